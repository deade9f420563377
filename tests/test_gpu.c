// GPU tests: every CUDA kernel (kernels/cuda/cuda_kernels.h) against its CPU twin on random
// inputs of several shapes (broadcasting, odd and edge sizes), then autograd ops on CUDA tensors
// against the same ops on CPU tensors. Self-contained: links only the detr library and Check.
//
// Tolerance: max|gpu - cpu| / max(1, max|cpu|) <= 1e-4 (TOL). The uniform fill is compared
// bitwise (both sides round the same operations); the normal draw to 1e-6 (device logf / sinf /
// cosf differ from glibc's by an ulp or two). Deterministic paths are also checked to give
// bitwise-equal results on a second run.
//
// Without a CUDA device (no driver, no GPU) it prints "no CUDA device: skipping" and returns 77,
// which ctest reports as skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt).
#define _POSIX_C_SOURCE 200809L  // setenv / unsetenv under -std=c11
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"

#define TOL 1e-4

// --- host/device buffers ---

static float *host_alloc(int64_t n) {
  float *h = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  ck_assert_ptr_nonnull(h);
  return h;
}

// Uniform in [lo, hi), from the project's counter-based stream (seeded per call site).
static float *host_uniform(int64_t n, uint64_t seed, float lo, float hi) {
  float *h = host_alloc(n);
  cpu_uniform(h, n, seed, 0, lo, hi);
  return h;
}

// Magnitudes in [lo, hi) with random signs: away from kinks and poles at 0.
static float *host_away_from_zero(int64_t n, uint64_t seed, float lo, float hi) {
  float *h = host_uniform(n, seed, lo, hi);
  float *sign = host_uniform(n, seed + 1000003, 0.0f, 1.0f);
  for (int64_t i = 0; i < n; i++)
    if (sign[i] < 0.5f) h[i] = -h[i];
  free(sign);
  return h;
}

static float *host_copy(const float *src, int64_t n) {
  float *h = host_alloc(n);
  if (n > 0) memcpy(h, src, (size_t)n * sizeof(float));
  return h;
}

static float *dev_upload(const float *h, int64_t n) {
  float *d = cuda_device_malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
  ck_assert_ptr_nonnull(d);
  cuda_memcpy_h2d(d, h, (size_t)n * sizeof(float));
  return d;
}

static float *dev_download(const float *d, int64_t n) {
  float *h = host_alloc(n);
  cuda_memcpy_d2h(h, d, (size_t)n * sizeof(float));
  return h;
}

static double max_rel_diff(const float *a, const float *b, int64_t n) {
  double max_diff = 0.0, max_ref = 1.0;
  for (int64_t i = 0; i < n; i++) {
    double diff = fabs((double)a[i] - (double)b[i]);
    if (diff > max_diff || isnan(diff)) max_diff = isnan(diff) ? INFINITY : diff;
    if (fabs((double)b[i]) > max_ref) max_ref = fabs((double)b[i]);
  }
  return max_diff / max_ref;
}

// The device array d against the host reference ref.
static void expect_close(const char *what, const float *d, const float *ref, int64_t n,
                         double tol) {
  float *h = dev_download(d, n);
  double err = max_rel_diff(h, ref, n);
  ck_assert_msg(err <= tol, "%s: relative error %.3g > %.3g", what, err, tol);
  free(h);
}

static void expect_bitwise(const char *what, const float *d, const float *ref, int64_t n) {
  float *h = dev_download(d, n);
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(memcmp(&h[i], &ref[i], sizeof(float)) == 0,
                  "%s: element %lld is %.9g, expected %.9g", what, (long long)i, h[i], ref[i]);
  free(h);
}

// --- fill, random draws, accumulate ---

