// Matrix products on cuBLAS with the row-major semantics of cpu_gemm (kernels/cpu/matmul.c), and
// the row-bias kernels of linear layers.
//
// cuBLAS is column-major. A row-major X [r, c] with leading dimension ld is, read column-major,
// X^T [c, r] with the same ld. So row-major C = op(A) op(B) is computed as the column-major
// C^T = op(B)^T op(A)^T: swap the operands (and m with n), keep each one's transpose flag.
//
// bf16 (cuda_set_bf16): A and B rounded to the nearest bf16 into copies here (kernels/bf16_math.h,
// conv.cu's rounding; the CPU's oneDNN conversion differs on denormal inputs alone), then
// cublasGemmEx / cublasGemmStridedBatchedEx on CUDA_R_16BF inputs with CUBLAS_COMPUTE_32F:
// tensor-core products, fp32 accumulation and output - what the CPU's bf16 GEMM computes
// (kernels/cpu/matmul_bf16.c). Every GEMM takes it (autocast's rule); the CPU keeps small ones in
// fp32 only because its conversion costs more than it saves.
// Why copies: CUBLAS_COMPUTE_32F_FAST_16BF on the fp32 matrices (no copies) was measured on an H100
// (2026-11-27, cuBLAS of CUDA 13.0) to compute in TF32, not bf16: test_gpu's bf16_within_rounding_bound
// found its results 1.3e-5 from the TF32-rounded sums and 0.047 from the bf16-rounded ones - cuBLAS
// documents FAST_16BF as *allowing* bf16, and took TF32 instead.
#include <limits.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.cuh"

static int to_int(int64_t v, const char *what) {
  DETR_CHECK(v >= 0 && v <= INT_MAX, "cuda_gemm: %s = %lld does not fit cuBLAS's int", what, (long long)v);
  return (int)v;
}

// The bf16 copies of A and B: one grow-only device buffer, reused by every bf16 GEMM (as the CPU's
// kernels/cpu/matmul_bf16.c keeps its copies). The copies and the GEMMs that read them are queued on
// the one stream, so a copy is overwritten only after the GEMM before it has read it; growing waits
// for the stream before freeing the old buffer. Outside the caching allocator's figures (the device's
// memory in use counts it); on out-of-memory the allocator's cache is given back first.
static uint16_t *g_bf16_copies;
static size_t g_bf16_capacity;  // elements

static uint16_t *bf16_copies(size_t n) {
  if (n > g_bf16_capacity) {
    if (g_bf16_copies) {
      CUDA_CHECK(cudaStreamSynchronize(detr_cuda_stream()));
      cuda_device_free(g_bf16_copies);
      g_bf16_copies = NULL, g_bf16_capacity = 0;
    }
    size_t capacity = n + n / 2;  // room to grow without a reallocation per new shape
    g_bf16_copies = (uint16_t *)cuda_device_malloc_reclaiming(capacity * sizeof(uint16_t));
    if (!g_bf16_copies) g_bf16_copies = (uint16_t *)cuda_device_malloc_reclaiming((capacity = n) * sizeof(uint16_t));
    DETR_CHECK(g_bf16_copies, "cuda_gemm (bf16): out of device memory for %zu bytes of bf16 copies",
               n * sizeof(uint16_t));
    g_bf16_capacity = capacity;
  }
  return g_bf16_copies;
}

