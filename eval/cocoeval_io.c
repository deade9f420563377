// Streaming readers for cocoeval: an instances JSON (plain or gzip) and a results JSON, read
// through YAJL callbacks that keep only the fields COCOeval reads; everything else (segmentation
// polygons and RLEs, captions, licenses) is skipped as it streams past, so memory stays far below
// the file size. Not datasets/coco.h: that reader prepares training data (it drops or fails
// zero-size and out-of-image boxes and fills a missing area with w * h), while COCOeval evaluates
// every annotation exactly as the file states it.
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yajl/yajl_parse.h>

#include "datasets/coco.h"  // the limits on instances files (COCO_MAX_*), applied here too
#include "datasets/json_stream.h"
#include "core/error.h"
#include "kernels/common.h"  // DETR_MAX_JSON_DEPTH
#include "eval/cocoeval.h"

typedef enum { SEC_NONE, SEC_IMAGES, SEC_ANNS, SEC_CATS, SEC_RESULTS, SEC_COUNT } Section;
static const char *const SECTION_NAME[SEC_COUNT] = {"", "images", "annotations", "categories", "detection"};

typedef enum {
  F_ID,
  F_IMAGE_ID,
  F_CATEGORY_ID,
  F_WIDTH,
  F_HEIGHT,
  F_BBOX,
  F_AREA,
  F_ISCROWD,
  F_IGNORE,
  F_SCORE,
  F_COUNT,
  F_NONE = -1
} Field;
static const char *const FIELD_NAME[F_COUNT] = {"id",   "image_id", "category_id", "width",  "height",
                                                "bbox", "area",     "iscrowd",     "ignore", "score"};
#define BIT(f) (1u << (f))
// The keys each section reads and those it requires. Results' id, area and iscrowd are not read:
// COCO.loadRes overwrites them (id = position + 1, area = w * h, iscrowd = 0).
static const uint32_t READS[SEC_COUNT] = {
    [SEC_IMAGES] = BIT(F_ID) | BIT(F_WIDTH) | BIT(F_HEIGHT),
    [SEC_ANNS] =
        BIT(F_ID) | BIT(F_IMAGE_ID) | BIT(F_CATEGORY_ID) | BIT(F_BBOX) | BIT(F_AREA) | BIT(F_ISCROWD) | BIT(F_IGNORE),
    [SEC_CATS] = BIT(F_ID),
    [SEC_RESULTS] = BIT(F_IMAGE_ID) | BIT(F_CATEGORY_ID) | BIT(F_BBOX) | BIT(F_SCORE),
};
static const uint32_t REQUIRES[SEC_COUNT] = {
    [SEC_IMAGES] = BIT(F_ID),
    [SEC_ANNS] = BIT(F_ID) | BIT(F_IMAGE_ID) | BIT(F_CATEGORY_ID) | BIT(F_BBOX) | BIT(F_AREA) | BIT(F_ISCROWD),
    [SEC_CATS] = BIT(F_ID),
    [SEC_RESULTS] = BIT(F_IMAGE_ID) | BIT(F_CATEGORY_ID) | BIT(F_BBOX) | BIT(F_SCORE),
};

typedef enum { V_NULL, V_BOOL, V_NUMBER, V_STRING, V_MAP, V_ARRAY } ValueKind;
static const char *const KIND_NAME[] = {"null", "a boolean", "a number", "a string", "an object", "an array"};

typedef struct {
  const char *path;
  bool results;    // a results array (else an instances object)
  int item_depth;  // containers open inside an item object: 3 for instances, 2 for results
  int depth;       // containers open (not counting skipped ones)
  int skip;        // > 0: inside a skipped value, this many containers deep
  bool skip_next;  // the next value belongs to a key that is not read
  Section section;
  uint32_t sections_seen;
  Field field;
  int64_t count[SEC_COUNT];  // items begun per section: the current one is count - 1
  int64_t items, max_items;  // items begun in all sections, and the limit for this file's size
  // The current item.
  uint32_t seen;
  int64_t ival[F_COUNT];
  double dval[F_COUNT];
  double bbox[4];
  int bbox_n;
  bool ignore_true;
  // Output.
  CocoEvalGt *gt;
  int64_t cap_images, cap_anns, cap_cats;
  CocoEvalDet *dets;
  int64_t n_dets, cap_dets;
  char *err;
  size_t err_cap;
  bool failed;
} Reader;

