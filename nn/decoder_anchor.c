// Anchor DETR's transformer (Wang et al., AAAI 2022; megvii-research/AnchorDETR models/transformer.py
// Transformer, TransformerEncoderLayerSpatial, TransformerDecoderLayer, pos2posemb1d/2d, mask2pos;
// models/anchor_detr.py; docs/anchor_detr.md), single feature level. A decoder kind with its own
// encoder (DecoderKind.encode) and queries (DecoderModelLayout.own_queries):
//   positions   per image, the map's column centres x = (i - 0.5) / valid_w of its first row and
//               row centres y likewise of its first column (mask2pos), each a sine embedding of d
//               features through adapt_pos1d (Linear, ReLU, Linear): pos_row [B, W, d], pos_col [B, H, d]
//   encoder     per layer: RCDA self-attention (nn/attn_rcda.c) with queries and keys x + pos_row
//               (row part) and x + pos_col (column part), values x; residual, norm1; FFN with its
//               own residual and norm (ffn.norm2). Post-norm. encoder_attn=enact_official:
//               Anchor-DETR-ENACT's (GSavathrakis/ENACT): keys and values clustered first (enact_rcda).
//   queries     P = 3 patterns x (num_queries / 3) anchor points: query p * NP + i starts as
//               pattern[p] with anchor position[i] (learned, in [0, 1]); query_pos =
//               adapt_pos2d(sine(anchor)), query_pos_x / _y = adapt_pos1d(sine(anchor x / y)).
//   decoder     per layer: self-attention (nn.MultiheadAttention, q = k = tgt + query_pos), residual,
//               norm2; RCDA cross-attention (queries tgt + query_pos_x / _y, keys memory + pos_row /
//               pos_col, values memory), residual, norm1; FFN. No final norm: each layer's output
//               feeds the heads.
//   boxes       sigmoid(box head + [inverse_sigmoid(anchor), 0, 0]); classes: sigmoid focal.
// The reference's sine embeddings have 256 (1-D) and 128 (2-D, per coordinate) features, which fit
// d = 256; here d and d / 2, the same at 256 and defined for the small presets.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/decoder.h"
#include "nn/enact.h"

#define ANCHOR_PATTERNS 3          // num_query_pattern
#define INVERSE_SIGMOID_EPS 1e-5f  // util/misc.py inverse_sigmoid
#define TWO_PI 6.28318530717958647692

typedef struct {
  Linear w_prob;  // ENACT.W_prob [1, d] (Anchor-DETR-ENACT's ClustAttn), only with enact_sigma > 0
  MultiheadRcda self_attn;
  LayerNorm norm1;
  Linear linear1, linear2;  // ffn.linear1, ffn.linear2
  LayerNorm ffn_norm;       // ffn.norm2
} EncLayer;

typedef struct {
  MultiheadRcda cross_attn;
  LayerNorm norm1;
  MultiheadAttention self_attn;
  LayerNorm norm2;
  Linear linear1, linear2;
  LayerNorm ffn_norm;
} DecLayer;

typedef struct {
  EncLayer enc[DECODER_MAX_LAYERS];
  DecLayer dec[DECODER_MAX_LAYERS];
  Tensor *pattern;                            // [P, d]
  Tensor *position;                           // [NP, 2] the anchors (x, y)
  Linear pos2d_0, pos2d_2, pos1d_0, pos1d_2;  // adapt_pos2d.{0,2}, adapt_pos1d.{0,2}
  TransformerShape s;
  int64_t n_enc, n_dec, positions;
  int enact_sigma;        // > 0: the encoder clusters its keys and values as Anchor-DETR-ENACT
  int64_t enact_fixed_c;  // > 0: that cluster size instead of the computed one (gradient checks)
} AnchorTransformer;

