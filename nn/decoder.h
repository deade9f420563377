// The decoder seam (docs/architecture.md "How to add a decoder"; the kinds: docs/conditional_detr.md,
// docs/kmeans_cross_attention.md): how the object queries
// read the encoder's memory, and how the box head's output becomes a box. A decoder kind owns its
// layers, its final norm and whatever else its reference puts under `transformer.decoder.*`
// (registered there, so the reference's weights load); the model keeps the backbone, the encoder,
// the query embedding and the class and box heads, and sees the decoder only through this.
//
// Adding a kind: one file nn/decoder_<name>.c defining a `const DecoderKind decoder_<name>`, plus
// one line in the registry (nn/decoder.c). Kinds: detr (models/transformer.py's decoder),
// conditional (Conditional DETR, nn/decoder_conditional.c) and anchor (Anchor DETR,
// nn/decoder_anchor.c: a kind with its own encoder and queries, encode and layout below).
#pragma once
#include "nn/class_head.h"
#include "nn/transformer.h"

#define DECODER_MAX_LAYERS 12

typedef struct {
  TransformerShape s;      // d, heads, FFN, dropout, pre-norm
  int64_t layers;          // decoder layers (1..DECODER_MAX_LAYERS)
  const char *cross_attn;  // one of the kind's cross_attns (config decoder_cross_attn); NULL: the first
  int64_t enc_layers;      // a kind with its own encoder (DecoderKind.encode): its layers
  int64_t queries;         // num_queries (a kind that makes its own queries: DecoderModelLayout.own_queries)
  // A kind with its own encoder that takes an encoder_attn (DecoderKind.own_encoder_attn): the
  // config's variant (NULL: dense) and its settings (NULL: the defaults).
  const EncoderAttnKind *encoder_attn;
  const AttnSettings *attn_settings;
} DecoderShape;

typedef struct {
  Tensor *memory, *pos;         // the encoder's output and the sine positions [B, HW, d]
  Tensor *key_mask;             // the memory's key padding mask (FeatureGeometry.key_mask)
  Tensor *query_embed;          // the learned queries [Q, d] (NULL for a kind with its own queries)
  int64_t batch;                // B
  const FeatureGeometry *geom;  // the memory's Hp x Wp map and padding
} DecoderInput;

typedef struct {
  Tensor *hs[DECODER_MAX_LAYERS];  // [B, Q, d] every layer's output, after the decoder's final norm
  int n_layers;
  Tensor *reference;   // [Q, 2] or [B, Q, 2] the queries' reference points (sigmoid space), or NULL
  Tensor *cross_attn;  // [B, Q, HW] the last layer's cross-attention weights averaged over the
                       // heads when ctx->want_cross_attn, else NULL (the model zeroes it)
} DecoderOutput;

// The parts of the model around the transformer, for a kind whose reference names or builds them
// differently from DETR (Anchor DETR). DecoderKind.layout NULL: DETR's (decoder_layout).
typedef struct {
  const char *prefix;                    // the prefix the kind's create gets (DETR: "transformer.decoder")
  const char *backbone;                  // the backbone's prefix (DETR: "backbone.0.body")
  const char *input_proj;                // the input projection's 1x1 convolution (DETR: "input_proj")
  const char *input_norm;                // a GroupNorm (32 groups) after it, or NULL (DETR: none); with it, the
                                         // convolution is initialised as Anchor DETR's: xavier-uniform, bias 0
  const char *class_embed, *bbox_embed;  // the heads, shared by every decoder layer
  bool own_queries;                      // the kind makes its queries: the model has no query_embed
  const char *last_ffn;                  // the last decoder layer's first FFN weight, a format of the layer index
                                         // (a checkpoint's config is checked against its shape: api/model_file.c)
} DecoderModelLayout;

