// The whole DETR training step of detr-c: forward, loss, backward, gradient clipping, AdamW.
//   build/bench/bench_step [--preset detr-r18-small] [--size 320 | --hw HxW] [--batch 2] [--boxes 3]
//                          [--reps 5] [--enact] [--profile] [--forward] [--device cpu|cuda]
//                          [--conv auto | im2col | onednn | onednn-nchw | onednn-winograd] [--vary-size]
//                          [--set key=value ...]   (any model config field, e.g. --set tf32=true)
// --forward times the no-grad forward alone (e.g. detr-r50 on one 800x1066 image: --batch 1
// --hw 800x1066 --forward). --conv forces one CPU convolution implementation everywhere (default
// auto: the faster per shape and pass). --vary-size gives every step its own input size, 8 and 12
// pixels smaller each (as multi-scale training's batches have): the times include creating the
// new shapes' oneDNN primitives.
// Prints one JSON line: median step seconds over reps (after one warm-up step), the steps' times,
// the peak resident memory of the process (getrusage), and the tensor allocator's peak live bytes,
// cached bytes at the end, and peak of live + cached; with --device cuda also the peak of the caching allocator's live device memory.
// --profile adds the per-op breakdown (on the CPU only: GPU work is asynchronous, so host-side op
// times say little there; use Nsight Systems).
// bench/compare_torch.sh runs this and bench/torch_step.py alternately.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "kernels/cpu/cpu_kernels.h"
#if DETR_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif
#include "nn/detr.h"
#include "train/optim.h"
#include "bench/bench_util.h"

// Waits for the device's queued work, so that a step's time includes it.
static void device_sync(Device dev) {
#if DETR_HAVE_CUDA
  if (dev == DEVICE_CUDA) cuda_synchronize();
#endif
  (void)dev;
}

int main(int argc, char **argv) {
  cpu_runtime_setup(argv);  // libgomp's spin setting, as the detr command has it
  const char *preset = "detr-r18-small";
  int size = 320, boxes = 3, reps = 5, batch = 2, height = 0, width = 0;
  bool enact = false, profile = false, forward_only = false, vary = false;
  Device dev = DEVICE_CPU;
  const char *sets[32];
  int n_sets = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
    else if (!strcmp(argv[i], "--set") && i + 1 < argc && n_sets < 32) sets[n_sets++] = argv[++i];
    else if (!strcmp(argv[i], "--size") && i + 1 < argc) size = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--boxes") && i + 1 < argc) boxes = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--enact")) enact = true;
    else if (!strcmp(argv[i], "--forward")) forward_only = true;
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--hw") && i + 1 < argc) {
      if (sscanf(argv[++i], "%dx%d", &height, &width) != 2) height = width = 0;
    }
    else if (!strcmp(argv[i], "--profile")) profile = true;
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
      const char *d = argv[++i];
      if (strcmp(d, "cpu") && strcmp(d, "cuda")) {
        fprintf(stderr, "bench_step: --device %s: expected cpu or cuda\n", d);
        return 2;
      }
      dev = strcmp(d, "cuda") ? DEVICE_CPU : DEVICE_CUDA;
#if DETR_HAVE_CUDA
      char why[512];
      if (dev == DEVICE_CUDA && cuda_device_probe(why, sizeof why) <= 0) {
        fprintf(stderr, "bench_step: --device cuda: %s\n", why);
        return 1;
      }
#else
      if (dev == DEVICE_CUDA) {
        fprintf(stderr, "bench_step: --device cuda: this build has no CUDA backend\n");
        return 2;
      }
