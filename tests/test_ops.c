// Forward values of the ops against straightforward loops, and clear failures on bad shapes.
#define _POSIX_C_SOURCE 200809L  // fork, pipe, dup2 under -std=c11
#include <check.h>
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/runtime.h"
#include "kernels/cpu/conv_onednn.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/norm_math.h"
#include "kernels/rng_math.h"
#include "tests/gradcheck.h"

static float at4(const Tensor *t, int64_t a, int64_t b, int64_t c, int64_t d) {
  return t->data[((a * t->shape.d[1] + b) * t->shape.d[2] + c) * t->shape.d[3] + d];
}

// Element (n, c, y, x) of a map held as [N, C, H, W] or, channels last, [N, H, W, C].
static float at_nchw(const Tensor *t, bool channels_last, int64_t n, int64_t c, int64_t y, int64_t x) {
  return channels_last ? at4(t, n, y, x, c) : at4(t, n, c, y, x);
}

// Every CPU convolution implementation of this build (AUTO's per-shape choice, then each forced;
// Winograd forced on a shape oneDNN has none for runs its direct convolution).
static const ConvImpl conv_impls[] = {CONV_IMPL_AUTO, CONV_IMPL_IM2COL, CONV_IMPL_ONEDNN, CONV_IMPL_ONEDNN_PLAIN,
                                      CONV_IMPL_ONEDNN_WINOGRAD};
static const int n_conv_impls = DETR_HAVE_ONEDNN ? 5 : 2;

// Convolution cases: odd sizes, stride, padding and dilation per axis, an output size that floors
// (the last input rows unread), channels that are not a multiple of oneDNN's 16-channel blocks, and
// one that oneDNN's Winograd runs (3x3, stride 1, 16-channel blocks; conv2d_winograd_runs).
static const struct {
  int64_t x[4], w[4];  // [B, C, H, W], [O, C, KH, KW]
  Conv2dParams p;
} conv_cases[] = {
    {{2, 3, 9, 8}, {5, 3, 3, 3}, {1, 1, 1, 1, 1, 1}},     {{1, 4, 11, 10}, {3, 4, 3, 3}, {2, 2, 1, 1, 1, 1}},
    {{1, 2, 10, 9}, {2, 2, 3, 3}, {1, 1, 2, 2, 2, 2}},    {{1, 3, 15, 13}, {4, 3, 7, 7}, {2, 2, 3, 3, 1, 1}},
    {{2, 6, 5, 5}, {4, 6, 1, 1}, {1, 1, 0, 0, 1, 1}},     {{2, 20, 8, 7}, {18, 20, 1, 1}, {2, 2, 0, 0, 1, 1}},
    {{2, 24, 9, 12}, {33, 24, 3, 3}, {2, 1, 0, 1, 1, 2}}, {{1, 17, 12, 11}, {16, 17, 3, 2}, {3, 2, 2, 1, 2, 1}},
    {{2, 16, 9, 10}, {32, 16, 3, 3}, {1, 1, 1, 1, 1, 1}}};

// A convolution workspace of n floats, 64-byte aligned as the kernels require (free() it).
static float *conv_workspace(int64_t n) {
  size_t bytes = ((size_t)(n > 0 ? n : 1) * sizeof(float) + 63) / 64 * 64;
  float *ws = aligned_alloc(64, bytes);
  ck_assert_ptr_nonnull(ws);
  return ws;
}

// The convolution kernels with a workspace of exactly the size asked for the call, followed by a
// guard that must come back untouched: a pass that needs more than its size says fails here.
enum { WS_GUARD = 256 };
static const float ws_sentinel = -1234.5f;
static float *guarded_workspace(int64_t n) {
  float *ws = conv_workspace(n + WS_GUARD);
  for (int i = 0; i < WS_GUARD; i++) ws[n + i] = ws_sentinel;
  return ws;
}
static void check_guard(const float *ws, int64_t n, const char *what, const ConvGeom *g) {
  for (int i = 0; i < WS_GUARD; i++)
    ck_assert_msg(ws[n + i] == ws_sentinel,
                  "%s (%lldx%lld, %lld -> %lld channels, channels last %d, impl %d): wrote "
                  "past its %lld-float workspace",
                  what, (long long)g->in_h, (long long)g->in_w, (long long)g->in_ch, (long long)g->out_ch,
                  g->channels_last, (int)cpu_conv2d_impl(g, CONV_PASS_FWD), (long long)n);
}
static void conv_forward_guarded(const float *x, const float *w, const float *bias, float *y, const ConvGeom *g) {
  int64_t n = cpu_conv2d_forward_workspace_floats(g, bias != NULL);
  float *ws = guarded_workspace(n);
  cpu_conv2d_forward(x, NULL, w, bias, y, g, ws);
  check_guard(ws, n, "forward", g);
  free(ws);
}
static void conv_backward_guarded(const float *x, const float *w, const float *dy, float *dx, bool set_dx, float *dw,
                                  bool set_dw, float *dbias, const ConvGeom *g) {
  int64_t n = cpu_conv2d_backward_workspace_floats(g, dx != NULL, set_dx, dw != NULL, set_dw, dbias != NULL);
  float *ws = guarded_workspace(n);
  cpu_conv2d_backward(x, NULL, w, dy, NULL, dx, set_dx, dw, set_dw, dbias, g, ws);
  check_guard(ws, n, "backward", g);
  free(ws);
}

// oneDNN's passes run on the whole batch or, above a size, one image at a time: _i == 1 forces
// the second on these small cases (the loop tests run twice, "per_image" in the messages).
START_TEST(conv2d_matches_direct_loops) {
  onednn_conv2d_set_whole_batch_bytes(_i == 1 ? 0 : -1);
  for (int i = 0; i < 2 * n_conv_impls * (int)(sizeof conv_cases / sizeof conv_cases[0]); i++) {
    int impl = i % n_conv_impls;
    bool last = i / n_conv_impls % 2;  // each case nchw, then channels last
    size_t k = (size_t)i / (size_t)(2 * n_conv_impls);
    cpu_conv2d_set_impl(conv_impls[impl]);
    ScopeMark mark = tensor_scope_mark();
    const int64_t *xd = conv_cases[k].x, *wd = conv_cases[k].w;
    Tensor *x =
        test_uniform(last ? SHAPE(xd[0], xd[2], xd[3], xd[1]) : SHAPE(xd[0], xd[1], xd[2], xd[3]), -1, 1, k, false);
    Tensor *w = test_uniform(SHAPE(wd[0], wd[1], wd[2], wd[3]), -1, 1, 10 + k, false);
    Tensor *b = test_uniform(SHAPE(wd[0]), -1, 1, 20 + k, false);
    Conv2dParams p = conv_cases[k].p;
    p.channels_last = last;
    Tensor *y = op_conv2d(x, w, b, p);
    int64_t O = wd[0], HO = y->shape.d[last ? 1 : 2], WO = y->shape.d[last ? 2 : 3];
    ck_assert_int_eq(y->shape.d[last ? 3 : 1], O);
    double worst = 0;
    for (int64_t n = 0; n < xd[0]; n++)
      for (int64_t o = 0; o < O; o++)
        for (int64_t oy = 0; oy < HO; oy++)
          for (int64_t ox = 0; ox < WO; ox++) {
            double s = b->data[o];
            for (int64_t c = 0; c < xd[1]; c++)
              for (int64_t ky = 0; ky < w->shape.d[2]; ky++)
                for (int64_t kx = 0; kx < w->shape.d[3]; kx++) {
                  int64_t iy = oy * p.stride_h - p.pad_h + ky * p.dilation_h;
                  int64_t ix = ox * p.stride_w - p.pad_w + kx * p.dilation_w;
                  if (iy < 0 || ix < 0 || iy >= xd[2] || ix >= xd[3]) continue;
                  s += (double)at_nchw(x, last, n, c, iy, ix) * at4(w, o, c, ky, kx);
                }
            worst = fmax(worst, fabs(s - at_nchw(y, last, n, o, oy, ox)));
          }
    ck_assert_msg(worst < 1e-4, "implementation %d, case %zu, channels last %d, per_image %d: max error %g",
                  (int)conv_impls[impl], k, last, _i, worst);
    tensor_release(x);
    tensor_release(w);
    tensor_release(b);
    tensor_scope_release(mark);
  }
  cpu_conv2d_set_impl(CONV_IMPL_AUTO);
  onednn_conv2d_set_whole_batch_bytes(-1);
}
END_TEST

