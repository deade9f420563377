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

// Why parameter p does not fit entry e ("" when it does).
static void misfit(const Param *p, const StEntry *e, char *why, size_t cap) {
  char s1[64], s2[64];
  Shape s = {.ndim = e->ndim};
  bool fits = e->ndim <= DETR_MAX_DIMS;
  for (int d = 0; fits && d < e->ndim; d++) s.d[d] = e->shape[d];
  why[0] = 0;
  if (e->dtype != ST_F32) snprintf(why, cap, " is %s, expected F32", st_dtype_name(e->dtype));
  else if (!fits || !shape_equal(s, p->tensor->shape))
    snprintf(why, cap, " is %s in the file, the model has %s", fits ? shape_str(s, s1, sizeof s1) : "(rank > 6)",
             shape_str(p->tensor->shape, s2, sizeof s2));
}

// Appends "\n  WHAT: NAME DETAIL" to the not-loaded list when it fits whole (a name is never cut):
// false when it did not (the caller counts it among the rest).
static bool list_not_loaded(const ParamsLoad *opt, const char *what, const char *name, const char *detail) {
  size_t n = strlen(opt->not_loaded), need = strlen(what) + strlen(name) + strlen(detail) + 6;
  if (n + need + 32 >= opt->not_loaded_cap) return false;  // room kept for "... and N more"
  snprintf(opt->not_loaded + n, opt->not_loaded_cap - n, "\n  %s: %s%s", what, name, detail);
  return true;
}

int params_load_with(ParamStore *ps, const StFile *f, const ParamsLoad *opt, char *err, size_t err_cap) {
  err[0] = 0;
  if (opt->not_loaded) opt->not_loaded[0] = 0;
  int problems = 0, skipped = 0, unlisted = 0;
  char detail[160];
  bool *load = detr_calloc((size_t)ps->count, sizeof(bool), "params_load flags");  // [count]: read from the file
  for (int i = 0; i < ps->count; i++) {
    const Param *p = &ps->items[i];
    if (listed(p->name, opt->keep_init)) continue;
    const StEntry *e = st_find(f, p->name);
    const char *what = NULL;
    if (!e) {
      if (p->optional) continue;  // keeps its initial value
      what = "missing", detail[0] = 0;
    } else {
      misfit(p, e, detail, sizeof detail);
      if (detail[0]) what = e->dtype != ST_F32 ? "wrong dtype" : "wrong shape";
    }
    if (!what) {
      load[i] = true;
    } else if (opt->partial) {  // keeps its initial value; said
      if (opt->not_loaded && (skipped >= 64 || !list_not_loaded(opt, what, p->name, detail))) unlisted++;
      skipped++;
    } else {
      char fmt[64];
      snprintf(fmt, sizeof fmt, "\n  %s: %%s%%s", what);
      report(err, err_cap, &problems, fmt, p->name, detail);
    }
  }
  for (int i = 0; i < st_count(f); i++) {
    const StEntry *e = st_entry(f, i);
    if (params_find(ps, e->name) || ignored(e->name, opt->ignore_prefixes) || listed(e->name, opt->keep_init)) continue;
    if (!opt->partial) {
      report(err, err_cap, &problems, "\n  unexpected: %s%s", e->name, "");
    } else if (opt->not_loaded) {
      if (skipped >= 64 || !list_not_loaded(opt, "unused", e->name, "")) unlisted++;
      skipped++;
    }
  }
  if (opt->not_loaded && unlisted) {
    size_t n = strlen(opt->not_loaded);
    snprintf(opt->not_loaded + n, opt->not_loaded_cap - n, "\n  ... and %d more", unlisted);
  }
  if (problems) {
    char head[512];
    snprintf(head, sizeof head, "%s: %d tensor%s do not fit the model:", st_path(f), problems, problems > 1 ? "s" : "");
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
      rc = st_read_f32_into(f, ps->items[i].name, ps->items[i].tensor, err, err_cap);
    }
  free(load);
  return rc;
}

ParamsFit params_fit(const ParamStore *ps, const StFile *f) {
  ParamsFit w = {0};
  char why[160];
  for (int i = 0; i < ps->count; i++) {
    const Param *p = &ps->items[i];
    const StEntry *e = st_find(f, p->name);
    if (!e) {
      w.missing += !p->optional;
      continue;
    }
    misfit(p, e, why, sizeof why);
    if (why[0]) w.other++;
    else w.fit++;
  }
  const char *const optim[] = {"optim.", NULL};
  for (int i = 0; i < st_count(f); i++) {
    const char *name = st_entry(f, i)->name;
    if (!ignored(name, optim) && !params_find(ps, name)) w.unused++;
  }
  return w;
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
