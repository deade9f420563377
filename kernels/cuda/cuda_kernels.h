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
// TF32 tensor-core math for cuBLAS (CUBLAS_TF32_TENSOR_OP_MATH) and cuDNN (CUDNN_DEFAULT_MATH):
// faster fp32 matmuls and convolutions on sm_80+ with inputs rounded to a 10-bit mantissa. Off by
// default (plain fp32 FMA math, which agrees with the CPU to fp32 rounding). Process-wide; applies
// to the work queued after the call.
void cuda_set_tf32(bool on);
bool cuda_tf32_enabled(void);
void *cuda_device_malloc(size_t bytes);  // NULL on out-of-memory
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

// elementwise.cu
void cuda_fill(float *x, int64_t n, float value);
void cuda_uniform(float *x, int64_t n, uint64_t seed, uint64_t offset, float low, float high);
void cuda_normal(float *x, int64_t n, uint64_t seed, uint64_t offset, float mean, float std);
void cuda_accumulate(float *dst, const float *src, int64_t n);
void cuda_unary_forward(int op, const float *x, float *y, int64_t n, float param);
void cuda_unary_backward(int op, const float *x, const float *y, const float *dy, float *dx,
                         int64_t n, float param);
void cuda_binary_forward(int op, const float *a, const float *b, float *y, Broadcast bc);
void cuda_binary_backward(int op, const float *a, const float *b, const float *dy, float *da,
                          float *db, Broadcast bc);
void cuda_dropout_forward(const float *x, float *y, int64_t n, float p, uint64_t seed, uint64_t offset);
void cuda_dropout_backward(const float *dy, float *dx, int64_t n, float p, uint64_t seed, uint64_t offset);

// reduce.cu: x viewed as [outer, n, inner]; y [outer, inner] = scale * sum over n.
void cuda_reduce_sum(const float *x, float *y, int64_t outer, int64_t n, int64_t inner, float scale);
void cuda_reduce_sum_backward(const float *dy, float *dx, int64_t outer, int64_t n, int64_t inner, float scale);

// matmul.cu (cuBLAS)
void cuda_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
               int64_t ldc);
void cuda_gemm_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                       int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c,
                       int64_t batch);
void cuda_add_row_bias(float *y, const float *bias, int64_t rows, int64_t cols, bool relu);
void cuda_row_bias_backward(const float *dy, float *dbias, int64_t rows, int64_t cols);
void cuda_relu_row_bias_backward(const float *y, const float *dy, float keep_scale, float *dz, float *dbias, int64_t rows,
                                 int64_t cols);

// conv.cu (cuDNN). dx, dw, dbias may be NULL; gradients accumulate. The caller provides cuDNN's
// workspace (device memory, at least the bytes the _workspace function gives for g under the
// current settings; NULL when that is 0): the algorithms are chosen, within
// DETR_CUDNN_WORKSPACE_MB, and cached per geometry by the size query.
size_t cuda_conv2d_forward_workspace(const ConvGeom *g);
size_t cuda_conv2d_backward_workspace(const ConvGeom *g, bool dx, bool dw);
void cuda_conv2d_forward(const float *x, const float *w, const float *bias, float *y,
                         const ConvGeom *g, void *workspace, size_t workspace_bytes);
// set_dx, set_dw: dx, dw are written (their old contents ignored) instead of accumulated into, as
// cpu_conv2d_backward.
void cuda_conv2d_backward(const float *x, const float *w, const float *dy, float *dx, bool set_dx, float *dw,
                          bool set_dw, float *dbias, const ConvGeom *g, void *workspace, size_t workspace_bytes);
// conv.cu: depthwise convolution (as cpu_dwconv_*).
void cuda_dwconv_forward(const float *x, const float *w, const float *bias, float *y, const DwConvGeom *g);
void cuda_dwconv_backward(const float *x, const float *w, const float *dy, float *dx, float *dw, float *dbias,
                          const DwConvGeom *g);
// conv.cu: max pooling (argmax [B, C, HO, WO] int32 on the device) and frozen batch norm.
void cuda_maxpool2d_forward(const float *x, float *y, int32_t *argmax, const ConvGeom *g);
void cuda_maxpool2d_backward(const float *dy, const int32_t *argmax, float *dx, const ConvGeom *g);
void cuda_frozen_bn_forward(const float *x, const float *weight, const float *bias, const float *mean,
                            const float *var, float eps, const float *residual, bool relu, float *y, float *scale,
                            int64_t batch, int64_t channels, int64_t spatial);
void cuda_frozen_bn_backward(const float *y, const float *dy, const float *scale, bool relu, float *dx, bool set_dx,
                             float *dresidual, bool set_dresidual, int64_t batch, int64_t channels, int64_t spatial);