START_TEST(fill_random_accumulate) {
  const int64_t sizes[] = {1, 7, 1000, 1000003};
  for (size_t t = 0; t < sizeof sizes / sizeof *sizes; t++) {
    int64_t n = sizes[t];
    char what[96];
    float *ref = host_alloc(n), *d = cuda_device_malloc((size_t)n * sizeof(float));
    ck_assert_ptr_nonnull(d);

    const float values[] = {0.0f, 2.5f, -1e-3f};
    for (int v = 0; v < 3; v++) {
      cpu_fill(ref, n, values[v]);
      cuda_fill(d, n, values[v]);
      snprintf(what, sizeof what, "fill(%g) n=%lld", values[v], (long long)n);
      expect_bitwise(what, d, ref, n);
    }

    cpu_uniform(ref, n, 123, 17, -2.0f, 3.0f);
    cuda_uniform(d, n, 123, 17, -2.0f, 3.0f);
    snprintf(what, sizeof what, "uniform n=%lld", (long long)n);
    expect_bitwise(what, d, ref, n);

    cpu_normal(ref, n, 9, 5, 0.5f, 2.0f);
    cuda_normal(d, n, 9, 5, 0.5f, 2.0f);
    snprintf(what, sizeof what, "normal n=%lld", (long long)n);
    expect_close(what, d, ref, n, 1e-6);

    float *dst = host_uniform(n, 31, -1, 1), *src = host_uniform(n, 32, -1, 1);
    float *d_dst = dev_upload(dst, n), *d_src = dev_upload(src, n);
    cpu_accumulate(dst, src, n);
    cuda_accumulate(d_dst, d_src, n);
    snprintf(what, sizeof what, "accumulate n=%lld", (long long)n);
    expect_bitwise(what, d_dst, dst, n);

    cuda_device_free(d_dst);
    cuda_device_free(d_src);
    cuda_device_free(d);
    free(dst);
    free(src);
    free(ref);
  }
}
END_TEST

// --- unary ops ---

START_TEST(unary_forward_backward) {
  const int64_t sizes[] = {1, 33, 100003};
  const char *names[UNARY_COUNT] = {"relu", "sigmoid",    "exp",       "log",
                                    "neg",  "add_scalar", "mul_scalar"};
  const float param = 0.7f;
  for (int op = 0; op < UNARY_COUNT; op++) {
    for (size_t t = 0; t < sizeof sizes / sizeof *sizes; t++) {
      int64_t n = sizes[t];
      uint64_t seed = 100 + 10 * (uint64_t)op + t;
      float *x = op == UNARY_LOG   ? host_uniform(n, seed, 0.1f, 4.0f)
                 : op == UNARY_EXP ? host_uniform(n, seed, -4.0f, 4.0f)
                                   : host_away_from_zero(n, seed, 0.05f, 3.0f);
      float *y = host_alloc(n);
      cpu_unary_forward(op, x, y, n, param);
      float *d_x = dev_upload(x, n), *d_y = dev_upload(y, n);  // d_y overwritten below
      cuda_unary_forward(op, d_x, d_y, n, param);
      char what[96];
      snprintf(what, sizeof what, "unary %s forward n=%lld", names[op], (long long)n);
      expect_close(what, d_y, y, n, TOL);

      // Backward from the same x, y (the CPU's y): dx accumulates onto random values.
      cuda_memcpy_h2d(d_y, y, (size_t)n * sizeof(float));
      float *dy = host_uniform(n, seed + 1, -1, 1), *dx = host_uniform(n, seed + 2, -1, 1);
      float *d_dy = dev_upload(dy, n), *d_dx = dev_upload(dx, n);
      cpu_unary_backward(op, x, y, dy, dx, n, param);
      cuda_unary_backward(op, d_x, d_y, d_dy, d_dx, n, param);
      snprintf(what, sizeof what, "unary %s backward n=%lld", names[op], (long long)n);
      expect_close(what, d_dx, dx, n, TOL);

      cuda_device_free(d_x);
      cuda_device_free(d_y);
      cuda_device_free(d_dy);
      cuda_device_free(d_dx);
      free(x);
      free(y);
      free(dy);
      free(dx);
    }
  }
}
END_TEST

// --- binary ops with broadcasting ---

typedef struct {
  int ndim;
  int64_t d[DETR_MAX_DIMS];
} TestShape;

static int64_t test_numel(TestShape s) {
  int64_t n = 1;
  for (int i = 0; i < s.ndim; i++) n *= s.d[i];
  return n;
}

// numpy broadcasting geometry, as autograd/ops_elementwise.c builds it.
static Broadcast test_broadcast(TestShape a, TestShape b) {
  Broadcast bc = {.ndim = a.ndim > b.ndim ? a.ndim : b.ndim};
  int64_t sa = 1, sb = 1;
  for (int d = bc.ndim - 1; d >= 0; d--) {
    int da = d - (bc.ndim - a.ndim), db = d - (bc.ndim - b.ndim);
    int64_t na = da >= 0 ? a.d[da] : 1, nb = db >= 0 ? b.d[db] : 1;
    ck_assert(na == nb || na == 1 || nb == 1);
    bc.shape[d] = na > nb ? na : nb;
    if (na == 0 || nb == 0) bc.shape[d] = 0;
    bc.stride_a[d] = na == 1 ? 0 : sa;
    bc.stride_b[d] = nb == 1 ? 0 : sb;
    sa *= na;
    sb *= nb;
  }
  return bc;
}