static float *host_uniform(int64_t n, uint64_t seed) {
  float *h = malloc((size_t)n * sizeof(float));
  ck_assert_ptr_nonnull(h);
  cpu_uniform(h, n, seed, 0, -1, 1);
  return h;
}

// The backward kernels of every implementation agree with im2col + sgemm, accumulate onto what dx,
// dw and dbias held, run each gradient alone, and give the same bits run to run.
START_TEST(conv2d_backward_implementations_agree) {
  onednn_conv2d_set_whole_batch_bytes(_i == 1 ? 0 : -1);
  for (size_t kl = 0; kl < 2 * sizeof conv_cases / sizeof conv_cases[0]; kl++) {
    size_t k = kl / 2;  // each case nchw, then channels last (the same buffer sizes)
    Conv2dParams p = conv_cases[k].p;
    const int64_t *xd = conv_cases[k].x, *wd = conv_cases[k].w;
    ConvGeom g = {.batch = xd[0],
                  .in_ch = xd[1],
                  .in_h = xd[2],
                  .in_w = xd[3],
                  .out_ch = wd[0],
                  .kh = wd[2],
                  .kw = wd[3],
                  .stride_h = p.stride_h,
                  .stride_w = p.stride_w,
                  .pad_h = p.pad_h,
                  .pad_w = p.pad_w,
                  .dil_h = p.dilation_h,
                  .dil_w = p.dilation_w,
                  .channels_last = (int)(kl % 2)};
    g.out_h = conv_out_size(g.in_h, g.kh, g.stride_h, g.pad_h, g.dil_h);
    g.out_w = conv_out_size(g.in_w, g.kw, g.stride_w, g.pad_w, g.dil_w);
    int64_t nx = g.batch * g.in_ch * g.in_h * g.in_w, nw = g.out_ch * g.in_ch * g.kh * g.kw;
    int64_t ny = g.batch * g.out_ch * g.out_h * g.out_w, nb = g.out_ch;
    float *x = host_uniform(nx, 100 + k), *w = host_uniform(nw, 200 + k), *dy = host_uniform(ny, 300 + k);
    float *dx0 = host_uniform(nx, 400 + k), *dw0 = host_uniform(nw, 500 + k), *db0 = host_uniform(nb, 600 + k);
    float *ref[3] = {NULL, NULL, NULL};  // dx, dw, dbias of im2col + sgemm
    for (int impl = 1; impl < n_conv_impls; impl++) {
      cpu_conv2d_set_impl(conv_impls[impl]);
      float *y = malloc((size_t)ny * sizeof(float));  // the forward's workspace checked too
      conv_forward_guarded(x, w, db0, y, &g);
      free(y);
      float *grads[2][3];  // two runs: dx, dw, dbias from dx0, dw0, db0
      for (int run = 0; run < 3; run++) {
        if (run == 2) {  // dx and dw written (set_dx, set_dw) over NaN: the terms added to zeros, bit for bit
          int64_t nmax = nx > nw ? nx : nw;
          float *fresh = malloc((size_t)nmax * sizeof(float)), *zeros = malloc((size_t)nmax * sizeof(float));
          for (int t = 0; t < 2; t++) {  // dx, then dw
            int64_t nt = t ? nw : nx;
            for (int64_t i = 0; i < nt; i++) fresh[i] = NAN, zeros[i] = 0.0f;
            conv_backward_guarded(t ? x : NULL, t ? NULL : w, dy, t ? NULL : fresh, !t, t ? fresh : NULL, t, NULL, &g);
            conv_backward_guarded(t ? x : NULL, t ? NULL : w, dy, t ? NULL : zeros, false, t ? zeros : NULL, false,
                                  NULL, &g);
            ck_assert_msg(!memcmp(fresh, zeros, (size_t)nt * sizeof(float)),
                          "implementation %d, case %zu, channels last %d, per_image %d: %s written differs from %s "
                          "added to zeros",
                          (int)conv_impls[impl], k, g.channels_last, _i, t ? "dw" : "dx", t ? "dw" : "dx");
          }
          free(fresh), free(zeros);
          continue;
        }
        float **gr = grads[run];
        gr[0] = malloc((size_t)nx * sizeof(float)), gr[1] = malloc((size_t)nw * sizeof(float));
        gr[2] = malloc((size_t)nb * sizeof(float));
        memcpy(gr[0], dx0, (size_t)nx * sizeof(float));
        memcpy(gr[1], dw0, (size_t)nw * sizeof(float));
        memcpy(gr[2], db0, (size_t)nb * sizeof(float));
        if (run == 0) {
          conv_backward_guarded(x, w, dy, gr[0], false, gr[1], false, gr[2], &g);
        } else {  // one gradient at a time: the same sums
          conv_backward_guarded(NULL, w, dy, gr[0], false, NULL, false, NULL, &g);
          conv_backward_guarded(x, NULL, dy, NULL, false, gr[1], false, gr[2], &g);
        }
      }
      int64_t n[3] = {nx, nw, nb};
      for (int t = 0; t < 3; t++) {
        ck_assert_msg(!memcmp(grads[0][t], grads[1][t], (size_t)n[t] * sizeof(float)),
                      "implementation %d, case %zu, channels last %d, gradient %d: not the same bits alone and "
                      "together",
                      (int)conv_impls[impl], k, g.channels_last, t);
        if (impl == 1) {
          ref[t] = grads[0][t];
        } else {
          double err = max_rel_diff(grads[0][t], ref[t], n[t]);
          ck_assert_msg(err < 1e-5,
                        "implementation %d, case %zu, channels last %d, gradient %d, per_image %d: "
                        "relative error %g",
                        (int)conv_impls[impl], k, g.channels_last, t, _i, err);
          free(grads[0][t]);
        }
        free(grads[1][t]);
      }
    }
    for (int t = 0; t < 3; t++) free(ref[t]);
    free(x), free(w), free(dy), free(dx0), free(dw0), free(db0);
  }
  cpu_conv2d_set_impl(CONV_IMPL_AUTO);
  onednn_conv2d_set_whole_batch_bytes(-1);
}
END_TEST

