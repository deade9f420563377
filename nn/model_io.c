#include "nn/model_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool ignored(const char *name, const char *const *prefixes) {
  for (int i = 0; prefixes && prefixes[i]; i++)
    if (!strncmp(name, prefixes[i], strlen(prefixes[i]))) return true;
  return false;
}

// Appends one problem to err (at most `shown` are listed; the rest are counted).
static void report(char *err, size_t err_cap, int *problems, const char *fmt, const char *name, const char *detail) {
  const int shown = 8;
  size_t n = strlen(err);
  if (*problems < shown && n < err_cap) snprintf(err + n, err_cap - n, fmt, name, detail);
  (*problems)++;
}

static bool listed(const char *name, const char *const *names) {
  for (int i = 0; names && names[i]; i++)
    if (!strcmp(name, names[i])) return true;
  return false;
}

// Why a tensor of shape want does not fit entry e ("" when it does).
static void misfit(Shape want, const StEntry *e, char *why, size_t cap) {
  char s1[64], s2[64];
  Shape s = {.ndim = e->ndim};
  bool fits = e->ndim <= DETR_MAX_DIMS;
  for (int d = 0; fits && d < e->ndim; d++) s.d[d] = e->shape[d];
  why[0] = 0;
  if (e->dtype != ST_F32) snprintf(why, cap, " is %s, expected F32", st_dtype_name(e->dtype));
  else if (!fits || !shape_equal(s, want))
    snprintf(why, cap, " is %s in the file, the model has %s", fits ? shape_str(s, s1, sizeof s1) : "(rank > 6)",
             shape_str(want, s2, sizeof s2));
}

// Appends "\n  WHAT: NAME DETAIL" to the not-loaded list when it fits whole (a name is never cut):
// false when it did not (the caller counts it among the rest).
static bool list_not_loaded(const ParamsLoad *opt, const char *what, const char *name, const char *detail) {
  size_t n = strlen(opt->not_loaded), need = strlen(what) + strlen(name) + strlen(detail) + 6;
  if (n + need + 32 >= opt->not_loaded_cap) return false;  // room kept for "... and N more"
  snprintf(opt->not_loaded + n, opt->not_loaded_cap - n, "\n  %s: %s%s", what, name, detail);
  return true;
}

// Where a model tensor is in the file, by the file's naming (nn/hf_names.h): one entry, or the
// q, k, v entries of a packed in_proj, stacked along dim 0; n 0 when the naming has no place for it.
typedef struct {
  int n;
  char name[HF_MAX_PARTS][HF_NAME_MAX];
  const StEntry *e[HF_MAX_PARTS];  // NULL: absent
} Located;

static void locate(const StFile *f, HfFormat fmt, const char *name, Located *at) {
  at->n = hf_names(fmt, name, at->name);
  for (int k = 0; k < at->n; k++) at->e[k] = st_find(f, at->name[k]);
}

// The shape each of the n parts of a tensor of shape s has in the file: dim 0 split n ways.
static Shape part_shape(Shape s, int n) {
  if (n > 1 && s.ndim > 0) s.d[0] /= n;
  return s;
}

// Why the file does not hold parameter p where `at` says (the part it names into *part; "" when
// it does), and the kind of problem ("missing", "wrong dtype", "wrong shape") or NULL.
static const char *located_misfit(const Param *p, const Located *at, HfFormat fmt, int *part, char *why, size_t cap) {
  *part = 0;
  why[0] = 0;
  if (at->n == 0) {
    snprintf(why, cap, " (transformers' model has no such tensor)");
    return "missing";
  }
  for (int k = 0; k < at->n; k++) {
    *part = k;
    if (!at->e[k]) {
      if (fmt != HF_NONE) snprintf(why, cap, " (%s)", p->name);
      return "missing";
    }
    misfit(part_shape(p->tensor->shape, at->n), at->e[k], why, cap);
    if (why[0]) return at->e[k]->dtype != ST_F32 ? "wrong dtype" : "wrong shape";
  }
  return NULL;
}

// Reads parameter p from the file where `at` says (each part into its rows of the tensor).
static int located_read(const StFile *f, const Located *at, Tensor *t, char *err, size_t err_cap) {
  if (at->n == 1) return st_read_f32_into(f, at->name[0], t, err, err_cap);
  Shape ps = part_shape(t->shape, at->n);
  int rc = 0;
  for (int k = 0; k < at->n && !rc; k++) {
    Tensor *rows = tensor_view_range(t, k * shape_numel(ps), ps);
    rc = st_read_f32_into(f, at->name[k], rows, err, err_cap);
    tensor_release(rows);
  }
  return rc;
}

