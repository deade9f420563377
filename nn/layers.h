// The layers DETR is built from. Each owns no memory: its tensors live in a ParamStore under
// their reference names. Forward functions take scoped tensors and return scoped tensors.
#pragma once
#include "autograd/ops.h"
#include "nn/params.h"

// Forward-pass context: dropout is active only when training. want_cross_attn asks the decoder
// for its last layer's cross-attention weights (DetrOutput.cross_attn, `detr predict --show
// attention`), want_clusters the encoder variants that cluster for each position's cluster
// (AttnTrace.clusters, `--show clusters`); off, nothing extra is computed. inference is set by
// detr_model_forward, not by callers: the model was prepared for inference
// (detr_model_prepare_inference), nothing is recorded and nothing trains, so a layer may compute
// the same function in another order, equal to rounding (attention_fold_projections).
typedef struct {
  bool training;
  Rng *dropout_rng;  // advanced by every dropout draw
  bool want_cross_attn;
  bool want_clusters;
  bool inference;
} NnCtx;

Tensor *nn_dropout(const NnCtx *ctx, Tensor *x, float p);
// op_bmm(nn_dropout(ctx, a, p), b, false, false), fused: the dropped-out a is not kept for backward.
Tensor *nn_dropout_bmm(const NnCtx *ctx, Tensor *a, Tensor *b, float p);

// --- Linear (nn/linear.c): y = x W^T + b, W [out, in] ---
typedef struct {
  Tensor *weight, *bias;  // [out, in], [out] or NULL
} Linear;
Linear linear_create(ParamStore *ps, const char *prefix, int64_t in, int64_t out, bool bias, ParamKind kind,
                     LrGroup group);
Tensor *linear_forward(const Linear *l, Tensor *x);
Tensor *linear_relu_forward(const Linear *l, Tensor *x);  // relu(linear_forward(l, x)), fused
// nn_dropout(ctx, linear_relu_forward(l, x), p), fused: the ReLU's output is not kept for backward.
Tensor *linear_relu_dropout_forward(const NnCtx *ctx, const Linear *l, Tensor *x, float p);
// A trainable Linear with bias (main learning rate) named `prefix.name` (the transformers' layers).
Linear linear_create_named(ParamStore *ps, const char *prefix, const char *name, int64_t in, int64_t out);

// --- MLP (nn/mlp.c): Linear layers with ReLU between them (DETR's bbox_embed) ---
#define MLP_MAX_LAYERS 4
typedef struct {
  Linear layers[MLP_MAX_LAYERS];
  int n_layers;
} Mlp;
Mlp mlp_create(ParamStore *ps, const char *prefix, int64_t in, int64_t hidden, int64_t out, int n_layers);
Tensor *mlp_forward(const Mlp *m, Tensor *x);

// --- Conv2d (nn/conv2d.c) ---
typedef struct {
  Tensor *weight, *bias;  // [out, in, kh, kw], [out] or NULL
  Conv2dParams p;
} Conv2d;
Conv2d conv2d_create(ParamStore *ps, const char *prefix, int64_t in, int64_t out, int kernel, int stride, int pad,
                     int dilation, bool bias, ParamKind kind, LrGroup group);
Tensor *conv2d_forward(const Conv2d *c, Tensor *x);

