// The DETR detector (models/detr.py): ResNet backbone -> input_proj (1x1 conv) -> transformer
// with sine positional encoding and learned queries -> class and box heads on every decoder
// layer's output (the earlier ones feed the auxiliary losses).
#pragma once
#include "nn/criterion.h"
#include "nn/resnet.h"
#include "nn/decoder.h"
#include "nn/postprocess.h"

#define DETR_MAX_LAYERS 12
_Static_assert(DETR_MAX_LAYERS == DECODER_MAX_LAYERS, "one layer limit for the model and its decoder");

typedef struct {
  int backbone_depth;   // 18, 34, 50, 101
  int backbone_width;   // channels of the stem and layer1, doubling per stage (torchvision: 64; 0 = 64)
  int backbone_layers;  // ResNet layers run: 4 (DETR, stride 32) or 3 (stop after layer3: stride 16); 0 = 4
  bool dilation;        // DC5: layer4 dilated instead of strided
  bool train_backbone;  // the backbone trains at all (lr_backbone > 0)
  int frozen_stages;    // leading backbone stages kept frozen: 2 = stem + layer1 (the reference), 0 = none
  int64_t hidden_dim, nheads, enc_layers, dec_layers, ffn_dim, num_queries, num_classes;
  float dropout;
  bool pre_norm;
  bool aux_loss;
  const EncoderAttnKind *encoder_attn;  // every encoder layer's self-attention variant (NULL: dense)
  const DecoderKind *decoder;           // the decoder (nn/decoder.h; NULL: detr)
  const char *decoder_cross_attn;       // the decoder's cross-attention (a kind's static name; NULL: its default)
  AttnSettings attn_settings;           // the variants' settings (e.g. enact_sigma); n == 0: defaults
  bool tf32;                            // CUDA: TF32 tensor-core matmuls and convolutions (off: fp32, CPU parity)
  bool bf16;  // bf16 inputs, fp32 accumulation in convolutions and GEMMs (CPU: AVX512-BF16 or AMX)
  // Key resize=transformers: images are resized with the long side as transformers'
  // DetrImageProcessor computes it (512x900 -> 758x1333; the reference's 758x1332). On by default
  // for weights read from a transformers file (api/model_file.c); docs/ecosystem.md.
  bool resize_transformers;
} DetrConfig;

// The presets, one row each (the only list of them; their models are built in nn/presets.c):
// X(id, name, epochs, image_size, max_size, lr_drop), the last row LAST(...). The numbers are the
// run defaults that go with the model (RunDefaults). The last macro argument lets the name list
// below be one string literal, joinable into --help texts.
#define DETR_PRESET_ROWS(X, LAST)                                                                    \
  X(r50, "detr-r50", 300, 800, 1333, 200)                /* the paper: its schedule, COCO's sizes */ \
  X(r50_dc5, "detr-r50-dc5", 500, 800, 1333, 400)        /* the paper's DC5 (layer4 dilated) */      \
  X(r18_small, "detr-r18-small", 50, 320, 512, 0)        /* CPU-sized: the synthetic set's scale */  \
  X(cond_r50, "conditional-detr-r50", 50, 800, 1333, 40) /* Conditional DETR's paper and main.py */  \
  X(cond_r18_small, "conditional-detr-r18-small", 50, 320, 512, 0)                                   \
  X(anchor_r50, "anchor-detr-r50", 50, 800, 1333, 40) /* Anchor DETR's main.py (DC5) */              \
  X(anchor_r18_small, "anchor-detr-r18-small", 50, 320, 512, 0)                                      \
  LAST(tiny, "tiny", 50, 128, 192, 0) /* tests and smoke runs */