// Winograd runs where oneDNN has it (AVX-512: the conv cases above then test it) and is AUTO's
// choice where bench_ops measured it faster and, for a backward pass, its workspace is not too
// large (conv.c; at 2 threads, as measured: the workspace grows with the thread count); forced on
// a geometry it does not cover, or on a CPU without it, the direct convolution runs.
START_TEST(conv2d_winograd_runs) {
  if (!DETR_HAVE_ONEDNN) return;
  omp_set_num_threads(2);  // this test's own process (Check forks one per test)
  bool avx512_core = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  ck_assert_int_eq(onednn_conv2d_has_winograd(), avx512_core);
  ConvGeom g = {.batch = 2,
                .in_ch = 16,
                .in_h = 9,
                .in_w = 10,
                .out_ch = 32,
                .out_h = 9,
                .out_w = 10,
                .kh = 3,
                .kw = 3,
                .stride_h = 1,
                .stride_w = 1,
                .pad_h = 1,
                .pad_w = 1,
                .dil_h = 1,
                .dil_w = 1};
  ConvGeom strided = g;
  strided.stride_h = strided.stride_w = 2, strided.out_h = 5, strided.out_w = 5;
  for (int last = 0; last < 2; last++) {
    g.channels_last = strided.channels_last = last;
    for (int pass = 0; pass < 3; pass++) {
      const char *name = onednn_conv2d_impl(&g, (ConvPass)pass, CONV_IMPL_ONEDNN_WINOGRAD);
      ck_assert_msg((strstr(name, "wino") != NULL) == avx512_core, "pass %d, channels last %d: %s on a CPU %s AVX-512",
                    pass, last, name, avx512_core ? "with" : "without");
      ck_assert_int_eq(onednn_conv2d_winograd_workspace_floats(&g, (ConvPass)pass) > 0, avx512_core);
      if (avx512_core)  // from the descriptor, as the pass itself takes it
        ck_assert_int_eq(onednn_conv2d_winograd_workspace_floats(&g, (ConvPass)pass),
                         onednn_conv2d_workspace_floats(&g, (ConvPass)pass, CONV_IMPL_ONEDNN_WINOGRAD, false, false));
      ck_assert_int_eq(onednn_conv2d_winograd_workspace_floats(&strided, (ConvPass)pass), -1);
      char direct[128];
      snprintf(direct, sizeof direct, "%s", onednn_conv2d_impl(&strided, (ConvPass)pass, CONV_IMPL_ONEDNN));
      ck_assert_str_eq(onednn_conv2d_impl(&strided, (ConvPass)pass, CONV_IMPL_ONEDNN_WINOGRAD), direct);
    }
  }
  // AUTO on the backbone's (channels last) 3x3 stride-1 convolutions: r18@320's layer2, layer4's
  // 10x10, and r50@512's layer3, whose Winograd backward workspaces are over the limit. Without
  // AVX-512, im2col where conv.c's avx2_im2col_wins measured it faster: every backward-weights
  // from 64 channels, the forward from 128, backward-data from 128-256 at stride 1.
  ck_assert_int_eq(cpu_has_avx512(), avx512_core);
  ConvImpl wino_or_im2col = avx512_core ? CONV_IMPL_ONEDNN_WINOGRAD : CONV_IMPL_IM2COL;
  ConvImpl avx2_im2col = avx512_core ? CONV_IMPL_ONEDNN : CONV_IMPL_IM2COL;
  ConvGeom r18 = {.batch = 2,
                  .in_ch = 128,
                  .in_h = 40,
                  .in_w = 40,
                  .out_ch = 128,
                  .out_h = 40,
                  .out_w = 40,
                  .kh = 3,
                  .kw = 3,
                  .stride_h = 1,
                  .stride_w = 1,
                  .pad_h = 1,
                  .pad_w = 1,
                  .dil_h = 1,
                  .dil_w = 1,
                  .channels_last = 1};
  // A backward pass whose Winograd workspace is over the cap goes direct. That workspace depends on
  // oneDNN's blocking for the CPU's caches: r18's backward-weights takes 19 MB on a Zen 4, 27 MB on
  // a Xeon with 2 MB of L2 per core.
  for (int pass = 0; pass < 3; pass++) {
    int64_t bytes = onednn_conv2d_winograd_workspace_floats(&r18, (ConvPass)pass) * (int64_t)sizeof(float);
    bool fits = pass == CONV_PASS_FWD || bytes <= CPU_WINOGRAD_BACKWARD_MAX_BYTES;
    ck_assert_int_eq(cpu_conv2d_impl(&r18, (ConvPass)pass), fits ? wino_or_im2col : avx2_im2col);
  }
  ConvGeom r18_layer4 = r18;
  r18_layer4.in_ch = r18_layer4.out_ch = 512, r18_layer4.in_h = r18_layer4.in_w = 10;
  r18_layer4.out_h = r18_layer4.out_w = 10;
  ck_assert_int_eq(cpu_conv2d_impl(&r18_layer4, CONV_PASS_FWD), avx2_im2col);
  ck_assert_int_eq(cpu_conv2d_impl(&r18_layer4, CONV_PASS_BWD_DATA), CONV_IMPL_ONEDNN);
  ck_assert_int_eq(cpu_conv2d_impl(&r18_layer4, CONV_PASS_BWD_WEIGHTS), avx2_im2col);
  ConvGeom r50 = r18;
  r50.in_ch = r50.out_ch = 256, r50.in_h = r50.in_w = r50.out_h = r50.out_w = 32;
  ck_assert_int_eq(cpu_conv2d_impl(&r50, CONV_PASS_FWD), wino_or_im2col);
  for (int pass = 1; pass < 3; pass++) ck_assert_int_eq(cpu_conv2d_impl(&r50, (ConvPass)pass), avx2_im2col);
  ConvGeom r50_layer1 = r18;  // 64 channels: oneDNN's, but for backward-weights without AVX-512
  r50_layer1.in_ch = r50_layer1.out_ch = 64,
  r50_layer1.in_h = r50_layer1.in_w = r50_layer1.out_h = r50_layer1.out_w = 128;
  ck_assert_int_eq(cpu_conv2d_impl(&r50_layer1, CONV_PASS_FWD),
                   avx512_core ? CONV_IMPL_ONEDNN_WINOGRAD : CONV_IMPL_ONEDNN);
  if (!avx512_core) {  // (with AVX-512 the backward passes' Winograd depends on its workspace)
    ck_assert_int_eq(cpu_conv2d_impl(&r50_layer1, CONV_PASS_BWD_DATA), CONV_IMPL_ONEDNN);
    ck_assert_int_eq(cpu_conv2d_impl(&r50_layer1, CONV_PASS_BWD_WEIGHTS), CONV_IMPL_IM2COL);
    ConvGeom down = r50_layer1;  // stride 2 from 64 channels (r18@320's layer2): backward-data too
    down.stride_h = down.stride_w = 2, down.out_ch = 128, down.out_h = down.out_w = 64;
    ck_assert_int_eq(cpu_conv2d_impl(&down, CONV_PASS_FWD), CONV_IMPL_ONEDNN);
    ck_assert_int_eq(cpu_conv2d_impl(&down, CONV_PASS_BWD_DATA), CONV_IMPL_IM2COL);
    ck_assert_int_eq(cpu_conv2d_impl(&down, CONV_PASS_BWD_WEIGHTS), CONV_IMPL_IM2COL);
    ConvGeom narrow = down;  // under 64 channels (the main job's): oneDNN's in every pass
    narrow.in_ch = 32, narrow.out_ch = 64;
    for (int pass = 0; pass < 3; pass++) ck_assert_int_eq(cpu_conv2d_impl(&narrow, (ConvPass)pass), CONV_IMPL_ONEDNN);
  }
}
END_TEST

// More distinct shapes than oneDNN's primitive cache holds (256, as a training run with a new input
// size every step sees): evicted primitives are destroyed and re-created, results unchanged.
START_TEST(conv2d_primitive_cache_turns_over) {
  if (!DETR_HAVE_ONEDNN) return;
  enum { MAX_HW = 9 * 45 };  // in_h 3..9, in_w 3..45
  float x[2 * MAX_HW], w[3 * 2 * 3 * 3], y[2][3 * MAX_HW];
  cpu_uniform(x, 2 * MAX_HW, 1, 0, -1, 1);
  cpu_uniform(w, 3 * 2 * 3 * 3, 2, 0, -1, 1);
  for (int i = 0; i < 300 + 1; i++) {
    int s = i % 300;  // the last one is the first again, long evicted
    ConvGeom g = {.batch = 1,
                  .in_ch = 2,
                  .in_h = 3 + s % 7,
                  .in_w = 3 + s / 7,
                  .out_ch = 3,
                  .kh = 3,
                  .kw = 3,
                  .stride_h = 1,
                  .stride_w = 1,
                  .pad_h = 1,
                  .pad_w = 1,
                  .dil_h = 1,
                  .dil_w = 1};
    g.out_h = g.in_h, g.out_w = g.in_w;
    for (int k = 0; k < 2; k++) {
      cpu_conv2d_set_impl(k ? CONV_IMPL_ONEDNN : CONV_IMPL_IM2COL);
      conv_forward_guarded(x, w, NULL, y[k], &g);
    }
    double err = max_rel_diff(y[1], y[0], g.out_ch * g.out_h * g.out_w);
    ck_assert_msg(err < 1e-5, "shape %d (%lldx%lld): relative error %g", i, (long long)g.in_h, (long long)g.in_w, err);
  }
  cpu_conv2d_set_impl(CONV_IMPL_AUTO);
}
END_TEST

