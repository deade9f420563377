// Conditional DETR's decoder (Meng et al., ICCV 2021; Atten4Vis/ConditionalDETR
// models/transformer.py TransformerDecoder and TransformerDecoderLayer.forward_post,
// models/conditional_detr.py; docs/conditional_detr.md). Per query a reference point
// s = sigmoid(ref_point_head(query_pos)) [Q, 2]; its sine embedding p_s; in layer l > 0 the
// transform T = query_scale(output of layer l-1) scales it (layer 0: T = 1). In each layer:
//   self-attention   q = sa_qcontent(tgt) + sa_qpos(query_pos), k likewise, v = sa_v(tgt)
//   cross-attention  per head, content and spatial parts side by side:
//                    q_h = [ca_qcontent(tgt) (+ ca_qpos(query_pos) in layer 0)]_h ++ [ca_qpos_sine(p_s T)]_h
//                    k_h = [ca_kcontent(memory) (+ ca_kpos(pos) in layer 0)]_h ++ [ca_kpos(pos)]_h
//                    v = ca_v(memory); softmax over q_h k_h / sqrt(2 d / heads); out_proj
//   then FFN, post-norm as DETR. Every layer's output through the final norm. Boxes: the box
// head's output with inverse_sigmoid(s) added to its centre, then sigmoid. Classes: sigmoid focal
// (nn/class_focal.c). The reference's gen_sineembed_for_position has 128 features per coordinate
// (d = 256); here d / 2, the same at d = 256 and defined for the small presets.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/decoder.h"

#define INVERSE_SIGMOID_EPS 1e-5f  // util/misc.py inverse_sigmoid

typedef struct {
  Linear sa_qcontent, sa_qpos, sa_kcontent, sa_kpos, sa_v, sa_out;
  Linear ca_qcontent, ca_qpos, ca_kcontent, ca_kpos, ca_v, ca_qpos_sine, ca_out;  // ca_qpos: layer 0 only
  Linear linear1, linear2;
  LayerNorm norm1, norm2, norm3;
} CondLayer;

// What a layer computes from the learned queries alone (prepare_inference), each [Q, d]; NULL: not
// prepared (computed in the forward).
typedef struct {
  Tensor *sa_qpos, *sa_kpos;  // sa_qpos(query_pos), sa_kpos(query_pos)
  Tensor *ca_qpos, *q_sine;   // layer 0: ca_qpos(query_pos), ca_qpos_sine(p_s) (later layers scale p_s by tgt)
} QueryTerms;

typedef struct {
  CondLayer layers[DECODER_MAX_LAYERS];
  LayerNorm norm;      // transformer.decoder.norm
  Mlp query_scale;     // d -> d -> d
  Mlp ref_point_head;  // d -> d -> 2
  TransformerShape s;
  int64_t n_layers;
  // prepare_inference's: the reference points [Q, 2], their sine embedding p_s [Q, d], each
  // layer's query terms; NULL until prepared.
  Tensor *reference, *sine;
  QueryTerms terms[DECODER_MAX_LAYERS];
} CondDecoder;

// The reference's state_dict order within a layer.
static void create_layer(CondLayer *l, ParamStore *ps, const char *p, TransformerShape s, bool first) {
  int64_t d = s.dim;
  l->sa_qcontent = linear_create_named(ps, p, "sa_qcontent_proj", d, d);
  l->sa_qpos = linear_create_named(ps, p, "sa_qpos_proj", d, d);
  l->sa_kcontent = linear_create_named(ps, p, "sa_kcontent_proj", d, d);
  l->sa_kpos = linear_create_named(ps, p, "sa_kpos_proj", d, d);
  l->sa_v = linear_create_named(ps, p, "sa_v_proj", d, d);
  l->sa_out = linear_create_named(ps, p, "self_attn.out_proj", d, d);
  l->ca_qcontent = linear_create_named(ps, p, "ca_qcontent_proj", d, d);
  if (first) l->ca_qpos = linear_create_named(ps, p, "ca_qpos_proj", d, d);  // None in later layers
  l->ca_kcontent = linear_create_named(ps, p, "ca_kcontent_proj", d, d);
  l->ca_kpos = linear_create_named(ps, p, "ca_kpos_proj", d, d);
  l->ca_v = linear_create_named(ps, p, "ca_v_proj", d, d);
  l->ca_qpos_sine = linear_create_named(ps, p, "ca_qpos_sine_proj", d, d);
  l->ca_out = linear_create_named(ps, p, "cross_attn.out_proj", d, d);
  l->linear1 = linear_create_named(ps, p, "linear1", d, s.ffn_dim);
  l->linear2 = linear_create_named(ps, p, "linear2", s.ffn_dim, d);
  l->norm1 = layernorm_create_named(ps, p, "norm1", d);
  l->norm2 = layernorm_create_named(ps, p, "norm2", d);
  l->norm3 = layernorm_create_named(ps, p, "norm3", d);
}

