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
      .in_proj_weight =
          params_add(ps, SHAPE(3 * dim, dim), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.in_proj_weight", prefix),
      .in_proj_bias = params_add(ps, SHAPE(3 * dim), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.in_proj_bias", prefix),
      .out_proj = linear_create(ps, name, dim, dim, true, PARAM_TRAINABLE, LR_GROUP_MAIN),
      .dim = dim,
      .heads = heads,
      .dropout = dropout,
  };
  return a;
}

// Rows [which*d, (which+1)*d) of the packed projection's weight and bias (views where nothing
// records, else copies); which: 0 q, 1 k, 2 v.
static void mha_rows(const MultiheadAttention *a, int which, Tensor **w, Tensor **b) {
  *w = op_slice(a->in_proj_weight, 0, which * a->dim, (which + 1) * a->dim);
  *b = op_slice(a->in_proj_bias, 0, which * a->dim, (which + 1) * a->dim);
}

Tensor *mha_project(const MultiheadAttention *a, Tensor *x, int which) {
  Tensor *w, *b;
  mha_rows(a, which, &w, &b);
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

bool attention_fold_pays(Device dev, int64_t Q, int64_t L, int64_t d, int64_t heads, const int64_t *din, int n_terms,
                         int64_t dv_in) {
  if (dev != DEVICE_CPU) return false;  // measured on the CPU only; on a GPU the projected form runs
  // multiply-adds per image: the projections of the keys and values and the per-head products,
  // against the projections of the queries and the outputs and products over the inputs' width
  int64_t projected = L * d * dv_in + Q * L * d * (n_terms + 1), folded = Q * d * dv_in + heads * Q * L * dv_in;
  for (int t = 0; t < n_terms; t++) projected += L * d * din[t], folded += Q * d * din[t] + heads * Q * L * din[t];
  return folded < projected;
}

// Whether a row of the additive key padding mask [B, L] (host-readable: the fold runs on the CPU)
// is all padding (-inf).
static bool some_row_all_padding(const Tensor *mask) {
  int64_t L = mask->shape.d[mask->shape.ndim - 1], rows = L > 0 ? mask->numel / L : 0;
  for (int64_t r = 0; r < rows; r++) {
    int64_t j = 0;
    while (j < L && mask->data[r * L + j] == -INFINITY) j++;
    if (j == L) return true;
  }
  return false;
}

// [B, Q, heads * hd] -> [heads, B * Q, hd]
static Tensor *heads_first(Tensor *x, int64_t heads) {
  int64_t B = x->shape.d[0], Q = x->shape.d[1], hd = x->shape.d[2] / heads;
  return op_reshape(op_permute(op_reshape(x, SHAPE(B, Q, heads, hd)), (const int[]){2, 0, 1, 3}),
                    SHAPE(heads, B * Q, hd));
}

Tensor *attention_fold_projections(const AttnKeyTerm *terms, int n_terms, Tensor *value_weight, Tensor *value_bias,
                                   Tensor *values, int64_t heads, float scale, Tensor *key_padding_mask,
                                   Tensor **weights) {
  DETR_CHECK(n_terms >= 1 && n_terms <= ATTN_MAX_KEY_TERMS, "attention_fold_projections: %d key terms (1..%d)", n_terms,
             ATTN_MAX_KEY_TERMS);
  int64_t B = values->shape.d[0], L = values->shape.d[1], dv_in = values->shape.d[2];
  int64_t Q = terms[0].query->shape.d[1], d = value_weight->shape.d[0], D = 0;
  DETR_CHECK(values->device == DEVICE_CPU, "attention_fold_projections: CPU tensors only (attention_fold_pays)");
  DETR_CHECK(
      values->shape.ndim == 3 && value_weight->shape.d[1] == dv_in && d % heads == 0,
      "attention_fold_projections: values [B, L, %lld] do not fit the value projection [%lld, %lld] in %lld heads",
      (long long)dv_in, (long long)d, (long long)value_weight->shape.d[1], (long long)heads);
  Tensor *folded[ATTN_MAX_KEY_TERMS], *keys[ATTN_MAX_KEY_TERMS];
  for (int t = 0; t < n_terms; t++) {
    int64_t din = terms[t].weight->shape.d[1];
    const Shape *qs = &terms[t].query->shape, *ks = &terms[t].keys->shape;
    DETR_CHECK(
        qs->ndim == 3 && qs->d[0] == B && qs->d[1] == Q && qs->d[2] == terms[t].weight->shape.d[0] &&
            qs->d[2] % heads == 0 && ks->ndim == 3 && ks->d[0] == B && ks->d[1] == L && ks->d[2] == din,
        "attention_fold_projections: term %d's query, weight [%lld, %lld] and keys do not fit [B %lld, Q %lld, L %lld]",
        t, (long long)terms[t].weight->shape.d[0], (long long)din, (long long)B, (long long)Q, (long long)L);
    Tensor *w = op_reshape(terms[t].weight, SHAPE(heads, terms[t].weight->shape.d[0] / heads, din));  // [h, hd, din]
    folded[t] = op_bmm(heads_first(terms[t].query, heads), w, false, false);  // [h, B*Q, din]: W_t,h^T q_t,h
    keys[t] = terms[t].keys;
    D += din;
  }
  Tensor *a = n_terms > 1 ? op_concat(folded, n_terms, 2) : folded[0];  // [h, B*Q, D]
  a = op_permute(op_reshape(a, SHAPE(heads, B, Q, D)), (const int[]){1, 0, 2, 3});
  a = op_mul_scalar(op_reshape(a, SHAPE(B, heads * Q, D)), scale);  // [B, h*Q, D]
  Tensor *k = n_terms > 1 ? op_concat(keys, n_terms, 2) : keys[0];  // [B, L, D]
  // The mask row of image b serves its h*Q logit rows, as in attention_heads.
  Tensor *attn = op_softmax(op_bmm(a, k, false, true), key_padding_mask);  // [B, h*Q, L]
  if (weights) *weights = attention_head_mean(op_reshape(attn, SHAPE(B * heads, Q, L)), B);
  Tensor *pooled = op_reshape(op_bmm(attn, values, false, false), SHAPE(B, heads, Q, dv_in));  // sum_j P x_v(j)
  pooled = op_reshape(op_permute(pooled, (const int[]){1, 0, 2, 3}), SHAPE(heads, B * Q, dv_in));
  Tensor *out = op_bmm(pooled, op_reshape(value_weight, SHAPE(heads, d / heads, dv_in)), false, true);  // [h, B*Q, dv]
  out = op_permute(op_reshape(out, SHAPE(heads, B, Q, d / heads)), (const int[]){1, 2, 0, 3});          // [B, Q, h, dv]
  if (value_bias) {
    Tensor *bias = op_reshape(value_bias, SHAPE(heads, d / heads));  // [h, dv]
    if (key_padding_mask && some_row_all_padding(key_padding_mask)) {
      // b_v times the row's weights' sum: 1, or 0 where every key is padding (softmax's zeros, which
      // the projected form turns into 0, not b_v). Only then: the sums cost 6 us a layer.
      Tensor *sums = op_reshape(op_sum(attn, 2, false), SHAPE(B, heads, Q, 1));
      bias = op_mul(op_permute(sums, (const int[]){0, 2, 1, 3}), bias);  // [B, Q, h, 1] x [h, dv]
    }
    out = op_add(out, bias);
  }
  return op_reshape(out, SHAPE(B, Q, d));
}

Tensor *mha_forward_weights(const MultiheadAttention *a, const NnCtx *ctx, Tensor *query, Tensor *key, Tensor *value,
                            Tensor *key_padding_mask, Tensor **weights) {
  // The decoder's cross-attention at inference, where the queries are few; never the encoders'
  // self-attention (as many queries as keys, or more: it does not pay).
  int64_t d = a->dim, Lq = query->shape.d[1], Lk = key->shape.d[1];
  if (ctx->inference && attention_fold_pays(query->device, Lq, Lk, d, a->heads, &d, 1, d)) {
    Tensor *wk, *bk, *wv, *bv;  // the keys' bias is a constant over the keys: unused
    mha_rows(a, 1, &wk, &bk), mha_rows(a, 2, &wv, &bv);
    AttnKeyTerm term = {.query = mha_project(a, query, 0), .weight = wk, .keys = key};
    Tensor *out = attention_fold_projections(&term, 1, wv, bv, value, a->heads, 1.0f / sqrtf((float)(d / a->heads)),
                                             key_padding_mask, weights);
    return linear_forward(&a->out_proj, out);
  }
  Tensor *q = mha_project(a, query, 0), *k = mha_project(a, key, 1), *v = mha_project(a, value, 2);
  return linear_forward(&a->out_proj, attention_heads(ctx, q, k, v, a->heads, key_padding_mask, a->dropout, weights));
}

Tensor *mha_forward(const MultiheadAttention *a, const NnCtx *ctx, Tensor *query, Tensor *key, Tensor *value,
                    Tensor *key_padding_mask) {
  return mha_forward_weights(a, ctx, query, key, value, key_padding_mask, NULL);
}
