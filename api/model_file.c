#define _POSIX_C_SOURCE 200809L  // strtok_r
#include "api/model_file.h"

#include <errno.h>
#include <math.h>
#include <ctype.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>  // crc32

#include "datasets/coco.h"
#include "datasets/data_util.h"
#include "nn/model_io.h"

// --- checkpoint format and checksum ------------------------------------------------------------

unsigned long checkpoint_crc_update(unsigned long crc, const char *name, const void *data, size_t nbytes) {
  crc = crc32(crc, (const Bytef *)name, (uInt)strlen(name) + 1);
  const Bytef *p = data;
  while (nbytes > 0) {  // zlib takes uInt lengths
    uInt chunk = nbytes > (1u << 30) ? (1u << 30) : (uInt)nbytes;
    crc = crc32(crc, p, chunk);
    p += chunk;
    nbytes -= chunk;
  }
  return crc;
}

bool checkpoint_is(const StFile *f) {
  const char *format = st_metadata(f, "format");
  return format && !strcmp(format, CHECKPOINT_FORMAT);
}

static void not_a_checkpoint(const StFile *f, const char *hint, char *err, size_t err_cap) {
  const char *format = st_metadata(f, "format");
  snprintf(err, err_cap, "%s: not a detr-c checkpoint (format '%s')%s%s", st_path(f), format ? format : "none",
           hint ? "; " : "", hint ? hint : "");
}

int checkpoint_verify(const StFile *f, const char *hint, char *err, size_t err_cap) {
  if (!checkpoint_is(f)) {
    not_a_checkpoint(f, hint, err, err_cap);
    return -1;
  }
  uLong crc = crc32(0L, Z_NULL, 0);
  for (int i = 0; i < st_count(f); i++) {
    const StEntry *e = st_entry(f, i);
    crc = checkpoint_crc_update(crc, e->name, st_data(f, e), e->nbytes);
  }
  char expect[32];
  snprintf(expect, sizeof expect, "%08lx", crc);
  const char *stored = st_metadata(f, "crc32");
  if (!stored || strcmp(stored, expect)) {
    snprintf(err, err_cap, "%s: checksum mismatch (stored %s, computed %s): the checkpoint is corrupted", st_path(f),
             stored ? stored : "none", expect);
    return -1;
  }
  return 0;
}

// --- model configs -----------------------------------------------------------------------------

int model_config_line(DetrConfig *cfg, char *line, const char *where, char *err, size_t err_cap) {
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
  char local[2048];  // an unknown key's message lists every key
  if (detr_config_set(cfg, start, eq + 1, local, sizeof local)) {
    snprintf(err, err_cap, "%s: %s", where, local);
    return -1;
  }
  return 0;
}

