// GEMM on the CPU: oneDNN's sgemm where the build has oneDNN, OpenBLAS's otherwise. oneDNN picks
// its kernel by the CPU's instruction sets; Debian 12's OpenBLAS 0.3.21 by family and model, and
// runs its AVX2 kernel on AVX-512 CPUs it does not know (AMD Zen 4, Zen 5). Measured (2 threads,
// median of 41, the transformer's and the main job's shapes, bench/README.md#bench_ops): on
// an AMD family 26 (AVX-512) oneDNN 1.7-3.2x OpenBLAS (410-500 vs 220-245 GFLOP/s; 40-row
// decoder GEMMs 230-440 vs 125-140); with oneDNN held to AVX2 (DNNL_MAX_CPU_ISA=AVX2) 0.8-1.6x,
// 1.04x at the median; but for A^T B of most shapes below AVX-512 (cpu_gemm_on_openblas). Results:
// deterministic for a fixed thread count either way.
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#if DETR_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>  // dnnl_status2str
#endif

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

// C = A^T B (a weight gradient: dW = dY^T X) on OpenBLAS instead of oneDNN below AVX-512, where
// oneDNN 2.6's AVX2 sgemm with A transposed measured slower (OMP_NUM_THREADS=2, fresh buffers at
// several alignments, k 200-2048 (`bench_ops 3 --gemm-at-b`) and the convolutions' chunks of 800-7281
// rows; bench/README.md#bench_ops): C of 256+ rows and 128+ columns, 1.1-2.1x (0.96 at worst): the transformer's
// feed-forward weights (2048x256, 256x2048), the 3x3 backward-weights' [O, 9C] of 256 outputs,
// the 1x1 ones into 512-1024 outputs. Not C of 512+ by 512+ beyond 512x512, where the two are even
// (0.8-1.1x), nor C of 128 rows (0.9-1.0x on the convolutions' long chunks, though 1.1-1.9x at k up
// to 2048), nor narrower C (attention's 32-64-column heads, the stem's 64 outputs: 0.4-0.9x). The
// other transpositions stay on oneDNN (as fast or faster: 0.5-1.0x), and with AVX-512 everything
// (1.7-3.2x OpenBLAS's).
bool cpu_gemm_on_openblas(bool trans_a, bool trans_b, int64_t m, int64_t n) {
  if (!DETR_HAVE_ONEDNN) return true;
  if (!trans_a || trans_b || m < 256 || n < 128 || (m >= 512 && n >= 512 && m * n > (1 << 18))) return false;
  return !cpu_has_avx512();
}

static void openblas_sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                           int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (blasint)m,
              (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

// The fp32 GEMM: oneDNN's, or OpenBLAS's where cpu_gemm_on_openblas.
static void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                  const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // C = beta C, done here: a GEMM library may skip the beta scaling when k is 0
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
#if DETR_HAVE_ONEDNN
  if (cpu_gemm_on_openblas(trans_a, trans_b, m, n)) {
    openblas_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  DETR_CHECK(st == dnnl_success, "cpu_gemm: dnnl_sgemm(%c%c, %lld x %lld x %lld) failed: %s", trans_a ? 'T' : 'N',
             trans_b ? 'T' : 'N', (long long)m, (long long)n, (long long)k, dnnl_status2str(st));
#else
  openblas_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

void cpu_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
              const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m > 0 && n > 0 && k > 0 &&
      cpu_gemm_bf16_batched(trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1))
    return;
  sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char *cpu_gemm_library(char *name, size_t cap) {
#if DETR_HAVE_ONEDNN
  const dnnl_version_t *v = dnnl_version();
  snprintf(name, cap, "oneDNN %d.%d sgemm%s", v->major, v->minor,
           cpu_has_avx512() ? "" : " (OpenBLAS's for most A^T B)");
#else
  snprintf(name, cap, "OpenBLAS sgemm (%s)", openblas_get_corename());
#endif
  return name;
}

void cpu_gemm_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                      int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, float beta,
                      float *c, int64_t ldc, int64_t stride_c, int64_t batch) {
  // Small matrices one per thread (the GEMM library runs single-threaded inside a parallel
  // region; GEMM_BATCH_PARALLEL_MAX_FLOPS); large ones one after another, each on all threads. In
  // fp32 either way: a batch bf16 declines has matrices it would decline too (each smaller, or run
  // inside the per-thread region), so they need not be asked again.
  if (m > 0 && n > 0 && k > 0 &&
      cpu_gemm_bf16_batched(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                            stride_c, batch))
    return;
  double flops = 2.0 * (double)m * (double)n * (double)k;
  int64_t threads = omp_get_max_threads();
#define SGEMM_MATRIX(i) \
  sgemm(trans_a, trans_b, m, n, k, alpha, a + (i)*stride_a, lda, b + (i)*stride_b, ldb, beta, c + (i)*stride_c, ldc)
  if (batch >= threads && flops < GEMM_BATCH_PARALLEL_MAX_FLOPS) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < batch; i++) SGEMM_MATRIX(i);
    return;
  }
  // Not inside a parallel region, even an inactive one (an `if` clause that is false): oneDNN's
  // sgemm called there took 3-4 ms instead of 12 us for a 40x128x196 product at 2 threads, its
  // threads waiting on each other (the folded attention's 1-image batch in a served forward;
  // bench/README.md#bench_serve).
  for (int64_t i = 0; i < batch; i++) SGEMM_MATRIX(i);
