#include "datasets/coco.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <yajl/yajl_parse.h>

#include "core/error.h"
#include "datasets/json_stream.h"
#include "kernels/common.h"  // DETR_MAX_JSON_DEPTH

// Bytes handed to the parser per call (and zlib's buffer size). Fuzz builds read in small chunks,
// so that inputs of a few kilobytes cross chunk boundaries as real files do.
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define COCO_READ_CHUNK 509
#else
#define COCO_READ_CHUNK (1u << 20)
#endif

// --- parse state -------------------------------------------------------------------------------

typedef enum { SEC_NONE, SEC_IMAGES, SEC_ANNOTATIONS, SEC_CATEGORIES, SEC_OTHER } Section;

typedef enum {
  F_NONE,  // a key we do not keep: its value is skipped
  F_ID,
  F_FILE_NAME,
  F_WIDTH,
  F_HEIGHT,  // images
  F_IMAGE_ID,
  F_CATEGORY_ID,
  F_BBOX,
  F_AREA,
  F_ISCROWD,  // annotations
  F_NAME,
  F_SUPERCATEGORY,  // categories
} Field;

typedef struct {
  int64_t id;
  int64_t name;  // offset in the string pool
  int width, height;
  int64_t file_index;
} RawImage;

typedef struct {
  int id;
  int64_t name, supercategory;  // offsets in the string pool
  int64_t file_index;
} RawCategory;

typedef struct {
  const char *path;
  BadInputPolicy policy;
  DataError *err;
  bool failed;  // err holds the reason; the callbacks return 0 to stop the parser
  int64_t warnings;
  CocoStats *stats;

  int depth;       // nesting of the value being parsed: 1 = inside the top-level object
  int skip_depth;  // while skipping, the depth at which the skipped value started
  bool skipping;
  bool seen_top, seen_images, seen_categories;
  bool categories_only;  // CocoOpenConfig's: the images and annotations are skipped, not required
  Section section;
  Field field;
  int64_t item_index;        // position of the current item in its array
  int64_t items, max_items;  // items begun in all sections, and the limit for this file's size

  // The current item: which fields it had, their values, the first problem found.
  bool has_id, has_file_name, has_width, has_height, has_image_id, has_category_id, has_area, has_iscrowd, has_name,
      has_supercategory;
  int n_bbox;  // numbers seen in the bbox array (more than 4 is a problem)
  bool in_bbox;
  int64_t id, image_id;
  int category_id, width, height, iscrowd;
  double bbox[4], area;
  int64_t name, supercategory;  // pool offsets
  char problem[200];

  RawImage *images;
  int64_t n_images, cap_images;
  CocoAnn *anns;
  int64_t n_anns, cap_anns;
  RawCategory *cats;
  int64_t n_cats, cap_cats;
  char *pool;
  int64_t pool_len, pool_cap;
} Parser;

static const char *section_name(Section s) {
  return s == SEC_IMAGES ? "images" : s == SEC_ANNOTATIONS ? "annotations" : "categories";
}

static int64_t pool_add(Parser *p, const unsigned char *s, size_t n) {
  void *pool = p->pool;
  data_reserve(&pool, &p->pool_cap, p->pool_len + (int64_t)n + 1, 1, "annotation string pool");
  p->pool = pool;
  int64_t off = p->pool_len;
  memcpy(p->pool + off, s, n);
  p->pool[off + (int64_t)n] = '\0';
  p->pool_len += (int64_t)n + 1;
  return off;
}

// Records the first problem of the current item (reported when the item ends).
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
item_problem(Parser *p, const char *fmt, ...) {
  if (p->problem[0]) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->problem, sizeof p->problem, fmt, ap);
  va_end(ap);
}

static void set_error(Parser *p, const char *fmt, ...);

// A bad item, described by fmt: under the fail policy the parse stops with it as the error
// (returns false); under skip it is printed as a warning (returns true) and the caller drops it.
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static bool
bad_item(Parser *p, const char *fmt, ...) {
  char msg[sizeof(((DataError *)0)->msg) - 16];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (p->policy == BAD_INPUT_FAIL) {
    set_error(p, "%s", msg);
    return false;
  }
  data_warn(&p->warnings, "%s - skipped", msg);
  return true;
}

// A fatal error: err holds the message and the callbacks stop the parser.
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
set_error(Parser *p, const char *fmt, ...) {
  if (p->failed) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(p->err->msg, sizeof p->err->msg, fmt, ap);
  va_end(ap);
  p->failed = true;
}

// Counts an item against the file's budget; false (err set) past it.
static bool count_item(Parser *p) {
  if (++p->items <= p->max_items) return true;
  set_error(p,
            "%s: more than %lld images, annotations and categories, the limit for a file of this size (%d per byte "
            "on disk, at least %d; a gzip bomb?)",
            p->path, (long long)p->max_items, JSON_MAX_ITEMS_PER_BYTE, JSON_MIN_ITEM_BUDGET);
  return false;
}

static void begin_item(Parser *p) {
  p->has_id = p->has_file_name = p->has_width = p->has_height = p->has_image_id = p->has_category_id = false;
  p->has_area = p->has_iscrowd = p->has_name = p->has_supercategory = false;
  p->n_bbox = 0;
  p->in_bbox = false;
  p->iscrowd = 0;
  p->problem[0] = '\0';
  p->field = F_NONE;
}

