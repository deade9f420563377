// Matmul and conv2d throughput against OpenBLAS's raw sgemm on the same machine.
//   build/bench/bench_ops [reps] [--conv [MODEL]]  (--conv: the convolutions only, of one model)
//   build/bench/bench_ops [reps] --attention-bf16  (attention's per-head GEMMs, fp32 against bf16)
//   build/bench/bench_ops [reps] --gemm-at-b  (C = A^T B on oneDNN's sgemm against OpenBLAS's)
// Matmul: the median time of our op (on oneDNN's sgemm where the build has oneDNN) and of the bare
// OpenBLAS cblas_sgemm call doing the same multiply-adds, in GFLOP/s, and their ratio; batches of
// small GEMMs one per thread (cpu_gemm_batched) against one after another. Conv2d: every convolution of DETR's training step (detr-r18-small at
// 320x320, detr-r50 at 512x512, batch 2), each pass (forward, backward-data, backward-weights) on
// im2col + sgemm, oneDNN on its blocked layouts, oneDNN on plain nchw and oneDNN's Winograd (its
// direct convolution where it has none) side by side, what
// AUTO (cpu_conv2d_impl) chooses, and the convolution time per step on each.
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if DETR_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#include "core/runtime.h"
#include "autograd/ops.h"
#include "kernels/cpu/conv_onednn.h"
#include "kernels/cpu/cpu_kernels.h"
#include "bench/bench_util.h"

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static float *rand_buffer(int64_t n, uint64_t seed) {
  float *x = malloc((size_t)n * sizeof(float));
  cpu_uniform(x, n, seed, 0, -1, 1);
  return x;
}

static Tensor *rand_tensor(Shape s, uint64_t seed, bool grad) {
  Tensor *t = tensor_new(DEVICE_CPU, s);
  Rng r = rng_make(seed);
  tensor_uniform_(t, &r, -1, 1);
  tensor_set_requires_grad(t, grad);
  return t;
}

// Median seconds of `batch` sgemm calls of [m,k] x [k,n].
static double time_sgemm(int64_t m, int64_t n, int64_t k, int batch, int reps) {
  // Random inputs: calloc'ed zeros of a fresh mapping all read one shared zero page, which stays
  // in cache and flatters a memory-bound multiply.
  float *a = rand_buffer(m * k, 1), *b = rand_buffer(k * n, 2), *c = calloc((size_t)(m * n), 4);
  double *t = malloc(sizeof(double) * reps);
  for (int r = -3; r < reps; r++) {
    double t0 = now();
    for (int i = 0; i < batch; i++)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)k, b, (int)n, 0.0f,
                  c, (int)n);
    if (r >= 0) t[r] = now() - t0;
  }
  double med = median(t, reps);
  free(a), free(b), free(c), free(t);
  return med;
}

static void bench_matmul(int64_t m, int64_t n, int64_t k, int reps) {
  Tensor *x = rand_tensor(SHAPE(m, k), 1, false), *w = rand_tensor(SHAPE(n, k), 2, false);
  double *t = malloc(sizeof(double) * reps);
  for (int r = -3; r < reps; r++) {  // 3 warm-up calls: the first ones fault fresh heap pages in
    ScopeMark mark = tensor_scope_mark();
    double t0 = now();
    op_linear(x, w, NULL);
    if (r >= 0) t[r] = now() - t0;
    tensor_scope_release(mark);
  }
  double ours = median(t, reps), blas = time_sgemm(m, n, k, 1, reps);
  double gflop = 2.0 * m * n * k * 1e-9;
  printf("linear  %5lldx%5lldx%5lld          ours %7.1f GFLOP/s  sgemm %7.1f GFLOP/s  ratio %.2f\n", (long long)m,
         (long long)n, (long long)k, gflop / ours, gflop / blas, blas / ours);
  tensor_release(x), tensor_release(w), free(t);
}