static void create_ffn(Linear *l1, Linear *l2, LayerNorm *norm, ParamStore *ps, const char *p, TransformerShape s) {
  char name[128];
  snprintf(name, sizeof name, "%s.ffn", p);
  *l1 = linear_create_named(ps, name, "linear1", s.dim, s.ffn_dim);
  *l2 = linear_create_named(ps, name, "linear2", s.ffn_dim, s.dim);
  *norm = layernorm_create_named(ps, name, "norm2", s.dim);
}

// encoder_attn=enact_official (its enact_official_sigma) makes the encoder Anchor-DETR-ENACT's; 0: plain.
static int enact_sigma(const DecoderShape *shape) {
  if (!shape->encoder_attn || strcmp(shape->encoder_attn->name, "enact_official") != 0) return 0;
  if (!shape->attn_settings) return 3;  // the setting's default
  return (int)attn_setting(shape->attn_settings, "enact_official_sigma");
}

// The reference's state_dict order: encoder_layers, decoder_layers, pattern, position, adapt_pos2d,
// adapt_pos1d (then the model's transformer.class_embed.0, transformer.bbox_embed.0).
static void create(void *state, ParamStore *ps, const char *prefix, const DecoderShape *shape) {
  AnchorTransformer *a = state;
  TransformerShape s = shape->s;
  int64_t d = s.dim;
  char p[112], name[128];
  a->enact_sigma = enact_sigma(shape);
  for (int i = 0; i < shape->enc_layers; i++) {
    EncLayer *l = &a->enc[i];
    snprintf(p, sizeof p, "%s.encoder_layers.%d", prefix, i);
    if (a->enact_sigma > 0)
      l->w_prob = linear_create_named(ps, p, "ENACT.W_prob", d, 1);  // before self_attn, as the reference
    snprintf(name, sizeof name, "%s.self_attn", p);
    l->self_attn = rcda_create(ps, name, d, s.heads, s.dropout);
    l->norm1 = layernorm_create_named(ps, p, "norm1", d);
    create_ffn(&l->linear1, &l->linear2, &l->ffn_norm, ps, p, s);
  }
  for (int i = 0; i < shape->layers; i++) {
    DecLayer *l = &a->dec[i];
    snprintf(p, sizeof p, "%s.decoder_layers.%d", prefix, i);
    snprintf(name, sizeof name, "%s.cross_attn", p);
    l->cross_attn = rcda_create(ps, name, d, s.heads, s.dropout);
    l->norm1 = layernorm_create_named(ps, p, "norm1", d);
    snprintf(name, sizeof name, "%s.self_attn", p);
    l->self_attn = mha_create(ps, name, d, s.heads, s.dropout);
    l->norm2 = layernorm_create_named(ps, p, "norm2", d);
    create_ffn(&l->linear1, &l->linear2, &l->ffn_norm, ps, p, s);
  }
  a->positions = shape->queries / ANCHOR_PATTERNS;
  a->pattern = params_add(ps, SHAPE(ANCHOR_PATTERNS, d), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.pattern.weight", prefix);
  a->position = params_add(ps, SHAPE(a->positions, 2), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.position.weight", prefix);
  snprintf(p, sizeof p, "%s.adapt_pos2d", prefix);
  a->pos2d_0 = linear_create_named(ps, p, "0", d, d);
  a->pos2d_2 = linear_create_named(ps, p, "2", d, d);
  snprintf(p, sizeof p, "%s.adapt_pos1d", prefix);
  a->pos1d_0 = linear_create_named(ps, p, "0", d, d);
  a->pos1d_2 = linear_create_named(ps, p, "2", d, d);
  a->s = s;
  a->n_enc = shape->enc_layers;
  a->n_dec = shape->layers;
}

static void init_mha(const MultiheadAttention *m, Rng *rng) {  // torch's MultiheadAttention._reset_parameters
  init_xavier_uniform(m->in_proj_weight, rng);
  tensor_fill_(m->in_proj_bias, 0.0f);
  init_torch_default(m->out_proj.weight, m->out_proj.bias, rng);
  tensor_fill_(m->out_proj.bias, 0.0f);
}

// Only the attention modules and the embeddings have an init of their own in the reference (its
// Transformer does not xavier the rest); Linear layers torch's default, LayerNorms 1 and 0.
static void init(const void *state, Rng *rng) {
  const AnchorTransformer *a = state;
  for (int i = 0; i < a->n_enc; i++) {
    const EncLayer *l = &a->enc[i];
    if (a->enact_sigma > 0) {  // nn.Linear's default, then ClustAttn's xavier_uniform_ of the weight
      init_torch_default(l->w_prob.weight, l->w_prob.bias, rng);
      init_xavier_uniform(l->w_prob.weight, rng);
    }
    rcda_init(&l->self_attn, rng);
    init_torch_default(l->linear1.weight, l->linear1.bias, rng);
    init_torch_default(l->linear2.weight, l->linear2.bias, rng);
  }
  for (int i = 0; i < a->n_dec; i++) {
    const DecLayer *l = &a->dec[i];
    rcda_init(&l->cross_attn, rng);
    init_mha(&l->self_attn, rng);
    init_torch_default(l->linear1.weight, l->linear1.bias, rng);
    init_torch_default(l->linear2.weight, l->linear2.bias, rng);
  }
  init_normal(a->pattern, rng, 1.0f);             // nn.Embedding
  tensor_uniform_(a->position, rng, 0.0f, 1.0f);  // nn.init.uniform_(position.weight, 0, 1)
  const Linear *lin[] = {&a->pos2d_0, &a->pos2d_2, &a->pos1d_0, &a->pos1d_2};
  for (int i = 0; i < 4; i++) init_torch_default(lin[i]->weight, lin[i]->bias, rng);
}

// --- positions ---

// Sine features of coordinates c [n, 1] -> [n, F]: feature j is sin(2 pi c / T^(2 floor(j/2) / F))
// for even j, cos for odd j, T = 10000 (pos2posemb1d; per coordinate of pos2posemb2d). Even and
// odd are selected by 0/1 masks (exact), so the gradient reaches c (the learned anchors).
static Tensor *sine_features(Tensor *c, int64_t F) {
  float *host = detr_malloc((size_t)(3 * F) * sizeof(float), "decoder_anchor sine");  // dim_t, even, odd [F] each
  for (int64_t j = 0; j < F; j++) {
    host[j] = powf(10000.0f, (float)(2 * (j / 2)) / (float)F);
    host[F + j] = j % 2 == 0 ? 1.0f : 0.0f;
    host[2 * F + j] = j % 2 == 0 ? 0.0f : 1.0f;
  }
  Device dev = c->device;
  Tensor *dim_t = op_constant(dev, SHAPE(F), host);
  Tensor *even = op_constant(dev, SHAPE(F), host + F);
  Tensor *odd = op_constant(dev, SHAPE(F), host + 2 * F);
  free(host);
  Tensor *arg = op_div(op_mul_scalar(c, (float)TWO_PI), dim_t);  // [n, F]
  return op_add(op_mul(op_sin(arg), even), op_mul(op_cos(arg), odd));
}

static Tensor *adapt(const Linear *l0, const Linear *l2, Tensor *x) {  // nn.Sequential(Linear, ReLU, Linear)
  return linear_forward(l2, linear_relu_forward(l0, x));
}

// mask2pos on the host: per image the first row's columns and the first column's rows, numbered
// 1, 2, ... over the valid ones (cumsum), minus 0.5, over the count (a padded tail keeps the last
// value). xs [B * W], ys [B * H]. An image with no valid pixel (the reference divides by 0) uses 1.
static void mask_positions(const FeatureGeometry *g, float *xs, float *ys) {
  int64_t H = g->Hp, W = g->Wp;
  for (int64_t b = 0; b < g->B; b++) {
    const uint8_t *m = g->mask + b * H * W;
    float n = 0;
    for (int64_t x = 0; x < W; x++) xs[b * W + x] = n += m[x] ? 0.0f : 1.0f;
    for (int64_t x = 0; x < W; x++) xs[b * W + x] = (xs[b * W + x] - 0.5f) / (n > 0 ? n : 1.0f);
    n = 0;
    for (int64_t y = 0; y < H; y++) ys[b * H + y] = n += m[y * W] ? 0.0f : 1.0f;
    for (int64_t y = 0; y < H; y++) ys[b * H + y] = (ys[b * H + y] - 0.5f) / (n > 0 ? n : 1.0f);
  }
}

// pos_row [B, W, d] and pos_col [B, H, d]: adapt_pos1d of the sine features of mask_positions.
static void map_positions(const AnchorTransformer *a, const FeatureGeometry *g, Device dev, Tensor **pos_row,
                          Tensor **pos_col) {
  int64_t B = g->B, H = g->Hp, W = g->Wp, d = a->s.dim;
  float *host = detr_malloc((size_t)(B * (W + H)) * sizeof(float), "decoder_anchor positions");  // xs, ys
  mask_positions(g, host, host + B * W);
  Tensor *xs = op_constant(dev, SHAPE(B * W, 1), host);
  Tensor *ys = op_constant(dev, SHAPE(B * H, 1), host + B * W);
  free(host);
  *pos_row = op_reshape(adapt(&a->pos1d_0, &a->pos1d_2, sine_features(xs, d)), SHAPE(B, W, d));
  *pos_col = op_reshape(adapt(&a->pos1d_0, &a->pos1d_2, sine_features(ys, d)), SHAPE(B, H, d));
}

// --- encoder ---

// FFN with its residual and norm: ffn_norm(x + linear2(relu(linear1(x)))), dropout after each.
static Tensor *ffn(const Linear *l1, const Linear *l2, const LayerNorm *norm, const NnCtx *ctx, float p, Tensor *x) {
  Tensor *y = linear_forward(l2, linear_relu_dropout_forward(ctx, l1, x, p));
  return layernorm_forward(norm, op_add(x, nn_dropout(ctx, y, p)));
}

// Anchor-DETR-ENACT's encoder attention (GSavathrakis/ENACT, Anchor-DETR-ENACT models/enact.py
// ClustAttn): the row keys xr, column keys xc and values x [B, H, W, d], flattened to N = H*W (the
// whole padded map, no mask), are cut into L = N / c chunks of c pixels by the entropy of W_prob(xr)
// (nn/enact.h, enact_official_*: one cluster size c for the batch, found where the tensors live);
// the chunks' entropy-weighted sums are RCDA's keys and values (rcda_cluster_forward). -> [B, HW, d].
static Tensor *enact_rcda(const EncLayer *l, const NnCtx *ctx, int sigma, int64_t fixed_c, Tensor *xr, Tensor *xc,
                          Tensor *x) {
  int64_t B = x->shape.d[0], N = x->shape.d[1] * x->shape.d[2], d = x->shape.d[3];
  Tensor *kr = op_reshape(xr, SHAPE(B * N, d)), *kc = op_reshape(xc, SHAPE(B * N, d)),
         *v = op_reshape(x, SHAPE(B * N, d));
  Tensor *hsm = enact_official_entropy(&l->w_prob, op_reshape(xr, SHAPE(B, N, d)), sigma);  // [B, N]
  EnactRegionIndex index = enact_official_chunks(hsm, fixed_c);
  // RCDA takes the chunks as [B, L, d], every image's L the same: the first B * L rows of the
  // clustered tensors. L is read where the index lives: free on the CPU, one 8-byte read (a
  // synchronisation) a layer on a GPU. At the bound N instead, RCDA's products and what they keep
  // for the backward would grow c-fold: N^2 hd a head, ~8 GB at batch 8 for anchor-r50 at 800x1066.
  int64_t L;
  enact_region_index_read(&index, enact_region_image_offset(&index) + 1, 1, &L);
  Tensor *h = op_reshape(hsm, SHAPE(B * N)), *vc = NULL, *unused = NULL;
  Tensor *krc = op_enact_cluster(kr, v, h, NULL, &index, &vc);  // [rows, d] each, rows >= B * L
  Tensor *kcc = op_enact_cluster(kc, v, h, NULL, &index, &unused);
  Tensor *chunks[3] = {krc, kcc, vc};
  for (int i = 0; i < 3; i++) {
    Tensor *rows = chunks[i]->shape.d[0] == B * L ? chunks[i] : op_slice(chunks[i], 0, 0, B * L);
    chunks[i] = op_reshape(rows, SHAPE(B, L, d));
  }
  return rcda_cluster_forward(&l->self_attn, ctx, xr, xc, chunks[0], chunks[1], chunks[2]);
}

// x [B, H, W, d]; prow [B, 1, W, d], pcol [B, H, 1, d]; masks [B, W], [B, H]; sigma > 0: ENACT's
// clustered keys (fixed_c > 0: that cluster size). -> [B, H, W, d].
static Tensor *enc_layer_forward(const EncLayer *l, const NnCtx *ctx, float p, Tensor *x, Tensor *prow, Tensor *pcol,
                                 Tensor *row_mask, Tensor *col_mask, int sigma, int64_t fixed_c) {
  int64_t B = x->shape.d[0], H = x->shape.d[1], W = x->shape.d[2], d = x->shape.d[3];
  Tensor *xr = op_add(x, prow), *xc = op_add(x, pcol);  // [B, H, W, d]
  Tensor *y =
      sigma > 0 ? enact_rcda(l, ctx, sigma, fixed_c, xr, xc, x)
                : rcda_forward(&l->self_attn, ctx, op_reshape(xr, SHAPE(B, H * W, d)),
                               op_reshape(xc, SHAPE(B, H * W, d)), xr, xc, x, row_mask, col_mask, NULL);  // [B, HW, d]
  Tensor *t = layernorm_forward(&l->norm1, op_add(op_reshape(x, SHAPE(B, H * W, d)), nn_dropout(ctx, y, p)));
  return op_reshape(ffn(&l->linear1, &l->linear2, &l->ffn_norm, ctx, p, t), SHAPE(B, H, W, d));
}

typedef struct {
  const AnchorTransformer *a;
  const NnCtx *ctx;
  Tensor *prow, *pcol, *row_mask, *col_mask;
} EncStep;

// Encoder layer i (tensor_run_layers): x [B, H, W, d] in carry->t[0].
static void enc_step(void *state, int i, TensorCarry *carry) {
  const EncStep *e = state;
  const AnchorTransformer *a = e->a;
  carry->t[0] = enc_layer_forward(&a->enc[i], e->ctx, a->s.dropout, carry->t[0], e->prow, e->pcol, e->row_mask,
                                  e->col_mask, a->enact_sigma, a->enact_fixed_c);
}

// The memory [B, N, d] and *pos = [pos_row; pos_col] along dim 1: [B, W + H, d].
static Tensor *encode(const void *state, const NnCtx *ctx, Tensor *src, const FeatureGeometry *g, Tensor **pos) {
  const AnchorTransformer *a = state;
  int64_t B = g->B, H = g->Hp, W = g->Wp, d = a->s.dim;
  Tensor *pos_row, *pos_col, *row_mask, *col_mask;
  map_positions(a, g, src->device, &pos_row, &pos_col);
  rcda_masks(g->key_mask, H, W, &row_mask, &col_mask);
  Tensor *prow = op_reshape(pos_row, SHAPE(B, 1, W, d)), *pcol = op_reshape(pos_col, SHAPE(B, H, 1, d));
  EncStep e = {.a = a, .ctx = ctx, .prow = prow, .pcol = pcol, .row_mask = row_mask, .col_mask = col_mask};
  TensorCarry carry = {.t = {op_reshape(src, SHAPE(B, H, W, d))}, .n = 1};
  tensor_run_layers((int)a->n_enc, enc_step, &e, &carry);
  Tensor *parts[2] = {pos_row, pos_col};
  *pos = op_concat(parts, 2, 1);
  return op_reshape(carry.t[0], SHAPE(B, H * W, d));
}

// --- decoder ---

typedef struct {
  Tensor *query_pos, *pos_x, *pos_y;  // [Q, d]
  Tensor *key_row, *key_col, *value;  // [B, H, W, d] memory + pos_row, memory + pos_col, memory
  Tensor *row_mask, *col_mask;        // [B, W], [B, H]
} DecContext;

static Tensor *dec_layer_forward(const DecLayer *l, const NnCtx *ctx, float p, Tensor *tgt, const DecContext *c,
                                 Tensor **cross_weights) {
  Tensor *q = op_add(tgt, c->query_pos);
  tgt = layernorm_forward(&l->norm2, op_add(tgt, nn_dropout(ctx, mha_forward(&l->self_attn, ctx, q, q, tgt, NULL), p)));
  Tensor *y = rcda_forward(&l->cross_attn, ctx, op_add(tgt, c->pos_x), op_add(tgt, c->pos_y), c->key_row, c->key_col,
                           c->value, c->row_mask, c->col_mask, cross_weights);  // [B, Q, d]
  tgt = layernorm_forward(&l->norm1, op_add(tgt, nn_dropout(ctx, y, p)));
  return ffn(&l->linear1, &l->linear2, &l->ffn_norm, ctx, p, tgt);
}

// The queries' rows of the anchors and patterns: query q = p * NP + i is anchor i, pattern p.
static void query_rows(int64_t NP, int64_t Q, int64_t *anchor, int64_t *pattern) {
  for (int64_t q = 0; q < Q; q++) anchor[q] = q % NP, pattern[q] = q / NP;
}

// query_pos, pos_x, pos_y [Q, d] from the NP anchors [NP, 2] (computed once per anchor).
static void query_positions(const AnchorTransformer *a, const int64_t *anchor, int64_t Q, DecContext *c) {
  int64_t d = a->s.dim;
  Tensor *xs = op_slice(a->position, 1, 0, 1), *ys = op_slice(a->position, 1, 1, 2);  // [NP, 1]
  Tensor *yx[2] = {sine_features(ys, d / 2), sine_features(xs, d / 2)};               // pos2posemb2d: y then x
  c->query_pos = op_index_select(adapt(&a->pos2d_0, &a->pos2d_2, op_concat(yx, 2, 1)), anchor, Q);
  c->pos_x = op_index_select(adapt(&a->pos1d_0, &a->pos1d_2, sine_features(xs, d)), anchor, Q);
  c->pos_y = op_index_select(adapt(&a->pos1d_0, &a->pos1d_2, sine_features(ys, d)), anchor, Q);
}

typedef struct {
  const AnchorTransformer *a;
  const NnCtx *ctx;
  const DecContext *c;
  DecoderOutput *out;
} DecStep;

// Decoder layer i (tensor_run_layers): tgt in carry->t[0]; its output (unnormed, as the reference)
// joins every earlier layer's.
static void dec_step(void *state, int i, TensorCarry *carry) {
  const DecStep *s = state;
  bool last = i == s->a->n_dec - 1 && s->ctx->want_cross_attn;
  carry->t[0] =
      dec_layer_forward(&s->a->dec[i], s->ctx, s->a->s.dropout, carry->t[0], s->c, last ? &s->out->cross_attn : NULL);
  s->out->hs[i] = carry->t[0];
  carry->t[carry->n++] = carry->t[0];
  if (last) carry->t[carry->n++] = s->out->cross_attn;
}

static void forward(const void *state, const NnCtx *ctx, const DecoderInput *in, DecoderOutput *out) {
  const AnchorTransformer *a = state;
  const FeatureGeometry *g = in->geom;
  int64_t B = in->batch, H = g->Hp, W = g->Wp, d = a->s.dim, NP = a->positions, Q = ANCHOR_PATTERNS * NP;
  int64_t *rows = detr_malloc((size_t)(2 * Q) * sizeof(int64_t), "decoder_anchor rows");  // anchor [Q], pattern [Q]
  query_rows(NP, Q, rows, rows + Q);
  DecContext c;
  query_positions(a, rows, Q, &c);
  out->reference = op_index_select(a->position, rows, Q);  // [Q, 2]
  Tensor *tgt =
      op_add(op_zeros(in->memory->device, SHAPE(B, Q, d)), op_index_select(a->pattern, rows + Q, Q));  // [B, Q, d]
  free(rows);
  Tensor *mem = op_reshape(in->memory, SHAPE(B, H, W, d));
  c.key_row = op_add(mem, op_reshape(op_slice(in->pos, 1, 0, W), SHAPE(B, 1, W, d)));
  c.key_col = op_add(mem, op_reshape(op_slice(in->pos, 1, W, W + H), SHAPE(B, H, 1, d)));
  c.value = mem;
  rcda_masks(in->key_mask, H, W, &c.row_mask, &c.col_mask);
  out->n_layers = (int)a->n_dec;
  DecStep ds = {.a = a, .ctx = ctx, .c = &c, .out = out};
  TensorCarry carry = {.t = {tgt}, .n = 1};
  tensor_run_layers((int)a->n_dec, dec_step, &ds, &carry);
}

// sigmoid(head_out + [inverse_sigmoid(anchor), 0, 0]): the anchor is the box centre's prior.
static Tensor *boxes(const void *state, Tensor *head_out, const DecoderOutput *out, int layer) {
  (void)state, (void)layer;
  Tensor *centre = op_add(op_slice(head_out, 2, 0, 2), op_inverse_sigmoid(out->reference, INVERSE_SIGMOID_EPS));
  Tensor *parts[2] = {centre, op_slice(head_out, 2, 2, 4)};
  return op_sigmoid(op_concat(parts, 2, 2));
}

// Transformer._reset_parameters: the class bias at the focal prior -log((1 - 0.01) / 0.01); the box
// head's last layer weight 0 and bias (0, 0, -2, -2), so a box starts at its anchor, small.
static void init_heads(Linear *class_embed, Mlp *bbox_embed) {
  tensor_fill_(class_embed->bias, -logf((1.0f - 0.01f) / 0.01f));
  Linear *last = &bbox_embed->layers[bbox_embed->n_layers - 1];
  tensor_fill_(last->weight, 0.0f);
  const float bias[4] = {0.0f, 0.0f, -2.0f, -2.0f};
  tensor_copy_from_host_(last->bias, bias);
}

static const char *unsupported(const DecoderShape *shape) {
  if (shape->encoder_attn && shape->encoder_attn != encoder_attn_default() && !enact_sigma(shape))
    return "the anchor decoder's own encoder (RCDA) takes encoder_attn=enact_official only (Anchor-DETR-ENACT)";
  if (shape->s.pre_norm) return "the anchor decoder is post-norm only (as the reference)";
  if (shape->queries % ANCHOR_PATTERNS) return "the anchor decoder needs num_queries a multiple of its 3 patterns";
  if (shape->s.dim % 2) return "the anchor decoder needs an even hidden_dim (its 2-D sine positions)";
  return NULL;
}

static const DecoderModelLayout LAYOUT = {
    .prefix = "transformer",
    .backbone = "backbone.body",
    .input_proj = "input_proj.0.0",
    .input_norm = "input_proj.0.1",
    .class_embed = "transformer.class_embed.0",
    .bbox_embed = "transformer.bbox_embed.0",
    .own_queries = true,
    .last_ffn = "transformer.decoder_layers.%d.ffn.linear1.weight",
};

const DecoderKind decoder_anchor = {
    .name = "anchor",
    .model = "Anchor DETR",
    .summary = "Anchor DETR: anchor-point queries x patterns, row-column decoupled attention, focal classes",
    .state_size = sizeof(AnchorTransformer),
    .create = create,
    .init = init,
    .forward = forward,
    .boxes = boxes,
    .classes = &class_head_focal,
    .init_heads = init_heads,
    .unsupported = unsupported,
    .encode = encode,
    .layout = &LAYOUT,
    .own_encoder_attn = true,
};
