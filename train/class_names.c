// Class names from a COCO instances file or a checkpoint's metadata (train/class_names.h), moved
// out of cmd_predict.c so that the fuzz harnesses reach them.
#define _POSIX_C_SOURCE 200809L  // strtok_r, strdup
#include "train/class_names.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yajl/yajl_parse.h>
#include <zlib.h>

#include "datasets/coco.h"  // the limits on instances files
#include "kernels/common.h"

static char *xstrdup(const char *s) {
  char *c = strdup(s);
  DETR_CHECK(c, "class names: out of host memory");
  return c;
}

void class_names_set(ClassNames *nm, int label, const char *name) {
  if (label < 0 || label > CLASS_NAMES_MAX_ID) return;  // ids beyond any model: ignore rather than allocate
  if (label >= nm->n) {
    char **grown = realloc(nm->name, (size_t)(label + 1) * sizeof(char *));
    DETR_CHECK(grown, "class names: out of host memory");
    for (int i = nm->n; i <= label; i++) grown[i] = NULL;
    nm->name = grown, nm->n = label + 1;
  }
  free(nm->name[label]);
  nm->name[label] = xstrdup(name);
}

void class_names_free(ClassNames *nm) {
  for (int i = 0; i < nm->n; i++) free(nm->name[i]);
  free(nm->name);
  *nm = (ClassNames){0};
}

// The "categories" of a COCO instances file (plain or .gz), streamed: a file with only that
// array is accepted too, and a 450 MB train2017 file needs no memory for its annotations.
typedef struct {
  ClassNames *nm;
  const char *path;
  int depth;              // open maps and arrays
  bool top_is_categories; // the current key of the top-level object is "categories"
  bool in_categories;     // inside its array
  bool seen;              // the array was there
  char key[16];           // current key inside a category object
  long long id, index;    // the category being read, and its position in the array
  bool has_id;
  char *name;
  char err[512];
} NameParser;

static int np_fail(NameParser *p, const char *what) {
  snprintf(p->err, sizeof p->err, "%s: categories[%lld]: %s", p->path, p->index, what);
  return 0;  // cancels the parse
}

static int np_deep(NameParser *p) {
  snprintf(p->err, sizeof p->err, "%s: JSON nested deeper than the limit of %d levels", p->path, DETR_MAX_JSON_DEPTH);
  return 0;
}

static bool np_field(const NameParser *p, const char *key) { return p->in_categories && p->depth == 3 && !strcmp(p->key, key); }

static int np_integer(void *ctx, long long v) {
  NameParser *p = ctx;
  if (np_field(p, "id")) p->id = v, p->has_id = true;
  else if (np_field(p, "name")) return np_fail(p, "'name' is not a string");
  return 1;
}

static int np_other(NameParser *p) {
  if (np_field(p, "id")) return np_fail(p, "'id' is not an integer");
  if (np_field(p, "name")) return np_fail(p, "'name' is not a string");
  return 1;
}
static int np_null(void *ctx) { return np_other(ctx); }
static int np_bool(void *ctx, int v) { return (void)v, np_other(ctx); }
static int np_double(void *ctx, double v) { return (void)v, np_other(ctx); }

static int np_string(void *ctx, const unsigned char *s, size_t len) {
  NameParser *p = ctx;
  if (np_field(p, "id")) return np_fail(p, "'id' is not an integer");
  if (np_field(p, "name")) {
    if (len > COCO_MAX_STRING_BYTES) return np_fail(p, "'name' is longer than the limit of 4096 bytes");
    if (memchr(s, 0, len)) return np_fail(p, "'name' contains a NUL character");
    free(p->name);
    p->name = malloc(len + 1);
    DETR_CHECK(p->name, "class names: out of host memory");
    memcpy(p->name, s, len);
    p->name[len] = 0;
  }
  return 1;
}

static int np_map_key(void *ctx, const unsigned char *s, size_t len) {
  NameParser *p = ctx;
  if (p->depth == 1) p->top_is_categories = len == 10 && !memcmp(s, "categories", 10);
  if (p->in_categories && p->depth == 3) snprintf(p->key, sizeof p->key, "%.*s", (int)(len < 15 ? len : 15), s);
  return 1;
}

static int np_start_map(void *ctx) {
  NameParser *p = ctx;
  if (p->depth >= DETR_MAX_JSON_DEPTH) return np_deep(p);
  if (p->depth == 1 && p->top_is_categories) {
    snprintf(p->err, sizeof p->err, "%s: 'categories' is not an array", p->path);
    return 0;
  }
  if (p->in_categories && p->depth == 2) p->has_id = false, p->key[0] = 0;
  else if (np_field(p, "id")) return np_fail(p, "'id' is not an integer");
  p->depth++;
  return 1;
}