// A batch of small GEMMs (attention's per-head products): cpu_gemm_batched (one matrix per thread
// below GEMM_BATCH_PARALLEL_MAX_FLOPS) against the matrices one after another, each on all threads.
static void bench_gemm_batched(int64_t batch, int64_t m, int64_t n, int64_t k, int reps) {
  float *a = rand_buffer(batch * m * k, 3), *b = rand_buffer(batch * k * n, 4), *c = calloc((size_t)(batch * m * n), 4);
  double *t = malloc(sizeof(double) * reps), med[2];
  for (int way = 0; way < 2; way++) {
    for (int r = -1; r < reps; r++) {
      double t0 = now();
      if (way == 0) cpu_gemm_batched(false, false, m, n, k, 1.0f, a, k, m * k, b, n, k * n, 0.0f, c, n, m * n, batch);
      else
        for (int64_t i = 0; i < batch; i++)
          cpu_gemm(false, false, m, n, k, 1.0f, a + i * m * k, k, b + i * k * n, n, 0.0f, c + i * m * n, n);
      if (r >= 0) t[r] = now() - t0;
    }
    med[way] = median(t, reps);
  }
  double gflop = 2.0 * batch * m * n * k * 1e-9;
  printf("batched %3lldx %4lldx%4lldx%4lld  batched %7.1f GFLOP/s  one after another %7.1f GFLOP/s  ratio %.2f\n",
         (long long)batch, (long long)m, (long long)n, (long long)k, gflop / med[0], gflop / med[1], med[1] / med[0]);
  free(a), free(b), free(c), free(t);
}

// Attention's per-head GEMMs in bf16 mode: fp32 (bf16 off; one matrix per thread or one after
// another), oneDNN's bf16 matmul over the batch (forced below the narrow-batch width), and what bf16
// mode runs (matmul_bf16.c's rule). Each row: the product's transposes as the forward and backward of
// dropout_bmm / bmm pass them, y [B, M, N] = op(a) op(b).
static double time_batched(bool ta, bool tb, int64_t batch, int64_t m, int64_t n, int64_t k, const float *a,
                           const float *b, float *c, int reps) {
  double *t = malloc(sizeof(double) * reps);
  int64_t lda = ta ? m : k, ldb = tb ? k : n;
  for (int r = -3; r < reps; r++) {
    double t0 = now();
    cpu_gemm_batched(ta, tb, m, n, k, 1.0f, a, lda, m * k, b, ldb, k * n, 0.0f, c, n, m * n, batch);
    if (r >= 0) t[r] = now() - t0;
  }
  double med = median(t, reps);
  free(t);
  return med;
}

static void bench_gemm_batched_bf16(bool ta, bool tb, int64_t batch, int64_t m, int64_t n, int64_t k, int reps) {
  float *a = rand_buffer(batch * m * k, 5), *b = rand_buffer(batch * k * n, 6), *c = calloc((size_t)(batch * m * n), 4);
  double fp32 = time_batched(ta, tb, batch, m, n, k, a, b, c, reps);
  cpu_set_bf16(true);
  int64_t width = cpu_gemm_bf16_set_min_batched_width(0);
  double forced = time_batched(ta, tb, batch, m, n, k, a, b, c, reps);
  cpu_gemm_bf16_set_min_batched_width(width);
  double chosen = time_batched(ta, tb, batch, m, n, k, a, b, c, reps);
  bool bf16 = cpu_gemm_bf16_batched(ta, tb, m, n, k, 1.0f, a, ta ? m : k, m * k, b, tb ? k : n, k * n, 0.0f, c, n,
                                    m * n, batch);  // what the rule takes (it runs it once more)
  cpu_set_bf16(false);
  double gflop = 2.0 * batch * m * n * k * 1e-9;
  printf(
      "bmm %c%c %3lldx %4lldx%4lldx%4lld  fp32 %6.1f  bf16 %6.1f GFLOP/s (bf16/fp32 time %.2f)  bf16 mode: %s %6.1f\n",
      ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)batch, (long long)m, (long long)n, (long long)k, gflop / fp32,
      gflop / forced, forced / fp32, bf16 ? "bf16" : "fp32", gflop / chosen);
  free(a), free(b), free(c);
}

