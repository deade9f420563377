#define _POSIX_C_SOURCE 200809L  // open/pread/fsync/getpid under -std=c11
#include "tensor/safetensors.h"
#include "core/json_text.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yajl/yajl_parse.h>

// The format is little-endian and we hand out pointers into the file image.
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

// --- dtypes ---

static const struct {
  const char *name;
  size_t size;
} dtypes[ST_DTYPE_COUNT] = {
    [ST_F32] = {"F32", 4}, [ST_F64] = {"F64", 8},         [ST_I64] = {"I64", 8},         [ST_I32] = {"I32", 4},
    [ST_U8] = {"U8", 1},   [ST_BOOL] = {"BOOL", 1},       [ST_F16] = {"F16", 2},         [ST_BF16] = {"BF16", 2},
    [ST_I8] = {"I8", 1},   [ST_I16] = {"I16", 2},         [ST_U16] = {"U16", 2},         [ST_U32] = {"U32", 4},
    [ST_U64] = {"U64", 8}, [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

static void check_dtype(StDtype dt) {
  DETR_CHECK((int)dt >= 0 && dt < ST_DTYPE_COUNT, "safetensors: unknown dtype %d", (int)dt);
}
size_t st_dtype_size(StDtype dt) {
  check_dtype(dt);
  return dtypes[dt].size;
}
const char *st_dtype_name(StDtype dt) {
  check_dtype(dt);
  return dtypes[dt].name;
}
bool st_dtype_supported(StDtype dt) {
  check_dtype(dt);
  return dt <= ST_BOOL;
}

// --- small helpers ---

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void
set_err(char *err, size_t err_cap, const char *fmt, ...) {
  if (!err || err_cap == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, err_cap, fmt, ap);
  va_end(ap);
}

static char *xstrndup(const unsigned char *s, size_t n) {
  char *d = detr_realloc(NULL, n + 1, "a safetensors buffer");
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

// a * b into *out, false on uint64 overflow.
static bool mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
  if (a && b > UINT64_MAX / a) return false;
  *out = a * b;
  return true;
}

// Returns numel, or -1 when the shape's element count or byte size overflows.
static int64_t checked_numel(int ndim, const int64_t *shape, size_t esize, size_t *nbytes) {
  uint64_t n = 1, b;
  for (int i = 0; i < ndim; i++)
    if (!mul_u64(n, (uint64_t)shape[i], &n)) return -1;
  if (n > (uint64_t)INT64_MAX || !mul_u64(n, esize, &b) || b > (uint64_t)SIZE_MAX) return -1;
  *nbytes = (size_t)b;
  return (int64_t)n;
}

// Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF): what JSON readers accept,
// the reference's serde_json among them (YAJL's own check lets overlong forms through).
static bool utf8_valid_n(const unsigned char *s, size_t len) {
  const unsigned char *end = s + len;
  while (s < end) {
    unsigned c = *s, n;
    uint32_t cp;
    if (c < 0x80) {
      s++;
      continue;
    }
    if (c >= 0xC2 && c <= 0xDF) n = 1, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) n = 2, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) n = 3, cp = c & 0x07;
    else return false;
    if ((size_t)(end - s) <= n) return false;
    for (unsigned i = 1; i <= n; i++) {
      if ((s[i] & 0xC0) != 0x80) return false;
      cp = cp << 6 | (s[i] & 0x3F);
    }
    if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
      return false;
    s += n + 1;
  }
  return true;
}
static bool utf8_valid(const char *s) { return utf8_valid_n((const unsigned char *)s, strlen(s)); }

static const char *dims_str(int ndim, const int64_t *d, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)d[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
  return buf;
}

// =============================================================================================
// Reader
// =============================================================================================

typedef struct {
  char *key, *value;
} StMeta;

struct StFile {
  char *path;
  unsigned char *mem;        // allocation holding the file image
  const unsigned char *buf;  // the data buffer inside it (64-byte aligned)
  uint64_t buf_len;
  StEntry *entries;  // header order
  uint64_t *ends;    // each entry's end offset, for validation
  int n, cap;
  const StEntry **by_name;  // sorted by name for st_find
  StMeta *meta;             // header order
  int nmeta, cap_meta;
  const StMeta **meta_by_key;  // sorted by key
};

void st_close(StFile *f) {
  if (!f) return;
  for (int i = 0; i < f->n; i++) free((char *)f->entries[i].name);
  for (int i = 0; i < f->nmeta; i++) {
    free(f->meta[i].key);
    free(f->meta[i].value);
  }
  free(f->entries);
  free(f->ends);
  free(f->by_name);
  free(f->meta);
  free(f->meta_by_key);
  free(f->mem);
  free(f->path);
  free(f);
}

