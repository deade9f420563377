// The kernels whose CPU and CUDA forms take the same arguments, declared once for both backends:
// TWIN_<FAMILY>(cpu) in kernels/cpu/cpu_kernels.h declares cpu_<kernel>, TWIN_<FAMILY>(cuda) in
// kernels/cuda/cuda_kernels.h cuda_<kernel> (there every pointer is a device pointer). One list, so
// the two backends cannot drift apart; a kernel whose forms differ (a loss the CUDA one leaves on
// the device, cuDNN's workspace) is declared in its backend's header. Backward kernels accumulate
// into their gradient outputs (dx += ...) unless a set_ flag says otherwise.
#pragma once

// elementwise.c/.cu: fill, uniform in [low, high) and normal draws (kernels/rng_math.h: the same
// stream on both), dst += src, unary and broadcasting binary ops (binary_backward: da, db may be
// NULL; they have the broadcast, unexpanded shapes of a and b), dropout.
#define TWIN_ELEMENTWISE(P)                                                                                            \
  void P##_fill(float *x, int64_t n, float value);                                                                     \
  void P##_uniform(float *x, int64_t n, uint64_t seed, uint64_t offset, float low, float high);                        \
  void P##_normal(float *x, int64_t n, uint64_t seed, uint64_t offset, float mean, float std);                         \
  void P##_accumulate(float *dst, const float *src, int64_t n);                                                        \
  void P##_unary_forward(int op, const float *x, float *y, int64_t n, float param);                                    \
  void P##_unary_backward(int op, const float *x, const float *y, const float *dy, float *dx, int64_t n, float param); \
  void P##_binary_forward(int op, const float *a, const float *b, float *y, Broadcast bc);                             \
  void P##_binary_backward(int op, const float *a, const float *b, const float *dy, float *da, float *db,              \
                           Broadcast bc);                                                                              \
  void P##_dropout_forward(const float *x, float *y, int64_t n, float p, uint64_t seed, uint64_t offset);              \
  void P##_dropout_backward(const float *dy, float *dx, int64_t n, float p, uint64_t seed, uint64_t offset);

// reduce.c/.cu: x viewed as [outer, n, inner]; y [outer, inner] = scale * sum over n.
#define TWIN_REDUCE(P)                                                                                 \
  void P##_reduce_sum(const float *x, float *y, int64_t outer, int64_t n, int64_t inner, float scale); \
  void P##_reduce_sum_backward(const float *dy, float *dx, int64_t outer, int64_t n, int64_t inner, float scale);

// matmul.c/.cu: row-major C[M,N] = alpha op(A) op(B) + beta C, and its strided-batched form.
// add_row_bias: y[r, j] += bias[j] for r < rows (bias NULL: 0), then y = relu(y) when relu;
// row_bias_backward: dbias[j] += sum_r dy[r, j]. relu_row_bias_backward: through a ReLU given its
// output y [rows, cols]: dz = relu'(y) dy (dz may be dy itself), and dbias[j] += sum_r dz[r, j] when
// dbias is not NULL, in one pass; keep_scale != 1: y is the output of dropout after the ReLU, dy its
// gradient (relu_dropout_backward_from_output).
#define TWIN_MATMUL(P)                                                                                                 \
  void P##_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, \
                const float *b, int64_t ldb, float beta, float *c, int64_t ldc);                                       \
  void P##_gemm_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,      \
                        int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, float beta,      \
                        float *c, int64_t ldc, int64_t stride_c, int64_t batch);                                       \
  void P##_add_row_bias(float *y, const float *bias, int64_t rows, int64_t cols, bool relu);                           \
  void P##_row_bias_backward(const float *dy, float *dbias, int64_t rows, int64_t cols);                               \
  void P##_relu_row_bias_backward(const float *y, const float *dy, float keep_scale, float *dz, float *dbias,          \
                                  int64_t rows, int64_t cols);

// matmul_bf16.c / matmul.cu: for an op that reads one matrix in several GEMMs (linear: x and W in the
// forward and again in the backward, dy in both backward GEMMs), bf16's rounding done once:
// gemm_bf16_wanted - whether P_gemm runs a GEMM of this shape in bf16 now; round_bf16 - a dense
// matrix [rows, cols] rounded to the nearest bf16; gemm_bf16 - C[m, n] = alpha op(A) op(B) + beta C
// on such copies (A [m, k], or [k, m] when trans_a; B [k, n] or [n, k]): P_gemm's bf16 arithmetic
// (on the CPU its bits: the same conversion instruction and oneDNN matmul).
#define TWIN_GEMM_BF16(P)                                                                                         \
  bool P##_gemm_bf16_wanted(int64_t m, int64_t n, int64_t k);                                                     \
  void P##_round_bf16(const float *x, int64_t rows, int64_t cols, uint16_t *out);                                 \
  void P##_gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a, \
                     const uint16_t *b, float beta, float *c, int64_t ldc);

