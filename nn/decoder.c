// The decoder registry (nn/decoder.h).
#include "nn/decoder.h"

#include <stdio.h>
#include <string.h>

extern const DecoderKind decoder_detr, decoder_conditional, decoder_anchor;

// The registry: one line per kind. The first is the default.
static const DecoderKind *const KINDS[] = {&decoder_detr, &decoder_conditional, &decoder_anchor};
#define N_KINDS ((int)(sizeof KINDS / sizeof KINDS[0]))

const DecoderKind *decoder_default(void) { return KINDS[0]; }

const ClassHead *decoder_classes(const DecoderKind *k) { return class_head_or_softmax(k->classes); }

static const DecoderModelLayout DETR_LAYOUT = {
    .prefix = "transformer.decoder",
    .backbone = "backbone.0.body",
    .input_proj = "input_proj",
    .class_embed = "class_embed",
    .bbox_embed = "bbox_embed",
    .last_ffn = "transformer.decoder.layers.%d.linear1.weight",
};

const DecoderModelLayout *decoder_layout(const DecoderKind *k) { return k->layout ? k->layout : &DETR_LAYOUT; }

const DecoderKind *decoder_find(const char *name) {
  for (int i = 0; i < N_KINDS; i++)
    if (!strcmp(KINDS[i]->name, name)) return KINDS[i];
  return NULL;
}

const char *decoder_names(char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = 0;
  for (int i = 0; i < N_KINDS && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", KINDS[i]->name);
  return buf;
}

static const char *const SOFTMAX_ONLY[] = {"softmax", NULL};

static const char *const *cross_attns(const DecoderKind *k) { return k->cross_attns ? k->cross_attns : SOFTMAX_ONLY; }

const char *decoder_cross_attn_find(const DecoderKind *k, const char *name) {
  for (const char *const *c = cross_attns(k); *c; c++)
    if (!strcmp(*c, name)) return *c;
  return NULL;
}

const char *decoder_cross_attn_names(const DecoderKind *k, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = 0;
  const char *const *c = cross_attns(k);
  for (int i = 0; c[i] && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", c[i]);
  return buf;
}
