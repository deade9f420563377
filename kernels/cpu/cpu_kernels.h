// CPU kernels: raw compute on float pointers. Backward kernels *accumulate* into their gradient
// outputs (dx += ...), so autograd can sum contributions without temporaries.
#pragma once
#include <stdbool.h>

#include "kernels/common.h"
#include "kernels/conv_math.h"
#include "kernels/elementwise_math.h"

// cpu_runtime.c: called first thing in main(argv). Puts in the environment what libgomp reads as
// it loads (a short spin before a waiting thread sleeps) and starts the program again, once; a
// setting the user made is kept. Returns when nothing needed setting.
void cpu_runtime_setup(char **argv);

// elementwise.c
void cpu_fill(float *x, int64_t n, float value);
void cpu_uniform(float *x, int64_t n, uint64_t seed, uint64_t offset, float low, float high);
void cpu_normal(float *x, int64_t n, uint64_t seed, uint64_t offset, float mean, float std);
void cpu_accumulate(float *dst, const float *src, int64_t n);  // dst += src
void cpu_unary_forward(int op, const float *x, float *y, int64_t n, float param);
void cpu_unary_backward(int op, const float *x, const float *y, const float *dy, float *dx,
                        int64_t n, float param);
void cpu_binary_forward(int op, const float *a, const float *b, float *y, Broadcast bc);
// da, db may be NULL; they have the broadcast (unexpanded) shapes of a and b.
void cpu_binary_backward(int op, const float *a, const float *b, const float *dy, float *da,
                         float *db, Broadcast bc);
void cpu_dropout_forward(const float *x, float *y, int64_t n, float p, uint64_t seed,
                         uint64_t offset);
void cpu_dropout_backward(const float *dy, float *dx, int64_t n, float p, uint64_t seed,
                          uint64_t offset);

// reduce.c: x viewed as [outer, n, inner]; y [outer, inner] = scale * sum over n.
void cpu_reduce_sum(const float *x, float *y, int64_t outer, int64_t n, int64_t inner, float scale);
void cpu_reduce_sum_backward(const float *dy, float *dx, int64_t outer, int64_t n, int64_t inner,
                             float scale);

// matmul.c: row-major C[M,N] = alpha op(A) op(B) + beta C, and its strided-batched form.
void cpu_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
              int64_t ldc);
const char *cpu_gemm_library(void);  // e.g. "oneDNN 2.6 sgemm", "OpenBLAS sgemm (Haswell)"
void cpu_gemm_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                      int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c,
                      int64_t batch);
// y[r, j] += bias[j] for r < rows (bias NULL: 0), then y = relu(y) when relu; dbias[j] += sum_r dy[r, j].
void cpu_add_row_bias(float *y, const float *bias, int64_t rows, int64_t cols, bool relu);
void cpu_row_bias_backward(const float *dy, float *dbias, int64_t rows, int64_t cols);
// Through a ReLU given its output y [rows, cols]: dz = relu'(y) dy (dz may be dy itself), and
// dbias[j] += sum_r dz[r, j] when dbias is not NULL, in one pass. keep_scale != 1: y is the output
// of dropout after the ReLU, dy its gradient (relu_dropout_backward_from_output).
void cpu_relu_row_bias_backward(const float *y, const float *dy, float keep_scale, float *dz, float *dbias,
                                int64_t rows, int64_t cols);

// conv.c: im2col + sgemm, or oneDNN (conv_onednn.c) where it is the faster (bench/README.md).
// workspace: cpu_conv2d_forward_workspace_floats(g) floats for the forward,
// cpu_conv2d_backward_workspace_floats(g, ...) for a backward with the same gradients and flags
// (im2col's column chunk, or oneDNN's layout copies and scratchpad: the caller takes it from the
// tensor allocator, as cuDNN's, so that it is memory only while a pass runs).
int64_t cpu_conv2d_forward_workspace_floats(const ConvGeom *g, bool bias);
int64_t cpu_conv2d_backward_workspace_floats(const ConvGeom *g, bool dx, bool set_dx, bool dw, bool set_dw, bool dbias);
void cpu_conv2d_forward(const float *x, const float *w, const float *bias, float *y,
                        const ConvGeom *g, float *workspace);
// dx, dw, dbias may be NULL; x is read for dw only, w for dx only (the other may be NULL). The
// gradients accumulate, but dx (dw) is written when set_dx (set_dw): its old contents may be
// garbage (a fresh buffer, autograd_grad_to_write).
void cpu_conv2d_backward(const float *x, const float *w, const float *dy, float *dx, bool set_dx, float *dw,
                         bool set_dw, float *dbias, const ConvGeom *g, float *workspace);