static void check_binary_case(int op, TestShape sa, TestShape sb, bool grad_b, uint64_t seed) {
  const char *names[BINARY_COUNT] = {"add", "sub", "mul", "div"};
  Broadcast bc = test_broadcast(sa, sb);
  int64_t na = test_numel(sa), nb = test_numel(sb), n = 1;
  for (int d = 0; d < bc.ndim; d++) n *= bc.shape[d];
  float *a = host_uniform(na, seed, -2, 2);
  float *b = op == BINARY_DIV ? host_away_from_zero(nb, seed + 1, 0.5f, 2.0f)
                              : host_uniform(nb, seed + 1, -2, 2);
  float *y = host_alloc(n), *dy = host_uniform(n, seed + 2, -1, 1);
  float *da0 = host_uniform(na, seed + 3, -1, 1), *db0 = host_uniform(nb, seed + 4, -1, 1);
  float *da = host_copy(da0, na), *db = host_copy(db0, nb);
  char what[160];
  snprintf(what, sizeof what, "binary %s, a rank %d [%lld..] (%lld), b rank %d (%lld)", names[op],
           sa.ndim, (long long)(sa.ndim ? sa.d[0] : 1), (long long)na, sb.ndim, (long long)nb);

  cpu_binary_forward(op, a, b, y, bc);
  float *d_a = dev_upload(a, na), *d_b = dev_upload(b, nb), *d_y = dev_upload(y, n);
  cuda_fill(d_y, n, NAN);  // every output element must be written
  cuda_binary_forward(op, d_a, d_b, d_y, bc);
  char msg[200];
  snprintf(msg, sizeof msg, "%s: forward", what);
  expect_close(msg, d_y, y, n, TOL);

  cpu_binary_backward(op, a, b, dy, da, grad_b ? db : NULL, bc);
  float *d_dy = dev_upload(dy, n), *d_da = dev_upload(da0, na), *d_db = dev_upload(db0, nb);
  cuda_binary_backward(op, d_a, d_b, d_dy, d_da, grad_b ? d_db : NULL, bc);
  snprintf(msg, sizeof msg, "%s: da", what);
  expect_close(msg, d_da, da, na, TOL);
  snprintf(msg, sizeof msg, "%s: db", what);
  expect_close(msg, d_db, grad_b ? db : db0, nb, TOL);  // untouched when not asked for

  // No atomics: a second run from the same start gives the same bits.
  float *first_da = dev_download(d_da, na), *first_db = dev_download(d_db, nb);
  cuda_memcpy_h2d(d_da, da0, (size_t)na * sizeof(float));
  cuda_memcpy_h2d(d_db, db0, (size_t)nb * sizeof(float));
  cuda_binary_backward(op, d_a, d_b, d_dy, d_da, grad_b ? d_db : NULL, bc);
  snprintf(msg, sizeof msg, "%s: da run to run", what);
  expect_bitwise(msg, d_da, first_da, na);
  snprintf(msg, sizeof msg, "%s: db run to run", what);
  expect_bitwise(msg, d_db, first_db, nb);

  float *bufs_d[] = {d_a, d_b, d_y, d_dy, d_da, d_db};
  for (size_t i = 0; i < sizeof bufs_d / sizeof *bufs_d; i++) cuda_device_free(bufs_d[i]);
  float *bufs_h[] = {a, b, y, dy, da0, db0, da, db, first_da, first_db};
  for (size_t i = 0; i < sizeof bufs_h / sizeof *bufs_h; i++) free(bufs_h[i]);
}

START_TEST(binary_forward_backward) {
  // Pairs of shapes: same shape, trailing vector, mutual broadcasting, scalars, large reductions
  // (more than 64 terms per gradient element: the block-reduction path), rank 6, empty.
  const TestShape pairs[][2] = {
      {{3, {2, 3, 4}}, {3, {2, 3, 4}}},
      {{3, {2, 3, 4}}, {1, {4}}},
      {{3, {2, 1, 4}}, {2, {3, 1}}},
      {{3, {5, 1, 7}}, {3, {1, 6, 1}}},
      {{1, {1}}, {2, {3, 5}}},
      {{0, {0}}, {2, {4, 3}}},
      {{2, {37, 1}}, {2, {1, 129}}},
      {{2, {2000, 64}}, {1, {64}}},
      {{1, {1}}, {1, {5000}}},
      {{3, {300, 1, 3}}, {3, {1, 70, 3}}},
      {{4, {2, 3, 1, 5}}, {4, {1, 3, 4, 1}}},
      {{6, {2, 1, 3, 1, 2, 2}}, {5, {3, 3, 1, 2, 1}}},
      {{2, {0, 3}}, {1, {3}}},
  };
  uint64_t seed = 1000;
  for (int op = 0; op < BINARY_COUNT; op++)
    for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++)
      for (int swap = 0; swap < 2; swap++) {  // each shape as a and as b
        TestShape sa = pairs[p][swap], sb = pairs[p][1 - swap];
        check_binary_case(op, sa, sb, true, seed += 10);
        if (p % 3 == 0) check_binary_case(op, sa, sb, false, seed += 10);  // db NULL
      }
}
END_TEST

