// The encoder self-attention seam (docs/attention.md: the variants and their sources; docs/enact.md).
// Every encoder layer owns DETR's projections (self_attn.in_proj_weight/in_proj_bias: the q, k, v
// rows; self_attn.out_proj), so DETR weights load into every variant, except one that brings its
// own projections (EncoderAttnKind.own_projections: enact_official). A variant decides how the
// queries meet the keys and values between those projections, may add parameters of its own
// (registered after the layer's, under <layer>.self_attn.*) and settings (config keys), and reports
// statistics for the logs and arrays for `detr step` through an AttnTrace.
//
// Adding a variant: one file nn/attn_<name>.c defining a `const EncoderAttnKind encoder_attn_<name>`,
// plus one line in the registry (nn/encoder_attn.c). Nothing else names it.
#pragma once
#include "nn/layers.h"

// A batch's feature map: padded grid Hp x Wp (N = Hp * Wp tokens per image), DETR's padding
// bottom/right. valid_h/valid_w: the extent of each image's valid pixels from the top-left (the
// valid region is exactly that rectangle when `rectangular`, as DETR's batches always are).
typedef struct {
  int64_t B, Hp, Wp;
  int64_t *valid_h, *valid_w;  // [B] each
  const uint8_t *mask;         // host [B, Hp * Wp], 1 = padding
  Tensor *key_mask;            // additive [B, N] on the model's device: 0 valid, -inf padding
  Tensor *valid;               // [B, N, 1] on the model's device: 1 valid, 0 padding
  bool rectangular;
} FeatureGeometry;

// From the feature-resolution mask [B, Hp*Wp] (host, 1 = padding; kept by pointer, not copied);
// the tensors on dev, owned by g until feature_geometry_free (the tape keeps what it needs).
void feature_geometry_make(const uint8_t *mask, int64_t B, int64_t Hp, int64_t Wp, Device dev, FeatureGeometry *g);
void feature_geometry_free(FeatureGeometry *g);

// What a variant's forward reports. Stats are this batch's per-image means (the trainer and the
// evaluation average them over layers, weighted by images); exports are written by `detr step`
// as <variant>.<layer>.<name>.
#define ATTN_TRACE_MAX 4
typedef struct {
  const char *name;   // metrics.jsonl key, e.g. "clusters_per_image"
  const char *label;  // progress line, e.g. "clusters/img"
  double value;
} AttnStat;
typedef struct {
  const char *name;    // e.g. "entropy"
  Tensor *f32;         // a float tensor (scoped), or NULL and then:
  const int64_t *i64;  // host int64 values [n], owned by the trace
  int64_t n;
} AttnExport;
typedef struct AttnTrace {
  int n_stats, n_exports;
  AttnStat stats[ATTN_TRACE_MAX];
  AttnExport exports[ATTN_TRACE_MAX];
  // A variant that clusters the positions (EncoderAttnKind.clusters) reports each position's
  // cluster, numbered 0, 1, ... within its image (-1 on padding): host [B * N], owned by the trace.
  const int32_t *clusters;
  void *owned;                   // the variant's host data behind the exports and clusters
  void (*release)(void *owned);  // frees it
  // A variant whose numbers are on the device when its forward returns (ENACT's region counts on a
  // GPU: reading them mid-forward would stall the stream once a layer) leaves stats, host exports and
  // clusters to resolve, which the model calls once its whole forward is queued (attn_trace_resolve);
  // the tensors it reads until then are in pending (the model keeps them alive past the layer).
  void (*resolve)(struct AttnTrace *t);
  Tensor *pending[2];
} AttnTrace;
void attn_trace_free(AttnTrace *t);
// Calls t->resolve once (none: nothing to do).
void attn_trace_resolve(AttnTrace *t);

// A variant's stats accumulated over batches: per batch the mean over the encoder layers, weighted
// by the batch's images. sum[] and images are plain sums (data-parallel runs add them up).
typedef struct {
  int n;
  const char *name[ATTN_TRACE_MAX], *label[ATTN_TRACE_MAX];
  double sum[ATTN_TRACE_MAX];
  double images;
} AttnStatSums;
void attn_stats_add(AttnStatSums *s, const AttnTrace *layers, int n_layers, int images);
double attn_stats_mean(const AttnStatSums *s, int i);  // 0 with no images