typedef struct DecoderKind {
  const char *name;
  const char *model;  // the detector it makes, for titles: "DETR", "Conditional DETR"
  const char *summary;
  size_t state_size;  // the kind's state (layers, norms), allocated zeroed by the model
  // Registers the kind's parameters under `prefix` (the reference's "transformer.decoder").
  void (*create)(void *state, ParamStore *ps, const char *prefix, const DecoderShape *shape);
  void (*init)(const void *state, Rng *rng);  // the reference's initialisation
  // Every layer's output (out->hs; each kept past its layer's scope), the reference points and,
  // when ctx->want_cross_attn, the last layer's cross-attention weights.
  void (*forward)(const void *state, const NnCtx *ctx, const DecoderInput *in, DecoderOutput *out);
  // Boxes [B, Q, 4] (cxcywh in [0, 1]) from the box head's raw output [B, Q, 4] for layer `layer`.
  Tensor *(*boxes)(const void *state, Tensor *head_out, const DecoderOutput *out, int layer);
  // The cross-attentions it offers (config decoder_cross_attn), NULL-terminated; the first is the
  // default. NULL: the kind has no choice (only "softmax").
  const char *const *cross_attns;
  // How the class head's logits are read, and so the criterion's class loss and weights, the
  // matcher's class cost and the post-processing (nn/class_head.h). NULL: DETR's softmax.
  const ClassHead *classes;
  // After the model's default initialisation of its heads, the kind's own (e.g. a prior on the
  // class bias, a zero last box layer). NULL: none.
  void (*init_heads)(Linear *class_embed, Mlp *bbox_embed);
  // What the kind cannot build (e.g. pre-norm), as a message for the config error. NULL: all.
  const char *(*unsupported)(const DecoderShape *shape);
  // A kind with its own encoder (Anchor DETR), optional: from the projected map src [B, N, d]
  // (tokens row-major over g's Hp x Wp map) the memory [B, N, d], and in *pos what its forward
  // reads as DecoderInput.pos. Set: the model builds neither DETR's encoder layers nor its sine
  // positions; the kind's create makes DecoderShape.enc_layers encoder layers.
  Tensor *(*encode)(const void *state, const NnCtx *ctx, Tensor *src, const FeatureGeometry *g, Tensor **pos);
  const DecoderModelLayout *layout;  // NULL: DETR's
  // Optional, for a model prepared for inference (detr_model_prepare_inference; its weights do not
  // change after): computes once what the kind's forward derives from its weights and the learned
  // queries alone (query_embed [Q, d], NULL for a kind with its own queries), for its forward to
  // use where ctx->inference - the same floats the forward would compute, its tensors owned by
  // `owner` (the model's ParamStore.derived, cleared before each preparation and at the model's
  // free). release_inference forgets them (also called by detr_model_free; safe when nothing was
  // prepared).
  void (*prepare_inference)(void *state, Tensor *query_embed, TensorOwner *owner);  // its tensors: owner's
  void (*release_inference)(void *state);
  // The kind's own encoder judges DecoderShape.encoder_attn itself (in unsupported): Anchor DETR's
  // takes enact_official (Anchor-DETR-ENACT). false: a kind with encode refuses any encoder_attn.
  bool own_encoder_attn;
} DecoderKind;

const DecoderKind *decoder_find(const char *name);               // NULL when unknown
const DecoderKind *decoder_default(void);                        // detr
const ClassHead *decoder_classes(const DecoderKind *k);          // the kind's class head (softmax when unset)
const DecoderModelLayout *decoder_layout(const DecoderKind *k);  // the kind's layout (DETR's when unset)
const char *decoder_names(char *buf, size_t cap);                // "detr, ..." for messages
// The kind's cross-attention named `name` as its own static string (NULL: unknown to the kind);
// names: "softmax, ..." for messages.
const char *decoder_cross_attn_find(const DecoderKind *k, const char *name);
const char *decoder_cross_attn_names(const DecoderKind *k, char *buf, size_t cap);
