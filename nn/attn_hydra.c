// Hydra Attention (Bolya et al., "Hydra Attention: Efficient Attention with Many Heads", ECCV-W
// 2022, the paper's code listing): as many heads as channels with the cosine kernel,
//   out = phi(q) * sum_t phi(k_t) * v_t    (elementwise), phi(x) = x / ||x||_2 over the d channels,
// the sum over the image's valid pixels only. No eps in phi (as the listing). The config's nheads
// does not apply. O(N d) time and memory.
#include "nn/encoder_attn.h"

static Tensor *l2_normalize(Tensor *x) {  // over the last axis
  return op_div(x, op_sqrt(op_sum(op_mul(x, x), -1, true)));
}

static Tensor *forward(const void *extras, const NnCtx *ctx, const EncoderAttnInput *in, AttnTrace *trace, char *err,
                       size_t err_cap) {
  const MultiheadAttention *a = in->proj;
  Tensor *qk = op_add(in->x, in->pos);
  Tensor *q = l2_normalize(mha_project(a, qk, 0)), *k = l2_normalize(mha_project(a, qk, 1));  // [B, N, d]
  Tensor *v = mha_project(a, in->x, 2);
  Tensor *kv = op_sum(op_mul(op_mul(k, v), in->geom->valid), 1, true);  // [B, 1, d]: padding masked out
  return linear_forward(&a->out_proj, op_mul(q, kv));
}

const EncoderAttnKind encoder_attn_hydra = {
    .name = "hydra",
    .summary = "Hydra Attention: d heads of one channel, phi(q) * sum_t phi(k_t) v_t with phi = L2 norm, O(N d)",
    .forward = forward,
};