// A variant setting: a config key (e.g. "enact_sigma") with its type, default and range.
typedef enum { ATTN_SETTING_FLOAT, ATTN_SETTING_INT, ATTN_SETTING_BOOL } AttnSettingType;
typedef struct {
  const char *key;
  AttnSettingType type;
  double default_value, min, max;
  const char *help;
} AttnSettingSpec;

// The settings of every registered variant with their current values (config text round-trips
// them; a variant reads its own with attn_setting).
#define ATTN_MAX_SETTINGS 16
typedef struct {
  int n;
  const AttnSettingSpec *spec[ATTN_MAX_SETTINGS];
  double value[ATTN_MAX_SETTINGS];
} AttnSettings;
double attn_setting(const AttnSettings *s, const char *key);  // aborts on a key no variant declares

// What the variant's forward gets. q_in = k_in = x + pos, v_in = x (DETR's encoder).
typedef struct {
  const MultiheadAttention *proj;  // the layer's in_proj (q, k, v rows) and out_proj; NULL with own_projections
  Tensor *x, *pos;                 // [B, N, d]
  const FeatureGeometry *geom;
  int layer;  // the encoder layer's index (0 first): a variant may alternate by it (swin's shifted windows)
} EncoderAttnInput;

typedef struct {
  const char *name;     // the --set encoder_attn value
  const char *summary;  // one line: what it computes and its cost
  const AttnSettingSpec *settings;
  int n_settings;
  size_t extras_size;  // bytes of the per-layer state (0: none)
  bool clusters;       // its trace reports AttnTrace.clusters (`detr predict --show clusters`)
  // The variant registers its own q, k, v and output projections in create (under its reference's
  // names), and the layer registers none of DETR's (no self_attn.in_proj_*/out_proj; in->proj is
  // NULL): its reference's weights load, DETR's do not. Its parameters are then required in a
  // weights file, not optional. (enact_official: ClustAttn's W_q, W_k, W_v, W_o.)
  bool own_projections;
  // Padded pixels take part, as in the variant's reference (no mask): their values change the
  // valid pixels' outputs (enact_official). Every other variant ignores them.
  bool attends_padding;
  // Registers the variant's own parameters under `prefix` (= "<layer>.self_attn") and reads its
  // settings into extras. May be NULL.
  void (*create)(void *extras, ParamStore *ps, const char *prefix, int64_t dim, int64_t heads,
                 const AttnSettings *settings);
  void (*init)(void *extras, Rng *rng);  // may be NULL
  // [B, N, d] attention output (before the layer's residual), or NULL with err set for a batch the
  // variant cannot handle. trace may be NULL.
  Tensor *(*forward)(const void *extras, const NnCtx *ctx, const EncoderAttnInput *in, AttnTrace *trace, char *err,
                     size_t err_cap);
} EncoderAttnKind;

// The registry (nn/encoder_attn.c).
const EncoderAttnKind *encoder_attn_find(const char *name);  // NULL when unknown
const EncoderAttnKind *encoder_attn_default(void);           // dense
int encoder_attn_count(void);
const EncoderAttnKind *encoder_attn_at(int i);
// "dense|enact|..." into buf.
const char *encoder_attn_names(char *buf, size_t cap);
// Every registered variant's settings at their defaults.
void attn_settings_default(AttnSettings *s);
// A config-text boolean (true/false/1/0) for `key`: 0, or -1 with err naming the key and value.
// The one parser of the config's booleans (nn/config.c's fields use it too).
int config_parse_bool(const char *key, const char *value, bool *out, char *err, size_t err_cap);
// Sets `key` when a variant declares it: returns 1 (set), 0 (no such key), -1 (bad value, err set).
int attn_settings_set(AttnSettings *s, const char *key, const char *value, char *err, size_t err_cap);
// "key=value\n" lines of kind's settings into buf; returns the bytes written.
size_t attn_settings_format(const AttnSettings *s, const EncoderAttnKind *kind, char *buf, size_t cap);