static void grow(void **buf, int64_t *cap, int64_t need, size_t elem) {
  if (need <= *cap) return;
  int64_t c = *cap ? *cap * 2 : 256;
  while (c < need) c *= 2;
  void *p = detr_realloc(*buf, (size_t)c * elem, "cocoeval items");
  *buf = p, *cap = c;
}

// "FILE: message" for the document; "FILE: annotations[17] (id 42): message" for an item.
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static int
fail(Reader *r, bool item, const char *fmt, ...) {
  int n = snprintf(r->err, r->err_cap, "%s: ", r->path);
  if (item && n >= 0 && (size_t)n < r->err_cap) {
    int64_t i = r->count[r->section] - 1;
    if (r->section == SEC_RESULTS) n += snprintf(r->err + n, r->err_cap - (size_t)n, "detection %lld", (long long)i);
    else n += snprintf(r->err + n, r->err_cap - (size_t)n, "%s[%lld]", SECTION_NAME[r->section], (long long)i);
    if (r->seen & BIT(F_ID) && (size_t)n < r->err_cap)
      n += snprintf(r->err + n, r->err_cap - (size_t)n, " (id %lld)", (long long)r->ival[F_ID]);
    if ((size_t)n < r->err_cap) n += snprintf(r->err + n, r->err_cap - (size_t)n, ": ");
  }
  if (n >= 0 && (size_t)n < r->err_cap) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err + n, r->err_cap - (size_t)n, fmt, ap);
    va_end(ap);
  }
  r->failed = true;
  return 0;  // stops YAJL
}

// JSON number text -> double. Python's float() and strtod both round correctly, so the values are
// the ones pycocotools computes with.
static int parse_number(Reader *r, const char *s, size_t len, double *out) {
  char buf[512];
  if (len >= sizeof buf) return fail(r, true, "'%s': number of %zu characters", FIELD_NAME[r->field], len);
  memcpy(buf, s, len);
  buf[len] = 0;
  *out = strtod(buf, NULL);
  if (!isfinite(*out)) return fail(r, true, "'%s': %s is out of the double range", FIELD_NAME[r->field], buf);
  return 1;
}

// Integers as written, or integral floats (1.0, as Python's float ids compare equal to ints).
static int parse_int(Reader *r, const char *s, size_t len, int64_t *out) {
  char buf[512];
  if (len >= sizeof buf) return fail(r, true, "'%s': number of %zu characters", FIELD_NAME[r->field], len);
  memcpy(buf, s, len);
  buf[len] = 0;
  if (!strpbrk(buf, ".eE")) {
    errno = 0;
    long long v = strtoll(buf, NULL, 10);
    if (errno == ERANGE) return fail(r, true, "'%s': %s is out of the 64-bit integer range", FIELD_NAME[r->field], buf);
    *out = v;
    return 1;
  }
  double v = strtod(buf, NULL);
  if (!(v == floor(v) && fabs(v) < 9.2e18))
    return fail(r, true, "'%s' must be an integer, found %s", FIELD_NAME[r->field], buf);
  *out = (int64_t)v;
  return 1;
}

