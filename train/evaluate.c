#include "train/evaluate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "train/postprocess.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int write_coco_results(const char *path, const CocoEvalDet *dets, int64_t n, char *err, size_t err_cap) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) {
    snprintf(err, err_cap, "%s: cannot write: %m", tmp);
    return -1;
  }
  fputc('[', f);
  for (int64_t i = 0; i < n; i++)
    fprintf(f, "%s{\"image_id\": %lld, \"category_id\": %lld, \"bbox\": [%.9g, %.9g, %.9g, %.9g], \"score\": %.9g}",
            i ? ",\n" : "", (long long)dets[i].image_id, (long long)dets[i].category_id, dets[i].bbox[0],
            dets[i].bbox[1], dets[i].bbox[2], dets[i].bbox[3], dets[i].score);
  fputs("]\n", f);
  if (fflush(f) || fsync(fileno(f)) || fclose(f)) {
    snprintf(err, err_cap, "%s: write failed: %m", tmp);
    remove(tmp);
    return -1;
  }
  if (rename(tmp, path)) {
    snprintf(err, err_cap, "%s: rename to %s failed: %m", tmp, path);
    remove(tmp);
    return -1;
  }
  return 0;
}

int evaluate_model(const DetrModel *model, const CocoDataset *ds, const EvalConfig *cfg, EvalReport *rep, char *err,
                   size_t err_cap) {
  memset(rep, 0, sizeof *rep);
  double t0 = now_s();
  CocoEvalGt gt;
  if (coco_eval_read_gt(ds->ann_path, &gt, err, err_cap)) return -1;
  LoaderConfig lc = loader_config_default(false);
  lc.batch_size = cfg->batch_size;
  lc.num_workers = cfg->num_workers;
  lc.aug = cfg->aug;
  lc.policy = cfg->policy;
  lc.quiet = true;
  DataLoader *loader = NULL;
  DataError derr;
  if (loader_create(ds, &lc, (LoaderPosition){0, 0}, &loader, &derr)) {
    snprintf(err, err_cap, "%s", derr.msg);
    coco_eval_free_gt(&gt);
    return -1;
  }
  int64_t Q = model->cfg.num_queries, cap = ds->n_images * Q, n = 0;
  CocoEvalDet *dets = malloc((size_t)(cap ? cap : 1) * sizeof(CocoEvalDet));
  Detection *batch_dets = malloc((size_t)(cfg->batch_size * Q) * sizeof(Detection));
  DETR_CHECK(dets && batch_dets, "evaluate_model: out of host memory");
  bool was = autograd_set_grad_enabled(false);
  NnCtx ctx = {.training = false};
  bool tty = isatty(STDERR_FILENO);  // the redrawn progress line only on a terminal
  int rc = 0;
  double clusters = 0.0, ratio = 0.0;
  int64_t enact_samples = 0, batches = 0, total_batches = loader_batches_per_epoch(loader);
  for (;;) {
    const Batch *b;
    int st = loader_next(loader, &b, &derr);
    if (st == LOADER_END) break;
    if (st != DATA_OK) {
      snprintf(err, err_cap, "%s", derr.msg);
      rc = -1;
      break;
    }
    ScopeMark mark = tensor_scope_mark();
    Tensor *images = tensor_scoped(batch_images_tensor(b, model->params.device));
    DetrOutput out;
    if (detr_model_forward(model, &ctx, images, b->mask, &out, err, err_cap)) {
      tensor_scope_release(mark);
      rc = -1;
      break;
    }
    int ow[64], oh[64];
    DETR_CHECK(b->size <= 64, "evaluate_model: batch of %d images", b->size);
    for (int i = 0; i < b->size; i++) ow[i] = b->targets[i].orig_w, oh[i] = b->targets[i].orig_h;
    const DetrLayerOutput *last = &out.layers[out.n_layers - 1];
    detr_postprocess(last->logits, last->boxes, ow, oh, batch_dets);
    for (int i = 0; i < b->size; i++)
      for (int64_t q = 0; q < Q; q++) {
        const Detection *d = &batch_dets[i * Q + q];
        int category = coco_category_of(ds, d->label);
        if (category < 0 || n >= cap) continue;  // a label no category has: pycocotools drops it too
        dets[n++] = (CocoEvalDet){.image_id = b->targets[i].image_id, .category_id = category,
                                  .bbox = {d->box[0], d->box[1], d->box[2] - d->box[0], d->box[3] - d->box[1]},
                                  .score = d->score};
      }
    for (int l = 0; l < out.n_enact; l++) {
      const EnactRegions *r = &out.enact[l].regions;
      if (l == 0) clusters += (double)r->count / (double)b->size;
      ratio += enact_pixels_per_cluster(r);
      enact_samples++;
    }
    rep->images += b->size;
    detr_output_free(&out);
    tensor_scope_release(mark);
    batches++;
    if (cfg->progress && tty)
      fprintf(stderr, "\reval %lld/%lld batches", (long long)batches, (long long)total_batches);
  }
  if (cfg->progress && tty) fprintf(stderr, "\n");
  autograd_set_grad_enabled(was);
  loader_free(loader);
  if (rc == 0) {
    rep->detections = n;
    if (enact_samples) {
      int layers = model->cfg.enc_layers;
      rep->clusters_per_image = clusters / (double)(enact_samples / (layers ? layers : 1));
      rep->compression = ratio / (double)enact_samples;
    }
    if (cfg->results_path) rc = write_coco_results(cfg->results_path, dets, n, err, err_cap);
    if (rc == 0 && coco_evaluate(&gt, dets, n, &rep->coco, err, err_cap)) rc = -1;
  }
  rep->seconds = now_s() - t0;
  free(dets);
  free(batch_dets);
  coco_eval_free_gt(&gt);
  return rc;
}
