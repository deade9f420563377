// 2-D convolution on cuDNN (v9, legacy convolution API), and the custom max-pooling and frozen
// batch-norm kernels (kernels/cpu/conv.c's twins). Convolution: NCHW float32, cross-correlation (as
// torch), one group. Forward = cudnnConvolutionForward + a bias kernel; backward =
// cudnnConvolutionBackwardData / BackwardFilter with beta = 1 (gradients accumulate, as the CPU
// kernels) and a deterministic bias-gradient kernel.
//
// Arithmetic: the convolution descriptor's math type is CUDNN_FMA_MATH. CUDNN_DEFAULT_MATH would
// let cuDNN run fp32 convolutions on TF32 tensor cores on sm_80+ (10-bit mantissa inputs); FMA
// math restricts it to fp32 FMA kernels, so results agree with the CPU's im2col + sgemm.
//
// Algorithms: with DETR_CUDNN_DETERMINISTIC unset or anything but "0" (the default), the
// deterministic IMPLICIT_PRECOMP_GEMM / BWD_DATA_ALGO_1 / BWD_FILTER_ALGO_1 are used (bitwise
// identical results run to run); should one not support a geometry, the first deterministic
// algorithm of cuDNN's heuristics is taken instead. With DETR_CUDNN_DETERMINISTIC=0 the
// heuristics' first usable choice is taken (possibly faster, possibly with atomics). Choices are
// cached per geometry.
//
// Not thread-safe (like the rest of the backend: one stream, driven from one host thread).
#include <float.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/norm_math.h"

static int conv_int(int64_t v, const char *what) {
  DETR_CHECK(v >= 0 && v <= INT_MAX, "conv2d (cuDNN): %s = %lld does not fit an int", what,
             (long long)v);
  return (int)v;
}

static bool cudnn_deterministic(void) {
  const char *v = getenv("DETR_CUDNN_DETERMINISTIC");
  return !(v && v[0] == '0' && v[1] == '\0');
}

// --- descriptors: created per call from the geometry, destroyed on scope exit ---

struct ConvDescs {
  cudnnTensorDescriptor_t x, y;  // x [B, C, H, W], y [B, O, HO, WO]
  cudnnFilterDescriptor_t w;     // w [O, C, KH, KW]
  cudnnConvolutionDescriptor_t conv;

  explicit ConvDescs(const ConvGeom *g) {
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    int B = conv_int(g->batch, "batch"), C = conv_int(g->in_ch, "in_ch");
    int O = conv_int(g->out_ch, "out_ch");
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, C,
                                           conv_int(g->in_h, "in_h"), conv_int(g->in_w, "in_w")));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, B, O,
                                           conv_int(g->out_h, "out_h"),
                                           conv_int(g->out_w, "out_w")));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, O, C,
                                           conv_int(g->kh, "kh"), conv_int(g->kw, "kw")));
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, g->pad_h, g->pad_w, g->stride_h, g->stride_w,
                                                g->dil_h, g->dil_w, CUDNN_CROSS_CORRELATION,
                                                CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH));
    // The geometry's output size (torch's formula) must be the one cuDNN computes.
    int on, oc, oh, ow;
    CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv, x, w, &on, &oc, &oh, &ow));
    DETR_CHECK(on == B && oc == O && oh == g->out_h && ow == g->out_w,
               "conv2d (cuDNN): output [%d, %d, %d, %d] differs from the geometry's "
               "[%lld, %lld, %lld, %lld]",
               on, oc, oh, ow, (long long)g->batch, (long long)g->out_ch, (long long)g->out_h,
               (long long)g->out_w);
  }
  ~ConvDescs() {
    CUDNN_CHECK(cudnnDestroyConvolutionDescriptor(conv));
    CUDNN_CHECK(cudnnDestroyFilterDescriptor(w));
    CUDNN_CHECK(cudnnDestroyTensorDescriptor(y));
    CUDNN_CHECK(cudnnDestroyTensorDescriptor(x));
  }
  ConvDescs(const ConvDescs &) = delete;
  ConvDescs &operator=(const ConvDescs &) = delete;
};

// --- workspace: one device buffer, grown on demand and reused by every call ---
// Kept here, not in the caching allocator, so that kernels/ does not call up into tensor/.
// Work on the single stream is ordered, so reusing the buffer across calls is safe.

static void *g_workspace = NULL;
static size_t g_workspace_bytes = 0;