#undef SGEMM_MATRIX
}

void cpu_add_row_bias(float *y, const float *bias, int64_t rows, int64_t cols, bool relu) {
#pragma omp parallel for schedule(static) if (rows * cols > PARALLEL_MIN_LIGHT)
  for (int64_t r = 0; r < rows; r++) {
    float *yr = y + r * cols;
    if (relu)
      for (int64_t j = 0; j < cols; j++) yr[j] = bias_relu_forward(yr[j], bias ? bias[j] : 0.0f);
    else
      for (int64_t j = 0; j < cols; j++) yr[j] += bias[j];
  }
}

// dbias[j] += sum_r dz[r, j], dz = dy or (relu_y given) relu'(relu_y) dy keep_scale, also written to dz_out;
// dbias NULL: only dz_out. Column sums in double, rows in a fixed order: deterministic for any
// thread count. A thread takes a block of columns and walks the rows, reading each row's block
// contiguously (a column at a time strode over the rows: 2.5% of the main job's step in `perf`).
static void row_bias_blocks(const float *dy, const float *relu_y, float keep_scale, float *dz_out, float *dbias,
                            int64_t rows, int64_t cols) {
  enum { BLOCK = 64 };
  int64_t blocks = (cols + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) if (blocks > 1 && rows * cols > PARALLEL_MIN_LIGHT)
  for (int64_t b = 0; b < blocks; b++) {
    int64_t j0 = b * BLOCK, width = cols - j0 < BLOCK ? cols - j0 : BLOCK;
    double acc[BLOCK] = {0};
    for (int64_t r = 0; r < rows; r++) {
      const float *row = dy + r * cols + j0;
      if (relu_y) {
        const float *yr = relu_y + r * cols + j0;
        float *dzr = dz_out + r * cols + j0;
        for (int64_t j = 0; j < width; j++) dzr[j] = relu_dropout_backward_from_output(yr[j], row[j], keep_scale);
        row = dzr;
      }
      if (dbias)
        for (int64_t j = 0; j < width; j++) acc[j] += row[j];
    }
    if (dbias)
      for (int64_t j = 0; j < width; j++) dbias[j0 + j] += (float)acc[j];
  }
}

void cpu_row_bias_backward(const float *dy, float *dbias, int64_t rows, int64_t cols) {
  row_bias_blocks(dy, NULL, 1.0f, NULL, dbias, rows, cols);
}

void cpu_relu_row_bias_backward(const float *y, const float *dy, float keep_scale, float *dz, float *dbias,
                                int64_t rows, int64_t cols) {
  row_bias_blocks(dy, y, keep_scale, dz, dbias, rows, cols);
}