const char *st_path(const StFile *f) { return f->path; }
int st_count(const StFile *f) { return f->n; }
const StEntry *st_entry(const StFile *f, int i) {
  DETR_CHECK(i >= 0 && i < f->n, "st_entry: index %d out of range [0, %d) in %s", i, f->n, f->path);
  return &f->entries[i];
}
const void *st_data(const StFile *f, const StEntry *e) { return f->buf + e->offset; }
const void *st_data_buffer(const StFile *f, size_t *nbytes) {
  if (nbytes) *nbytes = (size_t)f->buf_len;
  return f->buf;
}
int st_metadata_count(const StFile *f) { return f->nmeta; }
const char *st_metadata_key(const StFile *f, int i) {
  DETR_CHECK(i >= 0 && i < f->nmeta, "st_metadata_key: index %d out of range [0, %d) in %s", i, f->nmeta, f->path);
  return f->meta[i].key;
}
const char *st_metadata_value(const StFile *f, int i) {
  DETR_CHECK(i >= 0 && i < f->nmeta, "st_metadata_value: index %d out of range [0, %d) in %s", i, f->nmeta, f->path);
  return f->meta[i].value;
}

static int cmp_entry_name(const void *a, const void *b) {
  return strcmp((*(const StEntry *const *)a)->name, (*(const StEntry *const *)b)->name);
}
static int cmp_name_entry(const void *key, const void *e) {
  return strcmp((const char *)key, (*(const StEntry *const *)e)->name);
}
static int cmp_meta_key(const void *a, const void *b) {
  return strcmp((*(const StMeta *const *)a)->key, (*(const StMeta *const *)b)->key);
}
static int cmp_key_meta(const void *key, const void *m) {
  return strcmp((const char *)key, (*(const StMeta *const *)m)->key);
}

const StEntry *st_find(const StFile *f, const char *name) {
  if (f->n == 0) return NULL;
  const StEntry **e = bsearch(name, f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name_entry);
  return e ? *e : NULL;
}

const char *st_metadata(const StFile *f, const char *key) {
  if (f->nmeta == 0) return NULL;
  const StMeta **m = bsearch(key, f->meta_by_key, (size_t)f->nmeta, sizeof *f->meta_by_key, cmp_key_meta);
  return m ? (*m)->value : NULL;
}

// --- header parsing: YAJL's callback API, so the parse is strict (no comments, exact integers,
// duplicate keys caught) and errors can say where they are ---

enum { FLD_DTYPE = 1, FLD_SHAPE = 2, FLD_OFFSETS = 4, FLD_IGNORED = 8 };
enum { V_NULL, V_BOOL, V_NUMBER, V_STRING, V_MAP, V_ARRAY };

typedef struct {
  StFile *f;
  char msg[512];     // what is wrong, when a callback cancels the parse
  int depth;         // containers open
  int ignore_depth;  // > 0 inside the value of an unknown entry field, which is skipped
  bool in_meta;      // the current top-level value is __metadata__
  bool seen_meta;
  int field;      // FLD_* of the current entry field
  unsigned seen;  // FLD_* bits seen in the current entry
  int nvals;      // integers read into the current array
  uint64_t offsets[2];
} Parser;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int
parse_fail(Parser *p, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->msg, sizeof p->msg, fmt, ap);
  va_end(ap);
  return 0;  // cancels the parse
}

static StEntry *cur_entry(Parser *p) { return &p->f->entries[p->f->n - 1]; }
static const char *field_name(int field) {
  return field == FLD_DTYPE ? "dtype" : field == FLD_SHAPE ? "shape" : "data_offsets";
}

// A value of __metadata__ (depth 2): a string without NUL characters, valid UTF-8.
static int on_metadata_value(Parser *p, int kind, const unsigned char *s, size_t len) {
  StMeta *m = &p->f->meta[p->f->nmeta - 1];
  if (kind != V_STRING) return parse_fail(p, "__metadata__ value of '%s' is not a string", m->key);
  if (memchr(s, 0, len)) return parse_fail(p, "__metadata__ value of '%s' contains a NUL character", m->key);
  if (!utf8_valid_n(s, len)) return parse_fail(p, "__metadata__ value of '%s' is not valid UTF-8", m->key);
  m->value = xstrndup(s, len);
  return 1;
}

// An element of the current entry's shape or data_offsets (depth 3): a non-negative integer.
static int on_array_element(Parser *p, int kind, const unsigned char *s, size_t len) {
  const char *what = field_name(p->field);
  if (kind != V_NUMBER)
    return parse_fail(p, "tensor '%s': %s holds a value that is not an integer", cur_entry(p)->name, what);
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9')
      return parse_fail(p, "tensor '%s': %s holds %.*s, not a non-negative integer", cur_entry(p)->name, what,
                        (int)(len > 32 ? 32 : len), (const char *)s);
    unsigned digit = (unsigned)(s[i] - '0');
    if (v > (UINT64_MAX - digit) / 10)
      return parse_fail(p, "tensor '%s': %s holds %.*s, which is too large", cur_entry(p)->name, what,
                        (int)(len > 32 ? 32 : len), (const char *)s);
    v = v * 10 + digit;
  }
  if (p->field == FLD_SHAPE) {
    if (p->nvals == ST_MAX_DIMS)
      return parse_fail(p, "tensor '%s': shape has more than %d dimensions", cur_entry(p)->name, ST_MAX_DIMS);
    if (v > (uint64_t)INT64_MAX)
      return parse_fail(p, "tensor '%s': shape holds %llu, which is too large", cur_entry(p)->name,
                        (unsigned long long)v);
    cur_entry(p)->shape[p->nvals] = (int64_t)v;
  } else {
    if (p->nvals == 2) return parse_fail(p, "tensor '%s': data_offsets has more than 2 values", cur_entry(p)->name);
    p->offsets[p->nvals] = v;
  }
  p->nvals++;
  return 1;
}