static void create(void *state, ParamStore *ps, const char *prefix, const DecoderShape *shape) {
  CondDecoder *c = state;
  char name[112];
  for (int i = 0; i < shape->layers; i++) {
    snprintf(name, sizeof name, "%s.layers.%d", prefix, i);
    create_layer(&c->layers[i], ps, name, shape->s, i == 0);
  }
  int64_t d = shape->s.dim;
  snprintf(name, sizeof name, "%s.norm", prefix);
  c->norm = layernorm_create(ps, name, d);
  snprintf(name, sizeof name, "%s.query_scale", prefix);
  c->query_scale = mlp_create(ps, name, d, d, d, 2);
  snprintf(name, sizeof name, "%s.ref_point_head", prefix);
  c->ref_point_head = mlp_create(ps, name, d, d, 2, 2);
  c->s = shape->s;
  c->n_layers = shape->layers;
}

// torch's Linear default, then Transformer._reset_parameters' xavier on every matrix; the
// attention output projections' biases 0 (attention.py MultiheadAttention._reset_parameters).
static void init_linear(Linear *l, Rng *rng, bool zero_bias) {
  if (!l->weight) return;  // ca_qpos after layer 0
  init_torch_default(l->weight, l->bias, rng);
  init_xavier_uniform(l->weight, rng);
  if (zero_bias) tensor_fill_(l->bias, 0.0f);
}

static void init(const void *state, Rng *rng) {
  const CondDecoder *c = state;
  for (int i = 0; i < c->n_layers; i++) {
    CondLayer *l = (CondLayer *)&c->layers[i];
    Linear *plain[] = {&l->sa_qcontent,  &l->sa_qpos, &l->sa_kcontent, &l->sa_kpos, &l->sa_v,
                       &l->ca_qcontent,  &l->ca_qpos, &l->ca_kcontent, &l->ca_kpos, &l->ca_v,
                       &l->ca_qpos_sine, &l->linear1, &l->linear2};
    for (size_t k = 0; k < sizeof plain / sizeof *plain; k++) init_linear(plain[k], rng, false);
    init_linear(&l->sa_out, rng, true);
    init_linear(&l->ca_out, rng, true);
  }
  Mlp *mlps[] = {(Mlp *)&c->query_scale, (Mlp *)&c->ref_point_head};
  for (int m = 0; m < 2; m++)
    for (int i = 0; i < mlps[m]->n_layers; i++) init_linear(&mlps[m]->layers[i], rng, false);
}

// gen_sineembed_for_position: points [Q, 2] (x, y in [0, 1]) -> [Q, d], the y features then the
// x features; feature j of a coordinate c is sin(2 pi c / T^(2 floor(j/2) / F)) for even j and cos
// for odd j, F = d / 2, T = 10000. Even and odd are selected by 0/1 masks (exact).
static Tensor *sine_embed(Tensor *points, int64_t d) {
  int64_t Q = points->shape.d[0], F = d / 2;
  Device dev = points->device;
  float *host = detr_malloc((size_t)(3 * F) * sizeof(float), "decoder_conditional");  // dim_t [F], even [F], odd [F]
  for (int64_t j = 0; j < F; j++) {
    host[j] = powf(10000.0f, (float)(2 * (j / 2)) / (float)F);
    host[F + j] = j % 2 == 0 ? 1.0f : 0.0f;
    host[2 * F + j] = j % 2 == 0 ? 0.0f : 1.0f;
  }
  Tensor *dim_t = op_constant(dev, SHAPE(F), host);
  Tensor *even = op_constant(dev, SHAPE(F), host + F);
  Tensor *odd = op_constant(dev, SHAPE(F), host + 2 * F);
  free(host);
  Tensor *yx[2] = {op_slice(points, 1, 1, 2), op_slice(points, 1, 0, 1)};
  Tensor *c = op_reshape(op_concat(yx, 2, 1), SHAPE(Q, 2, 1));                           // [Q, 2 (y, x), 1]
  Tensor *arg = op_div(op_mul_scalar(c, (float)(2.0 * 3.14159265358979323846)), dim_t);  // [Q, 2, F]
  Tensor *emb = op_add(op_mul(op_sin(arg), even), op_mul(op_cos(arg), odd));             // [Q, 2, F]
  return op_reshape(emb, SHAPE(Q, d));
}

