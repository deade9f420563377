// Sums over one axis of x viewed as [outer, n, inner] (sum, mean, sum_all), mirroring
// kernels/cpu/reduce.c. Terms are summed in double and each output is rounded once
// (reduce_sum_finish, kernels/elementwise_math.h). No atomics: every summation order is fixed by
// the shape, so results are the same on every run.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.cuh"

#define REDUCE_BLOCK 256
// Below this many terms per output, or from this many outputs on, one thread sums an output alone
// (serially, in the CPU's order: the same bits as the CPU); otherwise a block shares each output.
#define REDUCE_THREAD_MAX_TERMS 64
#define REDUCE_THREAD_MIN_OUTPUTS 4096

// One thread per output (o, i) of y [outer, inner]: adjacent threads read adjacent i (coalesced
// when inner > 1).
__global__ void reduce_sum_thread_kernel(const float *x, float *y, int64_t outer, int64_t n, int64_t inner,
                                         float scale) {
  int64_t outputs = outer * inner;
  GRID_STRIDE_LOOP(e, outputs) {
    int64_t o = e / inner, i = e % inner;
    double acc = 0.0;
    for (int64_t k = 0; k < n; k++) acc += x[(o * n + k) * inner + i];
    y[e] = reduce_sum_finish(acc, scale);
  }
}

// One block per output: thread t sums terms k = t, t + REDUCE_BLOCK, ..., then a fixed tree adds
// the partials (block_sum).
__global__ void reduce_sum_block_kernel(const float *x, float *y, int64_t outer, int64_t n, int64_t inner,
                                        float scale) {
  int64_t outputs = outer * inner;
  BLOCK_STRIDE_LOOP(e, outputs) {
    int64_t o = e / inner, i = e % inner;
    double acc = 0.0;
    for (int64_t k = threadIdx.x; k < n; k += REDUCE_BLOCK) acc += x[(o * n + k) * inner + i];
    acc = block_sum<REDUCE_BLOCK>(acc);
    if (threadIdx.x == 0) y[e] = reduce_sum_finish(acc, scale);
  }
}

extern "C" void cuda_reduce_sum(const float *x, float *y, int64_t outer, int64_t n, int64_t inner, float scale) {
  int64_t outputs = outer * inner;
  if (outputs <= 0) return;
  cudaStream_t stream = detr_cuda_stream();
  if (n <= REDUCE_THREAD_MAX_TERMS || outputs >= REDUCE_THREAD_MIN_OUTPUTS) {
    reduce_sum_thread_kernel<<<detr_grid_size(outputs, DETR_BLOCK), DETR_BLOCK, 0, stream>>>(x, y, outer, n, inner,
                                                                                             scale);
    CUDA_CHECK_LAUNCH("reduce_sum_thread_kernel");
  } else {
    reduce_sum_block_kernel<<<detr_block_grid(outputs), REDUCE_BLOCK, 0, stream>>>(x, y, outer, n, inner, scale);
    CUDA_CHECK_LAUNCH("reduce_sum_block_kernel");
  }
}

// dx [outer, n, inner] += scale * dy [outer, inner] broadcast along n (one writer per element).
__global__ void reduce_sum_backward_kernel(const float *dy, float *dx, int64_t outer, int64_t n, int64_t inner,
                                           float scale) {
  int64_t total = outer * n * inner;
  GRID_STRIDE_LOOP(e, total) {
    int64_t o = e / (n * inner), i = e % inner;
    dx[e] += scale * dy[o * inner + i];
  }
}

extern "C" void cuda_reduce_sum_backward(const float *dy, float *dx, int64_t outer, int64_t n, int64_t inner,
                                         float scale) {
  int64_t total = outer * n * inner;
  if (total <= 0) return;
  reduce_sum_backward_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(dy, dx, outer, n,
                                                                                                       inner, scale);
  CUDA_CHECK_LAUNCH("reduce_sum_backward_kernel");
}
