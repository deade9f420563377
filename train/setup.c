#define _DEFAULT_SOURCE  // strtok_r, access
#include "train/setup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nn/model_io.h"
#include "train/checkpoint.h"
#include "train/dist.h"

#if DETR_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

static int apply_line(DetrConfig *cfg, char *line, const char *where, char *err, size_t err_cap) {
  char *hash = strchr(line, '#');
  if (hash) *hash = 0;
  char *start = line + strspn(line, " \t\r\n");
  size_t len = strlen(start);
  while (len && strchr(" \t\r\n", start[len - 1])) start[--len] = 0;
  if (!len) return 0;
  char *eq = strchr(start, '=');
  if (!eq) {
    snprintf(err, err_cap, "%s: '%s' is not key=value", where, start);
    return -1;
  }
  *eq = 0;
  char local[256];
  if (detr_config_set(cfg, start, eq + 1, local, sizeof local)) {
    snprintf(err, err_cap, "%s: %s", where, local);
    return -1;
  }
  return 0;
}

// One line of f into buf (cap bytes, NUL-terminated, without its newline); *len is its length
// in bytes (NULs included), cap or more for a longer line, whose rest is consumed. False at the end.
static bool read_line(FILE *f, char *buf, size_t cap, size_t *len) {
  size_t n = 0;
  int c;
  while ((c = getc(f)) != EOF && c != '\n') {
    if (n + 1 < cap) buf[n] = (char)c;
    n++;
  }
  buf[n + 1 < cap ? n : cap - 1] = 0;
  *len = n;
  return c != EOF || n > 0;
}

int setup_model_config(const char *config, const CliList *sets, DetrConfig *cfg, char *err, size_t err_cap) {
  if (detr_config_preset(config, cfg) != 0) {
    FILE *f = fopen(config, "r");
    if (!f) {
      snprintf(err, err_cap, "--config %s: not a preset (detr-r50, detr-r18-small, tiny) nor a readable file", config);
      return -1;
    }
    detr_config_preset("detr-r50", cfg);  // a file overrides the paper's configuration
    char line[SETUP_MAX_CONFIG_LINE + 1], where[4200];
    int lineno = 0, rc = 0;
    size_t len;
    while (rc == 0 && read_line(f, line, sizeof line, &len)) {
      snprintf(where, sizeof where, "%s:%d", config, ++lineno);
      if (len > SETUP_MAX_CONFIG_LINE) {
        snprintf(err, err_cap, "%s: line longer than the limit of %d bytes", where, SETUP_MAX_CONFIG_LINE);
        rc = -1;
      } else if (strlen(line) != len) {
        snprintf(err, err_cap, "%s: a NUL byte in the line (not a text file?)", where);
        rc = -1;
      } else {
        rc = apply_line(cfg, line, where, err, err_cap);
      }
    }
    if (rc == 0 && ferror(f)) {
      snprintf(err, err_cap, "%s: read error", config);
      rc = -1;
    }
    fclose(f);
    if (rc) return -1;
  }
  if (setup_apply_sets(cfg, sets, err, err_cap)) return -1;
  return detr_config_validate(cfg, err, err_cap);
}

int setup_apply_sets(DetrConfig *cfg, const CliList *sets, char *err, size_t err_cap) {
  for (int i = 0; sets && i < sets->count; i++) {
    char line[SETUP_MAX_CONFIG_LINE + 1];
    if (strlen(sets->items[i]) > SETUP_MAX_CONFIG_LINE) {
      snprintf(err, err_cap, "--set %.40s...: longer than the limit of %d bytes", sets->items[i], SETUP_MAX_CONFIG_LINE);
      return -1;
    }
    snprintf(line, sizeof line, "%s", sets->items[i]);
    if (apply_line(cfg, line, "--set", err, err_cap)) return -1;
  }
  return 0;
}

