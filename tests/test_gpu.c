// GPU tests: every CUDA kernel (kernels/cuda/cuda_kernels.h) against its CPU twin on random
// inputs of several shapes (broadcasting, odd and edge sizes); every autograd op, forward and
// backward, on CUDA tensors against the same op on CPU tensors; the staging of uploads; and the
// tiny DETR (plain and with ENACT) - a forward + loss + backward, and three AdamW training steps
// with a checkpoint round trip - on the GPU against the CPU from the same weights.
// Self-contained: links only the detr libraries and Check.
//
// Tolerances, as max|gpu - cpu| / max(1, max|cpu|):
//   - kernels and single ops: 1e-4 (TOL);
//   - the whole model (outputs, every loss term, every gradient, parameters after training):
//     1e-3 (MODEL_TOL; the reasons are next to its definition and in docs/cuda.md);
//   - bitwise: the uniform fill, dropout (the same Philox mask), the pure copies (permute,
//     concat, slice, index_select, max-pool), the staged uploads and checkpoints;
//   - the normal draw: 1e-6 (device logf / sinf / cosf differ from glibc's by an ulp or two).
// Every op is also run twice on the GPU and must give the same bits: no kernel uses atomics.
// The unary and binary ops come from tests/op_table.c's entries, and every entry marked .cuda
// must be compared (ops_coverage).
//
// Without a CUDA device (no NVIDIA driver, or no GPU) it prints "no CUDA device: skipping" and the
// reason, and returns 77, which ctest reports as skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt).
// A CUDA that is present but unusable (a driver older than the runtime, ...) is a failure with the
// reason (cuda_device_probe), never a skip.
//
// The tests run in this process (no fork: a CUDA context does not survive into a child), so a
// checked fixture (gpu_test_setup / gpu_test_teardown) puts the process back in order after each
// test, failed ones included: the tape is cleared, the tensors scoped since the test began are
// released, grad mode, TF32 and the cuDNN settings are restored. A per-test watchdog
// (DETR_GPU_TEST_TIMEOUT seconds, default 120, 0 = none) ends a hung test with its name and exit
// status 124; ctest's TIMEOUT bounds the whole binary.
#define _POSIX_C_SOURCE 200809L  // setenv / unsetenv, mkdtemp, sigaction under -std=c11
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/runtime.h"
#include "autograd/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "nn/detr.h"
#include "nn/enact.h"
#include "train/checkpoint.h"
#include "tests/op_table.h"

#define TOL 1e-4

// --- the per-test fixture and watchdog ---

static bool g_on_gpu = false;  // main() found a device (test_gpu_harness runs without one)
static ScopeMark g_test_mark;
static struct timespec g_test_start;

static void watchdog_fired(int sig) {
  (void)sig;
  const char *name = tcase_name();  // the running test's (set when its body starts)
  static const char head[] = "\ntest_gpu: watchdog: test '",
                    tail[] = "' exceeded DETR_GPU_TEST_TIMEOUT (a hung kernel or a deadlock?); stopping\n";
  ssize_t ignored = write(2, head, sizeof head - 1);
  if (name) ignored = write(2, name, strlen(name));
  ignored = write(2, tail, sizeof tail - 1);
  (void)ignored;
  _exit(124);
}

static unsigned gpu_test_timeout(void) {
  const char *v = getenv("DETR_GPU_TEST_TIMEOUT");
  return v && *v ? (unsigned)strtoul(v, NULL, 10) : 120u;
}

static void gpu_test_setup(void) {
  g_test_mark = tensor_scope_mark();
  autograd_set_grad_enabled(true);
  clock_gettime(CLOCK_MONOTONIC, &g_test_start);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = watchdog_fired;
  sigaction(SIGALRM, &sa, NULL);
  alarm(gpu_test_timeout());
}

// Runs after every test, also after a failed assertion (which longjmps out of the test body): the
// next test starts from a clean tape and scope whatever this one left behind.
static void gpu_test_teardown(void) {
  alarm(0);
  if (g_on_gpu) cuda_synchronize();  // an asynchronous kernel error surfaces here, not in the next test
  autograd_clear_tape();             // before the scope: the nodes hold saved tensors
  if (tensor_scope_size() >= g_test_mark) tensor_scope_release(g_test_mark);
  autograd_set_grad_enabled(true);
  cuda_set_tf32(false);
  if (g_on_gpu && cuda_bf16_enabled()) cuda_set_bf16(false);
  unsetenv("DETR_CUDNN_DETERMINISTIC");
  unsetenv("DETR_CUDNN_WORKSPACE_MB");
  struct timespec end;
  clock_gettime(CLOCK_MONOTONIC, &end);
  printf("test_gpu: %-32s %7.2f s\n", tcase_name(),
         (double)(end.tv_sec - g_test_start.tv_sec) + 1e-9 * (double)(end.tv_nsec - g_test_start.tv_nsec));
  fflush(stdout);
}

// A test case with the fixture and the suite-wide settings.
static TCase *gpu_tcase(Suite *s, const char *name) {
  TCase *tc = tcase_create(name);
  tcase_add_checked_fixture(tc, gpu_test_setup, gpu_test_teardown);
  suite_add_tcase(s, tc);
  return tc;
}

// --- host/device buffers ---