static void *conv_workspace(size_t bytes) {
  if (bytes <= g_workspace_bytes) return g_workspace;
  if (g_workspace) CUDA_CHECK(cudaFree(g_workspace));  // synchronises: no queued use remains
  g_workspace = NULL;
  g_workspace_bytes = 0;
  cudaError_t err = cudaMalloc(&g_workspace, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    detr_fail(__FILE__, __LINE__, "conv2d (cuDNN): cannot allocate a %zu-byte workspace: %s", bytes,
              cudaGetErrorString(err));
  }
  g_workspace_bytes = bytes;
  return g_workspace;
}

// --- algorithm choice, cached per (geometry, determinism) ---

#define ALGO_UNSET (-1)

struct AlgoCacheEntry {
  ConvGeom g;
  bool deterministic;
  int fwd, bwd_data, bwd_filter;  // ALGO_UNSET until first chosen
};

#define ALGO_CACHE_SIZE 256
static AlgoCacheEntry g_algo_cache[ALGO_CACHE_SIZE];
static int g_algo_cache_count = 0, g_algo_cache_next = 0;

static bool geom_equal(const ConvGeom *a, const ConvGeom *b) {
  return a->batch == b->batch && a->in_ch == b->in_ch && a->in_h == b->in_h && a->in_w == b->in_w &&
         a->out_ch == b->out_ch && a->kh == b->kh && a->kw == b->kw && a->out_h == b->out_h &&
         a->out_w == b->out_w && a->stride_h == b->stride_h && a->stride_w == b->stride_w &&
         a->pad_h == b->pad_h && a->pad_w == b->pad_w && a->dil_h == b->dil_h &&
         a->dil_w == b->dil_w;
}

static AlgoCacheEntry *algo_cache_entry(const ConvGeom *g, bool deterministic) {
  for (int i = 0; i < g_algo_cache_count; i++)
    if (g_algo_cache[i].deterministic == deterministic && geom_equal(&g_algo_cache[i].g, g))
      return &g_algo_cache[i];
  // Not cached: take a free slot, or replace the oldest once full (the choice is recomputable).
  int slot = g_algo_cache_count < ALGO_CACHE_SIZE ? g_algo_cache_count++ : g_algo_cache_next;
  g_algo_cache_next = (slot + 1) % ALGO_CACHE_SIZE;
  AlgoCacheEntry *e = &g_algo_cache[slot];
  e->g = *g;
  e->deterministic = deterministic;
  e->fwd = e->bwd_data = e->bwd_filter = ALGO_UNSET;
  return e;
}

// Each chooser: the preferred deterministic algorithm when it supports this geometry (its
// workspace query succeeds), else the first heuristic result that ran fine (and is deterministic
// when required) and whose workspace query succeeds.

static cudnnConvolutionFwdAlgo_t choose_fwd(const ConvDescs &d, bool deterministic) {
  cudnnHandle_t h = detr_cudnn_handle();
  size_t bytes;
  if (deterministic) {
    cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
    if (cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, algo, &bytes) ==
        CUDNN_STATUS_SUCCESS)
      return algo;
  }
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int returned = 0;
  CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(
      h, d.x, d.w, d.conv, d.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf));
  for (int i = 0; i < returned; i++) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (deterministic && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
    if (cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, perf[i].algo, &bytes) ==
        CUDNN_STATUS_SUCCESS)
      return perf[i].algo;
  }
  DETR_FAIL("conv2d (cuDNN): no %sforward algorithm supports this geometry",
            deterministic ? "deterministic " : "");
}

static cudnnConvolutionBwdDataAlgo_t choose_bwd_data(const ConvDescs &d, bool deterministic) {
  cudnnHandle_t h = detr_cudnn_handle();
  size_t bytes;
  if (deterministic) {
    cudnnConvolutionBwdDataAlgo_t algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    if (cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, algo, &bytes) ==
        CUDNN_STATUS_SUCCESS)
      return algo;
  }
  cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  int returned = 0;
  CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
      h, d.w, d.y, d.conv, d.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf));
  for (int i = 0; i < returned; i++) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (deterministic && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
    if (cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, perf[i].algo,
                                                     &bytes) == CUDNN_STATUS_SUCCESS)
      return perf[i].algo;
  }
  DETR_FAIL("conv2d (cuDNN): no %sbackward-data algorithm supports this geometry",
            deterministic ? "deterministic " : "");
}