void setup_split_paths(const char *data_dir, const char *split, char *ann, size_t ann_cap, char *img, size_t img_cap) {
  snprintf(ann, ann_cap, "%s/annotations/instances_%s.json", data_dir, split);
  size_t len = strlen(ann);
  if (access(ann, F_OK) != 0 && len + 3 < ann_cap) {
    memcpy(ann + len, ".gz", 4);
    if (access(ann, F_OK) != 0) ann[len] = 0;  // neither exists: report the plain name
  }
  snprintf(img, img_cap, "%s/%s", data_dir, split);
}

int setup_device(const char *name, Device *dev, char *err, size_t err_cap) {
  if (!strcmp(name, "cpu")) {
    *dev = DEVICE_CPU;
    return 0;
  }
  if (strcmp(name, "cuda")) {
    snprintf(err, err_cap, "--device %s: expected cpu or cuda", name);
    return -1;
  }
#if DETR_HAVE_CUDA
  char why[512];
  int n = cuda_device_probe(why, sizeof why);
  if (n == 0) {
    snprintf(err, err_cap, "--device cuda: no CUDA device: %s", why);
    return -1;
  }
  if (n < 0) {
    snprintf(err, err_cap, "--device cuda: %s", why);
    return -1;
  }
  *dev = DEVICE_CUDA;
  // Under mpirun each rank takes its own GPU before its first CUDA work (every verb, not only train).
  return dist_bind_device(*dev, err, err_cap);
#else
  snprintf(err, err_cap, "--device cuda: this build has no CUDA backend (configure with -DDETR_CUDA=ON)");
  return -1;
#endif
}

static char *copy_text(const char *s) {
  size_t n = strlen(s) + 1;
  char *c = malloc(n);
  DETR_CHECK(c, "out of host memory");
  return memcpy(c, s, n);
}

// The value of --flag in a stored command line ("train --data d --image-size 256 ..."), or -1.
static long long flag_in_command(const char *cmd, const char *flag) {
  size_t fl = strlen(flag);
  for (const char *p = cmd; p && *p;) {
    p += strspn(p, " ");
    size_t len = strcspn(p, " ");
    const char *value = NULL;
    if (len == fl && !strncmp(p, flag, fl)) value = p + len + strspn(p + len, " ");
    else if (len > fl && !strncmp(p, flag, fl) && p[fl] == '=') value = p + fl + 1;
    if (value) {
      char *end = NULL;
      long long v = strtoll(value, &end, 10);
      return end != value && (*end == 0 || *end == ' ') ? v : -1;
    }
    p += len;
  }
  return -1;
}

// The stored config against the checkpoint's own tensors, before a model is built from it: the
// tensors that pin hidden_dim, num_queries, num_classes, ffn_dim, dec_layers and the backbone width
// must be there with the config's shapes, so a small file cannot make the caller build a huge
// model. The full check of every tensor is checkpoint_load's.
static int check_config_tensors(const StFile *f, const DetrConfig *c, char *err, size_t cap) {
  char last_ffn[112];
  snprintf(last_ffn, sizeof last_ffn, "transformer.decoder.layers.%lld.linear1.weight", (long long)c->dec_layers - 1);
  const struct {
    const char *name;
    int ndim;
    int64_t d[4];
  } want[] = {
      {"query_embed.weight", 2, {c->num_queries, c->hidden_dim}},
      {"class_embed.weight", 2, {c->num_classes + 1, c->hidden_dim}},
      {last_ffn, 2, {c->ffn_dim, c->hidden_dim}},
      {"backbone.0.body.conv1.weight", 4, {c->backbone_width ? c->backbone_width : 64, 3, 7, 7}},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const StEntry *e = st_find(f, want[i].name);
    bool same = e && e->ndim == want[i].ndim;
    for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == want[i].d[d];
    if (!same) {
      snprintf(err, cap, "%s: the stored model_config does not match the checkpoint's tensors (%s %s)", st_path(f),
               want[i].name, e ? "has another shape" : "is missing");
      return -1;
    }
  }
  return 0;
}

