// detr export: a model written for another framework. --format transformers: a Hugging Face
// transformers model folder (config.json + model.safetensors) that DetrForObjectDetection or
// ConditionalDetrForObjectDetection's from_pretrained loads (docs/ecosystem.md).
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/json_text.h"
#include "cli/cli.h"
#include "cli/commands.h"
#include "cli/setup.h"
#include "datasets/data_util.h"
#include "nn/model_io.h"

static const char *USAGE =
    "--format transformers (--checkpoint C | --weights W [--config X]) [--set k=v ...] [--backbone timm|resnet] "
    "OUT_DIR\n"
    "Writes the model as a Hugging Face transformers folder: OUT_DIR/config.json and OUT_DIR/model.safetensors\n"
    "(DetrForObjectDetection, or ConditionalDetrForObjectDetection for decoder=conditional), which transformers'\n"
    "from_pretrained(OUT_DIR) loads offline (use_pretrained_backbone is false). The backbone is named as timm's\n"
    "ResNet (use_timm_backbone=True, the default) or as transformers' own (--backbone resnet, the hub's no_timm).\n"
    "Class names come from the checkpoint, or --names. The model must be one transformers has: DETR or\n"
    "Conditional DETR, a ResNet of 4 stages and width 64, dense post-norm attention.";

typedef struct {
  const char *format, *checkpoint, *weights, *config, *names, *backbone, *out_dir;
  CliList sets;
  HfFormat fmt;
} ExportArgs;

static int parse_args(int argc, char **argv, ExportArgs *a) {
  *a = (ExportArgs){.backbone = "timm"};
  CliFlag flags[] = {
      {"format", FLAG_STRING, &a->format, "transformers (a Hugging Face transformers model folder)"},
      {"checkpoint", FLAG_STRING, &a->checkpoint, "a detr-c checkpoint (model config, weights, class names)"},
      {"weights", FLAG_STRING, &a->weights, "model weights safetensors, with --config"},
      {"config", FLAG_STRING, &a->config,
       "with --weights: preset (" DETR_PRESET_LIST ") or key=value file (default " SETUP_DEFAULT_PRESET ")"},
      {"set", FLAG_LIST, &a->sets, "override one model config field"},
      {"names", FLAG_STRING, &a->names, "COCO instances JSON whose categories name the labels (config.json id2label)"},
      {"backbone", FLAG_STRING, &a->backbone,
       "the backbone's names: timm (default, use_timm_backbone=True) or resnet (transformers' ResNet)"},
  };
  const char *pos[2];
  int n_pos = 0;
  int rc = cli_parse("export", USAGE, argc, argv, 2, flags, (int)(sizeof flags / sizeof flags[0]), pos, 2, &n_pos);
  if (rc) return rc == 1 ? 1 : 2;
  const char *usage_error = NULL;
  if (!a->format || strcmp(a->format, "transformers")) usage_error = "--format transformers is required";
  else if (!a->checkpoint == !a->weights) usage_error = "exactly one of --checkpoint and --weights is required";
  else if (a->checkpoint && a->config) usage_error = "--config goes with --weights (a checkpoint stores its config)";
  else if (strcmp(a->backbone, "timm") && strcmp(a->backbone, "resnet")) usage_error = "--backbone: timm or resnet";
  else if (n_pos != 1) usage_error = "one OUT_DIR is required";
  if (usage_error) {
    fprintf(stderr, "detr export: %s (see detr export --help)\n", usage_error);
    return 2;
  }
  a->out_dir = pos[0];
  a->fmt = strcmp(a->backbone, "timm") ? HF_RESNET : HF_TIMM;
  return 0;
}