static void bench_attention_bf16(int reps) {
  char why[256];
  if (!cpu_bf16_supported(why, sizeof why)) {
    printf("bf16: %s\n", why);
    return;
  }
  // heads x images, queries, keys, head width: DETR-R50 at 512 (2 images, 8 heads, 256 tokens, 100
  // queries, 32 wide), at 800x1066 (one image, 850 tokens) and the main job's (4 images, 144 tokens,
  // 16 wide).
  static const int64_t shapes[][4] = {
      {16, 256, 256, 32}, {16, 100, 256, 32}, {16, 100, 100, 32}, {8, 850, 850, 32}, {32, 144, 144, 16}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    int64_t B = shapes[i][0], q = shapes[i][1], kv = shapes[i][2], d = shapes[i][3];
    bench_gemm_batched_bf16(false, true, B, q, kv, d, reps);   // logits = q k^T; dp = dy v^T
    bench_gemm_batched_bf16(false, false, B, q, d, kv, reps);  // y = p v; dq = dlogits k
    bench_gemm_batched_bf16(true, false, B, kv, d, q, reps);   // dv = p^T dy; dk = dlogits^T q
  }
}

// --- convolution: im2col + sgemm against oneDNN on DETR's shapes ---

typedef struct {
  const char *model;  // preset @ input size, batch 2
  int calls;          // per training step
  int grads;          // 0: frozen (forward only), 1: dw, 2: dw and dx
  int c, hw, o, k, stride;
  bool bias;
  int batch;  // 0: 2
} DetrConv;

