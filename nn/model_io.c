#include "nn/model_io.h"

#include <stdio.h>
#include <string.h>

static bool ignored(const char *name, const char *const *prefixes) {
  for (int i = 0; prefixes && prefixes[i]; i++)
    if (!strncmp(name, prefixes[i], strlen(prefixes[i]))) return true;
  return false;
}

// Appends one problem to err (at most `shown` are listed; the rest are counted).
static void report(char *err, size_t cap, int *problems, const char *fmt, const char *name, const char *detail) {
  const int shown = 8;
  size_t n = strlen(err);
  if (*problems < shown && n < cap) snprintf(err + n, cap - n, fmt, name, detail);
  (*problems)++;
}

int params_load(ParamStore *ps, const StFile *f, const char *const *ignore_prefixes, char *err, size_t err_cap) {
  err[0] = 0;
  int problems = 0;
  char detail[160], s1[64], s2[64];
  for (int i = 0; i < ps->count; i++) {
    const Param *p = &ps->items[i];
    const StEntry *e = st_find(f, p->name);
    if (!e) {
      if (!p->optional) report(err, err_cap, &problems, "\n  missing: %s%s", p->name, "");
      continue;
    }
    Shape s = {.ndim = e->ndim};
    bool fits = e->ndim <= DETR_MAX_DIMS;
    for (int d = 0; fits && d < e->ndim; d++) s.d[d] = e->shape[d];
    if (e->dtype != ST_F32) {
      snprintf(detail, sizeof detail, " is %s, expected F32", st_dtype_name(e->dtype));
      report(err, err_cap, &problems, "\n  wrong dtype: %s%s", p->name, detail);
    } else if (!fits || !shape_equal(s, p->tensor->shape)) {
      snprintf(detail, sizeof detail, " is %s in the file, the model has %s", fits ? shape_str(s, s1, sizeof s1) : "(rank > 6)",
               shape_str(p->tensor->shape, s2, sizeof s2));
      report(err, err_cap, &problems, "\n  wrong shape: %s%s", p->name, detail);
    }
  }
  for (int i = 0; i < st_count(f); i++) {
    const StEntry *e = st_entry(f, i);
    if (!params_find(ps, e->name) && !ignored(e->name, ignore_prefixes))
      report(err, err_cap, &problems, "\n  unexpected: %s%s", e->name, "");
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
    return -1;
  }
  for (int i = 0; i < ps->count; i++) {
    if (ps->items[i].optional && !st_find(f, ps->items[i].name)) continue;  // keeps its initial value
    if (st_read_f32_into(f, ps->items[i].name, ps->items[i].tensor, err, err_cap)) return -1;
  }
  return 0;
}

int params_load_file(ParamStore *ps, const char *path, char *err, size_t err_cap) {
  StFile *f = st_open(path, err, err_cap);
  if (!f) return -1;
  int rc = params_load(ps, f, NULL, err, err_cap);
  st_close(f);
  return rc;
}

int params_load_file_prefix(ParamStore *ps, const char *path, const char *prefix, char *err, size_t err_cap) {
  StFile *f = st_open(path, err, err_cap);
  if (!f) return -1;
  size_t n = strlen(prefix);
  int matched = 0, rc = 0;
  for (int i = 0; i < ps->count && !rc; i++) {  // every tensor is checked before any is read
    const Param *p = &ps->items[i];
    if (strncmp(p->name, prefix, n)) continue;
    matched++;
    const StEntry *e = st_find(f, p->name);
    bool fits = e && e->dtype == ST_F32 && e->ndim == p->tensor->shape.ndim;
    for (int d = 0; fits && d < e->ndim; d++) fits = e->shape[d] == p->tensor->shape.d[d];
    if (!fits) {
      st_read_f32_into(f, p->name, p->tensor, err, err_cap);  // fails (it does not fit), wording the problem
      rc = -1;
    }
  }
  if (!rc && matched == 0) {
    snprintf(err, err_cap, "%s: the model has no tensor named %s*", path, prefix);
    rc = -1;
  }
  for (int i = 0; i < ps->count && !rc; i++) {
    const Param *p = &ps->items[i];
    if (!strncmp(p->name, prefix, n)) rc = st_read_f32_into(f, p->name, p->tensor, err, err_cap);
  }
  st_close(f);
  return rc;
}

void params_save(const ParamStore *ps, StWriter *w, const char *prefix) {
  char name[160];
  for (int i = 0; i < ps->count; i++) {
    snprintf(name, sizeof name, "%s%s", prefix, ps->items[i].name);
    st_writer_add_tensor(w, name, ps->items[i].tensor);
  }
}