START_TEST(maxpool_matches_torch_semantics) {
  // 1x1x4x4, kernel 3, stride 2, pad 1 (ResNet's stem pool): out 2x2, padding never wins.
  float x[16] = {-5, -1, -2, -3, -4, -6, -7, -8, -9, -10, -11, -12, -13, -14, -15, -16};
  Tensor *t = tensor_from_host(DEVICE_CPU, SHAPE(1, 1, 4, 4), x);
  ScopeMark mark = tensor_scope_mark();
  Tensor *y = op_maxpool2d(t, 3, 2, 1, false);
  ck_assert_int_eq(y->shape.d[2], 2);
  ck_assert_float_eq(y->data[0], -1);  // window rows 0-1, cols 0-1
  ck_assert_float_eq(y->data[1], -1);  // rows 0-1, cols 1-3
  ck_assert_float_eq(y->data[2], -4);  // rows 1-3, cols 0-1
  ck_assert_float_eq(y->data[3], -6);
  tensor_scope_release(mark);
  tensor_release(t);
}
END_TEST

// The CPU max-pool (tap by tap over rows of outputs, stride 2 inlined) against a plain scan of each
// window in tap order - the first maximum wins, a NaN always takes (maxpool_takes) - values and
// argmax bit for bit, over kernels 1-4, strides 1-3, padding up to half the kernel, odd sizes, 3
// and 20 channels (channels last runs blocks of 16 channels: one and a rest), on inputs full of
// ties, -inf and NaN. Without argmax (inference) both layouts give the same floats.
START_TEST(maxpool_matches_window_scan) {
  float vals[] = {0.0f, 1.0f, 1.0f, -1.0f, 2.0f, -INFINITY, NAN, 2.0f};
  int cases = 0;
  for (int channels = 3; channels <= 20; channels += 17)  // channels last without argmax: 16 + a rest
    for (int k = 1; k <= 4; k++)
      for (int stride = 1; stride <= 3; stride++)
        for (int pad = 0; 2 * pad <= k; pad++)
          for (int size = k; size <= 11; size += 3) {
            ConvGeom g = {.batch = 2,
                          .in_ch = channels,
                          .in_h = size,
                          .in_w = size + 2,
                          .out_ch = channels,
                          .kh = k,
                          .kw = k,
                          .stride_h = stride,
                          .stride_w = stride,
                          .pad_h = pad,
                          .pad_w = pad,
                          .dil_h = 1,
                          .dil_w = 1};
            g.out_h = conv_out_size(g.in_h, k, stride, pad, 1), g.out_w = conv_out_size(g.in_w, k, stride, pad, 1);
            int64_t nx = g.batch * g.in_ch * g.in_h * g.in_w, ny = g.batch * g.in_ch * g.out_h * g.out_w;
            float *x = malloc((size_t)nx * 4), *y = malloc((size_t)ny * 4);
            int32_t *at = malloc((size_t)ny * 4);
            ck_assert(x && y && at);
            for (int64_t i = 0; i < nx; i++) x[i] = vals[(i * 2654435761u + (uint64_t)cases) % 8];
            cpu_maxpool2d_forward(x, y, at, &g);
            for (int64_t p = 0; p < g.batch * g.in_ch; p++)
              for (int64_t oy = 0; oy < g.out_h; oy++)
                for (int64_t ox = 0; ox < g.out_w; ox++) {
                  float best = -FLT_MAX;
                  int32_t best_at = -1;
                  for (int ky = 0; ky < k; ky++)
                    for (int kx = 0; kx < k; kx++) {
                      int64_t iy = oy * stride - pad + ky, ix = ox * stride - pad + kx;
                      if (iy < 0 || iy >= g.in_h || ix < 0 || ix >= g.in_w) continue;
                      float v = x[p * g.in_h * g.in_w + iy * g.in_w + ix];
                      if (maxpool_takes(v, best, best_at)) best = v, best_at = (int32_t)(iy * g.in_w + ix);
                    }
                  int64_t o = (p * g.out_h + oy) * g.out_w + ox;
                  ck_assert_msg(!memcmp(&y[o], &best, 4) && at[o] == best_at,
                                "k %d stride %d pad %d size %d, output %lld: %g at %d, want %g at %d", k, stride, pad,
                                size, (long long)o, y[o], at[o], best, best_at);
                }
            // Channels last on the same values, permuted: the same floats and argmax, bit for bit.
            ConvGeom gl = g;
            gl.channels_last = 1;
            float *xl = malloc((size_t)nx * 4), *yl = malloc((size_t)ny * 4);
            int32_t *atl = malloc((size_t)ny * 4);
            ck_assert(xl && yl && atl);
            int64_t C = g.in_ch, HW = g.in_h * g.in_w, OHW = g.out_h * g.out_w;
            for (int64_t i = 0; i < nx; i++) xl[conv_offset(1, i / (C * HW), i / HW % C, i % HW, C, HW)] = x[i];
            cpu_maxpool2d_forward(xl, yl, atl, &gl);
            for (int64_t o = 0; o < ny; o++) {
              int64_t ol = conv_offset(1, o / (C * OHW), o / OHW % C, o % OHW, C, OHW);
              ck_assert_msg(!memcmp(&yl[ol], &y[o], 4) && atl[ol] == at[o],
                            "channels last: k %d stride %d pad %d size %d, output %lld: %g at %d, want %g at %d", k,
                            stride, pad, size, (long long)o, yl[ol], atl[ol], y[o], at[o]);
            }
            // Without argmax: the floats with it (y, checked above), both layouts.
            float *y2 = malloc((size_t)ny * 4);
            ck_assert(y2);
            cpu_maxpool2d_forward(x, y2, NULL, &g);
            cpu_maxpool2d_forward(xl, yl, NULL, &gl);
            for (int64_t o = 0; o < ny; o++) {
              int64_t ol = conv_offset(1, o / (C * OHW), o / OHW % C, o % OHW, C, OHW);
              ck_assert_msg(!memcmp(&y2[o], &y[o], 4) && !memcmp(&yl[ol], &y[o], 4),
                            "no argmax: k %d stride %d pad %d size %d C %d, output %lld: nchw %g, channels last %g, "
                            "want %g",
                            k, stride, pad, size, channels, (long long)o, y2[o], yl[ol], y[o]);
            }
            free(y2);
            free(xl), free(yl), free(atl);
            free(x), free(y), free(at);
            cases++;
          }
  ck_assert_int_gt(cases, 100);
}
END_TEST

