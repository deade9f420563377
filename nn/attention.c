// Multi-head attention as torch.nn.MultiheadAttention computes it (batch-first here):
//   q, k, v = x W_{q,k,v}^T + b;  q /= sqrt(head_dim);  A = softmax(q k^T + mask);  y = (A v) W_o^T + b_o
#include <math.h>
#include <stdio.h>

#include "nn/layers.h"

MultiheadAttention mha_create(ParamStore *ps, const char *prefix, int64_t dim, int64_t heads, float dropout) {
  DETR_CHECK(heads > 0 && dim % heads == 0, "attention: dim %lld is not divisible by %lld heads", (long long)dim,
             (long long)heads);
  char name[112];
  param_name_join(name, sizeof name, prefix, "out_proj");
  MultiheadAttention a = {
      .in_proj_weight = params_add(ps, SHAPE(3 * dim, dim), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.in_proj_weight", prefix),
      .in_proj_bias = params_add(ps, SHAPE(3 * dim), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.in_proj_bias", prefix),
      .out_proj = linear_create(ps, name, dim, dim, true, PARAM_TRAINABLE, LR_GROUP_MAIN),
      .dim = dim,
      .heads = heads,
      .dropout = dropout,
  };
  return a;
}

Tensor *mha_project(const MultiheadAttention *a, Tensor *x, int which) {
  // Rows [which*d, (which+1)*d) of the packed projection (slices are small copies).
  Tensor *w = op_slice(a->in_proj_weight, 0, which * a->dim, (which + 1) * a->dim);
  Tensor *b = op_slice(a->in_proj_bias, 0, which * a->dim, (which + 1) * a->dim);
  return op_linear(x, w, b);
}

Tensor *mha_split_heads(Tensor *x, int64_t heads) {
  int64_t B = x->shape.d[0], L = x->shape.d[1], d = x->shape.d[2];
  Tensor *t = op_transpose(op_reshape(x, SHAPE(B, L, heads, d / heads)), 1, 2);  // [B, h, L, hd]
  return op_reshape(t, SHAPE(B * heads, L, d / heads));
}

Tensor *mha_merge_heads(Tensor *x, int64_t B) {
  int64_t h = x->shape.d[0] / B, L = x->shape.d[1], hd = x->shape.d[2];
  return op_reshape(op_transpose(op_reshape(x, SHAPE(B, h, L, hd)), 1, 2), SHAPE(B, L, h * hd));
}

Tensor *attention_head_mean(Tensor *w, int64_t B) {
  int64_t Lq = w->shape.d[1], Lk = w->shape.d[2];
  return op_reshape(op_mean(op_reshape(w, SHAPE(B, w->shape.d[0] / B, Lq * Lk)), 1, false), SHAPE(B, Lq, Lk));
}

Tensor *attention_heads(const NnCtx *ctx, Tensor *q, Tensor *k, Tensor *v, int64_t heads, Tensor *key_padding_mask,
                        float dropout, Tensor **weights) {
  int64_t B = q->shape.d[0], Lq = q->shape.d[1], Lk = k->shape.d[1], hd = q->shape.d[2] / heads;
  q = op_mul_scalar(q, 1.0f / sqrtf((float)hd));
  Tensor *qh = mha_split_heads(q, heads), *kh = mha_split_heads(k, heads), *vh = mha_split_heads(v, heads);
  Tensor *logits = op_bmm(qh, kh, false, true);  // [B*h, Lq, Lk]
  // The mask row of image b serves its h*Lq logit rows.
  Tensor *attn = op_softmax(op_reshape(logits, SHAPE(B, heads * Lq, Lk)), key_padding_mask);
  attn = op_reshape(attn, SHAPE(B * heads, Lq, Lk));
  if (weights) *weights = attention_head_mean(attn, B);
  return mha_merge_heads(nn_dropout_bmm(ctx, attn, vh, dropout), B);  // [B, Lq, h * dv]
}

Tensor *mha_forward_weights(const MultiheadAttention *a, const NnCtx *ctx, Tensor *query, Tensor *key, Tensor *value,
                            Tensor *key_padding_mask, Tensor **weights) {
  Tensor *q = mha_project(a, query, 0), *k = mha_project(a, key, 1), *v = mha_project(a, value, 2);
  return linear_forward(&a->out_proj, attention_heads(ctx, q, k, v, a->heads, key_padding_mask, a->dropout, weights));
}

Tensor *mha_forward(const MultiheadAttention *a, const NnCtx *ctx, Tensor *query, Tensor *key, Tensor *value,
                    Tensor *key_padding_mask) {
  return mha_forward_weights(a, ctx, query, key, value, key_padding_mask, NULL);
}
