// Efficient Attention (Shen et al., WACV 2021; github cmsflash/efficient-attention,
// efficient_attention.py): per head, rho_q(q) (rho_k(k)^T v) with rho_q a softmax over each
// query's hd channels and rho_k a softmax over the positions for each key channel. The keys' softmax
// runs over the image's valid pixels only, so padding contributes nothing. No 1/sqrt(hd) scaling
// and no dropout (the official module has neither); its `+ input_` residual is the encoder
// layer's. O(N d hd) time, O(d hd) for the context instead of O(N^2 h).
#include "nn/encoder_attn.h"

static Tensor *forward(const void *extras, const NnCtx *ctx, const EncoderAttnInput *in, AttnTrace *trace, char *err,
                       size_t err_cap) {
  const MultiheadAttention *a = in->proj;
  int64_t B = in->x->shape.d[0], N = in->x->shape.d[1], d = a->dim, h = a->heads, hd = d / h;
  Tensor *qk = op_add(in->x, in->pos);
  Tensor *q = mha_project(a, qk, 0), *k = mha_project(a, qk, 1), *v = mha_project(a, in->x, 2);  // [B, N, d]
  Tensor *rho_q = op_reshape(op_softmax(op_reshape(q, SHAPE(B * N * h, hd)), NULL), SHAPE(B, N, d));
  Tensor *rho_k = op_softmax(op_transpose(k, 1, 2), in->geom->key_mask);   // [B, d, N], over valid positions
  Tensor *kh = op_reshape(rho_k, SHAPE(B * h, hd, N));                     // channels are head-major
  Tensor *context = op_bmm(kh, mha_split_heads(v, h), false, false);       // [B*h, hd, hd]
  Tensor *out = op_bmm(mha_split_heads(rho_q, h), context, false, false);  // [B*h, N, hd]
  return linear_forward(&a->out_proj, mha_merge_heads(out, B));
}

const EncoderAttnKind encoder_attn_efficient = {
    .name = "efficient",
    .summary = "Efficient Attention: softmax_channels(q) (softmax_positions(k)^T v) per head, O(N d^2 / h)",
    .forward = forward,
};
