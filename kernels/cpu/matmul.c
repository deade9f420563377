#include <cblas.h>

#include "kernels/cpu/cpu_kernels.h"

void cpu_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
              int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // OpenBLAS would skip the beta scaling too
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              (blasint)m, (blasint)n, (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta, c,
              (blasint)ldc);
}

void cpu_gemm_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                      int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c,
                      int64_t batch) {
  for (int64_t i = 0; i < batch; i++)
    cpu_gemm(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
             c + i * stride_c, ldc);
}

void cpu_add_row_bias(float *y, const float *bias, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < cols; j++) y[r * cols + j] += bias[j];
}

void cpu_row_bias_backward(const float *dy, float *dbias, int64_t rows, int64_t cols) {
  // Column sums, rows in a fixed order: deterministic for any thread count.
#pragma omp parallel for schedule(static) if (rows * cols > 32768)
  for (int64_t j = 0; j < cols; j++) {
    double acc = 0.0;
    for (int64_t r = 0; r < rows; r++) acc += dy[r * cols + j];
    dbias[j] += (float)acc;
  }
}