static cudnnConvolutionBwdFilterAlgo_t choose_bwd_filter(const ConvDescs &d, bool deterministic) {
  cudnnHandle_t h = detr_cudnn_handle();
  size_t bytes;
  if (deterministic) {
    cudnnConvolutionBwdFilterAlgo_t algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
    if (cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, algo, &bytes) ==
        CUDNN_STATUS_SUCCESS)
      return algo;
  }
  cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
  int returned = 0;
  CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
      h, d.x, d.y, d.conv, d.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, perf));
  for (int i = 0; i < returned; i++) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (deterministic && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
    if (cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, perf[i].algo,
                                                       &bytes) == CUDNN_STATUS_SUCCESS)
      return perf[i].algo;
  }
  DETR_FAIL("conv2d (cuDNN): no %sbackward-filter algorithm supports this geometry",
            deterministic ? "deterministic " : "");
}

// --- bias ---

// y [B, O, S] += bias [O], S = HO * WO.
__global__ void conv_bias_forward_kernel(float *y, const float *bias, int64_t total, int64_t out_ch,
                                         int64_t spatial) {
  GRID_STRIDE_LOOP(i, total) y[i] += bias[(i / spatial) % out_ch];
}

// dbias [O] += sum over b, s of dy [B, O, S]. One block per channel (grid-stride over channels);
// thread t sums the flattened (b, s) positions t, t + DETR_BLOCK, ... (adjacent threads read
// adjacent floats of a plane), then a fixed tree adds the partials: no atomics, the same result
// on every run. Double accumulation, as the CPU's.
__global__ void conv_bias_backward_kernel(const float *dy, float *dbias, int64_t batch,
                                          int64_t out_ch, int64_t spatial) {
  __shared__ double partial[DETR_BLOCK];  // blockDim.x == DETR_BLOCK, a power of two
  int64_t per_channel = batch * spatial;
  for (int64_t o = blockIdx.x; o < out_ch; o += gridDim.x) {
    double acc = 0.0;
    for (int64_t t = threadIdx.x; t < per_channel; t += DETR_BLOCK) {
      int64_t b = t / spatial, s = t % spatial;
      acc += dy[(b * out_ch + o) * spatial + s];
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int step = DETR_BLOCK / 2; step > 0; step >>= 1) {
      if ((int)threadIdx.x < step) partial[threadIdx.x] += partial[threadIdx.x + step];
      __syncthreads();
    }
    if (threadIdx.x == 0) dbias[o] += (float)partial[0];
    __syncthreads();  // partial[0] is read before the next channel overwrites it
  }
}

static int64_t conv_output_numel(const ConvGeom *g) {
  return g->batch * g->out_ch * g->out_h * g->out_w;
}

extern "C" void cuda_conv2d_forward(const float *x, const float *w, const float *bias, float *y,
                                    const ConvGeom *g) {
  int64_t total = conv_output_numel(g);
  if (total == 0) return;
  if (g->in_ch == 0) {  // an empty sum (cuDNN rejects C = 0): zeros, then the bias, as the CPU
    CUDA_CHECK(cudaMemsetAsync(y, 0, (size_t)total * sizeof(float), detr_cuda_stream()));
  } else {
    ConvDescs d(g);
    bool det = cudnn_deterministic();
    AlgoCacheEntry *e = algo_cache_entry(g, det);
    if (e->fwd == ALGO_UNSET) e->fwd = (int)choose_fwd(d, det);
    cudnnConvolutionFwdAlgo_t algo = (cudnnConvolutionFwdAlgo_t)e->fwd;
    cudnnHandle_t h = detr_cudnn_handle();
    size_t bytes = 0;
    CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, algo, &bytes));
    void *ws = bytes ? conv_workspace(bytes) : NULL;
    const float one = 1.0f, zero = 0.0f;  // beta = 0: y is overwritten
    CUDNN_CHECK(
        cudnnConvolutionForward(h, &one, d.x, x, d.w, w, d.conv, algo, ws, bytes, &zero, d.y, y));
  }
  if (bias) {
    int64_t spatial = g->out_h * g->out_w;
    conv_bias_forward_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0,
                               detr_cuda_stream()>>>(y, bias, total, g->out_ch, spatial);
    CUDA_CHECK_LAUNCH("conv_bias_forward_kernel");
  }
}