// --- FrozenBatchNorm2d (nn/frozen_bn.c): four buffers, eps 1e-5 ---
#define FROZEN_BN_EPS 1e-5f  // DETR's FrozenBatchNorm2d (models/backbone.py)
typedef struct {
  Tensor *weight, *bias, *running_mean, *running_var;  // [C] each
  bool channels_last;                                  // its input is [B, H, W, C], not [B, C, H, W]
} FrozenBn;
FrozenBn frozen_bn_create(ParamStore *ps, const char *prefix, int64_t channels);
Tensor *frozen_bn_forward(const FrozenBn *bn, Tensor *x);
// relu?(bn(x) + residual) in one op (residual NULL: none): a ResNet block's norm, add and ReLU.
Tensor *frozen_bn_act_forward(const FrozenBn *bn, Tensor *x, Tensor *residual, bool relu);
// A convolution with the frozen batch norm after it folded in, for inference: weight [O, C, KH, KW]
// = the convolution's scaled by the norm's scale[o] = weight[o] / sqrt(var[o] + eps), bias [O] =
// the norm's shift[o] = bias[o] - mean[o] * scale[o] (plus scale[o] * the convolution's own bias).
// Tensors owned by `owner` (the model's ParamStore.derived), on the convolution's device; a copy
// of the weights at the time of folding. On the CPU the weight's reordered copies are kept in pack (the weight never
// changes), one per oneDNN weight layout the forwards use (kernels/cpu/cpu_kernels.h).
typedef struct {
  Tensor *weight, *bias;
  ConvWeightPack *pack;  // NULL off the CPU
  Conv2dParams p;
} FoldedConv;
FoldedConv frozen_bn_fold(const Conv2d *c, const FrozenBn *bn, TensorOwner *owner);
void folded_conv_free(FoldedConv *f);  // its weight packs; its tensors are the owner's
// relu?(bn(conv(x)) + residual) as one op_conv2d_fused (grad mode off); residual_dead: the
// residual is a temporary no one reads afterwards, and its buffer becomes the output
// (op_conv2d_fused_into).
Tensor *folded_conv_forward(const FoldedConv *f, Tensor *x, Tensor *residual, bool relu, bool residual_dead);

// --- LayerNorm (nn/layernorm.c), eps 1e-5 ---
typedef struct {
  Tensor *weight, *bias;  // [d]
} LayerNorm;
LayerNorm layernorm_create(ParamStore *ps, const char *prefix, int64_t d);
Tensor *layernorm_forward(const LayerNorm *ln, Tensor *x);
LayerNorm layernorm_create_named(ParamStore *ps, const char *prefix, const char *name, int64_t d);  // prefix.name

// --- multi-head attention (nn/attention.c), torch.nn.MultiheadAttention's layout: a packed
// in_proj_weight [3d, d] (q, k, v rows) and in_proj_bias [3d], out_proj Linear(d, d) ---
typedef struct {
  Tensor *in_proj_weight, *in_proj_bias;
  Linear out_proj;
  int64_t dim, heads;
  float dropout;  // on the attention weights
} MultiheadAttention;
MultiheadAttention mha_create(ParamStore *ps, const char *prefix, int64_t dim, int64_t heads, float dropout);
// query [B, Lq, d], key and value [B, Lk, d]; key_padding_mask: additive [B, Lk] (0 or -inf), or
// NULL. Returns [B, Lq, d]. Logits are scaled by 1/sqrt(d / heads).
// k-means cross-attention (nn/cross_attn_kmeans.c, docs/kmeans_cross_attention.md): DETR's
// projections; per head, each unpadded pixel is assigned to the query with the largest logit
// q.k/sqrt(hd) (a constant: computed without gradient, as kMaX-DeepLab's kMaXTransformerLayer does),
// and each query's update is the mean of its pixels' values, then out_proj. Same signature as
// mha_forward_weights (dropout is not applied to the assignment); its weights: the assignment A.
Tensor *kmeans_cross_attention(const MultiheadAttention *a, const NnCtx *ctx, Tensor *query, Tensor *key, Tensor *value,
                               Tensor *key_padding_mask, Tensor **weights);
// Its two halves: the assignment [B*h, Lq, Lk] (op_cluster_argmax of the per-head logits, no tape;
// winners as op_cluster_argmax's), and the differentiable update (assign v_h) W_o^T + b_o given it.
Tensor *kmeans_cross_attention_assign(const MultiheadAttention *a, Tensor *query, Tensor *key, Tensor *key_padding_mask,
                                      Tensor **winners);
Tensor *kmeans_cross_attention_update(const MultiheadAttention *a, Tensor *assign, Tensor *value);
Tensor *mha_forward(const MultiheadAttention *a, const NnCtx *ctx, Tensor *query, Tensor *key, Tensor *value,
                    Tensor *key_padding_mask);
// mha_forward, and when weights is not NULL its attention weights averaged over the heads into
// *weights [B, Lq, Lk] (before dropout): the decoder's cross-attention, whose weights are pictured.
Tensor *mha_forward_weights(const MultiheadAttention *a, const NnCtx *ctx, Tensor *query, Tensor *key, Tensor *value,
                            Tensor *key_padding_mask, Tensor **weights);