// What transformers' DETR and Conditional DETR cannot hold of this model, or NULL.
static const char *not_exportable(const DetrConfig *c, HfFormat fmt) {
  const char *dec = detr_decoder(c)->name;
  if (strcmp(dec, "detr") && strcmp(dec, "conditional")) return "transformers has DETR and Conditional DETR decoders";
  if (c->decoder_cross_attn && strcmp(c->decoder_cross_attn, "softmax")) return "its cross-attention is softmax's";
  if (detr_encoder_attn(c) != encoder_attn_default()) return "its encoder attention is dense (encoder_attn=dense)";
  if (c->pre_norm) return "its layers are post-norm";
  if (c->backbone_layers == 3) return "its ResNet has 4 stages";
  if (c->backbone_width != 0 && c->backbone_width != 64) return "its ResNet has width 64";
  if (c->dilation && fmt == HF_RESNET) return "transformers' ResNet has no dilation (DC5): use --backbone timm";
  return NULL;
}

// put() of json_quote into a FILE.
static void put_file(void *ctx, const char *bytes, size_t n) { fwrite(bytes, 1, n, (FILE *)ctx); }

// Label i's name: the one known, else transformers' own LABEL_i.
static const char *label_name(const LabelNames *nm, int i, char *buf, size_t cap) {
  if (i < nm->n && nm->name[i]) return nm->name[i];
  snprintf(buf, cap, "LABEL_%d", i);
  return buf;
}

// "id2label" and "label2id". A name given twice keeps its first id in label2id (one to one).
static void write_labels(FILE *f, const DetrConfig *c, const LabelNames *nm) {
  char a[32], b[32];
  fputs("  \"id2label\": {", f);
  for (int i = 0; i < c->num_classes; i++) {
    fprintf(f, "%s\"%d\": ", i ? ", " : "", i);
    json_quote(label_name(nm, i, a, sizeof a), put_file, f);
  }
  fputs("},\n  \"label2id\": {", f);
  for (int i = 0; i < c->num_classes; i++) {
    const char *name = label_name(nm, i, a, sizeof a);
    bool first = true;
    for (int j = 0; j < i && first; j++) first = strcmp(name, label_name(nm, j, b, sizeof b)) != 0;
    if (!first) continue;
    fputs(i ? ", " : "", f);
    json_quote(name, put_file, f);
    fprintf(f, ": %d", i);
  }
  fputs("},\n", f);
}

// The backbone's part of config.json: timm's resnetN, or transformers' ResNetConfig.
static void write_backbone(FILE *f, const DetrConfig *c, HfFormat fmt) {
  int d = c->backbone_depth;
  if (fmt == HF_TIMM) {
    fprintf(f, "  \"use_timm_backbone\": true,\n  \"backbone\": \"resnet%d\",\n  \"backbone_config\": null,\n", d);
    fprintf(f, "  \"backbone_kwargs\": {\"in_chans\": 3, \"out_indices\": [1, 2, 3, 4]%s},\n",
            c->dilation ? ", \"output_stride\": 16" : "");
    return;
  }
  static const int DEPTHS[][4] = {{2, 2, 2, 2}, {3, 4, 6, 3}, {3, 4, 6, 3}, {3, 4, 23, 3}};  // 18, 34, 50, 101
  const int *n = DEPTHS[d == 18 ? 0 : d == 34 ? 1 : d == 50 ? 2 : 3];
  int e = d >= 50 ? 4 : 1;  // a bottleneck's expansion
  fprintf(f,
          "  \"use_timm_backbone\": false,\n  \"backbone\": null,\n  \"backbone_kwargs\": null,\n"
          "  \"backbone_config\": {\"model_type\": \"resnet\", \"num_channels\": 3, \"embedding_size\": 64,\n"
          "    \"hidden_sizes\": [%d, %d, %d, %d], \"depths\": [%d, %d, %d, %d], \"layer_type\": \"%s\",\n"
          "    \"hidden_act\": \"relu\", \"downsample_in_first_stage\": false, \"downsample_in_bottleneck\": false,\n"
          "    \"out_features\": [\"stage4\"], \"out_indices\": [4]},\n",
          64 * e, 128 * e, 256 * e, 512 * e, n[0], n[1], n[2], n[3], d >= 50 ? "bottleneck" : "basic");
}