// Every convolution of detr-r18-small at 320x320 and detr-r50 at 512x512, batch 2 (the stem and
// layer1 are frozen, as in DETR; input_proj has a bias). From DNNL_VERBOSE=1 bench_step.
static const DetrConv detr_convs[] = {
    {"r18@320", 1, 0, 3, 320, 64, 7, 2, false},
    {"r18@320", 4, 0, 64, 80, 64, 3, 1, false},
    {"r18@320", 1, 1, 64, 80, 128, 3, 2, false},
    {"r18@320", 1, 1, 64, 80, 128, 1, 2, false},
    {"r18@320", 3, 2, 128, 40, 128, 3, 1, false},
    {"r18@320", 1, 2, 128, 40, 256, 3, 2, false},
    {"r18@320", 1, 2, 128, 40, 256, 1, 2, false},
    {"r18@320", 3, 2, 256, 20, 256, 3, 1, false},
    {"r18@320", 1, 2, 256, 20, 512, 3, 2, false},
    {"r18@320", 1, 2, 256, 20, 512, 1, 2, false},
    {"r18@320", 3, 2, 512, 10, 512, 3, 1, false},
    {"r18@320", 1, 2, 512, 10, 128, 1, 1, true},
    {"r50@512", 1, 0, 3, 512, 64, 7, 2, false},
    {"r50@512", 1, 0, 64, 128, 64, 1, 1, false},
    {"r50@512", 3, 0, 64, 128, 64, 3, 1, false},
    {"r50@512", 4, 0, 64, 128, 256, 1, 1, false},
    {"r50@512", 2, 0, 256, 128, 64, 1, 1, false},
    {"r50@512", 1, 1, 256, 128, 128, 1, 1, false},
    {"r50@512", 1, 2, 128, 128, 128, 3, 2, false},
    {"r50@512", 1, 1, 256, 128, 512, 1, 2, false},
    {"r50@512", 4, 2, 128, 64, 512, 1, 1, false},
    {"r50@512", 3, 2, 512, 64, 128, 1, 1, false},
    {"r50@512", 3, 2, 128, 64, 128, 3, 1, false},
    {"r50@512", 1, 2, 512, 64, 256, 1, 1, false},
    {"r50@512", 1, 2, 256, 64, 256, 3, 2, false},
    {"r50@512", 1, 2, 512, 64, 1024, 1, 2, false},
    {"r50@512", 6, 2, 256, 32, 1024, 1, 1, false},
    {"r50@512", 5, 2, 1024, 32, 256, 1, 1, false},
    {"r50@512", 5, 2, 256, 32, 256, 3, 1, false},
    {"r50@512", 1, 2, 1024, 32, 512, 1, 1, false},
    {"r50@512", 1, 2, 512, 32, 512, 3, 2, false},
    {"r50@512", 1, 2, 1024, 32, 2048, 1, 2, false},
    {"r50@512", 3, 2, 512, 16, 2048, 1, 1, false},
    {"r50@512", 2, 2, 2048, 16, 512, 1, 1, false},
    {"r50@512", 2, 2, 512, 16, 512, 3, 1, false},
    {"r50@512", 1, 2, 2048, 16, 256, 1, 1, true},
    // The main job's model (tools/main_job_config.sh: ResNet-18 at width 16 to layer3, every stage
    // trained) at 192x192, batch 4, and issue #18's (the same to layer4, input_proj to 64).
    {"main@192", 1, 1, 3, 192, 16, 7, 2, false, 4},
    {"main@192", 4, 2, 16, 48, 16, 3, 1, false, 4},
    {"main@192", 1, 2, 16, 48, 32, 3, 2, false, 4},
    {"main@192", 1, 2, 16, 48, 32, 1, 2, false, 4},
    {"main@192", 3, 2, 32, 24, 32, 3, 1, false, 4},
    {"main@192", 1, 2, 32, 24, 64, 3, 2, false, 4},
    {"main@192", 1, 2, 32, 24, 64, 1, 2, false, 4},
    {"main@192", 3, 2, 64, 12, 64, 3, 1, false, 4},
    {"main@192", 1, 2, 64, 12, 128, 1, 1, true, 4},
    {"i18@192", 1, 1, 3, 192, 16, 7, 2, false, 4},
    {"i18@192", 4, 2, 16, 48, 16, 3, 1, false, 4},
    {"i18@192", 1, 2, 16, 48, 32, 3, 2, false, 4},
    {"i18@192", 1, 2, 16, 48, 32, 1, 2, false, 4},
    {"i18@192", 3, 2, 32, 24, 32, 3, 1, false, 4},
    {"i18@192", 1, 2, 32, 24, 64, 3, 2, false, 4},
    {"i18@192", 1, 2, 32, 24, 64, 1, 2, false, 4},
    {"i18@192", 3, 2, 64, 12, 64, 3, 1, false, 4},
    {"i18@192", 1, 2, 64, 12, 128, 3, 2, false, 4},
    {"i18@192", 1, 2, 64, 12, 128, 1, 2, false, 4},
    {"i18@192", 3, 2, 128, 6, 128, 3, 1, false, 4},
    {"i18@192", 1, 2, 128, 6, 64, 1, 1, true, 4},
};

#define PASSES 3
// im2col + sgemm, oneDNN blocked, oneDNN plain, oneDNN Winograd, oneDNN bf16 (direct), and im2col
// with bf16 on (its GEMMs through cpu_gemm's bf16 path: what bf16 mode runs where it chooses im2col).
#define IMPLS 6
static const ConvImpl impls[IMPLS] = {CONV_IMPL_IM2COL,          CONV_IMPL_ONEDNN,      CONV_IMPL_ONEDNN_PLAIN,
                                      CONV_IMPL_ONEDNN_WINOGRAD, CONV_IMPL_ONEDNN_BF16, CONV_IMPL_IM2COL};