// Frozen batch norm (+ residual + ReLU) channels last, the kernels' [B*H*W, C, 1] view, against
// the nchw [B, C, H*W] kernels on the same values permuted: forward and both gradients, bit for bit.
// Under ReLU the mask the forward writes (one bit per element) is y > 0, element by element - rows
// of whole bytes (8, 16 and 320 elements) and rows that share bytes (5, 12, 13).
static void check_frozen_bn_layouts(int64_t B, int64_t C, int64_t HW) {
  int64_t N = B * C * HW;
  float *buf = malloc(sizeof(float) * (size_t)(17 * N + 6 * C));
  int64_t *to_last = malloc(sizeof(int64_t) * (size_t)N);  // nchw index -> channels-last index
  uint8_t *mask = malloc((size_t)(N + 7) / 8), *maskl = malloc((size_t)(N + 7) / 8);
  float *x = buf, *res = x + N, *dy = res + N, *xl = dy + N, *resl = xl + N, *dyl = resl + N, *y = dyl + N;
  float *yl = y + N, *dx = yl + N, *dxl = dx + N, *dr = dxl + N, *drl = dr + N, *scale = drl + N, *scalel = scale + C;
  float *w = scalel + C, *bias = w + C, *mean = bias + C, *var = mean + C, *dr0 = var + C;  // dr0: dr before
  cpu_uniform(x, N, 1, 0, -1, 1), cpu_uniform(res, N, 2, 0, -1, 1), cpu_uniform(dy, N, 3, 0, -1, 1);
  cpu_uniform(w, C, 4, 0, 0.5f, 1.5f), cpu_uniform(bias, C, 5, 0, -1, 1), cpu_uniform(mean, C, 6, 0, -1, 1);
  cpu_uniform(var, C, 7, 0, 0.2f, 2.0f);
  for (int64_t i = 0; i < N; i++) to_last[i] = conv_offset(1, i / (C * HW), i / HW % C, i % HW, C, HW);
  for (int64_t i = 0; i < N; i++) xl[to_last[i]] = x[i], resl[to_last[i]] = res[i], dyl[to_last[i]] = dy[i];
  for (int relu = 0; relu < 2; relu++) {
    memset(mask, 0xA5, (size_t)(N + 7) / 8), memset(maskl, 0x5A, (size_t)(N + 7) / 8);
    cpu_frozen_bn_forward(x, w, bias, mean, var, 1e-5f, res, relu, y, mask, scale, B, C, HW);
    cpu_frozen_bn_forward(xl, w, bias, mean, var, 1e-5f, resl, relu, yl, maskl, scalel, B * HW, C, 1);
    ck_assert(!memcmp(scale, scalel, sizeof(float) * (size_t)C));
    for (int64_t i = 0; relu && i < N; i++)
      ck_assert_msg(relu_mask_bit(mask, i) == (y[i] > 0) && relu_mask_bit(maskl, i) == (yl[i] > 0),
                    "C %lld HW %lld element %lld: the ReLU mask's bit is not y > 0", (long long)C, (long long)HW,
                    (long long)i);
    cpu_uniform(dx, N, 8, 0, -1, 1), cpu_uniform(dr, N, 9, 0, -1, 1);  // both accumulate
    for (int64_t i = 0; i < N; i++) dxl[to_last[i]] = dx[i], drl[to_last[i]] = dr[i], dr0[i] = dr[i];
    cpu_frozen_bn_backward(mask, dy, scale, relu, dx, false, dr, false, B, C, HW);
    cpu_frozen_bn_backward(maskl, dyl, scalel, relu, dxl, false, drl, false, B * HW, C, 1);
    for (int64_t i = 0; i < N; i++) {
      ck_assert_msg(!memcmp(&yl[to_last[i]], &y[i], 4) && !memcmp(&dxl[to_last[i]], &dx[i], 4) &&
                        !memcmp(&drl[to_last[i]], &dr[i], 4),
                    "relu %d, element %lld: y %g/%g dx %g/%g dresidual %g/%g", relu, (long long)i, yl[to_last[i]], y[i],
                    dxl[to_last[i]], dx[i], drl[to_last[i]], dr[i]);
      float g = relu && !(y[i] > 0) ? 0.0f : dy[i];  // the residual's gradient by definition
      ck_assert_msg(dr[i] == dr0[i] + g, "relu %d, element %lld: dresidual %g, want %g", relu, (long long)i, dr[i],
                    dr0[i] + g);
    }
  }
  // Written in place (autograd hands dy's buffer over): dresidual = dy itself, and, without a
  // residual, dx = dy itself, against the same gradients into separate buffers (the ReLU's mask from
  // the last forward above).
  float *alias = malloc(sizeof(float) * (size_t)N), *apart = malloc(sizeof(float) * (size_t)N);
  memcpy(alias, dy, sizeof(float) * (size_t)N);
  cpu_frozen_bn_backward(mask, alias, scale, true, NULL, false, alias, true, B, C, HW);
  cpu_frozen_bn_backward(mask, dy, scale, true, NULL, false, apart, true, B, C, HW);
  ck_assert_msg(!memcmp(alias, apart, sizeof(float) * (size_t)N), "dresidual written over dy differs");
  memcpy(alias, dy, sizeof(float) * (size_t)N);
  cpu_frozen_bn_backward(mask, alias, scale, true, alias, true, NULL, false, B, C, HW);
  cpu_frozen_bn_backward(mask, dy, scale, true, apart, true, NULL, false, B, C, HW);
  ck_assert_msg(!memcmp(alias, apart, sizeof(float) * (size_t)N), "dx written over dy differs");
  free(alias), free(apart);
  free(buf), free(to_last), free(mask), free(maskl);
}

START_TEST(frozen_bn_channels_last_matches_nchw) {
  check_frozen_bn_layouts(2, 5, 12);
  check_frozen_bn_layouts(2, 8, 16);
  check_frozen_bn_layouts(1, 5, 13);   // 65 elements: the mask's last byte holds one
  check_frozen_bn_layouts(1, 8, 320);  // nchw rows of 320: the backward's chunks of 256 and 64
}
END_TEST

// Dropout's CPU kernel (Philox blocks of 16 counters, AVX2 where the CPU has it) against the
// definition element by element: element i of the stream at `offset` is word i % 4 of counter
// offset + i / 4, kept when its draw (rng_word_to_unit) is >= p and then scaled by 1 / (1 - p).
// Lengths around the 64-element block and the 4096-element chunk; an offset whose counters carry
// into the high 32 bits; p where the threshold falls between two draws and on one exactly.
START_TEST(dropout_matches_philox_definition) {
  const int64_t ns[] = {1, 3, 63, 64, 65, 4095, 4097, 20000};
  const uint64_t offsets[] = {0, 7, 0xFFFFFFF0ull};
  const float ps[] = {0.1f, 0.5f, 0.25f, 1.0f / 16777216.0f};
  int64_t nmax = 20000;
  float *x = malloc((size_t)nmax * 4), *y = malloc((size_t)nmax * 4), *dx = malloc((size_t)nmax * 4);
  ck_assert(x && y && dx);
  for (int64_t i = 0; i < nmax; i++) x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
  int64_t dropped = 0, total = 0;
  for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
    for (size_t b = 0; b < sizeof offsets / sizeof *offsets; b++)
      for (size_t c = 0; c < sizeof ps / sizeof *ps; c++) {
        int64_t n = ns[a];
        float p = ps[c], scale = 1.0f / (1.0f - p);
        uint64_t seed = 0x1234567890ABCDEFull + a;
        cpu_dropout_forward(x, y, n, p, seed, offsets[b]);
        for (int64_t i = 0; i < n; i++) dx[i] = 0.5f;
        cpu_dropout_backward(x, dx, n, p, seed, offsets[b]);
        for (int64_t i = 0; i < n; i++) {
          bool keep = rng_word_to_unit(philox4x32(offsets[b] + (uint64_t)i / 4, seed).v[i % 4]) >= p;
          float want = keep ? x[i] * scale : 0.0f, want_dx = keep ? 0.5f + x[i] * scale : 0.5f;
          if (memcmp(&y[i], &want, 4) || memcmp(&dx[i], &want_dx, 4))
            ck_abort_msg("dropout n=%lld offset=%llu p=%g element %lld: y %a dx %a, want %a %a", (long long)n,
                         (unsigned long long)offsets[b], p, (long long)i, y[i], dx[i], want, want_dx);
          dropped += !keep, total++;
        }
      }
  ck_assert(dropped > 0 && dropped < total);
  free(x), free(y), free(dx);
}
END_TEST