static int parse_field(Reader *r, Field f, ValueKind k, const char *s, size_t len, bool b) {
  switch (f) {
    case F_BBOX:
      if (k != V_ARRAY) return fail(r, true, "'bbox' must be an array of 4 numbers, found %s", KIND_NAME[k]);
      r->bbox_n = 0;
      return 1;
    case F_IGNORE: {  // never used (see CocoEvalGt.n_ignore_flags), so no type is wrong
      double v = 0;
      if (k == V_NUMBER && !parse_number(r, s, len, &v)) return 0;
      r->ignore_true = (k == V_BOOL && b) || (k == V_NUMBER && v != 0);
      return 1;
    }
    case F_ISCROWD: {
      double v = b;
      if (k == V_NUMBER && !parse_number(r, s, len, &v)) return 0;
      if ((k != V_NUMBER && k != V_BOOL) || (v != 0 && v != 1))
        return fail(r, true, "'iscrowd' must be 0 or 1, found %s", k == V_NUMBER ? "another number" : KIND_NAME[k]);
      r->ival[f] = v != 0;
      return 1;
    }
    case F_AREA:
    case F_SCORE:
      if (k != V_NUMBER) return fail(r, true, "'%s' must be a number, found %s", FIELD_NAME[f], KIND_NAME[k]);
      return parse_number(r, s, len, &r->dval[f]);
    default:
      if (k != V_NUMBER) return fail(r, true, "'%s' must be an integer, found %s", FIELD_NAME[f], KIND_NAME[k]);
      return parse_int(r, s, len, &r->ival[f]);
  }
}

static int field_value(Reader *r, ValueKind k, const char *s, size_t len, bool b) {
  Field f = r->field;
  int ok = parse_field(r, f, k, s, len, b);
  if (ok) r->seen |= BIT(f);  // after parsing: an error message shows only ids read
  return ok;
}

static int finish_item(Reader *r) {
  uint32_t missing = REQUIRES[r->section] & ~r->seen;
  for (int f = 0; f < F_COUNT; f++)
    if (missing & BIT(f)) return fail(r, true, "missing '%s'", FIELD_NAME[f]);
  CocoEvalGt *gt = r->gt;
  switch (r->section) {
    case SEC_IMAGES:
      grow((void **)&gt->images, &r->cap_images, gt->n_images + 1, sizeof(CocoEvalImage));
      gt->images[gt->n_images++] = (CocoEvalImage){
          .id = r->ival[F_ID],
          .width = r->seen & BIT(F_WIDTH) ? r->ival[F_WIDTH] : 0,
          .height = r->seen & BIT(F_HEIGHT) ? r->ival[F_HEIGHT] : 0,
      };
      break;
    case SEC_ANNS: {
      grow((void **)&gt->anns, &r->cap_anns, gt->n_anns + 1, sizeof(CocoEvalGtAnn));
      CocoEvalGtAnn *a = &gt->anns[gt->n_anns++];
      *a = (CocoEvalGtAnn){.id = r->ival[F_ID],
                           .image_id = r->ival[F_IMAGE_ID],
                           .category_id = r->ival[F_CATEGORY_ID],
                           .area = r->dval[F_AREA],
                           .iscrowd = r->ival[F_ISCROWD] != 0};
      memcpy(a->bbox, r->bbox, sizeof a->bbox);
      gt->n_ignore_flags += r->seen & BIT(F_IGNORE) && r->ignore_true;
      break;
    }
    case SEC_CATS:
      grow((void **)&gt->category_ids, &r->cap_cats, gt->n_categories + 1, sizeof(int64_t));
      gt->category_ids[gt->n_categories++] = r->ival[F_ID];
      break;
    case SEC_RESULTS: {
      grow((void **)&r->dets, &r->cap_dets, r->n_dets + 1, sizeof(CocoEvalDet));
      CocoEvalDet *d = &r->dets[r->n_dets++];
      *d = (CocoEvalDet){
          .image_id = r->ival[F_IMAGE_ID], .category_id = r->ival[F_CATEGORY_ID], .score = r->dval[F_SCORE]};
      memcpy(d->bbox, r->bbox, sizeof d->bbox);
      break;
    }
    default: break;
  }
  return 1;
}

