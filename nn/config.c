// DETR configuration from text: key=value overrides, the key list, formatting, checks (the
// presets: nn/presets.c).
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/detr.h"

typedef enum { FIELD_INT, FIELD_INT32, FIELD_BOOL, FIELD_FLOAT } FieldType;
typedef struct {
  const char *key;
  FieldType type;
  size_t offset;
  const char *help;  // one line for `--help` (detr_config_key)
} Field;

#define F(key, type, help) \
  { #key, type, offsetof(DetrConfig, key), help }
static const Field FIELDS[] = {
    {"backbone", FIELD_INT32, offsetof(DetrConfig, backbone_depth), "ResNet depth: 18, 34, 50 or 101"},
    {"backbone_width", FIELD_INT32, offsetof(DetrConfig, backbone_width), "channels of the stem and layer1 (0: 64)"},
    {"backbone_layers", FIELD_INT32, offsetof(DetrConfig, backbone_layers),
     "4 (stride 32) or 3 (stop after layer3: stride 16)"},
    F(dilation, FIELD_BOOL, "DC5: layer4 dilated instead of strided (ResNet-50/101)"),
    F(train_backbone, FIELD_BOOL, "the backbone trains at all"),
    {"frozen_stages", FIELD_INT32, offsetof(DetrConfig, frozen_stages),
     "leading backbone stages kept frozen (2: stem + layer1)"},
    F(hidden_dim, FIELD_INT, "the transformer's width"),
    F(nheads, FIELD_INT, "attention heads (divides hidden_dim)"),
    F(enc_layers, FIELD_INT, "encoder layers, 0..12"),
    F(dec_layers, FIELD_INT, "decoder layers, 1..12"),
    F(ffn_dim, FIELD_INT, "the feed-forward layers' width (the reference's dim_feedforward)"),
    F(num_queries, FIELD_INT, "object queries: detections per image"),
    F(num_classes, FIELD_INT, "largest category id + 1"),
    F(dropout, FIELD_FLOAT, "the transformer's dropout, in [0, 1)"),
    F(pre_norm, FIELD_BOOL, "LayerNorm before each sublayer instead of after"),
    F(aux_loss, FIELD_BOOL, "losses on every decoder layer's output"),
    F(tf32, FIELD_BOOL, "CUDA: TF32 matmuls and convolutions"),
    F(bf16, FIELD_BOOL, "CPU: bf16 inputs, fp32 accumulation in convolutions and GEMMs (AVX512-BF16 or AMX)"),
};
#define N_FIELDS (int)(sizeof FIELDS / sizeof FIELDS[0])

const ClassHead *detr_classes(const DetrConfig *cfg) { return decoder_classes(detr_decoder(cfg)); }

CriterionConfig detr_criterion_config(const DetrConfig *cfg) {
  return criterion_config_for((int)cfg->num_classes, detr_classes(cfg));
}

const EncoderAttnKind *detr_encoder_attn(const DetrConfig *cfg) {
  return cfg->encoder_attn ? cfg->encoder_attn : encoder_attn_default();
}

const DecoderKind *detr_decoder(const DetrConfig *cfg) { return cfg->decoder ? cfg->decoder : decoder_default(); }

// encoder_attn=NAME, the NAME=true|false shortcut, and the variants' settings.
static int set_encoder_attn(DetrConfig *cfg, const char *key, const char *value, char *err, size_t err_cap) {
  char names[256];
  if (!strcmp(key, "encoder_attn")) {
    const EncoderAttnKind *k = encoder_attn_find(value);
    if (!k) {
      snprintf(err, err_cap, "config encoder_attn: unknown variant '%s' (one of %s)", value,
               encoder_attn_names(names, sizeof names));
      return -1;
    }
    cfg->encoder_attn = k;
    return 1;
  }
  const EncoderAttnKind *k = encoder_attn_find(key);
  if (k) {
    bool on;
    if (config_parse_bool(key, value, &on, err, err_cap)) return -1;
    if (on) cfg->encoder_attn = k;
    else if (cfg->encoder_attn == k) cfg->encoder_attn = NULL;  // off: back to dense
    return 1;
  }
  if (cfg->attn_settings.n == 0) attn_settings_default(&cfg->attn_settings);
  return attn_settings_set(&cfg->attn_settings, key, value, err, err_cap);
}
#undef F

// The keys beyond the fields, in the order detr_config_key lists them.
static const char *const KIND_KEYS[] = {"encoder_attn", "decoder", "decoder_cross_attn", "resize"};
#define N_KIND_KEYS (int)(sizeof KIND_KEYS / sizeof KIND_KEYS[0])

const char *detr_config_key(int i, char *help, size_t cap) {
  char names[256];
  if (i < 0) return NULL;
  if (i < N_FIELDS) {
    if (help) snprintf(help, cap, "%s", FIELDS[i].help);
    return FIELDS[i].key;
  }
  i -= N_FIELDS;
  if (i < N_KIND_KEYS) {
    if (help && i == 0)
      snprintf(help, cap, "the encoder's self-attention: %s (docs/attention.md)",
               encoder_attn_names(names, sizeof names));
    else if (help && i == 1)
      snprintf(help, cap, "the decoder: %s (docs/conditional_detr.md)", decoder_names(names, sizeof names));
    else if (help && i == 2)
      snprintf(help, cap, "the decoder's cross-attention: %s with decoder=detr (docs/kmeans_cross_attention.md)",
               decoder_cross_attn_names(decoder_default(), names, sizeof names));
    else if (help)
      snprintf(help, cap,
               "reference or transformers: the long side's rounding of the image resize (transformers' "
               "DetrImageProcessor: 512x900 -> 758x1333, the reference 758x1332; docs/ecosystem.md)");
    return KIND_KEYS[i];
  }
  i -= N_KIND_KEYS;
  for (int k = 0; k < encoder_attn_count(); k++) {  // each variant: its NAME=true shortcut, its settings
    const EncoderAttnKind *kind = encoder_attn_at(k);
    if (i == 0) {
      if (help) snprintf(help, cap, "true: encoder_attn=%s", kind->name);
      return kind->name;
    }
    if (--i < kind->n_settings) {
      const AttnSettingSpec *sp = &kind->settings[i];
      char dflt[32];
      if (sp->type == ATTN_SETTING_BOOL) snprintf(dflt, sizeof dflt, "%s", sp->default_value != 0 ? "true" : "false");
      else snprintf(dflt, sizeof dflt, "%g", sp->default_value);
      if (help) snprintf(help, cap, "%s: %s (default %s)", kind->name, sp->help, dflt);
      return sp->key;
    }
    i -= kind->n_settings;
  }
  return NULL;
}

int detr_config_set(DetrConfig *cfg, const char *key, const char *value, char *err, size_t err_cap) {
  if (!strcmp(key, "decoder")) {
    const DecoderKind *k = decoder_find(value);
    char names[256];
    if (!k) {
      snprintf(err, err_cap, "config decoder: unknown decoder '%s' (one of %s)", value,
               decoder_names(names, sizeof names));
      return -1;
    }
    cfg->decoder = k;
    return 0;
  }
  if (!strcmp(key, "decoder_cross_attn")) {  // checked against the decoder kind again by validate
    const char *c = decoder_cross_attn_find(detr_decoder(cfg), value);
    char names[256];
    if (!c) {
      snprintf(err, err_cap, "config decoder_cross_attn: unknown cross-attention '%s' (one of %s)", value,
               decoder_cross_attn_names(detr_decoder(cfg), names, sizeof names));
      return -1;
    }
    cfg->decoder_cross_attn = c;
    return 0;
  }
  if (!strcmp(key, "resize")) {
    if (strcmp(value, "reference") && strcmp(value, "transformers")) {
      snprintf(err, err_cap, "config resize: '%s' is not reference or transformers", value);
      return -1;
    }
    cfg->resize_transformers = !strcmp(value, "transformers");
    return 0;
  }
  int attn = set_encoder_attn(cfg, key, value, err, err_cap);
  if (attn) return attn > 0 ? 0 : -1;
  for (int i = 0; i < N_FIELDS; i++) {
    if (strcmp(FIELDS[i].key, key)) continue;
    char *at = (char *)cfg + FIELDS[i].offset, *end = NULL;
    errno = 0;
    if (FIELDS[i].type == FIELD_BOOL) {
      bool v;
      if (config_parse_bool(key, value, &v, err, err_cap)) return -1;
      memcpy(at, &v, sizeof v);
    } else if (FIELDS[i].type == FIELD_FLOAT) {
      float v = strtof(value, &end);
      if (errno || end == value || *end) {
        snprintf(err, err_cap, "config %s: '%s' is not a number", key, value);
        return -1;
      }
      memcpy(at, &v, sizeof v);
    } else {
      long long v = strtoll(value, &end, 10);
      if (errno || end == value || *end) {
        snprintf(err, err_cap, "config %s: '%s' is not an integer", key, value);
        return -1;
      }
      if (FIELDS[i].type == FIELD_INT32) {
        if (v < INT32_MIN || v > INT32_MAX) {  // not truncated to another value
          snprintf(err, err_cap, "config %s: %s is out of range", key, value);
          return -1;
        }
        int v32 = (int)v;
        memcpy(at, &v32, sizeof v32);
      } else {
        int64_t v64 = v;
        memcpy(at, &v64, sizeof v64);
      }
    }
    return 0;
  }
  size_t n = (size_t)snprintf(err, err_cap, "config: unknown key '%s' (the keys:", key);
  const char *k;
  for (int i = 0; (k = detr_config_key(i, NULL, 0)) && n < err_cap; i++)
    n += (size_t)snprintf(err + n, err_cap - n, "%s %s", i ? "," : "", k);
  if (n < err_cap) snprintf(err + n, err_cap - n, "; `detr train --help` says what each sets)");
  return -1;
}

void detr_config_format(const DetrConfig *cfg, char *buf, size_t cap) {
  size_t n = 0;
  for (int i = 0; i < N_FIELDS && n < cap; i++) {
    const char *at = (const char *)cfg + FIELDS[i].offset;
    if (FIELDS[i].type == FIELD_BOOL)
      n += (size_t)snprintf(buf + n, cap - n, "%s=%s\n", FIELDS[i].key, *(const bool *)at ? "true" : "false");
    else if (FIELDS[i].type == FIELD_FLOAT)
      n += (size_t)snprintf(buf + n, cap - n, "%s=%.9g\n", FIELDS[i].key, *(const float *)at);
    else if (FIELDS[i].type == FIELD_INT32)
      n += (size_t)snprintf(buf + n, cap - n, "%s=%d\n", FIELDS[i].key, *(const int *)at);
    else n += (size_t)snprintf(buf + n, cap - n, "%s=%lld\n", FIELDS[i].key, (long long)*(const int64_t *)at);
  }
  const EncoderAttnKind *attn = detr_encoder_attn(cfg);
  if (n < cap) n += (size_t)snprintf(buf + n, cap - n, "encoder_attn=%s\n", attn->name);
  if (n < cap && cfg->attn_settings.n) n += attn_settings_format(&cfg->attn_settings, attn, buf + n, cap - n);
  if (n < cap) n += (size_t)snprintf(buf + n, cap - n, "decoder=%s\n", detr_decoder(cfg)->name);
  // Written only when not the default, so default checkpoints are as before; absent reads as softmax.
  if (n < cap && cfg->decoder_cross_attn && strcmp(cfg->decoder_cross_attn, "softmax"))
    n += (size_t)snprintf(buf + n, cap - n, "decoder_cross_attn=%s\n", cfg->decoder_cross_attn);
  if (n < cap && cfg->resize_transformers) snprintf(buf + n, cap - n, "resize=transformers\n");  // the same way
}

int detr_config_validate(const DetrConfig *c, char *err, size_t err_cap) {
  const char *problem = NULL;
  if (c->backbone_depth != 18 && c->backbone_depth != 34 && c->backbone_depth != 50 && c->backbone_depth != 101)
    problem = "backbone must be 18, 34, 50 or 101";
  else if (c->dilation && c->backbone_depth < 50) problem = "dilation needs backbone 50 or 101";
  else if (c->backbone_layers != 0 && c->backbone_layers != 3 && c->backbone_layers != 4)
    problem = "backbone_layers must be 3 (stride 16) or 4 (DETR, stride 32)";
  else if (c->dilation && c->backbone_layers == 3) problem = "dilation dilates layer4: it needs backbone_layers=4";
  else if (c->backbone_width != 0 && (c->backbone_width < 4 || c->backbone_width > 1024))
    problem = "backbone_width must be in 4..1024 (torchvision's ResNets: 64)";
  // Upper bounds far beyond any DETR keep every tensor size well inside int64 (a config file or a
  // checkpoint's metadata is input: a huge value must be an error, not an overflow).
  else if (c->hidden_dim <= 0 || c->hidden_dim % 2 || c->hidden_dim > DETR_CONFIG_MAX_HIDDEN)
    problem = "hidden_dim must be positive, even and at most 8192";
  else if (c->nheads <= 0 || c->hidden_dim % c->nheads) problem = "nheads must divide hidden_dim";
  else if (c->enc_layers < 0 || c->enc_layers > DETR_MAX_LAYERS) problem = "enc_layers must be in 0..12";
  else if (c->dec_layers < 1 || c->dec_layers > DETR_MAX_LAYERS) problem = "dec_layers must be in 1..12";
  else if (c->ffn_dim <= 0 || c->ffn_dim > DETR_CONFIG_MAX_FFN) problem = "ffn_dim must be in 1..65536";
  else if (c->frozen_stages < 0 || c->frozen_stages > 5) problem = "frozen_stages must be in 0..5";
  else if (c->num_queries <= 0 || c->num_queries > DETR_CONFIG_MAX_QUERIES) problem = "num_queries must be in 1..65536";
  else if (c->num_classes <= 0 || c->num_classes > DETR_CONFIG_MAX_CLASSES)
    problem = "num_classes must be in 1..1048577";
  else if (!(c->dropout >= 0.0f && c->dropout < 1.0f)) problem = "dropout must be in [0, 1)";
  else if (c->decoder_cross_attn && !decoder_cross_attn_find(detr_decoder(c), c->decoder_cross_attn))
    problem = "decoder_cross_attn is not offered by the decoder";
  else if (detr_decoder(c)->encode && !detr_decoder(c)->own_encoder_attn &&
           detr_encoder_attn(c) != encoder_attn_default())
    problem = "the decoder brings its own encoder (RCDA): encoder_attn does not apply to it";
  else if (detr_decoder(c)->unsupported)
    problem = detr_decoder(c)->unsupported(&(DecoderShape){.s = {.dim = c->hidden_dim,
                                                                 .heads = c->nheads,
                                                                 .ffn_dim = c->ffn_dim,
                                                                 .dropout = c->dropout,
                                                                 .pre_norm = c->pre_norm},
                                                           .layers = c->dec_layers,
                                                           .cross_attn = c->decoder_cross_attn,
                                                           .enc_layers = c->enc_layers,
                                                           .queries = c->num_queries,
                                                           .encoder_attn = detr_encoder_attn(c),
                                                           .attn_settings = &c->attn_settings});
  if (problem) {
    snprintf(err, err_cap, "config: %s", problem);
    return -1;
  }
  return 0;
}

int detr_math_parse(const char *name, DetrMath *math, char *err, size_t err_cap) {
  static const char *const NAMES[] = {"fp32", "tf32", "bf16"};  // DETR_MATH_FP32 ...
  *math = DETR_MATH_DEFAULT;
  if (!name) return 0;
  for (int i = 0; i < 3; i++)
    if (!strcmp(name, NAMES[i])) {
      *math = (DetrMath)(DETR_MATH_FP32 + i);
      return 0;
    }
  snprintf(err, err_cap, "%s: expected fp32, tf32 or bf16", name);
  return -1;
}

bool detr_config_sets_name(const char *const *sets, int n_sets, const char *key) {
  size_t n = strlen(key);
  for (int i = 0; i < n_sets; i++)
    if (!strncmp(sets[i], key, n) && sets[i][n] == '=') return true;
  return false;
}

int detr_math_keys(DetrMath math, bool inference, Device dev, const char *const *sets, int n_sets, const char *keys[2],
                   char *err, size_t err_cap) {
  switch (math) {
    case DETR_MATH_DEFAULT:
      if (!inference || detr_config_sets_name(sets, n_sets, "bf16")) return 0;
      keys[0] = "bf16=false";
      return 1;
    case DETR_MATH_FP32: keys[0] = "tf32=false", keys[1] = "bf16=false"; return 2;
    case DETR_MATH_TF32: keys[0] = "tf32=true", keys[1] = "bf16=false"; return 2;
    case DETR_MATH_BF16: {
      char why[256];
      if (!device_bf16_supported(dev, why, sizeof why)) {
        snprintf(err, err_cap, "bf16: %s", why);
        return -1;
      }
      keys[0] = "tf32=false", keys[1] = "bf16=true";
      return 2;
    }
  }
  snprintf(err, err_cap, "precision %d: not a DetrMath", (int)math);
  return -1;
}
