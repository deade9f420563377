// COCO evaluation of a model on a dataset: one pass of the val loader (no augmentation beyond the
// val resize), no-grad forward, DETR's post-processing, and the 12 COCO numbers (eval/cocoeval.h)
// against the annotation file, optionally writing a COCO results JSON.
#pragma once
#include "nn/encoder_attn.h"
#include "datasets/loader.h"
#include "nn/detr.h"
#include "eval/cocoeval.h"
#include "dist/dist.h"

typedef struct {
  int batch_size, num_workers;
  AugConfig aug;             // val resize (aug.train false)
  int pad_multiple;          // batches padded to a multiple of this many pixels (0 or 1: none)
  BadInputPolicy policy;     // unreadable images: fail or skip
  const char *results_path;  // a COCO results JSON to write, or NULL
  bool progress;             // a progress line on stderr
  Dist dist;                 // the processes (dist/dist.h; zero or DIST_SINGLE: this one alone).
                             // Several: each evaluates its slice of every batch, rank 0 merges the
                             // detections in dataset order and scores them, and every process gets
                             // the report. Collective: every rank of the group calls it.
} EvalConfig;

typedef struct {
  CocoEvalResult coco;
  int64_t images, detections;
  double seconds;
  AttnStatSums attn;  // the encoder-attention variant's statistics (e.g. ENACT's clusters per image)
} EvalReport;

int evaluate_model(const DetrModel *model, const CocoDataset *ds, const EvalConfig *cfg, EvalReport *rep, char *err,
                   size_t err_cap);
// A results JSON: [{"image_id", "category_id", "bbox": [x, y, w, h], "score"}, ...], atomically.
int write_coco_results(const char *path, const CocoEvalDet *dets, int64_t n, char *err, size_t err_cap);
