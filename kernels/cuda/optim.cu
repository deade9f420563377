// Optimizer kernels on CUDA, mirroring kernels/cpu/optim.c: the AdamW update (kernels/optim_math.h),
// the sum of squares of a gradient for the global clipping norm, and the clipping scale.
//
// The norm is deterministic without atomics: each gradient's squares are summed into exactly
// CUDA_SUM_SQUARES_PARTIALS doubles (block b takes the grid-stride slice b, a fixed tree inside),
// and one block then adds all partials of all gradients in a fixed tree (cuda_sum_doubles). The
// caller (train/optim.c) reads that one double back: the step's only optimizer synchronisation.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.cuh"

// p, m, v, g [n]: one element per thread iteration.
__global__ void adamw_kernel(float *p, float *m, float *v, const float *g, int64_t n, AdamWStep s) {
  GRID_STRIDE_LOOP(i, n) adamw_update(&p[i], &m[i], &v[i], g[i], s);
}

extern "C" void cuda_adamw(float *p, float *m, float *v, const float *g, int64_t n, AdamWStep s) {
  if (n <= 0) return;
  adamw_kernel<<<detr_grid_size(n, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(p, m, v, g, n, s);
  CUDA_CHECK_LAUNCH("adamw_kernel");
}

#define NORM_BLOCK 256

// x [n] -> partials [CUDA_SUM_SQUARES_PARTIALS] (gridDim.x == CUDA_SUM_SQUARES_PARTIALS); a
// block with no element writes 0.
__global__ void sum_squares_partials_kernel(const float *x, int64_t n, double *partials) {
  double acc = 0.0;
  GRID_STRIDE_LOOP(i, n) acc += sum_squares_term(x[i]);
  acc = block_sum<NORM_BLOCK>(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

extern "C" void cuda_sum_squares_partials(const float *x, int64_t n, double *partials) {
  sum_squares_partials_kernel<<<CUDA_SUM_SQUARES_PARTIALS, NORM_BLOCK, 0, detr_cuda_stream()>>>(x, n, partials);
  CUDA_CHECK_LAUNCH("sum_squares_partials_kernel");
}

// out[0] = sum of x [n]: one block.
__global__ void sum_doubles_kernel(const double *x, int64_t n, double *out) {
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += NORM_BLOCK) acc += x[i];
  acc = block_sum<NORM_BLOCK>(acc);
  if (threadIdx.x == 0) out[0] = acc;
}

extern "C" void cuda_sum_doubles(const double *x, int64_t n, double *out) {
  sum_doubles_kernel<<<1, NORM_BLOCK, 0, detr_cuda_stream()>>>(x, n, out);
  CUDA_CHECK_LAUNCH("sum_doubles_kernel");
}

// x [n] *= s.
__global__ void scale_kernel(float *x, int64_t n, float s) { GRID_STRIDE_LOOP(i, n) x[i] *= s; }

extern "C" void cuda_scale(float *x, int64_t n, float s) {
  if (n <= 0) return;
  scale_kernel<<<detr_grid_size(n, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(x, n, s);
  CUDA_CHECK_LAUNCH("scale_kernel");
}