// dx [B, C, H, W] += conv^T(dy), dw [O, C, KH, KW] += dy (*) x; either may be NULL.
static void conv_backward_cudnn(const float *x, const float *w, const float *dy, float *dx,
                                float *dw, const ConvGeom *g) {
  ConvDescs d(g);
  bool det = cudnn_deterministic();
  AlgoCacheEntry *e = algo_cache_entry(g, det);
  cudnnHandle_t h = detr_cudnn_handle();
  const float one = 1.0f;  // alpha = 1, beta = 1: gradients accumulate into dx, dw
  if (dx) {
    if (e->bwd_data == ALGO_UNSET) e->bwd_data = (int)choose_bwd_data(d, det);
    cudnnConvolutionBwdDataAlgo_t algo = (cudnnConvolutionBwdDataAlgo_t)e->bwd_data;
    size_t bytes = 0;
    CUDNN_CHECK(
        cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, algo, &bytes));
    void *ws = bytes ? conv_workspace(bytes) : NULL;
    CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, d.w, w, d.y, dy, d.conv, algo, ws, bytes,
                                             &one, d.x, dx));
  }
  if (dw) {
    if (e->bwd_filter == ALGO_UNSET) e->bwd_filter = (int)choose_bwd_filter(d, det);
    cudnnConvolutionBwdFilterAlgo_t algo = (cudnnConvolutionBwdFilterAlgo_t)e->bwd_filter;
    size_t bytes = 0;
    CUDNN_CHECK(
        cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, algo, &bytes));
    void *ws = bytes ? conv_workspace(bytes) : NULL;
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, &one, d.x, x, d.y, dy, d.conv, algo, ws, bytes,
                                               &one, d.w, dw));
  }
}

extern "C" void cuda_conv2d_backward(const float *x, const float *w, const float *dy, float *dx,
                                     float *dw, float *dbias, const ConvGeom *g) {
  if (!dx && !dw && !dbias) return;
  if (conv_output_numel(g) == 0) return;  // no output: every gradient term is zero
  if (g->in_ch == 0) dx = dw = NULL;      // both are empty
  if (dx || dw) conv_backward_cudnn(x, w, dy, dx, dw, g);
  if (dbias) {
    unsigned int grid = (unsigned int)(g->out_ch < 65535 ? g->out_ch : 65535);
    conv_bias_backward_kernel<<<grid, DETR_BLOCK, 0, detr_cuda_stream()>>>(
        dy, dbias, g->batch, g->out_ch, g->out_h * g->out_w);
    CUDA_CHECK_LAUNCH("conv_bias_backward_kernel");
  }
}

// --- max pooling: -inf padding (padded taps are skipped), argmax per output kept for backward ---

// x [B*C planes, in_h, in_w] -> y, argmax [planes, out_h, out_w]; argmax is the index within the
// input plane (-1 for a window with no input pixel, which padding <= kernel / 2 rules out).
__global__ void maxpool2d_forward_kernel(const float *x, float *y, int32_t *argmax, ConvGeom g, int64_t total) {
  GRID_STRIDE_LOOP(o, total) {
    int64_t ox = o % g.out_w, oy = (o / g.out_w) % g.out_h, p = o / (g.out_w * g.out_h);
    const float *xp = x + p * g.in_h * g.in_w;
    float best = -FLT_MAX;
    int32_t best_at = -1;
    for (int64_t ky = 0; ky < g.kh; ky++) {
      int64_t iy = conv_in_coord(oy, ky, g.stride_h, g.pad_h, g.dil_h);
      if (iy < 0 || iy >= g.in_h) continue;
      for (int64_t kx = 0; kx < g.kw; kx++) {
        int64_t ix = conv_in_coord(ox, kx, g.stride_w, g.pad_w, g.dil_w);
        if (ix < 0 || ix >= g.in_w) continue;
        float v = xp[iy * g.in_w + ix];
        if (maxpool_takes(v, best, best_at)) {
          best = v;
          best_at = (int32_t)(iy * g.in_w + ix);
        }
      }
    }
    y[o] = best;
    argmax[o] = best_at;
  }
}

// Gather form of the backward, no atomics: thread i owns input pixel (p, iy, ix) and adds dy of
// every output whose argmax is i, in increasing output order - the order in which the CPU's
// scatter loop adds them, so the result is the CPU's bit for bit. dx [planes, in_h, in_w].
__global__ void maxpool2d_backward_kernel(const float *dy, const int32_t *argmax, float *dx, ConvGeom g,
                                          int64_t total) {
  GRID_STRIDE_LOOP(i, total) {
    int64_t ix = i % g.in_w, iy = (i / g.in_w) % g.in_h, p = i / (g.in_w * g.in_h);
    int64_t oy0, oy1, ox0, ox1;
    conv_out_range(iy, g.kh, g.stride_h, g.pad_h, g.dil_h, g.out_h, &oy0, &oy1);
    conv_out_range(ix, g.kw, g.stride_w, g.pad_w, g.dil_w, g.out_w, &ox0, &ox1);
    int32_t self = (int32_t)(iy * g.in_w + ix);
    float acc = dx[i];
    bool hit = false;
    for (int64_t oy = oy0; oy <= oy1; oy++)
      for (int64_t ox = ox0; ox <= ox1; ox++) {
        int64_t o = (p * g.out_h + oy) * g.out_w + ox;
        if (argmax[o] == self) {
          acc += dy[o];
          hit = true;
        }
      }
    if (hit) dx[i] = acc;
  }
}