// conv.c/.cu: depthwise convolution (kernels/conv_math.h): w [C, k, k], bias [C] or NULL; the
// backward accumulates into dx, dw, dbias (each may be NULL). Max pooling (argmax [B, C, HO, WO]).
// argmax NULL: none kept (inference: no backward). Frozen batch norm, optionally fused with a residual add (residual: x's shape, or NULL) and ReLU:
// y = relu?(x * scale[c] + shift[c] + residual); under ReLU relu_mask (or NULL) receives y > 0 as
// bits (kernels/norm_math.h: relu_mask_byte). Backward: dx += g * scale[c], dresidual += g, with
// g = dy masked by relu_mask under ReLU (read only then); dx, dresidual may be NULL;
// set_dx: dx = g * scale instead of +=, and without dresidual dx may then be dy itself;
// set_dresidual: dresidual = g instead of += g, and dresidual may then be dy itself.
#define TWIN_CONV(P)                                                                                               \
  void P##_dwconv_forward(const float *x, const float *w, const float *bias, float *y, const DwConvGeom *g);       \
  void P##_dwconv_backward(const float *x, const float *w, const float *dy, float *dx, float *dw, float *dbias,    \
                           const DwConvGeom *g);                                                                   \
  void P##_maxpool2d_forward(const float *x, float *y, int32_t *argmax, const ConvGeom *g);                        \
  void P##_maxpool2d_backward(const float *dy, const int32_t *argmax, float *dx, const ConvGeom *g);               \
  void P##_frozen_bn_forward(const float *x, const float *weight, const float *bias, const float *mean,            \
                             const float *var, float eps, const float *residual, bool relu, float *y,              \
                             uint8_t *relu_mask, float *scale, int64_t batch, int64_t channels, int64_t spatial);  \
  void P##_frozen_bn_backward(const uint8_t *relu_mask, const float *dy, const float *scale, bool relu, float *dx, \
                              bool set_dx, float *dresidual, bool set_dresidual, int64_t batch, int64_t channels,  \
                              int64_t spatial);

// softmax.c/.cu: x [rows, n]; mask [rows / rows_per_mask, n] or NULL. cluster_argmax: x, y
// [n, q, l]; mask [n / rows_per_mask, l] or NULL; winners [n, l] and counts [n, q] receive each
// pixel's query (-1: padded) and each query's pixel count (op_cluster_argmax). Layer norm.
#define TWIN_SOFTMAX(P)                                                                                              \
  void P##_softmax_forward(const float *x, const float *mask, float *y, int64_t rows, int64_t n,                     \
                           int64_t rows_per_mask, bool log);                                                         \
  void P##_softmax_backward(const float *y, const float *dy, float *dx, int64_t rows, int64_t n, bool log);          \
  void P##_cluster_argmax(const float *x, const float *mask, float *y, float *winners, float *counts, int64_t n,     \
                          int64_t q, int64_t l, int64_t rows_per_mask, bool mean);                                   \
  void P##_layernorm_forward(const float *x, const float *w, const float *b, float *y, float *mean, float *rstd,     \
                             int64_t rows, int64_t n, float eps);                                                    \
  void P##_layernorm_backward(const float *x, const float *w, const float *mean, const float *rstd, const float *dy, \
                              float *dx, float *dw, float *db, int64_t rows, int64_t n);

// shape.c/.cu: permute (in_shape and perm are host arrays); copy_axis_range: dst[o, dst_start + k, i]
// (+)= src[o, src_start + k, i] for k < len, src/dst viewed as [outer, src_axis, inner] and
// [outer, dst_axis, inner]; index_select (idx in the kernel's memory).
#define TWIN_SHAPE(P)                                                                                              \
  void P##_permute(const float *x, float *y, int ndim, const int64_t *in_shape, const int *perm, bool accumulate); \
  void P##_copy_axis_range(const float *src, float *dst, int64_t outer, int64_t src_axis, int64_t dst_axis,        \
                           int64_t inner, int64_t src_start, int64_t dst_start, int64_t len, bool accumulate);     \
  void P##_index_select(const float *x, const int64_t *idx, float *y, int64_t n, int64_t row);

// loss.c/.cu: box format conversion (kernels/box_math.h) and generalized IoU, per box of [n, 4].
#define TWIN_BOXES(P)                                                                        \
  void P##_box_convert_forward(const float *in, float *out, int64_t boxes, bool to_xyxy);    \
  void P##_box_convert_backward(const float *dout, float *din, int64_t boxes, bool to_xyxy); \
  void P##_box_giou_forward(const float *a, const float *b, float *out, int64_t n);          \
  void P##_box_giou_backward(const float *a, const float *b, const float *dout, float *da, float *db, int64_t n);