int setup_read_checkpoint_info(const char *path, CheckpointInfo *ci, char *err, size_t cap) {
  *ci = (CheckpointInfo){.image_size = -1, .max_size = -1};
  StFile *f = st_open(path, err, cap);
  if (!f) return -1;
  const char *format = st_metadata(f, "format"), *mc = st_metadata(f, "model_config");
  int rc = 0;
  if (!format || strncmp(format, "detr-c checkpoint", 17)) {
    snprintf(err, cap, "%s: not a detr-c checkpoint (format '%s'); plain model weights load with --weights", path,
             format ? format : "none");
    rc = -1;
  } else if (!mc) {
    snprintf(err, cap, "%s: checkpoint metadata has no model_config", path);
    rc = -1;
  } else {
    detr_config_preset("detr-r50", &ci->cfg);  // every field is stored; this only fills a gap
    char *text = copy_text(mc), *save = NULL, where[4200];
    snprintf(where, sizeof where, "%s: model_config", path);
    for (char *line = strtok_r(text, "\n", &save); line && !rc; line = strtok_r(NULL, "\n", &save))
      rc = apply_line(&ci->cfg, line, where, err, cap);
    free(text);
    char why[256];
    if (!rc && detr_config_validate(&ci->cfg, why, sizeof why)) {
      snprintf(err, cap, "%s: model_config: %s", path, why);
      rc = -1;
    }
    if (!rc) rc = check_config_tensors(f, &ci->cfg, err, cap);
    const char *cats = st_metadata(f, "categories"), *train = st_metadata(f, "train_config");
    if (!rc && cats && *cats) ci->categories = copy_text(cats);
    if (train) {
      ci->image_size = flag_in_command(train, "--image-size");
      ci->max_size = flag_in_command(train, "--max-size");
    }
  }
  st_close(f);
  return rc;
}

void setup_checkpoint_info_free(CheckpointInfo *ci) {
  free(ci->categories);
  ci->categories = NULL;
}

void setup_enact_shortcut(DetrConfig *cfg, bool enact) {
  if (enact) cfg->encoder_attn = encoder_attn_find("enact");
}

void setup_eval_sizes(const DetrConfig *cfg, const CheckpointInfo *ci, int *image_size, int *max_size) {
  bool small = cfg->backbone_depth < 50, tiny = cfg->hidden_dim <= 32;
  *image_size = ci && ci->image_size >= 32 ? (int)ci->image_size : tiny ? 128 : small ? 320 : 800;
  *max_size = ci && ci->max_size >= 32 ? (int)ci->max_size : tiny ? 192 : small ? 512 : 1333;
}

int setup_load_model(const char *checkpoint, const char *weights, const char *config, const CliList *sets, bool enact,
                     Device dev, DetrModel **out, CheckpointInfo *info, char *err, size_t err_cap) {
  *out = NULL;
  if ((checkpoint != NULL) == (weights != NULL)) {
    snprintf(err, err_cap, "give exactly one of --checkpoint and --weights");
    return -1;
  }
  DetrConfig cfg;
  CheckpointInfo ci = {.image_size = -1, .max_size = -1};
  if (checkpoint) {
    if (setup_read_checkpoint_info(checkpoint, &ci, err, err_cap)) return -1;
    cfg = ci.cfg;
    if (setup_apply_sets(&cfg, sets, err, err_cap)) {
      setup_checkpoint_info_free(&ci);
      return -1;
    }
  } else if (setup_model_config(config, sets, &cfg, err, err_cap)) {
    return -1;
  }
  setup_enact_shortcut(&cfg, enact);
  if (detr_config_validate(&cfg, err, err_cap)) {
    setup_checkpoint_info_free(&ci);
    return -1;
  }
  DetrModel *m = detr_model_create(&cfg, dev);
  detr_model_init(m, 0);  // ENACT's W_prob keeps this when the weights have none
  TrainState state;
  int rc = checkpoint ? checkpoint_load(checkpoint, m, NULL, &state, err, err_cap)
                      : params_load_file(&m->params, weights, err, err_cap);
  if (rc) {
    detr_model_free(m);
    setup_checkpoint_info_free(&ci);
    return -1;
  }
  *out = m;
  if (info)
    *info = ci;
  else
    setup_checkpoint_info_free(&ci);
  return 0;
}