// --- gemm ---

// One row-major C [m, n] = alpha op(A) op(B) + beta C per batch entry, padded leading dims and
// batch strides (gaps between matrices), compared with cpu_gemm(_batched).
static void check_gemm_case(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t pad,
                            int64_t batch, float alpha, float beta, uint64_t seed) {
  int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
  int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
  int64_t sa = a_rows * lda + 5, sb = b_rows * ldb + 7, sc = m * ldc + 3;  // gaps between entries
  int64_t na = batch * sa, nb = batch * sb, nc = batch * sc;
  float *a = host_uniform(na, seed, -1, 1), *b = host_uniform(nb, seed + 1, -1, 1);
  float *c = host_uniform(nc, seed + 2, -1, 1);
  float *d_a = dev_upload(a, na), *d_b = dev_upload(b, nb), *d_c = dev_upload(c, nc);
  char what[160];
  snprintf(what, sizeof what, "gemm%s ta=%d tb=%d m=%lld n=%lld k=%lld pad=%lld alpha=%g beta=%g",
           batch > 1 ? "_batched" : "", ta, tb, (long long)m, (long long)n, (long long)k,
           (long long)pad, alpha, beta);
  if (batch == 1) {
    cpu_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    cuda_gemm(ta, tb, m, n, k, alpha, d_a, lda, d_b, ldb, beta, d_c, ldc);
  } else {
    cpu_gemm_batched(ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch);
    cuda_gemm_batched(ta, tb, m, n, k, alpha, d_a, lda, sa, d_b, ldb, sb, beta, d_c, ldc, sc,
                      batch);
  }
  expect_close(what, d_c, c, nc, TOL);  // includes the gaps: they must be untouched
  cuda_device_free(d_a);
  cuda_device_free(d_b);
  cuda_device_free(d_c);
  free(a);
  free(b);
  free(c);
}

START_TEST(gemm_all_transposes) {
  const int64_t dims[][3] = {{1, 1, 1}, {7, 13, 5}, {64, 33, 129}, {130, 257, 65}};
  uint64_t seed = 5000;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
        int64_t m = dims[i][0], n = dims[i][1], k = dims[i][2];
        check_gemm_case(ta, tb, m, n, k, 0, 1, 1.0f, 0.0f, seed += 10);
        check_gemm_case(ta, tb, m, n, k, 3, 1, 0.7f, 0.3f, seed += 10);
        check_gemm_case(ta, tb, m, n, k, 0, 1, -1.5f, 1.0f, seed += 10);  // accumulate
      }
  // k = 0: C = beta C; beta = 0 writes zeros even over NaN.
  check_gemm_case(false, false, 5, 6, 0, 2, 1, 1.0f, 0.5f, seed += 10);
  check_gemm_case(true, true, 5, 6, 0, 0, 3, 1.0f, 0.5f, seed += 10);
  float *d_c = dev_upload((float[]){NAN, NAN, NAN, NAN}, 4);
  cuda_gemm(false, false, 2, 2, 0, 1.0f, NULL, 1, NULL, 2, 0.0f, d_c, 2);
  expect_bitwise("gemm k=0 beta=0 over NaN", d_c, (float[]){0, 0, 0, 0}, 4);
  cuda_device_free(d_c);
}
END_TEST

START_TEST(gemm_batched_all_transposes) {
  const int64_t dims[][3] = {{5, 7, 3}, {33, 17, 65}, {1, 64, 64}};
  uint64_t seed = 6000;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
        check_gemm_case(ta, tb, dims[i][0], dims[i][1], dims[i][2], 0, 3, 1.0f, 0.0f, seed += 10);
        check_gemm_case(ta, tb, dims[i][0], dims[i][1], dims[i][2], 2, 4, 0.5f, 1.0f, seed += 10);
      }
}
END_TEST

// --- row bias ---