// Layer norm's forward sums rows side by side (LN_ROWS at a time) but each row in order: against
// one row at a time (each sum a chain over the row, the norm_math.h formulas), output, mean and rstd
// bit for bit, for row counts that fill groups and leave a rest (1-9), widths 1-256, with weight and
// bias or without.
START_TEST(layernorm_rows_side_by_side_bit_for_bit) {
  static const int64_t widths[] = {1, 5, 128, 256};
  Rng rng = rng_make(21);
  for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
    for (int64_t rows = 1; rows <= 9; rows++)
      for (int affine = 0; affine < 2; affine++) {
        int64_t n = widths[wi], N = rows * n;
        float *buf = malloc(sizeof(float) * (size_t)(3 * N + 2 * n + 4 * rows));
        ck_assert(buf);
        float *x = buf, *y = x + N, *want = y + N, *w = want + N, *b = w + n, *mean = b + n, *rstd = mean + rows;
        float *want_mean = rstd + rows, *want_rstd = want_mean + rows;
        for (int64_t i = 0; i < N; i++) x[i] = 6.0f * rng_next_uniform(&rng) - 1.5f;
        for (int64_t j = 0; j < n; j++) w[j] = 0.5f + rng_next_uniform(&rng), b[j] = rng_next_uniform(&rng) - 0.5f;
        const float *wp = affine ? w : NULL, *bp = affine ? b : NULL;
        cpu_layernorm_forward(x, wp, bp, y, mean, rstd, rows, n, 1e-5f);
        for (int64_t r = 0; r < rows; r++) {
          const float *xr = x + r * n;
          double s = 0.0, ss = 0.0;
          for (int64_t j = 0; j < n; j++) s += xr[j];
          double mu = s / (double)n;
          for (int64_t j = 0; j < n; j++) ss += (xr[j] - mu) * (xr[j] - mu);
          want_mean[r] = (float)mu, want_rstd[r] = layernorm_rstd(ss, n, 1e-5f);
          for (int64_t j = 0; j < n; j++)
            want[r * n + j] = layernorm_elem(xr[j], want_mean[r], want_rstd[r], wp ? wp[j] : 1.0f, bp ? bp[j] : 0.0f);
        }
        ck_assert_msg(
            !memcmp(y, want, sizeof(float) * (size_t)N) && !memcmp(mean, want_mean, sizeof(float) * (size_t)rows) &&
                !memcmp(rstd, want_rstd, sizeof(float) * (size_t)rows),
            "%lld rows of %lld (affine %d): not the one-row-at-a-time floats", (long long)rows, (long long)n, affine);
        free(buf);
      }
}
END_TEST

START_TEST(softmax_with_mask_and_layernorm) {
  float x[6] = {1, 2, 3, 1, 2, 3};
  float m[6] = {0, 0, 0, 0, -INFINITY, -INFINITY};
  Tensor *t = tensor_from_host(DEVICE_CPU, SHAPE(2, 1, 3), x), *mask = tensor_from_host(DEVICE_CPU, SHAPE(2, 3), m);
  ScopeMark mark = tensor_scope_mark();
  Tensor *y = op_softmax(t, mask);
  double z = exp(1) + exp(2) + exp(3);
  ck_assert_double_eq_tol(y->data[2], exp(3) / z, 1e-6);
  ck_assert_float_eq(y->data[3], 1.0f);
  ck_assert_float_eq(y->data[4], 0.0f);
  Tensor *ly = op_log_softmax(t, NULL);
  ck_assert_double_eq_tol(ly->data[0], 1 - log(z), 1e-6);
  Tensor *ln = op_layernorm(t, NULL, NULL, 1e-5f);
  double sd = sqrt(2.0 / 3.0 + 1e-5);
  ck_assert_double_eq_tol(ln->data[0], -1 / sd, 1e-5);
  ck_assert_double_eq_tol(ln->data[1], 0, 1e-6);
  float all_masked[3] = {-INFINITY, -INFINITY, -INFINITY};
  Tensor *am = tensor_from_host(DEVICE_CPU, SHAPE(1, 3), all_masked);
  Tensor *ys = op_softmax(am, NULL);
  ck_assert_float_eq(ys->data[0], 0.0f);  // a fully masked row gives zeros, not NaN
  tensor_release(am);
  tensor_scope_release(mark);
  tensor_release(t);
  tensor_release(mask);
}
END_TEST

// kernels/exp_math.h's exp_poly against exp in double: within 1.5 ulp over its whole range (measured
// 0.98 on every 7th float of [-104.5, 89]), 0 below, inf above, NaN kept, exp(0) exactly 1.
static double ulp_at(double v) {
  float f = (float)fabs(v);
  if (f < FLT_MIN) return ldexp(1.0, -149);  // denormals: one fixed step
  int e;
  frexpf(f, &e);
  return ldexp(1.0, e - 24);
}

START_TEST(exp_poly_accuracy) {
  double worst = 0, worst_x = 0;
  for (int64_t i = 0; i <= 2000000; i++) {
    float x = (float)(-104.5 + 193.5 * (double)i / 2000000);
    double want = exp((double)x);
    float got = exp_poly(x);
    if (want > FLT_MAX) {
      ck_assert_msg(isinf(got) && got > 0, "exp_poly(%.9g) = %.9g, not +inf", x, got);
      continue;
    }
    double err = fabs(got - want) / ulp_at(want);
    if (err > worst) worst = err, worst_x = x;
  }
  ck_assert_msg(worst <= 1.5, "exp_poly: %.3g ulp from exp at %.9g", worst, worst_x);
  ck_assert_float_eq(exp_poly(0.0f), 1.0f);
  ck_assert_float_eq(exp_poly(-INFINITY), 0.0f);
  ck_assert_float_eq(exp_poly(-105.0f), 0.0f);
  ck_assert(isinf(exp_poly(INFINITY)) && isinf(exp_poly(89.0f)));
  ck_assert(isnan(exp_poly(NAN)));
  ck_assert(exp_poly(-100.0f) > 0 && exp_poly(-100.0f) < FLT_MIN);  // a denormal, as expf gives
}
END_TEST

// The softmax's vectorized exponential loop (kernels/cpu/softmax.c, an AVX2 clone where the CPU has
// it) gives the bits of the scalar element math: softmax_exp, the sum in double in order, the scale.
START_TEST(softmax_vector_path_matches_element_math) {
  enum { N = 1037 };  // not a multiple of any vector width
  float *x = malloc(N * sizeof(float));
  ck_assert_ptr_nonnull(x);
  uint64_t state = 12345;
  for (int j = 0; j < N; j++) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x[j] = -40.0f + 48.0f * (float)(state >> 40) / (float)(1 << 24);
  }
  x[5] = -INFINITY;  // a masked entry
  Tensor *t = tensor_from_host(DEVICE_CPU, SHAPE(1, N), x);
  ScopeMark mark = tensor_scope_mark();
  Tensor *y = op_softmax(t, NULL);
  float max = -INFINITY;
  for (int j = 0; j < N; j++) max = x[j] > max ? x[j] : max;
  double sum = 0;
  for (int j = 0; j < N; j++) sum += softmax_exp(x[j], max);
  float inv = softmax_inv_sum(sum);
  for (int j = 0; j < N; j++)
    ck_assert_msg(y->data[j] == softmax_elem(x[j], max, inv), "softmax[%d] = %.9g, element math %.9g", j, y->data[j],
                  softmax_elem(x[j], max, inv));
  tensor_scope_release(mark);
  tensor_release(t);
  free(x);
}
END_TEST

// Conditional DETR's inverse_sigmoid: torch's values and the gradients its clamps pass.
START_TEST(inverse_sigmoid_and_focal_values) {
  float x[6] = {-0.5f, 0.0f, 2e-6f, 0.25f, 1.0f, 1.5f};
  Tensor *t = tensor_from_host(DEVICE_CPU, SHAPE(6), x);
  tensor_set_requires_grad(t, true);
  ScopeMark mark = tensor_scope_mark();
  Tensor *y = op_inverse_sigmoid(t, 1e-5f);
  const double want[6] = {log(1e-5), log(1e-5), log(1e-5), log(1.0 / 3.0), -log(1e-5), -log(1e-5)};
  for (int i = 0; i < 6; i++) ck_assert_double_eq_tol(y->data[i], want[i], 1e-5);
  autograd_backward(op_sum_all(y));
  const double grad[6] = {0, 1, 1 / (1 - 2e-6), 1 / 0.25 + 1 / 0.75, 1, 0};  // clamps pass at their bound
  for (int i = 0; i < 6; i++) ck_assert_double_eq_tol(t->grad->data[i], grad[i], 1e-4);
  // Focal loss: alpha_t * BCE * (1 - p_t)^2 by hand, a positive and a negative logit.
  float l[2] = {0.5f, -1.0f};
  int64_t targets[2] = {0, 1};  // row 0 positive at class 0; row 1: no class (C = 1)
  Tensor *tl = tensor_from_host(DEVICE_CPU, SHAPE(2, 1), l);
  double p0 = 1 / (1 + exp(-0.5)), p1 = 1 / (1 + exp(1.0));
  double want_focal = 0.25 * -log(p0) * (1 - p0) * (1 - p0) + 0.75 * -log(1 - p1) * p1 * p1;
  ck_assert_double_eq_tol(tensor_item(op_sigmoid_focal_loss(tl, targets, 0.25f, 2.0f)), want_focal, 1e-6);
  tensor_scope_release(mark);
  tensor_release(t);
  tensor_release(tl);
}
END_TEST