static const bool impl_bf16[IMPLS] = {[IMPLS - 1] = true};

// Median seconds of one pass of g through impl's kernel (bf16: with bf16 mode on), workspace
// allocation included.
static double time_conv_pass(ConvImpl impl, bool bf16, const ConvGeom *g, bool with_bias, ConvPass pass, int reps) {
  cpu_conv2d_set_impl(impl);
  cpu_set_bf16(bf16);
  int64_t nx = g->batch * g->in_ch * g->in_h * g->in_w, nw = g->out_ch * g->in_ch * g->kh * g->kw;
  int64_t ny = g->batch * g->out_ch * g->out_h * g->out_w;
  float *x = rand_buffer(nx, 5), *w = rand_buffer(nw, 6), *y = rand_buffer(ny, 7);  // y is dy too
  float *dx = calloc((size_t)nx, 4), *dw = calloc((size_t)nw, 4), *b = calloc((size_t)g->out_ch, 4);
  float *bias = with_bias ? b : NULL;
  double *t = malloc(sizeof(double) * reps);
  for (int r = -1; r < reps; r++) {  // r = -1: warm-up (oneDNN creates its primitive)
    double t0 = now();
    int64_t ws_floats = pass == CONV_PASS_FWD ? cpu_conv2d_forward_workspace_floats(g, with_bias)
                        : pass == CONV_PASS_BWD_DATA
                            ? cpu_conv2d_backward_workspace_floats(g, true, false, false, false, false)
                            : cpu_conv2d_backward_workspace_floats(g, false, false, true, true, with_bias);
    float *ws = detr_alloc(DEVICE_CPU, (size_t)ws_floats * sizeof(float));
    if (pass == CONV_PASS_FWD) cpu_conv2d_forward(x, NULL, w, bias, y, g, ws);
    else if (pass == CONV_PASS_BWD_DATA)
      cpu_conv2d_backward(NULL, NULL, w, y, NULL, dx, false, NULL, false, NULL, g, ws);
    else cpu_conv2d_backward(x, NULL, NULL, y, NULL, NULL, false, dw, true, bias, g, ws);  // dw fresh, as in training
    detr_free(DEVICE_CPU, ws, (size_t)ws_floats * sizeof(float));
    if (r >= 0) t[r] = now() - t0;
  }
  double med = median(t, reps);
  free(x), free(w), free(y), free(dx), free(dw), free(b), free(t);
  cpu_conv2d_set_impl(CONV_IMPL_AUTO);
  cpu_set_bf16(false);
  return med;
}

// The geometry of one of detr_convs: square maps, "same" padding.
static ConvGeom detr_conv_geom(const DetrConv *d, bool channels_last) {
  int pad = d->k / 2;
  ConvGeom g = {.batch = d->batch ? d->batch : 2,
                .in_ch = d->c,
                .in_h = d->hw,
                .in_w = d->hw,
                .out_ch = d->o,
                .kh = d->k,
                .kw = d->k,
                .stride_h = d->stride,
                .stride_w = d->stride,
                .pad_h = pad,
                .pad_w = pad,
                .dil_h = 1,
                .dil_w = 1,
                .channels_last = channels_last};
  g.out_h = g.out_w = conv_out_size(d->hw, d->k, d->stride, pad, 1);
  return g;
}

