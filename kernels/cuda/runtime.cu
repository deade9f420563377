// CUDA runtime wrappers: device query, device memory, copies, and the one stream (plus the cuBLAS
// and cuDNN handles bound to it) that every kernel of the backend is queued on. With a single
// stream, the order of launches is the order of execution, so a block freed to the caching
// allocator (tensor/alloc.c) can be handed out again at once: later work is queued behind earlier.
#include <cuda_profiler_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda_status.h"

static_assert(DETR_CUDA_ERROR_INITIALIZATION == cudaErrorInitializationError, "kernels/cuda_status.h");
static_assert(DETR_CUDA_ERROR_INSUFFICIENT_DRIVER == cudaErrorInsufficientDriver, "kernels/cuda_status.h");
static_assert(DETR_CUDA_ERROR_DEVICES_UNAVAILABLE == cudaErrorDevicesUnavailable, "kernels/cuda_status.h");
static_assert(DETR_CUDA_ERROR_NO_DEVICE == cudaErrorNoDevice, "kernels/cuda_status.h");
static_assert(DETR_CUDA_ERROR_SYSTEM_NOT_READY == cudaErrorSystemNotReady, "kernels/cuda_status.h");
static_assert(DETR_CUDA_ERROR_SYSTEM_DRIVER_MISMATCH == cudaErrorSystemDriverMismatch, "kernels/cuda_status.h");
static_assert(DETR_CUDA_ERROR_COMPAT_NOT_SUPPORTED == cudaErrorCompatNotSupportedOnDevice, "kernels/cuda_status.h");

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

// TF32 tensor-core math for cuBLAS and cuDNN (cuda_set_tf32): off unless asked for; the bound
// runtime's (core/runtime.h), read per call. A thread without one (none runs ops) computes in fp32.
bool detr_cuda_tf32(void) {
  const Runtime *rt = runtime_bound();
  return rt && rt->tf32;
}

// CUBLAS_DEFAULT_MATH keeps sgemm in plain fp32 (FMA) arithmetic, so results match the CPU's
// sgemm to fp32 rounding; CUBLAS_TF32_TENSOR_OP_MATH (the tf32 option) rounds the inputs to TF32
// (10-bit mantissa) on the tensor cores of sm_80+, as torch.backends.cuda.matmul.allow_tf32.
// BF16x9 emulation (CUBLAS_FP32_EMULATED_BF16X9_MATH) is never set. Set explicitly rather than
// relying on the handle's initial mode. (PEDANTIC would also forbid reduced-precision split-K
// reductions, which fp32 sgemm does not use, at a speed cost.) cuBLAS is bitwise reproducible run
// to run on one stream and one GPU model, in either mode.
// The handle is the process's (as the stream is); its math mode follows the runtime of the call
// that asks for it, set only when it changes.
cublasHandle_t detr_cublas_handle(void) {
  static cublasHandle_t handle = [] {
    cublasHandle_t h;
    CUBLAS_CHECK(cublasCreate(&h));
    CUBLAS_CHECK(cublasSetStream(h, detr_cuda_stream()));
    CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));
    return h;
  }();
  static bool handle_tf32 = false;  // the handle's math mode: part of the handle
  bool tf32 = detr_cuda_tf32();
  if (tf32 != handle_tf32) {
    CUBLAS_CHECK(cublasSetMathMode(handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    handle_tf32 = tf32;
  }
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

int cuda_device_probe(char *why, size_t cap) {
  // Asked once: cudaGetDeviceCount initialises the runtime, and its answer does not change.
  struct Probe {
    int status, count, driver, runtime;
  };
  static Probe p = [] {
    Probe r = {0, 0, 0, 0};
    cudaError_t err = cudaGetDeviceCount(&r.count);
    r.status = (int)err;
    if (err != cudaSuccess) r.count = 0;  // not written on failure
    // Both version queries work without a driver (the driver's is then 0).
    if (cudaDriverGetVersion(&r.driver) != cudaSuccess) r.driver = 0;
    if (cudaRuntimeGetVersion(&r.runtime) != cudaSuccess) r.runtime = CUDART_VERSION;
    (void)cudaGetLastError();  // clear the status: the caller decides, no later check trips over it
    return r;
  }();
  cudaError_t e = (cudaError_t)p.status;
  return cuda_probe_explain(p.status, p.count, p.driver, p.runtime, cudaGetErrorName(e), cudaGetErrorString(e),
                            getenv("CUDA_VISIBLE_DEVICES"), why, cap);
}

int cuda_device_count(void) {
  char why[512];
  int n = cuda_device_probe(why, sizeof why);
  if (n < 0) detr_fail(__FILE__, __LINE__, "CUDA: %s", why);
  return n;
}

void cuda_set_device(int index) {
  int n = cuda_device_count();
  DETR_CHECK(index >= 0 && index < n, "cuda_set_device(%d): %d CUDA device(s)", index, n);
  CUDA_CHECK(cudaSetDevice(index));
}

int cuda_current_device(void) {
  int d = 0;
  CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

int cuda_compute_capability(void) {
  // Two attributes, not cudaGetDeviceProperties (which fills the whole struct): bf16 asks this on
  // every forward (device_set_bf16 -> cuda_bf16_supported).
  int device = cuda_current_device(), major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return 10 * major + minor;
}

void cuda_device_name(char *name, size_t cap) {
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, cuda_current_device()));
  snprintf(name, cap, "%s", prop.name);
}

void cuda_device_memory(size_t *used, size_t *total) {
  size_t free_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, total));
  *used = *total - free_bytes;
}