// Which implementation runs each pass of a convolution. AUTO: the faster for the shape and pass;
// the others force one everywhere (bench_ops and bench_step compare them): im2col + sgemm, oneDNN
// on its blocked layouts (reorders around), oneDNN on plain nchw, oneDNN's Winograd F(4x4, 3x3) on
// its blocked layouts (where oneDNN has none for the shape or this CPU, its direct convolution as
// CONV_IMPL_ONEDNN). The oneDNN ones fail in a build without oneDNN.
typedef enum {
  CONV_IMPL_AUTO,
  CONV_IMPL_IM2COL,
  CONV_IMPL_ONEDNN,
  CONV_IMPL_ONEDNN_PLAIN,
  CONV_IMPL_ONEDNN_WINOGRAD
} ConvImpl;
void cpu_conv2d_set_impl(ConvImpl impl);
ConvImpl cpu_conv2d_impl(const ConvGeom *g, ConvPass pass);  // never AUTO
// Depthwise convolution (kernels/conv_math.h): w [C, k, k], bias [C] or NULL; the backward
// accumulates into dx, dw, dbias (each may be NULL).
void cpu_dwconv_forward(const float *x, const float *w, const float *bias, float *y, const DwConvGeom *g);
void cpu_dwconv_backward(const float *x, const float *w, const float *dy, float *dx, float *dw, float *dbias,
                         const DwConvGeom *g);
void cpu_maxpool2d_forward(const float *x, float *y, int32_t *argmax, const ConvGeom *g);
void cpu_maxpool2d_backward(const float *dy, const int32_t *argmax, float *dx, const ConvGeom *g);
// Frozen batch norm, optionally fused with a residual add (residual: x's shape, or NULL) and ReLU:
// y = relu?(x * scale[c] + shift[c] + residual). Backward: dx += g * scale[c], dresidual += g, with
// g = dy masked by y > 0 under ReLU (y is read only then); dx, dresidual may be NULL;
// set_dx: dx = g * scale instead of +=, and without dresidual dx may then be dy itself;
// set_dresidual: dresidual = g instead of += g, and dresidual may then be dy itself.
void cpu_frozen_bn_forward(const float *x, const float *weight, const float *bias,
                           const float *mean, const float *var, float eps, const float *residual,
                           bool relu, float *y, float *scale, int64_t batch, int64_t channels,
                           int64_t spatial);
void cpu_frozen_bn_backward(const float *y, const float *dy, const float *scale, bool relu, float *dx, bool set_dx,
                            float *dresidual, bool set_dresidual, int64_t batch, int64_t channels, int64_t spatial);

// softmax.c: x [rows, n]; mask [rows / rows_per_mask, n] or NULL.
void cpu_softmax_forward(const float *x, const float *mask, float *y, int64_t rows, int64_t n,
                         int64_t rows_per_mask, bool log);
void cpu_softmax_backward(const float *y, const float *dy, float *dx, int64_t rows, int64_t n,
                          bool log);
// x, y [n, q, l]; mask [n / rows_per_mask, l] or NULL; winners [n, l] and counts [n, q] receive
// each pixel's query (-1: padded) and each query's pixel count (op_cluster_argmax).
void cpu_cluster_argmax(const float *x, const float *mask, float *y, float *winners, float *counts, int64_t n,
                        int64_t q, int64_t l, int64_t rows_per_mask, bool mean);
void cpu_layernorm_forward(const float *x, const float *w, const float *b, float *y, float *mean,
                           float *rstd, int64_t rows, int64_t n, float eps);
void cpu_layernorm_backward(const float *x, const float *w, const float *mean, const float *rstd,
                            const float *dy, float *dx, float *dw, float *db, int64_t rows,
                            int64_t n);

// shape.c
void cpu_permute(const float *x, float *y, int ndim, const int64_t *in_shape, const int *perm,
                 bool accumulate);
// dst[o, dst_start + k, i] (+)= src[o, src_start + k, i] for k < len; src/dst viewed as
// [outer, src_axis, inner] and [outer, dst_axis, inner].
void cpu_copy_axis_range(const float *src, float *dst, int64_t outer, int64_t src_axis,
                         int64_t dst_axis, int64_t inner, int64_t src_start, int64_t dst_start,
                         int64_t len, bool accumulate);