// "annotations[12] (id 7)" for messages.
static const char *item_label(const Parser *p, char *buf, size_t cap) {
  if (p->has_id)
    snprintf(buf, cap, "%s[%lld] (id %lld)", section_name(p->section), (long long)p->item_index, (long long)p->id);
  else snprintf(buf, cap, "%s[%lld]", section_name(p->section), (long long)p->item_index);
  return buf;
}

static int end_item(Parser *p) {
  if (!p->problem[0]) {
    const char *missing = NULL;
    if (!p->has_id) missing = "id";
    else if (p->section == SEC_IMAGES)
      missing = !p->has_file_name ? "file_name" : !p->has_width ? "width" : !p->has_height ? "height" : NULL;
    else if (p->section == SEC_ANNOTATIONS)
      missing = !p->has_image_id ? "image_id" : !p->has_category_id ? "category_id" : p->n_bbox == 0 ? "bbox" : NULL;
    else if (p->section == SEC_CATEGORIES) missing = !p->has_name ? "name" : NULL;
    if (missing) item_problem(p, "missing '%s'", missing);
    else if (p->section == SEC_ANNOTATIONS && p->n_bbox != 4)
      item_problem(p, "'bbox' has %d numbers, not 4 (x, y, width, height)", p->n_bbox);
  }
  char label[96];
  if (p->problem[0]) {
    p->stats->malformed_items++;
    if (p->section == SEC_ANNOTATIONS) p->stats->skipped_annotations++;
    if (p->section == SEC_IMAGES) p->stats->skipped_images++;
    return bad_item(p, "%s: %s: %s", p->path, item_label(p, label, sizeof label), p->problem);
  }
  if (p->section == SEC_IMAGES) {
    void *buf = p->images;
    data_reserve(&buf, &p->cap_images, p->n_images + 1, sizeof(RawImage), "image records");
    p->images = buf;
    p->images[p->n_images++] =
        (RawImage){.id = p->id, .name = p->name, .width = p->width, .height = p->height, .file_index = p->item_index};
  } else if (p->section == SEC_ANNOTATIONS) {
    void *buf = p->anns;
    data_reserve(&buf, &p->cap_anns, p->n_anns + 1, sizeof(CocoAnn), "annotation records");
    p->anns = buf;
    CocoAnn *a = &p->anns[p->n_anns++];
    *a = (CocoAnn){.id = p->id,
                   .image_id = p->image_id,
                   .image_index = -1,
                   .category_id = p->category_id,
                   .iscrowd = p->iscrowd != 0,
                   .area = p->has_area ? p->area : p->bbox[2] * p->bbox[3],
                   .file_index = p->item_index};
    memcpy(a->bbox, p->bbox, sizeof a->bbox);
  } else {
    void *buf = p->cats;
    data_reserve(&buf, &p->cap_cats, p->n_cats + 1, sizeof(RawCategory), "category records");
    p->cats = buf;
    p->cats[p->n_cats++] = (RawCategory){.id = (int)p->id,
                                         .name = p->name,
                                         .supercategory = p->has_supercategory ? p->supercategory : -1,
                                         .file_index = p->item_index};
  }
  return 1;
}

// --- scalar conversion -------------------------------------------------------------------------

static bool number_to_double(const char *s, size_t n, double *out) {
  char buf[64];
  if (n == 0 || n >= sizeof buf) return false;
  memcpy(buf, s, n);
  buf[n] = '\0';
  char *end;
  errno = 0;
  double v = strtod(buf, &end);
  if (*end != '\0' || !isfinite(v)) return false;
  *out = v;
  return true;
}

// An integral value ("42", also "42.0" as some exporters write) within [lo, hi].
static bool number_to_int(const char *s, size_t n, int64_t lo, int64_t hi, int64_t *out) {
  double v;
  if (!memchr(s, '.', n) && !memchr(s, 'e', n) && !memchr(s, 'E', n)) {
    char buf[32];
    if (n == 0 || n >= sizeof buf) return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *end;
    errno = 0;
    long long i = strtoll(buf, &end, 10);
    if (*end != '\0' || errno) return false;
    if (i < lo || i > hi) return false;
    *out = i;
    return true;
  }
  if (!number_to_double(s, n, &v) || v != floor(v) || v < (double)lo || v > (double)hi) return false;
  *out = (int64_t)v;
  return true;
}

static const char *field_key(Field f) {
  switch (f) {
    case F_ID: return "id";
    case F_FILE_NAME: return "file_name";
    case F_WIDTH: return "width";
    case F_HEIGHT: return "height";
    case F_IMAGE_ID: return "image_id";
    case F_CATEGORY_ID: return "category_id";
    case F_BBOX: return "bbox";
    case F_AREA: return "area";
    case F_ISCROWD: return "iscrowd";
    case F_NAME: return "name";
    case F_SUPERCATEGORY: return "supercategory";
    default: return "?";
  }
}

// --- YAJL callbacks ------------------------------------------------------------------------------

typedef enum { V_NULL, V_BOOL, V_NUMBER, V_STRING } ValueKind;

