// DETR's transformer (models/transformer.py): post-norm encoder and decoder layers by default,
// pre-norm as an option; the decoder returns the final-LayerNorm'd output of every layer.
// Batch-first layout [B, L, d] throughout (the reference is sequence-first: the same numbers).
#pragma once
#include "nn/encoder_attn.h"

typedef struct {
  int64_t dim, heads, ffn_dim;
  float dropout;
  bool pre_norm;
} TransformerShape;

typedef struct {
  MultiheadAttention self_attn;  // DETR's projections, used by every attention variant (tensors NULL when
                                 // the variant has its own: EncoderAttnKind.own_projections)
  Linear linear1, linear2;
  LayerNorm norm1, norm2;
  TransformerShape s;
  const EncoderAttnKind *attn;  // how queries meet keys and values (nn/encoder_attn.h)
  void *attn_extras;            // the variant's per-layer state (owned), or NULL
  int index;                    // position in the encoder (0 first; the model sets it): EncoderAttnInput.layer
} EncoderLayer;

// How a decoder layer's cross-attention forms its weights from DETR's projections (multihead_attn):
// mha_forward_weights (softmax, the reference) or kmeans_cross_attention (nn/cross_attn_kmeans.c).
// The decoder kind picks it (nn/decoder_detr.c, config key decoder_cross_attn). weights (may be
// NULL) receives the weights averaged over the heads [B, Lq, Lk].
typedef Tensor *(*CrossAttnFn)(const MultiheadAttention *a, const NnCtx *ctx, Tensor *query, Tensor *key, Tensor *value,
                               Tensor *key_padding_mask, Tensor **weights);

typedef struct {
  MultiheadAttention self_attn, multihead_attn;
  Linear linear1, linear2;
  LayerNorm norm1, norm2, norm3;
  TransformerShape s;
  CrossAttnFn cross_attn;  // mha_forward_weights unless the decoder kind sets another
} DecoderLayer;

// attn: the self-attention variant (NULL: dense); its parameters are registered after the layer's
// and are optional in a weights file (DETR weights load into every variant).
EncoderLayer encoder_layer_create(ParamStore *ps, const char *prefix, TransformerShape s, const EncoderAttnKind *attn,
                                  const AttnSettings *settings);
void encoder_layer_free(EncoderLayer *l);
// src, pos [B, HW, d]; g: the batch's feature map. trace (may be NULL) receives what the variant
// reports. Returns NULL with err set for a batch the variant cannot handle.
Tensor *encoder_layer_forward(const EncoderLayer *l, const NnCtx *ctx, Tensor *src, Tensor *pos,
                              const FeatureGeometry *g, AttnTrace *trace, char *err, size_t err_cap);
// The layer's input to its attention (post-norm: src; pre-norm: norm1(src)), and the rest of the
// layer after the attention output attn_out: residual, norms, FFN. encoder_layer_forward is these
// two around the variant; tests that hold a variant's data-dependent choices fixed call them.
Tensor *encoder_layer_attn_input(const EncoderLayer *l, Tensor *src);
Tensor *encoder_layer_finish(const EncoderLayer *l, const NnCtx *ctx, Tensor *src, Tensor *attn_out);

DecoderLayer decoder_layer_create(ParamStore *ps, const char *prefix, TransformerShape s);
// tgt, query_pos [B, Q, d] (query_pos may be [Q, d]); memory, pos [B, HW, d]. cross_weights (may
// be NULL) receives the cross-attention's weights averaged over the heads [B, Q, HW].
Tensor *decoder_layer_forward(const DecoderLayer *l, const NnCtx *ctx, Tensor *tgt, Tensor *memory, Tensor *memory_mask,
                              Tensor *pos, Tensor *query_pos, Tensor **cross_weights);

// Xavier-uniform on every matrix of the transformer, zero biases for attention (torch's MHA
// reset), torch's Linear default for the FFN biases; LayerNorm weight 1, bias 0.
void encoder_layer_init(EncoderLayer *l, Rng *rng);  // then the variant's own parameters
void decoder_layer_init(DecoderLayer *l, Rng *rng);