START_TEST(row_bias_forward_backward) {
  const int64_t dims[][2] = {{1, 1}, {5, 7}, {1000, 33}, {3, 300}, {4099, 5}, {257, 1}};
  uint64_t seed = 7000;
  for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) {
    int64_t rows = dims[i][0], cols = dims[i][1], n = rows * cols;
    char what[96];
    float *y = host_uniform(n, seed++, -1, 1), *bias = host_uniform(cols, seed++, -1, 1);
    float *d_y = dev_upload(y, n), *d_bias = dev_upload(bias, cols);
    cpu_add_row_bias(y, bias, rows, cols);
    cuda_add_row_bias(d_y, d_bias, rows, cols);
    snprintf(what, sizeof what, "add_row_bias %lldx%lld", (long long)rows, (long long)cols);
    expect_close(what, d_y, y, n, TOL);

    float *dy = host_uniform(n, seed++, -1, 1), *db = host_uniform(cols, seed++, -1, 1);
    float *d_dy = dev_upload(dy, n), *d_db = dev_upload(db, cols);
    cpu_row_bias_backward(dy, db, rows, cols);
    cuda_row_bias_backward(d_dy, d_db, rows, cols);
    snprintf(what, sizeof what, "row_bias_backward %lldx%lld", (long long)rows, (long long)cols);
    expect_close(what, d_db, db, cols, TOL);

    cuda_device_free(d_y);
    cuda_device_free(d_bias);
    cuda_device_free(d_dy);
    cuda_device_free(d_db);
    free(y);
    free(bias);
    free(dy);
    free(db);
  }
}
END_TEST

// --- conv2d ---

static ConvGeom make_geom(int64_t b, int64_t c, int64_t h, int64_t w, int64_t o, int64_t kh,
                          int64_t kw, int sh, int sw, int ph, int pw, int dh, int dw) {
  ConvGeom g = {.batch = b,
                .in_ch = c,
                .in_h = h,
                .in_w = w,
                .out_ch = o,
                .kh = kh,
                .kw = kw,
                .stride_h = sh,
                .stride_w = sw,
                .pad_h = ph,
                .pad_w = pw,
                .dil_h = dh,
                .dil_w = dw};
  g.out_h = conv_out_size(h, kh, sh, ph, dh);
  g.out_w = conv_out_size(w, kw, sw, pw, dw);
  return g;
}