// softmax.cu: x [rows, n]; mask [rows / rows_per_mask, n] or NULL.
void cuda_softmax_forward(const float *x, const float *mask, float *y, int64_t rows, int64_t n,
                          int64_t rows_per_mask, bool log);
void cuda_softmax_backward(const float *y, const float *dy, float *dx, int64_t rows, int64_t n, bool log);
// x, y [n, q, l]; mask [n / rows_per_mask, l] or NULL; winners [n, l], counts [n, q] (scratch and
// results, as the CPU's).
void cuda_cluster_argmax(const float *x, const float *mask, float *y, float *winners, float *counts, int64_t n,
                         int64_t q, int64_t l, int64_t rows_per_mask, bool mean);
void cuda_layernorm_forward(const float *x, const float *w, const float *b, float *y, float *mean, float *rstd,
                            int64_t rows, int64_t n, float eps);
void cuda_layernorm_backward(const float *x, const float *w, const float *mean, const float *rstd,
                             const float *dy, float *dx, float *dw, float *db, int64_t rows, int64_t n);

// shape.cu. in_shape and perm are host arrays; idx, offsets, positions device arrays.
void cuda_permute(const float *x, float *y, int ndim, const int64_t *in_shape, const int *perm, bool accumulate);
void cuda_copy_axis_range(const float *src, float *dst, int64_t outer, int64_t src_axis, int64_t dst_axis,
                          int64_t inner, int64_t src_start, int64_t dst_start, int64_t len, bool accumulate);
void cuda_index_select(const float *x, const int64_t *idx, float *y, int64_t n, int64_t row);
// index_select's backward as a gather: dx [rows, row] row r += dy rows positions[offsets[r] ..
// offsets[r+1]) (the i with idx[i] == r, increasing: the CPU's summation order).
void cuda_index_add(const float *dy, const int64_t *offsets, const int64_t *positions, float *dx, int64_t rows,
                    int64_t row);

// loss.cu. targets [rows] int64 and the scalars loss [1], dloss [1] are device memory.
void cuda_cross_entropy_forward(const float *logits, const int64_t *targets, const float *weight, float *lse,
                                float *loss, int64_t rows, int64_t classes);
void cuda_cross_entropy_backward(const float *logits, const int64_t *targets, const float *weight,
                                 const float *lse, const float *dloss, float *dlogits, int64_t rows,
                                 int64_t classes);
void cuda_focal_loss_forward(const float *logits, const int64_t *targets, float *loss, int64_t rows, int64_t classes,
                             float alpha, float gamma);
void cuda_focal_loss_backward(const float *logits, const int64_t *targets, const float *dloss, float *dlogits,
                              int64_t rows, int64_t classes, float alpha, float gamma);
void cuda_l1_sum_forward(const float *a, const float *b, float *loss, int64_t n);
void cuda_l1_sum_backward(const float *a, const float *b, const float *dloss, float *da, float *db, int64_t n);
void cuda_box_convert_forward(const float *in, float *out, int64_t boxes, bool to_xyxy);
void cuda_box_convert_backward(const float *dout, float *din, int64_t boxes, bool to_xyxy);
void cuda_box_giou_forward(const float *a, const float *b, float *out, int64_t n);
void cuda_box_giou_backward(const float *a, const float *b, const float *dout, float *da, float *db, int64_t n);

// enact.cu: ENACT's clustering (Algorithm 1's regions x features grid); arrays on the device.
void cuda_enact_cluster_forward(const float *K, const float *V, const float *H, const float *signs,
                                const int64_t *starts, const int64_t *lengths, int64_t L, int64_t d, float *Kc,
                                float *Vc);
void cuda_enact_cluster_backward(const float *K, const float *V, const float *H, const float *signs,
                                 const int64_t *starts, const int64_t *lengths, int64_t L, int64_t d,
                                 const float *Kc, const float *Vc, const float *dKc, const float *dVc, float *dK,
                                 float *dV, float *dH);
// Gaussian smoothing (cpu_enact_smooth's contract); valid_h, valid_w [B], taps and workspace
// (B*Hp*Wp floats) on the device.
void cuda_enact_smooth(const float *x, float *y, int64_t B, int64_t Hp, int64_t Wp, const int64_t *valid_h,
                       const int64_t *valid_w, const float *taps, int64_t ntaps, bool two_d, float *workspace);

// optim.cu: AdamW; the clipping norm as per-gradient partial sums of squares (exactly
// CUDA_SUM_SQUARES_PARTIALS doubles each), added up by cuda_sum_doubles into out[0]; scaling.
#define CUDA_SUM_SQUARES_PARTIALS 64
void cuda_adamw(float *p, float *m, float *v, const float *g, int64_t n, AdamWStep s);
void cuda_sum_squares_partials(const float *x, int64_t n, double *partials);
void cuda_sum_doubles(const double *x, int64_t n, double *out);
void cuda_scale(float *x, int64_t n, float s);

#ifdef __cplusplus
}
#endif
