// COCO bbox evaluation with the semantics of pycocotools' COCOeval (iouType='bbox', default
// Params: useCats=1, all GT images and categories, IoU .50:.05:.95, 101 recall points, maxDets
// 1/10/100, areas all/small/medium/large), down to its quirks, so that the 12 numbers are the ones
// pycocotools prints (tools/check_cocoeval.py compares them on random data). Readers for an
// instances JSON (plain or .json.gz, streamed: segmentations are skipped, never built) and a
// results JSON (an array of {image_id, category_id, bbox, score}) live in cocoeval_io.c.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
  int64_t id;
  int64_t width, height;  // as the file states them (0 when absent); not used by the bbox metrics
} CocoEvalImage;

typedef struct {
  int64_t id, image_id, category_id;
  double bbox[4];  // x, y, w, h
  double area;     // as the file states it (COCO: the segmentation's area); decides the area range
  bool iscrowd;
} CocoEvalGtAnn;

typedef struct {
  CocoEvalImage *images;  // file order
  int64_t n_images;
  CocoEvalGtAnn *anns;  // file order
  int64_t n_anns;
  int64_t *category_ids;  // file order
  int64_t n_categories;
  // Annotations carrying a true "ignore" field. pycocotools' _prepare() overwrites that field with
  // iscrowd before evaluating, so it changes nothing here either; counted so the CLI can say so.
  int64_t n_ignore_flags;
} CocoEvalGt;

typedef struct {
  int64_t image_id, category_id;
  double bbox[4];  // x, y, w, h; the area is w * h (as COCO.loadRes sets it)
  double score;
} CocoEvalDet;

enum {
  COCO_AP,
  COCO_AP50,
  COCO_AP75,
  COCO_APS,
  COCO_APM,
  COCO_APL,
  COCO_AR1,
  COCO_AR10,
  COCO_AR100,
  COCO_ARS,
  COCO_ARM,
  COCO_ARL,
  COCO_N_STATS
};
extern const char *const coco_stat_names[COCO_N_STATS];  // "AP", "AP50", ..., "ARl"

typedef struct {
  double stats[COCO_N_STATS];  // summarize()'s order; -1 where no category had anything to average
  // Left out of the evaluation, as pycocotools leaves them out (the caller may warn):
  int64_t dets_unknown_category;  // detections whose category is not in the GT's categories
  int64_t gts_unknown_image;      // GT annotations of an image the GT does not list
  int64_t gts_unknown_category;   // GT annotations of a category the GT does not list
  // GT annotations with id 0: pycocotools stores the matched GT's id as the match flag, so a
  // detection matched to one counts as a false positive. Replicated; counted so callers can warn.
  int64_t gts_id_zero;
} CocoEvalResult;

// Evaluates dets against gt. Fails (returns -1, err set; nothing else is an error) when a
// detection names an image the GT does not list (pycocotools asserts this), a detection's box or
// score is not finite, or the GT repeats an image id. Messages name the item ("detection 17: ...")
// but not the file: callers prefix it.
int coco_evaluate(const CocoEvalGt *gt, const CocoEvalDet *dets, int64_t n_dets, CocoEvalResult *out, char *err,
                  size_t err_cap);

// The 12 lines exactly as COCOeval.summarize() prints them.
void coco_print_summary(const CocoEvalResult *r, FILE *f);
// {"AP": ..., ..., "ARl": ...} with round-trip precision, written to a temp file and renamed.
int coco_write_stats_json(const char *path, const CocoEvalResult *r, char *err, size_t err_cap);

// --- cocoeval_io.c ---
// Reads images (id; width, height), annotations (id, image_id, category_id, bbox, area, iscrowd;
// ignore) and categories (id) of an instances JSON, plain or gzip. Everything else is skipped as
// it streams past. Malformed JSON, missing or mistyped fields, repeated image, annotation or
// category ids are errors naming the file and the item. Returns 0, or -1 with err set and *gt
// empty.
int coco_eval_read_gt(const char *path, CocoEvalGt *gt, char *err, size_t err_cap);
void coco_eval_free_gt(CocoEvalGt *gt);
// Reads a results JSON: an array of objects with image_id, category_id, bbox [x, y, w, h] and
// score (other keys are skipped). Detection i is the file's item i. Returns 0, or -1 with err set.
int coco_eval_read_results(const char *path, CocoEvalDet **dets, int64_t *n_dets, char *err, size_t err_cap);