START_TEST(cross_entropy_l1_and_giou_values) {
  float logits[6] = {2, 0, -1, 0.5f, 0.5f, 0.5f};
  int64_t targets[2] = {0, 2};
  float w[3] = {1, 1, 0.1f};
  Tensor *l = tensor_from_host(DEVICE_CPU, SHAPE(2, 3), logits), *wt = tensor_from_host(DEVICE_CPU, SHAPE(3), w);
  ScopeMark mark = tensor_scope_mark();
  double l0 = log(exp(2) + 1 + exp(-1)) - 2, l1 = log(3.0);
  ck_assert_double_eq_tol(tensor_item(op_cross_entropy(l, targets, wt)), (l0 + 0.1 * l1) / 1.1, 1e-6);
  ck_assert_double_eq_tol(tensor_item(op_cross_entropy(l, targets, NULL)), (l0 + l1) / 2, 1e-6);
  float a[8] = {0, 0, 2, 2, 0, 0, 1, 1}, b[8] = {1, 1, 3, 3, 2, 2, 3, 3};
  Tensor *ta = tensor_from_host(DEVICE_CPU, SHAPE(2, 4), a), *tb = tensor_from_host(DEVICE_CPU, SHAPE(2, 4), b);
  Tensor *g = op_box_giou(ta, tb);
  ck_assert_double_eq_tol(g->data[0], 1.0 / 7.0 - (9.0 - 7.0) / 9.0, 1e-6);  // I 1, U 7, E 9
  ck_assert_double_eq_tol(g->data[1], 0.0 - (9.0 - 2.0) / 9.0, 1e-6);        // disjoint
  ck_assert_double_eq_tol(tensor_item(op_l1_sum(ta, tb)), 1 + 1 + 1 + 1 + 2 + 2 + 2 + 2, 1e-6);
  float c[4] = {0.5f, 0.5f, 0.2f, 0.4f};
  Tensor *tc = tensor_from_host(DEVICE_CPU, SHAPE(1, 4), c);
  Tensor *xy = op_box_cxcywh_to_xyxy(tc), *back = op_box_xyxy_to_cxcywh(xy);
  ck_assert_double_eq_tol(xy->data[0], 0.4, 1e-6);
  ck_assert_double_eq_tol(xy->data[3], 0.7, 1e-6);
  for (int i = 0; i < 4; i++) ck_assert_double_eq_tol(back->data[i], c[i], 1e-6);
  tensor_scope_release(mark);
  Tensor *owned[] = {l, wt, ta, tb, tc};
  for (int i = 0; i < 5; i++) tensor_release(owned[i]);
}
END_TEST

START_TEST(shape_ops_and_broadcasting) {
  float x[6] = {0, 1, 2, 3, 4, 5}, r[3] = {10, 20, 30};
  Tensor *t = tensor_from_host(DEVICE_CPU, SHAPE(2, 3), x), *row = tensor_from_host(DEVICE_CPU, SHAPE(3), r);
  ScopeMark mark = tensor_scope_mark();
  Tensor *s = op_add(t, row);
  ck_assert_float_eq(s->data[4], 24);
  Tensor *col = op_reshape(op_slice(row, 0, 0, 2), SHAPE(2, 1));
  Tensor *m = op_mul(t, col);  // [2,3] * [2,1]
  ck_assert_float_eq(m->data[5], 100);
  Tensor *tr = op_transpose(t, 0, 1);
  ck_assert_int_eq(tr->shape.d[0], 3);
  ck_assert_float_eq(tr->data[1], 3);
  Tensor *parts[2] = {t, t};
  Tensor *cat = op_concat(parts, 2, 1);
  ck_assert_int_eq(cat->shape.d[1], 6);
  ck_assert_float_eq(cat->data[4], 1);
  int64_t idx[2] = {1, 1};
  Tensor *sel = op_index_select(t, idx, 2);
  ck_assert_float_eq(sel->data[3], 3);
  Tensor *sm = op_sum(t, 0, false), *mn = op_mean(t, 1, true);
  ck_assert_float_eq(sm->data[2], 7);
  ck_assert_float_eq(mn->data[1], 4);
  ck_assert_int_eq(mn->shape.ndim, 2);
  tensor_scope_release(mark);
  tensor_release(t);
  tensor_release(row);
}
END_TEST

// cpu_permute (its batched-transpose path and the general one) against index loops: every
// permutation of 4 dims on shapes with a few or many rows to transpose and more than one block
// of 256 columns; written and accumulated.
START_TEST(permute_matches_index_loops) {
  const int64_t shapes[][4] = {{2, 3, 17, 19}, {1, 70, 5, 3}, {3, 2, 1, 300}};
  int perms[24][4], np = 0;
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++)
      for (int c = 0; c < 4; c++)
        for (int d = 0; d < 4; d++)
          if (a != b && a != c && a != d && b != c && b != d && c != d) {
            int *p = perms[np++];
            p[0] = a, p[1] = b, p[2] = c, p[3] = d;
          }
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    const int64_t *in = shapes[si];
    int64_t n = in[0] * in[1] * in[2] * in[3];
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4), *want = malloc((size_t)n * 4);
    ck_assert(x && y && want);
    cpu_uniform(x, n, 40 + si, 0, -1, 1);
    for (int pi = 0; pi < np; pi++) {
      const int *p = perms[pi];
      int64_t out[4] = {in[p[0]], in[p[1]], in[p[2]], in[p[3]]},
              stride[4] = {in[1] * in[2] * in[3], in[2] * in[3], in[3], 1};
      for (int64_t i = 0; i < n; i++) {  // y's element i: its index along each dim of y, then x's offset
        int64_t rest = i, off = 0;
        for (int dd = 3; dd >= 0; dd--) {
          off += (rest % out[dd]) * stride[p[dd]];
          rest /= out[dd];
        }
        want[i] = x[off];
      }
      for (int acc = 0; acc < 2; acc++) {
        for (int64_t i = 0; i < n; i++) y[i] = acc ? 1.0f : NAN;
        cpu_permute(x, y, 4, in, p, acc);
        for (int64_t i = 0; i < n; i++) {
          float w = acc ? 1.0f + want[i] : want[i];
          ck_assert_msg(!memcmp(&y[i], &w, 4), "shape %zu perm %d%d%d%d accumulate %d: y[%lld] %g, want %g", si, p[0],
                        p[1], p[2], p[3], acc, (long long)i, y[i], w);
        }
      }
    }
    free(x), free(y), free(want);
  }
}
END_TEST

