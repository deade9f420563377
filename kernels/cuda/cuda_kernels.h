// CUDA kernels and runtime wrappers, callable from C. Signatures mirror kernels/cpu/cpu_kernels.h
// (pointers are device pointers); element math comes from the same kernels/*_math.h headers.
// Every CUDA, cuBLAS and cuDNN status is checked; a failure stops with file:line and the call.
// All work is queued on one stream per process; only the copies to the host synchronise.
// Scalars that a kernel produces or consumes (a loss, its incoming gradient) stay on the device.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "kernels/common.h"
#include "kernels/conv_math.h"
#include "kernels/elementwise_math.h"
#include "kernels/kernel_twins.h"
#include "kernels/optim_math.h"

#ifdef __cplusplus
extern "C" {
#endif

// runtime.cu
// The number of GPUs this process can use (> 0); 0 with why set when the machine has none (no
// NVIDIA driver installed, or the driver finds no GPU: skip, or refuse --device cuda); -1 with why
// set when CUDA is present but unusable (a driver older than this build's runtime, mismatched
// driver parts, busy GPUs, ...: an error to report). kernels/cuda_status.h words the reasons.
int cuda_device_probe(char *why, size_t cap);
int cuda_device_count(void);  // cuda_device_probe's count; stops the process with the reason on -1
// Binds this process (its stream, handles and allocations) to GPU index; before other CUDA work.
void cuda_set_device(int index);
int cuda_current_device(void);
int cuda_compute_capability(void);  // of the current device: 10 * major + minor (90 for an H100)
// The current device's name (cudaDeviceProp.name), and its memory in bytes: total, and in use by
// every process on it (total - free, cudaMemGetInfo: what nvidia-smi shows, contexts included).
void cuda_device_name(char *name, size_t cap);
void cuda_device_memory(size_t *used, size_t *total);
// Starts (true) or stops a profiler's capture (cudaProfilerStart/Stop: ncu --profile-from-start off,
// nsys --capture-range=cudaProfilerApi), so that it records only the work in between.
void cuda_profiler_capture(bool on);
// TF32 tensor-core math for cuBLAS (CUBLAS_TF32_TENSOR_OP_MATH) and cuDNN (CUDNN_DEFAULT_MATH):
// faster fp32 matmuls and convolutions on sm_80+ with inputs rounded to a 10-bit mantissa. Off by
// default (plain fp32 FMA math, which agrees with the CPU to fp32 rounding). Process-wide; applies
// to the work queued after the call.
void cuda_set_tf32(bool on);
bool cuda_tf32_enabled(void);
// bf16 mixed precision, the CPU's cpu_set_bf16 on the GPU: GEMMs on bf16 copies of their inputs
// (rounded to nearest by matmul.cu; cuBLAS accumulates and writes fp32); convolutions on cuDNN's
// bf16 tensors (inputs rounded to nearest bf16 by conv.cu, fp32 accumulation, the output - y, dx,
// dw - rounded to bf16 by cuDNN and widened back to fp32). Overrides TF32 while on.
// cuda_bf16_supported: an sm_80+ GPU (why set when not). Process-wide, off by default; applies to
// the work queued after the call.
bool cuda_bf16_supported(char *why, size_t cap);
void cuda_set_bf16(bool on);  // fails where cuda_bf16_supported does not hold
bool cuda_bf16_enabled(void);
// dst [n] = src [n] rounded to the nearest bf16 (kernels/bf16_math.h): the staging copies of the
// bf16 convolutions and GEMMs.
void cuda_to_bf16(const float *src, uint16_t *dst, int64_t n);
void *cuda_device_malloc(size_t bytes);  // NULL on out-of-memory
// A device buffer for the kernels' own use (bf16 copies): on out-of-memory, the reclaim function
// registered by the layer that caches device memory (tensor/alloc.c: its free blocks) runs and the
// allocation is tried once more; NULL if it still fails.
void *cuda_device_malloc_reclaiming(size_t bytes);
void cuda_set_memory_reclaim(void (*reclaim)(void));
void cuda_device_free(void *ptr);
// From any host memory: staged through pinned blocks, queued on the stream; src is free on return.
void cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
void cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);  // synchronises
// Pinned (page-locked) host memory, NULL when none is left; and a copy from it that is only
// queued: pinned_src must stay unchanged until the stream has run the copy.
void *cuda_host_alloc(size_t bytes);
void cuda_host_free(void *ptr);
void cuda_memcpy_h2d_async(void *dst, const void *pinned_src, size_t bytes);
void cuda_memcpy_d2d(void *dst, const void *src, size_t bytes);
void cuda_synchronize(void);

// The kernels of kernel_twins.h, each family under its file's name, and the CUDA backend's own.
// elementwise.cu
TWIN_ELEMENTWISE(cuda)

// reduce.cu: x viewed as [outer, n, inner]; y [outer, inner] = scale * sum over n.
TWIN_REDUCE(cuda)

// matmul.cu (cuBLAS)
TWIN_MATMUL(cuda)
TWIN_GEMM_BF16(cuda)

