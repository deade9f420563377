// ENACT against dense encoder self-attention, and the whole detr-r18-small forward + loss +
// backward with and without ENACT.
//   build/bench/bench_enact [reps]
// Times are medians of forward + backward; memory is the peak of live tensor bytes (the caching
// allocator's count) above what was live before the pass. Inputs are random, so the entropy map
// is noisy and regions are short: the compression ratio N/L reported is the one this data gives
// (a trained W_prob on real images gives longer regions; see docs/enact.md).
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "nn/detr.h"
#include "bench/bench_util.h"

static Tensor *rand_tensor(Shape s, uint64_t seed, float scale) {
  Tensor *t = tensor_new(DEVICE_CPU, s);
  Rng r = rng_make(seed);
  tensor_uniform_(t, &r, -scale, scale);
  return t;
}

// One encoder layer's forward + backward; returns median seconds, peak bytes and N/L.
static void bench_layer(int64_t h, int64_t w, bool enact, int reps, double *secs, double *peak_mb, double *ratio) {
  const int64_t B = 2, d = 256, N = h * w;
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  TransformerShape s = {.dim = d, .heads = 8, .ffn_dim = 2048, .dropout = 0.1f};
  EnactEncoderLayer el;
  EncoderLayer plain;
  Rng init = rng_make(1);
  if (enact) {
    enact_layer_create(&el, &ps, "enc", s, enact_options_default());
    enact_layer_init(&el, &init);
  } else {
    plain = encoder_layer_create(&ps, "enc", s);
    encoder_layer_init(&plain, &init);
  }
  Tensor *src = rand_tensor(SHAPE(B, N, d), 2, 1.0f), *pos = rand_tensor(SHAPE(B, N, d), 3, 1.0f);
  tensor_set_requires_grad(src, true);
  uint8_t *pad = calloc((size_t)(B * N), 1);
  float *additive = calloc((size_t)(B * N), sizeof(float));
  Tensor *mask = tensor_from_host(DEVICE_CPU, SHAPE(B, N), additive);
  EnactGeometry g;
  char err[128];
  if (enact_geometry(pad, B, h, w, &g, err, sizeof err)) {
    fprintf(stderr, "bench_enact: %s\n", err);
    exit(1);
  }
  NnCtx ctx = {.training = false};
  double *t = malloc(sizeof(double) * (size_t)reps);
  *peak_mb = 0;
  for (int r = -1; r < reps; r++) {
    ScopeMark mark = tensor_scope_mark();
    size_t before = detr_alloc_stats(DEVICE_CPU).live_bytes;
    detr_alloc_reset_peak(DEVICE_CPU);
    double t0 = now();
    EnactTrace trace = {0};
    Tensor *y = enact ? enact_layer_forward(&el, &ctx, src, pos, mask, &g, NULL, &trace)
                      : encoder_layer_forward(&plain, &ctx, src, pos, mask);
    Tensor *grad = tensor_new_scoped(DEVICE_CPU, y->shape);
    tensor_fill_(grad, 1e-3f);
    autograd_backward_with(y, grad);
    double dt = now() - t0;
    double mb = (double)(detr_alloc_stats(DEVICE_CPU).peak_live_bytes - before) / (1 << 20);
    if (r >= 0) t[r] = dt;
    if (mb > *peak_mb) *peak_mb = mb;
    *ratio = enact ? (double)(B * N) / (double)trace.regions.count : 1.0;
    enact_trace_free(&trace);
    tensor_scope_release(mark);
    autograd_zero_grad(&src, 1);
  }
  qsort(t, (size_t)reps, sizeof(double), cmp_double);
  *secs = t[reps / 2];
  free(t), free(pad), free(additive);
  enact_geometry_free(&g);
  tensor_release(src), tensor_release(pos), tensor_release(mask);
  params_free(&ps);
}

static double bench_model(bool enact, int reps, double *peak_mb) {
  DetrConfig cfg;
  detr_config_preset("detr-r18-small", &cfg);
  cfg.enact = enact;
  DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(m, 1);
  Tensor *images = rand_tensor(SHAPE(2, 3, 320, 320), 5, 2.0f);
  uint8_t *mask = calloc(2 * 320 * 320, 1);
  float boxes[12] = {0.3f, 0.3f, 0.2f, 0.2f, 0.6f, 0.5f, 0.3f, 0.4f, 0.5f, 0.7f, 0.1f, 0.1f};
  int64_t labels[6] = {1, 5, 9, 3, 7, 2};
  DetrTarget targets[2] = {{3, boxes, labels}, {3, boxes, labels + 3}};
  CriterionConfig ccfg = criterion_config_default((int)cfg.num_classes);
  Rng drop = rng_make(2);
  NnCtx ctx = {.training = true, .dropout_rng = &drop};
  double *t = malloc(sizeof(double) * (size_t)reps);
  *peak_mb = 0;
  for (int r = -1; r < reps; r++) {
    ScopeMark mark = tensor_scope_mark();
    size_t before = detr_alloc_stats(DEVICE_CPU).live_bytes;
    detr_alloc_reset_peak(DEVICE_CPU);
    double t0 = now();
    DetrOutput out;
    char err[256];
    CriterionResult loss;
    if (detr_model_forward(m, &ctx, images, mask, &out, err, sizeof err) ||
        criterion_forward(&ccfg, out.layers[out.n_layers - 1], out.layers, out.n_layers - 1, targets, 6.0f, NULL,
                          &loss, err, sizeof err)) {
      fprintf(stderr, "bench_enact: %s\n", err);
      exit(1);
    }
    autograd_backward(loss.total);
    double dt = now() - t0;
    double mb = (double)(detr_alloc_stats(DEVICE_CPU).peak_live_bytes - before) / (1 << 20);
    if (r >= 0) t[r] = dt;
    if (mb > *peak_mb) *peak_mb = mb;
    criterion_result_free(&loss);
    detr_output_free(&out);
    tensor_scope_release(mark);
    for (int i = 0; i < m->params.count; i++) autograd_zero_grad(&m->params.items[i].tensor, 1);
  }
  qsort(t, (size_t)reps, sizeof(double), cmp_double);
  double med = t[reps / 2];
  free(t), free(mask);
  tensor_release(images);
  detr_model_free(m);
  return med;
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 5;
  printf("encoder layer (d 256, 8 heads, FFN 2048, batch 2), forward + backward:\n");
  int64_t sizes[2][2] = {{25, 38}, {50, 76}};
  for (int k = 0; k < 2; k++) {
    double ts, md, rd, te, me, re;
    bench_layer(sizes[k][0], sizes[k][1], false, reps, &ts, &md, &rd);
    bench_layer(sizes[k][0], sizes[k][1], true, reps, &te, &me, &re);
    printf("  %lldx%lld  dense %7.1f ms %7.1f MB   ENACT %7.1f ms %7.1f MB   N/L %.2f   time x%.2f memory x%.2f\n",
           (long long)sizes[k][0], (long long)sizes[k][1], ts * 1e3, md, te * 1e3, me, re, te / ts, me / md);
  }
  double md, me;
  double td = bench_model(false, reps, &md), te = bench_model(true, reps, &me);
  printf("detr-r18-small step (2 x 320x320, forward + loss + backward):\n");
  printf("  DETR %.3f s %.1f MB   DETR+ENACT %.3f s %.1f MB\n", td, md, te, me);
  return 0;
}