// [.., L, d] per head beside [.., L, d] per head -> [B, L, 2d]: head h's 2d/heads features are
// a's head h then b's head h (the reference's view(L, B, heads, d/heads) and cat on dim 3).
static Tensor *concat_heads(Tensor *a, Tensor *b, int64_t heads) {
  int64_t B = a->shape.d[0], L = a->shape.d[1], d = a->shape.d[2];
  Tensor *parts[2] = {op_reshape(a, SHAPE(B, L, heads, d / heads)), op_reshape(b, SHAPE(B, L, heads, d / heads))};
  return op_reshape(op_concat(parts, 2, 3), SHAPE(B, L, 2 * d));
}

static Tensor *ffn(const CondLayer *l, const NnCtx *ctx, float p, Tensor *x) {
  return linear_forward(&l->linear2, linear_relu_dropout_forward(ctx, &l->linear1, x, p));
}

// The cross-attention as the reference computes it: the memory's and positions' projections, then
// per head [content ++ spatial] queries against [content ++ spatial] keys. q_content [B, Q, d] (layer
// 0: with ca_qpos(query_pos) added); q_sine [B, Q, d] (layer 0: [Q, d]). -> [B, Q, d] before ca_out.
static Tensor *cross_attention(const CondLayer *l, const TransformerShape *s, const NnCtx *ctx, Tensor *q_content,
                               Tensor *q_sine, Tensor *memory, Tensor *key_mask, Tensor *pos, bool first,
                               Tensor **cross_weights) {
  int64_t B = q_content->shape.d[0], Q = q_content->shape.d[1], d = s->dim;
  Tensor *k_content = linear_forward(&l->ca_kcontent, memory);  // [B, HW, d]
  Tensor *k_pos = linear_forward(&l->ca_kpos, pos);             // [B, HW, d]
  Tensor *v = linear_forward(&l->ca_v, memory);
  if (first) k_content = op_add(k_content, k_pos);
  if (q_sine->shape.ndim == 2)  // one per query: the same for every image
    q_sine = op_add(op_zeros(q_content->device, SHAPE(B, Q, d)), q_sine);
  Tensor *q_cross = concat_heads(q_content, q_sine, s->heads);  // [B, Q, 2d]
  Tensor *k_cross = concat_heads(k_content, k_pos, s->heads);   // [B, HW, 2d]
  return attention_heads(ctx, q_cross, k_cross, v, s->heads, key_mask, s->dropout, cross_weights);
}

// The same with the projections moved onto the queries (attention_fold_projections), at inference
// where it pays: head h's logit is q_content,h . k_content,h + q_sine,h . k_pos,h (in layer 0 with
// k_pos,h in k_content,h too), a term on the memory and a term on the positions.
static bool cross_attention_folds(const TransformerShape *s, const NnCtx *ctx, Tensor *q_content, Tensor *memory) {
  int64_t d = s->dim, widths[2] = {d, d};
  return ctx->inference &&
         attention_fold_pays(memory->device, q_content->shape.d[1], memory->shape.d[1], d, s->heads, widths, 2, d);
}

static Tensor *cross_attention_folded(const CondLayer *l, const TransformerShape *s, Tensor *q_content, Tensor *q_sine,
                                      Tensor *memory, Tensor *key_mask, Tensor *pos, bool first,
                                      Tensor **cross_weights) {
  int64_t d = s->dim;
  AttnKeyTerm terms[2] = {
      {.query = q_content, .weight = l->ca_kcontent.weight, .keys = memory},
      {.query = first ? op_add(q_content, q_sine) : q_sine, .weight = l->ca_kpos.weight, .keys = pos}};
  return attention_fold_projections(terms, 2, l->ca_v.weight, l->ca_v.bias, memory, s->heads,
                                    1.0f / sqrtf((float)(2 * d / s->heads)), key_mask, cross_weights);
}