static void check_conv_case(const ConvGeom *g, bool with_bias, uint64_t seed) {
  int64_t nx = g->batch * g->in_ch * g->in_h * g->in_w, nw = g->out_ch * g->in_ch * g->kh * g->kw;
  int64_t ny = g->batch * g->out_ch * g->out_h * g->out_w, nb = g->out_ch;
  const char *det = getenv("DETR_CUDNN_DETERMINISTIC");
  bool deterministic = !det || strcmp(det, "0") != 0;  // as kernels/cuda/conv.cu reads it
  char what[200], msg[240];
  snprintf(
      what, sizeof what,
      "conv2d x[%lld,%lld,%lld,%lld] w[%lld,%lld,%lld,%lld] stride %d,%d pad %d,%d dil %d,%d%s "
      "(deterministic=%s)",
      (long long)g->batch, (long long)g->in_ch, (long long)g->in_h, (long long)g->in_w,
      (long long)g->out_ch, (long long)g->in_ch, (long long)g->kh, (long long)g->kw, g->stride_h,
      g->stride_w, g->pad_h, g->pad_w, g->dil_h, g->dil_w, with_bias ? " +bias" : "",
      det ? det : "unset");
  float *x = host_uniform(nx, seed, -1, 1), *w = host_uniform(nw, seed + 1, -1, 1);
  float *bias = host_uniform(nb, seed + 2, -1, 1), *y = host_alloc(ny);
  float *ws = host_alloc(cpu_conv2d_workspace_floats(g));
  cpu_conv2d_forward(x, w, with_bias ? bias : NULL, y, g, ws);
  float *d_x = dev_upload(x, nx), *d_w = dev_upload(w, nw), *d_bias = dev_upload(bias, nb);
  float *d_y = dev_upload(y, ny);
  cuda_fill(d_y, ny, NAN);  // forward overwrites (beta = 0)
  cuda_conv2d_forward(d_x, d_w, with_bias ? d_bias : NULL, d_y, g);
  snprintf(msg, sizeof msg, "%s: forward", what);
  expect_close(msg, d_y, y, ny, TOL);

  // Backward: all three gradients accumulate onto random values.
  float *dy = host_uniform(ny, seed + 3, -1, 1);
  float *dx0 = host_uniform(nx, seed + 4, -1, 1), *dw0 = host_uniform(nw, seed + 5, -1, 1);
  float *db0 = host_uniform(nb, seed + 6, -1, 1);
  float *dx = host_copy(dx0, nx), *dw = host_copy(dw0, nw), *db = host_copy(db0, nb);
  cpu_conv2d_backward(x, w, dy, dx, dw, with_bias ? db : NULL, g, ws);
  float *d_dy = dev_upload(dy, ny), *d_dx = dev_upload(dx0, nx), *d_dw = dev_upload(dw0, nw);
  float *d_db = dev_upload(db0, nb);
  cuda_conv2d_backward(d_x, d_w, d_dy, d_dx, d_dw, with_bias ? d_db : NULL, g);
  snprintf(msg, sizeof msg, "%s: dx", what);
  expect_close(msg, d_dx, dx, nx, TOL);
  snprintf(msg, sizeof msg, "%s: dw", what);
  expect_close(msg, d_dw, dw, nw, TOL);
  snprintf(msg, sizeof msg, "%s: dbias", what);
  expect_close(msg, d_db, with_bias ? db : db0, nb, TOL);

  if (deterministic) {  // deterministic algorithms: the same bits every run
    float *first_dx = dev_download(d_dx, nx), *first_dw = dev_download(d_dw, nw);
    float *first_db = dev_download(d_db, nb);
    cuda_memcpy_h2d(d_dx, dx0, (size_t)nx * sizeof(float));
    cuda_memcpy_h2d(d_dw, dw0, (size_t)nw * sizeof(float));
    cuda_memcpy_h2d(d_db, db0, (size_t)nb * sizeof(float));
    cuda_conv2d_backward(d_x, d_w, d_dy, d_dx, d_dw, with_bias ? d_db : NULL, g);
    snprintf(msg, sizeof msg, "%s: dx run to run", what);
    expect_bitwise(msg, d_dx, first_dx, nx);
    snprintf(msg, sizeof msg, "%s: dw run to run", what);
    expect_bitwise(msg, d_dw, first_dw, nw);
    snprintf(msg, sizeof msg, "%s: dbias run to run", what);
    expect_bitwise(msg, d_db, first_db, nb);
    free(first_dx);
    free(first_dw);
    free(first_db);
  }

  // One gradient at a time (the others NULL): dx only, from zero.
  memset(dx, 0, (size_t)nx * sizeof(float));
  cpu_conv2d_backward(x, w, dy, dx, NULL, NULL, g, ws);
  cuda_fill(d_dx, nx, 0.0f);
  cuda_conv2d_backward(d_x, d_w, d_dy, d_dx, NULL, NULL, g);
  snprintf(msg, sizeof msg, "%s: dx alone", what);
  expect_close(msg, d_dx, dx, nx, TOL);

  float *bufs_d[] = {d_x, d_w, d_bias, d_y, d_dy, d_dx, d_dw, d_db};
  for (size_t i = 0; i < sizeof bufs_d / sizeof *bufs_d; i++) cuda_device_free(bufs_d[i]);
  float *bufs_h[] = {x, w, bias, y, ws, dy, dx0, dw0, db0, dx, dw, db};
  for (size_t i = 0; i < sizeof bufs_h / sizeof *bufs_h; i++) free(bufs_h[i]);
}

static void check_conv_geometries(uint64_t seed) {
  const ConvGeom geoms[] = {
      make_geom(2, 3, 9, 11, 4, 3, 3, 1, 1, 1, 1, 1, 1),     // 3x3 same
      make_geom(2, 3, 10, 9, 5, 3, 3, 2, 2, 1, 1, 1, 1),     // 3x3 stride 2, odd sizes
      make_geom(1, 4, 12, 12, 3, 3, 3, 1, 1, 2, 2, 2, 2),    // dilation 2
      make_geom(2, 8, 7, 5, 6, 1, 1, 1, 1, 0, 0, 1, 1),      // 1x1 (ResNet bottleneck)
      make_geom(2, 6, 9, 8, 4, 1, 1, 2, 2, 0, 0, 1, 1),      // 1x1 stride 2 (downsample)
      make_geom(1, 3, 32, 30, 8, 7, 7, 2, 2, 3, 3, 1, 1),    // 7x7 stride 2 pad 3 (ResNet stem)
      make_geom(2, 5, 11, 13, 3, 3, 3, 1, 2, 1, 0, 1, 1),    // unequal strides and padding
      make_geom(1, 16, 20, 20, 32, 3, 3, 1, 1, 1, 1, 1, 1),  // wider channels
  };
  for (size_t i = 0; i < sizeof geoms / sizeof *geoms; i++) {
    check_conv_case(&geoms[i], true, seed + 20 * i);
    check_conv_case(&geoms[i], false, seed + 20 * i + 10);
  }
}

START_TEST(conv2d_deterministic_algorithms) {
  setenv("DETR_CUDNN_DETERMINISTIC", "1", 1);
  check_conv_geometries(8000);
  unsetenv("DETR_CUDNN_DETERMINISTIC");  // the default is deterministic too
  check_conv_geometries(8500);
}
END_TEST