// Every scalar and every container start comes here: its place (r->depth) says what it must be.
static int value(Reader *r, ValueKind k, const char *s, size_t len, bool b) {
  bool opens = k == V_MAP || k == V_ARRAY;
  if (opens && r->depth + r->skip >= DETR_MAX_JSON_DEPTH)
    return fail(r, false, "JSON nested deeper than the limit of %d levels", DETR_MAX_JSON_DEPTH);
  if (r->skip) {
    r->skip += opens;
    return 1;
  }
  if (r->skip_next) {
    r->skip_next = false;
    r->skip = opens;
    return 1;
  }
  int d = r->depth;
  if (d == r->item_depth && opens && r->field == F_IGNORE) {  // unused: any value will do
    r->skip = 1;
    return 1;
  }
  r->depth += opens;
  if (d == 0) {
    if (r->results && k != V_ARRAY) return fail(r, false, "expected an array of detections, found %s", KIND_NAME[k]);
    if (!r->results && k != V_MAP)
      return fail(r, false, "expected an object with images, annotations and categories, found %s", KIND_NAME[k]);
    if (r->results) r->section = SEC_RESULTS;
    return 1;
  }
  if (d == r->item_depth - 2) {  // instances only: the value of "images", "annotations" or "categories"
    if (k != V_ARRAY) return fail(r, false, "'%s' must be an array, found %s", SECTION_NAME[r->section], KIND_NAME[k]);
    return 1;
  }
  if (d == r->item_depth - 1) {  // an item
    if (++r->items > r->max_items)
      return fail(r, false,
                  "more than %lld items, the limit for a file of this size (%d per byte on disk, at least %d; a gzip "
                  "bomb?)",
                  (long long)r->max_items, JSON_MAX_ITEMS_PER_BYTE, JSON_MIN_ITEM_BUDGET);
    r->count[r->section]++;
    r->seen = 0;
    r->ignore_true = false;
    if (k != V_MAP) return fail(r, true, "expected an object, found %s", KIND_NAME[k]);
    return 1;
  }
  if (d == r->item_depth) return field_value(r, k, s, len, b);
  // Inside "bbox" (any other nested value is skipped).
  if (k != V_NUMBER) return fail(r, true, "'bbox' must hold 4 numbers, found %s", KIND_NAME[k]);
  if (r->bbox_n == 4) return fail(r, true, "'bbox' has more than 4 numbers");
  r->field = F_BBOX;
  return parse_number(r, s, len, &r->bbox[r->bbox_n++]);
}

static int cb_null(void *ctx) { return value(ctx, V_NULL, NULL, 0, false); }
static int cb_boolean(void *ctx, int b) { return value(ctx, V_BOOL, NULL, 0, b != 0); }
static int cb_number(void *ctx, const char *s, size_t len) { return value(ctx, V_NUMBER, s, len, false); }
static int cb_string(void *ctx, const unsigned char *s, size_t len) { return value(ctx, V_STRING, NULL, 0, false); }
static int cb_start_map(void *ctx) { return value(ctx, V_MAP, NULL, 0, false); }
static int cb_start_array(void *ctx) { return value(ctx, V_ARRAY, NULL, 0, false); }

static int cb_key(void *ctx, const unsigned char *key, size_t len) {
  Reader *r = ctx;
  if (r->skip) return 1;
  if (!r->results && r->depth == 1) {  // a key of the instances object
    Section s = SEC_NONE;
    for (int i = SEC_IMAGES; i <= SEC_CATS; i++)
      if (strlen(SECTION_NAME[i]) == len && !memcmp(SECTION_NAME[i], key, len)) s = (Section)i;
    if (s == SEC_NONE) {
      r->skip_next = true;
      return 1;
    }
    if (r->sections_seen & BIT(s)) return fail(r, false, "'%s' appears twice", SECTION_NAME[s]);
    r->sections_seen |= BIT(s);
    r->section = s;
    return 1;
  }
  // A key of an item (the only other objects not skipped).
  r->field = F_NONE;
  for (int f = 0; f < F_COUNT; f++)
    if (READS[r->section] & BIT(f) && strlen(FIELD_NAME[f]) == len && !memcmp(FIELD_NAME[f], key, len))
      r->field = (Field)f;
  if (r->field == F_NONE) r->skip_next = true;
  return 1;
}

static int cb_end(void *ctx) {  // end of a map or an array: YAJL has checked the nesting
  Reader *r = ctx;
  if (r->skip) {
    r->skip--;
    return 1;
  }
  int d = --r->depth;
  if (d == r->item_depth) {  // "bbox" closed
    r->field = F_BBOX;
    if (r->bbox_n != 4) return fail(r, true, "'bbox' must hold 4 numbers, found %d", r->bbox_n);
    return 1;
  }
  if (d == r->item_depth - 1) return finish_item(r);
  if (d == r->item_depth - 2) r->section = SEC_NONE;  // instances: a section's array closed
  return 1;
}