// Elements from a row-major operand's first to its last: `batch` matrices `stride` apart, each
// rows x cols with leading dimension ld (rows and cols >= 1). The copy keeps the same layout.
static int64_t operand_span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t batch) {
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

// A (op(A) m x k) and B (op(B) k x n) rounded to bf16 into the copies: *a16 and *b16 (B's 128-element
// aligned after A's).
static void bf16_operands(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                          int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, int64_t batch,
                          const uint16_t **a16, const uint16_t **b16) {
  int64_t span_a = operand_span(trans_a ? k : m, trans_a ? m : k, lda, stride_a, batch);
  int64_t span_b = operand_span(trans_b ? n : k, trans_b ? k : n, ldb, stride_b, batch);
  int64_t offset_b = (span_a + 127) / 128 * 128;
  uint16_t *copies = bf16_copies((size_t)(offset_b + span_b));
  cuda_to_bf16(a, copies, span_a);
  cuda_to_bf16(b, copies + offset_b, span_b);
  *a16 = copies;
  *b16 = copies + offset_b;
}

// k == 0: op(A) op(B) is empty, C = beta C; beta == 0 writes zeros (never 0 * NaN), as cpu_gemm.
// c [m rows, ldc apart][n] in each of `batch` matrices stride_c apart.
__global__ void gemm_scale_kernel(float *c, int64_t m, int64_t n, int64_t ldc, int64_t stride_c, int64_t batch,
                                  float beta) {
  int64_t total = batch * m * n;
  GRID_STRIDE_LOOP(i, total) {
    int64_t bi = i / (m * n), r = (i / n) % m, col = i % n;
    float *p = c + bi * stride_c + r * ldc + col;
    *p = beta == 0.0f ? 0.0f : beta * *p;
  }
}

static void gemm_scale(float *c, int64_t m, int64_t n, int64_t ldc, int64_t stride_c, int64_t batch, float beta) {
  if (beta == 1.0f) return;
  int64_t total = batch * m * n;
  gemm_scale_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(c, m, n, ldc, stride_c,
                                                                                              batch, beta);
  CUDA_CHECK_LAUNCH("gemm_scale_kernel");
}

// C [m, n] (ldc) = alpha op(A) op(B) + beta C on bf16 A (lda) and B (ldb), fp32 accumulation and output:
// column-major C^T [n, m] = op(B)^T [n, k] op(A)^T [k, m] (the operands swapped, m with n).
static void gemm_ex_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a16,
                         int64_t lda, const uint16_t *b16, int64_t ldb, float beta, float *c, int64_t ldc) {
  CUBLAS_CHECK(cublasGemmEx(detr_cublas_handle(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                            trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(n, "n"), to_int(m, "m"), to_int(k, "k"), &alpha,
                            b16, CUDA_R_16BF, to_int(ldb, "ldb"), a16, CUDA_R_16BF, to_int(lda, "lda"), &beta, c,
                            CUDA_R_32F, to_int(ldc, "ldc"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

extern "C" void cuda_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                          int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    gemm_scale(c, m, n, ldc, 0, 1, beta);
    return;
  }
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  // Column-major C^T [n, m] = op(B)^T [n, k] op(A)^T [k, m].
  if (cuda_bf16_enabled()) {
    const uint16_t *a16, *b16;
    bf16_operands(trans_a, trans_b, m, n, k, a, lda, 0, b, ldb, 0, 1, &a16, &b16);
    gemm_ex_bf16(trans_a, trans_b, m, n, k, alpha, a16, lda, b16, ldb, beta, c, ldc);
    return;
  }
  CUBLAS_CHECK(cublasSgemm(detr_cublas_handle(), op_b, op_a, to_int(n, "n"), to_int(m, "m"), to_int(k, "k"), &alpha, b,
                           to_int(ldb, "ldb"), a, to_int(lda, "lda"), &beta, c, to_int(ldc, "ldc")));
}

extern "C" void cuda_gemm_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                  const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                                  int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c,
                                  int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  if (k == 0) {
    gemm_scale(c, m, n, ldc, stride_c, batch, beta);
    return;
  }
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  // Per batch entry i: C_i^T = op(B_i)^T op(A_i)^T, strides in elements (long long in cuBLAS).
  if (cuda_bf16_enabled()) {
    const uint16_t *a16, *b16;
    bf16_operands(trans_a, trans_b, m, n, k, a, lda, stride_a, b, ldb, stride_b, batch, &a16, &b16);
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        detr_cublas_handle(), op_b, op_a, to_int(n, "n"), to_int(m, "m"), to_int(k, "k"), &alpha, b16, CUDA_R_16BF,
        to_int(ldb, "ldb"), (long long)stride_b, a16, CUDA_R_16BF, to_int(lda, "lda"), (long long)stride_a, &beta, c,
        CUDA_R_32F, to_int(ldc, "ldc"), (long long)stride_c, to_int(batch, "batch"), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
    return;
  }
  CUBLAS_CHECK(cublasSgemmStridedBatched(detr_cublas_handle(), op_b, op_a, to_int(n, "n"), to_int(m, "m"),
                                         to_int(k, "k"), &alpha, b, to_int(ldb, "ldb"), (long long)stride_b, a,
                                         to_int(lda, "lda"), (long long)stride_a, &beta, c, to_int(ldc, "ldc"),
                                         (long long)stride_c, to_int(batch, "batch")));
}

// --- bf16 operands rounded once by the op (TWIN_GEMM_BF16) ---

extern "C" bool cuda_gemm_bf16_wanted(int64_t m, int64_t n, int64_t k) {
  (void)m, (void)n;
  return cuda_bf16_enabled() && k > 0;  // every GEMM, as cuda_gemm
}

extern "C" void cuda_round_bf16(const float *x, int64_t rows, int64_t cols, uint16_t *out) {
  cuda_to_bf16(x, out, rows * cols);
}

extern "C" void cuda_gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                               const uint16_t *a, const uint16_t *b, float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  DETR_CHECK(k > 0, "cuda_gemm_bf16: %lld x %lld x %lld: no sum (cuda_gemm_bf16_wanted says no)", (long long)m,
             (long long)n, (long long)k);
  gemm_ex_bf16(trans_a, trans_b, m, n, k, alpha, a, trans_a ? m : k, b, trans_b ? k : n, beta, c, ldc);  // dense copies
}

// --- row bias of linear layers ---

// y [rows, cols] += bias [cols] broadcast over rows (bias NULL: 0), then relu(y) when relu.
__global__ void add_row_bias_kernel(float *y, const float *bias, int64_t rows, int64_t cols, bool relu) {
  int64_t total = rows * cols;
  GRID_STRIDE_LOOP(i, total) {
    if (relu) y[i] = bias_relu_forward(y[i], bias ? bias[i % cols] : 0.0f);
    else y[i] += bias[i % cols];
  }
}

extern "C" void cuda_add_row_bias(float *y, const float *bias, int64_t rows, int64_t cols, bool relu) {
  if (rows <= 0 || cols <= 0) return;
  add_row_bias_kernel<<<detr_grid_size(rows * cols, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(y, bias, rows,
                                                                                                      cols, relu);
  CUDA_CHECK_LAUNCH("add_row_bias_kernel");
}

// dz [n] = relu'(y) dy keep_scale (dz may be dy itself; y the dropout's output when keep_scale != 1).
__global__ void relu_backward_from_output_kernel(const float *y, const float *dy, float keep_scale, float *dz,
                                                 int64_t n) {
  GRID_STRIDE_LOOP(i, n) dz[i] = relu_dropout_backward_from_output(y[i], dy[i], keep_scale);
}

extern "C" void cuda_relu_row_bias_backward(const float *y, const float *dy, float keep_scale, float *dz, float *dbias,
                                            int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  relu_backward_from_output_kernel<<<detr_grid_size(rows * cols, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(
      y, dy, keep_scale, dz, rows * cols);
  CUDA_CHECK_LAUNCH("relu_backward_from_output_kernel");
  if (dbias) cuda_row_bias_backward(dz, dbias, rows, cols);
}

// Column sums without atomics: a block owns BIAS_TILE_X adjacent columns; thread (tx, ty) sums
// rows ty, ty + BIAS_TILE_Y, ... of column tx (a warp reads 32 adjacent floats of one row:
// coalesced), then thread ty == 0 adds the BIAS_TILE_Y partials in order. The order depends only
// on the shape, so the result is the same on every run. Accumulation is in double, as the CPU's.
#define BIAS_TILE_X 32
#define BIAS_TILE_Y 16

// dy [rows, cols]; dbias [cols] += sum over rows.
__global__ void row_bias_backward_kernel(const float *dy, float *dbias, int64_t rows, int64_t cols) {
  __shared__ double partial[BIAS_TILE_Y][BIAS_TILE_X];
  for (int64_t col0 = (int64_t)blockIdx.x * BIAS_TILE_X; col0 < cols; col0 += (int64_t)gridDim.x * BIAS_TILE_X) {
    int64_t col = col0 + threadIdx.x;
    double acc = 0.0;
    if (col < cols)
      for (int64_t r = threadIdx.y; r < rows; r += BIAS_TILE_Y) acc += dy[r * cols + col];
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
      double sum = 0.0;
      for (int t = 0; t < BIAS_TILE_Y; t++) sum += partial[t][threadIdx.x];
      dbias[col] += (float)sum;
    }
    __syncthreads();  // partial is reused by the next column tile
  }
}

extern "C" void cuda_row_bias_backward(const float *dy, float *dbias, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  int64_t tiles = (cols + BIAS_TILE_X - 1) / BIAS_TILE_X;
  unsigned int grid = (unsigned int)(tiles < 65535 ? tiles : 65535);
  row_bias_backward_kernel<<<grid, dim3(BIAS_TILE_X, BIAS_TILE_Y), 0, detr_cuda_stream()>>>(dy, dbias, rows, cols);
  CUDA_CHECK_LAUNCH("row_bias_backward_kernel");
}