// enact.c/.cu: ENACT (kernels/enact_math.h), every shape-setting step on the data's device: no host
// copy. Regions: starts/lengths [cap] (cap bounds the count) and image_offset [B + 1] (image b's
// regions are [image_offset[b], image_offset[b+1]); image_offset[B] is the count, read by the kernels
// where it lives).
// enact_cluster: K, V [M, d]; H [M]; signs [M] or NULL; Kc, Vc [cap, d], rows from the count on zero.
// dK, dV, dH may be NULL.
// enact_smooth: Gaussian smoothing of each image's valid h_b x w_b region of x [B, Hp*Wp] (zero
// outside it): taps [ntaps] centred, rows then columns (two_d), or along the valid pixels' row-major
// sequence. y [B, Hp*Wp] += result (0 on padding). Self-adjoint: backward is the same call on the
// gradient. workspace: B*Hp*Wp floats.
// enact_signs: the curvature sign of hsm [B, Hp*Wp] on each image's valid pixels (+1, -1), 0 on padding.
// enact_regions: maximal runs of equal sign within an image (0 ends a run), cap = M = B*N; workspace:
// enact_regions_workspace(M) bytes.
// enact_official_regions: the authors' chunks: one cluster size c for the batch from hsm [B, N]
// (written to *cluster_size), L = N / c chunks per image, cap = B*N; workspace: B int64.
// cluster_attention: each query row of image b over image b's clusters only, per head of hd:
// o[b, n, h] = out_scale sum_j P_j v[j, h], P = softmax_j(scale q[b, n, h] . k[j, h]) over
// j in [image_offset[b], image_offset[b+1]); q, o [B, N, heads*hd], k, v [cap, heads*hd], lse [B, heads, N]
// (the log of each softmax's normaliser, which the backward recomputes P from). Dropout p on P
// (0: none) with the draw (seed, offset): kernels/enact_math.h, cluster_attention_keep. Backward:
// dq, dk, dv accumulate; workspace: B*heads*N floats.
#define TWIN_ENACT(P)                                                                                                \
  void P##_enact_cluster_forward(const float *K, const float *V, const float *H, const float *signs,                 \
                                 const int64_t *starts, const int64_t *lengths, const int64_t *count, int64_t cap,   \
                                 int64_t d, float *Kc, float *Vc);                                                   \
  void P##_enact_cluster_backward(const float *K, const float *V, const float *H, const float *signs,                \
                                  const int64_t *starts, const int64_t *lengths, const int64_t *count, int64_t cap,  \
                                  int64_t d, const float *Kc, const float *Vc, const float *dKc, const float *dVc,   \
                                  float *dK, float *dV, float *dH);                                                  \
  void P##_enact_smooth(const float *x, float *y, int64_t B, int64_t Hp, int64_t Wp, const int64_t *valid_h,         \
                        const int64_t *valid_w, const float *taps, int64_t ntaps, bool two_d, float *workspace);     \
  void P##_enact_signs(const float *hsm, float *signs, int64_t B, int64_t Hp, int64_t Wp, const int64_t *valid_h,    \
                       const int64_t *valid_w, bool one_d);                                                          \
  size_t P##_enact_regions_workspace(int64_t M);                                                                     \
  void P##_enact_regions(const float *signs, int64_t B, int64_t N, int64_t *starts, int64_t *lengths,                \
                         int64_t *image_offset, void *workspace);                                                    \
  void P##_enact_official_regions(const float *hsm, int64_t B, int64_t N, int64_t *starts, int64_t *lengths,         \
                                  int64_t *image_offset, int64_t *cluster_size, double *mean_length,                 \
                                  int64_t *workspace);                                                               \
  void P##_cluster_attention_forward(const float *q, const float *k, const float *v, const int64_t *image_offset,    \
                                     int64_t B, int64_t N, int64_t heads, int64_t hd, float scale, float out_scale,  \
                                     float p, uint64_t seed, uint64_t offset, float *o, float *lse);                 \
  void P##_cluster_attention_backward(const float *q, const float *k, const float *v, const int64_t *image_offset,   \
                                      int64_t B, int64_t N, int64_t heads, int64_t hd, float scale, float out_scale, \
                                      float p, uint64_t seed, uint64_t offset, const float *o, const float *lse,     \
                                      const float *dout, float *dq, float *dk, float *dv, float *workspace);

// optim.c/.cu: AdamW over n elements (kernels/optim_math.h); scale in place.
#define TWIN_OPTIM(P)                                                                   \
  void P##_adamw(float *p, float *m, float *v, const float *g, int64_t n, AdamWStep s); \
  void P##_scale(float *x, int64_t n, float s);