static int on_value(Parser *p, int kind, const unsigned char *s, size_t len) {
  bool container = kind == V_MAP || kind == V_ARRAY;
  if (container && p->depth >= DETR_MAX_JSON_DEPTH)
    return parse_fail(p, "JSON nested deeper than the limit of %d levels", DETR_MAX_JSON_DEPTH);
  if (p->ignore_depth) {
    if (container) p->depth++;
    return 1;
  }
  switch (p->depth) {
    case 0:
      if (kind != V_MAP) return parse_fail(p, "the header is not a JSON object");
      break;
    case 1:
      if (kind != V_MAP)
        return p->in_meta ? parse_fail(p, "__metadata__ is not an object")
                          : parse_fail(p, "tensor '%s' is not an object", cur_entry(p)->name);
      break;
    case 2:
      if (p->in_meta) return on_metadata_value(p, kind, s, len);
      if (p->field == FLD_IGNORED) {  // an unknown field: tolerated, as the reference does
        if (container) p->ignore_depth = ++p->depth;
        return 1;
      }
      if (p->field == FLD_DTYPE) {
        if (kind != V_STRING) return parse_fail(p, "tensor '%s': dtype is not a string", cur_entry(p)->name);
        for (int d = 0; d < ST_DTYPE_COUNT; d++)
          if (strlen(dtypes[d].name) == len && memcmp(dtypes[d].name, s, len) == 0) {
            cur_entry(p)->dtype = (StDtype)d;
            return 1;
          }
        return parse_fail(p, "tensor '%s': unknown dtype \"%.*s\"", cur_entry(p)->name, (int)(len > 32 ? 32 : len),
                          (const char *)s);
      }
      if (kind != V_ARRAY)
        return parse_fail(p, "tensor '%s': %s is not an array", cur_entry(p)->name, field_name(p->field));
      p->nvals = 0;
      break;
    case 3:  // an element of shape or data_offsets
      return on_array_element(p, kind, s, len);
  }
  if (container) p->depth++;
  return 1;
}

static int on_null(void *ctx) { return on_value(ctx, V_NULL, NULL, 0); }
static int on_bool(void *ctx, int b) { return on_value(ctx, V_BOOL, NULL, 0); }
static int on_number(void *ctx, const char *s, size_t len) {
  return on_value(ctx, V_NUMBER, (const unsigned char *)s, len);
}
static int on_string(void *ctx, const unsigned char *s, size_t len) { return on_value(ctx, V_STRING, s, len); }
static int on_start_map(void *ctx) { return on_value(ctx, V_MAP, NULL, 0); }
static int on_start_array(void *ctx) { return on_value(ctx, V_ARRAY, NULL, 0); }

static int on_key(void *ctx, const unsigned char *s, size_t len) {
  Parser *p = ctx;
  StFile *f = p->f;
  if (p->ignore_depth) return 1;
  if (p->depth == 1) {  // a tensor name or __metadata__
    if (len == 12 && memcmp(s, "__metadata__", 12) == 0) {
      if (p->seen_meta) return parse_fail(p, "__metadata__ appears twice");
      p->seen_meta = p->in_meta = true;
      return 1;
    }
    if (memchr(s, 0, len)) return parse_fail(p, "a tensor name contains a NUL character");
    if (len > ST_MAX_NAME_BYTES)
      return parse_fail(p, "tensor %d's name has %zu bytes, more than the limit of %d", f->n, len, ST_MAX_NAME_BYTES);
    if (f->n == ST_MAX_TENSORS) return parse_fail(p, "more than the limit of %d tensors", ST_MAX_TENSORS);
    if (!utf8_valid_n(s, len)) return parse_fail(p, "tensor %d's name is not valid UTF-8", p->f->n);
    p->in_meta = false;
    if (f->n == f->cap) {
      f->cap = f->cap ? 2 * f->cap : 64;
      f->entries = detr_realloc(f->entries, (size_t)f->cap * sizeof *f->entries, "a safetensors buffer");
      f->ends = detr_realloc(f->ends, (size_t)f->cap * sizeof *f->ends, "a safetensors buffer");
    }
    f->entries[f->n++] = (StEntry){.name = xstrndup(s, len)};
    p->seen = 0;
    return 1;
  }
  // depth 2: a metadata key or a field of a tensor entry
  if (p->in_meta) {
    if (memchr(s, 0, len)) return parse_fail(p, "a __metadata__ key contains a NUL character");
    if (len > ST_MAX_NAME_BYTES)
      return parse_fail(p, "__metadata__ key %d has %zu bytes, more than the limit of %d", f->nmeta, len,
                        ST_MAX_NAME_BYTES);
    if (f->nmeta == ST_MAX_TENSORS)
      return parse_fail(p, "more than the limit of %d __metadata__ entries", ST_MAX_TENSORS);
    if (!utf8_valid_n(s, len)) return parse_fail(p, "__metadata__ key %d is not valid UTF-8", f->nmeta);
    if (f->nmeta == f->cap_meta) {
      f->cap_meta = f->cap_meta ? 2 * f->cap_meta : 16;
      f->meta = detr_realloc(f->meta, (size_t)f->cap_meta * sizeof *f->meta, "a safetensors buffer");
    }
    f->meta[f->nmeta++] = (StMeta){.key = xstrndup(s, len)};
    return 1;
  }
  p->field = FLD_IGNORED;
  for (int fld = FLD_DTYPE; fld <= FLD_OFFSETS; fld <<= 1)
    if (strlen(field_name(fld)) == len && memcmp(field_name(fld), s, len) == 0) p->field = fld;
  if (p->field == FLD_IGNORED) return 1;
  if (p->seen & (unsigned)p->field)
    return parse_fail(p, "tensor '%s': \"%s\" appears twice", cur_entry(p)->name, field_name(p->field));
  p->seen |= (unsigned)p->field;
  return 1;
}

