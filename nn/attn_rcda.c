// Row-column decoupled attention (Anchor DETR, Wang et al., AAAI 2022; megvii-research/AnchorDETR
// models/row_column_decoupled_attention.py multi_head_rcda_forward and MultiheadRCDA). A query
// attends to the W columns of a feature map with one softmax and to its H rows with another,
// instead of to the H * W positions: its output is sum_y col[y] sum_x row[x] v[y, x]. The keys are
// the map's projections averaged over the other axis. Used by Anchor DETR's encoder (each
// position a query) and its decoder's cross-attention (nn/decoder_anchor.c, docs/anchor_detr.md).
#include <math.h>

#include "nn/layers.h"

MultiheadRcda rcda_create(ParamStore *ps, const char *prefix, int64_t dim, int64_t heads, float dropout) {
  DETR_CHECK(heads > 0 && dim % heads == 0, "rcda: dim %lld is not divisible by %lld heads", (long long)dim,
             (long long)heads);
  char name[112];
  param_name_join(name, sizeof name, prefix, "out_proj");
  return (MultiheadRcda){
      .in_proj_weight =
          params_add(ps, SHAPE(5 * dim, dim), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.in_proj_weight", prefix),
      .in_proj_bias = params_add(ps, SHAPE(5 * dim), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.in_proj_bias", prefix),
      .out_proj = linear_create(ps, name, dim, dim, true, PARAM_TRAINABLE, LR_GROUP_MAIN),
      .dim = dim,
      .heads = heads,
      .dropout = dropout,
  };
}

void rcda_init(const MultiheadRcda *a, Rng *rng) {
  init_xavier_uniform(a->in_proj_weight, rng);  // fans of the packed [5d, d], as the reference
  tensor_fill_(a->in_proj_bias, 0.0f);
  init_torch_default(a->out_proj.weight, a->out_proj.bias, rng);
  tensor_fill_(a->out_proj.bias, 0.0f);
}

Tensor *rcda_project(const MultiheadRcda *a, Tensor *x, int which) {
  Tensor *w = op_slice(a->in_proj_weight, 0, which * a->dim, (which + 1) * a->dim);  // [d, d]
  Tensor *b = op_slice(a->in_proj_bias, 0, which * a->dim, (which + 1) * a->dim);    // [d]
  return op_linear(x, w, b);
}

RcdaKeys rcda_keys(const MultiheadRcda *a, Tensor *key_row_in, Tensor *key_col_in, Tensor *value_in) {
  DETR_CHECK(key_row_in->shape.ndim == 4 && key_col_in->shape.ndim == 4 && value_in->shape.ndim == 4,
             "rcda_keys: the keys and value must be maps [B, H, W, d]");
  return (RcdaKeys){.k_row = rcda_project(a, op_mean(key_row_in, 1, false), RCDA_K_ROW),  // [B, W, d]
                    .k_col = rcda_project(a, op_mean(key_col_in, 2, false), RCDA_K_COL),  // [B, H, d]
                    .v = rcda_project(a, value_in, RCDA_V)};                              // [B, H, W, d]
}

// Per-head softmax weights [B*h, L, S] of queries q [B, L, d] against keys k [B, S, d], the mask
// [B, S] serving each image's h * L rows.
static Tensor *weights_1d(Tensor *q, Tensor *k, int64_t heads, Tensor *mask) {
  int64_t B = q->shape.d[0], L = q->shape.d[1], S = k->shape.d[1], hd = q->shape.d[2] / heads;
  Tensor *logits = op_bmm(mha_split_heads(op_mul_scalar(q, 1.0f / sqrtf((float)hd)), heads), mha_split_heads(k, heads),
                          false, true);  // [B*h, L, S]
  return op_reshape(op_softmax(op_reshape(logits, SHAPE(B, heads * L, S)), mask), SHAPE(B * heads, L, S));
}

Tensor *rcda_attend(const NnCtx *ctx, Tensor *q_row, Tensor *q_col, const RcdaKeys *k, int64_t heads, Tensor *row_mask,
                    Tensor *col_mask, float p, Tensor **weights) {
  int64_t B = q_row->shape.d[0], L = q_row->shape.d[1], d = q_row->shape.d[2], hd = d / heads;
  int64_t H = k->v->shape.d[1], W = k->v->shape.d[2], bh = B * heads;
  Tensor *row = weights_1d(q_row, k->k_row, heads, row_mask);  // [B*h, L, W]
  Tensor *col = weights_1d(q_col, k->k_col, heads, col_mask);  // [B*h, L, H]
  if (weights) {                                               // before dropout, as DETR's pictured weights
    Tensor *w2 = op_mul(op_reshape(col, SHAPE(bh, L, H, 1)), op_reshape(row, SHAPE(bh, L, 1, W)));
    *weights = attention_head_mean(op_reshape(w2, SHAPE(bh, L, H * W)), B);
  }
  row = nn_dropout(ctx, row, p);
  col = nn_dropout(ctx, col, p);
  int perm_heads[5] = {0, 3, 1, 2, 4};
  Tensor *v = op_permute(op_reshape(k->v, SHAPE(B, H, W, heads, hd)), perm_heads);  // [B, h, H, W, hd]
  Tensor *out;
  if (H < W) {  // the reference's efficient_compute: the longer side (W) first, then H
    int perm[4] = {0, 2, 1, 3};
    Tensor *vw = op_reshape(op_permute(op_reshape(v, SHAPE(bh, H, W, hd)), perm), SHAPE(bh, W, H * hd));
    Tensor *t = op_reshape(op_bmm(row, vw, false, false), SHAPE(bh * L, H, hd));  // sum over x
    out = op_bmm(op_reshape(col, SHAPE(bh * L, 1, H)), t, false, false);          // [B*h*L, 1, hd]
  } else {
    Tensor *t = op_reshape(op_bmm(col, op_reshape(v, SHAPE(bh, H, W * hd)), false, false), SHAPE(bh * L, W, hd));
    out = op_bmm(op_reshape(row, SHAPE(bh * L, 1, W)), t, false, false);  // [B*h*L, 1, hd]
  }
  return mha_merge_heads(op_reshape(out, SHAPE(bh, L, hd)), B);  // [B, L, d]
}

Tensor *rcda_forward(const MultiheadRcda *a, const NnCtx *ctx, Tensor *query_row, Tensor *query_col, Tensor *key_row_in,
                     Tensor *key_col_in, Tensor *value_in, Tensor *row_mask, Tensor *col_mask, Tensor **weights) {
  RcdaKeys k = rcda_keys(a, key_row_in, key_col_in, value_in);
  Tensor *q_row = rcda_project(a, query_row, RCDA_Q_ROW), *q_col = rcda_project(a, query_col, RCDA_Q_COL);
  Tensor *y = rcda_attend(ctx, q_row, q_col, &k, a->heads, row_mask, col_mask, a->dropout, weights);
  return linear_forward(&a->out_proj, y);
}

void rcda_masks(Tensor *key_mask, int64_t H, int64_t W, Tensor **row_mask, Tensor **col_mask) {
  int64_t B = key_mask->shape.d[0];
  Tensor *m = op_reshape(key_mask, SHAPE(B, H, W));
  *row_mask = op_reshape(op_slice(m, 1, 0, 1), SHAPE(B, W));
  *col_mask = op_reshape(op_slice(m, 2, 0, 1), SHAPE(B, H));
}

Tensor *rcda_cluster_forward(const MultiheadRcda *a, const NnCtx *ctx, Tensor *map_row, Tensor *map_col,
                             Tensor *k_row_cl, Tensor *k_col_cl, Tensor *v_cl) {
  int64_t B = map_row->shape.d[0], H = map_row->shape.d[1], W = map_row->shape.d[2], d = map_row->shape.d[3];
  int64_t L = v_cl->shape.d[1], heads = a->heads, hd = d / heads, bh = B * heads;
  // The map's projections averaged over the other axis are the queries (projection then mean, as
  // the reference: the same affine map either way); the clusters are the keys, projected with the
  // query weights (the reference's argument order turns RCDA's roles).
  Tensor *q_row = op_mean(rcda_project(a, map_row, RCDA_K_ROW), 1, false);              // [B, W, d]
  Tensor *q_col = op_mean(rcda_project(a, map_col, RCDA_K_COL), 2, false);              // [B, H, d]
  Tensor *row = weights_1d(q_row, rcda_project(a, k_row_cl, RCDA_Q_ROW), heads, NULL);  // [B*h, W, L]
  Tensor *col = weights_1d(q_col, rcda_project(a, k_col_cl, RCDA_Q_COL), heads, NULL);  // [B*h, H, L]
  row = nn_dropout(ctx, row, a->dropout);
  col = nn_dropout(ctx, col, a->dropout);
  Tensor *v = mha_split_heads(rcda_project(a, v_cl, RCDA_V), heads);  // [B*h, L, hd]
  // out[y, x] = sum_n col[y, n] row[x, n] v[n]: the column weights scale the values, then one
  // batched product over n with the row weights.
  int perm[4] = {0, 2, 1, 3};
  Tensor *cv = op_mul(op_reshape(col, SHAPE(bh, H, L, 1)), op_reshape(v, SHAPE(bh, 1, L, hd)));  // [B*h, H, L, hd]
  cv = op_reshape(op_permute(cv, perm), SHAPE(bh, L, H * hd));
  Tensor *out = op_reshape(op_bmm(row, cv, false, false), SHAPE(bh, W, H, hd));
  out = op_reshape(op_permute(out, perm), SHAPE(bh, H * W, hd));
  return linear_forward(&a->out_proj, mha_merge_heads(out, B));  // [B, HW, d]
}