// tgt [B, Q, d]; query_pos [Q, d]; memory, pos [B, HW, d]; sine: p_s T, [B, Q, d] (layer 0: [Q, d]).
// qt: the layer's query terms where prepared and ctx->inference, else NULL. cross_weights (may be
// NULL): the cross-attention's weights averaged over the heads [B, Q, HW].
static Tensor *layer_forward(const CondLayer *l, const TransformerShape *s, const NnCtx *ctx, Tensor *tgt,
                             Tensor *memory, Tensor *key_mask, Tensor *pos, Tensor *query_pos, Tensor *sine,
                             const QueryTerms *qt, bool first, Tensor **cross_weights) {
  float p = s->dropout;
  Tensor *q = op_add(linear_forward(&l->sa_qcontent, tgt), qt ? qt->sa_qpos : linear_forward(&l->sa_qpos, query_pos));
  Tensor *k = op_add(linear_forward(&l->sa_kcontent, tgt), qt ? qt->sa_kpos : linear_forward(&l->sa_kpos, query_pos));
  Tensor *v = linear_forward(&l->sa_v, tgt);
  Tensor *self = linear_forward(&l->sa_out, attention_heads(ctx, q, k, v, s->heads, NULL, p, NULL));
  tgt = layernorm_forward(&l->norm1, op_add(tgt, nn_dropout(ctx, self, p)));

  // ca_qpos and ca_qpos_sine before the keys' and values' projections, where the reference has them
  // after: no tensor is read by both, so every gradient is summed in the same order.
  Tensor *q_content = linear_forward(&l->ca_qcontent, tgt);  // [B, Q, d]
  if (first) q_content = op_add(q_content, qt ? qt->ca_qpos : linear_forward(&l->ca_qpos, query_pos));
  Tensor *q_sine = qt && qt->q_sine ? qt->q_sine : linear_forward(&l->ca_qpos_sine, sine);  // [B, Q, d]; layer 0 [Q, d]
  Tensor *cross = cross_attention_folds(s, ctx, q_content, memory)
                      ? cross_attention_folded(l, s, q_content, q_sine, memory, key_mask, pos, first, cross_weights)
                      : cross_attention(l, s, ctx, q_content, q_sine, memory, key_mask, pos, first, cross_weights);
  tgt = layernorm_forward(&l->norm2, op_add(tgt, nn_dropout(ctx, linear_forward(&l->ca_out, cross), p)));
  tgt = op_add(tgt, nn_dropout(ctx, ffn(l, ctx, p, tgt), p));
  return layernorm_forward(&l->norm3, tgt);
}

typedef struct {
  const CondDecoder *c;
  const NnCtx *ctx;
  const DecoderInput *in;
  DecoderOutput *out;
  Tensor *sine;
  bool prepared;
} Step;

// Layer i (tensor_run_layers): tgt in carry->t[0]; its normed output joins every earlier layer's
// (the reference points and their sine were made before the layers: they outlive them).
static void layer_step(void *state, int i, TensorCarry *carry) {
  const Step *s = state;
  const CondDecoder *c = s->c;
  const DecoderInput *in = s->in;
  Tensor *tgt = carry->t[0];
  Tensor *scaled = i == 0 ? s->sine : op_mul(s->sine, mlp_forward(&c->query_scale, tgt));  // p_s T
  bool last = i == c->n_layers - 1 && s->ctx->want_cross_attn;
  tgt = layer_forward(&c->layers[i], &c->s, s->ctx, tgt, in->memory, in->key_mask, in->pos, in->query_embed, scaled,
                      s->prepared ? &c->terms[i] : NULL, i == 0, last ? &s->out->cross_attn : NULL);
  s->out->hs[i] = layernorm_forward(&c->norm, tgt);
  carry->t[0] = tgt;
  carry->t[carry->n++] = s->out->hs[i];
  if (last) carry->t[carry->n++] = s->out->cross_attn;
}