static int parse_file(Reader *r) {
  static const yajl_callbacks callbacks = {cb_null,      cb_boolean, NULL,   NULL,           cb_number, cb_string,
                                           cb_start_map, cb_key,     cb_end, cb_start_array, cb_end};
  r->max_items = json_item_budget(r->path);
  JsonReader jr = {.path = r->path,
                   .callbacks = &callbacks,
                   .ctx = r,
                   .expect = r->results ? "a JSON array of detections" : "a COCO instances file",
                   .check_utf8 = true};
  // The file's own failures are worded by json_read_file; an item's by the callbacks (r->err).
  return json_read_file(&jr, NULL, r->err, r->err_cap) || r->failed ? -1 : 0;
}

typedef struct {
  int64_t id, index;
} IdAt;

static int cmp_id_at(const void *a, const void *b) {
  const IdAt *x = a, *y = b;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return (x->index > y->index) - (x->index < y->index);
}

// pycocotools keys images, annotations and categories by id in dicts, so a repeated id silently
// drops an item: an error here instead. v holds (id, index) and is sorted in place.
static int check_unique(const char *path, const char *section, IdAt *v, int64_t n, char *err, size_t err_cap) {
  qsort(v, (size_t)n, sizeof(IdAt), cmp_id_at);
  for (int64_t i = 1; i < n; i++)
    if (v[i].id == v[i - 1].id) {
      snprintf(err, err_cap, "%s: %s[%lld] repeats the id %lld of %s[%lld]", path, section, (long long)v[i].index,
               (long long)v[i].id, section, (long long)v[i - 1].index);
      return -1;
    }
  return 0;
}

int coco_eval_read_gt(const char *path, CocoEvalGt *gt, char *err, size_t err_cap) {
  memset(gt, 0, sizeof *gt);
  Reader r = {.path = path, .item_depth = 3, .gt = gt, .err = err, .err_cap = err_cap, .field = F_NONE};
  int rc = parse_file(&r);
  for (int s = SEC_IMAGES; rc == 0 && s <= SEC_CATS; s++)
    if (!(r.sections_seen & BIT(s))) {
      snprintf(err, err_cap, "%s: no '%s' array (not a COCO instances file?)", path, SECTION_NAME[s]);
      rc = -1;
    }
  if (rc == 0) {
    int64_t n = gt->n_images > gt->n_anns ? gt->n_images : gt->n_anns;
    n = n > gt->n_categories ? n : gt->n_categories;
    IdAt *v = detr_malloc((size_t)(n ? n : 1) * sizeof(IdAt), "cocoeval ids");
    for (int64_t i = 0; i < gt->n_images; i++) v[i] = (IdAt){gt->images[i].id, i};
    rc = check_unique(path, "images", v, gt->n_images, err, err_cap);
    for (int64_t i = 0; i < gt->n_anns; i++) v[i] = (IdAt){gt->anns[i].id, i};
    rc = rc ? rc : check_unique(path, "annotations", v, gt->n_anns, err, err_cap);
    for (int64_t i = 0; i < gt->n_categories; i++) v[i] = (IdAt){gt->category_ids[i], i};
    rc = rc ? rc : check_unique(path, "categories", v, gt->n_categories, err, err_cap);
    free(v);
  }
  if (rc) {
    coco_eval_free_gt(gt);
    return -1;
  }
  return 0;
}

void coco_eval_free_gt(CocoEvalGt *gt) {
  free(gt->images);
  free(gt->anns);
  free(gt->category_ids);
  memset(gt, 0, sizeof *gt);
}

int coco_eval_read_results(const char *path, CocoEvalDet **dets, int64_t *n_dets, char *err, size_t err_cap) {
  Reader r = {.path = path, .results = true, .item_depth = 2, .err = err, .err_cap = err_cap, .field = F_NONE};
  *dets = NULL, *n_dets = 0;
  if (parse_file(&r)) {
    free(r.dets);
    return -1;
  }
  *dets = r.dets, *n_dets = r.n_dets;
  return 0;
}
