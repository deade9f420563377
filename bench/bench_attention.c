// The encoder-attention variants (nn/encoder_attn.h) against each other: one encoder layer's
// forward + backward at DETR's feature-map sizes, how time grows with the number of tokens, and the
// detr-r18-small training step with each variant.
//   build/bench/bench_attention [--variant NAME|all] [--reps 5] [--scaling] [--step]
// Times are medians; memory is the peak of live tensor bytes (the caching allocator's count) above
// what was live before the pass. Inputs are random (ENACT's entropy map is then noisy and its
// regions short: its N/L is the one this data gives, docs/enact.md).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "bench/bench_util.h"
#include "nn/detr.h"

static Tensor *rand_tensor(Shape s, uint64_t seed, float scale) {
  Tensor *t = tensor_new(DEVICE_CPU, s);
  Rng r = rng_make(seed);
  tensor_uniform_(t, &r, -scale, scale);
  return t;
}

typedef struct {
  double seconds, peak_mb;
} Measure;

// One encoder layer (d 256, 8 heads, FFN 2048) on B images of h x w, forward + backward.
static Measure bench_layer(const EncoderAttnKind *kind, int64_t B, int64_t h, int64_t w, int reps) {
  const int64_t d = 256, N = h * w;
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  AttnSettings settings;
  attn_settings_default(&settings);
  TransformerShape s = {.dim = d, .heads = 8, .ffn_dim = 2048, .dropout = 0.1f};
  EncoderLayer layer = encoder_layer_create(&ps, "enc", s, kind, &settings);
  Rng init = rng_make(1);
  encoder_layer_init(&layer, &init);
  Tensor *src = rand_tensor(SHAPE(B, N, d), 2, 1.0f), *pos = rand_tensor(SHAPE(B, N, d), 3, 1.0f);
  tensor_set_requires_grad(src, true);
  uint8_t *pad = detr_calloc((size_t)(B * N), 1, "a padding mask");
  FeatureGeometry g;
  feature_geometry_make(pad, B, h, w, DEVICE_CPU, &g);
  NnCtx ctx = {.training = false};
  double *t = malloc(sizeof(double) * (size_t)reps);
  Measure m = {0};
  for (int r = -1; r < reps; r++) {
    ScopeMark mark = tensor_scope_mark();
    size_t before = detr_alloc_stats(DEVICE_CPU).live_bytes;
    detr_alloc_reset_peak(DEVICE_CPU);
    double t0 = now();
    AttnTrace trace = {0};
    char err[256];
    Tensor *y = encoder_layer_forward(&layer, &ctx, src, pos, &g, &trace, err, sizeof err);
    DETR_CHECK(y, "bench_attention: %s", err);
    attn_trace_resolve(&trace);  // as the model does after its forward
    Tensor *grad = tensor_new_scoped(DEVICE_CPU, y->shape);
    tensor_fill_(grad, 1e-3f);
    autograd_backward_with(y, grad);
    double dt = now() - t0;
    double mb = (double)(detr_alloc_stats(DEVICE_CPU).peak_live_bytes - before) / (1 << 20);
    if (r >= 0) t[r] = dt;
    if (mb > m.peak_mb) m.peak_mb = mb;
    attn_trace_free(&trace);
    tensor_scope_release(mark);
    autograd_zero_grad(&src, 1);
  }
  qsort(t, (size_t)reps, sizeof(double), cmp_double);
  m.seconds = t[reps / 2];
  free(t), free(pad);
  feature_geometry_free(&g);
  encoder_layer_free(&layer);
  tensor_release(src), tensor_release(pos);
  params_free(&ps);
  return m;
}