#define DETR_PRESET_NAME_SEP_(id, name, ...) name ", "
#define DETR_PRESET_NAME_(id, name, ...) name
// "detr-r50, detr-r18-small, ..., tiny"
#define DETR_PRESET_LIST DETR_PRESET_ROWS(DETR_PRESET_NAME_SEP_, DETR_PRESET_NAME_)
extern const char *const DETR_PRESETS[];  // the names, NULL-terminated
// The preset's model into cfg. Returns 0, or -1 if unknown.
// Keys of detr_config_set beyond the fields: encoder_attn=NAME (nn/encoder_attn.h), NAME=true|false
// as a shortcut for it (e.g. enact=true), every variant's settings (e.g. enact_sigma=2), and
// decoder=NAME (nn/decoder.h), decoder_cross_attn=softmax|kmeans (the decoder's cross-attention).
int detr_config_preset(const char *name, DetrConfig *cfg);

// How a model is trained when the command says nothing: `detr train`'s epochs and image sizes, and
// the evaluation sizes of a model with no training run.
typedef struct {
  const char *preset;
  int epochs, image_size, max_size;
  int lr_drop;  // the epoch of the x0.1 drop (0: two thirds of the epochs)
} RunDefaults;
// The run defaults of the preset whose model is nearest to cfg's in backbone depth and transformer
// width, layers and feed-forward size (each as a ratio), among tiny and the presets of cfg's decoder:
// a preset's own model gets its own; a ResNet-34 on detr-r50's transformer the paper's schedule, on
// detr-r18-small's that preset's.
const RunDefaults *detr_run_defaults(const DetrConfig *cfg);
// Sets one field from text, e.g. ("hidden_dim", "128"). Returns 0, or -1 with err set.
int detr_config_set(DetrConfig *cfg, const char *key, const char *value, char *err, size_t err_cap);
// Key i of those detr_config_set takes (i = 0, 1, ...; NULL past the last): the fields, then
// encoder_attn, decoder and decoder_cross_attn, then each encoder variant's NAME=true shortcut
// and settings. help (may be NULL) receives a line saying what it sets. The one list of the keys:
// messages and `--help` take it from here.
const char *detr_config_key(int i, char *help, size_t cap);
// "key=value" lines of every field (readable by detr_config_set), into buf.
void detr_config_format(const DetrConfig *cfg, char *buf, size_t cap);
// The encoder's attention variant (dense when unset) and the decoder (detr when unset).
const EncoderAttnKind *detr_encoder_attn(const DetrConfig *cfg);
const DecoderKind *detr_decoder(const DetrConfig *cfg);
// How the class head's logits are read (the decoder's, nn/class_head.h), and the criterion that
// goes with it (the head's loss and class-cost weights).
const ClassHead *detr_classes(const DetrConfig *cfg);
CriterionConfig detr_criterion_config(const DetrConfig *cfg);
// Checks ranges (positive sizes, heads dividing hidden_dim, ...). Returns 0 or -1 with err set.
// Upper limits keep a config file or a checkpoint's stored config from asking for absurd models
// (every tensor dimension stays far below 2^31): beyond the backbone width's (1024), hidden_dim
// <= 8192, ffn_dim and num_queries <= 65536, num_classes <= 2^20 + 1 (COCO_MAX_CATEGORY_ID + 1:
// labels are category ids).
#define DETR_CONFIG_MAX_HIDDEN 8192
#define DETR_CONFIG_MAX_FFN 65536
#define DETR_CONFIG_MAX_QUERIES 65536
#define DETR_CONFIG_MAX_CLASSES ((1 << 20) + 1)
int detr_config_validate(const DetrConfig *cfg, char *err, size_t err_cap);