// One row per DETR convolution: GFLOP/s of each pass on each path (and bare sgemm doing the
// forward's multiply-adds, one call per image), and the step's convolution time on each path.
// channels_last: the same convolutions on [B, H, W, C] activations (the backbone's layout): im2col's
// rows are pixels, "oneDNN blocked" is nhwc with blocked weights, "oneDNN nchw" nhwc with oihw.
static void bench_detr_convs(int reps, const char *only_model, bool channels_last) {
  int n_impl = DETR_HAVE_ONEDNN ? IMPLS : 1;
  printf(
      "\nDETR convolutions%s, batch 2 (main, i18: 4): GFLOP/s of im2col+sgemm / oneDNN blocked / oneDNN nchw / "
      "oneDNN Winograd / oneDNN bf16 (fp32 accumulation) / im2col+bf16 GEMMs%s\n",
      channels_last ? " CHANNELS LAST" : "", DETR_HAVE_ONEDNN ? "" : " (no oneDNN in this build)");
  printf("calls: per training step; f: frozen (forward only), w: no dx (dw only)\n");
  printf("%-8s %-26s %5s  %-35s %-35s %-35s %6s  %s\n", "model", "conv", "calls", "fwd", "bwd-data", "bwd-weights",
         "sgemm", "AUTO's choice (fwd bwd-data bwd-weights), bf16 mode's, oneDNN blocked fwd, Winograd fwd");
  const char *model = NULL;
  // per training step: each path, the fastest per pass, AUTO's choice, bf16 mode's choice
  double step_ms[IMPLS + 3] = {0};
  bool bf16 = DETR_HAVE_ONEDNN && cpu_bf16_supported(NULL, 0);
  int n = (int)(sizeof detr_convs / sizeof detr_convs[0]);
  for (int i = 0; i <= n; i++) {
    const DetrConv *d = i < n ? &detr_convs[i] : NULL;
    if (d && only_model && strcmp(d->model, only_model)) continue;
    if (model && (!d || strcmp(d->model, model))) {
      printf(
          "%-8s convolution ms per step: im2col %.0f, oneDNN blocked %.0f, oneDNN nchw %.0f, Winograd %.0f, "
          "bf16 %.0f, im2col+bf16 %.0f, fastest per pass %.0f, AUTO %.0f, bf16 mode's choice %.0f\n",
          model, step_ms[0], step_ms[1], channels_last ? NAN : step_ms[2], step_ms[3], step_ms[4], step_ms[5],
          step_ms[IMPLS], step_ms[IMPLS + 1], bf16 ? step_ms[IMPLS + 2] : NAN);
      memset(step_ms, 0, sizeof step_ms);
    }
    if (!d) break;
    model = d->model;
    ConvGeom g = detr_conv_geom(d, channels_last);
    double gflop = 2.0 * g.batch * g.out_ch * g.out_h * g.out_w * g.in_ch * g.kh * g.kw * 1e-9;
    char what[64], cell[PASSES][64], chosen[8] = "", chosen_bf16[8] = "---";
    snprintf(what, sizeof what, "%dx%d s%d %4dx%3d->%4d%s", d->k, d->k, d->stride, d->c, d->hw, d->o,
             d->bias ? " +b" : "");
    for (int p = 0; p < PASSES; p++) {
      double t[IMPLS] = {0};
      int len = 0;
      for (int k = 0; k < n_impl; k++) {
        // oneDNN on nhwc with plain oihw weights is its reference loop (~1 GFLOP/s): not timed
        // bf16 only where the CPU has it
        bool skip = (channels_last && impls[k] == CONV_IMPL_ONEDNN_PLAIN) ||
                    ((impls[k] == CONV_IMPL_ONEDNN_BF16 || impl_bf16[k]) && !bf16);
        t[k] = skip ? 1e9 : time_conv_pass(impls[k], impl_bf16[k], &g, d->bias, (ConvPass)p, reps);
        len += snprintf(cell[p] + len, sizeof cell[p] - (size_t)len, k ? " /%4.0f" : "%4.0f", gflop / t[k]);
      }
      ConvImpl auto_impl = cpu_conv2d_impl(&g, (ConvPass)p);
      int a = 0;
      while (a < n_impl - 1 && impls[a] != auto_impl) a++;
      chosen[p] = "ibpwfg"[a];
      int a16 = 0;  // bf16 mode's choice: im2col there is im2col+bf16, the direct one bf16's
      if (bf16) {
        cpu_set_bf16(true);
        ConvImpl c = cpu_conv2d_impl(&g, (ConvPass)p);
        cpu_set_bf16(false);
        a16 = c == CONV_IMPL_IM2COL ? IMPLS - 1 : c == CONV_IMPL_ONEDNN_WINOGRAD ? 3 : 4;
        chosen_bf16[p] = "ibpwfg"[a16];
      }
      bool runs = p == CONV_PASS_FWD || (p == CONV_PASS_BWD_WEIGHTS && d->grads >= 1) ||
                  (p == CONV_PASS_BWD_DATA && d->grads == 2);
      if (!runs) continue;
      double best = t[0];
      for (int k = 0; k < n_impl; k++) {
        step_ms[k] += 1e3 * d->calls * t[k];
        if (t[k] < best) best = t[k];
      }
      step_ms[IMPLS] += 1e3 * d->calls * best;
      step_ms[IMPLS + 1] += 1e3 * d->calls * t[a];
      step_ms[IMPLS + 2] += 1e3 * d->calls * t[a16];
    }
    double blas = time_sgemm(g.out_ch, g.out_h * g.out_w, g.in_ch * g.kh * g.kw, (int)g.batch, reps);
    const char *impl = "", *wino = "";
#if DETR_HAVE_ONEDNN
    impl = onednn_conv2d_impl(&g, CONV_PASS_FWD, CONV_IMPL_ONEDNN);
    wino = onednn_conv2d_impl(&g, CONV_PASS_FWD, CONV_IMPL_ONEDNN_WINOGRAD);
#endif
    printf("%-8s %-26s %3d%-2s  %-35s %-35s %-35s %6.0f  %s %s %s %s\n", d->model, what, d->calls,
           d->grads == 0   ? "f"
           : d->grads == 1 ? "w"
                           : "",
           cell[0], cell[1], cell[2], gflop / blas, chosen, chosen_bf16, impl, wino);
  }
}