static int np_end_map(void *ctx) {
  NameParser *p = ctx;
  p->depth--;
  if (p->in_categories && p->depth == 2) {
    if (!p->has_id || !p->name) return np_fail(p, !p->has_id ? "no integer 'id'" : "no string 'name'");
    if (p->id < 0 || p->id > CLASS_NAMES_MAX_ID) return np_fail(p, "'id' outside [0, 1000000]");
    class_names_set(p->nm, (int)p->id, p->name);
    free(p->name);
    p->name = NULL;
    p->index++;
  }
  return 1;
}

static int np_start_array(void *ctx) {
  NameParser *p = ctx;
  if (p->depth >= DETR_MAX_JSON_DEPTH) return np_deep(p);
  if (p->depth == 1 && p->top_is_categories) p->in_categories = p->seen = true;
  else if (np_field(p, "id")) return np_fail(p, "'id' is not an integer");
  p->depth++;
  return 1;
}

static int np_end_array(void *ctx) {
  NameParser *p = ctx;
  if (--p->depth == 1) p->in_categories = false;
  return 1;
}

int class_names_from_coco(const char *path, ClassNames *nm, char *err, size_t cap) {
  static const yajl_callbacks CB = {np_null, np_bool, np_integer, np_double, NULL, np_string,
                                    np_start_map, np_map_key, np_end_map, np_start_array, np_end_array};
  NameParser p = {.nm = nm, .path = path};
  gzFile gz = gzopen(path, "rb");  // plain files pass through
  if (!gz) {
    snprintf(err, cap, "--names %s: cannot open: %m", path);
    return -1;
  }
  yajl_handle h = yajl_alloc(&CB, NULL, &p);
  DETR_CHECK(h, "class names: out of host memory");
  unsigned char chunk[1 << 16];
  long long offset = 0;
  int n;
  yajl_status st = yajl_status_ok;
  struct stat sb;
  long long file_bytes = stat(path, &sb) == 0 && sb.st_size > 0 ? (long long)sb.st_size : 0;
  long long max_json = file_bytes * COCO_MAX_GZIP_RATIO > COCO_MIN_GZIP_BUDGET ? file_bytes * COCO_MAX_GZIP_RATIO
                                                                               : COCO_MIN_GZIP_BUDGET;
  while (st == yajl_status_ok && (n = gzread(gz, chunk, sizeof chunk)) > 0) {
    if (!gzdirect(gz) && offset + n > max_json) {
      snprintf(p.err, sizeof p.err, "%s: decompresses to more than %lld bytes, the limit for a %lld-byte .gz file",
               path, max_json, file_bytes);
      break;
    }
    st = yajl_parse(h, chunk, (size_t)n);
    if (st == yajl_status_error) {
      long long at = offset + (long long)yajl_get_bytes_consumed(h);
      snprintf(p.err, sizeof p.err, "%s: malformed JSON at byte %lld", path, at);
    }
    offset += n;
  }
  int zerr;
  const char *zmsg = gzerror(gz, &zerr);
  if (!p.err[0] && zerr != Z_OK) snprintf(p.err, sizeof p.err, "%s: read error: %s", path, zmsg);
  if (!p.err[0] && yajl_complete_parse(h) != yajl_status_ok)
    snprintf(p.err, sizeof p.err, "%s: truncated JSON after %lld bytes", path, offset);
  if (!p.err[0] && (!p.seen || p.index == 0))
    snprintf(p.err, sizeof p.err, "%s: no categories (expected a COCO instances file)", path);
  yajl_free(h);
  gzclose(gz);
  free(p.name);
  if (p.err[0]) {
    snprintf(err, cap, "--names: %s", p.err);
    return -1;
  }
  return 0;
}

// A checkpoint's "categories" metadata: "id:name;id:name;...". Returns 0, or -1 naming the entry.
int class_names_from_text(const char *path, const char *text, ClassNames *nm, char *err, size_t cap) {
  char *copy = xstrdup(text), *save = NULL;
  int rc = 0;
  for (char *item = strtok_r(copy, ";", &save); item && !rc; item = strtok_r(NULL, ";", &save)) {
    char *colon = strchr(item, ':'), *end = NULL;
    long id = colon ? strtol(item, &end, 10) : -1;
    if (!colon || end != colon || id < 0) {
      snprintf(err, cap, "%s: metadata 'categories': '%s' is not id:name", path, item);
      rc = -1;
    } else {
      if (id <= CLASS_NAMES_MAX_ID) class_names_set(nm, (int)id, colon + 1);  // no int wrap-around
    }
  }
  free(copy);
  return rc;
}