static int on_end_map(void *ctx) {
  Parser *p = ctx;
  if (p->ignore_depth) {
    if (--p->depth < p->ignore_depth) p->ignore_depth = 0;
    return 1;
  }
  if (p->depth == 2 && !p->in_meta) {  // the end of a tensor entry
    for (int fld = FLD_DTYPE; fld <= FLD_OFFSETS; fld <<= 1)
      if (!(p->seen & (unsigned)fld))
        return parse_fail(p, "tensor '%s' has no \"%s\"", cur_entry(p)->name, field_name(fld));
    cur_entry(p)->offset = p->offsets[0];
    p->f->ends[p->f->n - 1] = p->offsets[1];
  }
  p->depth--;
  return 1;
}

static int on_end_array(void *ctx) {
  Parser *p = ctx;
  if (p->ignore_depth) {
    if (--p->depth < p->ignore_depth) p->ignore_depth = 0;
    return 1;
  }
  // depth 3: the end of shape or data_offsets
  if (p->field == FLD_SHAPE) {
    cur_entry(p)->ndim = p->nvals;
  } else if (p->nvals != 2) {
    return parse_fail(p, "tensor '%s': data_offsets has %d value%s, expected 2", cur_entry(p)->name, p->nvals,
                      p->nvals == 1 ? "" : "s");
  }
  p->depth--;
  return 1;
}

static const yajl_callbacks parser_callbacks = {
    .yajl_null = on_null,
    .yajl_boolean = on_bool,
    .yajl_number = on_number,  // the raw text: exact integers, floats and negatives rejected
    .yajl_string = on_string,
    .yajl_start_map = on_start_map,
    .yajl_map_key = on_key,
    .yajl_end_map = on_end_map,
    .yajl_start_array = on_start_array,
    .yajl_end_array = on_end_array,
};

static bool parse_header(StFile *f, const unsigned char *json, size_t len, char *err, size_t err_cap) {
  Parser p = {.f = f};
  yajl_handle h = yajl_alloc(&parser_callbacks, NULL, &p);
  DETR_CHECK(h, "safetensors: out of host memory for the JSON parser");
  yajl_status st = yajl_parse(h, json, len);
  size_t at = yajl_get_bytes_consumed(h);
  if (st == yajl_status_ok) {
    st = yajl_complete_parse(h);
    at = len;
  }
  bool ok = st == yajl_status_ok;
  if (st == yajl_status_client_canceled) {
    set_err(err, err_cap, "%s: invalid header: %s", f->path, p.msg);
  } else if (st == yajl_status_error) {
    unsigned char *msg = yajl_get_error(h, 0, json, len);
    size_t n = strcspn((const char *)msg, "\n");  // yajl ends its message with a newline
    set_err(err, err_cap, "%s: malformed JSON in the header at byte %zu of %zu: %.*s", f->path, at, len, (int)n,
            (const char *)msg);
    yajl_free_error(h, msg);
  }
  yajl_free(h);
  return ok;
}

typedef struct {
  uint64_t begin, end;
  const StEntry *e;
} Span;

