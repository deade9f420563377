// The one table from the reference's tensor names to transformers' (nn/hf_names.h). Learnt from
// transformers' modeling_detr.py, modeling_conditional_detr.py and their convert_*_to_pytorch.py.
#include "nn/hf_names.h"

#include <stdio.h>
#include <string.h>

// A row: a model name that starts with `model` (literal text; '#' a decimal number) has the file
// name `file` (each '#' the model's number plus `shift`; '@' q, k or v for a packed in_proj, which
// is HF_MAX_PARTS file tensors), followed by the rest of the model name. `only`: the one format it
// is for (HF_NONE: both). The first row that matches wins.
typedef struct {
  HfFormat only;
  const char *model, *file;
  int shift[3];
} HfRow;

#define BB "model.backbone.conv_encoder.model."
static const HfRow ROWS[] = {
    // The backbone: timm's names are torchvision's.
    {HF_TIMM, "backbone.0.body.", BB, {0}},
    // transformers' ResNet: stem, then stage S-1 for layerS, its conv C-1 for convC/bnC.
    {HF_RESNET, "backbone.0.body.conv1.", BB "embedder.embedder.convolution.", {0}},
    {HF_RESNET, "backbone.0.body.bn1.", BB "embedder.embedder.normalization.", {0}},
    {HF_RESNET, "backbone.0.body.layer#.#.conv#.", BB "encoder.stages.#.layers.#.layer.#.convolution.", {-1, 0, -1}},
    {HF_RESNET, "backbone.0.body.layer#.#.bn#.", BB "encoder.stages.#.layers.#.layer.#.normalization.", {-1, 0, -1}},
    {HF_RESNET, "backbone.0.body.layer#.#.downsample.0.", BB "encoder.stages.#.layers.#.shortcut.convolution.", {-1}},
    {HF_RESNET, "backbone.0.body.layer#.#.downsample.1.", BB "encoder.stages.#.layers.#.shortcut.normalization.", {-1}},
    {HF_NONE, "input_proj.", "model.input_projection.", {0}},
    {HF_NONE, "query_embed.", "model.query_position_embeddings.", {0}},
    // The encoder (DETR's and Conditional DETR's).
    {HF_NONE, "transformer.encoder.layers.#.self_attn.in_proj_", "model.encoder.layers.#.self_attn.@_proj.", {0}},
    {HF_NONE, "transformer.encoder.layers.#.self_attn.out_proj.", "model.encoder.layers.#.self_attn.out_proj.", {0}},
    {HF_NONE, "transformer.encoder.layers.#.linear1.", "model.encoder.layers.#.fc1.", {0}},
    {HF_NONE, "transformer.encoder.layers.#.linear2.", "model.encoder.layers.#.fc2.", {0}},
    {HF_NONE, "transformer.encoder.layers.#.norm1.", "model.encoder.layers.#.self_attn_layer_norm.", {0}},
    {HF_NONE, "transformer.encoder.layers.#.norm2.", "model.encoder.layers.#.final_layer_norm.", {0}},
    // The decoder: DETR's attentions packed; Conditional DETR's projections (sa_*_proj, ca_*_proj)
    // keep their names, its cross-attention is transformers' encoder_attn as DETR's.
    {HF_NONE, "transformer.decoder.layers.#.self_attn.in_proj_", "model.decoder.layers.#.self_attn.@_proj.", {0}},
    {HF_NONE,
     "transformer.decoder.layers.#.multihead_attn.in_proj_",
     "model.decoder.layers.#.encoder_attn.@_proj.",
     {0}},
    {HF_NONE,
     "transformer.decoder.layers.#.multihead_attn.out_proj.",
     "model.decoder.layers.#.encoder_attn.out_proj.",
     {0}},
    {HF_NONE,
     "transformer.decoder.layers.#.cross_attn.out_proj.",
     "model.decoder.layers.#.encoder_attn.out_proj.",
     {0}},
    {HF_NONE, "transformer.decoder.layers.#.linear1.", "model.decoder.layers.#.fc1.", {0}},
    {HF_NONE, "transformer.decoder.layers.#.linear2.", "model.decoder.layers.#.fc2.", {0}},
    {HF_NONE, "transformer.decoder.layers.#.norm1.", "model.decoder.layers.#.self_attn_layer_norm.", {0}},
    {HF_NONE, "transformer.decoder.layers.#.norm2.", "model.decoder.layers.#.encoder_attn_layer_norm.", {0}},
    {HF_NONE, "transformer.decoder.layers.#.norm3.", "model.decoder.layers.#.final_layer_norm.", {0}},
    {HF_NONE, "transformer.decoder.layers.#.self_attn.out_proj.", "model.decoder.layers.#.self_attn.out_proj.", {0}},
    {HF_NONE, "transformer.decoder.layers.#.sa_", "model.decoder.layers.#.sa_", {0}},
    {HF_NONE, "transformer.decoder.layers.#.ca_", "model.decoder.layers.#.ca_", {0}},
    {HF_NONE, "transformer.decoder.norm.", "model.decoder.layernorm.", {0}},
    {HF_NONE, "transformer.decoder.query_scale.", "model.decoder.query_scale.", {0}},
    {HF_NONE, "transformer.decoder.ref_point_head.", "model.decoder.ref_point_head.", {0}},
    // The heads: transformers' class head is the reference's (DETR: num_labels + 1 outputs, the
    // last "no object"; Conditional DETR: num_labels sigmoids).
    {HF_NONE, "class_embed.", "class_labels_classifier.", {0}},
    {HF_NONE, "bbox_embed.", "bbox_predictor.", {0}},
};
#undef BB
#define N_ROWS (int)(sizeof ROWS / sizeof ROWS[0])