// A string field of the current item (file_name, name, supercategory) into the string pool.
static void on_string_field(Parser *p, const char *s, size_t n) {
  if (p->field == F_FILE_NAME && n == 0) {
    item_problem(p, "empty 'file_name'");
    return;
  }
  if (n > COCO_MAX_STRING_BYTES) {
    item_problem(p, "'%s' has %zu bytes, more than the limit of %d", field_key(p->field), n, COCO_MAX_STRING_BYTES);
    return;
  }
  if (memchr(s, 0, n)) {  // "a\u0000b" would name the file "a"
    item_problem(p, "'%s' contains a NUL character", field_key(p->field));
    return;
  }
  int64_t off = pool_add(p, (const unsigned char *)s, n);
  if (p->field == F_SUPERCATEGORY) p->supercategory = off, p->has_supercategory = true;
  else if (p->field == F_NAME) p->name = off, p->has_name = true;
  else p->name = off, p->has_file_name = true;
}

// A scalar value of a field of the current item (depth 3): stored, or the item's problem.
static int on_field(Parser *p, ValueKind kind, const char *s, size_t n, int boolean) {
  int64_t i = 0;
  switch (p->field) {
    case F_ID:
    case F_IMAGE_ID:
      if (kind != V_NUMBER || !number_to_int(s, n, INT64_MIN / 2, INT64_MAX / 2, &i)) break;
      if (p->section == SEC_CATEGORIES && (i < 0 || i > COCO_MAX_CATEGORY_ID)) {
        item_problem(p, "category id %lld outside [0, %d]", (long long)i, COCO_MAX_CATEGORY_ID);
        return 1;
      }
      if (p->field == F_ID) p->id = i, p->has_id = true;
      else p->image_id = i, p->has_image_id = true;
      return 1;
    case F_WIDTH:
    case F_HEIGHT:
      if (kind != V_NUMBER || !number_to_int(s, n, INT32_MIN, INT32_MAX, &i)) break;
      if (i < 1 || i > IMAGE_MAX_SIDE) {
        item_problem(p, "'%s' %lld outside [1, %d]", field_key(p->field), (long long)i, IMAGE_MAX_SIDE);
        return 1;
      }
      if (p->field == F_WIDTH) p->width = (int)i, p->has_width = true;
      else p->height = (int)i, p->has_height = true;
      return 1;
    case F_CATEGORY_ID:
      if (kind != V_NUMBER || !number_to_int(s, n, INT32_MIN, INT32_MAX, &i)) break;
      p->category_id = (int)i;
      p->has_category_id = true;
      return 1;
    case F_AREA:
      if (kind != V_NUMBER || !number_to_double(s, n, &p->area)) break;
      p->has_area = true;
      return 1;
    case F_ISCROWD:
      if (kind == V_BOOL) i = boolean;
      else if (kind != V_NUMBER || !number_to_int(s, n, 0, 1, &i)) break;
      p->iscrowd = (int)i;
      p->has_iscrowd = true;
      return 1;
    case F_FILE_NAME:
    case F_NAME:
    case F_SUPERCATEGORY:
      if (kind != V_STRING) break;
      on_string_field(p, s, n);
      return 1;
    case F_BBOX: break;  // a scalar where the bbox array belongs
    default: return 1;
  }
  static const char *kinds[] = {"null", "a boolean", "a number", "a string"};
  item_problem(p, "'%s' has a wrong type or value (%s)", field_key(p->field), kinds[kind]);
  return 1;
}

// A scalar value at the current depth.
static int on_scalar(Parser *p, ValueKind kind, const char *s, size_t n, int boolean) {
  if (p->skipping) {
    if (p->depth == p->skip_depth) p->skipping = false;  // the skipped value was this scalar
    return 1;
  }
  if (p->depth == 1) {  // value of a top-level key
    if (p->section == SEC_IMAGES || p->section == SEC_ANNOTATIONS || p->section == SEC_CATEGORIES) {
      set_error(p, "%s: '%s' is not an array", p->path, section_name(p->section));
      return 0;
    }
    return 1;
  }
  if (p->depth == 2) {  // an array item that is not an object
    if (!count_item(p)) return 0;
    begin_item(p);
    item_problem(p, "not a JSON object");
    int ok = end_item(p);
    p->item_index++;
    return ok;
  }
  if (p->depth == 4) {  // inside bbox
    double v;
    if (kind != V_NUMBER || !number_to_double(s, n, &v)) item_problem(p, "'bbox' holds a value that is not a number");
    else if (p->n_bbox < 4) p->bbox[p->n_bbox] = v;
    p->n_bbox++;
    return 1;
  }
  if (p->depth != 3 || p->field == F_NONE) return 1;
  return on_field(p, kind, s, n, boolean);
}

static int cb_null(void *ctx) { return on_scalar(ctx, V_NULL, NULL, 0, 0); }
static int cb_boolean(void *ctx, int b) { return on_scalar(ctx, V_BOOL, NULL, 0, b); }
static int cb_number(void *ctx, const char *s, size_t n) { return on_scalar(ctx, V_NUMBER, s, n, 0); }
static int cb_string(void *ctx, const unsigned char *s, size_t n) {
  return on_scalar(ctx, V_STRING, (const char *)s, n, 0);
}

static void start_skip(Parser *p) {
  p->skipping = true;
  p->skip_depth = p->depth;
  p->depth++;
}