static int cmp_span(const void *a, const void *b) {
  const Span *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

// One entry's data_offsets [e->offset, end): in order, inside the data buffer, and as many bytes as
// its dtype and shape need; sets its numel and nbytes.
static bool validate_entry(const StFile *f, StEntry *e, uint64_t end, char *err, size_t err_cap) {
  char a[160];
  uint64_t begin = e->offset;
  if (end < begin) {
    set_err(err, err_cap, "%s: tensor '%s': data_offsets [%llu, %llu] are not in order", f->path, e->name,
            (unsigned long long)begin, (unsigned long long)end);
    return false;
  }
  if (end > f->buf_len) {
    set_err(err, err_cap,
            "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the %llu-byte data "
            "buffer (truncated file?)",
            f->path, e->name, (unsigned long long)begin, (unsigned long long)end, (unsigned long long)f->buf_len);
    return false;
  }
  size_t nbytes;
  e->numel = checked_numel(e->ndim, e->shape, dtypes[e->dtype].size, &nbytes);
  if (e->numel < 0) {
    set_err(err, err_cap, "%s: tensor '%s': shape %s is too large", f->path, e->name,
            dims_str(e->ndim, e->shape, a, sizeof a));
    return false;
  }
  if (nbytes != end - begin) {
    set_err(err, err_cap, "%s: tensor '%s': data_offsets [%llu, %llu] hold %llu bytes but %s %s needs %zu", f->path,
            e->name, (unsigned long long)begin, (unsigned long long)end, (unsigned long long)(end - begin),
            dtypes[e->dtype].name, dims_str(e->ndim, e->shape, a, sizeof a), nbytes);
    return false;
  }
  e->nbytes = nbytes;
  return true;
}

// The entries' byte ranges (spans, one per entry) tile the data buffer exactly: the reference
// rejects holes and overlaps. Walks the regions in offset order (sorts spans).
static bool validate_tiling(const StFile *f, Span *spans, char *err, size_t err_cap) {
  qsort(spans, (size_t)f->n, sizeof *spans, cmp_span);
  uint64_t at = 0;
  const char *prev = NULL;
  for (int i = 0; i < f->n; i++) {
    if (spans[i].begin < at) {
      set_err(err, err_cap, "%s: tensor '%s' (bytes %llu..%llu) overlaps tensor '%s' (ends at %llu)", f->path,
              spans[i].e->name, (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end, prev,
              (unsigned long long)at);
      return false;
    }
    if (spans[i].begin > at) {
      set_err(err, err_cap, "%s: bytes %llu..%llu of the data buffer belong to no tensor (before '%s')", f->path,
              (unsigned long long)at, (unsigned long long)spans[i].begin, spans[i].e->name);
      return false;
    }
    at = spans[i].end;
    prev = spans[i].e->name;
  }
  if (at != f->buf_len) {
    set_err(err, err_cap, "%s: the data buffer has %llu bytes but the tensors cover %llu (trailing bytes)", f->path,
            (unsigned long long)f->buf_len, (unsigned long long)at);
    return false;
  }
  return true;
}

// The indexes by tensor name and by metadata key (for st_find, st_metadata); false when a name or
// a key appears twice.
static bool index_names(StFile *f, char *err, size_t err_cap) {
  f->by_name = detr_realloc(NULL, (size_t)f->n * sizeof *f->by_name, "a safetensors buffer");
  for (int i = 0; i < f->n; i++) f->by_name[i] = &f->entries[i];
  qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_entry_name);
  for (int i = 1; i < f->n; i++)
    if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0) {
      set_err(err, err_cap, "%s: tensor name '%s' appears twice", f->path, f->by_name[i]->name);
      return false;
    }
  f->meta_by_key = detr_realloc(NULL, (size_t)f->nmeta * sizeof *f->meta_by_key, "a safetensors buffer");
  for (int i = 0; i < f->nmeta; i++) f->meta_by_key[i] = &f->meta[i];
  qsort(f->meta_by_key, (size_t)f->nmeta, sizeof *f->meta_by_key, cmp_meta_key);
  for (int i = 1; i < f->nmeta; i++)
    if (strcmp(f->meta_by_key[i - 1]->key, f->meta_by_key[i]->key) == 0) {
      set_err(err, err_cap, "%s: __metadata__ key '%s' appears twice", f->path, f->meta_by_key[i]->key);
      return false;
    }
  return true;
}

// Everything the JSON grammar cannot say: sizes agree with shapes, offsets lie in the buffer and
// tile it exactly, names and metadata keys are unique.
static bool validate(StFile *f, char *err, size_t err_cap) {
  Span *spans = detr_realloc(NULL, (size_t)f->n * sizeof *spans, "a safetensors buffer");
  bool ok = true;
  for (int i = 0; i < f->n && ok; i++) {
    StEntry *e = &f->entries[i];
    ok = validate_entry(f, e, f->ends[i], err, err_cap);
    spans[i] = (Span){e->offset, f->ends[i], e};
  }
  ok = ok && validate_tiling(f, spans, err, err_cap) && index_names(f, err, err_cap);
  free(spans);
  return ok;
}