#endif
    }
    else if (!strcmp(argv[i], "--vary-size")) vary = true;
    else if (!strcmp(argv[i], "--conv") && i + 1 < argc) {
      const char *c = argv[++i];
      ConvImpl impl = !strcmp(c, "im2col") ? CONV_IMPL_IM2COL : !strcmp(c, "onednn") ? CONV_IMPL_ONEDNN
                    : !strcmp(c, "onednn-nchw") ? CONV_IMPL_ONEDNN_PLAIN
                    : !strcmp(c, "onednn-winograd") ? CONV_IMPL_ONEDNN_WINOGRAD : CONV_IMPL_AUTO;
      if (impl == CONV_IMPL_AUTO && strcmp(c, "auto")) {
        fprintf(stderr, "bench_step: --conv takes auto, im2col, onednn, onednn-nchw or onednn-winograd\n");
        return 2;
      }
      if (impl != CONV_IMPL_AUTO && impl != CONV_IMPL_IM2COL && !DETR_HAVE_ONEDNN) {
        fprintf(stderr, "bench_step: this build has no oneDNN\n");
        return 2;
      }
      cpu_conv2d_set_impl(impl);
    }
    else {
      fprintf(stderr, "bench_step: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  if (!height) height = width = size;
  if (reps < 1 || height - (vary ? 8 * reps : 0) < 32 || width - (vary ? 12 * reps : 0) < 32 || boxes < 0 ||
      batch < 1 || batch > 64) {
    fprintf(stderr, "bench_step: need --reps >= 1, sizes >= 32, --boxes >= 0, --batch 1..64\n");
    return 2;
  }
  DetrConfig cfg;
  if (detr_config_preset(preset, &cfg)) {
    fprintf(stderr, "bench_step: unknown preset '%s'\n", preset);
    return 2;
  }
  if (enact) cfg.encoder_attn = encoder_attn_find("enact");
  for (int i = 0; i < n_sets; i++) {
    char key[128], err[256];
    const char *eq = strchr(sets[i], '=');
    if (!eq || eq - sets[i] >= (long)sizeof key) {
      fprintf(stderr, "bench_step: --set %s: expected key=value\n", sets[i]);
      return 2;
    }
    memcpy(key, sets[i], (size_t)(eq - sets[i]));
    key[eq - sets[i]] = 0;
    if (detr_config_set(&cfg, key, eq + 1, err, sizeof err)) {
      fprintf(stderr, "bench_step: --set %s: %s\n", sets[i], err);
      return 2;
    }
  }
  enact = cfg.encoder_attn == encoder_attn_find("enact");
  cpu_flush_denormals(true);  // as `detr train` runs
  DetrModel *m = detr_model_create(&cfg, dev);
  detr_model_init(m, 1);
  AdamW opt;
  adamw_init(&opt, &m->params, optim_config_default());
  // `batch` images of height x width, `boxes` targets per image (fixed, as the PyTorch script's).
  const int B = batch;
  Tensor *images = tensor_new(dev, SHAPE(B, 3, height, width));
  Rng rng = rng_make(7);
  tensor_normal_(images, &rng, 0.0f, 1.0f);
  uint8_t *mask = calloc((size_t)B * (size_t)height * (size_t)width, 1);
  float *tb = malloc((size_t)(B * boxes * 4) * sizeof(float));
  int64_t *tl = malloc((size_t)(B * boxes) * sizeof(int64_t));
  for (int i = 0; i < B * boxes; i++) {
    tb[4 * i + 0] = 0.2f + 0.6f * (float)((i * 37) % 11) / 10.0f;
    tb[4 * i + 1] = 0.2f + 0.6f * (float)((i * 53) % 7) / 6.0f;
    tb[4 * i + 2] = 0.1f + 0.2f * (float)(i % 3) / 2.0f;
    tb[4 * i + 3] = 0.1f + 0.2f * (float)((i + 1) % 3) / 2.0f;
    tl[i] = (i * 13) % cfg.num_classes;
  }
  DetrTarget *targets = malloc(sizeof(DetrTarget) * (size_t)B);
  for (int b = 0; b < B; b++) targets[b] = (DetrTarget){boxes, tb + 4 * boxes * b, tl + boxes * b};
  CriterionConfig ccfg = detr_criterion_config(&cfg);
  Rng drop = rng_make(3);
  NnCtx ctx = {.training = true, .dropout_rng = &drop};
  double *t = malloc(sizeof(double) * (size_t)reps);
  for (int r = -1; r < reps; r++) {
    if (r == 0 && profile) {
      autograd_profile_reset();
      autograd_profile_enable(true);
    }
    if (vary && r >= 0) {  // step r: (height - 8 (r + 1)) x (width - 12 (r + 1)); the mask is all valid
      tensor_release(images);
      images = tensor_new(dev, SHAPE(B, 3, height - 8 * (r + 1), width - 12 * (r + 1)));
      tensor_normal_(images, &rng, 0.0f, 1.0f);
    }
    double t0 = now();
    if (profile) autograd_profile_mark();
    ScopeMark mark = tensor_scope_mark();
    DetrOutput out;
    CriterionResult loss;
    char err[256];
    if (forward_only) {  // inference: no tape, no loss
      bool was = autograd_set_grad_enabled(false);
      NnCtx eval = {.training = false};
      if (detr_model_forward(m, &eval, images, mask, &out, err, sizeof err)) {
        fprintf(stderr, "bench_step: %s\n", err);
        return 1;
      }
      autograd_set_grad_enabled(was);
      detr_output_free(&out);
      tensor_scope_release(mark);
      device_sync(dev);
      if (r >= 0) t[r] = now() - t0;
      continue;
    }
    if (detr_model_forward(m, &ctx, images, mask, &out, err, sizeof err) ||
        criterion_forward(&ccfg, out.layers[out.n_layers - 1], out.layers, cfg.aux_loss ? out.n_layers - 1 : 0,
                          targets, (float)(B * boxes), NULL, &loss, err, sizeof err)) {
      fprintf(stderr, "bench_step: %s\n", err);
      return 1;
    }
    autograd_backward(loss.total);
    adamw_clip_step(&opt, 0.1f);  // clipping, AdamW, gradients released
    criterion_result_free(&loss);
    detr_output_free(&out);
    tensor_scope_release(mark);
    device_sync(dev);
    if (r >= 0) t[r] = now() - t0;
  }
  double *sorted = malloc(sizeof(double) * (size_t)reps);
  for (int r = 0; r < reps; r++) sorted[r] = t[r];
  qsort(sorted, (size_t)reps, sizeof(double), cmp_double);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  AllocStats alloc = detr_alloc_stats(DEVICE_CPU);  // the tensor allocator: peak live, cached now
  printf("{\"impl\": \"detr-c\", \"preset\": \"%s\", \"size\": %d, \"hw\": \"%dx%d\", \"batch\": %d, \"what\": \"%s\", "
         "\"enact\": %s, \"tf32\": %s, \"gemm\": \"%s\", \"median_s\": %.4f, \"peak_rss_mb\": %.1f, \"alloc_peak_mb\": %.1f, "
         "\"alloc_cached_mb\": %.1f, \"alloc_held_peak_mb\": %.1f, \"steps_s\": [",
         preset, size, height, width, B, forward_only ? "forward" : "train step", enact ? "true" : "false", cfg.tf32 ? "true" : "false",
         cpu_gemm_library(), sorted[reps / 2], ru.ru_maxrss / 1024.0, alloc.peak_live_bytes / 1048576.0, alloc.cached_bytes / 1048576.0,
         alloc.peak_held_bytes / 1048576.0);
  for (int r = 0; r < reps; r++) printf(r ? ", %.4f" : "%.4f", t[r]);
  printf("]");
  if (dev == DEVICE_CUDA)
    printf(", \"device\": \"cuda\", \"peak_device_mb\": %.1f",
           (double)detr_alloc_stats(DEVICE_CUDA).peak_live_bytes / (1 << 20));
  printf("}\n");
  if (profile) autograd_profile_report(stderr);
  adamw_free(&opt);
  detr_model_free(m);
  tensor_release(images);
  free(mask), free(tb), free(tl), free(t), free(sorted), free(targets);
  return 0;
}