// The attention between projections, per head: softmax(q k^T / sqrt(dk) + mask) v with dropout p
// on the weights; q [B, Lq, h*dk], k [B, Lk, h*dk], v [B, Lk, h*dv] -> [B, Lq, h*dv] (before any
// output projection). mha_forward is its projections around this; Conditional DETR's decoder
// (dk = 2 dv) calls it directly. weights: as mha_forward_weights (NULL: not wanted).
Tensor *attention_heads(const NnCtx *ctx, Tensor *q, Tensor *k, Tensor *v, int64_t heads, Tensor *key_padding_mask,
                        float dropout, Tensor **weights);
// Cross-attention of few queries over many keys with the key and value projections moved onto the
// queries (inference only: the same function to rounding; docs/inference.md "Projections moved
// onto the queries"). Per head h of hd features, with key terms t (DETR: one, the keys' projection;
// Conditional DETR: its content and position halves):
//   logit_h(q, j) = scale sum_t q_t,h(q) . (W_t,h x_t(j) + b_t,h)
//                 = scale sum_t (W_t,h^T q_t,h(q)) . x_t(j) + a constant over j, which softmax drops
//   out_h(q)      = sum_j P_h(q, j) (W_v,h x_v(j) + b_v,h) = W_v,h (sum_j P_h(q, j) x_v(j)) + b_v,h
// (the weights P of a row sum to 1, or 0 where every key is padding: b_v is scaled by the sum). No
// key or value is projected: the projections apply to Q
// queries instead of L keys, and the products run over the inputs' width instead of a head's.
typedef struct {
  Tensor *query;   // [B, Q, d]: head h is features h*hd .. (h+1)*hd - 1 (hd = d / heads)
  Tensor *weight;  // [d, din]: the key projection (its bias is one of the constants softmax drops)
  Tensor *keys;    // [B, L, din]: what it projects
} AttnKeyTerm;
#define ATTN_MAX_KEY_TERMS 4
// Whether the fold does fewer multiply-adds than projecting the keys and values (about: heads * Q
// under the inputs' width): Q queries, L keys, key terms of widths din[0..n_terms), values of width
// dv_in projected to d. On the CPU only (not measured on a GPU).
bool attention_fold_pays(Device dev, int64_t Q, int64_t L, int64_t d, int64_t heads, const int64_t *din, int n_terms,
                         int64_t dv_in);
// [B, Q, d] from terms[0..n_terms) (each query's head h scaled by `scale` in the logits) and the values'
// projection (value_weight [d, dv_in], value_bias [d] or NULL) of values [B, L, dv_in]; the key padding
// mask and *weights as attention_heads'. CPU tensors only (attention_fold_pays).
Tensor *attention_fold_projections(const AttnKeyTerm *terms, int n_terms, Tensor *value_weight, Tensor *value_bias,
                                   Tensor *values, int64_t heads, float scale, Tensor *key_padding_mask,
                                   Tensor **weights);
// Per-head weights [B*heads, Lq, Lk] averaged over the heads: [B, Lq, Lk].
Tensor *attention_head_mean(Tensor *w, int64_t B);
// The q, k, v projections alone (the encoder-attention variants apply their own attention between
// the projections: nn/encoder_attn.h).
Tensor *mha_project(const MultiheadAttention *a, Tensor *x, int which);  // which: 0 q, 1 k, 2 v
Tensor *mha_split_heads(Tensor *x, int64_t heads);                       // [B, L, d] -> [B*heads, L, d/heads]
Tensor *mha_merge_heads(Tensor *x, int64_t B);                           // [B*heads, L, hd] -> [B, L, heads*hd]

// --- GroupNorm (nn/layernorm.c): torch.nn.GroupNorm(groups, C), eps 1e-5, on channels-last
// x [B, N, C]: each image's C / groups channels of a group normalised together over all N
// positions (padding included, as the reference), then weight [C] and bias [C] ---
typedef struct {
  Tensor *weight, *bias;  // [C]
  int64_t groups;
} GroupNorm;
GroupNorm groupnorm_create(ParamStore *ps, const char *prefix, int64_t groups, int64_t channels);
Tensor *groupnorm_forward(const GroupNorm *g, Tensor *x);