static void forward(const void *state, const NnCtx *ctx, const DecoderInput *in, DecoderOutput *out) {
  const CondDecoder *c = state;
  int64_t Q = in->query_embed->shape.d[0], d = c->s.dim;
  bool prepared = ctx->inference && c->reference;
  Tensor *reference = prepared ? c->reference : op_sigmoid(mlp_forward(&c->ref_point_head, in->query_embed));  // [Q, 2]
  Tensor *sine = prepared ? c->sine : sine_embed(reference, d);                                                // [Q, d]
  out->n_layers = (int)c->n_layers;
  out->reference = reference;
  Step s = {.c = c, .ctx = ctx, .in = in, .out = out, .sine = sine, .prepared = prepared};
  TensorCarry carry = {.t = {op_zeros(in->memory->device, SHAPE(in->batch, Q, d))}, .n = 1};
  tensor_run_layers((int)c->n_layers, layer_step, &s, &carry);  // tgt [B, Q, d] in carry.t[0]
}

// The forward's terms of the learned queries alone, computed by the same ops (the same floats) once:
// the reference points and their sine embedding, and per layer the self-attention's query and key
// positions and layer 0's query position and spatial query. The model's owner keeps them.
static void release_inference(void *state) {
  CondDecoder *c = state;
  c->reference = c->sine = NULL;
  for (int i = 0; i < c->n_layers; i++) c->terms[i] = (QueryTerms){0};
}

typedef struct {
  CondDecoder *c;
  Tensor *query_embed;
  TensorOwner *owner;
} Prepare;

// One step (tensor_run_layers): every term made in it is kept by the owner; the rest goes after it.
static void prepare_step(void *state, int step, TensorCarry *carry) {
  (void)step, (void)carry;
  const Prepare *p = state;
  CondDecoder *c = p->c;
  TensorOwner *o = p->owner;
  c->reference = tensor_owner_keep(o, op_sigmoid(mlp_forward(&c->ref_point_head, p->query_embed)));
  c->sine = tensor_owner_keep(o, sine_embed(c->reference, c->s.dim));
  for (int i = 0; i < c->n_layers; i++) {
    const CondLayer *l = &c->layers[i];
    QueryTerms *t = &c->terms[i];
    t->sa_qpos = tensor_owner_keep(o, linear_forward(&l->sa_qpos, p->query_embed));
    t->sa_kpos = tensor_owner_keep(o, linear_forward(&l->sa_kpos, p->query_embed));
    if (i == 0) {
      t->ca_qpos = tensor_owner_keep(o, linear_forward(&l->ca_qpos, p->query_embed));
      t->q_sine = tensor_owner_keep(o, linear_forward(&l->ca_qpos_sine, c->sine));
    }
  }
}

static void prepare_inference(void *state, Tensor *query_embed, TensorOwner *owner) {
  bool was = autograd_set_grad_enabled(false);
  Prepare p = {.c = state, .query_embed = query_embed, .owner = owner};
  TensorCarry none = {.n = 0};
  tensor_run_layers(1, prepare_step, &p, &none);
  autograd_set_grad_enabled(was);
}

// sigmoid(head_out + [inverse_sigmoid(s), 0, 0]): the reference point is the box centre's prior.
static Tensor *boxes(const void *state, Tensor *head_out, const DecoderOutput *out, int layer) {
  Tensor *centre = op_add(op_slice(head_out, 2, 0, 2), op_inverse_sigmoid(out->reference, INVERSE_SIGMOID_EPS));
  Tensor *parts[2] = {centre, op_slice(head_out, 2, 2, 4)};
  return op_sigmoid(op_concat(parts, 2, 2));
}

// ConditionalDETR.__init__: the class bias at the focal prior -log((1 - 0.01) / 0.01); the box
// head's last layer zero, so every box starts at its reference point.
static void init_heads(Linear *class_embed, Mlp *bbox_embed) {
  tensor_fill_(class_embed->bias, -logf((1.0f - 0.01f) / 0.01f));
  Linear *last = &bbox_embed->layers[bbox_embed->n_layers - 1];
  tensor_fill_(last->weight, 0.0f);
  tensor_fill_(last->bias, 0.0f);
}

static const char *unsupported(const DecoderShape *shape) {
  return shape->s.pre_norm ? "the conditional decoder is post-norm only (the reference raises NotImplementedError)"
                           : NULL;
}

const DecoderKind decoder_conditional = {
    .name = "conditional",
    .model = "Conditional DETR",
    .summary = "Conditional DETR: reference points, conditional spatial queries, focal classes",
    .state_size = sizeof(CondDecoder),
    .create = create,
    .init = init,
    .forward = forward,
    .boxes = boxes,
    .classes = &class_head_focal,
    .init_heads = init_heads,
    .unsupported = unsupported,
    .prepare_inference = prepare_inference,
    .release_inference = release_inference,
};