// used[i]: file entry i holds (part of) one of the model's tensors.
static bool *entries_used(const ParamStore *ps, const StFile *f, HfFormat fmt) {
  bool *used = detr_calloc((size_t)st_count(f) + 1, sizeof(bool), "params_load used entries");
  Located at;
  for (int i = 0; i < ps->count; i++) {
    locate(f, fmt, ps->items[i].name, &at);
    for (int k = 0; k < at.n; k++)
      if (at.e[k]) used[at.e[k] - st_entry(f, 0)] = true;
  }
  return used;
}

int params_load_with(ParamStore *ps, const StFile *f, const ParamsLoad *opt, char *err, size_t err_cap) {
  err[0] = 0;
  if (opt->not_loaded) opt->not_loaded[0] = 0;
  int problems = 0, skipped = 0, unlisted = 0;
  char detail[HF_NAME_MAX + 64];
  HfFormat fmt = hf_format(f);
  Located at;
  bool *load = detr_calloc((size_t)ps->count, sizeof(bool), "params_load flags");  // [count]: read from the file
  for (int i = 0; i < ps->count; i++) {
    const Param *p = &ps->items[i];
    if (listed(p->name, opt->keep_init)) continue;
    locate(f, fmt, p->name, &at);
    int part;
    const char *what = located_misfit(p, &at, fmt, &part, detail, sizeof detail);
    if (what && !strcmp(what, "missing") && p->optional) continue;  // keeps its initial value
    const char *name = at.n ? at.name[part] : p->name;
    if (!what) {
      load[i] = true;
    } else if (opt->partial) {  // keeps its initial value; said
      if (opt->not_loaded && (skipped >= 64 || !list_not_loaded(opt, what, name, detail))) unlisted++;
      skipped++;
    } else {
      char fmt_line[64];
      snprintf(fmt_line, sizeof fmt_line, "\n  %s: %%s%%s", what);
      report(err, err_cap, &problems, fmt_line, name, detail);
    }
  }
  bool *used = entries_used(ps, f, fmt);
  for (int i = 0; i < st_count(f); i++) {
    const StEntry *e = st_entry(f, i);
    if (used[i] || ignored(e->name, opt->ignore_prefixes) || listed(e->name, opt->keep_init)) continue;
    if (!opt->partial) {
      report(err, err_cap, &problems, "\n  unexpected: %s%s", e->name, "");
    } else if (opt->not_loaded) {
      if (skipped >= 64 || !list_not_loaded(opt, "unused", e->name, "")) unlisted++;
      skipped++;
    }
  }
  free(used);
  if (opt->not_loaded && unlisted) {
    size_t n = strlen(opt->not_loaded);
    snprintf(opt->not_loaded + n, opt->not_loaded_cap - n, "\n  ... and %d more", unlisted);
  }
  if (problems) {
    char head[512];
    snprintf(head, sizeof head, "%s: %d tensor%s do not fit the model%s%s:", st_path(f), problems,
             problems > 1 ? "s" : "", fmt != HF_NONE ? ", read as " : "", fmt != HF_NONE ? hf_format_name(fmt) : "");
    size_t hn = strlen(head), bn = strlen(err);
    if (hn + bn + 32 < err_cap) {
      memmove(err + hn, err, bn + 1);
      memcpy(err, head, hn);
      if (problems > 8) snprintf(err + hn + bn, err_cap - hn - bn, "\n  ... and %d more", problems - 8);
    }
    free(load);
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < ps->count && !rc; i++)
    if (load[i]) {
      DETR_CHECK(!ps->items[i].tensor->bf16,
                 "params_load: %s is kept in bf16 for inference (tensor_keep_bf16): load "
                 "the weights before detr_model_prepare_inference",
                 ps->items[i].name);
      locate(f, fmt, ps->items[i].name, &at);
      rc = located_read(f, &at, ps->items[i].tensor, err, err_cap);
    }
  free(load);
  return rc;
}

ParamsFit params_fit(const ParamStore *ps, const StFile *f) {
  ParamsFit w = {0};
  char why[HF_NAME_MAX + 64];
  HfFormat fmt = hf_format(f);
  Located at;
  for (int i = 0; i < ps->count; i++) {
    const Param *p = &ps->items[i];
    locate(f, fmt, p->name, &at);
    int part;
    const char *what = located_misfit(p, &at, fmt, &part, why, sizeof why);
    if (!what) w.fit++;
    else if (!strcmp(what, "missing")) w.missing += !p->optional;
    else w.other++;
  }
  const char *const optim[] = {"optim.", NULL};
  bool *used = entries_used(ps, f, fmt);
  for (int i = 0; i < st_count(f); i++) w.unused += !used[i] && !ignored(st_entry(f, i)->name, optim);
  free(used);
  return w;
}