void cpu_index_select(const float *x, const int64_t *idx, float *y, int64_t n, int64_t row);
void cpu_index_add(const float *dy, const int64_t *idx, float *dx, int64_t n, int64_t row);

// loss.c
// Returns the loss; writes each row's log-sum-exp to lse[rows].
float cpu_cross_entropy_forward(const float *logits, const int64_t *targets, const float *weight,
                                float *lse, int64_t rows, int64_t classes);
void cpu_cross_entropy_backward(const float *logits, const int64_t *targets, const float *weight,
                                const float *lse, float dloss, float *dlogits, int64_t rows,
                                int64_t classes);
// Sigmoid focal loss summed over logits [rows, classes]; targets [rows] in [0, classes] (classes:
// no positive class in that row).
float cpu_focal_loss_forward(const float *logits, const int64_t *targets, int64_t rows, int64_t classes,
                             float alpha, float gamma);
void cpu_focal_loss_backward(const float *logits, const int64_t *targets, float dloss, float *dlogits, int64_t rows,
                             int64_t classes, float alpha, float gamma);
float cpu_l1_sum_forward(const float *a, const float *b, int64_t n);
void cpu_l1_sum_backward(const float *a, const float *b, float dloss, float *da, float *db,
                         int64_t n);
void cpu_box_convert_forward(const float *in, float *out, int64_t boxes, bool to_xyxy);
void cpu_box_convert_backward(const float *dout, float *din, int64_t boxes, bool to_xyxy);
void cpu_box_giou_forward(const float *a, const float *b, float *out, int64_t n);
void cpu_box_giou_backward(const float *a, const float *b, const float *dout, float *da,
                           float *db, int64_t n);

// enact.c: ENACT's clustering (kernels/enact_math.h). K, V [M, d]; H [M]; signs [M] or NULL;
// regions starts/lengths [L]; Kc, Vc [L, d]. dK, dV, dH may be NULL.
void cpu_enact_cluster_forward(const float *K, const float *V, const float *H, const float *signs,
                               const int64_t *starts, const int64_t *lengths, int64_t L, int64_t d, float *Kc,
                               float *Vc);
void cpu_enact_cluster_backward(const float *K, const float *V, const float *H, const float *signs,
                                const int64_t *starts, const int64_t *lengths, int64_t L, int64_t d,
                                const float *Kc, const float *Vc, const float *dKc, const float *dVc, float *dK,
                                float *dV, float *dH);
// Gaussian smoothing of each image's valid h_b x w_b region of x [B, Hp*Wp] (zero outside it):
// taps [ntaps] centred, rows then columns (two_d), or along the valid pixels' row-major sequence.
// y [B, Hp*Wp] += result (0 on padding). Self-adjoint: backward is the same call on the gradient.
// workspace: B*Hp*Wp floats.
void cpu_enact_smooth(const float *x, float *y, int64_t B, int64_t Hp, int64_t Wp, const int64_t *valid_h,
                      const int64_t *valid_w, const float *taps, int64_t ntaps, bool two_d, float *workspace);

// optim.c: AdamW over n elements (kernels/optim_math.h); sum of squares in double; scale in place.
#include "kernels/optim_math.h"
void cpu_adamw(float *p, float *m, float *v, const float *g, int64_t n, AdamWStep s);
double cpu_sum_squares(const float *x, int64_t n);
void cpu_scale(float *x, int64_t n, float s);
// Multi-tensor forms, one parallel region for all: the sum of squares of x[count] (n[count] floats
// each; the tensors' cpu_sum_squares added in order: the same double), and AdamW on each tensor with
// its gradient multiplied by grad_scale as it is read (clipping; 1: none; cpu_scale and cpu_adamw
// in one pass: the same floats).
typedef struct {
  float *p, *m, *v;  // [n] each
  const float *g;    // [n]
  int64_t n;
  AdamWStep s;
} AdamWTensor;
double cpu_sum_squares_multi(const float *const *x, const int64_t *n, int count);
void cpu_adamw_multi(const AdamWTensor *t, int count, float grad_scale);

// fpenv.c: flush denormal results and inputs to zero (MXCSR FTZ + DAZ) on the calling thread and
// every OpenMP worker. Gradients of deep nets underflow into denormals, whose arithmetic runs ~100x
// slower (measured: AdamW and the gradient norm at 20+ ns per element instead of ~1). Training
// turns it on; `detr step` (reference parity) leaves IEEE behaviour alone.
void cpu_flush_denormals(bool on);