// Reads the file into memory so that the data buffer (at 8 + N) lands 64-byte aligned.
static bool read_file(StFile *f, char *err, size_t err_cap) {
  int fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a named pipe: refused below, not waited on
  if (fd < 0) {
    set_err(err, err_cap, "%s: cannot open: %s", f->path, strerror(errno));
    return false;
  }
  bool ok = false;
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    set_err(err, err_cap, "%s: fstat failed: %s", f->path, strerror(errno));
    goto done;
  }
  if (!S_ISREG(sb.st_mode)) {
    set_err(err, err_cap, "%s: not a regular file", f->path);
    goto done;
  }
  uint64_t size = (uint64_t)sb.st_size;
  if (size < 8) {
    set_err(err, err_cap,
            "%s: %llu bytes is too short for a safetensors file (it starts with an "
            "8-byte header length)",
            f->path, (unsigned long long)size);
    goto done;
  }
  unsigned char len8[8];
  ssize_t got = pread(fd, len8, 8, 0);
  if (got != 8) {
    set_err(err, err_cap, "%s: reading the header length failed: %s", f->path,
            got < 0 ? strerror(errno) : "file shrank");
    goto done;
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
  if (n > ST_MAX_HEADER_BYTES) {
    set_err(err, err_cap, "%s: header length %llu exceeds the %d-byte limit (not a safetensors file?)", f->path,
            (unsigned long long)n, ST_MAX_HEADER_BYTES);
    goto done;
  }
  if (n > size - 8) {
    set_err(err, err_cap,
            "%s: header length %llu is larger than the %llu bytes after it (truncated "
            "or not a safetensors file)",
            f->path, (unsigned long long)n, (unsigned long long)(size - 8));
    goto done;
  }
  if (size > SIZE_MAX - 128) {
    set_err(err, err_cap, "%s: %llu bytes do not fit in memory", f->path, (unsigned long long)size);
    goto done;
  }
  f->mem = malloc((size_t)size + 64);
  if (!f->mem) {
    set_err(err, err_cap, "%s: out of host memory reading %llu bytes", f->path, (unsigned long long)size);
    goto done;
  }
  size_t pad = (64 - ((uintptr_t)f->mem + 8 + (uintptr_t)n) % 64) % 64;
  unsigned char *image = f->mem + pad;
  uint64_t done_bytes = 0;
  while (done_bytes < size) {  // read() moves at most ~2 GiB per call
    ssize_t r = pread(fd, image + done_bytes, (size_t)(size - done_bytes), (off_t)done_bytes);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      set_err(err, err_cap, "%s: read failed: %s", f->path, strerror(errno));
      goto done;
    }
    if (r == 0) {
      set_err(err, err_cap, "%s: file shrank while being read (%llu of %llu bytes)", f->path,
              (unsigned long long)done_bytes, (unsigned long long)size);
      goto done;
    }
    done_bytes += (uint64_t)r;
  }
  f->buf = image + 8 + n;
  f->buf_len = size - 8 - n;
  ok = parse_header(f, image + 8, (size_t)n, err, err_cap);
done:
  close(fd);
  return ok;
}

StFile *st_open(const char *path, char *err, size_t err_cap) {
  DETR_CHECK(path, "st_open: NULL path");
  StFile *f = detr_realloc(NULL, sizeof *f, "a safetensors buffer");
  *f = (StFile){.path = xstrndup((const unsigned char *)path, strlen(path))};
  if (!read_file(f, err, err_cap) || !validate(f, err, err_cap)) {
    st_close(f);
    return NULL;
  }
  return f;
}

int st_read_f32_into(const StFile *f, const char *name, Tensor *dst, char *err, size_t err_cap) {
  char want[160], have[160];
  const StEntry *e = st_find(f, name);
  if (!e) {
    set_err(err, err_cap, "%s: tensor '%s' not found (expected F32 %s)", f->path, name,
            shape_str(dst->shape, want, sizeof want));
    return -1;
  }
  if (e->dtype != ST_F32) {
    set_err(err, err_cap, "%s: tensor '%s' has dtype %s, expected F32%s", f->path, name, dtypes[e->dtype].name,
            st_dtype_supported(e->dtype) ? "" : " (unsupported dtype)");
    return -1;
  }
  bool same = e->ndim == dst->shape.ndim;
  for (int i = 0; same && i < e->ndim; i++) same = e->shape[i] == dst->shape.d[i];
  if (!same) {
    set_err(err, err_cap, "%s: tensor '%s' has shape %s, expected %s", f->path, name,
            dims_str(e->ndim, e->shape, have, sizeof have), shape_str(dst->shape, want, sizeof want));
    return -1;
  }
  if (e->nbytes == 0) return 0;
  // memcpy copes with any alignment of the bytes in the file.
  if (dst->device == DEVICE_CPU) {
    memcpy(dst->data, st_data(f, e), e->nbytes);
  } else {
    Tensor *tmp = tensor_new(DEVICE_CPU, dst->shape);
    memcpy(tmp->data, st_data(f, e), e->nbytes);
    tensor_copy_(dst, tmp);
    tensor_release(tmp);
  }
  return 0;
}

// =============================================================================================
// Writer
// =============================================================================================

typedef struct {
  char *name;
  StDtype dtype;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  void *data;
  size_t nbytes;
} WEntry;

struct StWriter {
  WEntry *e;
  int n, cap;
  StMeta *meta;
  int nmeta, cap_meta;
};

StWriter *st_writer_new(void) {
  StWriter *w = detr_realloc(NULL, sizeof *w, "a safetensors buffer");
  *w = (StWriter){0};
  return w;
}

void st_writer_free(StWriter *w) {
  if (!w) return;
  for (int i = 0; i < w->n; i++) {
    free(w->e[i].name);
    free(w->e[i].data);
  }
  for (int i = 0; i < w->nmeta; i++) {
    free(w->meta[i].key);
    free(w->meta[i].value);
  }
  free(w->e);
  free(w->meta);
  free(w);
}