// cpu_gemm on every transposition, on shapes either side of the rule that sends A^T B to OpenBLAS
// below AVX-512 (kernels/cpu/matmul.c cpu_gemm_on_openblas), and cpu_gemm_batched's one-per-thread
// path on such a shape, with gaps in every leading dimension, alpha and beta not 1, against a
// double-precision sum. Bound: each element's k products summed in float, |error| <= (k + 2) u sum
// |alpha a b| + 2 u |beta c| (u = 2^-24); a wrong leading dimension or transposition is off by far more.
static double gemm_worst_ratio(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t batch, uint64_t seed) {
  const float alpha = 0.75f, beta = -0.5f;
  int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;     // under ta, op(A)'s rows are A's columns
  int64_t sa = (ta ? k : m) * lda, sb = (tb ? n : k) * ldb, sc = m * ldc;  // one matrix each, gaps included
  float *a = malloc((size_t)(batch * sa) * sizeof(float)), *b = malloc((size_t)(batch * sb) * sizeof(float));
  float *c = malloc((size_t)(batch * sc) * sizeof(float)), *c0 = malloc((size_t)(batch * sc) * sizeof(float));
  cpu_uniform(a, batch * sa, seed, 0, -1, 1);
  cpu_uniform(b, batch * sb, seed + 1, 0, -1, 1);
  cpu_uniform(c0, batch * sc, seed + 2, 0, -1, 1);
  memcpy(c, c0, (size_t)(batch * sc) * sizeof(float));
  if (batch == 1) cpu_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else cpu_gemm_batched(ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch);
  double u = ldexp(1.0, -24), worst = 0.0;
  for (int64_t bi = 0; bi < batch; bi++) {
    const float *ab = a + bi * sa, *bb = b + bi * sb, *cb = c + bi * sc, *c0b = c0 + bi * sc;
    for (int64_t i = 0; i < m; i++) {
      for (int64_t j = 0; j < ldc; j++) {
        if (j >= n) {  // the gap after each row of C is left as it was
          if (memcmp(&cb[i * ldc + j], &c0b[i * ldc + j], sizeof(float))) worst = INFINITY;
          continue;
        }
        double sum = 0.0, mag = 0.0;
        for (int64_t p = 0; p < k; p++) {
          double x = ta ? ab[p * lda + i] : ab[i * lda + p], y = tb ? bb[j * ldb + p] : bb[p * ldb + j];
          sum += x * y;
          mag += fabs(x * y);
        }
        double want = alpha * sum + beta * c0b[i * ldc + j];
        double bound = (double)(k + 2) * u * fabs(alpha) * mag + 2.0 * u * fabs(beta * c0b[i * ldc + j]);
        double ratio = fabs(cb[i * ldc + j] - want) / (bound + 1e-30);
        if (!(ratio <= worst)) worst = ratio;  // NaN too
      }
    }
  }
  free(a), free(b), free(c), free(c0);
  return worst;
}

START_TEST(gemm_every_transposition_matches_double) {
  static const struct {
    int64_t m, n, k;
    bool openblas;  // below AVX-512, A^T B of this C runs on OpenBLAS
  } shapes[] = {{2048, 256, 40, true}, {256, 2048, 24, true},  {256, 2304, 30, true}, {128, 1152, 40, false},
                {512, 512, 33, true},  {1024, 512, 17, false}, {64, 576, 50, false},  {1024, 32, 20, false},
                {600, 200, 50, true},  {7, 5, 3, false}};
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    for (int t = 0; t < 4; t++) {
      bool ta = t & 1, tb = t & 2;
      int64_t m = shapes[si].m, n = shapes[si].n, k = shapes[si].k;
      bool want_openblas = !DETR_HAVE_ONEDNN || (ta && !tb && shapes[si].openblas && !cpu_has_avx512());
      ck_assert_msg(cpu_gemm_on_openblas(ta, tb, m, n) == want_openblas, "%c%c %lldx%lld: on OpenBLAS %d, want %d",
                    ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n, cpu_gemm_on_openblas(ta, tb, m, n),
                    want_openblas);
      double worst = gemm_worst_ratio(ta, tb, m, n, k, 1, 11 + si);
      ck_assert_msg(worst <= 1.0, "%c%c %lldx%lldx%lld: worst error %.3g of its bound", ta ? 'T' : 'N', tb ? 'T' : 'N',
                    (long long)m, (long long)n, (long long)k, worst);
    }
  }
  // A batch of small products runs one per thread (inside a parallel region: OpenBLAS single-threaded there).
  double worst = gemm_worst_ratio(true, false, 512, 128, 16, 2 * omp_get_max_threads(), 40);
  ck_assert_msg(worst <= 1.0, "batched TN 512x128x16: worst error %.3g of its bound", worst);
}
END_TEST

START_TEST(matmul_and_bmm_values) {
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1};
  Tensor *ta = tensor_from_host(DEVICE_CPU, SHAPE(2, 3), a), *tb = tensor_from_host(DEVICE_CPU, SHAPE(3, 2), b);
  ScopeMark mark = tensor_scope_mark();
  Tensor *y = op_matmul(ta, tb);  // [[4, 5], [10, 11]]
  ck_assert_float_eq(y->data[0], 4);
  ck_assert_float_eq(y->data[3], 11);
  Tensor *a3 = op_reshape(ta, SHAPE(1, 2, 3));
  Tensor *z = op_bmm(a3, a3, false, true);  // a a^T = [[14, 32], [32, 77]]
  ck_assert_float_eq(z->data[1], 32);
  ck_assert_float_eq(z->data[3], 77);
  Tensor *lin = op_linear(ta, op_reshape(ta, SHAPE(2, 3)), NULL);  // same as a a^T
  ck_assert_float_eq(lin->data[3], 77);
  tensor_scope_release(mark);
  tensor_release(ta);
  tensor_release(tb);
}
END_TEST

// Bad shapes stop with a message and exit status 1 (run in a forked child by Check).
START_TEST(bad_broadcast_fails) {
  Tensor *a = tensor_zeros(DEVICE_CPU, SHAPE(2, 3)), *b = tensor_zeros(DEVICE_CPU, SHAPE(4));
  op_add(a, b);
}
END_TEST
START_TEST(bad_matmul_fails) {
  Tensor *a = tensor_zeros(DEVICE_CPU, SHAPE(2, 3)), *b = tensor_zeros(DEVICE_CPU, SHAPE(4, 2));
  op_matmul(a, b);
}
END_TEST
START_TEST(bad_index_fails) {
  Tensor *a = tensor_zeros(DEVICE_CPU, SHAPE(2, 3));
  int64_t idx[1] = {2};
  op_index_select(a, idx, 1);
}
END_TEST
// A CUDA tensor in a build without CUDA: the library ends the process with status 1 and says why
// (a child process, so that its message can be read).
START_TEST(cuda_tensor_without_backend_fails) {
  int fd[2];
  ck_assert_int_eq(pipe(fd), 0);
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    dup2(fd[1], STDERR_FILENO);
    tensor_zeros(DEVICE_CUDA, SHAPE(2));
    _exit(0);  // reached only when the allocation did not fail
  }
  close(fd[1]);
  char msg[1024];
  size_t n = 0;
  for (ssize_t got; n < sizeof msg - 1 && (got = read(fd[0], msg + n, sizeof msg - 1 - n)) > 0;) n += (size_t)got;
  msg[n] = 0;
  close(fd[0]);
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d, stderr: %s", st, msg);
  ck_assert_msg(strstr(msg, "this build has no CUDA backend (configure with -DDETR_CUDA=ON)"), "stderr: %s", msg);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("ops");
  TCase *tc = tcase_create("forward");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, conv2d_matches_direct_loops, 0, 2);
  tcase_add_loop_test(tc, conv2d_backward_implementations_agree, 0, 2);
  tcase_add_test(tc, conv2d_winograd_runs);
  tcase_add_test(tc, conv2d_primitive_cache_turns_over);
  tcase_add_test(tc, maxpool_matches_torch_semantics);
  tcase_add_test(tc, maxpool_matches_window_scan);
  tcase_add_test(tc, frozen_bn_channels_last_matches_nchw);
  tcase_add_test(tc, dropout_matches_philox_definition);
  tcase_add_test(tc, softmax_with_mask_and_layernorm);
  tcase_add_test(tc, layernorm_rows_side_by_side_bit_for_bit);
  tcase_add_test(tc, exp_poly_accuracy);
  tcase_add_test(tc, softmax_vector_path_matches_element_math);
  tcase_add_test(tc, cross_entropy_l1_and_giou_values);
  tcase_add_test(tc, inverse_sigmoid_and_focal_values);
  tcase_add_test(tc, shape_ops_and_broadcasting);
  tcase_add_test(tc, permute_matches_index_loops);
  tcase_add_test(tc, gemm_every_transposition_matches_double);
  tcase_add_test(tc, matmul_and_bmm_values);
  tcase_add_exit_test(tc, bad_broadcast_fails, 1);
  tcase_add_exit_test(tc, bad_matmul_fails, 1);
  tcase_add_exit_test(tc, bad_index_fails, 1);
  if (!DETR_HAVE_CUDA) tcase_add_test(tc, cuda_tensor_without_backend_fails);  // with CUDA: test_gpu
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
