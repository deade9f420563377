// Loader throughput against what training consumes, on this machine.
//   build/bench/bench_loader [--data DIR] [--images 200] [--batches 150] [--scale 320] [--max-size 512]
//                            [--steps 6]
// 1. Images per second the loader delivers (decode + DETR train augmentation + normalize + pad +
//    collate) with 0, 1, 2 and 4 workers, batches of 2, nothing else running (the first 5
//    batches of each run are not timed).
// 2. The detr-r18-small training step (forward + SetCriterion + backward, CPU) fed by a 2-worker
//    loader: seconds per step, the images per second it consumes, and how long each step waited
//    in loader_next (0 when the loader keeps the trainer fed). The first step is not timed.
// Without --data, a synthetic dataset (detr synth defaults: 256..448 px JPEGs) is generated into
// /tmp/detr_bench_loader first.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/runtime.h"
#include "datasets/loader.h"
#include "datasets/synth.h"
#include "nn/detr.h"
#include "bench/bench_util.h"

// Training steps of detr-r18-small on loader batches; the loader prefetches while the step runs.
static void bench_training(const CocoDataset *ds, int scale, int max_size, int steps) {
  DetrConfig mc;
  DETR_CHECK(detr_config_preset("detr-r18-small", &mc) == 0, "no detr-r18-small preset");
  mc.num_classes = ds->num_classes;  // the synthetic dataset's ids run to 13
  DetrModel *model = detr_model_create(&mc, DEVICE_CPU);
  detr_model_init(model, 0);
  LoaderConfig cfg = loader_config_default(true);
  cfg.aug = aug_config_scaled(true, scale, max_size);
  cfg.num_workers = 2;
  DataLoader *L;
  DataError err;
  char msg[4096];
  DETR_CHECK(loader_create(ds, &cfg, (LoaderPosition){0, 0}, &L, &err) == DATA_OK, "%s", err.msg);
  Rng dropout_rng = rng_make(1);
  NnCtx ctx = {.training = true, .dropout_rng = &dropout_rng};
  CriterionConfig ccfg = detr_criterion_config(&mc);
  double t_start = 0, waited = 0;
  int64_t images = 0;
  for (int step = 0; step <= steps; step++) {
    if (step == 1) t_start = now();
    double t0 = now();
    const Batch *b;
    DETR_CHECK(loader_next(L, &b, &err) == DATA_OK, "%s", err.msg);
    if (step > 0) waited += now() - t0, images += b->size;
    ScopeMark mark = tensor_scope_mark();
    Tensor *x = batch_images_tensor(b, DEVICE_CPU);  // [B, H, W, 3]
    DetrOutput out;
    DETR_CHECK(detr_model_forward(model, &ctx, x, b->mask, &out, msg, sizeof msg) == 0, "%s", msg);
    DetrTarget targets[16];
    int64_t boxes = 0;
    for (int i = 0; i < b->size; i++) {
      targets[i] = (DetrTarget){.n = b->targets[i].n, .boxes = b->targets[i].boxes, .labels = b->targets[i].labels};
      boxes += b->targets[i].n;
    }
    CriterionResult loss;
    DETR_CHECK(criterion_forward(&ccfg, out.layers[out.n_layers - 1], out.layers, out.n_layers - 1, targets,
                                 boxes > 1 ? (float)boxes : 1.0f, NULL, &loss, msg, sizeof msg) == 0,
               "%s", msg);
    autograd_backward(loss.total);
    criterion_result_free(&loss);
    detr_output_free(&out);
    tensor_release(x);
    tensor_scope_release(mark);
  }
  double secs = now() - t_start;
  printf(
      "detr-r18-small training step (batch 2, 2 loader workers): %.2f s per step = %.2f images/s consumed; "
      "waited for data %.1f ms per step\n",
      secs / steps, images / secs, 1e3 * waited / steps);
  loader_free(L);
  detr_model_free(model);
}

int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  const char *data = NULL;
  int n_images = 200, n_batches = 150, scale = 320, max_size = 512, steps = 6;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--data") && i + 1 < argc) data = argv[++i];
    else if (!strcmp(argv[i], "--images") && i + 1 < argc) n_images = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--batches") && i + 1 < argc) n_batches = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--scale") && i + 1 < argc) scale = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--max-size") && i + 1 < argc) max_size = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
    else {
      fprintf(stderr,
              "usage: bench_loader [--data DIR] [--images N] [--batches N] [--scale PX] [--max-size PX] "
              "[--steps N]\n");
      return 2;
    }
  }
  DataError err;
  if (!data) {
    data = "/tmp/detr_bench_loader";
    SynthConfig sc = synth_config_default();
    sc.out_dir = data;
    sc.n_train = n_images;
    sc.n_val = 0;
    double t0 = now();
    if (synth_generate(&sc, &err) != DATA_OK) {
      fprintf(stderr, "bench_loader: %s\n", err.msg);
      return 1;
    }
    printf("synthetic dataset: %d images in %.2f s (%.0f images/s written)\n", n_images, now() - t0,
           n_images / (now() - t0));
  }
  char ann[1024], images[1024];
  snprintf(ann, sizeof ann, "%s/annotations/instances_train.json", data);
  snprintf(images, sizeof images, "%s/train", data);
  CocoOpenConfig oc = {.ann_path = ann, .image_dir = images, .check_images = true};
  CocoDataset *ds;
  if (coco_open(&oc, &ds, &err) != DATA_OK) {
    fprintf(stderr, "bench_loader: %s\n", err.msg);
    return 1;
  }
  printf("train augmentation: shortest side %d (scales %d..%d), max size %d; batch 2\n", scale,
         aug_config_scaled(true, scale, max_size).scales[0], scale, max_size);
  const int workers[] = {0, 1, 2, 4};
  for (size_t w = 0; w < sizeof workers / sizeof workers[0]; w++) {
    LoaderConfig cfg = loader_config_default(true);
    cfg.aug = aug_config_scaled(true, scale, max_size);
    cfg.num_workers = workers[w];
    cfg.prefetch = workers[w] > 0 ? 2 * workers[w] : 1;
    DataLoader *L;
    if (loader_create(ds, &cfg, (LoaderPosition){0, 0}, &L, &err) != DATA_OK) {
      fprintf(stderr, "bench_loader: %s\n", err.msg);
      return 1;
    }
    const Batch *b;
    double t0 = 0;
    int64_t images_seen = 0, pixels = 0;
    for (int i = 0; i < n_batches + 5; i++) {
      if (i == 5) t0 = now();
      if (loader_next(L, &b, &err) != DATA_OK) {
        fprintf(stderr, "bench_loader: %s\n", err.msg);
        return 1;
      }
      if (i >= 5) {
        images_seen += b->size;
        pixels += (int64_t)b->size * b->h * b->w;
      }
    }
    double secs = now() - t0;
    printf("workers %d: %7.1f images/s (%.2f ms per batch, mean padded batch image %.0f px)\n", workers[w],
           images_seen / secs, 1e3 * secs / n_batches, (double)pixels / images_seen);
    loader_free(L);
  }
  if (steps > 0) bench_training(ds, scale, max_size, steps);
  coco_free(ds);
  return 0;
}
