#define _POSIX_C_SOURCE 200809L  // fileno under -std=c11
#include "eval/evaluate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/clock.h"
#include "dist/dist.h"
#include "nn/postprocess.h"

typedef struct {
  const CocoEvalDet *dets;
  int64_t n;
} CocoResults;

static void print_coco_results(FILE *f, const void *ctx) {
  const CocoResults *r = ctx;
  fputc('[', f);
  for (int64_t i = 0; i < r->n; i++) {
    const CocoEvalDet *d = &r->dets[i];
    fprintf(f, "%s{\"image_id\": %lld, \"category_id\": %lld, \"bbox\": [%.9g, %.9g, %.9g, %.9g], \"score\": %.9g}",
            i ? ",\n" : "", (long long)d->image_id, (long long)d->category_id, d->bbox[0], d->bbox[1], d->bbox[2],
            d->bbox[3], d->score);
  }
  fputs("]\n", f);
}

int write_coco_results(const char *path, const CocoEvalDet *dets, int64_t n, char *err, size_t err_cap) {
  return atomic_file_write(path, print_coco_results, &(CocoResults){dets, n}, err, err_cap);
}

// A detection and its place in the single-process order: (batch, image in the batch, query).
typedef struct {
  int64_t order;
  CocoEvalDet det;
} OrderedDet;

static int by_order(const void *a, const void *b) {
  int64_t x = ((const OrderedDet *)a)->order, y = ((const OrderedDet *)b)->order;
  return (x > y) - (x < y);
}

// Data parallel: rank 0 gets every process's detections in the order one process would have
// made them (so ties in score rank the same), and the processes' counters summed.
static void merge_ranks(const Dist *g, OrderedDet **dets, int64_t *n, EvalReport *rep) {
  void *all;
  int64_t bytes;
  dist_gather_bytes(g, *dets, *n * (int64_t)sizeof(OrderedDet), &all, &bytes);
  free(*dets);
  *dets = all;
  *n = bytes / (int64_t)sizeof(OrderedDet);
  if (all) qsort(all, (size_t)*n, sizeof(OrderedDet), by_order);
  double sums[2 + ATTN_TRACE_MAX] = {(double)rep->images, rep->attn.images};
  for (int i = 0; i < ATTN_TRACE_MAX; i++) sums[2 + i] = rep->attn.sum[i];
  dist_allreduce_sum_f64(g, sums, 2 + ATTN_TRACE_MAX);
  rep->images = (int64_t)sums[0];
  rep->attn.images = sums[1];
  for (int i = 0; i < ATTN_TRACE_MAX; i++) rep->attn.sum[i] = sums[2 + i];
}

// The detections an evaluation collects, K per image, each with its place in the single-process
// order.
typedef struct {
  OrderedDet *dets;
  int64_t n, cap, K;
  int64_t global_batch, first_slot;  // images per batch over all processes; this slice's place in a batch
  Detection *batch_dets;             // [batch_size * K]: one batch's, before the categories
} DetList;

// Appends one batch's detections (from its forward output) to dl; a label no category has is
// dropped, as pycocotools drops it.
static void add_batch_detections(const DetrModel *model, const CocoDataset *ds, const Batch *b, const DetrOutput *out,
                                 DetList *dl) {
  int64_t K = dl->K;
  int ow[64], oh[64];
  DETR_CHECK(b->size <= 64, "evaluate_model: batch of %d images", b->size);
  for (int i = 0; i < b->size; i++) ow[i] = b->targets[i].orig_w, oh[i] = b->targets[i].orig_h;
  detr_postprocess_output(model, out, ow, oh, dl->batch_dets);
  for (int i = 0; i < b->size; i++)
    for (int64_t k = 0; k < K; k++) {
      const Detection *d = &dl->batch_dets[i * K + k];
      int category = coco_category_of(ds, d->label);
      if (category < 0 || dl->n >= dl->cap) continue;  // a label no category has: pycocotools drops it too
      dl->dets[dl->n].order = ((b->index * dl->global_batch + dl->first_slot + i) * K + k);
      dl->dets[dl->n++].det =
          (CocoEvalDet){.image_id = b->targets[i].image_id,
                        .category_id = category,
                        .bbox = {d->box[0], d->box[1], d->box[2] - d->box[0], d->box[3] - d->box[1]},
                        .score = d->score};
    }
}

// Runs the model without gradients over every batch of the loader (this process's slices under
// data parallel): the detections into dl, the image and attention counts into rep, a progress line
// on a terminal. 0, or -1 with the message in err.
static int run_batches(const DetrModel *model, const CocoDataset *ds, const EvalConfig *cfg, DataLoader *loader,
                       DetList *dl, EvalReport *rep, char *err, size_t err_cap) {
  DataError derr;
  bool was = autograd_set_grad_enabled(false);
  NnCtx ctx = {.training = false};
  bool tty = isatty(STDERR_FILENO);  // the redrawn progress line only on a terminal
  int rc = 0;
  int64_t batches = 0, total_batches = loader_batches_per_epoch(loader);
  for (;;) {
    const Batch *b;
    int st = loader_next(loader, &b, &derr);
    if (st == LOADER_END) break;
    if (st != DATA_OK) {
      snprintf(err, err_cap, "%s", derr.msg);
      rc = -1;
      break;
    }
    batches++;
    if (b->size == 0) continue;  // an empty slice of the last batch (data parallel)
    ScopeMark mark = tensor_scope_mark();
    Tensor *images = tensor_scoped(batch_images_tensor(b, model->params.device));
    DetrOutput out;
    if (detr_model_forward(model, &ctx, images, b->mask, &out, err, err_cap)) {
      tensor_scope_release(mark);
      rc = -1;
      break;
    }
    add_batch_detections(model, ds, b, &out, dl);
    attn_stats_add(&rep->attn, out.attn, out.n_attn, b->size);
    rep->images += b->size;
    detr_output_free(&out);
    tensor_scope_release(mark);
    if (cfg->progress && tty) fprintf(stderr, "\reval %lld/%lld batches", (long long)batches, (long long)total_batches);
  }
  if (cfg->progress && tty) fprintf(stderr, "\n");
  autograd_set_grad_enabled(was);
  return rc;
}