// The detr-r18-small training step (2 x 320x320, forward + loss + backward).
static Measure bench_step(const EncoderAttnKind *kind, int reps) {
  DetrConfig cfg;
  detr_config_preset("detr-r18-small", &cfg);
  cfg.encoder_attn = kind;
  DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(m, 1);
  Tensor *images = rand_tensor(SHAPE(2, 320, 320, 3), 5, 2.0f);
  uint8_t *mask = calloc(2 * 320 * 320, 1);
  float boxes[12] = {0.3f, 0.3f, 0.2f, 0.2f, 0.6f, 0.5f, 0.3f, 0.4f, 0.5f, 0.7f, 0.1f, 0.1f};
  int64_t labels[6] = {1, 5, 9, 3, 7, 2};
  DetrTarget targets[2] = {{3, boxes, labels}, {3, boxes, labels + 3}};
  CriterionConfig ccfg = detr_criterion_config(&cfg);
  Rng drop = rng_make(2);
  NnCtx ctx = {.training = true, .dropout_rng = &drop};
  double *t = malloc(sizeof(double) * (size_t)reps);
  Measure r0 = {0};
  for (int r = -1; r < reps; r++) {
    ScopeMark mark = tensor_scope_mark();
    size_t before = detr_alloc_stats(DEVICE_CPU).live_bytes;
    detr_alloc_reset_peak(DEVICE_CPU);
    double t0 = now();
    DetrOutput out;
    char err[256];
    CriterionResult loss;
    if (detr_model_forward(m, &ctx, images, mask, &out, err, sizeof err) ||
        criterion_forward(&ccfg, out.layers[out.n_layers - 1], out.layers, out.n_layers - 1, targets, 6.0f, NULL, &loss,
                          err, sizeof err)) {
      fprintf(stderr, "bench_attention: %s\n", err);
      exit(1);
    }
    autograd_backward(loss.total);
    double dt = now() - t0;
    double mb = (double)(detr_alloc_stats(DEVICE_CPU).peak_live_bytes - before) / (1 << 20);
    if (r >= 0) t[r] = dt;
    if (mb > r0.peak_mb) r0.peak_mb = mb;
    criterion_result_free(&loss);
    detr_output_free(&out);
    tensor_scope_release(mark);
    for (int i = 0; i < m->params.count; i++) autograd_zero_grad(&m->params.items[i].tensor, 1);
  }
  qsort(t, (size_t)reps, sizeof(double), cmp_double);
  r0.seconds = t[reps / 2];
  free(t), free(mask);
  tensor_release(images);
  detr_model_free(m);
  return r0;
}

int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  int reps = 5;
  bool scaling = false, step = false;
  const char *only = "all";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--variant") && i + 1 < argc) only = argv[++i];
    else if (!strcmp(argv[i], "--scaling")) scaling = true;
    else if (!strcmp(argv[i], "--step")) step = true;
    else {
      fprintf(stderr, "usage: bench_attention [--variant NAME|all] [--reps 5] [--scaling] [--step]\n");
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  const EncoderAttnKind *kinds[16];
  int n = 0;
  for (int i = 0; i < encoder_attn_count(); i++)
    if (!strcmp(only, "all") || !strcmp(only, encoder_attn_at(i)->name)) kinds[n++] = encoder_attn_at(i);
  if (!n) {
    fprintf(stderr, "bench_attention: unknown variant '%s'\n", only);
    return 2;
  }
  printf("encoder layer (d 256, 8 heads, FFN 2048), batch 2, forward + backward, median of %d:\n", reps);
  const int64_t sizes[2][2] = {{25, 38}, {50, 76}};
  for (int s = 0; s < 2; s++) {
    Measure dense = bench_layer(encoder_attn_default(), 2, sizes[s][0], sizes[s][1], reps);
    for (int k = 0; k < n; k++) {
      Measure m = kinds[k] == encoder_attn_default() ? dense : bench_layer(kinds[k], 2, sizes[s][0], sizes[s][1], reps);
      printf("  %lldx%lld  %-9s %8.1f ms %8.1f MB   time x%.2f memory x%.2f of dense\n", (long long)sizes[s][0],
             (long long)sizes[s][1], kinds[k]->name, m.seconds * 1e3, m.peak_mb, m.seconds / dense.seconds,
             m.peak_mb / dense.peak_mb);
      fflush(stdout);
    }
  }
  if (scaling) {
    // Square maps of about 1k..16k tokens, batch 1. Dense stops at 4k: its [8, N, N] attention
    // weights and their gradient need 8 GB at 16k.
    const int64_t sides[] = {32, 45, 64, 90, 128};
    printf("time as the tokens grow (batch 1, forward + backward, ms; ms per 1k tokens in brackets):\n");
    for (int k = 0; k < n; k++) {
      printf("  %-9s", kinds[k]->name);
      for (size_t i = 0; i < sizeof sides / sizeof sides[0]; i++) {
        int64_t side = sides[i], N = side * side;
        if (kinds[k] == encoder_attn_default() && N > 4200) {
          printf("  %5lld: -", (long long)N);
          continue;
        }
        Measure m = bench_layer(kinds[k], 1, side, side, reps < 3 ? reps : 3);
        printf("  %5lld: %7.1f (%5.2f)", (long long)N, m.seconds * 1e3, m.seconds * 1e3 / ((double)N / 1000.0));
        fflush(stdout);
      }
      printf("\n");
    }
  }
  if (step) {
    printf("detr-r18-small training step (2 x 320x320, forward + loss + backward):\n");
    for (int k = 0; k < n; k++) {
      Measure m = bench_step(kinds[k], reps);
      printf("  %-9s %.3f s  %.1f MB\n", kinds[k]->name, m.seconds, m.peak_mb);
      fflush(stdout);
    }
  }
  return 0;
}