static int on_start_container(Parser *p, bool is_map) {
  if (p->depth >= DETR_MAX_JSON_DEPTH) {
    set_error(p, "%s: JSON nested deeper than the limit of %d levels", p->path, DETR_MAX_JSON_DEPTH);
    return 0;
  }
  if (p->skipping) {
    p->depth++;
    return 1;
  }
  switch (p->depth) {
    case 0:
      if (!is_map) {
        set_error(p, "%s: the top level is an array, not an object (not a COCO instances file)", p->path);
        return 0;
      }
      p->seen_top = true;
      p->depth = 1;
      return 1;
    case 1:
      if (p->section == SEC_IMAGES || p->section == SEC_ANNOTATIONS || p->section == SEC_CATEGORIES) {
        if (is_map) {
          set_error(p, "%s: '%s' is an object, not an array", p->path, section_name(p->section));
          return 0;
        }
        p->item_index = 0;
        p->depth = 2;
        return 1;
      }
      start_skip(p);  // info, licenses, anything else
      return 1;
    case 2:
      if (!count_item(p)) return 0;
      if (!is_map) {
        begin_item(p);
        item_problem(p, "an array, not a JSON object");
        if (!end_item(p)) return 0;
        p->item_index++;
        start_skip(p);
        return 1;
      }
      begin_item(p);
      p->depth = 3;
      return 1;
    case 3:
      if (!is_map && p->field == F_BBOX && p->section == SEC_ANNOTATIONS) {
        if (p->in_bbox) item_problem(p, "'bbox' given twice");
        p->in_bbox = true;
        p->n_bbox = 0;
        p->depth = 4;
        return 1;
      }
      if (p->field != F_NONE) item_problem(p, "'%s' is %s", field_key(p->field), is_map ? "an object" : "an array");
      start_skip(p);  // segmentation, keypoints, ...
      return 1;
    default:  // a container inside bbox
      item_problem(p, "'bbox' holds a nested %s", is_map ? "object" : "array");
      p->n_bbox++;
      start_skip(p);
      return 1;
  }
}

static int on_end_container(Parser *p) {
  if (p->skipping) {
    p->depth--;
    if (p->depth == p->skip_depth) p->skipping = false;
    return 1;
  }
  switch (p->depth) {
    case 4:  // end of bbox
      p->depth = 3;
      return 1;
    case 3: {  // end of an item
      p->depth = 2;
      int ok = end_item(p);
      p->item_index++;
      return ok;
    }
    case 2:  // end of a section array
      p->depth = 1;
      p->section = SEC_NONE;
      return 1;
    default:  // end of the top-level object
      p->depth = 0;
      return 1;
  }
}

static int cb_start_map(void *ctx) { return on_start_container(ctx, true); }
static int cb_start_array(void *ctx) { return on_start_container(ctx, false); }
static int cb_end_map(void *ctx) { return on_end_container(ctx); }
static int cb_end_array(void *ctx) { return on_end_container(ctx); }

static bool key_is(const unsigned char *k, size_t n, const char *name) {
  return strlen(name) == n && memcmp(k, name, n) == 0;
}

static int cb_map_key(void *ctx, const unsigned char *k, size_t n) {
  Parser *p = ctx;
  if (p->skipping) return 1;
  if (p->depth == 1) {
    p->section = SEC_OTHER;
    if (key_is(k, n, "categories")) p->section = SEC_CATEGORIES, p->seen_categories = true;
    else if (p->categories_only) return 1;
    else if (key_is(k, n, "images")) p->section = SEC_IMAGES, p->seen_images = true;
    else if (key_is(k, n, "annotations")) p->section = SEC_ANNOTATIONS;
    return 1;
  }
  if (p->depth != 3) return 1;
  Field f = F_NONE;
  if (key_is(k, n, "id")) f = F_ID;
  else if (p->section == SEC_IMAGES) {
    if (key_is(k, n, "file_name")) f = F_FILE_NAME;
    else if (key_is(k, n, "width")) f = F_WIDTH;
    else if (key_is(k, n, "height")) f = F_HEIGHT;
  } else if (p->section == SEC_ANNOTATIONS) {
    if (key_is(k, n, "image_id")) f = F_IMAGE_ID;
    else if (key_is(k, n, "category_id")) f = F_CATEGORY_ID;
    else if (key_is(k, n, "bbox")) f = F_BBOX;
    else if (key_is(k, n, "area")) f = F_AREA;
    else if (key_is(k, n, "iscrowd")) f = F_ISCROWD;
  } else if (p->section == SEC_CATEGORIES) {
    if (key_is(k, n, "name")) f = F_NAME;
    else if (key_is(k, n, "supercategory")) f = F_SUPERCATEGORY;
  }
  p->field = f;
  return 1;
}

static const yajl_callbacks callbacks = {
    .yajl_null = cb_null,
    .yajl_boolean = cb_boolean,
    .yajl_number = cb_number,  // raw text: no conversion for the numbers we skip
    .yajl_string = cb_string,
    .yajl_start_map = cb_start_map,
    .yajl_map_key = cb_map_key,
    .yajl_end_map = cb_end_map,
    .yajl_start_array = cb_start_array,
    .yajl_end_array = cb_end_array,
};

// --- reading the file --------------------------------------------------------------------------