void cuda_profiler_capture(bool on) { CUDA_CHECK(on ? cudaProfilerStart() : cudaProfilerStop()); }

bool cuda_tf32_enabled(void) { return detr_cuda_tf32(); }

// bf16 mixed precision (cuda_set_bf16): the bound runtime's, read per call by matmul.cu and conv.cu.

bool cuda_bf16_supported(char *why, size_t cap) {
  char probe[512];
  int n = cuda_device_probe(probe, sizeof probe);
  if (n <= 0) {
    snprintf(why, cap, "no usable CUDA device (%.400s)", probe);
    return false;
  }
  int cc = cuda_compute_capability();
  if (cc < 80) {  // bf16 tensor cores arrived with Ampere; cuDNN's bf16 convolutions need them
    snprintf(why, cap, "this GPU (compute capability %d.%d) has no bf16 tensor cores (sm_80 or newer: A100, H100)",
             cc / 10, cc % 10);
    return false;
  }
  return true;
}

void cuda_set_bf16(bool on) {
  if (on) {
    char why[512];
    DETR_CHECK(cuda_bf16_supported(why, sizeof why), "cuda_set_bf16: %s", why);
  }
  runtime_current()->bf16_cuda = on;
}

bool cuda_bf16_enabled(void) {
  const Runtime *rt = runtime_bound();
  return rt && rt->bf16_cuda;
}

// cuBLAS takes the mode with the handle at its next call (detr_cublas_handle); cuDNN reads it per
// convolution (conv.cu).
void cuda_set_tf32(bool on) { runtime_current()->tf32 = on; }

static void (*g_reclaim)(void);

void cuda_set_memory_reclaim(void (*reclaim)(void)) { g_reclaim = reclaim; }

void *cuda_device_malloc_reclaiming(size_t bytes) {
  void *ptr = cuda_device_malloc(bytes);
  if (!ptr && g_reclaim) {
    g_reclaim();
    ptr = cuda_device_malloc(bytes);
  }
  return ptr;
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
    detr_fail(__FILE__, __LINE__, "cudaMalloc(%zu bytes) failed: %s", bytes, cudaGetErrorString(err));
  return ptr;
}

void cuda_device_free(void *ptr) {
  if (!ptr) return;
  CUDA_CHECK(cudaFree(ptr));  // synchronises the device: no queued kernel still uses ptr
}

void *cuda_host_alloc(size_t bytes) {
  void *ptr = NULL;
  cudaError_t err = cudaMallocHost(&ptr, bytes ? bytes : 1);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it, the caller decides
    return NULL;
  }
  if (err != cudaSuccess)
    detr_fail(__FILE__, __LINE__, "cudaMallocHost(%zu bytes) failed: %s", bytes, cudaGetErrorString(err));
  return ptr;
}

void cuda_host_free(void *ptr) {
  if (ptr) CUDA_CHECK(cudaFreeHost(ptr));
}

