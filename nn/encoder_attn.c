// The encoder-attention registry, settings and the pieces every variant shares.
#include "nn/encoder_attn.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const EncoderAttnKind encoder_attn_dense, encoder_attn_enact, encoder_attn_efficient, encoder_attn_hydra,
    encoder_attn_focused, encoder_attn_sra, encoder_attn_enact_official, encoder_attn_swin;

// The registry: one line per variant. The first is the default.
static const EncoderAttnKind *const KINDS[] = {
    &encoder_attn_dense,   &encoder_attn_enact, &encoder_attn_efficient,      &encoder_attn_hydra,
    &encoder_attn_focused, &encoder_attn_sra,   &encoder_attn_enact_official, &encoder_attn_swin,
};
#define N_KINDS ((int)(sizeof KINDS / sizeof KINDS[0]))

int encoder_attn_count(void) { return N_KINDS; }
const EncoderAttnKind *encoder_attn_at(int i) { return i >= 0 && i < N_KINDS ? KINDS[i] : NULL; }
const EncoderAttnKind *encoder_attn_default(void) { return KINDS[0]; }

const EncoderAttnKind *encoder_attn_find(const char *name) {
  for (int i = 0; i < N_KINDS; i++)
    if (!strcmp(KINDS[i]->name, name)) return KINDS[i];
  return NULL;
}

const char *encoder_attn_names(char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = 0;
  for (int i = 0; i < N_KINDS && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? "|" : "", KINDS[i]->name);
  return buf;
}

// --- settings ---

void attn_settings_default(AttnSettings *s) {
  *s = (AttnSettings){0};
  for (int k = 0; k < N_KINDS; k++)
    for (int i = 0; i < KINDS[k]->n_settings; i++) {
      DETR_CHECK(s->n < ATTN_MAX_SETTINGS, "attn_settings_default: more than %d variant settings", ATTN_MAX_SETTINGS);
      s->spec[s->n] = &KINDS[k]->settings[i];
      s->value[s->n++] = KINDS[k]->settings[i].default_value;
    }
}

double attn_setting(const AttnSettings *s, const char *key) {
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->spec[i]->key, key)) return s->value[i];
  DETR_CHECK(false, "attn_setting: no variant declares the setting '%s'", key);
  return 0.0;
}

int config_parse_bool(const char *key, const char *value, bool *out, char *err, size_t err_cap) {
  if (!strcmp(value, "1") || !strcmp(value, "true")) *out = true;
  else if (!strcmp(value, "0") || !strcmp(value, "false")) *out = false;
  else {
    snprintf(err, err_cap, "config %s: '%s' is not a boolean (true/false/1/0)", key, value);
    return -1;
  }
  return 0;
}

int attn_settings_set(AttnSettings *s, const char *key, const char *value, char *err, size_t err_cap) {
  for (int i = 0; i < s->n; i++) {
    const AttnSettingSpec *sp = s->spec[i];
    if (strcmp(sp->key, key)) continue;
    double v;
    char *end = NULL;
    errno = 0;
    if (sp->type == ATTN_SETTING_BOOL) {
      bool on;
      if (config_parse_bool(key, value, &on, err, err_cap)) return -1;
      v = on ? 1.0 : 0.0;
    } else {
      v = sp->type == ATTN_SETTING_INT ? (double)strtoll(value, &end, 10) : strtod(value, &end);
      if (errno || end == value || *end || !isfinite(v)) {
        snprintf(err, err_cap, "config %s: '%s' is not %s", key, value,
                 sp->type == ATTN_SETTING_INT ? "an integer" : "a number");
        return -1;
      }
      if (!(v >= sp->min && v <= sp->max)) {
        snprintf(err, err_cap, "config %s: %s is outside [%g, %g] (%s)", key, value, sp->min, sp->max, sp->help);
        return -1;
      }
    }
    s->value[i] = v;
    return 1;
  }
  return 0;
}

size_t attn_settings_format(const AttnSettings *s, const EncoderAttnKind *kind, char *buf, size_t cap) {
  size_t n = 0;
  for (int j = 0; j < kind->n_settings && n < cap; j++) {
    const AttnSettingSpec *sp = &kind->settings[j];
    double v = attn_setting(s, sp->key);
    if (sp->type == ATTN_SETTING_BOOL)
      n += (size_t)snprintf(buf + n, cap - n, "%s=%s\n", sp->key, v != 0 ? "true" : "false");
    else if (sp->type == ATTN_SETTING_INT) n += (size_t)snprintf(buf + n, cap - n, "%s=%lld\n", sp->key, (long long)v);
    else n += (size_t)snprintf(buf + n, cap - n, "%s=%.9g\n", sp->key, (double)(float)v);
  }
  return n < cap ? n : cap;
}

// --- the batch's feature map ---

void feature_geometry_make(const uint8_t *mask, int64_t B, int64_t Hp, int64_t Wp, Device dev, FeatureGeometry *g) {
  int64_t N = Hp * Wp;
  *g = (FeatureGeometry){.B = B, .Hp = Hp, .Wp = Wp, .mask = mask, .rectangular = true};
  g->valid_h = detr_calloc((size_t)(2 * B), sizeof(int64_t), "feature_geometry_make valid_h");
  float *host = detr_malloc((size_t)(2 * B * N) * sizeof(float), "feature_geometry_make host");
  g->valid_w = g->valid_h + B;
  float *additive = host, *valid = host + B * N;
  for (int64_t b = 0; b < B; b++) {
    const uint8_t *m = mask + b * N;
    int64_t h = 0, w = 0;
    while (h < Hp && !m[h * Wp]) h++;
    while (w < Wp && !m[w]) w++;
    for (int64_t p = 0; p < N; p++) {
      additive[b * N + p] = m[p] ? -INFINITY : 0.0f;
      valid[b * N + p] = m[p] ? 0.0f : 1.0f;
      if ((bool)m[p] != (p / Wp >= h || p % Wp >= w)) g->rectangular = false;
    }
    g->valid_h[b] = h;
    g->valid_w[b] = w;
  }
  g->key_mask = op_constant(dev, SHAPE(B, N), additive);  // the caller's scope owns them
  g->valid = op_constant(dev, SHAPE(B, N, 1), valid);
  free(host);
}

void feature_geometry_free(FeatureGeometry *g) {
  free(g->valid_h);
  g->valid_h = g->valid_w = NULL;
  g->key_mask = g->valid = NULL;
}

void attn_stats_add(AttnStatSums *s, const AttnTrace *layers, int n_layers, int images) {
  if (n_layers == 0 || layers[0].n_stats == 0) return;
  s->n = layers[0].n_stats;
  for (int i = 0; i < s->n; i++) {
    s->name[i] = layers[0].stats[i].name;
    s->label[i] = layers[0].stats[i].label;
    double mean = 0.0;
    for (int l = 0; l < n_layers; l++) mean += layers[l].stats[i].value / n_layers;
    s->sum[i] += mean * images;
  }
  s->images += images;
}

double attn_stats_mean(const AttnStatSums *s, int i) { return s->images > 0 ? s->sum[i] / s->images : 0.0; }

void attn_trace_resolve(AttnTrace *t) {
  if (!t->resolve) return;
  t->resolve(t);
  t->resolve = NULL;
  t->pending[0] = t->pending[1] = NULL;
}

void attn_trace_free(AttnTrace *t) {
  if (t->release && t->owned) t->release(t->owned);
  *t = (AttnTrace){0};
}