// Takes ownership of data.
static void writer_add_owned(StWriter *w, const char *name, StDtype dtype, int ndim, const int64_t *shape, void *data,
                             size_t nbytes) {
  DETR_CHECK(name && utf8_valid(name), "st_writer_add: tensor name is missing or not UTF-8");
  DETR_CHECK(strcmp(name, "__metadata__") != 0, "st_writer_add: '__metadata__' is reserved");
  DETR_CHECK(strlen(name) <= ST_MAX_NAME_BYTES && w->n < ST_MAX_TENSORS,
             "st_writer_add: '%.64s...': name longer than %d bytes or more than %d tensors (readers refuse it)", name,
             ST_MAX_NAME_BYTES, ST_MAX_TENSORS);
  for (int i = 0; i < w->n; i++)
    DETR_CHECK(strcmp(w->e[i].name, name) != 0, "st_writer_add: duplicate tensor name '%s'", name);
  if (w->n == w->cap) {
    w->cap = w->cap ? 2 * w->cap : 64;
    w->e = detr_realloc(w->e, (size_t)w->cap * sizeof *w->e, "a safetensors buffer");
  }
  WEntry *e = &w->e[w->n++];
  *e = (WEntry){.name = xstrndup((const unsigned char *)name, strlen(name)),
                .dtype = dtype,
                .ndim = ndim,
                .data = data,
                .nbytes = nbytes};
  if (ndim) memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
}

static size_t writer_check(const char *name, StDtype dtype, int ndim, const int64_t *shape) {
  check_dtype(dtype);
  DETR_CHECK(st_dtype_supported(dtype), "st_writer_add: tensor '%s': unsupported dtype %s", name, dtypes[dtype].name);
  DETR_CHECK(ndim >= 0 && ndim <= ST_MAX_DIMS, "st_writer_add: tensor '%s': rank %d not in 0..%d", name, ndim,
             ST_MAX_DIMS);
  for (int i = 0; i < ndim; i++)
    DETR_CHECK(shape[i] >= 0, "st_writer_add: tensor '%s': negative dimension %lld", name, (long long)shape[i]);
  size_t nbytes;
  DETR_CHECK(checked_numel(ndim, shape, dtypes[dtype].size, &nbytes) >= 0,
             "st_writer_add: tensor '%s': shape too large", name);
  return nbytes;
}

void st_writer_add(StWriter *w, const char *name, StDtype dtype, int ndim, const int64_t *shape, const void *data) {
  size_t nbytes = writer_check(name ? name : "(null)", dtype, ndim, shape);
  DETR_CHECK(data || nbytes == 0, "st_writer_add: tensor '%s': NULL data", name);
  void *copy = detr_realloc(NULL, nbytes, "a safetensors buffer");
  if (nbytes) memcpy(copy, data, nbytes);
  writer_add_owned(w, name, dtype, ndim, shape, copy, nbytes);
}

void st_writer_add_tensor(StWriter *w, const char *name, const Tensor *t) {
  size_t nbytes = writer_check(name ? name : "(null)", ST_F32, t->shape.ndim, t->shape.d);
  float *copy = detr_realloc(NULL, nbytes, "a safetensors buffer");
  tensor_to_host(t, copy);
  writer_add_owned(w, name, ST_F32, t->shape.ndim, t->shape.d, copy, nbytes);
}

void st_writer_set_metadata(StWriter *w, const char *key, const char *value) {
  DETR_CHECK(key && utf8_valid(key), "st_writer_set_metadata: key is missing or not UTF-8");
  DETR_CHECK(value && utf8_valid(value),
             "st_writer_set_metadata: value of '%s' is missing or "
             "not UTF-8",
             key);
  DETR_CHECK(strlen(key) <= ST_MAX_NAME_BYTES, "st_writer_set_metadata: key longer than %d bytes", ST_MAX_NAME_BYTES);
  char *v = xstrndup((const unsigned char *)value, strlen(value));
  for (int i = 0; i < w->nmeta; i++)
    if (strcmp(w->meta[i].key, key) == 0) {
      free(w->meta[i].value);
      w->meta[i].value = v;
      return;
    }
  if (w->nmeta == w->cap_meta) {
    w->cap_meta = w->cap_meta ? 2 * w->cap_meta : 16;
    w->meta = detr_realloc(w->meta, (size_t)w->cap_meta * sizeof *w->meta, "a safetensors buffer");
  }
  w->meta[w->nmeta++] = (StMeta){xstrndup((const unsigned char *)key, strlen(key)), v};
}

// --- the header JSON ---

typedef struct {
  char *p;
  size_t n, cap;
} Buf;

