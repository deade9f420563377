// DETR's transformer (models/transformer.py): post-norm encoder and decoder layers by default,
// pre-norm as an option; the decoder returns the final-LayerNorm'd output of every layer.
// Batch-first layout [B, L, d] throughout (the reference is sequence-first: the same numbers).
#pragma once
#include "nn/layers.h"

typedef struct {
  int64_t dim, heads, ffn_dim;
  float dropout;
  bool pre_norm;
} TransformerShape;

typedef struct {
  MultiheadAttention self_attn;
  Linear linear1, linear2;
  LayerNorm norm1, norm2;
  TransformerShape s;
} EncoderLayer;

typedef struct {
  MultiheadAttention self_attn, multihead_attn;
  Linear linear1, linear2;
  LayerNorm norm1, norm2, norm3;
  TransformerShape s;
} DecoderLayer;

EncoderLayer encoder_layer_create(ParamStore *ps, const char *prefix, TransformerShape s);
// src, pos [B, HW, d]; mask additive [B, HW] or NULL.
Tensor *encoder_layer_forward(const EncoderLayer *l, const NnCtx *ctx, Tensor *src, Tensor *pos, Tensor *mask);
// The feed-forward half of an encoder layer after its attention output attn_out (shared with
// ENACT's encoder layer, which replaces only the attention).
Tensor *encoder_layer_finish(const EncoderLayer *l, const NnCtx *ctx, Tensor *src, Tensor *attn_out);

DecoderLayer decoder_layer_create(ParamStore *ps, const char *prefix, TransformerShape s);
// tgt, query_pos [B, Q, d] (query_pos may be [Q, d]); memory, pos [B, HW, d].
Tensor *decoder_layer_forward(const DecoderLayer *l, const NnCtx *ctx, Tensor *tgt, Tensor *memory,
                              Tensor *memory_mask, Tensor *pos, Tensor *query_pos);

// Xavier-uniform on every matrix of the transformer, zero biases for attention (torch's MHA
// reset), torch's Linear default for the FFN biases; LayerNorm weight 1, bias 0.
void encoder_layer_init(EncoderLayer *l, Rng *rng);
void decoder_layer_init(DecoderLayer *l, Rng *rng);