static void check_plane_index(const ConvGeom *g, const char *what) {
  DETR_CHECK(g->in_h * g->in_w <= INT32_MAX, "%s: a %lldx%lld plane overflows the int32 argmax", what,
             (long long)g->in_h, (long long)g->in_w);
}

extern "C" void cuda_maxpool2d_forward(const float *x, float *y, int32_t *argmax, const ConvGeom *g) {
  check_plane_index(g, "cuda_maxpool2d_forward");
  int64_t total = g->batch * g->in_ch * g->out_h * g->out_w;
  if (total <= 0) return;
  maxpool2d_forward_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(
      x, y, argmax, *g, total);
  CUDA_CHECK_LAUNCH("maxpool2d_forward_kernel");
}

extern "C" void cuda_maxpool2d_backward(const float *dy, const int32_t *argmax, float *dx, const ConvGeom *g) {
  check_plane_index(g, "cuda_maxpool2d_backward");
  int64_t total = g->batch * g->in_ch * g->in_h * g->in_w;
  if (total <= 0 || g->out_h <= 0 || g->out_w <= 0) return;
  maxpool2d_backward_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(
      dy, argmax, dx, *g, total);
  CUDA_CHECK_LAUNCH("maxpool2d_backward_kernel");
}

// --- frozen batch norm: y = x * scale[c] + shift[c] (kernels/norm_math.h) ---

// scale [C] (kept for backward).
__global__ void frozen_bn_scale_kernel(const float *weight, const float *bias, const float *mean,
                                       const float *var, float eps, float *scale, int64_t channels) {
  GRID_STRIDE_LOOP(c, channels) {
    float shift;
    frozen_bn_scale_shift(weight[c], bias[c], mean[c], var[c], eps, &scale[c], &shift);
  }
}

// x, y [B, C, S]: each element recomputes its channel's scale and shift (a few flops; the kernel
// is bound by memory traffic), as the CPU recomputes them per (b, c) plane.
__global__ void frozen_bn_forward_kernel(const float *x, const float *weight, const float *bias,
                                         const float *mean, const float *var, float eps, float *y,
                                         int64_t channels, int64_t spatial, int64_t total) {
  GRID_STRIDE_LOOP(i, total) {
    int64_t c = (i / spatial) % channels;
    float s, t;
    frozen_bn_scale_shift(weight[c], bias[c], mean[c], var[c], eps, &s, &t);
    y[i] = frozen_bn_elem(x[i], s, t);
  }
}

extern "C" void cuda_frozen_bn_forward(const float *x, const float *weight, const float *bias, const float *mean,
                                       const float *var, float eps, float *y, float *scale, int64_t batch,
                                       int64_t channels, int64_t spatial) {
  if (channels <= 0) return;
  cudaStream_t stream = detr_cuda_stream();
  frozen_bn_scale_kernel<<<detr_grid_size(channels, DETR_BLOCK), DETR_BLOCK, 0, stream>>>(
      weight, bias, mean, var, eps, scale, channels);
  CUDA_CHECK_LAUNCH("frozen_bn_scale_kernel");
  int64_t total = batch * channels * spatial;
  if (total <= 0) return;
  frozen_bn_forward_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, stream>>>(
      x, weight, bias, mean, var, eps, y, channels, spatial, total);
  CUDA_CHECK_LAUNCH("frozen_bn_forward_kernel");
}

// dx [B, C, S] += dy * scale[c].
__global__ void channel_scale_backward_kernel(const float *dy, const float *scale, float *dx, int64_t channels,
                                              int64_t spatial, int64_t total) {
  GRID_STRIDE_LOOP(i, total) dx[i] += dy[i] * scale[(i / spatial) % channels];
}

extern "C" void cuda_channel_scale_backward(const float *dy, const float *scale, float *dx, int64_t batch,
                                            int64_t channels, int64_t spatial) {
  int64_t total = batch * channels * spatial;
  if (total <= 0) return;
  channel_scale_backward_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(
      dy, scale, dx, channels, spatial, total);
  CUDA_CHECK_LAUNCH("channel_scale_backward_kernel");
}