START_TEST(conv2d_heuristic_algorithms) {
  setenv("DETR_CUDNN_DETERMINISTIC", "0", 1);
  check_conv_geometries(9000);
  unsetenv("DETR_CUDNN_DETERMINISTIC");
}
END_TEST

// --- autograd ops on CUDA tensors against CPU tensors ---

// A CPU leaf tensor of uniform values, and its copy on the GPU; both require grad.
static void leaf_pair(Shape s, uint64_t seed, float lo, float hi, Tensor **cpu, Tensor **gpu) {
  int64_t n = shape_numel(s);
  float *h = host_uniform(n, seed, lo, hi);
  *cpu = tensor_from_host(DEVICE_CPU, s, h);
  *gpu = tensor_to_device(*cpu, DEVICE_CUDA);
  ck_assert_int_eq((*gpu)->device, DEVICE_CUDA);
  tensor_set_requires_grad(*cpu, true);
  tensor_set_requires_grad(*gpu, true);
  free(h);
}

// t (any device) against the CPU tensor ref.
static void expect_tensor_close(const char *what, const Tensor *t, const Tensor *ref) {
  ck_assert_msg(t && ref, "%s: missing tensor", what);
  ck_assert_msg(shape_equal(t->shape, ref->shape), "%s: shapes differ", what);
  float *a = host_alloc(t->numel), *b = host_alloc(ref->numel);
  tensor_to_host(t, a);
  tensor_to_host(ref, b);
  double err = max_rel_diff(a, b, t->numel);
  ck_assert_msg(err <= TOL, "%s: relative error %.3g > %.3g", what, err, TOL);
  free(a);
  free(b);
}

// Backward from y seeded with a random gradient (the same values for the same seed on any
// device). The tape is global: run each device's forward and backward in turn, not interleaved.
static void backward_seeded(Tensor *y, uint64_t seed) {
  float *g = host_uniform(y->numel, seed, -1, 1);
  Tensor *grad = tensor_from_host(y->device, y->shape, g);
  autograd_backward_with(y, grad);
  tensor_release(grad);
  free(g);
}

START_TEST(autograd_linear) {
  ScopeMark mark = tensor_scope_mark();
  Tensor *x, *xg, *w, *wg, *b, *bg;
  leaf_pair(SHAPE(2, 5, 7), 11, -1, 1, &x, &xg);
  leaf_pair(SHAPE(4, 7), 12, -1, 1, &w, &wg);
  leaf_pair(SHAPE(4), 13, -1, 1, &b, &bg);
  Tensor *y = op_linear(x, w, b);
  backward_seeded(y, 14);
  Tensor *yg = op_linear(xg, wg, bg);
  backward_seeded(yg, 14);
  ck_assert_int_eq(yg->device, DEVICE_CUDA);
  expect_tensor_close("linear forward", yg, y);
  expect_tensor_close("linear dx", xg->grad, x->grad);
  expect_tensor_close("linear dw", wg->grad, w->grad);
  expect_tensor_close("linear dbias", bg->grad, b->grad);
  tensor_scope_release(mark);
  Tensor *leaves[] = {x, xg, w, wg, b, bg};
  for (int i = 0; i < 6; i++) tensor_release(leaves[i]);
}
END_TEST

START_TEST(autograd_conv2d) {
  ScopeMark mark = tensor_scope_mark();
  Tensor *x, *xg, *w, *wg, *b, *bg;
  leaf_pair(SHAPE(2, 3, 9, 10), 21, -1, 1, &x, &xg);
  leaf_pair(SHAPE(4, 3, 3, 3), 22, -1, 1, &w, &wg);
  leaf_pair(SHAPE(4), 23, -1, 1, &b, &bg);
  Conv2dParams p = {
      .stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1, .dilation_h = 1, .dilation_w = 1};
  Tensor *y = op_conv2d(x, w, b, p);
  backward_seeded(y, 24);
  Tensor *yg = op_conv2d(xg, wg, bg, p);
  backward_seeded(yg, 24);
  ck_assert_int_eq(yg->device, DEVICE_CUDA);
  expect_tensor_close("conv2d forward", yg, y);
  expect_tensor_close("conv2d dx", xg->grad, x->grad);
  expect_tensor_close("conv2d dw", wg->grad, w->grad);
  expect_tensor_close("conv2d dbias", bg->grad, b->grad);
  tensor_scope_release(mark);
  Tensor *leaves[] = {x, xg, w, wg, b, bg};
  for (int i = 0; i < 6; i++) tensor_release(leaves[i]);
}
END_TEST