// Streams the file (plain or gzip) into the parser (datasets/json_stream.h: every failure of the
// file itself is worded there; the items' own here).
static int parse_file(Parser *p) {
  p->max_items = json_item_budget(p->path);
  JsonReader r = {.path = p->path,
                  .callbacks = &callbacks,
                  .ctx = p,
                  .expect = "a COCO instances file",
                  .chunk = COCO_READ_CHUNK,
                  .check_utf8 = false};  // names are copied as bytes; skip UTF-8 checks
  int64_t offset = 0;
  char err[sizeof(((DataError *)0)->msg)] = "";
  if (json_read_file(&r, &offset, err, sizeof err) && !p->failed) set_error(p, "%s", err);
  if (p->failed) return DATA_ERROR;
  if (!p->seen_top) {
    set_error(p, "%s: no JSON object in the file (%s)", p->path,
              offset == 0 ? "empty file" : "not a COCO instances file");
    return DATA_ERROR;
  }
  if (!p->seen_images && !p->categories_only)
    set_error(p, "%s: no 'images' array (not a COCO instances file)", p->path);
  else if (!p->seen_categories) set_error(p, "%s: no 'categories' array (not a COCO instances file)", p->path);
  return p->failed ? DATA_ERROR : DATA_OK;
}

// --- validation and indexing -------------------------------------------------------------------

static int cmp_raw_image(const void *a, const void *b) {
  const RawImage *x = a, *y = b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return x->file_index < y->file_index ? -1 : x->file_index > y->file_index;
}

static int cmp_raw_category(const void *a, const void *b) {
  const RawCategory *x = a, *y = b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return x->file_index < y->file_index ? -1 : x->file_index > y->file_index;
}

int64_t coco_find_image(const CocoDataset *ds, int64_t image_id) {
  int64_t lo = 0, hi = ds->n_images - 1;
  while (lo <= hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (ds->images[mid].id == image_id) return mid;
    if (ds->images[mid].id < image_id) lo = mid + 1;
    else hi = mid - 1;
  }
  return -1;
}

int coco_label_of(const CocoDataset *ds, int category_id) {
  if (category_id < 0 || category_id > ds->max_category_id) return -1;
  return ds->label_of_category[category_id];
}

int coco_category_of(const CocoDataset *ds, int label) {
  if (!ds->contiguous_labels) return coco_label_of(ds, label) >= 0 ? label : -1;
  return label >= 0 && label < ds->n_categories ? ds->categories[label].id : -1;
}

// The categories sorted by id, duplicates dropped, and the map from category id to label.
static int index_categories(Parser *p, CocoDataset *ds) {
  if (p->n_cats) qsort(p->cats, (size_t)p->n_cats, sizeof(RawCategory), cmp_raw_category);
  ds->categories = detr_calloc((size_t)p->n_cats, sizeof(CocoCategory), "categories");
  int nc = 0;
  for (int64_t i = 0; i < p->n_cats; i++) {
    const RawCategory *c = &p->cats[i];
    if (nc > 0 && ds->categories[nc - 1].id == c->id) {
      p->stats->duplicate_ids++;
      if (!bad_item(p, "%s: categories[%lld] (id %d): duplicate category id", p->path, (long long)c->file_index, c->id))
        return DATA_ERROR;
      continue;
    }
    ds->categories[nc++] = (CocoCategory){.id = c->id,
                                          .name = p->pool + c->name,
                                          .supercategory = c->supercategory >= 0 ? p->pool + c->supercategory : ""};
  }
  ds->n_categories = nc;
  ds->max_category_id = nc ? ds->categories[nc - 1].id : 0;
  ds->label_of_category = detr_malloc(sizeof(int) * (size_t)(ds->max_category_id + 1), "category label map");
  for (int i = 0; i <= ds->max_category_id; i++) ds->label_of_category[i] = -1;
  for (int i = 0; i < nc; i++)
    ds->label_of_category[ds->categories[i].id] = ds->contiguous_labels ? i : ds->categories[i].id;
  ds->num_classes = ds->contiguous_labels ? nc : ds->max_category_id + 1;
  return DATA_OK;
}

// The images sorted by id, duplicates dropped.
static int index_images(Parser *p, CocoDataset *ds) {
  CocoStats *s = p->stats;
  if (p->n_images) qsort(p->images, (size_t)p->n_images, sizeof(RawImage), cmp_raw_image);
  ds->images = detr_calloc((size_t)p->n_images, sizeof(CocoImage), "images");
  int64_t ni = 0;
  for (int64_t i = 0; i < p->n_images; i++) {
    const RawImage *r = &p->images[i];
    if (ni > 0 && ds->images[ni - 1].id == r->id) {
      s->skipped_images++;
      s->duplicate_ids++;
      if (!bad_item(p, "%s: images[%lld] (id %lld): duplicate image id", p->path, (long long)r->file_index,
                    (long long)r->id))
        return DATA_ERROR;
      continue;
    }
    ds->images[ni++] = (CocoImage){.id = r->id, .file_name = p->pool + r->name, .width = r->width, .height = r->height};
  }
  ds->n_images = ni;
  return DATA_OK;
}