#if DETR_HAVE_ONEDNN
// C = A^T B (every weight gradient, dW = dY^T X) on oneDNN's sgemm against OpenBLAS's: oneDNN's time
// over OpenBLAS's, each cell the median over 11 fresh allocations at different alignments (one
// alignment alone moved the ratio by up to 2x between runs) of the best of `reps` calls of each,
// alternating. '*': cpu_gemm runs that shape on OpenBLAS (cpu_gemm_on_openblas, kernels/cpu/matmul.c).
static void bench_gemm_at_b(int reps) {
  static const int64_t ms[] = {64, 128, 256, 512, 1024, 2048}, ns[] = {32, 64, 128, 256, 512, 1024, 2048, 4608};
  static const int64_t ks[] = {200, 512, 2048};
  enum { PLACEMENTS = 11 };
  printf(
      "\nC = A^T B, oneDNN's sgemm time / OpenBLAS's (median of %d placements, best of %d calls each); "
      "*: cpu_gemm takes OpenBLAS\n",
      PLACEMENTS, reps);
  for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
    int64_t k = ks[ki];
    printf("k = %lld\n  m \\ n", (long long)k);
    for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) printf("%8lld", (long long)ns[j]);
    printf("\n");
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
      int64_t m = ms[i];
      printf("%7lld", (long long)m);
      for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
        int64_t n = ns[j];
        double ratio[PLACEMENTS];
        for (int pl = 0; pl < PLACEMENTS; pl++) {
          // A [k, m], B [k, n], C [m, n]; the offset moves A's alignment by 64 bytes a placement.
          float *a_block = rand_buffer(k * m + 16 * (pl % 4), 1 + pl), *a = a_block + 16 * (pl % 4);
          float *b = rand_buffer(k * n, 2 + pl), *c = calloc((size_t)(m * n), sizeof(float));
          double one = 1e30, blas = 1e30;
          for (int r = 0; r < reps; r++) {
            double t0 = now();
            dnnl_sgemm('T', 'N', m, n, k, 1.0f, a, m, b, n, 1.0f, c, n);
            double t1 = now();
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)m, b, (int)n,
                        1.0f, c, (int)n);
            double t2 = now();
            if (t1 - t0 < one) one = t1 - t0;
            if (t2 - t1 < blas) blas = t2 - t1;
          }
          ratio[pl] = one / blas;
          free(a_block), free(b), free(c);
        }
        printf("%7.2f%c", median(ratio, PLACEMENTS), cpu_gemm_on_openblas(true, false, m, n) ? '*' : ' ');
      }
      printf("\n");
      fflush(stdout);
    }
  }
}
#endif