// The arithmetic a run asks for (`--precision` of train, eval, predict and bench_step; the C API's
// detr_options.precision) and the one place it becomes config keys (tf32=, bf16=).
typedef enum { DETR_MATH_DEFAULT, DETR_MATH_FP32, DETR_MATH_TF32, DETR_MATH_BF16 } DetrMath;
// "fp32" | "tf32" | "bf16" into *math (NULL: DETR_MATH_DEFAULT). 0, or -1 with err set.
int detr_math_parse(const char *name, DetrMath *math, char *err, size_t err_cap);
// Whether one of sets[0..n_sets) sets `key` ("key=..."): an explicit --set wins over defaults.
bool detr_config_sets_name(const char *const *sets, int n_sets, const char *key);
// The keys that put a model in `math`, to follow the caller's sets[0..n_sets): tf32= and bf16= for
// a math asked for (-1 with err set when dev cannot run bf16: it is refused, never emulated); for
// none, bf16=false for inference unless the sets name bf16 (a model trained in bf16 is evaluated in
// fp32 unless asked) and nothing for training (a resumed run keeps its own). Writes at most 2 keys to
// keys[]; returns how many, or -1.
int detr_math_keys(DetrMath math, bool inference, Device dev, const char *const *sets, int n_sets, const char *keys[2],
                   char *err, size_t err_cap);

typedef struct {
  DetrConfig cfg;
  ParamStore params;
  ResNet backbone;
  Conv2d input_proj;
  GroupNorm input_norm;               // Anchor DETR's (DecoderModelLayout.input_norm), else unused
  EncoderLayer enc[DETR_MAX_LAYERS];  // none when the decoder kind brings its encoder (DecoderKind.encode)
  LayerNorm enc_norm;                 // pre-norm only (transformer.encoder.norm)
  void *decoder_state;                // the decoder kind's layers and norms (transformer.decoder.*), owned
  Tensor *query_embed;                // [num_queries, hidden]; NULL when the decoder kind makes its queries
  Linear class_embed;                 // [num_classes + the class head's extra columns, hidden]
  Mlp bbox_embed;
  bool prepared_for_inference;  // detr_model_prepare_inference was called: see NnCtx.inference
} DetrModel;

// Creates the model's parameters on dev (zeros / identity batch norm until detr_model_init or a load).
DetrModel *detr_model_create(const DetrConfig *cfg, Device dev);
// Reference initialisation from a seed (the backbone is torchvision's kaiming-normal init).
void detr_model_init(DetrModel *m, uint64_t seed);
// For a model that is only run, no longer trained (the C API's, `detr eval`'s): the backbone's
// frozen batch norms folded into its convolutions (resnet_fold_bn), which the forward with grad
// mode off then runs with their epilogues fused, and the transformer's layers free to compute their
// function in another order where it is faster (NnCtx.inference). Call after the weights are loaded.
void detr_model_prepare_inference(DetrModel *m);
void detr_model_free(DetrModel *m);

typedef struct {
  DetrLayerOutput layers[DETR_MAX_LAYERS];  // decoder layer order; the last is the prediction (under
                                            // NnCtx.inference the only one: the others' NULL)
  int n_layers;
  int64_t feat_h, feat_w;           // feature map size
  AttnTrace attn[DETR_MAX_LAYERS];  // per encoder layer: what its attention variant reports
  int n_attn;
  Tensor *cross_attn;  // [B, Q, feat_h * feat_w] the last decoder layer's cross-attention weights averaged
                       // over the heads, when ctx->want_cross_attn (else NULL)
} DetrOutput;
void detr_output_free(DetrOutput *out);  // the attention traces
// Detections per image of a model (DETR: one per query; Conditional DETR: the 100 best), and the
// detections of the last layer's output (the class head's post-processing, nn/postprocess.h):
// out [B * detr_detections_per_image], image by image.
int64_t detr_detections_per_image(const DetrConfig *cfg);
void detr_postprocess_output(const DetrModel *m, const DetrOutput *o, const int *orig_w, const int *orig_h,
                             Detection *out);

// images [B, H, W, 3] normalized (channels last: the backbone's layout); mask host [B, H, W]
// (1 = padding). Returns 0, or -1 with err
// set for a batch the encoder's attention variant cannot handle (e.g. ENACT: an image with no valid
// pixel at feature resolution).
int detr_model_forward(const DetrModel *m, const NnCtx *ctx, Tensor *images, const uint8_t *mask, DetrOutput *out,
                       char *err, size_t err_cap);