START_TEST(autograd_add_broadcast) {
  ScopeMark mark = tensor_scope_mark();
  Tensor *a, *ag, *b, *bg;
  leaf_pair(SHAPE(3, 4, 5), 31, -1, 1, &a, &ag);
  leaf_pair(SHAPE(4, 1), 32, -1, 1, &b, &bg);
  Tensor *y = op_add(a, b);
  backward_seeded(y, 33);
  Tensor *yg = op_add(ag, bg);
  backward_seeded(yg, 33);
  ck_assert_int_eq(yg->device, DEVICE_CUDA);
  expect_tensor_close("add forward", yg, y);
  expect_tensor_close("add da", ag->grad, a->grad);
  expect_tensor_close("add db", bg->grad, b->grad);
  tensor_scope_release(mark);
  Tensor *leaves[] = {a, ag, b, bg};
  for (int i = 0; i < 4; i++) tensor_release(leaves[i]);
}
END_TEST

// Backward from both outputs of a two-output op, seeded with the same random grads on any device.
static void backward_two_seeded(Tensor *y0, Tensor *y1, uint64_t seed) {
  float *g1 = host_uniform(y1->numel, seed + 1, -1, 1);
  Tensor *t1 = tensor_from_host(y1->device, y1->shape, g1);
  tensor_copy_(autograd_grad(y1), t1);  // the second output's gradient, before walking the tape
  backward_seeded(y0, seed);
  tensor_release(t1);
  free(g1);
}

// ENACT's clustering op: regions of lengths 1..5 with gaps (padding), both sign options.
START_TEST(autograd_enact_cluster) {
  int64_t starts[] = {0, 3, 4, 9, 12, 16, 17, 20, 21}, lengths[] = {3, 1, 5, 3, 3, 1, 2, 1, 2};
  float signs[24];
  for (int i = 0; i < 24; i++) signs[i] = (i / 3) % 2 ? 1.0f : -1.0f;
  for (int with_sign = 0; with_sign < 2; with_sign++) {
    ScopeMark mark = tensor_scope_mark();
    Tensor *k, *kg, *v, *vg, *h, *hg;
    leaf_pair(SHAPE(24, 37), 41, -1, 1, &k, &kg);
    leaf_pair(SHAPE(24, 37), 42, -1, 1, &v, &vg);
    leaf_pair(SHAPE(24), 43, -2, 2, &h, &hg);
    const float *s = with_sign ? signs : NULL;
    Tensor *vc, *kc = op_enact_cluster(k, v, h, s, starts, lengths, 9, &vc);
    backward_two_seeded(kc, vc, 44);
    Tensor *vcg, *kcg = op_enact_cluster(kg, vg, hg, s, starts, lengths, 9, &vcg);
    backward_two_seeded(kcg, vcg, 44);
    ck_assert_int_eq(kcg->device, DEVICE_CUDA);
    expect_tensor_close("enact_cluster K'", kcg, kc);
    expect_tensor_close("enact_cluster V'", vcg, vc);
    expect_tensor_close("enact_cluster dK", kg->grad, k->grad);
    expect_tensor_close("enact_cluster dV", vg->grad, v->grad);
    expect_tensor_close("enact_cluster dH", hg->grad, h->grad);
    tensor_scope_release(mark);
    Tensor *leaves[] = {k, kg, v, vg, h, hg};
    for (int i = 0; i < 6; i++) tensor_release(leaves[i]);
  }
}
END_TEST

int main(void) {
  if (cuda_device_count() == 0) {
    printf("no CUDA device: skipping\n");
    return 77;
  }
  Suite *s = suite_create("gpu");
  TCase *kernels = tcase_create("kernels");
  tcase_set_timeout(kernels, 600);
  tcase_add_test(kernels, fill_random_accumulate);
  tcase_add_test(kernels, unary_forward_backward);
  tcase_add_test(kernels, binary_forward_backward);
  tcase_add_test(kernels, gemm_all_transposes);
  tcase_add_test(kernels, gemm_batched_all_transposes);
  tcase_add_test(kernels, row_bias_forward_backward);
  tcase_add_test(kernels, conv2d_deterministic_algorithms);
  tcase_add_test(kernels, conv2d_heuristic_algorithms);
  suite_add_tcase(s, kernels);
  TCase *autograd = tcase_create("autograd");
  tcase_set_timeout(autograd, 600);
  tcase_add_test(autograd, autograd_linear);
  tcase_add_test(autograd, autograd_conv2d);
  tcase_add_test(autograd, autograd_add_broadcast);
  tcase_add_test(autograd, autograd_enact_cluster);
  suite_add_tcase(s, autograd);
  SRunner *sr = srunner_create(s);
  // No fork: the CUDA context created above does not survive into a forked child.
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