int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  cpu_runtime_setup(argv);         // libgomp's spin setting, as the detr command has it
  int reps = argc > 1 ? atoi(argv[1]) : 7;
  bool channels_last = argc > 2 && !strcmp(argv[2], "--conv-last");
  bool conv_only = argc > 2 && (!strcmp(argv[2], "--conv") || channels_last);
  bool attention_bf16 = argc == 3 && !strcmp(argv[2], "--attention-bf16");
  bool gemm_at_b = argc == 3 && !strcmp(argv[2], "--gemm-at-b") && DETR_HAVE_ONEDNN;
  const char *only_model = conv_only && argc > 3 ? argv[3] : NULL;
  if (reps < 1 || (argc > 2 && !conv_only && !attention_bf16 && !gemm_at_b) || argc > 4) {
    fprintf(stderr,
            "usage: bench_ops [reps] [--conv | --conv-last [r18@320 | r50@512 | main@192 | i18@192]]\n"
            "       bench_ops [reps] --attention-bf16\n"
            "       bench_ops [reps] --gemm-at-b   (builds with oneDNN)\n"
            "  --conv-last: the convolutions channels last ([B, H, W, C], as the backbone runs)\n"
            "  --attention-bf16: attention's per-head GEMMs in fp32 and bf16, and bf16 mode's choice\n"
            "  --gemm-at-b: C = A^T B on oneDNN's sgemm against OpenBLAS's, and where cpu_gemm takes which\n");
    return 2;
  }
  char gemm[96];
  printf("threads: OpenBLAS %d; GEMM: %s\n", openblas_get_num_threads(), cpu_gemm_library(gemm, sizeof gemm));
  if (attention_bf16) {
    bench_attention_bf16(reps);
    return 0;
  }
#if DETR_HAVE_ONEDNN
  if (gemm_at_b) {
    bench_gemm_at_b(reps);
    return 0;
  }
#endif
  if (!conv_only) {
    // Transformer shapes: hidden 256, FFN 2048, a 25x38 feature map of 2 images (1900 tokens).
    bench_matmul(256, 256, 2048, reps);
    bench_matmul(256, 2048, 256, reps);
    bench_matmul(1900, 256, 256, reps);
    bench_matmul(1900, 2048, 256, reps);
    bench_matmul(1900, 256, 2048, reps);
    // The main job's (hidden 128, FFN 512, batch 4): encoder on 12x12 maps, decoder on 10 queries.
    bench_matmul(576, 128, 128, reps);
    bench_matmul(576, 512, 128, reps);
    bench_matmul(576, 128, 512, reps);
    bench_matmul(40, 128, 128, reps);
    bench_matmul(40, 512, 128, reps);
    // Per-head attention products: the main job's (8 heads x 4 images, 144 tokens, 16 per head)
    // and larger ones, up to past the one-per-thread limit.
    bench_gemm_batched(32, 144, 144, 16, reps);
    bench_gemm_batched(32, 144, 16, 144, reps);
    bench_gemm_batched(16, 256, 256, 32, reps);
    bench_gemm_batched(16, 576, 576, 16, reps);
    bench_gemm_batched(8, 1024, 1024, 32, reps);
  }
  bench_detr_convs(reps, only_model, channels_last);
  return 0;
}
