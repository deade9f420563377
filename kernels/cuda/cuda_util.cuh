// Internal to the CUDA backend (kernels/cuda/*.cu): status checks, the process-wide stream and the
// library handles bound to it, and launch geometry. Not part of the C API (cuda_kernels.h is).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "kernels/common.h"

// Every status is checked; a failure stops the process with file:line, the call and the reason.
#define CUDA_CHECK(call)                                                                                      \
  do {                                                                                                        \
    cudaError_t err_ = (call);                                                                                \
    if (err_ != cudaSuccess) detr_fail(__FILE__, __LINE__, "%s failed: %s", #call, cudaGetErrorString(err_)); \
  } while (0)

#define CUBLAS_CHECK(call)                                                               \
  do {                                                                                   \
    cublasStatus_t st_ = (call);                                                         \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                    \
      detr_fail(__FILE__, __LINE__, "%s failed: %s", #call, cublasGetStatusString(st_)); \
  } while (0)

#define CUDNN_CHECK(call)                                                                                             \
  do {                                                                                                                \
    cudnnStatus_t st_ = (call);                                                                                       \
    if (st_ != CUDNN_STATUS_SUCCESS) detr_fail(__FILE__, __LINE__, "%s failed: %s", #call, cudnnGetErrorString(st_)); \
  } while (0)

// After every <<<...>>>: launch errors (bad configuration, no kernel image for this GPU) are only
// reported by cudaGetLastError; errors during execution surface at the next synchronising call.
#define CUDA_CHECK_LAUNCH(kernel_name)                                                                 \
  do {                                                                                                 \
    cudaError_t err_ = cudaGetLastError();                                                             \
    if (err_ != cudaSuccess)                                                                           \
      detr_fail(__FILE__, __LINE__, "launch of %s failed: %s", kernel_name, cudaGetErrorString(err_)); \
  } while (0)

// The one stream all work is queued on (created on first use), and the cuBLAS / cuDNN handles
// bound to it (created on first use). Defined in runtime.cu.
cudaStream_t detr_cuda_stream(void);
cublasHandle_t detr_cublas_handle(void);
cudnnHandle_t detr_cudnn_handle(void);
// cuda_set_tf32's setting (runtime.cu): conv.cu sets its math type from it (and from
// cuda_bf16_enabled, which overrides it).
bool detr_cuda_tf32(void);

// Threads per block of the elementwise kernels.
#define DETR_BLOCK 256

// Blocks for a grid-stride loop over n items with `block` threads per block. Capped: the loop
// covers the rest, and the cap keeps the grid inside every GPU's limits. n must be > 0.
static inline unsigned int detr_grid_size(int64_t n, int block) {
  const int64_t max_blocks = 65535;
  int64_t blocks = (n + block - 1) / block;
  return (unsigned int)(blocks < max_blocks ? blocks : max_blocks);
}

// A grid-stride loop with 64-bit indices: i visits every index in [0, n) exactly once.
#define GRID_STRIDE_LOOP(i, n) \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)blockDim.x * gridDim.x)

// Queues kernel(args...) over a GRID_STRIDE_LOOP of n > 0 items (DETR_BLOCK threads a block, on
// the stream) and checks the launch: the launch of every one-item-per-thread kernel.
#define LAUNCH_GRID_STRIDE(kernel, n, ...)                                                       \
  do {                                                                                           \
    kernel<<<detr_grid_size((n), DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(__VA_ARGS__); \
    CUDA_CHECK_LAUNCH(#kernel);                                                                  \
  } while (0)

// A grid-stride loop over blocks: block b visits items b, b + gridDim.x, ... (one item per block
// at a time, e.g. a row that the block reduces).
#define BLOCK_STRIDE_LOOP(i, n) for (int64_t i = blockIdx.x; i < (n); i += gridDim.x)

// Blocks for a BLOCK_STRIDE_LOOP over n items (at most 65535; the loop covers the rest).
static inline unsigned int detr_block_grid(int64_t n) { return (unsigned int)(n < 65535 ? (n > 0 ? n : 1) : 65535); }

// Block-wide reduction in a fixed order: every thread passes one value, a shared-memory tree
// combines them (thread t with t + k for k = BLOCK/2, ..., 1), and every thread gets the result.
// The order depends only on BLOCK, so the result is the same on every run: no atomics. BLOCK must
// equal blockDim.x (a power of two) and every thread of the block must call it (it synchronises).
template <int BLOCK, typename T, typename Op>
__device__ inline T block_reduce(T v, Op op) {
  static_assert(BLOCK >= 32 && (BLOCK & (BLOCK - 1)) == 0, "BLOCK must be a power of two >= 32");
  __shared__ T shared[BLOCK];
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int k = BLOCK / 2; k > 0; k >>= 1) {
    if ((int)threadIdx.x < k) shared[threadIdx.x] = op(shared[threadIdx.x], shared[threadIdx.x + k]);
    __syncthreads();
  }
  T result = shared[0];
  __syncthreads();  // shared is free for the block's next reduction
  return result;
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
// Max that never picks a NaN (b > a is false for NaN), as the CPU's `if (v > max) max = v`.
struct MaxOp {
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};
struct OrOp {
  __device__ int operator()(int a, int b) const { return a | b; }
};

template <int BLOCK>
__device__ inline double block_sum(double v) {
  return block_reduce<BLOCK>(v, SumOp());
}
template <int BLOCK>
__device__ inline float block_max(float v) {
  return block_reduce<BLOCK>(v, MaxOp());
}
