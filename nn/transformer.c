#include "nn/transformer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static MultiheadAttention attention(ParamStore *ps, const char *prefix, const char *name, TransformerShape s) {
  char full[112];
  param_name_join(full, sizeof full, prefix, name);
  return mha_create(ps, full, s.dim, s.heads, s.dropout);
}

static Tensor *with_pos(Tensor *x, Tensor *pos) { return pos ? op_add(x, pos) : x; }

EncoderLayer encoder_layer_create(ParamStore *ps, const char *prefix, TransformerShape s, const EncoderAttnKind *attn,
                                  const AttnSettings *settings) {
  attn = attn ? attn : encoder_attn_default();
  EncoderLayer l = {.self_attn = attn->own_projections ? (MultiheadAttention){.dim = s.dim, .heads = s.heads}
                                                       : attention(ps, prefix, "self_attn", s),
                    .linear1 = linear_create_named(ps, prefix, "linear1", s.dim, s.ffn_dim),
                    .linear2 = linear_create_named(ps, prefix, "linear2", s.ffn_dim, s.dim),
                    .norm1 = layernorm_create_named(ps, prefix, "norm1", s.dim),
                    .norm2 = layernorm_create_named(ps, prefix, "norm2", s.dim),
                    .s = s,
                    .attn = attn};
  if (l.attn->extras_size) {
    l.attn_extras = detr_calloc(1, l.attn->extras_size, "encoder_layer_create attn_extras");
  }
  if (l.attn->create) {
    char full[112];
    param_name_join(full, sizeof full, prefix, "self_attn");
    int before = ps->count;
    l.attn->create(l.attn_extras, ps, full, s.dim, s.heads, settings);
    // Absent from DETR weights; a variant with its own projections needs its weights.
    if (!attn->own_projections)
      for (int i = before; i < ps->count; i++) ps->items[i].optional = true;
  }
  return l;
}

void encoder_layer_free(EncoderLayer *l) {
  free(l->attn_extras);
  l->attn_extras = NULL;
}

static Tensor *ffn(const Linear *l1, const Linear *l2, const NnCtx *ctx, float p, Tensor *x) {
  return linear_forward(l2, linear_relu_dropout_forward(ctx, l1, x, p));
}

Tensor *encoder_layer_finish(const EncoderLayer *l, const NnCtx *ctx, Tensor *src, Tensor *attn_out) {
  float p = l->s.dropout;
  src = op_add(src, nn_dropout(ctx, attn_out, p));
  if (l->s.pre_norm)
    return op_add(src, nn_dropout(ctx, ffn(&l->linear1, &l->linear2, ctx, p, layernorm_forward(&l->norm2, src)), p));
  src = layernorm_forward(&l->norm1, src);
  src = op_add(src, nn_dropout(ctx, ffn(&l->linear1, &l->linear2, ctx, p, src), p));
  return layernorm_forward(&l->norm2, src);
}

Tensor *encoder_layer_attn_input(const EncoderLayer *l, Tensor *src) {
  return l->s.pre_norm ? layernorm_forward(&l->norm1, src) : src;
}

Tensor *encoder_layer_forward(const EncoderLayer *l, const NnCtx *ctx, Tensor *src, Tensor *pos,
                              const FeatureGeometry *g, AttnTrace *trace, char *err, size_t err_cap) {
  EncoderAttnInput in = {.proj = l->attn->own_projections ? NULL : &l->self_attn,
                         .x = encoder_layer_attn_input(l, src),
                         .pos = pos,
                         .geom = g,
                         .layer = l->index};
  Tensor *attn = l->attn->forward(l->attn_extras, ctx, &in, trace, err, err_cap);
  return attn ? encoder_layer_finish(l, ctx, src, attn) : NULL;
}