// Resolves each annotation's image and category and validates its box against the image, in file
// order: the valid ones are kept at the front of p->anns, *n_valid of them.
static int resolve_annotations(Parser *p, CocoDataset *ds, int64_t *n_valid) {
  CocoStats *s = p->stats;
  int64_t na = 0;
  for (int64_t i = 0; i < p->n_anns; i++) {
    CocoAnn a = p->anns[i];
    char where[160];
    snprintf(where, sizeof where, "%s: annotations[%lld] (id %lld, image_id %lld)", p->path, (long long)a.file_index,
             (long long)a.id, (long long)a.image_id);
    a.image_index = coco_find_image(ds, a.image_id);
    if (a.image_index < 0) {
      s->skipped_annotations++;
      s->unknown_image_ids++;
      if (!bad_item(p, "%s: image_id not in 'images'", where)) return DATA_ERROR;
      continue;
    }
    if (coco_label_of(ds, a.category_id) < 0) {
      s->skipped_annotations++;
      s->unknown_category_ids++;
      if (!bad_item(p, "%s: unknown category_id %d (not in 'categories')", where, a.category_id)) return DATA_ERROR;
      continue;
    }
    const CocoImage *im = &ds->images[a.image_index];
    double x0 = a.bbox[0], y0 = a.bbox[1], bw = a.bbox[2], bh = a.bbox[3];
    if (!(bw > 0 && bh > 0)) {
      s->skipped_annotations++;
      s->zero_size_boxes++;
      if (!bad_item(p, "%s: box [%g, %g, %g, %g] has %s: a COCO bbox is [x, y, width, height] with both > 0", where, x0,
                    y0, bw, bh, bw < 0 || bh < 0 ? "a negative width or height" : "no area"))
        return DATA_ERROR;
      continue;
    }
    double cx0 = fmax(x0, 0), cy0 = fmax(y0, 0), cx1 = fmin(x0 + bw, im->width), cy1 = fmin(y0 + bh, im->height);
    if (!(cx1 > cx0 && cy1 > cy0)) {
      s->skipped_annotations++;
      s->out_of_image_boxes++;
      if (!bad_item(p, "%s: box [%g, %g, %g, %g] lies outside the %dx%d image", where, x0, y0, bw, bh, im->width,
                    im->height))
        return DATA_ERROR;
      continue;
    }
    if (x0 < 0 || y0 < 0 || x0 + bw > im->width || y0 + bh > im->height) s->clamped_boxes++;
    p->anns[na++] = a;
  }
  *n_valid = na;
  return DATA_OK;
}

// Groups the first na annotations by image, file order kept within an image: a counting sort
// applied in place (the annotation array is the largest allocation; a sorted copy would double
// the peak memory). The dataset takes the array over.
static void group_by_image(Parser *p, CocoDataset *ds, int64_t na) {
  int64_t ni = ds->n_images;
  for (int64_t i = 0; i < na; i++) ds->images[p->anns[i].image_index].n_anns++;
  int64_t start = 0;
  for (int64_t i = 0; i < ni; i++) {
    ds->images[i].first_ann = start;
    start += ds->images[i].n_anns;
    ds->images[i].n_anns = 0;
  }
  int64_t *dest = detr_malloc(sizeof(int64_t) * (size_t)(na ? na : 1), "annotation order");  // [na]
  for (int64_t i = 0; i < na; i++) {
    CocoImage *im = &ds->images[p->anns[i].image_index];
    dest[i] = im->first_ann + im->n_anns++;
  }
  for (int64_t i = 0; i < na; i++) {
    while (dest[i] != i) {  // each swap puts one annotation in its final place
      int64_t j = dest[i];
      CocoAnn t = p->anns[i];
      p->anns[i] = p->anns[j];
      p->anns[j] = t;
      dest[i] = dest[j];
      dest[j] = j;
    }
  }
  free(dest);
  ds->anns = detr_realloc(p->anns, sizeof(CocoAnn) * (size_t)na, "annotations");  // shrink to fit
  p->anns = NULL;
  ds->n_anns = na;
}

// Sorts images and categories by id (dropping duplicates), resolves every annotation's image and
// category, validates its box against the image, then groups annotations by image.
static int build_dataset(Parser *p, CocoDataset *ds) {
  int64_t na = 0;
  if (index_categories(p, ds) != DATA_OK || index_images(p, ds) != DATA_OK ||
      resolve_annotations(p, ds, &na) != DATA_OK)
    return DATA_ERROR;
  group_by_image(p, ds, na);
  return DATA_OK;
}

// Drops images (and their annotations) whose keep flag is false; keeps the order.
static void remove_images(CocoDataset *ds, const bool *keep) {
  int64_t ni = 0, na = 0;
  for (int64_t i = 0; i < ds->n_images; i++) {
    CocoImage im = ds->images[i];
    if (!keep[i]) {
      ds->stats.skipped_annotations += im.n_anns;
      continue;
    }
    for (int k = 0; k < im.n_anns; k++) {
      ds->anns[na + k] = ds->anns[im.first_ann + k];
      ds->anns[na + k].image_index = ni;
    }
    im.first_ann = na;
    na += im.n_anns;
    ds->images[ni++] = im;
  }
  ds->n_images = ni;
  ds->n_anns = na;
}

