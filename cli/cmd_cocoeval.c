// detr cocoeval: COCO bbox metrics of any results JSON against any instances JSON, the 12 numbers
// of pycocotools' COCOeval printed as its summarize() prints them.
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "eval/cocoeval.h"

static const char *USAGE =
    "--ann A.json[.gz] --results R.json [--json OUT.json]\n"
    "A: COCO instances file (images, annotations with bbox, area, iscrowd; categories).\n"
    "R: COCO results, an array of {image_id, category_id, bbox [x, y, w, h], score}.";

int cmd_cocoeval(int argc, char **argv, const Dist *job) {
  const char *ann_path = NULL, *res_path = NULL, *json_path = NULL;
  CliFlag flags[] = {
      {"ann", FLAG_STRING, &ann_path, "ground truth: COCO instances JSON (plain or .gz)"},
      {"results", FLAG_STRING, &res_path, "detections: COCO results JSON"},
      {"json", FLAG_STRING, &json_path, "also write the 12 numbers as {\"AP\": ..., \"ARl\": ...} here"},
  };
  int n_pos = 0, rc = cli_parse("cocoeval", USAGE, argc, argv, 2, flags, 3, NULL, 0, &n_pos);
  if (rc) return rc == 1 ? 0 : 2;
  if (!ann_path || !res_path) {
    fprintf(stderr, "detr cocoeval: --ann and --results are required (see detr cocoeval --help)\n");
    return 2;
  }
  char err[4400];
  CocoEvalGt gt;
  if (coco_eval_read_gt(ann_path, &gt, err, sizeof err)) {
    fprintf(stderr, "detr cocoeval: %s\n", err);
    return 1;
  }
  CocoEvalDet *dets;
  int64_t n_dets;
  if (coco_eval_read_results(res_path, &dets, &n_dets, err, sizeof err)) {
    fprintf(stderr, "detr cocoeval: %s\n", err);
    coco_eval_free_gt(&gt);
    return 1;
  }
  CocoEvalResult res;
  rc = coco_evaluate(&gt, dets, n_dets, &res, err, sizeof err);
  if (rc) fprintf(stderr, "detr cocoeval: %s: %s (ground truth %s)\n", res_path, err, ann_path);
  else {
    // What pycocotools leaves out or treats oddly, said out loud (the numbers still match it).
    if (res.dets_unknown_category)
      fprintf(stderr, "detr cocoeval: warning: %s: %lld detections of categories %s does not list (left out)\n",
              res_path, (long long)res.dets_unknown_category, ann_path);
    if (res.gts_unknown_image || res.gts_unknown_category)
      fprintf(stderr,
              "detr cocoeval: warning: %s: %lld annotations of unlisted images, %lld of unlisted categories "
              "(left out)\n",
              ann_path, (long long)res.gts_unknown_image, (long long)res.gts_unknown_category);
    if (res.gts_id_zero)
      fprintf(stderr,
              "detr cocoeval: warning: %s: an annotation has id 0; as in pycocotools, a detection "
              "matched to it counts as a false positive\n",
              ann_path);
    if (gt.n_ignore_flags)
      fprintf(stderr,
              "detr cocoeval: warning: %s: %lld annotations set \"ignore\"; pycocotools disregards it "
              "(only iscrowd is ignored), and so does this\n",
              ann_path, (long long)gt.n_ignore_flags);
    printf("%lld images, %lld categories, %lld annotations, %lld detections\n", (long long)gt.n_images,
           (long long)gt.n_categories, (long long)gt.n_anns, (long long)n_dets);
    coco_print_summary(&res, stdout);
    if (json_path && coco_write_stats_json(json_path, &res, err, sizeof err)) {
      fprintf(stderr, "detr cocoeval: %s\n", err);
      rc = -1;
    }
  }
  free(dets);
  coco_eval_free_gt(&gt);
  return rc ? 1 : 0;
}
