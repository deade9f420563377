// DETR's decoder (models/transformer.py TransformerDecoder, return_intermediate): post-norm (or
// pre-norm) layers of self-attention over the queries, cross-attention into the memory and an FFN,
// starting from zeros with the learned queries as positions; every layer's output through the
// shared final LayerNorm. Boxes: sigmoid of the box head's output.
// Cross-attention (config decoder_cross_attn): softmax (the reference's nn.MultiheadAttention) or
// kmeans (nn/cross_attn_kmeans.c, docs/kmeans_cross_attention.md), both on multihead_attn's weights.
#include <stdio.h>
#include <string.h>

#include "nn/decoder.h"

typedef struct {
  DecoderLayer layers[DECODER_MAX_LAYERS];
  LayerNorm norm;  // transformer.decoder.norm
  int64_t n_layers, dim;
} DetrDecoder;

static const char *const CROSS_ATTNS[] = {"softmax", "kmeans", NULL};

// The one place the choice is read.
static CrossAttnFn cross_attn_fn(const char *name) {
  return name && !strcmp(name, "kmeans") ? kmeans_cross_attention : mha_forward_weights;
}

static void create(void *state, ParamStore *ps, const char *prefix, const DecoderShape *shape) {
  DetrDecoder *d = state;
  char name[112];
  for (int i = 0; i < shape->layers; i++) {
    snprintf(name, sizeof name, "%s.layers.%d", prefix, i);
    d->layers[i] = decoder_layer_create(ps, name, shape->s);
    d->layers[i].cross_attn = cross_attn_fn(shape->cross_attn);
  }
  snprintf(name, sizeof name, "%s.norm", prefix);
  d->norm = layernorm_create(ps, name, shape->s.dim);
  d->n_layers = shape->layers;
  d->dim = shape->s.dim;
}

static void init(const void *state, Rng *rng) {
  const DetrDecoder *d = state;
  for (int i = 0; i < d->n_layers; i++) decoder_layer_init((DecoderLayer *)&d->layers[i], rng);
}

typedef struct {
  const DetrDecoder *d;
  const NnCtx *ctx;
  const DecoderInput *in;
  DecoderOutput *out;
} Step;

// Layer i (tensor_run_layers): tgt in carry->t[0]; its normed output joins every earlier layer's.
static void layer_step(void *state, int i, TensorCarry *carry) {
  Step *s = state;
  const DecoderInput *in = s->in;
  bool last = i == s->d->n_layers - 1 && s->ctx->want_cross_attn;
  Tensor *tgt = decoder_layer_forward(&s->d->layers[i], s->ctx, carry->t[0], in->memory, in->key_mask, in->pos,
                                      in->query_embed, last ? &s->out->cross_attn : NULL);
  s->out->hs[i] = layernorm_forward(&s->d->norm, tgt);  // every intermediate output is normed
  carry->t[0] = tgt;
  carry->t[carry->n++] = s->out->hs[i];
  if (last) carry->t[carry->n++] = s->out->cross_attn;
}

static void forward(const void *state, const NnCtx *ctx, const DecoderInput *in, DecoderOutput *out) {
  const DetrDecoder *d = state;
  int64_t Q = in->query_embed->shape.d[0];
  out->n_layers = (int)d->n_layers;
  out->reference = NULL;
  Step s = {.d = d, .ctx = ctx, .in = in, .out = out};
  TensorCarry carry = {.t = {op_zeros(in->memory->device, SHAPE(in->batch, Q, d->dim))}, .n = 1};  // tgt [B, Q, d]
  tensor_run_layers((int)d->n_layers, layer_step, &s, &carry);
}

static Tensor *boxes(const void *state, Tensor *head_out, const DecoderOutput *out, int layer) {
  return op_sigmoid(head_out);
}

const DecoderKind decoder_detr = {
    .name = "detr",
    .model = "DETR",
    .summary = "DETR's decoder: self-attention, cross-attention with the learned queries as positions, FFN",
    .state_size = sizeof(DetrDecoder),
    .create = create,
    .init = init,
    .forward = forward,
    .boxes = boxes,
    .cross_attns = CROSS_ATTNS,
};
