// The model presets: the models of DETR_PRESET_ROWS (nn/detr.h), by name, and their run defaults.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "nn/detr.h"

// The paper's DETR-R50: ResNet-50, hidden 256, 8 heads, 6 + 6 layers, FFN 2048, 100 queries,
// 91 classes (COCO ids 1..90, plus the unused 0).
static void preset_r50(DetrConfig *cfg) {
  *cfg = (DetrConfig){.backbone_depth = 50,
                      .backbone_width = 64,
                      .backbone_layers = 4,
                      .train_backbone = true,
                      .frozen_stages = 2,
                      .hidden_dim = 256,
                      .nheads = 8,
                      .enc_layers = 6,
                      .dec_layers = 6,
                      .ffn_dim = 2048,
                      .num_queries = 100,
                      .num_classes = 91,
                      .dropout = 0.1f,
                      .aux_loss = true};
  attn_settings_default(&cfg->attn_settings);
}

// The paper's DETR-DC5-R50: layer4 dilated (stride 16), the rest DETR-R50.
static void preset_r50_dc5(DetrConfig *cfg) {
  preset_r50(cfg);
  cfg->dilation = true;
}

// CPU-sized: ResNet-18, hidden 128, 4 heads, 2 + 2 layers.
static void preset_r18_small(DetrConfig *cfg) {
  preset_r50(cfg);
  cfg->backbone_depth = 18;
  cfg->hidden_dim = 128;
  cfg->nheads = 4;
  cfg->enc_layers = cfg->dec_layers = 2;
  cfg->ffn_dim = 512;
  cfg->num_queries = 50;
}

// Conditional DETR (Atten4Vis/ConditionalDETR main.py): DETR's sizes, its decoder, and for the
// paper's R50 300 queries; the small one keeps detr-r18-small's sizes.
static void preset_cond_r50(DetrConfig *cfg) {
  preset_r50(cfg);
  cfg->decoder = decoder_find("conditional");
  cfg->num_queries = 300;
}

static void preset_cond_r18_small(DetrConfig *cfg) {
  preset_r18_small(cfg);
  cfg->decoder = decoder_find("conditional");
}

// Anchor DETR (megvii-research/AnchorDETR main.py defaults, the paper's single-level DC5 R50):
// dilated layer4 (stride 16), FFN 1024, dropout 0, 300 anchor points x 3 patterns = 900 queries,
// its transformer (nn/decoder_anchor.c). The small one keeps detr-r18-small's sizes (stride 32)
// with 16 anchors x 3 patterns.
static void preset_anchor_r50(DetrConfig *cfg) {
  preset_r50(cfg);
  cfg->decoder = decoder_find("anchor");
  cfg->dilation = true;
  cfg->ffn_dim = 1024;
  cfg->dropout = 0.0f;
  cfg->num_queries = 900;
}

static void preset_anchor_r18_small(DetrConfig *cfg) {
  preset_r18_small(cfg);
  cfg->decoder = decoder_find("anchor");
  cfg->dropout = 0.0f;
  cfg->num_queries = 48;
}

// detr-r18-small's layout, narrower: seconds on a CPU.
static void preset_tiny(DetrConfig *cfg) {
  preset_r18_small(cfg);
  cfg->hidden_dim = 32;
  cfg->ffn_dim = 64;
  cfg->num_queries = 10;
  cfg->num_classes = 7;
}

typedef struct {
  void (*make)(DetrConfig *cfg);
  RunDefaults run;
} Preset;

#define PRESET_ROW(id, name, epochs, image_size, max_size, lr_drop) \
  {preset_##id, {name, epochs, image_size, max_size, lr_drop}},
static const Preset PRESETS[] = {DETR_PRESET_ROWS(PRESET_ROW, PRESET_ROW)};
#define N_PRESETS (int)(sizeof PRESETS / sizeof PRESETS[0])

#define PRESET_NAME(id, name, ...) name,
const char *const DETR_PRESETS[] = {DETR_PRESET_ROWS(PRESET_NAME, PRESET_NAME) NULL};

static const Preset *preset_find(const char *name) {
  for (int i = 0; i < N_PRESETS; i++)
    if (!strcmp(PRESETS[i].run.preset, name)) return &PRESETS[i];
  return NULL;
}

int detr_config_preset(const char *name, DetrConfig *cfg) {
  const Preset *p = preset_find(name);
  if (!p) return -1;
  p->make(cfg);
  return 0;
}

// How far model a is from model b in what sets a run's cost, and so its schedule: the backbone's
// depth and the transformer's width, layers and feed-forward size, each as a ratio, and whether
// layer4 is dilated (DC5: 4x its feature map).
static double model_distance(const DetrConfig *a, const DetrConfig *b) {
  const double fa[4] = {a->backbone_depth, a->hidden_dim, a->enc_layers + a->dec_layers, a->ffn_dim};
  const double fb[4] = {b->backbone_depth, b->hidden_dim, b->enc_layers + b->dec_layers, b->ffn_dim};
  double d = 0;
  for (int i = 0; i < 4; i++) d += fabs(log((fa[i] + 1) / (fb[i] + 1)));
  return d + (a->dilation != b->dilation ? log(4.0) : 0.0);
}

const RunDefaults *detr_run_defaults(const DetrConfig *cfg) {
  const Preset *best = NULL;
  double best_d = INFINITY;
  for (int i = 0; i < N_PRESETS; i++) {  // the first of equals: the table's order
    DetrConfig p;
    PRESETS[i].make(&p);
    if (strcmp(PRESETS[i].run.preset, "tiny") && detr_decoder(&p) != detr_decoder(cfg)) continue;
    double d = model_distance(cfg, &p);
    if (d < best_d) best = &PRESETS[i], best_d = d;
  }
  return &best->run;
}