// Every image file exists, is a JPEG/PNG and has the size the annotation file states.
static int check_images(CocoDataset *ds, BadInputPolicy policy, int64_t *warnings, DataError *err) {
  bool *keep = detr_malloc(sizeof(bool) * (size_t)(ds->n_images ? ds->n_images : 1), "image keep flags");
  int rc = DATA_OK;
  bool dropped = false;
  for (int64_t i = 0; i < ds->n_images && rc == DATA_OK; i++) {
    const CocoImage *im = &ds->images[i];
    char *path = data_path_join(ds->image_dir, im->file_name);
    DataError e;
    int w = 0, h = 0;
    keep[i] = true;
    bool missing = false, bad = false;
    struct stat st;
    if (stat(path, &st) != 0) {
      snprintf(e.msg, sizeof e.msg, "%s: missing image file: %s (file_name \"%s\" is read from %s/)", path,
               strerror(errno), im->file_name, ds->image_dir);
      missing = bad = true;
    } else if (image_read_header(path, &w, &h, &e) != DATA_OK) {
      bad = true;
    } else if (w != im->width || h != im->height) {
      // Sides swapped: a camera's EXIF orientation tag, which an annotation tool applied and the
      // decoder (as the reference's PIL loader) does not: the pixels are read as stored.
      bool swapped = w == im->height && h == im->width;
      snprintf(e.msg, sizeof e.msg, "%s: image is %dx%d but the annotation file says %dx%d%s", path, w, h, im->width,
               im->height,
               swapped ? ": width and height are swapped, as when the file's EXIF orientation tag rotates it on "
                         "display (pixels are read as stored): store it upright (e.g. ImageMagick's -auto-orient)"
                       : "");
      bad = true;
    }
    if (bad) {
      if (missing) ds->stats.missing_images++;
      else ds->stats.corrupt_images++;
      if (policy == BAD_INPUT_FAIL) {
        rc = data_error(err, "%s (image id %lld in %s)", e.msg, (long long)im->id, ds->ann_path);
      } else {
        data_warn(warnings, "%s (image id %lld) - skipped with its %d annotations", e.msg, (long long)im->id,
                  im->n_anns);
        keep[i] = false;
        dropped = true;
        ds->stats.skipped_images++;
      }
    }
    free(path);
  }
  if (rc == DATA_OK && dropped) remove_images(ds, keep);
  free(keep);
  return rc;
}

static int cmp_image_file(const void *a, const void *b) {
  const CocoImage *x = *(CocoImage *const *)a, *y = *(CocoImage *const *)b;
  int c = strcmp(x->file_name, y->file_name);
  return c ? c : (x->id > y->id) - (x->id < y->id);
}

// One file under two image ids (an image counted twice, or a copy-paste slip): an error, or under
// skip the later id dropped with its annotations.
static int check_duplicate_files(Parser *p, CocoDataset *ds) {
  if (ds->n_images < 2) return DATA_OK;
  CocoImage **by_name = detr_malloc(sizeof(CocoImage *) * (size_t)ds->n_images, "images by file name");  // [n_images]
  for (int64_t i = 0; i < ds->n_images; i++) by_name[i] = &ds->images[i];
  qsort(by_name, (size_t)ds->n_images, sizeof *by_name, cmp_image_file);
  bool *keep = NULL;
  int rc = DATA_OK;
  for (int64_t i = 1; i < ds->n_images && rc == DATA_OK; i++) {
    const CocoImage *a = by_name[i - 1], *b = by_name[i];
    if (strcmp(a->file_name, b->file_name)) continue;
    ds->stats.duplicate_files++;
    if (!bad_item(p, "%s: image ids %lld and %lld both name the file %s: one picture counted twice", p->path,
                  (long long)a->id, (long long)b->id, b->file_name)) {
      rc = DATA_ERROR;
      break;
    }
    if (!keep) {
      keep = detr_malloc(sizeof(bool) * (size_t)ds->n_images, "image keep flags");  // [n_images]
      for (int64_t k = 0; k < ds->n_images; k++) keep[k] = true;
    }
    keep[b - ds->images] = false;
    ds->stats.skipped_images++;
  }
  if (rc == DATA_OK && keep) remove_images(ds, keep);
  free(keep);
  free(by_name);
  return rc;
}

// Boxes written as [x0, y0, x1, y1]: read as COCO's [x, y, width, height], many reach past their
// image (then clipped: a model trained on them learns wrong boxes in silence), while read as
// corners every one fits. An error under either policy: the whole file is in the wrong format.
static int check_box_format(const CocoDataset *ds, DataError *err) {
  int64_t boxes = 0, past = 0, fit_as_corners = 0;
  for (int64_t i = 0; i < ds->n_anns; i++) {
    const CocoAnn *a = &ds->anns[i];
    if (a->iscrowd) continue;
    const CocoImage *im = &ds->images[a->image_index];
    double x = a->bbox[0], y = a->bbox[1], w = a->bbox[2], h = a->bbox[3];
    boxes++;
    past += x + w > im->width + 1.0 || y + h > im->height + 1.0;
    fit_as_corners += w > x && h > y && w <= im->width + 1.0 && h <= im->height + 1.0;
  }
  if (boxes < 4 || past * 5 < boxes || fit_as_corners * 100 < boxes * 95) return DATA_OK;
  return data_error(
      err,
      "%s: %lld of %lld boxes (%.0f%%) reach past their image read as COCO's [x, y, width, height], "
      "and %lld fit it read as [x0, y0, x1, y1]: the boxes look like corners. Write each bbox as [x0, y0, "
      "x1 - x0, y1 - y0]",
      ds->ann_path, (long long)past, (long long)boxes, 100.0 * (double)past / (double)boxes, (long long)fit_as_corners);
}

