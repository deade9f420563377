// COCO instances JSON, read by every reader of such files: the training reader (datasets/coco.c,
// coco_open under the fail and the skip policy, ids as labels and contiguous labels), predict's
// class names (label_names_from_coco, api/model_file.c) and cocoeval's (eval/cocoeval_io.c), whose ground truth is
// then evaluated against detections made from its own boxes (eval/cocoeval.c). fuzz_coco_gz compiles this file with FUZZ_COCO_GZIP: the
// input is gzip-compressed first and read as a .json.gz.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/runtime.h"
#include "api/model_file.h"
#include "datasets/coco.h"
#include "fuzz_util.h"
#include "eval/cocoeval.h"

static const char *write_input(const uint8_t *data, size_t size) {
#ifdef FUZZ_COCO_GZIP
  const char *path = fuzz_path("instances.json.gz");
  gzFile gz = gzopen(path, "wb");
  FUZZ_ASSERT(gz, "gzopen(%s)", path);
  FUZZ_ASSERT(size == 0 || gzwrite(gz, data, (unsigned)size) == (int)size, "gzwrite");
  FUZZ_ASSERT(gzclose(gz) == Z_OK, "gzclose");
  return path;
#else
  return fuzz_write_file("instances.json", data, size);
#endif
}

static void check_dataset(const CocoDataset *ds) {
  int64_t anns = 0;
  for (int64_t i = 0; i < ds->n_images; i++) {
    const CocoImage *im = &ds->images[i];
    FUZZ_ASSERT(i == 0 || ds->images[i - 1].id < im->id, "images not sorted by id");
    FUZZ_ASSERT(coco_find_image(ds, im->id) == i, "coco_find_image");
    FUZZ_ASSERT(im->width >= 1 && im->width <= IMAGE_MAX_SIDE && im->height >= 1 && im->height <= IMAGE_MAX_SIDE,
                "image size %dx%d", im->width, im->height);
    FUZZ_ASSERT(im->file_name && im->file_name[0], "empty file_name");
    FUZZ_ASSERT(im->first_ann == anns && im->n_anns >= 0, "annotation grouping");
    for (int k = 0; k < im->n_anns; k++) {
      const CocoAnn *a = &ds->anns[im->first_ann + k];
      FUZZ_ASSERT(a->image_index == i && a->image_id == im->id, "annotation of another image");
      FUZZ_ASSERT(coco_label_of(ds, a->category_id) >= 0, "annotation with an unknown category");
      FUZZ_ASSERT(a->bbox[2] > 0 && a->bbox[3] > 0, "zero-size box kept");
    }
    anns += im->n_anns;
  }
  FUZZ_ASSERT(anns == ds->n_anns, "%lld annotations grouped of %lld", (long long)anns, (long long)ds->n_anns);
  for (int c = 0; c < ds->n_categories; c++) {
    int label = coco_label_of(ds, ds->categories[c].id);
    FUZZ_ASSERT(label >= 0 && label < ds->num_classes, "label %d of %d classes", label, ds->num_classes);
    FUZZ_ASSERT(coco_category_of(ds, label) == ds->categories[c].id, "label -> category");
    FUZZ_ASSERT(ds->categories[c].name && ds->categories[c].supercategory, "category names");
  }
  static FILE *null;
  if (!null) null = fopen("/dev/null", "w");
  coco_print_stats(ds, null);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = write_input(data, size);
  for (int variant = 0; variant < 3; variant++) {
    CocoOpenConfig cfg = {.ann_path = path,
                          .policy = variant ? BAD_INPUT_SKIP : BAD_INPUT_FAIL,
                          .contiguous_labels = variant == 2,
                          .quiet = true};
    CocoDataset *ds = NULL;
    DataError err = {{0}};
    if (coco_open(&cfg, &ds, &err) == DATA_OK) {
      check_dataset(ds);
      coco_free(ds);
    } else {
      FUZZ_ASSERT(!ds, "a failed coco_open returned a dataset");
      fuzz_expect_error(err.msg, path);
    }
  }

  // `detr predict --names` (detr_options.names): the categories only.
  LabelNames names = {0};
  char err[2048] = "";
  if (label_names_from_coco(path, &names, err, sizeof err) != DETR_OK) fuzz_expect_error(err, path);
  for (int i = 0; i < names.n; i++)
    FUZZ_ASSERT(!names.name[i] || strlen(names.name[i]) <= COCO_MAX_STRING_BYTES, "name");
  label_names_free(&names);

  CocoEvalGt gt;
  err[0] = 0;
  if (coco_eval_read_gt(path, &gt, err, sizeof err)) {
    fuzz_expect_error(err, path);
    return 0;
  }
  // Detections from the ground truth's own boxes (scores from their position), with one of
  // them moved to image and category ids the file names, so evaluation runs on every group.
  int64_t n = gt.n_anns < 2000 ? gt.n_anns : 2000;
  CocoEvalDet *dets = malloc((size_t)(n ? n : 1) * sizeof *dets);
  int64_t nd = 0;
  for (int64_t i = 0; i < n; i++) {
    const CocoEvalGtAnn *a = &gt.anns[i];
    bool known = false;
    for (int64_t k = 0; k < gt.n_images && !known; k++) known = gt.images[k].id == a->image_id;
    if (!known) continue;  // cocoeval refuses detections of images the GT does not list
    bool finite = true;
    for (int c = 0; c < 4; c++) finite = finite && isfinite(a->bbox[c]);
    if (!finite) continue;
    dets[nd++] = (CocoEvalDet){.image_id = a->image_id,
                               .category_id = a->category_id,
                               .bbox = {a->bbox[0], a->bbox[1], a->bbox[2], a->bbox[3]},
                               .score = 1.0 / (double)(i + 1)};
  }
  CocoEvalResult res;
  if (coco_evaluate(&gt, dets, nd, &res, err, sizeof err) == 0) {
    for (int s = 0; s < COCO_N_STATS; s++)
      FUZZ_ASSERT(res.stats[s] == -1 || (res.stats[s] >= 0 && res.stats[s] <= 1), "stat %d = %g", s, res.stats[s]);
  }
  free(dets);
  coco_eval_free_gt(&gt);
  return 0;
}
