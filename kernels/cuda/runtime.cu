// CUDA runtime wrappers: device query, device memory, copies, and the one stream (plus the cuBLAS
// and cuDNN handles bound to it) that every kernel of the backend is queued on. With a single
// stream, the order of launches is the order of execution, so a block freed to the caching
// allocator (tensor/alloc.c) can be handed out again at once: later work is queued behind earlier.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.cuh"

// Function-local statics: created on first use, and C++ guarantees a thread-safe one-time init.

cudaStream_t detr_cuda_stream(void) {
  static cudaStream_t stream = [] {
    cudaStream_t s;
    // A blocking stream (not cudaStreamNonBlocking): it also orders against the legacy default
    // stream, in case a library or a debugging tool queues work there.
    CUDA_CHECK(cudaStreamCreate(&s));
    return s;
  }();
  return stream;
}

cublasHandle_t detr_cublas_handle(void) {
  static cublasHandle_t handle = [] {
    cublasHandle_t h;
    CUBLAS_CHECK(cublasCreate(&h));
    CUBLAS_CHECK(cublasSetStream(h, detr_cuda_stream()));
    // CUBLAS_DEFAULT_MATH keeps sgemm in plain fp32 (FMA) arithmetic: TF32 tensor cores
    // (CUBLAS_TF32_TENSOR_OP_MATH) and BF16x9 emulation (CUBLAS_FP32_EMULATED_BF16X9_MATH) are
    // opt-in modes that we do not set, so results match the CPU's sgemm to fp32 rounding.
    // Set explicitly rather than relying on the handle's initial mode. (PEDANTIC would also
    // forbid reduced-precision split-K reductions, which fp32 sgemm does not use, at a speed
    // cost.) cuBLAS is bitwise reproducible run to run on one stream and one GPU model.
    CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    return h;
  }();
  return handle;
}

cudnnHandle_t detr_cudnn_handle(void) {
  static cudnnHandle_t handle = [] {
    cudnnHandle_t h;
    CUDNN_CHECK(cudnnCreate(&h));
    CUDNN_CHECK(cudnnSetStream(h, detr_cuda_stream()));
    return h;
  }();
  return handle;
}

extern "C" {

int cuda_device_count(void) {
  // Without a driver or a GPU this reports an error (cudaErrorNoDevice, ...InsufficientDriver):
  // that means "no CUDA here", not a failure. Clear it so that no later check trips over it.
  static int count = [] {
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    return n;
  }();
  return count;
}

void *cuda_device_malloc(size_t bytes) {
  if (bytes == 0) bytes = 1;  // a NULL return means out-of-memory, so always allocate something
  void *ptr = NULL;
  cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err == cudaErrorMemoryAllocation) {
    // Not sticky, but still recorded as the last error: clear it so that the next launch check
    // does not report it. The caller (the caching allocator) empties its cache and retries.
    (void)cudaGetLastError();
    return NULL;
  }
  if (err != cudaSuccess)
    detr_fail(__FILE__, __LINE__, "cudaMalloc(%zu bytes) failed: %s", bytes,
              cudaGetErrorString(err));
  return ptr;
}

void cuda_device_free(void *ptr) {
  if (!ptr) return;
  CUDA_CHECK(cudaFree(ptr));  // synchronises the device: no queued kernel still uses ptr
}

void cuda_memcpy_h2d(void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return;
  // From pageable host memory this returns once src has been staged, so the caller may reuse
  // src at once; the copy is ordered with the kernels on the stream.
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, detr_cuda_stream()));
}

void cuda_memcpy_d2h(void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return;
  cudaStream_t stream = detr_cuda_stream();
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));  // dst is valid when we return
}

void cuda_memcpy_d2d(void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, detr_cuda_stream()));
}

void cuda_synchronize(void) { CUDA_CHECK(cudaStreamSynchronize(detr_cuda_stream())); }

}  // extern "C"
