// COCO results JSON (eval/cocoeval_io.c: an array of {image_id, category_id, bbox, score}), as
// `detr cocoeval --results` reads it, evaluated (eval/cocoeval.c) against a fixed ground truth
// of 3 images, 3 categories and crowd and non-crowd boxes of every area range.
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "eval/cocoeval.h"
#include "fuzz_util.h"

static CocoEvalGt gt;

static const char GT_JSON[] =
    "{\"images\": [{\"id\": 1, \"width\": 640, \"height\": 480}, {\"id\": 2, \"width\": 100, \"height\": 80},"
    " {\"id\": 7}],"
    " \"annotations\": ["
    "  {\"id\": 1, \"image_id\": 1, \"category_id\": 1, \"bbox\": [10, 20, 30, 40], \"area\": 1200, \"iscrowd\": 0},"
    "  {\"id\": 2, \"image_id\": 1, \"category_id\": 3, \"bbox\": [100, 100, 200, 150], \"area\": 30000, \"iscrowd\": "
    "0},"
    "  {\"id\": 3, \"image_id\": 1, \"category_id\": 1, \"bbox\": [0, 0, 640, 480], \"area\": 307200, \"iscrowd\": 1},"
    "  {\"id\": 4, \"image_id\": 2, \"category_id\": 2, \"bbox\": [5, 5, 4, 4], \"area\": 16, \"iscrowd\": 0},"
    "  {\"id\": 5, \"image_id\": 2, \"category_id\": 2, \"bbox\": [50, 40, 40, 30], \"area\": 1200, \"iscrowd\": 0,"
    "   \"ignore\": 1},"
    "  {\"id\": 0, \"image_id\": 7, \"category_id\": 3, \"bbox\": [1, 1, 2, 2], \"area\": 4, \"iscrowd\": 0}],"
    " \"categories\": [{\"id\": 1}, {\"id\": 2}, {\"id\": 3}]}";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  const char *path = fuzz_write_file("gt.json", (const uint8_t *)GT_JSON, sizeof GT_JSON - 1);
  char err[1024];
  FUZZ_ASSERT(coco_eval_read_gt(path, &gt, err, sizeof err) == 0, "the fixed ground truth: %s", err);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write_file("results.json", data, size);
  CocoEvalDet *dets = NULL;
  int64_t n = 0;
  char err[2048] = "";
  if (coco_eval_read_results(path, &dets, &n, err, sizeof err)) {
    fuzz_expect_error(err, path);
    FUZZ_ASSERT(!dets && n == 0, "a failed read returned detections");
    return 0;
  }
  CocoEvalResult res;
  if (coco_evaluate(&gt, dets, n, &res, err, sizeof err) == 0) {
    for (int s = 0; s < COCO_N_STATS; s++)
      FUZZ_ASSERT(res.stats[s] == -1 || (res.stats[s] >= 0 && res.stats[s] <= 1), "stat %d = %g", s, res.stats[s]);
  } else {
    FUZZ_ASSERT(err[0], "coco_evaluate failed without a message");
  }
  free(dets);
  return 0;
}