// --- row-column decoupled attention (nn/attn_rcda.c; Anchor DETR, megvii-research/AnchorDETR
// models/row_column_decoupled_attention.py MultiheadRCDA): a packed in_proj_weight [5d, d] whose
// rows are the q_row, q_col, k_row, k_col and v projections, in_proj_bias [5d], out_proj ---
typedef struct {
  Tensor *in_proj_weight, *in_proj_bias;
  Linear out_proj;
  int64_t dim, heads;
  float dropout;  // on both attention weights
} MultiheadRcda;
enum { RCDA_Q_ROW, RCDA_Q_COL, RCDA_K_ROW, RCDA_K_COL, RCDA_V };
MultiheadRcda rcda_create(ParamStore *ps, const char *prefix, int64_t dim, int64_t heads, float dropout);
// The reference's init: xavier-uniform over the whole [5d, d], zero in_proj_bias, torch's Linear
// default for out_proj with a zero bias.
void rcda_init(const MultiheadRcda *a, Rng *rng);
Tensor *rcda_project(const MultiheadRcda *a, Tensor *x, int which);  // rows which*d .. of in_proj
// The keys and value of a feature map [B, H, W, d] (key_row_in, key_col_in: the map plus its
// row / column positions; value_in: the map): k_row [B, W, d] (the projection averaged over the H
// rows), k_col [B, H, d] (over the W columns), v [B, H, W, d]. The projection commutes with the
// average, so the map is averaged first (H or W times less work). A variant that clusters keys and
// values before RCDA (Anchor-DETR-ENACT) replaces this step and calls rcda_attend.
typedef struct {
  Tensor *k_row, *k_col, *v;
} RcdaKeys;
RcdaKeys rcda_keys(const MultiheadRcda *a, Tensor *key_row_in, Tensor *key_col_in, Tensor *value_in);
// The attention between projections: per head, row weights softmax(q_row k_row^T / sqrt(hd) +
// row_mask) [L, W] and column weights softmax(q_col k_col^T / sqrt(hd) + col_mask) [L, H]
// (dropout p on each); out[q] = sum_y col[q, y] sum_x row[q, x] v[y, x], the shorter side summed
// first as the reference. q_row, q_col [B, L, d]; row_mask [B, W], col_mask [B, H] additive (0 or
// -inf) or NULL. Returns [B, L, d] before out_proj. weights (may be NULL): the 2-D weights
// row[q, x] col[q, y] averaged over the heads [B, L, H * W].
Tensor *rcda_attend(const NnCtx *ctx, Tensor *q_row, Tensor *q_col, const RcdaKeys *k, int64_t heads, Tensor *row_mask,
                    Tensor *col_mask, float p, Tensor **weights);
// The module: projections, rcda_attend, out_proj. [B, L, d].
Tensor *rcda_forward(const MultiheadRcda *a, const NnCtx *ctx, Tensor *query_row, Tensor *query_col, Tensor *key_row_in,
                     Tensor *key_col_in, Tensor *value_in, Tensor *row_mask, Tensor *col_mask, Tensor **weights);
// RCDA over clustered keys (Anchor-DETR-ENACT's encoder, GSavathrakis/ENACT,
// row_column_decoupled_attention.py multi_head_rcda_forward_enc): map_row, map_col [B, H, W, d] give
// the queries (projected with k_row / k_col's weights, averaged over H / W: one per column, one per
// row); k_row_cl, k_col_cl, v_cl [B, L, d] the clusters' keys (projected with q_row / q_col's
// weights) and values. Per head, row = softmax_n [W, L], col = softmax_n [H, L] (1/sqrt(hd), no
// mask: the reference clusters the padded map), out[y, x] = sum_n col[y, n] row[x, n] v[n], then
// out_proj. -> [B, HW, d].
Tensor *rcda_cluster_forward(const MultiheadRcda *a, const NnCtx *ctx, Tensor *map_row, Tensor *map_col,
                             Tensor *k_row_cl, Tensor *k_col_cl, Tensor *v_cl);
// The additive masks of a key-padding mask [B, H * W]: row_mask its first row [B, W], col_mask its
// first column [B, H] (the reference's key_padding_mask[:, 0, :] and [:, :, 0]).
void rcda_masks(Tensor *key_mask, int64_t H, int64_t W, Tensor **row_mask, Tensor **col_mask);