// Rank 0's part: writes the results file if asked, scores the n detections against gt into
// rep->coco, and fills shared with [status, the 12 numbers, detections] for the other processes.
static int score_detections(const CocoEvalGt *gt, const OrderedDet *dets, int64_t n, const EvalConfig *cfg,
                            EvalReport *rep, double *shared, char *err, size_t err_cap) {
  int rc = 0;
  CocoEvalDet *plain = detr_malloc((size_t)(n ? n : 1) * sizeof(CocoEvalDet), "evaluate_model plain");
  for (int64_t i = 0; i < n; i++) plain[i] = dets[i].det;
  if (cfg->results_path) rc = write_coco_results(cfg->results_path, plain, n, err, err_cap);
  if (rc == 0 && coco_evaluate(gt, plain, n, &rep->coco, err, err_cap)) rc = -1;
  free(plain);
  shared[0] = rc;
  for (int k = 0; k < COCO_N_STATS; k++) shared[1 + k] = rep->coco.stats[k];
  shared[1 + COCO_N_STATS] = (double)n;
  return rc;
}

int evaluate_model(const DetrModel *model, const CocoDataset *ds, const EvalConfig *cfg, EvalReport *rep, char *err,
                   size_t err_cap) {
  memset(rep, 0, sizeof *rep);
  double t0 = now_s();
  const Dist *g = &cfg->dist;
  bool dist = g->world > 1, scorer = dist_is_main(g);
  CocoEvalGt gt = {0};
  if (!dist_all_ok(g, !scorer || coco_eval_read_gt(ds->ann_path, &gt, err, err_cap) == 0)) {
    if (!scorer) snprintf(err, err_cap, "rank 0 could not read %s", ds->ann_path);
    return -1;
  }
  LoaderConfig lc = loader_config_make(false, cfg->batch_size, cfg->num_workers, cfg->aug, cfg->policy);
  lc.quiet = true;
  lc.pad_multiple = cfg->pad_multiple > 1 ? cfg->pad_multiple : 1;
  if (dist) lc.shard = g->rank, lc.shards = g->world;
  DataLoader *loader = NULL;
  DataError derr;
  if (loader_create(ds, &lc, (LoaderPosition){0, 0}, &loader, &derr)) {
    snprintf(err, err_cap, "%s", derr.msg);
    coco_eval_free_gt(&gt);
    return -1;
  }
  int64_t K = detr_detections_per_image(&model->cfg);  // K per image
  DetList dl = {.cap = ds->n_images * K,
                .K = K,
                .global_batch = (int64_t)cfg->batch_size * (dist ? g->world : 1),
                .first_slot = dist ? (int64_t)g->rank * cfg->batch_size : 0};
  dl.dets = detr_malloc((size_t)(dl.cap ? dl.cap : 1) * sizeof(OrderedDet), "evaluate_model dets");
  dl.batch_dets = detr_malloc((size_t)(cfg->batch_size * K) * sizeof(Detection), "evaluate_model batch_dets");
  int rc = run_batches(model, ds, cfg, loader, &dl, rep, err, err_cap);
  loader_free(loader);
  if (!dist_all_ok(g, rc == 0)) {
    if (rc == 0) snprintf(err, err_cap, "another process failed in the evaluation (see its message)");
    rc = -1;
  }
  bool all_ok = rc == 0;  // the same on every process
  if (all_ok && dist) merge_ranks(g, &dl.dets, &dl.n, rep);
  // [status, the 12 numbers, detections]: rank 0 scores, every process gets the result.
  double shared[2 + COCO_N_STATS] = {0};
  if (rc == 0 && scorer) rc = score_detections(&gt, dl.dets, dl.n, cfg, rep, shared, err, err_cap);
  if (dist && all_ok) {
    dist_broadcast_f64(g, shared, 2 + COCO_N_STATS);
    if (!scorer && rc == 0) {
      rc = (int)shared[0];
      if (rc) snprintf(err, err_cap, "rank 0 failed to score the evaluation (see its message)");
      for (int k = 0; k < COCO_N_STATS; k++) rep->coco.stats[k] = shared[1 + k];
      dl.n = (int64_t)shared[1 + COCO_N_STATS];
    }
  }
  if (rc == 0) rep->detections = dl.n;
  rep->seconds = now_s() - t0;
  free(dl.dets);
  free(dl.batch_dets);
  coco_eval_free_gt(&gt);
  return rc;
}