// 64-byte aligned, as the CPU convolution's workspace must be.
static float *host_alloc(int64_t n) {
  float *h = aligned_alloc(64, ((size_t)(n > 0 ? n : 1) * sizeof(float) + 63) / 64 * 64);
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

// max|a - b| / max(1, max|b|) over the elements that differ; equal elements (infinities included:
// a fully masked log-softmax row is -inf on both sides) count as 0, a NaN on one side as infinite.
// Non-finite references do not set the scale.
static double gpu_rel_diff(const float *a, const float *b, int64_t n) {
  double max_diff = 0.0, max_ref = 1.0;
  for (int64_t i = 0; i < n; i++) {
    if (isfinite(b[i]) && fabs((double)b[i]) > max_ref) max_ref = fabs((double)b[i]);
    if (a[i] == b[i] || (isnan(a[i]) && isnan(b[i]))) continue;
    double diff = fabs((double)a[i] - (double)b[i]);
    if (isnan(diff) || isinf(diff)) diff = INFINITY;
    if (diff > max_diff) max_diff = diff;
  }
  return max_diff / max_ref;
}

// The device array d against the host reference ref.
static void expect_close(const char *what, const float *d, const float *ref, int64_t n, double tol) {
  float *h = dev_download(d, n);
  double err = gpu_rel_diff(h, ref, n);
  ck_assert_msg(err <= tol, "%s: relative error %.3g > %.3g", what, err, tol);
  free(h);
}

static void expect_bitwise(const char *what, const float *d, const float *ref, int64_t n) {
  float *h = dev_download(d, n);
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(memcmp(&h[i], &ref[i], sizeof(float)) == 0, "%s: element %lld is %.9g, expected %.9g", what,
                  (long long)i, h[i], ref[i]);
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

    const float values[] = {0.0f, 2.5f, -1e-3f, -0.0f, NAN};  // -0.0: its sign bit too (bitwise)
    for (int v = 0; v < 5; v++) {
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

// Every unary kernel (tests/op_table.c has one entry for each), over the entry's wide range.
START_TEST(unary_forward_backward) {
  const int64_t sizes[] = {1, 33, 100003};
  const char *why = op_table_problem();
  ck_assert_msg(!why, "%s", why);
  for (int i = 0; i < OP_TABLE_COUNT; i++) {
    const OpEntry *e = &OP_TABLE[i];
    if (e->kind != OP_UNARY) continue;
    int op = e->kernel;
    float p = e->kernel_param;
    for (size_t t = 0; t < sizeof sizes / sizeof *sizes; t++) {
      int64_t n = sizes[t];
      uint64_t seed = 100 + 10 * (uint64_t)op + t;
      float *x = e->wide.away ? host_away_from_zero(n, seed, e->wide.lo, e->wide.hi)
                              : host_uniform(n, seed, e->wide.lo, e->wide.hi);
      float *y = host_alloc(n);
      cpu_unary_forward(op, x, y, n, p);
      float *d_x = dev_upload(x, n), *d_y = dev_upload(y, n);  // d_y overwritten below
      cuda_unary_forward(op, d_x, d_y, n, p);
      char what[96];
      snprintf(what, sizeof what, "unary %s forward n=%lld", unary_op_name(op), (long long)n);
      expect_close(what, d_y, y, n, TOL);

      // Backward from the same x, y (the CPU's y): dx accumulates onto random values.
      cuda_memcpy_h2d(d_y, y, (size_t)n * sizeof(float));
      float *dy = host_uniform(n, seed + 1, -1, 1), *dx = host_uniform(n, seed + 2, -1, 1);
      float *d_dy = dev_upload(dy, n), *d_dx = dev_upload(dx, n);
      cpu_unary_backward(op, x, y, dy, dx, n, p);
      cuda_unary_backward(op, d_x, d_y, d_dy, d_dx, n, p);
      snprintf(what, sizeof what, "unary %s backward n=%lld", unary_op_name(op), (long long)n);
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
  Broadcast bc = test_broadcast(sa, sb);
  int64_t na = test_numel(sa), nb = test_numel(sb), n = 1;
  for (int d = 0; d < bc.ndim; d++) n *= bc.shape[d];
  float *a = host_uniform(na, seed, -2, 2);
  float *b = op == BINARY_DIV ? host_away_from_zero(nb, seed + 1, 0.5f, 2.0f) : host_uniform(nb, seed + 1, -2, 2);
  float *y = host_alloc(n), *dy = host_uniform(n, seed + 2, -1, 1);
  float *da0 = host_uniform(na, seed + 3, -1, 1), *db0 = host_uniform(nb, seed + 4, -1, 1);
  float *da = host_copy(da0, na), *db = host_copy(db0, nb);
  char what[160];
  snprintf(what, sizeof what, "binary %s, a rank %d [%lld..] (%lld), b rank %d (%lld)", binary_op_name(op), sa.ndim,
           (long long)(sa.ndim ? sa.d[0] : 1), (long long)na, sb.ndim, (long long)nb);

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
static void check_gemm_case(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t pad, int64_t batch, float alpha,
                            float beta, uint64_t seed) {
  int64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
  int64_t lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
  int64_t sa = a_rows * lda + 5, sb = b_rows * ldb + 7, sc = m * ldc + 3;  // gaps between entries
  int64_t na = batch * sa, nb = batch * sb, nc = batch * sc;
  float *a = host_uniform(na, seed, -1, 1), *b = host_uniform(nb, seed + 1, -1, 1);
  float *c = host_uniform(nc, seed + 2, -1, 1);
  float *d_a = dev_upload(a, na), *d_b = dev_upload(b, nb), *d_c = dev_upload(c, nc);
  char what[160];
  snprintf(what, sizeof what, "gemm%s ta=%d tb=%d m=%lld n=%lld k=%lld pad=%lld alpha=%g beta=%g",
           batch > 1 ? "_batched" : "", ta, tb, (long long)m, (long long)n, (long long)k, (long long)pad, alpha, beta);
  if (batch == 1) {
    cpu_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    cuda_gemm(ta, tb, m, n, k, alpha, d_a, lda, d_b, ldb, beta, d_c, ldc);
  } else {
    cpu_gemm_batched(ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc, batch);
    cuda_gemm_batched(ta, tb, m, n, k, alpha, d_a, lda, sa, d_b, ldb, sb, beta, d_c, ldc, sc, batch);
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
    cpu_add_row_bias(y, bias, rows, cols, false);
    cuda_add_row_bias(d_y, d_bias, rows, cols, false);
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

static ConvGeom make_geom(int64_t b, int64_t c, int64_t h, int64_t w, int64_t o, int64_t kh, int64_t kw, int sh, int sw,
                          int ph, int pw, int dh, int dw) {
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

// The kernels with a workspace of the size they ask for (exactly: no slack hides an undersized one).
static void conv_forward_ws(const float *x, const float *w, const float *bias, float *y, const ConvGeom *g) {
  size_t bytes = cuda_conv2d_forward_workspace(g);
  void *ws = bytes ? cuda_device_malloc(bytes) : NULL;
  ck_assert(!bytes || ws);
  cuda_conv2d_forward(x, w, bias, y, g, ws, bytes);
  cuda_device_free(ws);
}

static void conv_backward_ws(const float *x, const float *w, const float *dy, float *dx, bool set_dx, float *dw,
                             bool set_dw, float *db, const ConvGeom *g) {
  size_t bytes = cuda_conv2d_backward_workspace(g, dx != NULL, dw != NULL);
  void *ws = bytes ? cuda_device_malloc(bytes) : NULL;
  ck_assert(!bytes || ws);
  cuda_conv2d_backward(x, w, dy, dx, set_dx, dw, set_dw, db, g, ws, bytes);
  cuda_device_free(ws);
}

static void check_conv_case(const ConvGeom *g, bool with_bias, uint64_t seed) {
  int64_t nx = g->batch * g->in_ch * g->in_h * g->in_w, nw = g->out_ch * g->in_ch * g->kh * g->kw;
  int64_t ny = g->batch * g->out_ch * g->out_h * g->out_w, nb = g->out_ch;
  const char *det = getenv("DETR_CUDNN_DETERMINISTIC");
  bool deterministic = !det || strcmp(det, "0") != 0;  // as kernels/cuda/conv.cu reads it
  char what[200], msg[240];
  snprintf(what, sizeof what,
           "conv2d%s x[%lld,%lld,%lld,%lld] w[%lld,%lld,%lld,%lld] stride %d,%d pad %d,%d dil %d,%d%s "
           "(deterministic=%s)",
           g->channels_last ? " (channels last, x as [B, C, H, W])" : "", (long long)g->batch, (long long)g->in_ch,
           (long long)g->in_h, (long long)g->in_w, (long long)g->out_ch, (long long)g->in_ch, (long long)g->kh,
           (long long)g->kw, g->stride_h, g->stride_w, g->pad_h, g->pad_w, g->dil_h, g->dil_w,
           with_bias ? " +bias" : "", det ? det : "unset");
  float *x = host_uniform(nx, seed, -1, 1), *w = host_uniform(nw, seed + 1, -1, 1);
  float *bias = host_uniform(nb, seed + 2, -1, 1), *y = host_alloc(ny);
  // One CPU workspace for the forward and the backward passes below (both gradients, or each alone).
  int64_t ws_floats = cpu_conv2d_forward_workspace_floats(g, with_bias);
  int64_t bwd_floats[3] = {cpu_conv2d_backward_workspace_floats(g, true, false, true, false, with_bias),
                           cpu_conv2d_backward_workspace_floats(g, true, false, false, false, false),
                           cpu_conv2d_backward_workspace_floats(g, false, false, true, false, false)};
  for (int i = 0; i < 3; i++)
    if (bwd_floats[i] > ws_floats) ws_floats = bwd_floats[i];
  float *ws = host_alloc(ws_floats);
  cpu_conv2d_forward(x, NULL, w, with_bias ? bias : NULL, y, g, ws);
  float *d_x = dev_upload(x, nx), *d_w = dev_upload(w, nw), *d_bias = dev_upload(bias, nb);
  float *d_y = dev_upload(y, ny);
  cuda_fill(d_y, ny, NAN);  // forward overwrites (beta = 0)
  conv_forward_ws(d_x, d_w, with_bias ? d_bias : NULL, d_y, g);
  snprintf(msg, sizeof msg, "%s: forward", what);
  expect_close(msg, d_y, y, ny, TOL);

  // Backward: all three gradients accumulate onto random values.
  float *dy = host_uniform(ny, seed + 3, -1, 1);
  float *dx0 = host_uniform(nx, seed + 4, -1, 1), *dw0 = host_uniform(nw, seed + 5, -1, 1);
  float *db0 = host_uniform(nb, seed + 6, -1, 1);
  float *dx = host_copy(dx0, nx), *dw = host_copy(dw0, nw), *db = host_copy(db0, nb);
  cpu_conv2d_backward(x, NULL, w, dy, NULL, dx, false, dw, false, with_bias ? db : NULL, g, ws);
  float *d_dy = dev_upload(dy, ny), *d_dx = dev_upload(dx0, nx), *d_dw = dev_upload(dw0, nw);
  float *d_db = dev_upload(db0, nb);
  conv_backward_ws(d_x, d_w, d_dy, d_dx, false, d_dw, false, with_bias ? d_db : NULL, g);
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
    conv_backward_ws(d_x, d_w, d_dy, d_dx, false, d_dw, false, with_bias ? d_db : NULL, g);
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

  // One gradient at a time (the others NULL): dx only, then dw only, from zero on the CPU, written
  // over NaN (set_dx, set_dw: a fresh, unfilled buffer) on the GPU.
  for (int t = 0; t < 2; t++) {  // dx, then dw
    float *host = t ? dw : dx, *dev = t ? d_dw : d_dx;
    int64_t n = t ? nw : nx;
    memset(host, 0, (size_t)n * sizeof(float));
    cpu_conv2d_backward(x, NULL, w, dy, NULL, t ? NULL : dx, false, t ? dw : NULL, false, NULL, g, ws);
    cuda_fill(dev, n, NAN);
    conv_backward_ws(d_x, d_w, d_dy, t ? NULL : d_dx, !t, t ? d_dw : NULL, t, NULL, g);
    snprintf(msg, sizeof msg, "%s: %s alone, written", what, t ? "dw" : "dx");
    expect_close(msg, dev, host, n, TOL);
  }

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
  for (int last = 0; last < 2; last++)  // nchw, then channels last (NHWC descriptors)
    for (size_t i = 0; i < sizeof geoms / sizeof *geoms; i++) {
      ConvGeom g = geoms[i];
      g.channels_last = last;
      check_conv_case(&g, true, seed + 20 * i);
      check_conv_case(&g, false, seed + 20 * i + 10);
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

// The workspace limit decides the choice: with DETR_CUDNN_WORKSPACE_MB=0 every pass takes an
// algorithm that needs no workspace (implicit GEMM forward, ALGO_0 backwards: cuDNN supports them
// for every geometry), also when the heuristics would rank a workspace-hungry one first; results
// still match the CPU. Geometries no other test uses, so no earlier choice is cached.
START_TEST(conv2d_workspace_limit) {
  const ConvGeom geoms[] = {make_geom(2, 13, 40, 44, 24, 3, 3, 1, 1, 1, 1, 1, 1),
                            make_geom(1, 9, 64, 61, 17, 5, 5, 2, 2, 2, 2, 1, 1)};
  setenv("DETR_CUDNN_WORKSPACE_MB", "0", 1);
  for (int det = 0; det < 2; det++) {
    setenv("DETR_CUDNN_DETERMINISTIC", det ? "1" : "0", 1);
    for (size_t i = 0; i < sizeof geoms / sizeof *geoms; i++) {
      if (!det) {  // deterministic algorithms may all need workspace: the smallest is taken, no bound
        ck_assert_msg(cuda_conv2d_forward_workspace(&geoms[i]) == 0, "forward: workspace %zu bytes past a 0 limit",
                      cuda_conv2d_forward_workspace(&geoms[i]));
        ck_assert_msg(cuda_conv2d_backward_workspace(&geoms[i], true, true) == 0,
                      "backward: workspace %zu bytes past a 0 limit",
                      cuda_conv2d_backward_workspace(&geoms[i], true, true));
      }
      check_conv_case(&geoms[i], true, 9500 + 20 * i + 100 * (uint64_t)det);
    }
  }
}
END_TEST

// Dropout's kernels: the CPU's mask and arithmetic bit for bit, the backward accumulating onto
// non-zero gradients (where a multiply-add contracted into an FMA would round differently).
START_TEST(dropout_kernels_bitwise) {
  const int64_t sizes[] = {1, 7, 4099, 1000003};
  const float ps[] = {0.1f, 0.5f};
  for (size_t t = 0; t < sizeof sizes / sizeof *sizes; t++)
    for (int k = 0; k < 2; k++) {
      int64_t n = sizes[t];
      char what[96];
      float *x = host_uniform(n, 40000 + t, -3, 3), *y = host_alloc(n);
      float *dy = host_uniform(n, 40100 + t, -3, 3), *dx = host_uniform(n, 40200 + t, -3, 3);
      float *d_x = dev_upload(x, n), *d_y = dev_upload(y, n), *d_dy = dev_upload(dy, n), *d_dx = dev_upload(dx, n);
      cpu_dropout_forward(x, y, n, ps[k], 77, 1000 + (uint64_t)t);
      cuda_dropout_forward(d_x, d_y, n, ps[k], 77, 1000 + (uint64_t)t);
      snprintf(what, sizeof what, "dropout forward p=%g n=%lld", ps[k], (long long)n);
      expect_bitwise(what, d_y, y, n);
      cpu_dropout_backward(dy, dx, n, ps[k], 77, 1000 + (uint64_t)t);
      cuda_dropout_backward(d_dy, d_dx, n, ps[k], 77, 1000 + (uint64_t)t);
      snprintf(what, sizeof what, "dropout backward (accumulating) p=%g n=%lld", ps[k], (long long)n);
      expect_bitwise(what, d_dx, dx, n);
      float *bufs_d[] = {d_x, d_y, d_dy, d_dx};
      for (int i = 0; i < 4; i++) cuda_device_free(bufs_d[i]);
      free(x), free(y), free(dy), free(dx);
    }
}
END_TEST

// TF32 (the `tf32` config key): off, sgemm and the convolution agree with the CPU to TOL; on, to
// TF32's precision (inputs rounded to 10 mantissa bits: ~1e-3 relative); off again, back to TOL
// (the switch reaches the existing cuBLAS handle). The error with TF32 on is printed: on sm_80+
// it should be well above the fp32 error (tensor cores in use).
static double gemm_error(int64_t m, uint64_t seed) {
  float *a = host_uniform(m * m, seed, -1, 1), *b = host_uniform(m * m, seed + 1, -1, 1), *c = host_alloc(m * m);
  float *d_a = dev_upload(a, m * m), *d_b = dev_upload(b, m * m), *d_c = dev_upload(c, m * m);
  cpu_gemm(false, false, m, m, m, 1.0f, a, m, b, m, 0.0f, c, m);
  cuda_gemm(false, false, m, m, m, 1.0f, d_a, m, d_b, m, 0.0f, d_c, m);
  float *h = dev_download(d_c, m * m);
  double err = gpu_rel_diff(h, c, m * m);
  cuda_device_free(d_a), cuda_device_free(d_b), cuda_device_free(d_c);
  free(a), free(b), free(c), free(h);
  return err;
}

START_TEST(tf32_switch) {
  double off = gemm_error(256, 41000);
  ck_assert_msg(off <= TOL, "sgemm without TF32: relative error %.3g > %.3g", off, TOL);
  cuda_set_tf32(true);
  double on = gemm_error(256, 41000);
  printf("test_gpu: sgemm 256^3 relative error: fp32 %.3g, TF32 %.3g (compute capability %d)\n", off, on,
         cuda_compute_capability());
  ck_assert_msg(on <= 1e-2, "sgemm with TF32: relative error %.3g > 1e-2", on);
  const ConvGeom g = make_geom(2, 16, 24, 20, 32, 3, 3, 1, 1, 1, 1, 1, 1);
  int64_t nx = 2 * 16 * 24 * 20, nw = 32 * 16 * 9, ny = 2 * 32 * g.out_h * g.out_w;
  float *x = host_uniform(nx, 41100, -1, 1), *w = host_uniform(nw, 41101, -1, 1), *y = host_alloc(ny);
  float *ws = host_alloc(cpu_conv2d_forward_workspace_floats(&g, false));
  cpu_conv2d_forward(x, NULL, w, NULL, y, &g, ws);
  float *d_x = dev_upload(x, nx), *d_w = dev_upload(w, nw), *d_y = dev_upload(y, ny);
  conv_forward_ws(d_x, d_w, NULL, d_y, &g);
  expect_close("conv2d forward with TF32", d_y, y, ny, 1e-2);
  cuda_set_tf32(false);
  conv_forward_ws(d_x, d_w, NULL, d_y, &g);
  expect_close("conv2d forward with TF32 off again", d_y, y, ny, TOL);
  double again = gemm_error(256, 41000);
  ck_assert_msg(again <= TOL, "sgemm with TF32 switched off again: relative error %.3g > %.3g", again, TOL);
  cuda_device_free(d_x), cuda_device_free(d_w), cuda_device_free(d_y);
  free(x), free(w), free(y), free(ws);
}
END_TEST

// --- bf16 (cuda_set_bf16) against a bound derived from how it must compute ---
// tests/test_bf16.c's bound for the CPU: with a', b' the inputs rounded to the nearest bf16 (computed
// here independently, frexp + nearbyint), a kernel summing K products a'b' in fp32 returns
// sum a'b' within (gamma_K + u) sum |a'b'|, here with 2u per addition: tensor cores align and
// truncate inside their blocks instead of rounding each addition to nearest. cuBLAS's FAST_16BF
// writes that fp32 sum; cuDNN's bf16 convolutions round it to bf16 once more (at most half a bf16
// ulp of the result, on top). That cuBLAS rounds to nearest bf16 (rather than truncating, or taking
// TF32, which FAST_16BF also allows) and that cuDNN rounds its output to nearest are this test's
// claims, not the libraries' documented ones: a failure names which reference the GEMM is closer to.
// Truncating the inputs, or accumulating in bf16, breaks the bound; and somewhere the result must be
// further from the exact sum than fp32 rounding could take it (bf16 really ran).
#define BF16_U32 (2.0 / 16777216.0)

static double bf16_gamma(double k) { return k * BF16_U32 / (1 - k * BF16_U32); }

static double bf16_ref(float x) {
  if (x == 0 || !isfinite(x)) return x;
  int e;
  double m = frexp(x, &e);
  return ldexp(nearbyint(ldexp(m, 8)), e - 8);
}

// Half a bf16 ulp at |v| (8 significant bits): the most a round-to-nearest output moves v.
static double bf16_half_ulp(double v) {
  if (v == 0) return 0;
  int e;
  frexp(v, &e);
  return ldexp(1.0, e - 9);
}

// Sums of one output: of the rounded products (rs, ra = sum |.|) and the exact ones (es, ea); k terms.
typedef struct {
  double rs, ra, es, ea;
  int64_t k;
} Bf16Sum;

static void bf16_sum_add(Bf16Sum *s, float a, float b) {
  double r = bf16_ref(a) * bf16_ref(b), e = (double)a * b;
  s->rs += r, s->ra += fabs(r), s->es += e, s->ea += fabs(e);
  s->k++;
}

// got against its sums; out_rounded: the kernel rounds its result to bf16 (cuDNN). Updates the worst
// ratio to the bound (<= 1 passes) and to fp32's own error about the exact sum (> 1 somewhere: bf16 ran).
static void bf16_judge(double got, const Bf16Sum *s, bool out_rounded, double *worst, double *vs_exact) {
  double sum_err = (bf16_gamma((double)s->k) + BF16_U32) * s->ra;
  double allowed = sum_err + (out_rounded ? bf16_half_ulp(fabs(s->rs) + sum_err) : 0) + 1e-30;
  *worst = fmax(*worst, fabs(got - s->rs) / allowed);
  *vs_exact = fmax(*vs_exact, fabs(got - s->es) / (bf16_gamma((double)s->k) * s->ea + 1e-30));
}

// x rounded to TF32's 11 significant bits (for the diagnosis only: which rounding a failing GEMM took).
static double tf32_ref(float x) {
  if (x == 0 || !isfinite(x)) return x;
  int e;
  double m = frexp(x, &e);
  return ldexp(nearbyint(ldexp(m, 11)), e - 11);
}

// C = A B + beta C (C starts uniform) in bf16 against the bound. pad: A's and B's rows `pad` floats
// longer than their width and `pad` floats between batch entries (the bf16 copies keep the layout);
// b_shared: one B for every batch entry (stride 0).
static void check_gemm_bf16(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t batch, float beta, uint64_t seed,
                            int64_t pad, bool b_shared) {
  int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, sc = m * n;
  int64_t sa = (ta ? k : m) * lda + pad, sb = b_shared ? 0 : (tb ? n : k) * ldb + pad;
  int64_t na = sa * batch, nb = b_shared ? (tb ? n : k) * ldb : sb * batch;
  float *a = host_uniform(na, seed, -1, 1), *b = host_uniform(nb, seed + 1, -1, 1);
  float *c0 = host_uniform(sc * batch, seed + 2, -1, 1);
  float *d_a = dev_upload(a, na), *d_b = dev_upload(b, nb), *d_c = dev_upload(c0, sc * batch);
  cuda_set_bf16(true);
  if (batch == 1) cuda_gemm(ta, tb, m, n, k, 1.0f, d_a, lda, d_b, ldb, beta, d_c, n);
  else cuda_gemm_batched(ta, tb, m, n, k, 1.0f, d_a, lda, sa, d_b, ldb, sb, beta, d_c, n, sc, batch);
  cuda_set_bf16(false);
  float *c = dev_download(d_c, sc * batch);
  double worst = 0, vs_exact = 0, tf32_err = 0, bf16_err = 0;
  for (int64_t q = 0; q < batch; q++)
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        Bf16Sum sum = {0};
        double tf32_sum = 0, old = beta * (double)c0[q * sc + i * n + j];
        for (int64_t p = 0; p < k; p++) {
          float x = a[q * sa + (ta ? p * lda + i : i * lda + p)], y = b[q * sb + (tb ? j * ldb + p : p * ldb + j)];
          bf16_sum_add(&sum, x, y);
          tf32_sum += tf32_ref(x) * tf32_ref(y);
        }
        sum.rs += old, sum.es += old;  // beta C: one more term, and one more rounding (the k + 1 below)
        sum.ra += fabs(old), sum.ea += fabs(old), sum.k++;
        double got = c[q * sc + i * n + j];
        bf16_judge(got, &sum, false, &worst, &vs_exact);
        tf32_err = fmax(tf32_err, fabs(got - (tf32_sum + old)));
        bf16_err = fmax(bf16_err, fabs(got - sum.rs));
      }
  ck_assert_msg(worst <= 1,
                "bf16 gemm%s %c%c %lldx%lldx%lld beta %g: %.3g x the bound (largest distance to the "
                "bf16-rounded sum %.3g, to the TF32-rounded one %.3g)",
                batch > 1 ? "_batched" : "", ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k,
                beta, worst, bf16_err, tf32_err);
  ck_assert_msg(vs_exact > 1, "bf16 gemm %lldx%lldx%lld: within fp32's error of the exact sum: bf16 did not run",
                (long long)m, (long long)n, (long long)k);
  cuda_device_free(d_a), cuda_device_free(d_b), cuda_device_free(d_c);
  free(a), free(b), free(c), free(c0);
}

// Element (b, c, h, w) of a [B, C, H, W] activation, NCHW or channels last.
static int64_t act_index(bool last, int64_t b, int64_t c, int64_t h, int64_t w, int64_t C, int64_t H, int64_t W) {
  return last ? ((b * H + h) * W + w) * C + c : ((b * C + c) * H + h) * W + w;
}

// The forward, backward-data and backward-filter of one geometry in bf16, each output within its bound
// (computed in double from the definitions); dx and dw written (set) together, accumulated onto that
// (exactly twice it: the deterministic algorithms give the same bits), then each alone (a frozen
// stage's dx only, the first trained convolution's dw only: their own staging layouts).
static void check_conv_bf16(const ConvGeom *g, uint64_t seed) {
  int64_t nx = g->batch * g->in_ch * g->in_h * g->in_w, nw = g->out_ch * g->in_ch * g->kh * g->kw;
  int64_t ny = g->batch * g->out_ch * g->out_h * g->out_w;
  float *x = host_uniform(nx, seed, -1, 1), *w = host_uniform(nw, seed + 1, -1, 1),
        *dy = host_uniform(ny, seed + 2, -1, 1);
  Bf16Sum *sy = calloc((size_t)ny, sizeof *sy), *sdx = calloc((size_t)nx, sizeof *sdx),
          *sdw = calloc((size_t)nw, sizeof *sdw);
  ck_assert(sy && sdx && sdw);
  bool last = g->channels_last;
  for (int64_t b = 0; b < g->batch; b++)
    for (int64_t o = 0; o < g->out_ch; o++)
      for (int64_t oh = 0; oh < g->out_h; oh++)
        for (int64_t ow = 0; ow < g->out_w; ow++) {
          int64_t yi = act_index(last, b, o, oh, ow, g->out_ch, g->out_h, g->out_w);
          for (int64_t c = 0; c < g->in_ch; c++)
            for (int64_t i = 0; i < g->kh; i++)
              for (int64_t j = 0; j < g->kw; j++) {
                int64_t ih = oh * g->stride_h - g->pad_h + i * g->dil_h,
                        iw = ow * g->stride_w - g->pad_w + j * g->dil_w;
                if (ih < 0 || ih >= g->in_h || iw < 0 || iw >= g->in_w) continue;
                int64_t xi = act_index(last, b, c, ih, iw, g->in_ch, g->in_h, g->in_w);
                int64_t wi = ((o * g->in_ch + c) * g->kh + i) * g->kw + j;
                bf16_sum_add(&sy[yi], x[xi], w[wi]);
                bf16_sum_add(&sdx[xi], dy[yi], w[wi]);
                bf16_sum_add(&sdw[wi], dy[yi], x[xi]);
              }
        }
  float *d_x = dev_upload(x, nx), *d_w = dev_upload(w, nw), *d_dy = dev_upload(dy, ny);
  float *d_y = dev_upload(dy, ny), *d_dx = dev_upload(x, nx), *d_dw = dev_upload(w, nw);  // overwritten
  cuda_set_bf16(true);
  conv_forward_ws(d_x, d_w, NULL, d_y, g);
  conv_backward_ws(d_x, d_w, d_dy, d_dx, true, d_dw, true, NULL, g);
  float *y = dev_download(d_y, ny), *dx = dev_download(d_dx, nx), *dw = dev_download(d_dw, nw);
  conv_backward_ws(d_x, d_w, d_dy, d_dx, false, d_dw, false, NULL, g);  // accumulate: dx + dx', dw + dw'
  float *dx2 = dev_download(d_dx, nx), *dw2 = dev_download(d_dw, nw);
  conv_backward_ws(d_x, d_w, d_dy, d_dx, true, NULL, false, NULL, g);  // dx alone
  conv_backward_ws(d_x, d_w, d_dy, NULL, false, d_dw, true, NULL, g);  // dw alone
  cuda_set_bf16(false);
  float *dx_alone = dev_download(d_dx, nx), *dw_alone = dev_download(d_dw, nw);
  for (int64_t i = 0; i < nx; i++)
    ck_assert_msg(dx_alone[i] == dx[i], "bf16 conv backward-data alone: %.9g, with dw %.9g", dx_alone[i], dx[i]);
  for (int64_t i = 0; i < nw; i++)
    ck_assert_msg(dw_alone[i] == dw[i], "bf16 conv backward-filter alone: %.9g, with dx %.9g", dw_alone[i], dw[i]);
  const struct {
    const char *name;
    const float *got, *twice;
    const Bf16Sum *sums;
    int64_t n;
  } outs[] = {{"forward", y, NULL, sy, ny}, {"backward-data", dx, dx2, sdx, nx}, {"backward-filter", dw, dw2, sdw, nw}};
  for (int t = 0; t < 3; t++) {
    double worst = 0, vs_exact = 0;
    for (int64_t i = 0; i < outs[t].n; i++) {
      bf16_judge(outs[t].got[i], &outs[t].sums[i], true, &worst, &vs_exact);
      if (outs[t].twice)  // the accumulation adds the same bf16 result in fp32: exactly 2x (a power of 2)
        ck_assert_msg(outs[t].twice[i] == 2 * outs[t].got[i], "bf16 conv %s, accumulated: %.9g, expected 2 x %.9g",
                      outs[t].name, outs[t].twice[i], outs[t].got[i]);
    }
    ck_assert_msg(worst <= 1, "bf16 conv %s (%s, %lldx%lld kernel, %lld channels): %.3g x the bound", outs[t].name,
                  last ? "channels last" : "nchw", (long long)g->kh, (long long)g->kw, (long long)g->in_ch, worst);
    ck_assert_msg(vs_exact > 1, "bf16 conv %s: within fp32's error of the exact sum: bf16 did not run", outs[t].name);
  }
  float *bufs_d[] = {d_x, d_w, d_dy, d_y, d_dx, d_dw};
  for (int i = 0; i < 6; i++) cuda_device_free(bufs_d[i]);
  free(x), free(w), free(dy), free(y), free(dx), free(dw), free(dx2), free(dw2), free(dx_alone), free(dw_alone);
  free(sy), free(sdx), free(sdw);
}

// One output of C [m, n] = A B from row-major host A [m, k] (element (i, p) at a[i * sa_i + p * sa_p])
// and B [k, n] (b[p * sb_p + j * sb_j]) against its bf16 bound.
static void judge_product(const float *got, int64_t m, int64_t n, int64_t k, const float *a, int64_t sa_i, int64_t sa_p,
                          const float *b, int64_t sb_p, int64_t sb_j, double *worst, double *vs_exact) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      Bf16Sum sum = {0};
      for (int64_t p = 0; p < k; p++) bf16_sum_add(&sum, a[i * sa_i + p * sa_p], b[p * sb_p + j * sb_j]);
      bf16_judge(got[i * n + j], &sum, false, worst, vs_exact);
    }
}

// op_linear in bf16 on the GPU (x and W rounded once in the forward and kept for the backward, dy
// rounded once for both backward GEMMs: autograd/ops_matmul.c): y = x W^T, dx = dy W, dW = dy^T x,
// each within its bound.
static void check_linear_bf16(void) {
  enum { ROWS = 150, IN = 48, OUT = 72 };
  float *xh = host_uniform(ROWS * IN, 43000, -1, 1), *wh = host_uniform(OUT * IN, 43001, -1, 1);
  float *gh = host_uniform(ROWS * OUT, 43002, -1, 1);
  Tensor *x = tensor_from_host(DEVICE_CUDA, SHAPE(ROWS, IN), xh),
         *w = tensor_from_host(DEVICE_CUDA, SHAPE(OUT, IN), wh);
  Tensor *g = tensor_from_host(DEVICE_CUDA, SHAPE(ROWS, OUT), gh);
  tensor_set_requires_grad(x, true);
  tensor_set_requires_grad(w, true);
  cuda_set_bf16(true);
  ck_assert(cuda_gemm_bf16_wanted(ROWS, OUT, IN));
  ScopeMark mark = tensor_scope_mark();
  Tensor *y = op_linear(x, w, NULL);
  autograd_backward_with(y, g);
  cuda_set_bf16(false);
  float *yh = dev_download(y->data, ROWS * OUT), *dxh = dev_download(x->grad->data, ROWS * IN);
  float *dwh = dev_download(w->grad->data, OUT * IN);
  double worst[3] = {0}, vs_exact[3] = {0};
  judge_product(yh, ROWS, OUT, IN, xh, IN, 1, wh, 1, IN, &worst[0], &vs_exact[0]);    // x [R, I] W^T
  judge_product(dxh, ROWS, IN, OUT, gh, OUT, 1, wh, IN, 1, &worst[1], &vs_exact[1]);  // dy [R, O] W [O, I]
  judge_product(dwh, OUT, IN, ROWS, gh, 1, OUT, xh, IN, 1, &worst[2], &vs_exact[2]);  // dy^T [O, R] x [R, I]
  static const char *what[3] = {"y", "dx", "dW"};
  for (int i = 0; i < 3; i++) {
    ck_assert_msg(worst[i] <= 1, "bf16 linear %s: %.3g x the bound", what[i], worst[i]);
    ck_assert_msg(vs_exact[i] > 1, "bf16 linear %s: within fp32's error of the exact sum: bf16 did not run", what[i]);
  }
  tensor_scope_release(mark);
  tensor_release(x), tensor_release(w), tensor_release(g);
  free(xh), free(wh), free(gh), free(yh), free(dxh), free(dwh);
}

START_TEST(bf16_within_rounding_bound) {
  char why[512];
  if (!cuda_bf16_supported(why, sizeof why)) {
    printf("test_gpu: bf16 skipped: %s\n", why);
    return;
  }
  setenv("DETR_CUDNN_DETERMINISTIC", "1", 1);  // the accumulation check needs the same bits twice
  for (int t = 0; t < 4; t++) check_gemm_bf16(t & 1, t & 2, 97, 130, 211, 1, 0.0f, 42000 + (uint64_t)t * 10, 0, false);
  check_gemm_bf16(false, true, 64, 96, 300, 3, 1.0f, 42100, 0, false);  // a strided batch accumulating into C
  check_gemm_bf16(true, false, 33, 40, 70, 3, 0.0f, 42200, 5, false);   // padded rows, gaps between entries
  check_gemm_bf16(false, false, 33, 40, 70, 3, 0.0f, 42300, 3, true);   // one B for every entry
  check_linear_bf16();
  const ConvGeom geoms[] = {make_geom(2, 16, 12, 10, 24, 3, 3, 1, 1, 1, 1, 1, 1),  // 3x3
                            make_geom(2, 32, 9, 8, 16, 1, 1, 2, 2, 0, 0, 1, 1),    // 1x1 stride 2
                            make_geom(1, 8, 20, 18, 16, 7, 7, 2, 2, 3, 3, 1, 1),   // 7x7
                            make_geom(1, 3, 20, 18, 16, 7, 7, 2, 2, 3, 3, 1, 1)};  // the stem: 3 channels
  for (int last = 0; last < 2; last++)
    for (size_t i = 0; i < sizeof geoms / sizeof *geoms; i++) {
      ConvGeom g = geoms[i];
      g.channels_last = last;
      check_conv_bf16(&g, 42200 + 10 * i + 100 * (uint64_t)last);
    }
  // Off again: fp32 to TOL (the switch reaches both libraries).
  double again = gemm_error(256, 41000);
  ck_assert_msg(again <= TOL, "sgemm with bf16 switched off again: relative error %.3g > %.3g", again, TOL);
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

// Which entries of the op table were compared: ops_coverage requires every entry marked .cuda.
// An entry counts when a comparison's `what` starts with its name (the longest that fits).
static bool g_compared[256];

static void record_compared(const char *what) {
  int best = -1;
  size_t best_len = 0;
  for (int i = 0; i < OP_TABLE_COUNT; i++) {
    size_t len = strlen(OP_TABLE[i].name);
    if (len <= best_len || strncmp(what, OP_TABLE[i].name, len)) continue;
    char next = what[len];  // the name must end there: "linear" is not "linear_relu"
    if (next == '_' || next == '.' || (next >= 'a' && next <= 'z') || (next >= '0' && next <= '9')) continue;
    best = i;
    best_len = len;
  }
  if (best >= 0) g_compared[best] = true;
}

// t (any device) against the CPU tensor ref.
static void expect_tensor_close(const char *what, const Tensor *t, const Tensor *ref) {
  ck_assert_msg(t && ref, "%s: missing tensor", what);
  ck_assert_msg(shape_equal(t->shape, ref->shape), "%s: shapes differ", what);
  float *a = host_alloc(t->numel), *b = host_alloc(ref->numel);
  tensor_to_host(t, a);
  tensor_to_host(ref, b);
  double err = gpu_rel_diff(a, b, t->numel);
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
  Conv2dParams p = {.stride_h = 2, .stride_w = 2, .pad_h = 1, .pad_w = 1, .dilation_h = 1, .dilation_w = 1};
  Tensor *y = op_conv2d(x, w, b, p);
  backward_seeded(y, 24);
  Tensor *yg = op_conv2d(xg, wg, bg, p);
  backward_seeded(yg, 24);
  ck_assert_int_eq(yg->device, DEVICE_CUDA);
  record_compared("conv2d");
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
    int64_t images[2] = {0, 9};
    EnactRegionIndex index = enact_region_index_upload(DEVICE_CPU, starts, lengths, 9, images, 1);
    EnactRegionIndex gindex = enact_region_index_upload(DEVICE_CUDA, starts, lengths, 9, images, 1);
    Tensor *s = with_sign ? op_constant(DEVICE_CPU, SHAPE(24), signs) : NULL;
    Tensor *sg = with_sign ? op_constant(DEVICE_CUDA, SHAPE(24), signs) : NULL;
    Tensor *vc, *kc = op_enact_cluster(k, v, h, s, &index, &vc);
    backward_two_seeded(kc, vc, 44);
    Tensor *vcg, *kcg = op_enact_cluster(kg, vg, hg, sg, &gindex, &vcg);
    backward_two_seeded(kcg, vcg, 44);
    ck_assert_int_eq(kcg->device, DEVICE_CUDA);
    record_compared("enact_cluster");
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

// --- every autograd op: CUDA tensors against CPU tensors ---
//
// compare_op runs an op - forward, then backward from a random output gradient that is the same on
// both devices - on CPU inputs and on copies of them on the GPU, and compares the output and the
// gradient of every input that takes one (TOL, relative to max(1, max|cpu|)). Inputs that take no
// gradient (masks, class weights, batch-norm statistics) are copied too. It then runs the GPU side
// again from no gradients and requires the same bits: no CUDA kernel uses atomics, every
// summation order is fixed by the shapes. Shapes cover the tests/test_grad.c cases plus sizes that
// reach every launch path (grid-stride loops, block reductions over long rows, tiled column sums).

typedef Tensor *(*OpFn)(Tensor *const *in, void *ctx);

#define MAX_OP_INPUTS 6

static float *download(const Tensor *t) {
  float *h = host_alloc(t->numel);
  tensor_to_host(t, h);
  return h;
}

// A CPU tensor of uniform values in [lo, hi) (requires_grad as asked); the caller releases it.
static Tensor *cpu_uniform_tensor(Shape s, uint64_t seed, float lo, float hi, bool grad) {
  float *h = host_uniform(shape_numel(s), seed, lo, hi);
  Tensor *t = tensor_from_host(DEVICE_CPU, s, h);
  tensor_set_requires_grad(t, grad);
  free(h);
  return t;
}

static Tensor *run_op(OpFn f, Tensor *const *in, void *ctx, uint64_t seed) {
  Tensor *y = f(in, ctx);
  if (y->requires_grad) backward_seeded(y, seed);
  return y;
}

static void drop_grads(Tensor *const *in, int n) {
  for (int i = 0; i < n; i++)
    if (in[i] && in[i]->grad) {
      tensor_release(in[i]->grad);
      in[i]->grad = NULL;
    }
}

static void expect_tensor_bitwise(const char *what, const Tensor *t, const float *ref) {
  float *h = download(t);
  for (int64_t i = 0; i < t->numel; i++)
    ck_assert_msg(memcmp(&h[i], &ref[i], sizeof(float)) == 0, "%s: element %lld is %.9g, expected %.9g", what,
                  (long long)i, h[i], ref[i]);
  free(h);
}

// Compares op f on the CPU inputs in[0..n) (NULL entries allowed) with the same op on GPU copies.
// bitwise: the forward must equal the CPU's bit for bit (ops with no arithmetic, or whose
// arithmetic cannot round differently). Releases the inputs.
static void compare_op(const char *what, OpFn f, Tensor **in, int n, void *ctx, uint64_t seed, bool bitwise) {
  ck_assert(n <= MAX_OP_INPUTS);
  record_compared(what);
  Tensor *gin[MAX_OP_INPUTS] = {NULL};
  for (int i = 0; i < n; i++)
    if (in[i]) {
      gin[i] = tensor_to_device(in[i], DEVICE_CUDA);
      tensor_set_requires_grad(gin[i], in[i]->requires_grad);
    }
  char msg[256];
  ScopeMark mark = tensor_scope_mark();
  Tensor *y = run_op(f, in, ctx, seed);
  Tensor *yg = run_op(f, gin, ctx, seed);
  ck_assert_msg(yg->device == DEVICE_CUDA, "%s: output not on the GPU", what);
  snprintf(msg, sizeof msg, "%s: forward", what);
  if (bitwise) {
    float *ref = download(y);
    expect_tensor_bitwise(msg, yg, ref);
    free(ref);
  } else {
    expect_tensor_close(msg, yg, y);
  }
  float *first_y = download(yg), *first_g[MAX_OP_INPUTS] = {NULL};
  for (int i = 0; i < n; i++) {
    if (!in[i] || !in[i]->requires_grad) continue;
    snprintf(msg, sizeof msg, "%s: gradient of input %d", what, i);
    ck_assert_msg(in[i]->grad && gin[i]->grad, "%s: missing", msg);
    expect_tensor_close(msg, gin[i]->grad, in[i]->grad);
    first_g[i] = download(gin[i]->grad);
  }
  // Run to run: the same bits from the same inputs.
  drop_grads(gin, n);
  Tensor *yg2 = run_op(f, gin, ctx, seed);
  snprintf(msg, sizeof msg, "%s: forward run to run", what);
  expect_tensor_bitwise(msg, yg2, first_y);
  for (int i = 0; i < n; i++) {
    if (!first_g[i]) continue;
    snprintf(msg, sizeof msg, "%s: gradient of input %d run to run", what, i);
    expect_tensor_bitwise(msg, gin[i]->grad, first_g[i]);
    free(first_g[i]);
  }
  free(first_y);
  tensor_scope_release(mark);
  for (int i = 0; i < n; i++) {
    tensor_release(in[i]);
    tensor_release(gin[i]);
  }
}

// --- the ops ---

// Unary and binary elementwise ops, from their tests/op_table.c entries: the table's shapes (the
// gradient checks' and larger ones), values from the entries' ranges.
START_TEST(ops_elementwise) {
  for (int i = 0; i < OP_TABLE_COUNT; i++) {
    const OpEntry *e = &OP_TABLE[i];
    char what[64];
    if (e->kind == OP_UNARY)
      for (int s = 0; s < UNARY_SHAPES; s++) {
        uint64_t seed = 20000 + 10 * (uint64_t)i + s;
        Tensor *x = op_input(e, 0, OP_UNARY_SHAPES[s], seed, true);
        snprintf(what, sizeof what, "%s numel %lld", e->name, (long long)shape_numel(OP_UNARY_SHAPES[s]));
        compare_op(what, e->f, &x, 1, NULL, seed + 5, false);
      }
    if (e->kind == OP_BINARY)
      for (int p = 0; p < BINARY_PAIRS; p++) {
        uint64_t seed = 21000 + 100 * (uint64_t)e->kernel + 2 * p;
        Tensor *in[2] = {op_input(e, 0, OP_BINARY_PAIRS[p][0], seed, true),
                         op_input(e, 1, OP_BINARY_PAIRS[p][1], seed + 1, true)};
        snprintf(what, sizeof what, "%s pair %d", e->name, p);
        compare_op(what, e->f, in, 2, NULL, seed + 7, false);
      }
  }
}
END_TEST

static Tensor *f_dropout(Tensor *const *in, void *c) {
  Rng rng = rng_make(77);  // the same stream on both devices: the same mask
  rng.offset = 5;
  return op_dropout(in[0], *(float *)c, true, &rng);
}

START_TEST(ops_dropout) {
  const Shape shapes[] = {SHAPE(4, 33), SHAPE(1, 7), SHAPE(1000003)};
  float ps[] = {0.1f, 0.5f};
  for (int i = 0; i < 2; i++)
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
      Tensor *x = cpu_uniform_tensor(shapes[s], 22000 + 10 * (uint64_t)i + s, -1, 1, true);
      char what[64];
      snprintf(what, sizeof what, "dropout p=%g numel %lld", ps[i], (long long)shape_numel(shapes[s]));
      compare_op(what, f_dropout, &x, 1, &ps[i], 22100 + s, true);  // the same mask, bit for bit
    }
}
END_TEST

typedef struct {
  int axis;
  bool keepdim, mean;
} AxisArg;

static Tensor *f_reduce(Tensor *const *in, void *c) {
  AxisArg *a = c;
  return a->mean ? op_mean(in[0], a->axis, a->keepdim) : op_sum(in[0], a->axis, a->keepdim);
}
static Tensor *f_sum_all(Tensor *const *in, void *c) { return op_sum_all(in[0]); }
static Tensor *f_mean_all(Tensor *const *in, void *c) { return op_mean_all(in[0]); }

START_TEST(ops_reduce) {
  // Small (the grad tests'), many outputs of few terms (thread path, the CPU's order), few outputs
  // of many terms (block path), and whole-tensor sums.
  struct {
    Shape s;
    AxisArg a;
  } cases[] = {{SHAPE(3, 4, 5), {0, false, false}},    {SHAPE(3, 4, 5), {1, true, true}},
               {SHAPE(3, 4, 5), {-1, false, false}},   {SHAPE(1, 7), {0, false, true}},
               {SHAPE(64, 30, 50), {1, false, false}}, {SHAPE(3, 5000, 2), {1, true, false}},
               {SHAPE(2, 3000), {-1, false, true}},    {SHAPE(5000, 3), {0, false, false}}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    Tensor *x = cpu_uniform_tensor(cases[i].s, 23000 + i, -1, 1, true);
    char what[64];
    snprintf(what, sizeof what, "%s case %zu", cases[i].a.mean ? "mean" : "sum", i);
    compare_op(what, f_reduce, &x, 1, &cases[i].a, 23100 + i, false);
  }
  const Shape all[] = {SHAPE(3, 4, 5), SHAPE(100003)};
  for (size_t i = 0; i < 2; i++) {
    Tensor *x = cpu_uniform_tensor(all[i], 23200 + i, -1, 1, true);
    compare_op("sum_all", f_sum_all, &x, 1, NULL, 23300 + i, false);
    x = cpu_uniform_tensor(all[i], 23400 + i, -1, 1, true);
    compare_op("mean_all", f_mean_all, &x, 1, NULL, 23500 + i, false);
  }
}
END_TEST

static Tensor *f_matmul(Tensor *const *in, void *c) { return op_matmul(in[0], in[1]); }
static Tensor *f_bmm(Tensor *const *in, void *c) {
  bool *t = c;
  return op_bmm(in[0], in[1], t[0], t[1]);
}
static Tensor *f_dropout_bmm(Tensor *const *in, void *c) {
  Rng rng = rng_make(81);  // the same stream on both devices: the same mask
  return op_dropout_bmm(in[0], in[1], 0.3f, true, &rng);
}
static Tensor *f_linear(Tensor *const *in, void *c) { return op_linear(in[0], in[1], in[2]); }
static Tensor *f_linear_relu(Tensor *const *in, void *c) { return op_linear_relu(in[0], in[1], in[2]); }
static Tensor *f_linear_relu_dropout(Tensor *const *in, void *c) {
  Rng rng = rng_make(79);  // the same stream on both devices: the same mask
  return op_linear_relu_dropout(in[0], in[1], in[2], 0.3f, true, &rng);
}

START_TEST(ops_matmul) {
  Shape mm[][2] = {{SHAPE(3, 4), SHAPE(4, 5)}, {SHAPE(2, 3, 4), SHAPE(4, 1)}, {SHAPE(2, 70, 33), SHAPE(33, 65)}};
  for (int i = 0; i < 3; i++) {
    Tensor *in[2] = {cpu_uniform_tensor(mm[i][0], 24000 + i, -1, 1, true),
                     cpu_uniform_tensor(mm[i][1], 24010 + i, -1, 1, true)};
    compare_op("matmul", f_matmul, in, 2, NULL, 24020 + i, false);
  }
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int64_t B = 3, M = 17, K = 9, N = 12;
      Tensor *in[2] = {cpu_uniform_tensor(ta ? SHAPE(B, K, M) : SHAPE(B, M, K), 24100 + ta, -1, 1, true),
                       cpu_uniform_tensor(tb ? SHAPE(B, N, K) : SHAPE(B, K, N), 24110 + tb, -1, 1, true)};
      bool t[2] = {ta, tb};
      compare_op("bmm", f_bmm, in, 2, t, 24120 + 2 * ta + tb, false);
    }
  Tensor *dbmm[2] = {cpu_uniform_tensor(SHAPE(3, 17, 9), 24130, -1, 1, true),
                     cpu_uniform_tensor(SHAPE(3, 9, 12), 24131, -1, 1, true)};
  compare_op("dropout_bmm", f_dropout_bmm, dbmm, 2, NULL, 24132, false);
  Tensor *lin[3] = {cpu_uniform_tensor(SHAPE(2, 50, 33), 24200, -1, 1, true),
                    cpu_uniform_tensor(SHAPE(40, 33), 24201, -1, 1, true),
                    cpu_uniform_tensor(SHAPE(40), 24202, -1, 1, true)};
  compare_op("linear", f_linear, lin, 3, NULL, 24203, false);
  Tensor *nobias[3] = {cpu_uniform_tensor(SHAPE(7), 24210, -1, 1, true),
                       cpu_uniform_tensor(SHAPE(3, 7), 24211, -1, 1, true), NULL};
  compare_op("linear without bias", f_linear, nobias, 3, NULL, 24212, false);
  // Pre-activations at least 1.4 from the ReLU's kink (biases +-1.5..2.5, alternating: live and
  // dead units; small x and W), so the two devices' roundings cannot flip a mask.
  Tensor *lr[3] = {cpu_uniform_tensor(SHAPE(2, 50, 33), 24220, -0.04f, 0.04f, true),
                   cpu_uniform_tensor(SHAPE(70, 33), 24221, -0.04f, 0.04f, true),
                   cpu_uniform_tensor(SHAPE(70), 24222, 1.5f, 2.5f, true)};
  for (int64_t j = 1; j < 70; j += 2) lr[2]->data[j] = -lr[2]->data[j];
  compare_op("linear_relu", f_linear_relu, lr, 3, NULL, 24223, false);
  Tensor *lrd[3] = {cpu_uniform_tensor(SHAPE(2, 50, 33), 24225, -0.04f, 0.04f, true),
                    cpu_uniform_tensor(SHAPE(70, 33), 24226, -0.04f, 0.04f, true),
                    cpu_uniform_tensor(SHAPE(70), 24227, 1.5f, 2.5f, true)};
  for (int64_t j = 1; j < 70; j += 2) lrd[2]->data[j] = -lrd[2]->data[j];
  compare_op("linear_relu_dropout", f_linear_relu_dropout, lrd, 3, NULL, 24228, false);
}
END_TEST

static Tensor *f_maxpool(Tensor *const *in, void *c) {
  int *k = c;
  return op_maxpool2d(in[0], k[0], k[1], k[2], k[3]);
}
static Tensor *f_dwconv(Tensor *const *in, void *c) { return op_depthwise_conv2d(in[0], in[1], in[2]); }
static Tensor *f_frozen_bn(Tensor *const *in, void *c) {
  return op_frozen_batchnorm2d(in[0], in[1], in[2], in[3], in[4], 1e-5f);
}
static Tensor *f_frozen_bn_act(Tensor *const *in, void *c) {
  const bool *flags = c;  // {has residual, relu, channels last}
  return op_frozen_batchnorm2d_act(in[0], in[1], in[2], in[3], in[4], 1e-5f, flags[0] ? in[5] : NULL, flags[1],
                                   flags[2]);
}

START_TEST(ops_pool_and_norm) {
  // Max pooling: overlapping windows (3/2/1, the ResNet stem's: inputs read by up to 4 windows),
  // tiling windows, stride 1; the gather backward must add exactly the CPU's terms in its order.
  // The last two channels last ({kernel, stride, pad, channels last}).
  int params[][4] = {{3, 2, 1, 0}, {2, 2, 0, 0}, {3, 1, 1, 0}, {3, 2, 1, 1}, {2, 2, 0, 1}};
  Shape shapes[] = {SHAPE(2, 3, 17, 16), SHAPE(1, 3, 4, 6), SHAPE(2, 2, 9, 11), SHAPE(2, 17, 16, 5), SHAPE(1, 4, 6, 3)};
  for (int i = 0; i < 5; i++) {
    Tensor *x = cpu_uniform_tensor(shapes[i], 25000 + i, -1, 1, true);
    compare_op(params[i][3] ? "maxpool2d (channels last)" : "maxpool2d", f_maxpool, &x, 1, params[i], 25010 + i, true);
  }
  // Depthwise convolution: FLatten's 5x5 over a feature map, a 3x3 without bias, a 1x1; sizes
  // past one block of parameter-gradient threads (the [C, k, k] reductions over 2 x 40 x 36).
  Tensor *dw[3] = {cpu_uniform_tensor(SHAPE(2, 6, 40, 36), 25300, -1, 1, true),
                   cpu_uniform_tensor(SHAPE(6, 1, 5, 5), 25301, -1, 1, true),
                   cpu_uniform_tensor(SHAPE(6), 25302, -1, 1, true)};
  compare_op("depthwise_conv2d 5x5", f_dwconv, dw, 3, NULL, 25303, false);
  Tensor *dw3[3] = {cpu_uniform_tensor(SHAPE(3, 4, 7, 9), 25310, -1, 1, true),
                    cpu_uniform_tensor(SHAPE(4, 1, 3, 3), 25311, -1, 1, true), NULL};
  compare_op("depthwise_conv2d 3x3 without bias", f_dwconv, dw3, 3, NULL, 25312, false);
  Tensor *dw1[3] = {cpu_uniform_tensor(SHAPE(1, 5, 4, 4), 25320, -1, 1, true),
                    cpu_uniform_tensor(SHAPE(5, 1, 1, 1), 25321, -1, 1, true),
                    cpu_uniform_tensor(SHAPE(5), 25322, -1, 1, true)};
  compare_op("depthwise_conv2d 1x1", f_dwconv, dw1, 3, NULL, 25323, false);
  Tensor *bn[5] = {cpu_uniform_tensor(SHAPE(2, 3, 4, 5), 25100, -1, 1, true),
                   cpu_uniform_tensor(SHAPE(3), 25101, 0.5f, 1.5f, false),
                   cpu_uniform_tensor(SHAPE(3), 25102, -1, 1, false), cpu_uniform_tensor(SHAPE(3), 25103, -1, 1, false),
                   cpu_uniform_tensor(SHAPE(3), 25104, 0.2f, 2.0f, false)};
  compare_op("frozen_batchnorm2d", f_frozen_bn, bn, 5, NULL, 25105, false);
  // Fused with the residual add and ReLU (the ResNet blocks' form): every combination, each on
  // inputs of its own (compare_op releases its inputs).
  // The last channels last, as the backbone runs them.
  bool combos[4][3] = {{true, false, false}, {true, true, false}, {false, true, false}, {true, true, true}};
  const char *combo_names[4] = {"frozen_batchnorm2d_act: add", "frozen_batchnorm2d_act: add_relu",
                                "frozen_batchnorm2d_act: relu", "frozen_batchnorm2d_act: add_relu (channels last)"};
  for (int i = 0; i < 4; i++) {
    uint64_t seed = 25110 + 10 * (uint64_t)i;
    Shape xs = combos[i][2] ? SHAPE(2, 4, 5, 3) : SHAPE(2, 3, 4, 5);
    Tensor *in[6] = {cpu_uniform_tensor(xs, seed, -1, 1, true),
                     cpu_uniform_tensor(SHAPE(3), seed + 1, 0.5f, 1.5f, false),
                     cpu_uniform_tensor(SHAPE(3), seed + 2, -1, 1, false),
                     cpu_uniform_tensor(SHAPE(3), seed + 3, -1, 1, false),
                     cpu_uniform_tensor(SHAPE(3), seed + 4, 0.2f, 2.0f, false),
                     combos[i][0] ? cpu_uniform_tensor(xs, seed + 5, -1, 1, true) : NULL};
    compare_op(combo_names[i], f_frozen_bn_act, in, combos[i][0] ? 6 : 5, combos[i], seed + 6, false);
  }
  Tensor *big[5] = {
      cpu_uniform_tensor(SHAPE(2, 64, 20, 30), 25200, -1, 1, true),
      cpu_uniform_tensor(SHAPE(64), 25201, 0.5f, 1.5f, false), cpu_uniform_tensor(SHAPE(64), 25202, -1, 1, false),
      cpu_uniform_tensor(SHAPE(64), 25203, -1, 1, false), cpu_uniform_tensor(SHAPE(64), 25204, 0.2f, 2.0f, false)};
  compare_op("frozen_batchnorm2d 64 channels", f_frozen_bn, big, 5, NULL, 25205, false);
}
END_TEST

static Tensor *f_softmax(Tensor *const *in, void *c) { return op_softmax(in[0], in[1]); }
static Tensor *f_log_softmax(Tensor *const *in, void *c) { return op_log_softmax(in[0], in[1]); }
static Tensor *f_layernorm(Tensor *const *in, void *c) { return op_layernorm(in[0], in[1], in[2], 1e-5f); }
static Tensor *f_cluster_argmax(Tensor *const *in, void *c) { return op_cluster_argmax(in[0], in[1], c != NULL, NULL); }

// A key-padding mask [images, keys]: -inf on the last `pad[i]` keys of image i.
static Tensor *padding_mask(int64_t images, int64_t keys, const int64_t *pad) {
  float *m = host_alloc(images * keys);
  for (int64_t i = 0; i < images; i++)
    for (int64_t k = 0; k < keys; k++) m[i * keys + k] = k >= keys - pad[i] ? -INFINITY : 0.0f;
  Tensor *t = tensor_from_host(DEVICE_CPU, SHAPE(images, keys), m);
  free(m);
  return t;
}

START_TEST(ops_softmax_layernorm) {
  OpFn fs[] = {f_softmax, f_log_softmax};
  const char *names[] = {"softmax", "log_softmax"};
  for (int l = 0; l < 2; l++) {
    char what[96];
    Tensor *in[2] = {cpu_uniform_tensor(SHAPE(3, 7), 26000, -2, 2, true), NULL};
    compare_op(names[l], fs[l], in, 2, NULL, 26001, false);
    Tensor *one[2] = {cpu_uniform_tensor(SHAPE(4, 1), 26002, -2, 2, true), NULL};
    compare_op(names[l], fs[l], one, 2, NULL, 26003, false);
    // Attention-shaped: [images, heads * queries, keys] with a key-padding mask; image 2's keys
    // are all masked (a row with no distribution: zeros / -inf, no gradient).
    int64_t pad[3] = {0, 300, 1000};
    Tensor *att[2] = {cpu_uniform_tensor(SHAPE(3, 16, 1000), 26004, -4, 4, true), padding_mask(3, 1000, pad)};
    snprintf(what, sizeof what, "%s masked [3, 16, 1000]", names[l]);
    compare_op(what, fs[l], att, 2, NULL, 26005, false);
    Tensor *classes[2] = {cpu_uniform_tensor(SHAPE(2, 100, 92), 26006, -4, 4, true), NULL};
    snprintf(what, sizeof what, "%s [2, 100, 92]", names[l]);
    compare_op(what, fs[l], classes, 2, NULL, 26007, false);
  }
  // k-means assignment (no gradient): the same one-hot / mean weights bit for bit, [3 images x 2
  // heads, 100 queries, 1000 pixels], image 2 all padded (assigned to nothing).
  for (int mean = 0; mean < 2; mean++) {
    int64_t pad[3] = {0, 300, 1000};
    Tensor *km[2] = {cpu_uniform_tensor(SHAPE(6, 100, 1000), 26200 + mean, -4, 4, false), padding_mask(3, 1000, pad)};
    compare_op(mean ? "cluster_argmax (mean)" : "cluster_argmax (sum)", f_cluster_argmax, km, 2,
               mean ? (void *)1 : NULL, 26210 + mean, true);
  }
  Tensor *ln[3] = {cpu_uniform_tensor(SHAPE(3, 2, 8), 26100, -2, 2, true),
                   cpu_uniform_tensor(SHAPE(8), 26101, 0.5f, 1.5f, true),
                   cpu_uniform_tensor(SHAPE(8), 26102, -1, 1, true)};
  compare_op("layernorm", f_layernorm, ln, 3, NULL, 26103, false);
  Tensor *plain[3] = {cpu_uniform_tensor(SHAPE(4, 5), 26104, -2, 2, true), NULL, NULL};
  compare_op("layernorm without affine", f_layernorm, plain, 3, NULL, 26105, false);
  Tensor *wide[3] = {cpu_uniform_tensor(SHAPE(2, 300, 256), 26106, -2, 2, true),
                     cpu_uniform_tensor(SHAPE(256), 26107, 0.5f, 1.5f, true),
                     cpu_uniform_tensor(SHAPE(256), 26108, -1, 1, true)};
  compare_op("layernorm [600, 256]", f_layernorm, wide, 3, NULL, 26109, false);
}
END_TEST

static Tensor *f_reshape(Tensor *const *in, void *c) {
  return op_mul(op_reshape(in[0], SHAPE(4, -1)), op_reshape(in[0], SHAPE(4, 6)));
}
static Tensor *f_permute(Tensor *const *in, void *c) { return op_permute(in[0], (int *)c); }
static Tensor *f_transpose(Tensor *const *in, void *c) { return op_transpose(in[0], 0, -1); }
static Tensor *f_concat(Tensor *const *in, void *c) { return op_concat(in, 3, *(int *)c); }
static Tensor *f_slice(Tensor *const *in, void *c) {
  int64_t *a = c;
  return op_slice(in[0], (int)a[0], a[1], a[2]);
}

typedef struct {
  const int64_t *idx;
  int64_t n;
} IndexArg;

static Tensor *f_index_select(Tensor *const *in, void *c) {
  IndexArg *a = c;
  return op_index_select(in[0], a->idx, a->n);
}

START_TEST(ops_shape) {
  Tensor *r = cpu_uniform_tensor(SHAPE(2, 3, 4), 27000, -1, 1, true);
  compare_op("reshape (used twice)", f_reshape, &r, 1, NULL, 27001, false);
  int perms[][4] = {{1, 0, 2, 3}, {0, 2, 3, 1}, {3, 2, 1, 0}};
  for (int i = 0; i < 3; i++) {
    Tensor *x = cpu_uniform_tensor(SHAPE(2, 3, 1, 4), 27010 + i, -1, 1, true);
    compare_op("permute", f_permute, &x, 1, perms[i], 27020 + i, true);
    x = cpu_uniform_tensor(SHAPE(5, 33, 7, 64), 27030 + i, -1, 1, true);
    compare_op("permute [5, 33, 7, 64]", f_permute, &x, 1, perms[i], 27040 + i, true);
  }
  Tensor *t = cpu_uniform_tensor(SHAPE(3, 2, 5), 27050, -1, 1, true);
  compare_op("transpose", f_transpose, &t, 1, NULL, 27051, true);
  int axis0 = 0, axis1 = 1, axis_last = -1;
  Tensor *a[3] = {cpu_uniform_tensor(SHAPE(1, 3, 2), 27100, -1, 1, true),
                  cpu_uniform_tensor(SHAPE(2, 3, 2), 27101, -1, 1, true),
                  cpu_uniform_tensor(SHAPE(3, 3, 2), 27102, -1, 1, true)};
  compare_op("concat axis 0", f_concat, a, 3, &axis0, 27103, true);
  Tensor *b[3] = {cpu_uniform_tensor(SHAPE(2, 1, 2), 27110, -1, 1, true),
                  cpu_uniform_tensor(SHAPE(2, 4, 2), 27111, -1, 1, false),  // one input takes no gradient
                  cpu_uniform_tensor(SHAPE(2, 2, 2), 27112, -1, 1, true)};
  compare_op("concat axis 1", f_concat, b, 3, &axis1, 27113, true);
  Tensor *c[3] = {cpu_uniform_tensor(SHAPE(2, 300, 1), 27120, -1, 1, true),
                  cpu_uniform_tensor(SHAPE(2, 300, 64), 27121, -1, 1, true),
                  cpu_uniform_tensor(SHAPE(2, 300, 3), 27122, -1, 1, true)};
  compare_op("concat last axis", f_concat, c, 3, &axis_last, 27123, true);
  int64_t slices[][3] = {{0, 1, 3}, {1, 0, 2}, {2, 3, 5}, {-1, 0, 5}};
  for (int i = 0; i < 4; i++) {
    Tensor *x = cpu_uniform_tensor(SHAPE(4, 3, 5), 27200 + i, -1, 1, true);
    compare_op("slice", f_slice, &x, 1, slices[i], 27210 + i, true);
  }
  // index_select with repeated indices (gradients of a row add up) and rows never picked.
  static const int64_t idx[] = {2, 0, 2, 3, 1, 2};
  IndexArg ia = {idx, 6};
  Tensor *x = cpu_uniform_tensor(SHAPE(5, 3), 27300, -1, 1, true);
  compare_op("index_select", f_index_select, &x, 1, &ia, 27301, true);
  Tensor *v = cpu_uniform_tensor(SHAPE(4), 27302, -1, 1, true);
  compare_op("index_select 1-d", f_index_select, &v, 1, &ia, 27303, true);
  // ENACT-shaped: 2 images' clusters padded with a shared zero row (index L repeated many times).
  int64_t L = 150, n = 2 * 100, *big = malloc((size_t)n * sizeof(int64_t));
  ck_assert_ptr_nonnull(big);
  for (int64_t k = 0; k < n; k++) big[k] = k < 100 ? k : (k < 170 ? k - 30 : L);
  IndexArg ib = {big, n};
  Tensor *rows = cpu_uniform_tensor(SHAPE(L + 1, 64), 27304, -1, 1, true);
  compare_op("index_select [151, 64] x 200", f_index_select, &rows, 1, &ib, 27305, true);
  free(big);
}
END_TEST

typedef struct {
  const int64_t *targets;
} TargetsArg;

static Tensor *f_cross_entropy(Tensor *const *in, void *c) {
  return op_cross_entropy(in[0], ((TargetsArg *)c)->targets, in[1]);
}
static Tensor *f_focal(Tensor *const *in, void *c) {
  return op_sigmoid_focal_loss(in[0], ((TargetsArg *)c)->targets, 0.25f, 2.0f);
}
static Tensor *f_l1(Tensor *const *in, void *c) { return op_l1_sum(in[0], in[1]); }
static Tensor *f_to_xyxy(Tensor *const *in, void *c) { return op_box_cxcywh_to_xyxy(in[0]); }
static Tensor *f_to_cxcywh(Tensor *const *in, void *c) { return op_box_xyxy_to_cxcywh(in[0]); }
static Tensor *f_giou(Tensor *const *in, void *c) { return op_box_giou(in[0], in[1]); }

// n random xyxy boxes inside [0, 1]: centres in [0.2, 0.8], sizes in [0.05, 0.4].
static Tensor *random_xyxy(int64_t n, uint64_t seed, bool grad) {
  float *u = host_uniform(4 * n, seed, 0.0f, 1.0f), *b = host_alloc(4 * n);
  for (int64_t i = 0; i < n; i++) {
    float cx = 0.2f + 0.6f * u[4 * i], cy = 0.2f + 0.6f * u[4 * i + 1];
    float w = 0.05f + 0.35f * u[4 * i + 2], h = 0.05f + 0.35f * u[4 * i + 3];
    b[4 * i] = cx - w / 2, b[4 * i + 1] = cy - h / 2, b[4 * i + 2] = cx + w / 2, b[4 * i + 3] = cy + h / 2;
  }
  Tensor *t = tensor_from_host(DEVICE_CPU, SHAPE(n, 4), b);
  tensor_set_requires_grad(t, grad);
  free(u);
  free(b);
  return t;
}

START_TEST(ops_losses_and_boxes) {
  // DETR's classification loss: [B*Q, C+1] logits, no-object weight 0.1 on the last class.
  int64_t rows = 200, classes = 92, *targets = malloc((size_t)rows * sizeof(int64_t));
  ck_assert_ptr_nonnull(targets);
  for (int64_t r = 0; r < rows; r++) targets[r] = r % 7 == 0 ? (r * 13) % (classes - 1) : classes - 1;
  float *w = host_alloc(classes);
  for (int64_t c = 0; c < classes; c++) w[c] = c == classes - 1 ? 0.1f : 1.0f;
  TargetsArg ta = {targets};
  Tensor *ce[2] = {cpu_uniform_tensor(SHAPE(rows, classes), 28000, -3, 3, true),
                   tensor_from_host(DEVICE_CPU, SHAPE(classes), w)};
  compare_op("cross_entropy weighted [200, 92]", f_cross_entropy, ce, 2, &ta, 28001, false);
  Tensor *ce2[2] = {cpu_uniform_tensor(SHAPE(5, 5), 28002, -2, 2, true), NULL};
  static const int64_t small_targets[] = {0, 4, 2, 4, 1};
  TargetsArg ts = {small_targets};
  compare_op("cross_entropy", f_cross_entropy, ce2, 2, &ts, 28003, false);
  // Conditional DETR's classification loss: [B*Q, C] logits, most rows with no positive class.
  Tensor *fl = cpu_uniform_tensor(SHAPE(rows, classes - 1), 28004, -6, 3, true);
  compare_op("sigmoid_focal_loss [200, 91]", f_focal, &fl, 1, &ta, 28005, false);
  free(targets);
  free(w);
  const Shape l1_shapes[] = {SHAPE(6, 4), SHAPE(37, 4), SHAPE(100003)};
  for (int i = 0; i < 3; i++) {
    Tensor *in[2] = {cpu_uniform_tensor(l1_shapes[i], 28100 + i, -1, 1, true),
                     cpu_uniform_tensor(l1_shapes[i], 28110 + i, -1, 1, true)};
    compare_op("l1_sum", f_l1, in, 2, NULL, 28120 + i, false);
  }
  Tensor *one_side[2] = {cpu_uniform_tensor(SHAPE(9, 4), 28130, -1, 1, true),
                         cpu_uniform_tensor(SHAPE(9, 4), 28131, -1, 1, false)};  // targets: no gradient
  compare_op("l1_sum, one side", f_l1, one_side, 2, NULL, 28132, false);
  Tensor *cb = cpu_uniform_tensor(SHAPE(2, 300, 4), 28200, 0.1f, 0.9f, true);
  compare_op("box_cxcywh_to_xyxy", f_to_xyxy, &cb, 1, NULL, 28201, false);
  Tensor *xb = cpu_uniform_tensor(SHAPE(5, 4), 28202, 0.1f, 0.9f, true);
  compare_op("box_xyxy_to_cxcywh", f_to_cxcywh, &xb, 1, NULL, 28203, false);
  const int64_t counts[] = {4, 1000};
  for (int i = 0; i < 2; i++) {
    Tensor *g[2] = {random_xyxy(counts[i], 28300 + i, true), random_xyxy(counts[i], 28310 + i, true)};
    compare_op("box_giou", f_giou, g, 2, NULL, 28320 + i, false);
  }
  Tensor *g1[2] = {random_xyxy(50, 28330, true), random_xyxy(50, 28331, false)};
  compare_op("box_giou, one side", f_giou, g1, 2, NULL, 28332, false);
}
END_TEST

typedef struct {
  int64_t Hp, Wp;
  const int64_t *valid_h, *valid_w;
  float taps[64];
  int ntaps;
  bool one_d;
} SmoothArg;

static Tensor *f_smooth(Tensor *const *in, void *c) {
  SmoothArg *a = c;
  return op_enact_smooth(in[0], a->Hp, a->Wp, a->valid_h, a->valid_w, a->taps, a->ntaps, a->one_d);
}

START_TEST(ops_enact_smooth) {
  // 3 images of a padded 25 x 38 map (DETR-R50 at 800 x 1200), valid regions full, right-padded
  // and bottom-right padded; sigma 3 (17 taps) and 1 (5 taps), 2-D and the 1-D variant.
  static const int64_t vh[] = {25, 25, 13}, vw[] = {38, 21, 30};
  for (int sigma = 1; sigma <= 3; sigma += 2)
    for (int one_d = 0; one_d < 2; one_d++) {
      SmoothArg a = {.Hp = 25, .Wp = 38, .valid_h = vh, .valid_w = vw, .one_d = one_d};
      a.ntaps = enact_gaussian_taps((float)sigma, a.taps);
      Tensor *x = cpu_uniform_tensor(SHAPE(3, 25 * 38), 29000 + 10 * (uint64_t)sigma + one_d, 0, 1, true);
      char what[64];
      snprintf(what, sizeof what, "enact_smooth sigma %d %s", sigma, one_d ? "1-D" : "2-D");
      compare_op(what, f_smooth, &x, 1, &a, 29100 + (uint64_t)sigma + one_d, false);
    }
}
END_TEST

// ENACT's regions found on the GPU (signs, flags, cub's scan, scatter; the authors' cluster size and
// chunks) are the CPU's, value for value: 3 images of a padded 25 x 38 map, full, right-padded and
// bottom-right padded; both curvature forms. Then the clustering over the device-found regions
// (the GPU's B*N rows, the count read on the device; the CPU's the count's).
START_TEST(ops_enact_regions) {
  static const int64_t vh[] = {25, 25, 13}, vw[] = {38, 21, 30};
  const int64_t B = 3, Hp = 25, Wp = 38, N = Hp * Wp, d = 24;
  for (int one_d = 0; one_d < 2; one_d++) {
    ScopeMark mark = tensor_scope_mark();
    Tensor *hsm = cpu_uniform_tensor(SHAPE(B, N), 29500 + (uint64_t)one_d, 0, 1, false);
    Tensor *hsmg = tensor_scoped(tensor_to_device(hsm, DEVICE_CUDA));
    Tensor *signs = op_enact_signs(hsm, Hp, Wp, vh, vw, one_d), *signsg = op_enact_signs(hsmg, Hp, Wp, vh, vw, one_d);
    expect_tensor_close("enact_signs", signsg, signs);  // +-1 and 0: close is equal
    EnactRegionIndex r = op_enact_regions(signs), rg = op_enact_regions(signsg);
    EnactRegions host, hostg;
    enact_regions_from_index(&r, &host);
    enact_regions_from_index(&rg, &hostg);
    ck_assert_int_gt(host.count, 3 * B);
    ck_assert_int_eq(hostg.count, host.count);
    ck_assert_mem_eq(hostg.image_offset, host.image_offset, (size_t)(B + 1) * sizeof(int64_t));
    ck_assert_mem_eq(hostg.starts, host.starts, (size_t)host.count * sizeof(int64_t));
    ck_assert_mem_eq(hostg.lengths, host.lengths, (size_t)host.count * sizeof(int64_t));
    // The clustering over them, cap = B*N rows (zero past the count), forward and backward.
    Tensor *k, *kg, *v, *vg, *h, *hg;
    leaf_pair(SHAPE(B * N, d), 29510, -1, 1, &k, &kg);
    leaf_pair(SHAPE(B * N, d), 29511, -1, 1, &v, &vg);
    leaf_pair(SHAPE(B * N), 29512, -2, 2, &h, &hg);
    Tensor *vc, *kc = op_enact_cluster(k, v, h, op_reshape(signs, SHAPE(B * N)), &r, &vc);
    backward_two_seeded(kc, vc, 29513);
    Tensor *vcg, *kcg = op_enact_cluster(kg, vg, hg, op_reshape(signsg, SHAPE(B * N)), &rg, &vcg);
    backward_two_seeded(kcg, vcg, 29513);
    // The CPU's K', V' have the count's rows; the GPU's the bound's, zero past the count.
    ck_assert_int_eq(kc->shape.d[0], host.count);
    ck_assert_int_eq(kcg->shape.d[0], kcg->device == DEVICE_CPU ? host.count : B * N);  // gpu_harness: a CPU
    Tensor *out[2] = {kc, vc}, *gout[2] = {kcg, vcg};
    for (int t = 0; t < 2; t++) {
      Tensor *head = tensor_view_range(gout[t], 0, out[t]->shape);
      expect_tensor_close(t ? "enact_regions cluster V'" : "enact_regions cluster K'", head, out[t]);
      tensor_release(head);
      float *all = download(gout[t]);
      for (int64_t e = host.count * d; e < gout[t]->numel; e++) ck_assert_float_eq(all[e], 0.0f);
      free(all);
    }
    expect_tensor_close("enact_regions cluster dK", kg->grad, k->grad);
    expect_tensor_close("enact_regions cluster dH", hg->grad, h->grad);
    // The authors' form: the same cluster size, mean length and chunks.
    EnactRegionIndex o = op_enact_official_regions(hsm), og = op_enact_official_regions(hsmg);
    EnactOfficialTrace t = {.entropy = hsm, .index = o}, tg = {.entropy = hsmg, .index = og};
    double mean, meang;
    int64_t c = enact_official_trace_cluster_size(&t, &mean), cg = enact_official_trace_cluster_size(&tg, &meang);
    ck_assert_int_eq(cg, c);
    ck_assert(mean == meang);
    EnactRegions chunks, chunksg;
    enact_regions_from_index(&o, &chunks);
    enact_regions_from_index(&og, &chunksg);
    ck_assert_int_eq(chunks.count, B * (N / c));
    ck_assert_int_eq(chunksg.count, chunks.count);
    ck_assert_mem_eq(chunksg.starts, chunks.starts, (size_t)chunks.count * sizeof(int64_t));
    ck_assert_mem_eq(chunksg.image_offset, chunks.image_offset, (size_t)(B + 1) * sizeof(int64_t));
    enact_regions_free(&host), enact_regions_free(&hostg), enact_regions_free(&chunks), enact_regions_free(&chunksg);
    tensor_scope_release(mark);
    Tensor *leaves[] = {hsm, k, kg, v, vg, h, hg};
    for (int i = 0; i < 7; i++) tensor_release(leaves[i]);
  }
  // One image of one pixel: one region, and the authors' one chunk of size 1, on both devices.
  ScopeMark mark = tensor_scope_mark();
  static const int64_t one[1] = {1};
  Tensor *hsm = tensor_scoped(cpu_uniform_tensor(SHAPE(1, 1), 29520, 0, 1, false));
  Tensor *hsmg = tensor_scoped(tensor_to_device(hsm, DEVICE_CUDA));
  EnactRegionIndex idx[4] = {op_enact_regions(op_enact_signs(hsm, 1, 1, one, one, false)),
                             op_enact_regions(op_enact_signs(hsmg, 1, 1, one, one, false)),
                             op_enact_official_regions(hsm), op_enact_official_regions(hsmg)};
  for (int i = 0; i < 4; i++) {
    EnactRegions r;
    enact_regions_from_index(&idx[i], &r);
    ck_assert_int_eq(r.count, 1);
    ck_assert_int_eq(r.starts[0], 0);
    ck_assert_int_eq(r.lengths[0], 1);
    ck_assert_int_eq(r.image_offset[1], 1);
    enact_regions_free(&r);
  }
  tensor_scope_release(mark);
}
END_TEST

// The clustered attention over per-image cluster counts of 1 to 400 (no padding to the longest),
// then over an image of no cluster beside one with a cluster per query (N = 37, under a block's
// queries): heads of 16, 32 and 64 features (each register width), both scalings, attention dropout.
typedef struct {
  const int64_t *starts, *lengths, *offsets;
  int64_t L, B, heads;
  float scale, out_scale, p;  // p: attention dropout, the same draw on both devices
} ClusterAttnArg;

static Tensor *f_cluster_attention(Tensor *const *in, void *c) {
  ClusterAttnArg *a = c;
  EnactRegionIndex r = enact_region_index_upload(in[0]->device, a->starts, a->lengths, a->L, a->offsets, a->B);
  Rng rng = rng_make(29640);
  return op_cluster_attention(in[0], in[1], in[2], &r, a->heads, a->scale, a->out_scale, a->p, &rng);
}

START_TEST(ops_cluster_attention) {
  static const int64_t Bs[2] = {3, 2}, Ns[2] = {950, 37}, counts[2][3] = {{400, 1, 137}, {0, 37, 0}};
  for (int scene = 0; scene < 2; scene++) {
    const int64_t B = Bs[scene], N = Ns[scene];
    int64_t offsets[4] = {0}, L = 0;
    for (int b = 0; b < B; b++) offsets[b + 1] = L += counts[scene][b];
    int64_t *starts = malloc((size_t)L * sizeof(int64_t)), *lengths = malloc((size_t)L * sizeof(int64_t));
    for (int64_t j = 0; j < L; j++) starts[j] = j, lengths[j] = 1;  // the op reads only the offsets
    static const int64_t heads[3] = {16, 8, 4};                     // 256 features: head widths 16, 32, 64
    for (int k = 0; k < 3; k++) {
      ClusterAttnArg a = {.starts = starts,
                          .lengths = lengths,
                          .offsets = offsets,
                          .L = L,
                          .B = B,
                          .heads = heads[k],
                          .scale = k == 1 ? 1.0f : 1.0f / sqrtf(256.0f / (float)heads[k]),
                          .out_scale = k == 1 ? 1.0f / 32.0f : 1.0f,
                          .p = k == 2 ? 0.1f : 0.0f};
      uint64_t seed = 29600 + 40 * (uint64_t)scene + (uint64_t)k;
      Tensor *in[3] = {cpu_uniform_tensor(SHAPE(B, N, 256), seed, -1, 1, true),
                       cpu_uniform_tensor(SHAPE(L, 256), seed + 10, -1, 1, true),
                       cpu_uniform_tensor(SHAPE(L, 256), seed + 20, -1, 1, true)};
      char what[96];
      snprintf(what, sizeof what, "cluster_attention N %lld, %lld heads", (long long)N, (long long)heads[k]);
      compare_op(what, f_cluster_attention, in, 3, &a, seed + 30, false);
    }
    free(starts);
    free(lengths);
  }
}
END_TEST

// Every op table entry marked .cuda was compared with the CPU by the autograd and op tests
// (which run first, in this process): the structural form of "every op has a CUDA test".
START_TEST(ops_coverage) {
  const char *c = getenv("CK_RUN_CASE"), *t = getenv("CK_RUN_SUITE");
  if ((c && *c) || (t && *t)) return;  // only a part was run: nothing to count
  ck_assert(OP_TABLE_COUNT <= (int)(sizeof g_compared / sizeof *g_compared));
  char missing[512] = "";
  for (int i = 0; i < OP_TABLE_COUNT; i++)
    if (OP_TABLE[i].cuda && !g_compared[i] && strlen(missing) + strlen(OP_TABLE[i].name) + 2 < sizeof missing) {
      strcat(missing, " ");
      strcat(missing, OP_TABLE[i].name);
    }
  ck_assert_msg(!missing[0], "op table entries marked .cuda that test_gpu never compared:%s", missing);
}
END_TEST

// --- host-to-device copies: pinned staging ---

START_TEST(staged_uploads) {
  // More uploads in flight than staging slots (64), sizes from 4 bytes to 3.2 MB, no
  // synchronisation in between; each source is overwritten as soon as its upload returns.
  enum { COUNT = 200 };
  const int64_t sizes[] = {1, 1000, 70000, 800000, 3};
  Tensor *t[COUNT];
  float *ref[COUNT], *src = host_alloc(800000);
  for (int i = 0; i < COUNT; i++) {
    int64_t n = sizes[i % 5];
    ref[i] = host_uniform(n, 30000 + (uint64_t)i, -1, 1);
    memcpy(src, ref[i], (size_t)n * sizeof(float));
    t[i] = tensor_from_host(DEVICE_CUDA, SHAPE(n), src);
    for (int64_t k = 0; k < n; k++) src[k] = NAN;
  }
  for (int i = 0; i < COUNT; i++) {
    char what[64];
    snprintf(what, sizeof what, "upload %d (%lld floats)", i, (long long)t[i]->numel);
    expect_tensor_bitwise(what, t[i], ref[i]);
    tensor_release(t[i]);
    free(ref[i]);
  }
  free(src);
  // The pinned-memory API: a queued copy from pinned memory.
  int64_t n = 100000;
  float *pinned = cuda_host_alloc((size_t)n * sizeof(float)), *h = host_uniform(n, 30999, -1, 1);
  ck_assert_ptr_nonnull(pinned);
  memcpy(pinned, h, (size_t)n * sizeof(float));
  float *d = cuda_device_malloc((size_t)n * sizeof(float));
  ck_assert_ptr_nonnull(d);
  cuda_memcpy_h2d_async(d, pinned, (size_t)n * sizeof(float));
  expect_bitwise("cuda_memcpy_h2d_async", d, h, n);  // the download is ordered after the copy
  cuda_host_free(pinned);
  cuda_device_free(d);
  free(h);
}
END_TEST

// --- the whole model: the tiny DETR (and DETR+ENACT) on CUDA against the CPU ---
//
// Both devices start from the same weights (initialised on the CPU, copied to the GPU) and see the
// same batch and the same dropout stream (training mode, dropout 0.1: the masks are the same bits
// on both devices). The loss and the gradients are compared under the CPU's matching held fixed
// (matching is discontinuous: a near-tie in the cost could pick another assignment from values
// that agree to rounding); separately, the GPU's own matching must give the same assignment.
//
// MODEL_TOL = 1e-3, relative to max(1, max|cpu|): single ops agree to ~1e-6 (cuBLAS / cuDNN and
// the reductions sum in other orders, the GPU contracts multiply-adds into FMAs), and these
// differences compound through the forward's and the backward's ~60 ops each, amplified where
// layer norm divides by a small spread or a softmax is sharp. docs/cuda.md lists the bounds.
#define MODEL_TOL 1e-3

static void expect_tensor_close_tol(const char *what, const Tensor *t, const Tensor *ref, double tol) {
  ck_assert_msg(t && ref, "%s: missing tensor", what);
  ck_assert_msg(shape_equal(t->shape, ref->shape), "%s: shapes differ", what);
  float *a = download(t), *b = download(ref);
  double err = gpu_rel_diff(a, b, t->numel);
  ck_assert_msg(err <= tol, "%s: relative error %.3g > %.3g", what, err, tol);
  free(a);
  free(b);
}

static void expect_scalar_close(const char *what, double got, double ref, double tol) {
  double err = fabs(got - ref) / (fabs(ref) > 1.0 ? fabs(ref) : 1.0);
  ck_assert_msg(err <= tol, "%s: %.9g vs %.9g on the CPU (relative error %.3g > %.3g)", what, got, ref, err, tol);
}

static const float TARGET_BOXES[12] = {0.5f, 0.5f, 0.2f, 0.3f, 0.3f, 0.6f, 0.1f, 0.2f, 0.4f, 0.45f, 0.3f, 0.25f};
static const int64_t TARGET_LABELS[3] = {3, 6, 1};

typedef struct {
  DetrModel *cpu, *gpu;
  Tensor *images_cpu, *images_gpu;  // [2, H, W, 3]
  uint8_t *mask;                    // [2, H, W]: image 1's right third is padding
  DetrTarget targets[2];            // 2 boxes and 1 box
} ModelPair;

// decoder: the decoder kind (NULL: DETR's); with one, 9 queries (Anchor DETR's 3 patterns x 3 anchors).
static void model_pair_make(ModelPair *mp, const char *attn, const char *decoder, int64_t H, int64_t W) {
  DetrConfig cfg;
  ck_assert_int_eq(detr_config_preset("tiny", &cfg), 0);
  cfg.encoder_attn = encoder_attn_find(attn);
  ck_assert_ptr_nonnull(cfg.encoder_attn);
  if (decoder) {
    cfg.decoder = decoder_find(decoder);
    ck_assert_ptr_nonnull(cfg.decoder);
    cfg.num_queries = 9;
  }
  mp->cpu = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(mp->cpu, 1);
  mp->gpu = detr_model_create(&cfg, DEVICE_CUDA);
  ck_assert_int_eq(mp->gpu->params.count, mp->cpu->params.count);
  for (int i = 0; i < mp->cpu->params.count; i++)
    tensor_copy_(mp->gpu->params.items[i].tensor, mp->cpu->params.items[i].tensor);
  float *img = host_uniform(2 * 3 * H * W, 31000, -2, 2);
  mp->images_cpu = tensor_from_host(DEVICE_CPU, SHAPE(2, H, W, 3), img);
  mp->images_gpu = tensor_to_device(mp->images_cpu, DEVICE_CUDA);
  free(img);
  mp->mask = calloc((size_t)(2 * H * W), 1);
  ck_assert_ptr_nonnull(mp->mask);
  for (int64_t y = 0; y < H; y++)
    for (int64_t x = 2 * W / 3; x < W; x++) mp->mask[H * W + y * W + x] = 1;
  mp->targets[0] = (DetrTarget){2, TARGET_BOXES, TARGET_LABELS};
  mp->targets[1] = (DetrTarget){1, TARGET_BOXES + 8, TARGET_LABELS + 2};
}

static void model_pair_free(ModelPair *mp) {
  detr_model_free(mp->cpu);
  detr_model_free(mp->gpu);
  tensor_release(mp->images_cpu);
  tensor_release(mp->images_gpu);
  free(mp->mask);
}

// Forward in training mode with the dropout stream (9, 0).
static void model_forward(DetrModel *m, Tensor *images, const uint8_t *mask, DetrOutput *out) {
  Rng drop = rng_make(9);
  NnCtx ctx = {.training = true, .dropout_rng = &drop};
  char err[256];
  ck_assert_msg(detr_model_forward(m, &ctx, images, mask, out, err, sizeof err) == 0, "forward: %s", err);
}

// The matches of every decoder output: m[0] the final one's, m[1 + l] auxiliary output l's.
static void match_all(const DetrModel *m, const DetrOutput *out, const DetrTarget *targets, DetrMatch (*matches)[2]) {
  CriterionConfig cc = detr_criterion_config(&m->cfg);  // the decoder kind's class head (Anchor DETR: focal)
  char err[256];
  for (int k = 0; k < out->n_layers; k++) {
    const DetrLayerOutput *o = &out->layers[k == 0 ? out->n_layers - 1 : k - 1];
    ck_assert_msg(detr_hungarian_match(o->logits, o->boxes, targets, cc.matcher, matches[k], err, sizeof err) == 0,
                  "matching: %s", err);
  }
}

static void loss_backward(const DetrModel *m, const DetrOutput *out, const DetrTarget *targets, DetrMatch (*matches)[2],
                          CriterionResult *loss) {
  CriterionConfig cc = detr_criterion_config(&m->cfg);
  const DetrMatch *fixed[DETR_MAX_LAYERS];
  for (int k = 0; k < out->n_layers; k++) fixed[k] = matches[k];
  char err[256];
  ck_assert_msg(criterion_forward(&cc, out->layers[out->n_layers - 1], out->layers, out->n_layers - 1, targets, 3.0f,
                                  fixed, loss, err, sizeof err) == 0,
                "criterion: %s", err);
  autograd_backward(loss->total);
}

static void compare_model_step(const char *attn, const char *decoder, int64_t H, int64_t W) {
  ModelPair mp;
  model_pair_make(&mp, attn, decoder, H, W);
  ScopeMark mark = tensor_scope_mark();
  DetrOutput out, gout;
  DetrMatch cm[DETR_MAX_LAYERS][2], gm[DETR_MAX_LAYERS][2];
  CriterionResult loss, gloss;
  // The tape is global: each device's forward and backward run in turn.
  model_forward(mp.cpu, mp.images_cpu, mp.mask, &out);
  match_all(mp.cpu, &out, mp.targets, cm);
  loss_backward(mp.cpu, &out, mp.targets, cm, &loss);
  model_forward(mp.gpu, mp.images_gpu, mp.mask, &gout);
  match_all(mp.gpu, &gout, mp.targets, gm);
  loss_backward(mp.gpu, &gout, mp.targets, cm, &gloss);  // the CPU's matches (see above)

  char what[256], model[64];
  snprintf(model, sizeof model, "%s (%s encoder attention)", decoder ? decoder : "DETR", attn);
  ck_assert_int_eq(gout.n_layers, out.n_layers);
  for (int l = 0; l < out.n_layers; l++) {
    snprintf(what, sizeof what, "%s decoder output %d logits", model, l);
    expect_tensor_close_tol(what, gout.layers[l].logits, out.layers[l].logits, MODEL_TOL);
    snprintf(what, sizeof what, "%s decoder output %d boxes", model, l);
    expect_tensor_close_tol(what, gout.layers[l].boxes, out.layers[l].boxes, MODEL_TOL);
  }
  for (int k = 0; k < out.n_layers; k++)
    for (int b = 0; b < 2; b++) {
      ck_assert_int_eq(gm[k][b].n, cm[k][b].n);
      for (int64_t j = 0; j < cm[k][b].n; j++)
        ck_assert_msg(gm[k][b].query[j] == cm[k][b].query[j] && gm[k][b].target[j] == cm[k][b].target[j],
                      "%s: the GPU's matching of output %d, image %d differs from the CPU's", model, k, b);
    }
  ck_assert_int_eq(gout.n_attn, out.n_attn);
  for (int l = 0; l < out.n_attn; l++) {  // what the variant reports (ENACT: entropy and regions)
    const AttnTrace *c = &out.attn[l], *g = &gout.attn[l];
    ck_assert_int_eq(g->n_exports, c->n_exports);
    for (int e = 0; e < c->n_exports; e++) {
      snprintf(what, sizeof what, "%s encoder layer %d %s", model, l, c->exports[e].name);
      if (c->exports[e].f32) {
        expect_tensor_close_tol(what, g->exports[e].f32, c->exports[e].f32, MODEL_TOL);
        continue;
      }
      ck_assert_msg(g->exports[e].n == c->exports[e].n, "%s: %lld values on the GPU, %lld on the CPU", what,
                    (long long)g->exports[e].n, (long long)c->exports[e].n);
      for (int64_t j = 0; j < c->exports[e].n; j++)
        ck_assert_msg(g->exports[e].i64[j] == c->exports[e].i64[j], "%s: value %lld differs", what, (long long)j);
    }
  }
  ck_assert_int_eq(gloss.n_terms, loss.n_terms);
  for (int i = 0; i < loss.n_terms; i++) {
    snprintf(what, sizeof what, "%s %s", model, loss.terms[i].name);
    expect_scalar_close(what, tensor_item(gloss.terms[i].value), tensor_item(loss.terms[i].value), MODEL_TOL);
  }
  snprintf(what, sizeof what, "%s total loss", model);
  expect_scalar_close(what, tensor_item(gloss.total), tensor_item(loss.total), MODEL_TOL);
  int checked = 0;
  for (int i = 0; i < mp.cpu->params.count; i++) {
    const Param *p = &mp.cpu->params.items[i], *q = &mp.gpu->params.items[i];
    ck_assert_msg((p->tensor->grad == NULL) == (q->tensor->grad == NULL), "%s: %s has a gradient on one device only",
                  model, p->name);
    if (!p->tensor->grad) continue;
    snprintf(what, sizeof what, "%s gradient of %s", model, p->name);
    expect_tensor_close_tol(what, q->tensor->grad, p->tensor->grad, MODEL_TOL);
    checked++;
  }
  ck_assert_int_gt(checked, 20);
  for (int k = 0; k < out.n_layers; k++) {
    detr_matches_free(cm[k], 2);
    detr_matches_free(gm[k], 2);
  }
  criterion_result_free(&loss);
  criterion_result_free(&gloss);
  detr_output_free(&out);
  detr_output_free(&gout);
  tensor_scope_release(mark);
  model_pair_free(&mp);
}

START_TEST(model_detr_step) { compare_model_step("dense", NULL, 64, 96); }
END_TEST

START_TEST(model_detr_enact_step) { compare_model_step("enact", NULL, 128, 192); }
END_TEST

// Every other encoder-attention variant: the same step on both devices.
START_TEST(model_detr_attn_variants_step) {
  for (int i = 0; i < encoder_attn_count(); i++) {
    const char *name = encoder_attn_at(i)->name;
    if (strcmp(name, "dense") && strcmp(name, "enact")) compare_model_step(name, NULL, 64, 96);
  }
}
END_TEST

// Anchor DETR (nn/decoder_anchor.c): its RCDA encoder and decoder, GroupNorm input projection,
// anchors and focal classes, on a map taller than wide and one wider than tall (both of RCDA's
// summation orders); then Anchor-DETR-ENACT (its cluster size and chunks found on the device).
START_TEST(model_anchor_step) {
  compare_model_step("dense", "anchor", 64, 96);
  compare_model_step("dense", "anchor", 128, 64);
  compare_model_step("enact_official", "anchor", 128, 192);
}
END_TEST

// AdamW steps from the model's weights, matching on the model's own device (the trainer's path):
// the loss and the gradient norm of every step; system allocations during the last step.
static void train_steps(DetrModel *m, AdamW *opt, Tensor *images, const uint8_t *mask, const DetrTarget *targets,
                        int steps, float *losses, double *norms, uint64_t *last_step_allocs) {
  Rng drop = rng_make(11);
  CriterionConfig cc = detr_criterion_config(&m->cfg);
  for (int s = 0; s < steps; s++) {
    uint64_t before = detr_alloc_stats(m->params.device).system_allocs;
    ScopeMark mark = tensor_scope_mark();
    NnCtx ctx = {.training = true, .dropout_rng = &drop};
    DetrOutput out;
    CriterionResult loss;
    char err[256];
    ck_assert_msg(detr_model_forward(m, &ctx, images, mask, &out, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(criterion_forward(&cc, out.layers[out.n_layers - 1], out.layers, out.n_layers - 1, targets, 3.0f,
                                    NULL, &loss, err, sizeof err) == 0,
                  "%s", err);
    losses[s] = tensor_item(loss.total);
    autograd_backward(loss.total);
    norms[s] = adamw_clip_step(opt, opt->cfg.clip_max_norm);  // as the trainer: gradients released
    criterion_result_free(&loss);
    detr_output_free(&out);
    tensor_scope_release(mark);
    *last_step_allocs = detr_alloc_stats(m->params.device).system_allocs - before;
  }
}

// A checkpoint written from the GPU model and optimizer holds their exact bits, and loads back
// into a CPU model and into a GPU model.
static void check_checkpoint_round_trip(ModelPair *mp, AdamW *gopt) {
  char dir[] = "/tmp/detr_gpu_ckpt_XXXXXX", path[64], err[1024];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
  TrainState st = {.step = gopt->step, .seed = 1, .dropout_rng = rng_make(11), .best_map = -1.0};
  ck_assert_msg(checkpoint_save(path, mp->gpu, gopt, &st, NULL, NULL, err, sizeof err) == 0, "%s", err);
  Device devs[2] = {DEVICE_CPU, DEVICE_CUDA};
  for (int d = 0; d < 2; d++) {
    DetrModel *m = detr_model_create(&mp->gpu->cfg, devs[d]);
    AdamW opt;
    adamw_init(&opt, &m->params, gopt->cfg);
    TrainState back;
    ck_assert_msg(checkpoint_load(path, m, &opt, &back, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(opt.step, gopt->step);
    for (int i = 0; i < m->params.count; i++) {
      char what[160];
      float *ref = download(mp->gpu->params.items[i].tensor);
      snprintf(what, sizeof what, "checkpoint (%s) %s", device_name(devs[d]), m->params.items[i].name);
      expect_tensor_bitwise(what, m->params.items[i].tensor, ref);
      free(ref);
      if (!gopt->exp_avg[i]) continue;
      ref = download(gopt->exp_avg[i]);
      snprintf(what, sizeof what, "checkpoint (%s) exp_avg of %s", device_name(devs[d]), m->params.items[i].name);
      expect_tensor_bitwise(what, opt.exp_avg[i], ref);
      free(ref);
      ref = download(gopt->exp_avg_sq[i]);
      snprintf(what, sizeof what, "checkpoint (%s) exp_avg_sq of %s", device_name(devs[d]), m->params.items[i].name);
      expect_tensor_bitwise(what, opt.exp_avg_sq[i], ref);
      free(ref);
    }
    adamw_free(&opt);
    detr_model_free(m);
  }
  ck_assert_int_eq(unlink(path), 0);
  ck_assert_int_eq(rmdir(dir), 0);
}

START_TEST(model_training_steps) {
  // Three AdamW steps (lr 1e-4, backbone 1e-5, clipping at 0.1) of the tiny DETR on each device.
  // Losses and gradient norms must agree to MODEL_TOL at every step. Parameters: AdamW moves an
  // element by about lr whatever its gradient's size, so an element whose gradient is rounding
  // noise (e.g. attention's key bias, whose exact gradient is 0) may move by +lr on one device
  // and -lr on the other: |difference| <= 2 lr x steps = 6e-4 < MODEL_TOL.
  enum { STEPS = 3 };
  ModelPair mp;
  model_pair_make(&mp, "dense", NULL, 64, 96);
  OptimConfig oc = optim_config_default();
  AdamW opt, gopt;
  adamw_init(&opt, &mp.cpu->params, oc);
  adamw_init(&gopt, &mp.gpu->params, oc);
  float losses[STEPS], glosses[STEPS];
  double norms[STEPS], gnorms[STEPS];
  uint64_t allocs, gallocs;
  train_steps(mp.cpu, &opt, mp.images_cpu, mp.mask, mp.targets, STEPS, losses, norms, &allocs);
  train_steps(mp.gpu, &gopt, mp.images_gpu, mp.mask, mp.targets, STEPS, glosses, gnorms, &gallocs);
  for (int s = 0; s < STEPS; s++) {
    char what[64];
    snprintf(what, sizeof what, "training step %d loss", s + 1);
    expect_scalar_close(what, glosses[s], losses[s], MODEL_TOL);
    snprintf(what, sizeof what, "training step %d gradient norm", s + 1);
    expect_scalar_close(what, gnorms[s], norms[s], MODEL_TOL);
  }
  for (int i = 0; i < mp.cpu->params.count; i++) {
    char what[160];
    snprintf(what, sizeof what, "%s after %d steps", mp.cpu->params.items[i].name, STEPS);
    expect_tensor_close_tol(what, mp.gpu->params.items[i].tensor, mp.cpu->params.items[i].tensor, MODEL_TOL);
  }
  // Steady state: after two steps the caching allocator serves every request (no cudaMalloc). In
  // gpu_harness "CUDA" is the CPU, whose blocks of 64 KiB and more come from its arena and count as
  // system allocations every time by design (tensor/alloc.c): nothing to check there.
  if (DEVICE_CUDA != DEVICE_CPU)
    ck_assert_msg(gallocs == 0, "step %d made %llu cudaMalloc calls", STEPS, (unsigned long long)gallocs);
  check_checkpoint_round_trip(&mp, &gopt);
  adamw_free(&opt);
  adamw_free(&gopt);
  model_pair_free(&mp);
}
END_TEST

// test_gpu [--probe]: --probe only reports the device (exit 0, 77 none, 1 unusable) and runs nothing.
int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  char why[512];
  int devices = cuda_device_probe(why, sizeof why);
  if (devices == 0) {
    printf("no CUDA device: skipping (%s)\n", why);
    return 77;
  }
  if (devices < 0) {  // CUDA is there but cannot be used: a failure, not a skip
    printf("CUDA is present but unusable: %s\n", why);
    return 1;
  }
  g_on_gpu = true;
  printf("test_gpu: %d CUDA device(s); device %d, compute capability %d\n", devices, cuda_current_device(),
         cuda_compute_capability());
  if (argc > 1 && !strcmp(argv[1], "--probe")) return 0;
  Suite *s = suite_create("gpu");
  TCase *kernels = gpu_tcase(s, "kernels");
  tcase_add_test(kernels, fill_random_accumulate);
  tcase_add_test(kernels, unary_forward_backward);
  tcase_add_test(kernels, binary_forward_backward);
  tcase_add_test(kernels, gemm_all_transposes);
  tcase_add_test(kernels, gemm_batched_all_transposes);
  tcase_add_test(kernels, row_bias_forward_backward);
  tcase_add_test(kernels, conv2d_deterministic_algorithms);
  tcase_add_test(kernels, conv2d_heuristic_algorithms);
  tcase_add_test(kernels, conv2d_workspace_limit);
  tcase_add_test(kernels, dropout_kernels_bitwise);
  tcase_add_test(kernels, tf32_switch);
  tcase_add_test(kernels, bf16_within_rounding_bound);
  TCase *autograd = gpu_tcase(s, "autograd");
  tcase_add_test(autograd, autograd_linear);
  tcase_add_test(autograd, autograd_conv2d);
  tcase_add_test(autograd, autograd_add_broadcast);
  tcase_add_test(autograd, autograd_enact_cluster);
  TCase *ops = gpu_tcase(s, "ops");  // every op, forward and backward, against the CPU
  tcase_add_test(ops, ops_elementwise);
  tcase_add_test(ops, ops_dropout);
  tcase_add_test(ops, ops_reduce);
  tcase_add_test(ops, ops_matmul);
  tcase_add_test(ops, ops_pool_and_norm);
  tcase_add_test(ops, ops_softmax_layernorm);
  tcase_add_test(ops, ops_shape);
  tcase_add_test(ops, ops_losses_and_boxes);
  tcase_add_test(ops, ops_enact_smooth);
  tcase_add_test(ops, ops_enact_regions);
  tcase_add_test(ops, ops_cluster_attention);
  tcase_add_test(ops, ops_coverage);  // after every op test
  tcase_add_test(ops, staged_uploads);
  TCase *model = gpu_tcase(s, "model");  // the tiny DETR: a step, and AdamW training
  tcase_add_test(model, model_detr_step);
  tcase_add_test(model, model_detr_enact_step);
  tcase_add_test(model, model_detr_attn_variants_step);
  tcase_add_test(model, model_anchor_step);
  tcase_add_test(model, model_training_steps);
  SRunner *sr = srunner_create(s);
  // No fork: the CUDA context created above does not survive into a forked child. (So Check's
  // own timeouts do not apply: the fixture's watchdog does.) CK_RUN_CASE=ops etc. runs one case.
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