void cuda_memcpy_h2d_async(void *dst, const void *pinned_src, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, pinned_src, bytes, cudaMemcpyHostToDevice, detr_cuda_stream()));
}

}  // extern "C"

// --- pinned staging of host-to-device copies ---
//
// A copy from pageable memory makes the driver stage it through its own pinned buffer, and it may
// wait for the stream to do so. Instead every host-to-device copy is memcpy'd into one of our
// pinned blocks and queued with cudaMemcpyAsync: the call returns at once (src is free to reuse),
// and the DMA runs in stream order. An event recorded after the copy marks the block busy until
// the DMA has read it. Blocks are powers of two (at least 64 KiB), kept for reuse: after the first
// training steps no copy allocates. When the pool is full (64 blocks, or 512 MiB) and no free
// block fits, the stream is drained, which frees them all, and if none fits still, the pool
// starts over.

#define STAGING_SLOTS 64
#define STAGING_MIN_BYTES ((size_t)64 << 10)
#define STAGING_MAX_BYTES ((size_t)512 << 20)

struct StagingBlock {
  char *host;  // pinned, `bytes` long
  size_t bytes;
  cudaEvent_t done;  // recorded after the last copy out of the block
  bool queued;       // a copy was queued since the block was made (done was recorded)
};

static StagingBlock g_staging[STAGING_SLOTS];
static int g_staging_count = 0;
static size_t g_staging_bytes = 0;  // sum of the blocks' sizes
static pthread_mutex_t g_staging_lock = PTHREAD_MUTEX_INITIALIZER;

static bool staging_free(StagingBlock *b) {
  if (!b->queued) return true;
  cudaError_t err = cudaEventQuery(b->done);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: the copy is still in flight
    return false;
  }
  CUDA_CHECK(err);
  return true;
}

// The smallest free block of at least `bytes`, or -1.
static int staging_find(size_t bytes) {
  int best = -1;
  for (int i = 0; i < g_staging_count; i++)
    if (g_staging[i].bytes >= bytes && (best < 0 || g_staging[i].bytes < g_staging[best].bytes) &&
        staging_free(&g_staging[i]))
      best = i;
  return best;
}

// A new block of `size` bytes, or -1 when pinned memory is exhausted.
static int staging_add(size_t size) {
  char *host = (char *)cuda_host_alloc(size);
  if (!host) return -1;
  StagingBlock *b = &g_staging[g_staging_count];
  CUDA_CHECK(cudaEventCreateWithFlags(&b->done, cudaEventDisableTiming));
  b->host = host;
  b->bytes = size;
  b->queued = false;
  g_staging_bytes += size;
  return g_staging_count++;
}

// Frees every block; the caller has drained the stream, so none is in use.
static void staging_release_all(void) {
  for (int i = 0; i < g_staging_count; i++) {
    CUDA_CHECK(cudaFreeHost(g_staging[i].host));
    CUDA_CHECK(cudaEventDestroy(g_staging[i].done));
  }
  g_staging_count = 0;
  g_staging_bytes = 0;
}

// A free block of at least `bytes`, or -1 when no pinned memory can be had (then the caller
// copies from pageable memory).
static int staging_block(size_t bytes) {
  int i = staging_find(bytes);
  if (i >= 0) return i;
  size_t size = STAGING_MIN_BYTES;
  while (size < bytes) size *= 2;
  if (g_staging_count == STAGING_SLOTS || g_staging_bytes + size > STAGING_MAX_BYTES) {
    CUDA_CHECK(cudaStreamSynchronize(detr_cuda_stream()));  // every queued copy completes
    i = staging_find(bytes);
    if (i >= 0) return i;
    staging_release_all();
  }
  return staging_add(size);
}

extern "C" {

void cuda_memcpy_h2d(void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return;
  cudaStream_t stream = detr_cuda_stream();
  pthread_mutex_lock(&g_staging_lock);
  int i = staging_block(bytes);
  if (i >= 0) {
    StagingBlock *b = &g_staging[i];
    memcpy(b->host, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, b->host, bytes, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaEventRecord(b->done, stream));  // the block is busy until the copy has run
    b->queued = true;
    pthread_mutex_unlock(&g_staging_lock);
    return;
  }
  pthread_mutex_unlock(&g_staging_lock);
  // No pinned memory left: the driver stages the pageable copy itself (src is free on return).
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
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