// The length of the start of s that pattern matches ('#' one decimal number, into num[]), or 0.
static size_t match(const char *pattern, const char *s, int num[3]) {
  size_t i = 0;
  int k = 0;
  for (const char *p = pattern; *p; p++) {
    if (*p != '#') {
      if (s[i] != *p) return 0;
      i++;
      continue;
    }
    if (s[i] < '0' || s[i] > '9' || k == 3) return 0;
    long v = 0;
    while (s[i] >= '0' && s[i] <= '9' && v < 1000000) v = v * 10 + (s[i++] - '0');
    num[k++] = (int)v;
  }
  return i;
}

// pattern with its numbers (plus shift) and '@' as `part`, then rest, into out.
static void render(const char *pattern, const int num[3], const int shift[3], char part, const char *rest, char *out) {
  size_t n = 0;
  int k = 0;
  for (const char *p = pattern; *p && n + 16 < HF_NAME_MAX; p++) {
    if (*p == '#') n += (size_t)snprintf(out + n, HF_NAME_MAX - n, "%d", num[k] + shift[k]), k++;
    else out[n++] = *p == '@' ? part : *p;
  }
  snprintf(out + n, HF_NAME_MAX - n, "%s", rest);
}

int hf_names(HfFormat fmt, const char *name, char out[HF_MAX_PARTS][HF_NAME_MAX]) {
  if (fmt == HF_NONE) {
    snprintf(out[0], HF_NAME_MAX, "%s", name);
    return 1;
  }
  for (int r = 0; r < N_ROWS; r++) {
    const HfRow *row = &ROWS[r];
    int num[3] = {0, 0, 0};
    size_t len = row->only == HF_NONE || row->only == fmt ? match(row->model, name, num) : 0;
    if (!len) continue;
    if (!strchr(row->file, '@')) {
      render(row->file, num, row->shift, 0, name + len, out[0]);
      return 1;
    }
    for (int part = 0; part < HF_MAX_PARTS; part++)
      render(row->file, num, row->shift, "qkv"[part], name + len, out[part]);
    return HF_MAX_PARTS;
  }
  return 0;
}

HfFormat hf_format(const StFile *f) {
  static const char backbone[] = "model.backbone.conv_encoder.model.";
  bool hf = st_find(f, "model.input_projection.weight") != NULL;
  for (int i = 0; i < st_count(f); i++) {
    const char *name = st_entry(f, i)->name;
    if (strncmp(name, backbone, sizeof backbone - 1)) continue;
    if (!strncmp(name + sizeof backbone - 1, "embedder.", 9)) return HF_RESNET;
    hf = true;
  }
  return hf ? HF_TIMM : HF_NONE;
}

const char *hf_format_name(HfFormat fmt) {
  static const char *const NAMES[] = {"reference", "transformers (timm backbone)",
                                      "transformers (transformers' ResNet)"};
  return NAMES[fmt];
}
