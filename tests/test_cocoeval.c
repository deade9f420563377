// COCO evaluation: hand-computed cases of pycocotools' semantics (101-point interpolation, crowd
// regions, area ranges, categories without GT, maxDets, tie order, its quirks), a fixed case with
// the numbers pycocotools printed for it, the readers' errors and the `detr cocoeval` verb.
// tools/check_cocoeval.py compares with pycocotools itself on random data.
#define _POSIX_C_SOURCE 200809L  // mkdtemp
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "cli/commands.h"
#include "core/runtime.h"
#include "eval/cocoeval.h"

// --- helpers -------------------------------------------------------------------------------------

static char tmp[64];  // this test's scratch folder (each test runs in its own process)
static const char *const FILES[] = {"gt.json", "res.json", "out.json", "out.json.tmp", "gt.json.gz"};

static void setup_tmp(void) {
  snprintf(tmp, sizeof tmp, "/tmp/detr_test_cocoeval_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmp));
}

static const char *at(const char *name) {
  static char bufs[4][256];
  static int next;
  char *b = bufs[next++ % 4];
  snprintf(b, 256, "%s/%s", tmp, name);
  return b;
}

static void teardown_tmp(void) {
  for (size_t i = 0; i < sizeof FILES / sizeof FILES[0]; i++) remove(at(FILES[i]));
  rmdir(tmp);
}

// Writes JSON given with single quotes (readable in C) as real JSON.
static void write_json(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  for (const char *c = text; *c; c++) fputc(*c == '\'' ? '"' : *c, f);
  ck_assert_int_eq(fclose(f), 0);
}

// Reads gt.json and res.json written from these texts and evaluates; every step must succeed.
static CocoEvalResult evaluate(const char *gt_json, const char *res_json) {
  char err[1024] = "";
  write_json(at("gt.json"), gt_json);
  write_json(at("res.json"), res_json);
  CocoEvalGt gt;
  CocoEvalDet *dets;
  int64_t n;
  ck_assert_msg(coco_eval_read_gt(at("gt.json"), &gt, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(coco_eval_read_results(at("res.json"), &dets, &n, err, sizeof err) == 0, "%s", err);
  CocoEvalResult r;
  ck_assert_msg(coco_evaluate(&gt, dets, n, &r, err, sizeof err) == 0, "%s", err);
  free(dets);
  coco_eval_free_gt(&gt);
  return r;
}

#define NA -1.0  // summarize() of nothing
static void expect_stats(const CocoEvalResult *r, const double want[COCO_N_STATS]) {
  for (int s = 0; s < COCO_N_STATS; s++)
    ck_assert_msg(fabs(r->stats[s] - want[s]) <= 1e-12, "%s = %.17g, expected %.17g", coco_stat_names[s], r->stats[s],
                  want[s]);
}

// The error of reading gt_json as an instances file (must fail).
static const char *gt_error(const char *gt_json) {
  static char err[1024];
  write_json(at("gt.json"), gt_json);
  CocoEvalGt gt;
  ck_assert_int_eq(coco_eval_read_gt(at("gt.json"), &gt, err, sizeof err), -1);
  ck_assert_ptr_null(gt.anns);
  return err;
}

static const char *results_error(const char *res_json) {
  static char err[1024];
  write_json(at("res.json"), res_json);
  CocoEvalDet *dets;
  int64_t n;
  ck_assert_int_eq(coco_eval_read_results(at("res.json"), &dets, &n, err, sizeof err), -1);
  ck_assert_ptr_null(dets);
  return err;
}

#define ck_assert_contains(haystack, needle) \
  ck_assert_msg(strstr((haystack), (needle)) != NULL, "'%s' does not contain '%s'", (haystack), (needle))

// AP over the 101 recall thresholds when recall points <= 0.5 (51 of them) have precision p_lo and
// the 50 above have p_hi, the same at every IoU threshold.
static double ap_halves(double p_lo, double p_hi) { return (51 * p_lo + 50 * p_hi) / 101; }

// --- hand-computed cases -------------------------------------------------------------------------

START_TEST(perfect_detections) {
  // One box per area range in two categories, detected exactly: every number is 1 (precision
  // tp / (tp + fp + eps) is 1 - 2^-52, so not exactly).
  CocoEvalResult r = evaluate(
      "{'images': [{'id': 1, 'width': 400, 'height': 400}],"
      " 'annotations': ["
      "  {'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'area': 100, 'iscrowd': 0},"
      "  {'id': 2, 'image_id': 1, 'category_id': 2, 'bbox': [50, 50, 40, 40], 'area': 1600, 'iscrowd': 0},"
      "  {'id': 3, 'image_id': 1, 'category_id': 1, 'bbox': [100, 100, 150, 100], 'area': 15000, 'iscrowd': 0}],"
      " 'categories': [{'id': 1}, {'id': 2}]}",
      "[{'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'score': 0.5},"
      " {'image_id': 1, 'category_id': 2, 'bbox': [50, 50, 40, 40], 'score': 0.6},"
      " {'image_id': 1, 'category_id': 1, 'bbox': [100, 100, 150, 100], 'score': 0.7}]");
  // AR1 per category: category 1 has two GTs and one detection per image counts: 1/2; category 2: 1.
  expect_stats(&r, (double[]){1, 1, 1, 1, 1, 1, 0.75, 1, 1, 1, 1, 1});
  ck_assert_double_eq_tol(r.stats[COCO_AP], 1.0, 1e-15);
}
END_TEST

static const char *ONE_GT =
    "{'images': [{'id': 1, 'width': 100, 'height': 100}],"
    " 'annotations': [{'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'area': 100, 'iscrowd': 0}],"
    " 'categories': [{'id': 1}]}";

START_TEST(false_positive_above_true_positive) {
  // Ranked FP, TP: precision [0, 1/2] becomes [1/2, 1/2] once made non-increasing; recall reaches 1
  // at the second detection, so every recall threshold reads 1/2. Only small boxes: APm, APl -1.
  CocoEvalResult r = evaluate(ONE_GT,
                              "[{'image_id': 1, 'category_id': 1, 'bbox': [50, 50, 10, 10], 'score': 0.9},"
                              " {'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'score': 0.8}]");
  // AR1: the top detection alone is the false positive.
  expect_stats(&r, (double[]){0.5, 0.5, 0.5, 0.5, NA, NA, 0, 1, 1, 1, NA, NA});

  // Two GTs ranked TP, FP, TP: precision [1, 1/2, 2/3] -> [1, 2/3, 2/3], recall [1/2, 1/2, 1].
  r = evaluate(
      "{'images': [{'id': 1}],"
      " 'annotations': ["
      "  {'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'area': 100, 'iscrowd': 0},"
      "  {'id': 2, 'image_id': 1, 'category_id': 1, 'bbox': [20, 0, 10, 10], 'area': 100, 'iscrowd': 0}],"
      " 'categories': [{'id': 1}]}",
      "[{'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'score': 0.9},"
      " {'image_id': 1, 'category_id': 1, 'bbox': [50, 50, 10, 10], 'score': 0.8},"
      " {'image_id': 1, 'category_id': 1, 'bbox': [20, 0, 10, 10], 'score': 0.7}]");
  double ap = ap_halves(1 / (1 + DBL_EPSILON), 2 / (3 + DBL_EPSILON));
  expect_stats(&r, (double[]){ap, ap, ap, ap, NA, NA, 0.5, 1, 1, 1, NA, NA});
}
END_TEST

START_TEST(iou_thresholds) {
  // A detection with IoU 150 / 250 = 0.6, which equals numpy's .60 threshold (both are the double
  // nearest 0.6): a match at IoU >= threshold, so a true positive at .50, .55 and .60 and a false
  // positive above. AP = AR = 3/10, AP50 = 1, AP75 = 0.
  CocoEvalResult r = evaluate(
      "{'images': [{'id': 1}],"
      " 'annotations': [{'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 20, 10], 'area': 200, 'iscrowd': 0}],"
      " 'categories': [{'id': 1}]}",
      "[{'image_id': 1, 'category_id': 1, 'bbox': [5, 0, 20, 10], 'score': 0.9}]");
  double p = 0.3 / (1 + DBL_EPSILON);
  expect_stats(&r, (double[]){p, 1, 0, p, NA, NA, 0.3, 0.3, 0.3, 0.3, NA, NA});
}
END_TEST

START_TEST(recall_thresholds_are_numpy_linspace) {
  // 20 GTs; ranked 7 TPs, 5 FPs, 13 TPs. Precision made non-increasing is 1 up to recall 7/20 and
  // 20/25 after. np.linspace's recall thresholds are i * 0.01: the 36th, 35 * 0.01, is one ulp
  // above 7/20 = 0.35, so only 35 thresholds read 1 (i / 100 would give 36).
  char gt[8192], res[8192];
  int n = snprintf(gt, sizeof gt, "{'images': [{'id': 1}], 'categories': [{'id': 1}], 'annotations': [");
  for (int i = 0; i < 20; i++)
    n += snprintf(gt + n, sizeof gt - (size_t)n,
                  "%s{'id': %d, 'image_id': 1, 'category_id': 1, 'bbox': [%d, 0, 10, 10], 'area': 100, 'iscrowd': 0}",
                  i ? ", " : "", i + 1, 20 * i);
  snprintf(gt + n, sizeof gt - (size_t)n, "]}");
  n = snprintf(res, sizeof res, "[");
  for (int rank = 0; rank < 25; rank++) {
    int tp = rank < 7 ? rank : rank >= 12 ? rank - 5 : -1;  // the GT found at this rank, or an FP
    n += snprintf(res + n, sizeof res - (size_t)n,
                  "%s{'image_id': 1, 'category_id': 1, 'bbox': [%d, %d, 10, 10], 'score': %g}", rank ? ", " : "",
                  tp >= 0 ? 20 * tp : 20 * rank, tp >= 0 ? 0 : 100, 0.99 - rank * 0.01);
  }
  snprintf(res + n, sizeof res - (size_t)n, "]");
  CocoEvalResult r = evaluate(gt, res);
  double ap = (35 + 66 * (20 / (25 + DBL_EPSILON))) / 101;
  ck_assert_double_eq_tol(r.stats[COCO_AP], ap, 1e-12);
  ck_assert_double_eq_tol(r.stats[COCO_AR100], 1, 1e-12);
  ck_assert_double_eq_tol(r.stats[COCO_AR10], 0.35, 1e-12);  // 7 TPs, 3 FPs in the first 10
}
END_TEST

static const char *CROWD_GT =
    "{'images': [{'id': 1}],"
    " 'annotations': ["
    "  {'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 20, 20], 'area': 400, 'iscrowd': 0},"
    "  {'id': 2, 'image_id': 1, 'category_id': 1, 'bbox': [100, 100, 200, 200], 'area': 40000, 'iscrowd': %d}],"
    " 'categories': [{'id': 1}]}";
static const char *CROWD_RES =
    "[{'image_id': 1, 'category_id': 1, 'bbox': [110, 110, 10, 10], 'score': 0.9},"
    " {'image_id': 1, 'category_id': 1, 'bbox': [150, 150, 20, 20], 'score': 0.85},"
    " {'image_id': 1, 'category_id': 1, 'bbox': [200, 200, 30, 30], 'score': 0.8},"
    " {'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 20, 20], 'score': 0.7}]";

START_TEST(crowd_region_absorbs_detections) {
  char gt[1024];
  // Crowd: the three detections inside it match it (IoU = intersection / detection area = 1) and
  // are ignored, however many there are; the remaining TP gives AP 1. AR1 sees only the top
  // detection, an ignored one: 0.
  snprintf(gt, sizeof gt, CROWD_GT, 1);
  CocoEvalResult r = evaluate(gt, CROWD_RES);
  expect_stats(&r, (double[]){1, 1, 1, 1, NA, NA, 0, 1, 1, 1, NA, NA});
  // The same box as a regular GT: three false positives (IoU <= 0.0225) ranked before the TP,
  // precision 1/4 up to recall 1/2; the big GT is never found.
  snprintf(gt, sizeof gt, CROWD_GT, 0);
  r = evaluate(gt, CROWD_RES);
  double ap = ap_halves(1 / (4 + DBL_EPSILON), 0), q = 1 / (4 + DBL_EPSILON);
  // Small range: the big GT is ignored, the detections are not (unmatched, small): precision 1/4
  // at recall 1. Large: only the big GT counts and nothing finds it (the small detections are
  // outside the range, the TP is matched to a GT ignored there): AP 0, AR 0.
  expect_stats(&r, (double[]){ap, ap, ap, q, NA, 0, 0, 0.5, 0.5, 1, NA, 0});
}
END_TEST

START_TEST(area_ranges_use_the_annotation_area) {
  // A 50 x 50 box whose annotation area is 500 (a segmentation's): small, though w * h = 2500.
  // Its exact detection (area 2500) is a TP for small and ignored (matched to an out-of-range GT)
  // for medium, which has no GT: -1. A higher-scored 10 x 10 false positive counts for small and
  // all; a 100 x 100 one, higher still, is outside the small range and ignored there.
  CocoEvalResult r = evaluate(
      "{'images': [{'id': 1}],"
      " 'annotations': [{'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 50, 50], 'area': 500, 'iscrowd': 0}],"
      " 'categories': [{'id': 1}]}",
      "[{'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 50, 50], 'score': 0.9},"
      " {'image_id': 1, 'category_id': 1, 'bbox': [200, 200, 10, 10], 'score': 0.95},"
      " {'image_id': 1, 'category_id': 1, 'bbox': [300, 300, 100, 100], 'score': 0.99}]");
  double third = 1 / (3 + DBL_EPSILON), half = 1 / (2 + DBL_EPSILON);
  expect_stats(&r, (double[]){third, third, third, half, NA, NA, 0, 1, 1, 1, NA, NA});
  // Areas on a bound belong to both ranges ([0, 32^2] and [32^2, 96^2] are inclusive).
  r = evaluate(
      "{'images': [{'id': 1}],"
      " 'annotations': [{'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 32, 32], 'area': 1024,"
      "  'iscrowd': 0}],"
      " 'categories': [{'id': 1}]}",
      "[{'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 32, 32], 'score': 0.9}]");
  expect_stats(&r, (double[]){1, 1, 1, 1, 1, NA, 1, 1, 1, 1, 1, NA});
}
END_TEST

START_TEST(categories_without_gt_are_excluded) {
  // Category 2 has detections but no GT (-1, left out of the mean); category 3 has GT but no
  // detections (0, averaged in); category 4 has neither.
  CocoEvalResult r = evaluate(
      "{'images': [{'id': 1}],"
      " 'annotations': ["
      "  {'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'area': 100, 'iscrowd': 0},"
      "  {'id': 2, 'image_id': 1, 'category_id': 3, 'bbox': [50, 50, 10, 10], 'area': 100, 'iscrowd': 0}],"
      " 'categories': [{'id': 4}, {'id': 3}, {'id': 2}, {'id': 1}]}",
      "[{'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'score': 0.9},"
      " {'image_id': 1, 'category_id': 2, 'bbox': [0, 0, 10, 10], 'score': 0.8},"
      " {'image_id': 1, 'category_id': 7, 'bbox': [50, 50, 10, 10], 'score': 0.8}]");
  expect_stats(&r, (double[]){0.5, 0.5, 0.5, 0.5, NA, NA, 0.5, 0.5, 0.5, 0.5, NA, NA});
  ck_assert_int_eq(r.dets_unknown_category, 1);  // category 7 is not listed: left out
}
END_TEST

START_TEST(empty_results) {
  // No detections: categories with GT score 0, ranges without GT -1 (pycocotools itself cannot
  // load an empty list; this is what its accumulate() gives for no detections).
  CocoEvalResult r = evaluate(ONE_GT, "[]");
  expect_stats(&r, (double[]){0, 0, 0, 0, NA, NA, 0, 0, 0, 0, NA, NA});
  // No GT annotations at all: nothing to average anywhere.
  r = evaluate("{'images': [{'id': 1}], 'annotations': [], 'categories': [{'id': 1}]}", "[]");
  expect_stats(&r, (double[]){NA, NA, NA, NA, NA, NA, NA, NA, NA, NA, NA, NA});
}
END_TEST

START_TEST(max_detections_per_image) {
  // 150 detections on one image, the true positive ranked `rank` (1-based) by score.
  char res[40000];
  int ranks[] = {5, 120};
  for (int c = 0; c < 2; c++) {
    int n = snprintf(res, sizeof res, "[");
    for (int i = 1; i <= 150; i++)
      n += snprintf(res + n, sizeof res - (size_t)n,
                    "%s{'image_id': 1, 'category_id': 1, 'bbox': [%d, %d, 10, 10], 'score': %g}", i > 1 ? ", " : "",
                    i == ranks[c] ? 0 : 20 + i, i == ranks[c] ? 0 : 50, 1.0 - i / 1000.0);
    snprintf(res + n, sizeof res - (size_t)n, "]");
    CocoEvalResult r = evaluate(ONE_GT, res);
    if (ranks[c] == 5) {  // found by maxDets 10 and 100, precision 1/5
      double p = 1 / (5 + DBL_EPSILON);
      expect_stats(&r, (double[]){p, p, p, p, NA, NA, 0, 1, 1, 1, NA, NA});
    } else {  // beyond the 100 kept per image
      expect_stats(&r, (double[]){0, 0, 0, 0, NA, NA, 0, 0, 0, 0, NA, NA});
    }
  }
}
END_TEST

START_TEST(ties_keep_image_id_order) {
  // Two images (listed out of id order), one GT each, one detection each with the same score: the
  // stable sort across images puts image 1's first. FP then TP: precision [0, 1/2] -> 1/2 up to
  // recall 1/2; TP then FP: precision 1 up to recall 1/2.
  const char *gt =
      "{'images': [{'id': 2}, {'id': 1}],"
      " 'annotations': ["
      "  {'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'area': 100, 'iscrowd': 0},"
      "  {'id': 2, 'image_id': 2, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'area': 100, 'iscrowd': 0}],"
      " 'categories': [{'id': 1}]}";
  CocoEvalResult r = evaluate(gt,
                              "[{'image_id': 2, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'score': 0.5},"
                              " {'image_id': 1, 'category_id': 1, 'bbox': [50, 50, 10, 10], 'score': 0.5}]");
  double ap = ap_halves(1 / (2 + DBL_EPSILON), 0);
  expect_stats(&r, (double[]){ap, ap, ap, ap, NA, NA, 0.5, 0.5, 0.5, 0.5, NA, NA});
  r = evaluate(gt,
               "[{'image_id': 2, 'category_id': 1, 'bbox': [50, 50, 10, 10], 'score': 0.5},"
               " {'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'score': 0.5}]");
  ap = ap_halves(1 / (1 + DBL_EPSILON), 0);
  expect_stats(&r, (double[]){ap, ap, ap, ap, NA, NA, 0.5, 0.5, 0.5, 0.5, NA, NA});
}
END_TEST

START_TEST(pycocotools_quirks) {
  // "ignore": 1 is overwritten by iscrowd in COCOeval._prepare(): the GT still counts.
  CocoEvalResult r = evaluate(
      "{'images': [{'id': 1}],"
      " 'annotations': [{'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'area': 100, 'iscrowd': 0,"
      "  'ignore': 1}],"
      " 'categories': [{'id': 1}]}",
      "[{'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'score': 0.9}]");
  expect_stats(&r, (double[]){1, 1, 1, 1, NA, NA, 1, 1, 1, 1, NA, NA});
  // A GT with id 0: its match is stored as dtm = 0, read as "unmatched", so the exact detection is
  // a false positive (and the GT stays unfound).
  r = evaluate(
      "{'images': [{'id': 1}],"
      " 'annotations': [{'id': 0, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'area': 100, 'iscrowd': 0}],"
      " 'categories': [{'id': 1}]}",
      "[{'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 10, 10], 'score': 0.9}]");
  expect_stats(&r, (double[]){0, 0, 0, 0, NA, NA, 0, 0, 0, 0, NA, NA});
  ck_assert_int_eq(r.gts_id_zero, 1);
}
END_TEST

// --- a fixed case against pycocotools ------------------------------------------------------------

// Crowd region, ignore field, areas on the range bounds and below w * h, tied scores, a category
// without GT (5), one with detections of an image without annotations (300), images and categories
// listed out of order. pycocotools 2.0.11 (numpy 2.4) gave FIXED_STATS (its ev.stats, repr).
static const char *FIXED_GT =
    "{'images': [{'id': 42, 'width': 640, 'height': 480}, {'id': 7, 'width': 320, 'height': 240},"
    "  {'id': 100, 'width': 200, 'height': 200}, {'id': 300, 'width': 64, 'height': 64}],"
    " 'annotations': ["
    "  {'id': 1, 'image_id': 7, 'category_id': 3, 'bbox': [10, 10, 20, 20], 'area': 400, 'iscrowd': 0},"
    "  {'id': 2, 'image_id': 7, 'category_id': 3, 'bbox': [50, 50, 60, 40], 'area': 2400, 'iscrowd': 0},"
    "  {'id': 3, 'image_id': 7, 'category_id': 18, 'bbox': [0, 0, 200, 150], 'area': 30000, 'iscrowd': 1},"
    "  {'id': 4, 'image_id': 7, 'category_id': 18, 'bbox': [20, 30, 40, 40], 'area': 1500, 'iscrowd': 0},"
    "  {'id': 5, 'image_id': 42, 'category_id': 3, 'bbox': [5, 5, 120, 100], 'area': 12000, 'iscrowd': 0},"
    "  {'id': 6, 'image_id': 42, 'category_id': 90, 'bbox': [100, 100, 30, 30], 'area': 900, 'iscrowd': 0},"
    "  {'id': 7, 'image_id': 42, 'category_id': 90, 'bbox': [105, 102, 28, 31], 'area': 868, 'iscrowd': 0,"
    "   'ignore': 1},"
    "  {'id': 8, 'image_id': 100, 'category_id': 3, 'bbox': [0, 0, 32, 32], 'area': 1024, 'iscrowd': 0},"
    "  {'id': 9, 'image_id': 100, 'category_id': 18, 'bbox': [10, 10, 96, 96], 'area': 9216, 'iscrowd': 0}],"
    " 'categories': [{'id': 90}, {'id': 3}, {'id': 18}, {'id': 5}]}";
static const char *FIXED_RES =
    "[{'image_id': 7, 'category_id': 3, 'bbox': [10, 10, 20, 20], 'score': 0.9},"
    " {'image_id': 7, 'category_id': 3, 'bbox': [11, 12, 19, 18], 'score': 0.9},"
    " {'image_id': 7, 'category_id': 3, 'bbox': [52, 48, 58, 44], 'score': 0.6},"
    " {'image_id': 7, 'category_id': 3, 'bbox': [200, 200, 10, 10], 'score': 0.95},"
    " {'image_id': 7, 'category_id': 18, 'bbox': [10, 10, 20, 20], 'score': 0.8},"
    " {'image_id': 7, 'category_id': 18, 'bbox': [22, 28, 40, 41], 'score': 0.7},"
    " {'image_id': 7, 'category_id': 18, 'bbox': [100, 50, 30, 30], 'score': 0.85},"
    " {'image_id': 42, 'category_id': 3, 'bbox': [8, 3, 118, 104], 'score': 0.75},"
    " {'image_id': 42, 'category_id': 3, 'bbox': [5, 5, 60, 50], 'score': 0.75},"
    " {'image_id': 42, 'category_id': 90, 'bbox': [101, 101, 29, 30], 'score': 0.5},"
    " {'image_id': 42, 'category_id': 90, 'bbox': [104, 103, 28, 30], 'score': 0.5},"
    " {'image_id': 42, 'category_id': 90, 'bbox': [300, 300, 5, 5], 'score': 0.99},"
    " {'image_id': 42, 'category_id': 5, 'bbox': [1, 1, 10, 10], 'score': 0.9},"
    " {'image_id': 100, 'category_id': 3, 'bbox': [0, 0, 30, 33], 'score': 0.4},"
    " {'image_id': 100, 'category_id': 18, 'bbox': [12, 8, 90, 99], 'score': 0.65},"
    " {'image_id': 100, 'category_id': 18, 'bbox': [0, 0, 50, 50], 'score': 0.3},"
    " {'image_id': 300, 'category_id': 90, 'bbox': [1, 1, 50, 50], 'score': 0.2}]";
static const double FIXED_STATS[COCO_N_STATS] = {0.6356199905704856,
                                                 0.746031746031746,
                                                 0.746031746031746,
                                                 0.5376237623762377,
                                                 0.6755775577557755,
                                                 0.8999999999999999,
                                                 0.3,
                                                 0.8666666666666667,
                                                 0.8666666666666667,
                                                 0.925,
                                                 0.825,
                                                 0.9};

START_TEST(fixed_case_matches_pycocotools) {
  CocoEvalResult r = evaluate(FIXED_GT, FIXED_RES);
  for (int s = 0; s < COCO_N_STATS; s++)  // bit-identical: same arithmetic in the same order
    ck_assert_msg(r.stats[s] == FIXED_STATS[s], "%s = %.17g, pycocotools %.17g", coco_stat_names[s], r.stats[s],
                  FIXED_STATS[s]);
}
END_TEST

START_TEST(summary_lines) {
  CocoEvalResult r = {.stats = {0.6356, 0.74603, 0.7, 0.5, 0.6, -1, 0.3, 0.8, 0.86666, 0.925, 0.825, 0.0005}};
  FILE *f = tmpfile();
  ck_assert_ptr_nonnull(f);
  coco_print_summary(&r, f);
  rewind(f);
  char text[2048] = "";
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
  const char *want =
      " Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ] = 0.636\n"
      " Average Precision  (AP) @[ IoU=0.50      | area=   all | maxDets=100 ] = 0.746\n"
      " Average Precision  (AP) @[ IoU=0.75      | area=   all | maxDets=100 ] = 0.700\n"
      " Average Precision  (AP) @[ IoU=0.50:0.95 | area= small | maxDets=100 ] = 0.500\n"
      " Average Precision  (AP) @[ IoU=0.50:0.95 | area=medium | maxDets=100 ] = 0.600\n"
      " Average Precision  (AP) @[ IoU=0.50:0.95 | area= large | maxDets=100 ] = -1.000\n"
      " Average Recall     (AR) @[ IoU=0.50:0.95 | area=   all | maxDets=  1 ] = 0.300\n"
      " Average Recall     (AR) @[ IoU=0.50:0.95 | area=   all | maxDets= 10 ] = 0.800\n"
      " Average Recall     (AR) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ] = 0.867\n"
      " Average Recall     (AR) @[ IoU=0.50:0.95 | area= small | maxDets=100 ] = 0.925\n"
      " Average Recall     (AR) @[ IoU=0.50:0.95 | area=medium | maxDets=100 ] = 0.825\n"
      " Average Recall     (AR) @[ IoU=0.50:0.95 | area= large | maxDets=100 ] = 0.001\n";
  ck_assert_str_eq(text, want);
}
END_TEST

// --- readers -------------------------------------------------------------------------------------

START_TEST(reader_skips_what_it_does_not_need) {
  // Unknown keys at every level, nested segmentations (polygons and RLE), integral floats as ids,
  // booleans as iscrowd, width/height optional; then the same file gzip-compressed.
  const char *text =
      "{'info': {'year': 2017, 'x': [[1, {'a': null}], true]}, 'licenses': [],"
      " 'images': [{'file_name': 'a.jpg', 'id': 3.0, 'width': 64, 'height': 48, 'extra': {'k': [1, 2]}}, {'id': 5}],"
      " 'annotations': [{'segmentation': [[1, 2, 3, 4, 5, 6]], 'id': 7, 'image_id': 3, 'category_id': 2,"
      "   'bbox': [1.5, 2, 3e1, 4], 'area': 96.5, 'iscrowd': false, 'keypoints': [1, 2, 0]},"
      "  {'segmentation': {'counts': [1, 2], 'size': [4, 4]}, 'id': 8, 'image_id': 5, 'category_id': 2,"
      "   'bbox': [0, 0, 4, 4], 'area': 16, 'iscrowd': true, 'ignore': [1, {}]}],"
      " 'categories': [{'supercategory': 's', 'id': 2, 'name': 'x', 'keypoints': ['a']}]}";
  write_json(at("gt.json"), text);
  char err[1024] = "";
  for (int gz = 0; gz < 2; gz++) {
    const char *path = at("gt.json");
    if (gz) {
      path = at("gt.json.gz");
      gzFile f = gzopen(path, "wb");
      ck_assert_ptr_nonnull(f);
      for (const char *c = text; *c; c++) gzputc(f, *c == '\'' ? '"' : *c);
      ck_assert_int_eq(gzclose(f), Z_OK);
    }
    CocoEvalGt gt;
    ck_assert_msg(coco_eval_read_gt(path, &gt, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(gt.n_images, 2);
    ck_assert_int_eq(gt.images[0].id, 3);
    ck_assert_int_eq(gt.images[0].width, 64);
    ck_assert_int_eq(gt.images[1].height, 0);
    ck_assert_int_eq(gt.n_anns, 2);
    ck_assert_int_eq(gt.anns[0].id, 7);
    ck_assert_double_eq(gt.anns[0].bbox[0], 1.5);
    ck_assert_double_eq(gt.anns[0].bbox[2], 30);
    ck_assert_double_eq(gt.anns[0].area, 96.5);
    ck_assert(!gt.anns[0].iscrowd && gt.anns[1].iscrowd);
    ck_assert_int_eq(gt.n_categories, 1);
    ck_assert_int_eq(gt.category_ids[0], 2);
    coco_eval_free_gt(&gt);
  }
}
END_TEST

static const struct {
  const char *json, *message;
} BAD_GT[] = {
    {"{'images': [{'id': 1}], 'annotations': [], 'categories': [", "truncated JSON: the file ends inside a value"},
    {"{'images': [{'id': 1}], 'annotations': [}", "malformed JSON"},
    {"", "empty file (expected a COCO instances file)"},
    {"[]", "expected an object with images, annotations and categories, found an array"},
    {"{'images': [{'id': 1}], 'categories': []}", "no 'annotations' array"},
    {"{'images': {}, 'annotations': [], 'categories': []}", "'images' must be an array, found an object"},
    {"{'images': [{'id': 1}, 7], 'annotations': [], 'categories': []}",
     "images[1]: expected an object, found a number"},
    {"{'images': [{'width': 1}], 'annotations': [], 'categories': []}", "images[0]: missing 'id'"},
    {"{'images': [{'id': 'a'}], 'annotations': [], 'categories': []}",
     "images[0]: 'id' must be an integer, found a string"},
    {"{'images': [{'id': 1.5}], 'annotations': [], 'categories': []}", "images[0]: 'id' must be an integer, found 1.5"},
    {"{'images': [{'id': 99999999999999999999}], 'annotations': [], 'categories': []}",
     "'id': 99999999999999999999 is out of the 64-bit integer range"},
    {"{'images': [{'id': 1}], 'annotations': [{'id': 4, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 1, 1],"
     " 'iscrowd': 0}], 'categories': [{'id': 1}]}",
     "annotations[0] (id 4): missing 'area'"},
    {"{'images': [{'id': 1}], 'annotations': [{'id': 4, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 1],"
     " 'area': 1, 'iscrowd': 0}], 'categories': [{'id': 1}]}",
     "annotations[0] (id 4): 'bbox' must hold 4 numbers, found 3"},
    {"{'images': [{'id': 1}], 'annotations': [{'id': 4, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 1, [1]],"
     " 'area': 1, 'iscrowd': 0}], 'categories': [{'id': 1}]}",
     "'bbox' must hold 4 numbers, found an array"},
    {"{'images': [{'id': 1}], 'annotations': [{'id': 4, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 1, 1],"
     " 'area': 1e999, 'iscrowd': 0}], 'categories': [{'id': 1}]}",
     "'area': 1e999 is out of the double range"},
    {"{'images': [{'id': 1}], 'annotations': [{'id': 4, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 1, 1],"
     " 'area': 1, 'iscrowd': 2}], 'categories': [{'id': 1}]}",
     "'iscrowd' must be 0 or 1, found another number"},
    {"{'images': [{'id': 1}, {'id': 2}, {'id': 1}], 'annotations': [], 'categories': []}",
     "images[2] repeats the id 1 of images[0]"},
    {"{'images': [{'id': 1}], 'annotations': [{'id': 4, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 1, 1],"
     " 'area': 1, 'iscrowd': 0}, {'id': 4, 'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 1, 1], 'area': 1,"
     " 'iscrowd': 0}], 'categories': [{'id': 1}]}",
     "annotations[1] repeats the id 4 of annotations[0]"},
    {"{'images': [], 'images': [], 'annotations': [], 'categories': []}", "'images' appears twice"},
};

START_TEST(bad_ground_truth) {
  const char *err = gt_error(BAD_GT[_i].json);
  ck_assert_contains(err, at("gt.json"));
  ck_assert_contains(err, BAD_GT[_i].message);
}
END_TEST

START_TEST(bad_results) {
  ck_assert_contains(results_error("[{'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 1, 1], 'score': 0.5},"
                                   " {'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 1, 1]}]"),
                     "res.json: detection 1: missing 'score'");
  ck_assert_contains(results_error("[{'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 1, 1], 'score': '0.5'}]"),
                     "detection 0: 'score' must be a number, found a string");
  ck_assert_contains(results_error("{'image_id': 1}"), "res.json: expected an array of detections, found an object");
  ck_assert_contains(results_error("[{'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 1, 1], 'score': 0.5}"),
                     "res.json: truncated JSON");
  ck_assert_contains(results_error("[] []"), "res.json: malformed JSON at byte 4: trailing garbage, near \"[] []\"");
  char err[1024];
  CocoEvalDet *dets;
  int64_t n;
  ck_assert_int_eq(coco_eval_read_results(at("missing.json"), &dets, &n, err, sizeof err), -1);
  ck_assert_contains(err, "missing.json: cannot open: No such file or directory");

  // A result for an image the GT does not list: pycocotools asserts, this fails naming it.
  write_json(at("gt.json"), ONE_GT);
  write_json(at("res.json"),
             "[{'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 1, 1], 'score': 0.5, 'id': 3},"
             " {'image_id': 99, 'category_id': 1, 'bbox': [0, 0, 1, 1], 'score': 0.5}]");
  CocoEvalGt gt;
  ck_assert_int_eq(coco_eval_read_gt(at("gt.json"), &gt, err, sizeof err), 0);
  ck_assert_int_eq(coco_eval_read_results(at("res.json"), &dets, &n, err, sizeof err), 0);
  ck_assert_int_eq(n, 2);
  CocoEvalResult r;
  ck_assert_int_eq(coco_evaluate(&gt, dets, n, &r, err, sizeof err), -1);
  ck_assert_str_eq(err, "detection 1: image_id 99 is not an image of the ground truth");
  dets[1].image_id = 1;
  dets[1].score = NAN;  // only possible in memory: JSON has no NaN
  ck_assert_int_eq(coco_evaluate(&gt, dets, n, &r, err, sizeof err), -1);
  ck_assert_str_eq(err, "detection 1: bbox or score is not finite");
  free(dets);
  coco_eval_free_gt(&gt);
}
END_TEST

// --- the verb ------------------------------------------------------------------------------------

static int run_verb(const char *a1, const char *a2, const char *a3, const char *a4, const char *a5, const char *a6) {
  char *argv[] = {"detr", "cocoeval", (char *)a1, (char *)a2, (char *)a3, (char *)a4, (char *)a5, (char *)a6, NULL};
  int argc = 2;
  while (argv[argc]) argc++;
  fflush(stdout);
  Dist alone = DIST_SINGLE;
  return cmd_cocoeval(argc, argv, &alone);
}

START_TEST(cocoeval_verb) {
  write_json(at("gt.json"), FIXED_GT);
  write_json(at("res.json"), FIXED_RES);
  ck_assert_int_eq(run_verb("--ann", at("gt.json"), "--results", at("res.json"), "--json", at("out.json")), 0);
  FILE *f = fopen(at("out.json"), "r");
  ck_assert_ptr_nonnull(f);
  char text[2048] = "";
  size_t n = fread(text, 1, sizeof text - 1, f);
  text[n] = 0;
  fclose(f);
  ck_assert_int_eq(access(at("out.json.tmp"), F_OK), -1);
  for (int s = 0; s < COCO_N_STATS; s++) {  // "NAME": value, in order, round-tripping exactly
    char key[16];
    snprintf(key, sizeof key, "\"%s\": ", coco_stat_names[s]);
    const char *v = strstr(text, key);
    ck_assert_msg(v != NULL, "no %s in %s", key, text);
    ck_assert_double_eq(strtod(v + strlen(key), NULL), FIXED_STATS[s]);
  }
  // Bad data: 1; bad usage: 2.
  write_json(at("res.json"), "[{'image_id': 5, 'category_id': 3, 'bbox': [0, 0, 1, 1], 'score': 0.5}]");
  ck_assert_int_eq(run_verb("--ann", at("gt.json"), "--results", at("res.json"), NULL, NULL), 1);
  write_json(at("gt.json"), "{");
  ck_assert_int_eq(run_verb("--ann", at("gt.json"), "--results", at("res.json"), NULL, NULL), 1);
  ck_assert_int_eq(run_verb("--ann", at("gt.json"), NULL, NULL, NULL, NULL), 2);
  ck_assert_int_eq(run_verb("--ann", at("gt.json"), "--results", at("res.json"), "--iou", "0.5"), 2);
  ck_assert_int_eq(run_verb("--ann", at("gt.json"), "--results", at("res.json"), "extra", NULL), 2);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("cocoeval");
  TCase *tc = tcase_create("cocoeval");
  tcase_add_checked_fixture(tc, setup_tmp, teardown_tmp);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, perfect_detections);
  tcase_add_test(tc, false_positive_above_true_positive);
  tcase_add_test(tc, iou_thresholds);
  tcase_add_test(tc, recall_thresholds_are_numpy_linspace);
  tcase_add_test(tc, crowd_region_absorbs_detections);
  tcase_add_test(tc, area_ranges_use_the_annotation_area);
  tcase_add_test(tc, categories_without_gt_are_excluded);
  tcase_add_test(tc, empty_results);
  tcase_add_test(tc, max_detections_per_image);
  tcase_add_test(tc, ties_keep_image_id_order);
  tcase_add_test(tc, pycocotools_quirks);
  tcase_add_test(tc, fixed_case_matches_pycocotools);
  tcase_add_test(tc, summary_lines);
  tcase_add_test(tc, reader_skips_what_it_does_not_need);
  tcase_add_loop_test(tc, bad_ground_truth, 0, (int)(sizeof BAD_GT / sizeof BAD_GT[0]));
  tcase_add_test(tc, bad_results);
  tcase_add_test(tc, cocoeval_verb);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