static void buf_put(Buf *b, const char *s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    while (b->n + n + 1 > b->cap) b->cap = b->cap ? 2 * b->cap : 4096;
    b->p = detr_realloc(b->p, b->cap, "a safetensors buffer");
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
buf_printf(Buf *b, const char *fmt, ...) {
  char tmp[64];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  DETR_CHECK(n >= 0 && (size_t)n < sizeof tmp, "safetensors: header number too long");
  buf_put(b, tmp, (size_t)n);
}

static void buf_put_bytes(void *b, const char *bytes, size_t n) { buf_put(b, bytes, n); }

static void buf_json_string(Buf *b, const char *s) { json_quote(s, buf_put_bytes, b); }

// Data order: larger dtypes first (stable), so in a buffer that starts 8-aligned every tensor is
// aligned for its dtype without padding (the format allows no holes). The header keeps
// insertion order.
static int *data_order(const StWriter *w) {
  int *order = detr_realloc(NULL, (size_t)w->n * sizeof *order, "a safetensors buffer"), k = 0;
  for (size_t size = 8; size >= 1; size /= 2)
    for (int i = 0; i < w->n; i++)
      if (dtypes[w->e[i].dtype].size == size) order[k++] = i;
  DETR_CHECK(k == w->n, "safetensors: dtype size not a power of two up to 8");
  return order;
}

static void build_header(const StWriter *w, const int *order, Buf *b) {
  uint64_t *begin = detr_realloc(NULL, (size_t)w->n * sizeof *begin, "a safetensors buffer"), at = 0;
  for (int k = 0; k < w->n; k++) {
    begin[order[k]] = at;
    at += w->e[order[k]].nbytes;
  }
  buf_put(b, "{", 1);
  if (w->nmeta) {
    buf_put(b, "\"__metadata__\":{", 16);
    for (int i = 0; i < w->nmeta; i++) {
      if (i) buf_put(b, ",", 1);
      buf_json_string(b, w->meta[i].key);
      buf_put(b, ":", 1);
      buf_json_string(b, w->meta[i].value);
    }
    buf_put(b, "}", 1);
  }
  for (int i = 0; i < w->n; i++) {
    const WEntry *e = &w->e[i];
    if (i || w->nmeta) buf_put(b, ",", 1);
    buf_json_string(b, e->name);
    buf_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", dtypes[e->dtype].name);
    for (int d = 0; d < e->ndim; d++) buf_printf(b, d ? ",%lld" : "%lld", (long long)e->shape[d]);
    buf_printf(b, "],\"data_offsets\":[%llu,", (unsigned long long)begin[i]);
    buf_printf(b, "%llu]}", (unsigned long long)(begin[i] + e->nbytes));
  }
  buf_put(b, "}", 1);
  while (b->n % 8) buf_put(b, " ", 1);  // the data then starts 8-aligned in the file
  free(begin);
}

// fsync the directory holding path, so the rename itself survives a crash.
static int fsync_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? xstrndup((const unsigned char *)path, slash == path ? 1 : (size_t)(slash - path))
                    : xstrndup((const unsigned char *)".", 1);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = -1;
  if (fd >= 0) {
    rc = fsync(fd);
    if (rc != 0 && errno == EINVAL) rc = 0;  // a file system without directory fsync
    int e = errno;
    close(fd);
    errno = e;
  }
  free(dir);
  return rc;
}

int st_writer_save(const StWriter *w, const char *path, char *err, size_t err_cap) {
  DETR_CHECK(path, "st_writer_save: NULL path");
  int *order = data_order(w);
  Buf header = {0};
  build_header(w, order, &header);
  size_t tmp_cap = strlen(path) + 32;
  char *tmp = detr_realloc(NULL, tmp_cap, "a safetensors buffer");
  snprintf(tmp, tmp_cap, "%s.tmp.%ld", path, (long)getpid());

  int rc = -1;
  const char *failed = NULL;  // the call that failed, with errno set by it
  FILE *fp = fopen(tmp, "wb");
  if (!fp) {
    set_err(err, err_cap, "%s: fopen(%s) failed: %s", path, tmp, strerror(errno));
    goto out;
  }
  unsigned char len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)header.n >> (8 * i));
  if (fwrite(len8, 1, 8, fp) != 8 || fwrite(header.p, 1, header.n, fp) != header.n) failed = "fwrite";
  for (int k = 0; k < w->n && !failed; k++) {
    const WEntry *e = &w->e[order[k]];
    if (e->nbytes && fwrite(e->data, 1, e->nbytes, fp) != e->nbytes) failed = "fwrite";
  }
  if (!failed && fflush(fp) != 0) failed = "fflush";
  if (!failed && fsync(fileno(fp)) != 0) failed = "fsync";
  if (failed) {
    set_err(err, err_cap, "%s: %s(%s) failed: %s", path, failed, tmp, strerror(errno));
    fclose(fp);
    unlink(tmp);
    goto out;
  }
  if (fclose(fp) != 0) {  // a delayed write error (e.g. NFS) shows up here
    set_err(err, err_cap, "%s: fclose(%s) failed: %s", path, tmp, strerror(errno));
    unlink(tmp);
    goto out;
  }
  if (rename(tmp, path) != 0) {
    set_err(err, err_cap, "%s: rename(%s, %s) failed: %s", path, tmp, path, strerror(errno));
    unlink(tmp);
    goto out;
  }
  // The new file is in place; without this fsync the rename itself may not survive a crash.
  if (fsync_dir(path) != 0) {
    set_err(err, err_cap, "%s: written, but fsync of its directory failed: %s", path, strerror(errno));
    goto out;
  }
  rc = 0;
out:
  free(tmp);
  free(header.p);
  free(order);
  return rc;
}