int model_config_apply_sets(DetrConfig *cfg, const char *const *sets, int n_sets, char *err, size_t err_cap) {
  for (int i = 0; i < n_sets; i++) {
    char line[MODEL_CONFIG_MAX_LINE + 1];
    if ((size_t)snprintf(line, sizeof line, "%s", sets[i]) >= sizeof line) {
      snprintf(err, err_cap, "--set: '%.40s...' is longer than the limit of %d bytes", sets[i], MODEL_CONFIG_MAX_LINE);
      return -1;
    }
    if (model_config_line(cfg, line, "--set", err, err_cap)) return -1;
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

int model_config_load(const char *config, const char *const *sets, int n_sets, DetrConfig *cfg, char *err,
                      size_t err_cap) {
  if (detr_config_preset(config, cfg) != 0) {
    FILE *f = fopen(config, "r");
    struct stat st;
    if (!f || fstat(fileno(f), &st) || !S_ISREG(st.st_mode)) {
      snprintf(err, err_cap, "--config %s: not a preset (" DETR_PRESET_LIST ") nor a readable file", config);
      if (f) fclose(f);
      return -1;
    }
    detr_config_preset("detr-r50", cfg);  // a file overrides the paper's configuration
    // Whole lines only: a fixed buffer would split a long line into a second, silently applied one.
    char line[MODEL_CONFIG_MAX_LINE + 1], where[4200];
    int lineno = 0, rc = 0;
    size_t len;
    while (rc == 0 && read_line(f, line, sizeof line, &len)) {
      snprintf(where, sizeof where, "%s:%d", config, ++lineno);
      if (len > MODEL_CONFIG_MAX_LINE) {
        snprintf(err, err_cap, "%s: line longer than the limit of %d bytes", where, MODEL_CONFIG_MAX_LINE);
        rc = -1;
      } else if (strlen(line) != len) {
        snprintf(err, err_cap, "%s: a NUL byte in the line (not a text file?)", where);
        rc = -1;
      } else {
        rc = model_config_line(cfg, line, where, err, err_cap);
      }
    }
    if (rc == 0 && ferror(f)) {
      snprintf(err, err_cap, "%s: read error", config);
      rc = -1;
    }
    fclose(f);
    if (rc) return -1;
  }
  if (model_config_apply_sets(cfg, sets, n_sets, err, err_cap)) return -1;
  return detr_config_validate(cfg, err, err_cap);
}

// --- checkpoint metadata -----------------------------------------------------------------------

// A checkpoint's config (stored, then the overrides) against the file's own tensors, before a
// model is built from it: the tensors that pin hidden_dim, num_queries, num_classes, ffn_dim,
// dec_layers and the backbone width must be there with the config's shapes, so a small file
// cannot make the caller build a huge model. The full check of every tensor is the load's.
static int check_config_tensors(const StFile *f, const DetrConfig *c, bool overridden, char *err, size_t err_cap) {
  const DecoderModelLayout *lay = decoder_layout(detr_decoder(c));
  char last_ffn[112], class_w[112], conv1[112];
  snprintf(last_ffn, sizeof last_ffn, lay->last_ffn, (int)c->dec_layers - 1);
  snprintf(class_w, sizeof class_w, "%s.weight", lay->class_embed);
  snprintf(conv1, sizeof conv1, "%s.conv1.weight", lay->backbone);
  const struct {
    const char *name;
    int ndim;
    int64_t d[4];
  } want[] = {
      {"query_embed.weight", 2, {c->num_queries, c->hidden_dim}},  // not for a kind with its own queries
      {class_w, 2, {c->num_classes + detr_classes(c)->extra_columns, c->hidden_dim}},
      {last_ffn, 2, {c->ffn_dim, c->hidden_dim}},
      {conv1, 4, {c->backbone_width ? c->backbone_width : 64, 3, 7, 7}},
  };
  // The decoder kind's layout names the tensors (nn/decoder.h DecoderModelLayout); a kind that makes
  // its own queries (Anchor DETR) has no query_embed: its anchors pin num_queries at the load.
  for (size_t i = lay->own_queries ? 1 : 0; i < sizeof want / sizeof want[0]; i++) {
    const StEntry *e = st_find(f, want[i].name);
    bool same = e && e->ndim == want[i].ndim;
    for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == want[i].d[d];
    if (!same) {
      snprintf(err, err_cap, "%s: the model_config%s does not match the checkpoint's tensors (%s %s)", st_path(f),
               overridden ? " with the overrides" : "", want[i].name, e ? "has another shape" : "is missing");
      return -1;
    }
  }
  return 0;
}

// The fields of RunSettings by key, with the range detr train's flag allows: the one table its
// writer and reader share. The reader holds a checkpoint's values to the same ranges as the flags
// (a crafted file must not hand a resumed run what no flag could).
typedef struct {
  const char *key;
  bool is_float;  // else an int
  size_t offset;
  double min, max;  // the flag's range; NaN allowed where min is NaN (a weight: the model's own)
} RunSettingsField;

#define RS_INT(k, lo, hi) \
  { #k, false, offsetof(RunSettings, k), lo, hi }
#define RS_FLOAT(k, lo, hi) \
  { #k, true, offsetof(RunSettings, k), lo, hi }
static const RunSettingsField RUN_SETTINGS_FIELDS[] = {
    RS_INT(epochs, 1, 100000),      RS_INT(lr_drop, 1, 1000000),   RS_INT(batch, 1, 64),
    RS_INT(pad_multiple, 1, 256),   RS_INT(image_size, 32, 4096),  RS_INT(max_size, 32, 8192),
    RS_INT(augment, 0, 1),          RS_FLOAT(lr, 1e-30, 1e6),      RS_FLOAT(lr_backbone, 0, 1e6),
    RS_FLOAT(weight_decay, 0, 1e6), RS_FLOAT(clip, 0, 1e30),       RS_FLOAT(ce, NAN, 1e6),
    RS_FLOAT(bbox, NAN, 1e6),       RS_FLOAT(giou, NAN, 1e6),      RS_FLOAT(eos, NAN, 1e6),
    RS_FLOAT(cost_class, NAN, 1e6), RS_FLOAT(cost_bbox, NAN, 1e6), RS_FLOAT(cost_giou, NAN, 1e6)};
#undef RS_INT
#undef RS_FLOAT
#define N_RUN_SETTINGS_FIELDS (sizeof RUN_SETTINGS_FIELDS / sizeof RUN_SETTINGS_FIELDS[0])

void run_settings_format(const RunSettings *s, char *out, size_t cap) {
  size_t n = 0;
  out[0] = 0;
  for (size_t i = 0; i < N_RUN_SETTINGS_FIELDS && n < cap; i++) {
    const RunSettingsField *f = &RUN_SETTINGS_FIELDS[i];
    const char *p = (const char *)s + f->offset;
    if (f->is_float) n += (size_t)snprintf(out + n, cap - n, "%s=%.9g\n", f->key, (double)*(const float *)p);
    else n += (size_t)snprintf(out + n, cap - n, "%s=%d\n", f->key, *(const int *)p);
  }
}

// One "key=value" line into s: 0, 1 for a key this version does not know (a later version's:
// ignored), -1 with err set.
static int run_settings_line(const char *line, size_t len, RunSettings *s, bool *seen, const char *where, char *err,
                             size_t err_cap) {
  size_t eq = strcspn(line, "=");
  char key[32], value[64];
  if (eq >= len || eq >= sizeof key || len - eq - 1 >= sizeof value) {
    snprintf(err, err_cap, "%s: '%.*s' is no key=value line", where, (int)(len < 80 ? len : 80), line);
    return -1;
  }
  snprintf(key, sizeof key, "%.*s", (int)eq, line);
  snprintf(value, sizeof value, "%.*s", (int)(len - eq - 1), line + eq + 1);
  size_t i = 0;
  while (i < N_RUN_SETTINGS_FIELDS && strcmp(key, RUN_SETTINGS_FIELDS[i].key)) i++;
  if (i == N_RUN_SETTINGS_FIELDS) return 1;
  const RunSettingsField *f = &RUN_SETTINGS_FIELDS[i];
  char *end = NULL;
  double v = strtod(value, &end);
  bool nan_ok = isnan(f->min) && isnan(v);
  bool ok = end != value && !*end && !isspace((unsigned char)value[0]) && !seen[i] &&
            (nan_ok || (v >= (isnan(f->min) ? 0 : f->min) && v <= f->max && (f->is_float || v == (double)(int)v)));
  if (!ok) {
    snprintf(err, err_cap, "%s: %s=%s: %s", where, key, value, seen[i] ? "given twice" : "not a value the flag takes");
    return -1;
  }
  if (f->is_float) *(float *)((char *)s + f->offset) = (float)v;
  else *(int *)((char *)s + f->offset) = (int)v;
  seen[i] = true;
  return 0;
}

int run_settings_parse(const char *text, RunSettings *s, const char *where, char *err, size_t err_cap) {
  *s = (RunSettings){0};
  bool seen[N_RUN_SETTINGS_FIELDS] = {false};
  for (const char *line = text; *line;) {
    size_t len = strcspn(line, "\n");
    if (len > 0 && run_settings_line(line, len, s, seen, where, err, err_cap) < 0) return -1;
    line += len + (line[len] == '\n');
  }
  for (size_t i = 0; i < N_RUN_SETTINGS_FIELDS; i++)
    if (!seen[i]) {
      snprintf(err, err_cap, "%s: no %s", where, RUN_SETTINGS_FIELDS[i].key);
      return -1;
    }
  s->known = true;
  return 0;
}

int checkpoint_info_read(const StFile *f, CheckpointInfo *ci, char *err, size_t err_cap) {
  *ci = (CheckpointInfo){0};
  const char *mc = st_metadata(f, "model_config");
  if (!checkpoint_is(f)) {
    not_a_checkpoint(f, "plain model weights load with --weights (detr_open_weights)", err, err_cap);
    return -1;
  }
  if (!mc) {
    snprintf(err, err_cap, "%s: checkpoint metadata has no model_config", st_path(f));
    return -1;
  }
  detr_config_preset("detr-r50", &ci->cfg);  // every field is stored; this only fills a gap
  char *text = detr_strdup(mc, "a string"), *save = NULL, where[4200];
  snprintf(where, sizeof where, "%s: model_config", st_path(f));
  int rc = 0;
  for (char *line = strtok_r(text, "\n", &save); line && !rc; line = strtok_r(NULL, "\n", &save))
    rc = model_config_line(&ci->cfg, line, where, err, err_cap);
  free(text);
  if (rc) return -1;
  // Without run_settings (written by no training run, or by a version before they were stored)
  // the run's settings are unknown: whoever reads the checkpoint uses the model's run defaults.
  const char *cats = st_metadata(f, "categories"), *run = st_metadata(f, "run_settings");
  if (run) {
    snprintf(where, sizeof where, "%s: run_settings", st_path(f));
    if (run_settings_parse(run, &ci->run, where, err, err_cap)) return -1;
  }
  if (cats && *cats) ci->categories = detr_strdup(cats, "a string");
  return 0;
}

void checkpoint_info_free(CheckpointInfo *ci) {
  free(ci->categories);
  ci->categories = NULL;
}

void model_eval_sizes(const DetrConfig *cfg, const CheckpointInfo *ci, int *image_size, int *max_size) {
  const RunDefaults *d = detr_run_defaults(cfg);
  bool known = ci && ci->run.known;
  *image_size = known ? ci->run.image_size : d->image_size;
  *max_size = known ? ci->run.max_size : d->max_size;
}

// --- class names -------------------------------------------------------------------------------

#define MAX_LABEL 1000000  // ids beyond any model are ignored rather than allocated

static void names_set(LabelNames *nm, int label, const char *name) {
  if (label < 0 || label > MAX_LABEL) return;
  if (label >= nm->n) {
    char **grown = detr_realloc(nm->name, (size_t)(label + 1) * sizeof(char *), "label names");
    for (int i = nm->n; i <= label; i++) grown[i] = NULL;
    nm->name = grown, nm->n = label + 1;
  }
  free(nm->name[label]);
  nm->name[label] = detr_strdup(name, "a string");
}

void label_names_free(LabelNames *nm) {
  for (int i = 0; i < nm->n; i++) free(nm->name[i]);
  free(nm->name);
  *nm = (LabelNames){0};
}

// A missing, unreadable or non-regular file is an I/O error with errno's words.
int file_check_readable(const char *path, char *err, size_t err_cap) {
  return data_regular_file_size(path, err, err_cap) < 0 ? -1 : 0;
}

// The categories of a COCO file as coco.c reads them (categories_only: the rest of the file is
// skipped unread), every item checked as for training.
detr_status label_names_from_coco(const char *path, LabelNames *nm, char *err, size_t err_cap) {
  if (file_check_readable(path, err, err_cap)) return DETR_ERR_IO;
  CocoOpenConfig cc = {.ann_path = path, .policy = BAD_INPUT_FAIL, .quiet = true, .categories_only = true};
  CocoDataset *ds;
  DataError derr;
  if (coco_open(&cc, &ds, &derr) != DATA_OK) {
    snprintf(err, err_cap, "%s", derr.msg);
    return DETR_ERR_FORMAT;
  }
  for (int i = 0; i < ds->n_categories; i++) names_set(nm, ds->categories[i].id, ds->categories[i].name);
  int n = ds->n_categories;
  coco_free(ds);
  if (n > 0) return DETR_OK;
  snprintf(err, err_cap, "%s: no categories (expected a COCO instances file)", path);
  return DETR_ERR_FORMAT;
}

int label_names_from_text(const char *path, const char *text, LabelNames *nm, char *err, size_t err_cap) {
  char *copy = detr_strdup(text, "a string"), *save = NULL;
  int rc = 0;
  for (char *item = strtok_r(copy, ";", &save); item && !rc; item = strtok_r(NULL, ";", &save)) {
    char *colon = strchr(item, ':'), *end = NULL;
    long id = colon ? strtol(item, &end, 10) : -1;
    if (!colon || end != colon || id < 0) {
      snprintf(err, err_cap, "%s: metadata 'categories': '%s' is not id:name", path, item);
      rc = -1;
    } else {
      names_set(nm, id > MAX_LABEL ? -1 : (int)id, colon + 1);
    }
  }
  free(copy);
  return rc;
}

// --- loading a model ---------------------------------------------------------------------------

// A readable safetensors file: DETR_ERR_IO when it cannot be read, DETR_ERR_FORMAT when it is not
// a (complete, valid) safetensors file.
static detr_status open_safetensors(const char *path, StFile **f, char *err, size_t err_cap) {
  *f = NULL;
  if (file_check_readable(path, err, err_cap)) return DETR_ERR_IO;
  *f = st_open(path, err, err_cap);
  return *f ? DETR_OK : DETR_ERR_FORMAT;
}

void weights_fitting_presets(const StFile *f, char *out, size_t cap) {
  size_t n = 0;
  out[0] = 0;
  for (int i = 0; DETR_PRESETS[i]; i++) {
    DetrConfig cfg;
    if (detr_config_preset(DETR_PRESETS[i], &cfg)) continue;
    const DecoderModelLayout *lay = decoder_layout(detr_decoder(&cfg));
    char class_w[112];
    snprintf(class_w, sizeof class_w, "%s.weight", lay->class_embed);
    const StEntry *c = params_file_entry(f, class_w), *q = params_file_entry(f, "query_embed.weight");
    if (!c || c->ndim != 2) continue;  // not this decoder's layout
    cfg.num_classes = c->shape[0] - detr_classes(&cfg)->extra_columns;
    if (q && q->ndim == 2 && !lay->own_queries) cfg.num_queries = q->shape[0];
    char why[256];
    if (cfg.num_classes < 1 || cfg.num_queries < 1 || cfg.num_classes > 100000 || cfg.num_queries > 100000 ||
        detr_config_validate(&cfg, why, sizeof why))
      continue;
    DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
    ParamsFit w = params_fit(&m->params, f);
    detr_model_free(m);
    if (w.other == 0 && w.missing == 0 && w.unused == 0 && n < cap)
      n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? ", " : "", DETR_PRESETS[i]);
  }
}

void weights_mismatch_hint(const ParamStore *ps, const StFile *f, bool with_partial, char *err, size_t err_cap) {
  char presets[512];
  weights_fitting_presets(f, presets, sizeof presets);
  size_t n = strlen(err);
  if (presets[0] && n < err_cap)
    n += (size_t)snprintf(err + n, err_cap - n, "\n(the file's tensors are those of the preset%s %s: --config %.*s)",
                          strchr(presets, ',') ? "s" : "", presets, (int)strcspn(presets, ","), presets);
  ParamsFit w = params_fit(ps, f);
  if (with_partial && n < err_cap)
    snprintf(err + n, err_cap - n,
             "\n(--init-partial would load the %d of the model's %d tensors that fit and keep the initialisation of "
             "the other %d: %d of another shape, %d missing from the file; %d of the file's tensors unused)",
             w.fit, w.fit + w.other + w.missing, w.other + w.missing, w.other, w.missing, w.unused);
}

detr_status model_file_load(const char *checkpoint, const char *weights, const char *config, const char *const *sets,
                            int n_sets, Device dev, DetrModel **out, CheckpointInfo *info, char *err, size_t err_cap) {
  *out = NULL;
  CheckpointInfo ci = {0};
  if (info) *info = ci;
  if ((checkpoint != NULL) == (weights != NULL)) {
    snprintf(err, err_cap, "give exactly one of a checkpoint (--checkpoint) and weights (--weights)");
    return DETR_ERR_ARGUMENT;
  }
  DetrConfig cfg;
  StFile *f = NULL;
  detr_status st = DETR_OK;
  if (checkpoint) {
    // One read of the file: format and crc, then the stored config, then the tensors.
    if ((st = open_safetensors(checkpoint, &f, err, err_cap))) return st;
    if (checkpoint_info_read(f, &ci, err, err_cap) ||
        checkpoint_verify(f, "plain model weights load with --weights (detr_open_weights)", err, err_cap)) {
      st = DETR_ERR_FORMAT;
    } else {
      cfg = ci.cfg;
      char why[512];
      if (model_config_apply_sets(&cfg, sets, n_sets, err, err_cap)) {
        st = DETR_ERR_CONFIG;
      } else if (detr_config_validate(&cfg, why,
                                      sizeof why)) {  // the message names the file (found by fuzz_checkpoint)
        snprintf(err, err_cap, "%s: model_config%s: %s", checkpoint, n_sets ? " with the overrides" : "", why);
        st = DETR_ERR_CONFIG;
      } else if (check_config_tensors(f, &cfg, n_sets > 0, err, err_cap)) st = DETR_ERR_MISMATCH;
    }
  } else {
    // The config first: a bad one is reported before the (possibly large) weights are read.
    if (model_config_load(config ? config : "detr-r50", sets, n_sets, &cfg, err, err_cap)) return DETR_ERR_CONFIG;
    if ((st = open_safetensors(weights, &f, err, err_cap))) return st;
  }
  if (!st && weights && checkpoint_is(f)) {  // its optimizer tensors would fail the load: say what the file is
    snprintf(err, err_cap, "%s is a detr-c checkpoint, not weights: load it with --checkpoint / detr_open_checkpoint",
             weights);
    st = DETR_ERR_MISMATCH;
  }
  // Weights from transformers resize as its image processor does, the sizes its users compare with.
  if (!st && weights && hf_format(f) != HF_NONE && !detr_config_sets_name(sets, n_sets, "resize"))
    cfg.resize_transformers = true;
  if (!st) {
    DetrModel *m = detr_model_create(&cfg, dev);
    // A load sets every tensor but the optional ones (ENACT's W_prob) that the file lacks: those
    // keep the initialisation, which is drawn only then (millions of draws for a ResNet).
    bool init = false;
    for (int i = 0; i < m->params.count && !init; i++)
      init = m->params.items[i].optional && !st_find(f, m->params.items[i].name);
    if (init) detr_model_init(m, 0);
    const char *ignore[] = {"optim.", NULL};  // a checkpoint's AdamW moments
    if (params_load(&m->params, f, checkpoint ? ignore : NULL, err, err_cap)) {
      if (weights) weights_mismatch_hint(&m->params, f, false, err, err_cap);
      detr_model_free(m);
      st = DETR_ERR_MISMATCH;
    } else {
      *out = m;
    }
  }
  st_close(f);
  if (!st && info) *info = ci;
  else checkpoint_info_free(&ci);
  return st;
}