DecoderLayer decoder_layer_create(ParamStore *ps, const char *prefix, TransformerShape s) {
  return (DecoderLayer){.self_attn = attention(ps, prefix, "self_attn", s),
                        .multihead_attn = attention(ps, prefix, "multihead_attn", s),
                        .linear1 = linear_create_named(ps, prefix, "linear1", s.dim, s.ffn_dim),
                        .linear2 = linear_create_named(ps, prefix, "linear2", s.ffn_dim, s.dim),
                        .norm1 = layernorm_create_named(ps, prefix, "norm1", s.dim),
                        .norm2 = layernorm_create_named(ps, prefix, "norm2", s.dim),
                        .norm3 = layernorm_create_named(ps, prefix, "norm3", s.dim),
                        .s = s,
                        .cross_attn = mha_forward_weights};
}

Tensor *decoder_layer_forward(const DecoderLayer *l, const NnCtx *ctx, Tensor *tgt, Tensor *memory, Tensor *memory_mask,
                              Tensor *pos, Tensor *query_pos, Tensor **cross_weights) {
  float p = l->s.dropout;
  Tensor *key = with_pos(memory, pos);
  if (l->s.pre_norm) {
    Tensor *t2 = layernorm_forward(&l->norm1, tgt);
    Tensor *qk = with_pos(t2, query_pos);
    tgt = op_add(tgt, nn_dropout(ctx, mha_forward(&l->self_attn, ctx, qk, qk, t2, NULL), p));
    t2 = layernorm_forward(&l->norm2, tgt);
    tgt = op_add(tgt, nn_dropout(ctx,
                                 l->cross_attn(&l->multihead_attn, ctx, with_pos(t2, query_pos), key, memory,
                                               memory_mask, cross_weights),
                                 p));
    t2 = layernorm_forward(&l->norm3, tgt);
    return op_add(tgt, nn_dropout(ctx, ffn(&l->linear1, &l->linear2, ctx, p, t2), p));
  }
  Tensor *qk = with_pos(tgt, query_pos);
  tgt =
      layernorm_forward(&l->norm1, op_add(tgt, nn_dropout(ctx, mha_forward(&l->self_attn, ctx, qk, qk, tgt, NULL), p)));
  Tensor *cross =
      l->cross_attn(&l->multihead_attn, ctx, with_pos(tgt, query_pos), key, memory, memory_mask, cross_weights);
  tgt = layernorm_forward(&l->norm2, op_add(tgt, nn_dropout(ctx, cross, p)));
  tgt = op_add(tgt, nn_dropout(ctx, ffn(&l->linear1, &l->linear2, ctx, p, tgt), p));
  return layernorm_forward(&l->norm3, tgt);
}

// DETR's Transformer._reset_parameters xaviers every matrix, the output projection's too (Anchor
// DETR's keeps torch's MultiheadAttention init there: nn/decoder_anchor.c's init_mha differs).
static void init_mha(MultiheadAttention *a, Rng *rng) {
  init_xavier_uniform(a->in_proj_weight, rng);
  tensor_fill_(a->in_proj_bias, 0.0f);
  init_xavier_uniform(a->out_proj.weight, rng);
  tensor_fill_(a->out_proj.bias, 0.0f);
}

// FFN: torch's Linear default first, then the transformer's xavier reset of the matrices.
static void init_ffn(Linear *l, Rng *rng) {
  init_torch_default(l->weight, l->bias, rng);
  init_xavier_uniform(l->weight, rng);
}

void encoder_layer_init(EncoderLayer *l, Rng *rng) {
  if (!l->attn->own_projections) init_mha(&l->self_attn, rng);
  init_ffn(&l->linear1, rng);
  init_ffn(&l->linear2, rng);
  if (l->attn->init) l->attn->init(l->attn_extras, rng);
}

void decoder_layer_init(DecoderLayer *l, Rng *rng) {
  init_mha(&l->self_attn, rng);
  init_mha(&l->multihead_attn, rng);
  init_ffn(&l->linear1, rng);
  init_ffn(&l->linear2, rng);
}