void coco_print_stats(const CocoDataset *ds, FILE *f) {
  const CocoStats *s = &ds->stats;
  fprintf(f, "%s: %lld images, %lld annotations (%lld crowd), %lld categories, %lld images without annotations",
          ds->ann_path, (long long)s->images, (long long)s->annotations, (long long)s->crowd_annotations,
          (long long)s->categories, (long long)s->images_without_annotations);
  if (s->clamped_boxes) fprintf(f, ", %lld boxes clipped to their image", (long long)s->clamped_boxes);
  if (s->skipped_annotations || s->skipped_images || s->malformed_items || s->duplicate_ids) {
    fprintf(f, "; skipped %lld images and %lld annotations:", (long long)s->skipped_images,
            (long long)s->skipped_annotations);
    const struct {
      const char *what;
      int64_t n;
    } kinds[] = {{"malformed items", s->malformed_items},         {"duplicate ids", s->duplicate_ids},
                 {"unknown image ids", s->unknown_image_ids},     {"unknown category ids", s->unknown_category_ids},
                 {"empty or negative boxes", s->zero_size_boxes}, {"out-of-image boxes", s->out_of_image_boxes},
                 {"missing image files", s->missing_images},      {"corrupt images", s->corrupt_images},
                 {"files named twice", s->duplicate_files}};
    const char *sep = " ";
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
      if (!kinds[k].n) continue;
      fprintf(f, "%s%lld %s", sep, (long long)kinds[k].n, kinds[k].what);
      sep = ", ";
    }
  }
  fputc('\n', f);
}

int coco_open(const CocoOpenConfig *cfg, CocoDataset **out, DataError *err) {
  *out = NULL;
  DETR_CHECK(cfg->ann_path, "coco_open: no annotation path");
  DETR_CHECK(!cfg->check_images || cfg->image_dir, "coco_open: check_images needs an image folder");
  CocoDataset *ds = detr_calloc(1, sizeof(CocoDataset), "dataset");
  ds->ann_path = detr_strdup(cfg->ann_path, "annotation path");
  ds->image_dir = cfg->image_dir ? detr_strdup(cfg->image_dir, "image folder") : NULL;
  ds->contiguous_labels = cfg->contiguous_labels;
  DataError local;
  if (!err) err = &local;
  err->msg[0] = '\0';
  Parser p = {.path = cfg->ann_path,
              .policy = cfg->policy,
              .err = err,
              .stats = &ds->stats,
              .categories_only = cfg->categories_only};
  int rc = parse_file(&p);
  if (rc == DATA_OK) rc = build_dataset(&p, ds);
  if (rc == DATA_OK) rc = check_duplicate_files(&p, ds);
  if (rc == DATA_OK) rc = check_box_format(ds, err);
  free(p.images);
  free(p.anns);
  free(p.cats);
  ds->strings = p.pool;  // names point into it
  if (rc == DATA_OK && cfg->check_images) rc = check_images(ds, cfg->policy, &p.warnings, err);
  if (rc != DATA_OK) {
    coco_free(ds);
    return DATA_ERROR;
  }
  CocoStats *s = &ds->stats;
  s->images = ds->n_images;
  s->annotations = ds->n_anns;
  s->categories = ds->n_categories;
  for (int64_t i = 0; i < ds->n_anns; i++) s->crowd_annotations += ds->anns[i].iscrowd;
  for (int64_t i = 0; i < ds->n_images; i++) s->images_without_annotations += ds->images[i].n_anns == 0;
  if (!cfg->quiet) {
    fflush(stdout);
    fprintf(stderr, "detr: ");
    coco_print_stats(ds, stderr);
  }
  *out = ds;
  return DATA_OK;
}

void coco_free(CocoDataset *ds) {
  if (!ds) return;
  free(ds->ann_path);
  free(ds->image_dir);
  free(ds->images);
  free(ds->anns);
  free(ds->categories);
  free(ds->label_of_category);
  free(ds->strings);
  free(ds);
}

// --- samples -----------------------------------------------------------------------------------

int coco_load_sample(const CocoDataset *ds, int64_t index, Image *img, Target *target, DataError *err) {
  DETR_CHECK(ds->image_dir, "coco_load_sample: the dataset was opened without an image folder");
  DETR_CHECK(index >= 0 && index < ds->n_images, "coco_load_sample: index %lld of %lld", (long long)index,
             (long long)ds->n_images);
  image_free(img);
  target_clear(target);
  const CocoImage *im = &ds->images[index];
  char *path = data_path_join(ds->image_dir, im->file_name);
  DataError e;
  int rc = image_decode_file(path, img, &e);
  free(path);
  if (rc != DATA_OK) return data_error(err, "%s (image id %lld in %s)", e.msg, (long long)im->id, ds->ann_path);
  // ConvertCocoPolysToMask, in float32 like the reference's tensors.
  float w = (float)img->w, h = (float)img->h;
  for (int k = 0; k < im->n_anns; k++) {
    const CocoAnn *a = &ds->anns[im->first_ann + k];
    if (a->iscrowd) continue;
    float b[4] = {(float)a->bbox[0], (float)a->bbox[1], (float)a->bbox[2], (float)a->bbox[3]};
    b[2] += b[0];
    b[3] += b[1];
    b[0] = fminf(fmaxf(b[0], 0.0f), w);
    b[2] = fminf(fmaxf(b[2], 0.0f), w);
    b[1] = fminf(fmaxf(b[1], 0.0f), h);
    b[3] = fminf(fmaxf(b[3], 0.0f), h);
    if (!(b[3] > b[1] && b[2] > b[0])) continue;
    target_push(target, b, coco_label_of(ds, a->category_id));
  }
  return DATA_OK;
}