const StEntry *params_file_entry(const StFile *f, const char *name) {
  Located at;
  locate(f, hf_format(f), name, &at);
  return at.n == 1 ? at.e[0] : NULL;
}

int params_load(ParamStore *ps, const StFile *f, const char *const *ignore_prefixes, char *err, size_t err_cap) {
  return params_load_with(ps, f, &(ParamsLoad){.ignore_prefixes = ignore_prefixes}, err, err_cap);
}

int params_load_file(ParamStore *ps, const char *path, char *err, size_t err_cap) {
  StFile *f = st_open(path, err, err_cap);
  if (!f) return -1;
  int rc = params_load(ps, f, NULL, err, err_cap);
  st_close(f);
  return rc;
}

// The file's name of the model's tensor `name` (which starts with prefix): the same, or with the
// prefix replaced by file_prefix.
static const char *file_name(const char *name, const char *prefix, const char *file_prefix, char *buf, size_t cap) {
  if (!file_prefix) return name;
  snprintf(buf, cap, "%s%s", file_prefix, name + strlen(prefix));
  return buf;
}

int params_load_file_prefix_as(ParamStore *ps, const char *path, const char *prefix, const char *file_prefix, char *err,
                               size_t err_cap) {
  StFile *f = st_open(path, err, err_cap);
  if (!f) return -1;
  size_t n = strlen(prefix);
  int matched = 0, rc = 0;
  char buf[224];
  for (int i = 0; i < ps->count && !rc; i++) {  // every tensor is checked before any is read
    const Param *p = &ps->items[i];
    if (strncmp(p->name, prefix, n)) continue;
    matched++;
    const char *fname = file_name(p->name, prefix, file_prefix, buf, sizeof buf);
    const StEntry *e = st_find(f, fname);
    bool fits = e && e->dtype == ST_F32 && e->ndim == p->tensor->shape.ndim;
    for (int d = 0; fits && d < e->ndim; d++) fits = e->shape[d] == p->tensor->shape.d[d];
    if (!fits) {
      st_read_f32_into(f, fname, p->tensor, err, err_cap);  // fails (it does not fit), wording the problem
      rc = -1;
    }
  }
  if (!rc && matched == 0) {
    snprintf(err, err_cap, "%s: the model has no tensor named %s*", path, prefix);
    rc = -1;
  }
  for (int i = 0; i < ps->count && !rc; i++) {
    const Param *p = &ps->items[i];
    if (!strncmp(p->name, prefix, n))
      rc = st_read_f32_into(f, file_name(p->name, prefix, file_prefix, buf, sizeof buf), p->tensor, err, err_cap);
  }
  st_close(f);
  return rc;
}

int params_load_file_prefix(ParamStore *ps, const char *path, const char *prefix, char *err, size_t err_cap) {
  return params_load_file_prefix_as(ps, path, prefix, NULL, err, err_cap);
}

void params_save(const ParamStore *ps, StWriter *w, const char *prefix) {
  char name[160];
  for (int i = 0; i < ps->count; i++) {
    snprintf(name, sizeof name, "%s%s", prefix, ps->items[i].name);
    st_writer_add_tensor(w, name, ps->items[i].tensor);
  }
}

int params_save_hf(const ParamStore *ps, StWriter *w, HfFormat fmt, char *err, size_t err_cap) {
  char names[HF_MAX_PARTS][HF_NAME_MAX];
  for (int i = 0; i < ps->count; i++) {  // every name first: nothing is added for a model that cannot be written
    if (!hf_names(fmt, ps->items[i].name, names)) {
      snprintf(err, err_cap, "%s: transformers' model has no such tensor", ps->items[i].name);
      return -1;
    }
  }
  for (int i = 0; i < ps->count; i++) {
    Tensor *t = ps->items[i].tensor;
    int n = hf_names(fmt, ps->items[i].name, names);
    Shape part = part_shape(t->shape, n);
    for (int k = 0; k < n; k++) {
      Tensor *rows = n == 1 ? tensor_retain(t) : tensor_view_range(t, k * shape_numel(part), part);
      st_writer_add_tensor(w, names[k], rows);
      tensor_release(rows);
    }
  }
  return 0;
}