// config.json: the model's sizes under transformers' keys, its losses' weights the reference's.
// auxiliary_loss is false, as in the hub's configs: with it on, transformers' decoders pass each
// layer's output through the final LayerNorm before the next layer (modeling_detr.py,
// modeling_conditional_detr.py), which the reference does not: another model.
static void write_config_json(FILE *f, const DetrConfig *c, HfFormat fmt, const LabelNames *nm) {
  bool cond = !strcmp(detr_decoder(c)->name, "conditional");
  fprintf(f, "{\n  \"model_type\": \"%s\",\n  \"architectures\": [\"%s\"],\n", cond ? "conditional_detr" : "detr",
          cond ? "ConditionalDetrForObjectDetection" : "DetrForObjectDetection");
  write_backbone(f, c, fmt);
  fprintf(f,
          "  \"use_pretrained_backbone\": false,\n  \"dilation\": %s,\n  \"num_channels\": 3,\n"
          "  \"num_queries\": %lld,\n  \"d_model\": %lld,\n"
          "  \"encoder_layers\": %lld,\n  \"decoder_layers\": %lld,\n"
          "  \"encoder_attention_heads\": %lld,\n  \"decoder_attention_heads\": %lld,\n"
          "  \"encoder_ffn_dim\": %lld,\n  \"decoder_ffn_dim\": %lld,\n"
          "  \"dropout\": %g,\n  \"attention_dropout\": 0.0,\n  \"activation_dropout\": 0.0,\n"
          "  \"activation_function\": \"relu\",\n  \"position_embedding_type\": \"sine\",\n"
          "  \"encoder_layerdrop\": 0.0,\n  \"decoder_layerdrop\": 0.0,\n  \"is_encoder_decoder\": true,\n"
          "  \"init_std\": 0.02,\n  \"init_xavier_std\": 1.0,\n  \"auxiliary_loss\": false,\n",
          c->dilation ? "true" : "false", (long long)c->num_queries, (long long)c->hidden_dim, (long long)c->enc_layers,
          (long long)c->dec_layers, (long long)c->nheads, (long long)c->nheads, (long long)c->ffn_dim,
          (long long)c->ffn_dim, c->dropout);
  if (cond)
    fputs(
        "  \"class_cost\": 2,\n  \"bbox_cost\": 5,\n  \"giou_cost\": 2,\n  \"cls_loss_coefficient\": 2,\n"
        "  \"bbox_loss_coefficient\": 5,\n  \"giou_loss_coefficient\": 2,\n  \"focal_alpha\": 0.25,\n",
        f);
  else
    fputs(
        "  \"class_cost\": 1,\n  \"bbox_cost\": 5,\n  \"giou_cost\": 2,\n  \"bbox_loss_coefficient\": 5,\n"
        "  \"giou_loss_coefficient\": 2,\n  \"eos_coefficient\": 0.1,\n",
        f);
  fputs("  \"mask_loss_coefficient\": 1,\n  \"dice_loss_coefficient\": 1,\n", f);
  write_labels(f, c, nm);
  fputs("  \"torch_dtype\": \"float32\"\n}\n", f);
}

typedef struct {
  const DetrConfig *c;
  HfFormat fmt;
  const LabelNames *nm;
} ConfigJson;

static void print_config_json(FILE *f, const void *ctx) {
  const ConfigJson *j = ctx;
  write_config_json(f, j->c, j->fmt, j->nm);
}

// DIR/config.json, written whole or not at all. Returns 0, or -1 with err.
static int save_config_json(const char *dir, const DetrConfig *c, HfFormat fmt, const LabelNames *nm, char *err,
                            size_t err_cap) {
  char *path = data_path_join(dir, "config.json");
  int rc = atomic_file_write(path, print_config_json, &(ConfigJson){c, fmt, nm}, err, err_cap);
  free(path);
  return rc;
}