// conv.cu (cuDNN). dx, dw, dbias may be NULL; gradients accumulate. The caller provides cuDNN's
// workspace (device memory, at least the bytes the _workspace function gives for g under the
// current settings; NULL when that is 0): the algorithms are chosen, within
// DETR_CUDNN_WORKSPACE_MB, and cached per geometry by the size query.
size_t cuda_conv2d_forward_workspace(const ConvGeom *g);
size_t cuda_conv2d_backward_workspace(const ConvGeom *g, bool dx, bool dw);
void cuda_conv2d_forward(const float *x, const float *w, const float *bias, float *y, const ConvGeom *g,
                         void *workspace, size_t workspace_bytes);
// set_dx, set_dw: dx, dw are written (their old contents ignored) instead of accumulated into, as
// cpu_conv2d_backward.
void cuda_conv2d_backward(const float *x, const float *w, const float *dy, float *dx, bool set_dx, float *dw,
                          bool set_dw, float *dbias, const ConvGeom *g, void *workspace, size_t workspace_bytes);
// The cost of convolution algorithms, for bench_step --conv-survey: each pass (geometry and
// direction) run under the current math and determinism setting, with how many times it ran since
// the process started, detr-c's choice when determinism is required and when not
// (DETR_CUDNN_DETERMINISTIC=0; -1: none supports it), and every (algorithm, math type) cuDNN's Find
// timed on zero tensors within DETR_CUDNN_WORKSPACE_MB, fastest first. Writes up to cap rows;
// returns the passes' count. The caller leaves room on the device: buffers for the largest pass
// and the workspace limit are allocated outside the tensor allocator.
#define CONV_SURVEY_ALGOS 32
typedef struct {
  int algo;       // a cudnnConvolution*Algo_t of the row's pass
  int math_type;  // the cudnnMathType_t it ran with
  bool deterministic;
  bool ran;  // false: cuDNN could not run it here (unsupported, or over the workspace limit)
  float ms;
  size_t bytes;  // its workspace
} ConvAlgoTime;
typedef struct {
  ConvGeom g;
  ConvPass pass;
  int64_t calls;
  int pick_deterministic, pick_any;  // the algorithm detr-c runs in each setting
  int n;
  ConvAlgoTime algos[CONV_SURVEY_ALGOS];
} ConvSurveyRow;
int cuda_conv2d_survey(ConvSurveyRow *rows, int cap);
// conv.cu: depthwise convolution, max pooling (argmax int32 on the device), frozen batch norm.
TWIN_CONV(cuda)

// softmax.cu: softmax, cluster argmax (winners, counts: scratch and results, as the CPU's), layer norm.
TWIN_SOFTMAX(cuda)

// shape.cu. in_shape and perm are host arrays; idx, offsets, positions device arrays.
TWIN_SHAPE(cuda)
// index_select's backward as a gather: dx [rows, row] row r += dy rows positions[offsets[r] ..
// offsets[r+1]) (the i with idx[i] == r, increasing: the CPU's summation order).
void cuda_index_add(const float *dy, const int64_t *offsets, const int64_t *positions, float *dx, int64_t rows,
                    int64_t row);

// loss.cu (the boxes: TWIN_BOXES below). targets [rows] int64 and the scalars loss [1], dloss [1] are device memory.
void cuda_cross_entropy_forward(const float *logits, const int64_t *targets, const float *weight, float *lse,
                                float *loss, int64_t rows, int64_t classes);
void cuda_cross_entropy_backward(const float *logits, const int64_t *targets, const float *weight, const float *lse,
                                 const float *dloss, float *dlogits, int64_t rows, int64_t classes);
void cuda_focal_loss_forward(const float *logits, const int64_t *targets, float *loss, int64_t rows, int64_t classes,
                             float alpha, float gamma);
void cuda_focal_loss_backward(const float *logits, const int64_t *targets, const float *dloss, float *dlogits,
                              int64_t rows, int64_t classes, float alpha, float gamma);
void cuda_l1_sum_forward(const float *a, const float *b, float *loss, int64_t n);
void cuda_l1_sum_backward(const float *a, const float *b, const float *dloss, float *da, float *db, int64_t n);
TWIN_BOXES(cuda)

// enact.cu: ENACT's regions, clustering (Algorithm 1's regions x features grid) and clustered
// attention; arrays on the device. Gaussian smoothing: valid_h, valid_w [B], taps and workspace
// (B*Hp*Wp floats) on the device.
TWIN_ENACT(cuda)

// scan.cu: out[i] = in[0] + ... + in[i] for n int64 on the device (cub); temp: cuda_inclusive_scan_i64_bytes(n) bytes.
size_t cuda_inclusive_scan_i64_bytes(int64_t n);
void cuda_inclusive_scan_i64(const int64_t *in, int64_t *out, int64_t n, void *temp, size_t temp_bytes);

// optim.cu: AdamW; the clipping norm as per-gradient partial sums of squares (exactly
// CUDA_SUM_SQUARES_PARTIALS doubles each), added up by cuda_sum_doubles into out[0]; scaling.
#define CUDA_SUM_SQUARES_PARTIALS 64
TWIN_OPTIM(cuda)
void cuda_sum_squares_partials(const float *x, int64_t n, double *partials);
void cuda_sum_doubles(const double *x, int64_t n, double *out);

#ifdef __cplusplus
}
#endif
