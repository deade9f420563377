// Dense multi-head attention, DETR's encoder self-attention: softmax(q k^T / sqrt(hd)) v per head
// over every valid pixel of the image. O(N^2 d) time, O(N^2 h) memory for the attention weights.
#include "nn/encoder_attn.h"

static Tensor *forward(const void *extras, const NnCtx *ctx, const EncoderAttnInput *in, AttnTrace *trace, char *err,
                       size_t err_cap) {
  Tensor *qk = op_add(in->x, in->pos);
  return mha_forward(in->proj, ctx, qk, qk, in->x, in->geom->key_mask);
}

const EncoderAttnKind encoder_attn_dense = {
    .name = "dense",
    .summary = "DETR's multi-head attention, softmax(q k^T / sqrt(hd)) v, O(N^2 d)",
    .forward = forward,
};