// model.safetensors under transformers' names, with the "format": "pt" metadata that transformers'
// loader requires of a safetensors file.
static int save_weights(const char *dir, const DetrModel *m, HfFormat fmt, char *err, size_t err_cap) {
  StWriter *w = st_writer_new();
  char *path = data_path_join(dir, "model.safetensors");
  st_writer_set_metadata(w, "format", "pt");
  int rc = params_save_hf(&m->params, w, fmt, err, err_cap);
  if (!rc) rc = st_writer_save(w, path, err, err_cap);
  st_writer_free(w);
  free(path);
  return rc;
}

// An earlier export (or save_pretrained's folder) is replaced; anything else in the way is not:
// a model.safetensors under other names, a config.json without a transformers model beside it.
static int check_out_dir(const char *dir, char *err, size_t err_cap) {
  char *model = data_path_join(dir, "model.safetensors"), *config = data_path_join(dir, "config.json");
  int rc = 0;
  if (access(model, F_OK) == 0) {
    StFile *f = st_open(model, err, err_cap);
    if (!f || hf_format(f) == HF_NONE) {
      snprintf(err, err_cap, "%s exists and is not a transformers model: not replaced", model);
      rc = -1;
    }
    st_close(f);
  } else if (access(config, F_OK) == 0) {
    snprintf(err, err_cap, "%s exists without a model.safetensors beside it: not replaced", config);
    rc = -1;
  }
  free(model);
  free(config);
  return rc;
}

// The class names: --names, else the checkpoint's.
static int load_names(const ExportArgs *a, const CheckpointInfo *ci, LabelNames *nm, char *err, size_t err_cap) {
  if (a->names) return label_names_from_coco(a->names, nm, err, err_cap) == DETR_OK ? 0 : -1;
  if (ci->categories) return label_names_from_text(a->checkpoint, ci->categories, nm, err, err_cap);
  return 0;
}

int cmd_export(int argc, char **argv, const Dist *job) {
  (void)job;
  ExportArgs a;
  int rc = parse_args(argc, argv, &a);
  if (rc) return rc == 1 ? 0 : rc;
  char err[4608];
  DetrModel *m = NULL;
  CheckpointInfo ci;
  LabelNames nm = {0};
  DataError derr;
  const char *config = a.config ? a.config : SETUP_DEFAULT_PRESET;
  if (setup_load_model(a.checkpoint, a.weights, config, &a.sets, DEVICE_CPU, &m, &ci, err, sizeof err)) {
    fprintf(stderr, "detr export: %s\n", err);
    return 1;
  }
  const char *why = not_exportable(&m->cfg, a.fmt);
  if (why) {
    snprintf(err, sizeof err, "transformers' model cannot hold this one: %s", why);
    rc = 1;
  } else if (load_names(&a, &ci, &nm, err, sizeof err) || check_out_dir(a.out_dir, err, sizeof err)) {
    rc = 1;
  } else if (data_mkdirs(a.out_dir, &derr)) {
    snprintf(err, sizeof err, "%s", derr.msg);
    rc = 1;
  } else if (save_weights(a.out_dir, m, a.fmt, err, sizeof err) ||
             save_config_json(a.out_dir, &m->cfg, a.fmt, &nm, err, sizeof err)) {
    rc = 1;
  }
  if (rc) fprintf(stderr, "detr export: %s\n", err);
  else
    printf("detr export: %s/config.json and %s/model.safetensors (%s, %s backbone names)\n", a.out_dir, a.out_dir,
           !strcmp(detr_decoder(&m->cfg)->name, "conditional") ? "ConditionalDetrForObjectDetection"
                                                               : "DetrForObjectDetection",
           a.backbone);
  label_names_free(&nm);
  checkpoint_info_free(&ci);
  detr_model_free(m);
  return rc;
}
