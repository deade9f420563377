// CPU kernels: raw compute on float pointers. Backward kernels *accumulate* into their gradient
// outputs (dx += ...), so autograd can sum contributions without temporaries.
#pragma once
#include <stdbool.h>

#include "kernels/common.h"
#include "kernels/conv_math.h"
#include "kernels/elementwise_math.h"
#include "kernels/kernel_twins.h"
#include "kernels/optim_math.h"

// cpu_runtime.c: called first thing in main(argv). Puts in the environment what libgomp reads as
// it loads (a short spin before a waiting thread sleeps) and starts the program again, once; a
// setting the user made is kept. Returns when nothing needed setting.
void cpu_runtime_setup(char **argv);

// Whether oneDNN runs its AVX-512 kernels on this CPU (cpu_runtime.c; DNNL_MAX_CPU_ISA honoured; false
// without oneDNN). Below AVX-512 some passes and GEMMs are faster elsewhere: cpu_conv2d_impl's
// rules, cpu_gemm's. Safe from any thread.
bool cpu_has_avx512(void);

// bf16 mixed precision (cpu_runtime.c): the GEMM-shaped kernels (convolutions, cpu_gemm) round
// their inputs to bf16 and accumulate in fp32 where that is the faster per shape; everything else
// stays fp32. Process-wide, off by default. cpu_bf16_supported: whether this build and CPU run bf16
// at the hardware's rate (oneDNN with AVX512-BF16 or AMX-BF16); if not, `why` names what is missing.
bool cpu_bf16_supported(char *why, size_t why_cap);
void cpu_set_bf16(bool on);  // fails where cpu_bf16_supported does not hold
bool cpu_bf16_enabled(void);

// The kernels of kernel_twins.h, each family under its file's name, and the CPU's own.
// elementwise.c
TWIN_ELEMENTWISE(cpu)

// reduce.c: x viewed as [outer, n, inner]; y [outer, inner] = scale * sum over n.
TWIN_REDUCE(cpu)

// matmul.c: row-major C[M,N] = alpha op(A) op(B) + beta C, and its strided-batched form.
TWIN_MATMUL(cpu)
const char *cpu_gemm_library(char *name,
                             size_t cap);  // into name, returned: e.g. "oneDNN 2.6 sgemm", "OpenBLAS sgemm (Haswell)"
// Whether cpu_gemm's fp32 GEMM of that transposition and C [m, n] runs on OpenBLAS (always without
// oneDNN; with it, some A^T B below AVX-512: matmul.c says which, and why).
bool cpu_gemm_on_openblas(bool trans_a, bool trans_b, int64_t m, int64_t n);
// matmul_bf16.c: cpu_gemm_batched's operation with A and B rounded to bf16 and fp32 accumulation,
// when bf16 is on (cpu_set_bf16) and the GEMM is large enough to gain (and, batched, not narrow);
// false (nothing done) otherwise. cpu_gemm and cpu_gemm_batched call it first.
bool cpu_gemm_bf16_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                           int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, float beta,
                           float *c, int64_t ldc, int64_t stride_c, int64_t batch);
// A batch whose m or n is under this stays fp32 (48; a negative width restores it): returns the
// previous width. For bench_ops, which times what bf16 would do below it.
int64_t cpu_gemm_bf16_set_min_batched_width(int64_t width);
TWIN_GEMM_BF16(cpu)
// y [rows, out] = relu?(x W^T + bias) in bf16 with W given rounded (w16 [out, in]: a weight kept in
// bf16, tensor_keep_bf16), x rounded here, fp32 accumulation, the bias and ReLU as the matmul's
// epilogue. False (nothing done) where bf16 is off, inside a parallel region, or the GEMM too small
// to gain (LINEAR_BF16_KEPT_MIN_MACS_PER_THREAD): the caller runs its fp32 path.
bool cpu_linear_bf16(const float *x, const uint16_t *w16, const float *bias, bool relu, float *y, int64_t rows,
                     int64_t in, int64_t out);
// The same on x already rounded (x16 [rows, in]), whatever the size: training's bf16 linear layer,
// which keeps both copies for its backward. The epilogue's floats are those of the GEMM and then
// cpu_add_row_bias (measured bit for bit on oneDNN 2.6, Zen 4; bench/README.md#bench_step).
void cpu_linear_bf16_rounded(const uint16_t *x16, const uint16_t *w16, const float *bias, bool relu, float *y,
                             int64_t rows, int64_t in, int64_t out);
// The inference path's linear layer (op_linear with nothing recorded): y [rows, out] = relu?(x [rows,
// in] W^T + bias) on oneDNN's fp32 matmul with the bias (NULL: none) and ReLU as its epilogue - one
// pass over y instead of sgemm's and the bias pass's two. False (nothing done) without oneDNN or
// inside a parallel region: the caller runs cpu_gemm and cpu_add_row_bias. Sums in another order
// than sgemm's: the training path's results within fp32 rounding, not its bits.
bool cpu_linear_fused(const float *x, const float *w, const float *bias, bool relu, float *y, int64_t rows, int64_t in,
                      int64_t out);

// conv.c: im2col + sgemm, or oneDNN (conv_onednn.c) where it is the faster (bench/README.md#bench_ops).
// workspace: cpu_conv2d_forward_workspace_floats(g) floats for the forward,
// cpu_conv2d_backward_workspace_floats(g, ...) for a backward with the same gradients and flags
// (im2col's column chunk, or oneDNN's layout copies and scratchpad: the caller takes it from the
// tensor allocator, as cuDNN's, so that it is memory only while a pass runs).
int64_t cpu_conv2d_forward_workspace_floats(const ConvGeom *g, bool bias);
int64_t cpu_conv2d_backward_workspace_floats(const ConvGeom *g, bool dx, bool set_dx, bool dw, bool set_dw, bool dbias);
void cpu_conv2d_forward(const float *x, uint16_t *x16, const float *w, const float *bias, float *y, const ConvGeom *g,
                        float *workspace);
// dx, dw, dbias may be NULL; x is read for dw only, w for dx only (the other may be NULL). The
// gradients accumulate, but dx (dw) is written when set_dx (set_dw): its old contents may be
// garbage (a fresh buffer, autograd_grad_to_write).
void cpu_conv2d_backward(const float *x, const uint16_t *x16, const float *w, const float *dy, uint16_t *dy16,
                         float *dx, bool set_dx, float *dw, bool set_dw, float *dbias, const ConvGeom *g,
                         float *workspace);
// bf16 mode's activations rounded once. x is read by the forward and backward-weights, dy by
// backward-data and backward-weights, and each such pass that runs in bf16 rounds its operands
// itself. cpu_conv2d_takes_bf16: whether `pass` of g, on the implementation cpu_conv2d_impl picks,
// reads its activations as bf16 on their own layout - oneDNN's bf16 direct convolution on
// channels-last activations, or a 1x1's GEMM in bf16 - and so can read dense bf16 copies of them
// in place of rounding them itself: the same bits (but for a stride-2 1x1's GEMM in chunks, whose
// short last chunk cpu_gemm might run in fp32 and the copies run in bf16: one more rounding there,
// within bf16's bound). The forward's x16 is NULL or room for cpu_conv2d_x16_numel(g) bf16 values,
// which it fills - with x rounded (cpu_round_bf16), [B, H, W, C], or where a strided 1x1's forward
// and backward-weights are both bf16 GEMMs, with the pixels they read, [B, HO, WO, C] - and reads
// where it takes the copy; the backward's x16 is NULL or that copy, its dy16 NULL or room for dy,
// which it rounds dy into once for its passes. A pass that does not take a copy ignores it; x may be NULL where every pass
// that reads x takes x16 (dy is always given: dbias reads it), and backward-weights' GEMM takes
// x16 only with dy16. op_conv2d rounds x in the forward where both of its passes take the copy and
// keeps it for the backward in place of x (less memory; the step's time is the same), and dy where
// both of its passes take it (bench/README.md#bench_step, `--precision bf16`).
bool cpu_conv2d_takes_bf16(const ConvGeom *g, ConvPass pass);
int64_t cpu_conv2d_x16_numel(const ConvGeom *g);
// Inference's convolution with its epilogue fused (no backward: nothing is kept for one):
// y = relu?(conv(x, w) + bias + residual), residual of y's shape or NULL (it may be y itself).
// On oneDNN through its post-ops (CONV_POST_SUM of the residual copied into y, CONV_POST_RELU), on
// the implementation cpu_conv2d_impl picks for the forward; im2col + sgemm adds them after.
#define CONV_POST_SUM 1u
#define CONV_POST_RELU 2u
// pack: w's reordered copies kept between calls (below), or NULL; the workspace is smaller with one
// (packed: pack != NULL).
int64_t cpu_conv2d_forward_fused_workspace_floats(const ConvGeom *g, bool bias, bool residual, bool relu, bool packed);
void cpu_conv2d_forward_fused(const float *x, const float *w, const float *bias, const float *residual, bool relu,
                              float *y, const ConvGeom *g, float *workspace, ConvWeightPack *pack);
// A constant weight's copies in the layouts oneDNN's primitives take it in (conv_onednn.c), made
// on first use and kept: inference's folded weights never change, so each is reordered once
// instead of in every forward. One pack per weight, which must not change while the pack lives
// (its first use binds the pack to that buffer); owned by whoever owns the weight. A layout it
// lacks (Winograd's or the direct convolution's, nchw's or channels last's, bf16's) is added, up to
// four, the least recently used dropped; an input size whose primitive takes a layout already
// kept reuses it.
ConvWeightPack *conv_weight_pack_new(void);
void conv_weight_pack_free(ConvWeightPack *pack);
// Which implementation runs each pass of a convolution. AUTO: the faster for the shape and pass;
// the others force one everywhere (bench_ops and bench_step compare them): im2col + sgemm, oneDNN
// on its blocked layouts (reorders around), oneDNN on plain nchw, oneDNN's Winograd F(4x4, 3x3) on
// its blocked layouts (where oneDNN has none for the shape or this CPU, its direct convolution as
// CONV_IMPL_ONEDNN). CONV_IMPL_ONEDNN_BF16: oneDNN's direct convolution with its inputs rounded to
// bf16 (the reorders to its layouts convert) and fp32 accumulation and output, on a CPU with
// AVX512-BF16 or AMX (cpu_bf16_supported; AUTO picks it per pass under cpu_set_bf16). The oneDNN ones
// fail in a build without oneDNN.
typedef enum {
  CONV_IMPL_AUTO,
  CONV_IMPL_IM2COL,
  CONV_IMPL_ONEDNN,
  CONV_IMPL_ONEDNN_PLAIN,
  CONV_IMPL_ONEDNN_WINOGRAD,
  CONV_IMPL_ONEDNN_BF16
} ConvImpl;
void cpu_conv2d_set_impl(ConvImpl impl);
ConvImpl cpu_conv2d_impl(const ConvGeom *g, ConvPass pass);  // never AUTO
// A backward pass takes Winograd only when its workspace fits this (the backbone's backward is the
// step's memory peak). The workspace depends on the CPU: oneDNN blocks by its cache sizes.
#define CPU_WINOGRAD_BACKWARD_MAX_BYTES ((int64_t)24 << 20)
// Depthwise convolution, max pooling, frozen batch norm.
TWIN_CONV(cpu)

// softmax.c: softmax, cluster argmax, layer norm.
TWIN_SOFTMAX(cpu)

// shape.c; index_add: dx rows idx[i] += dy row i.
TWIN_SHAPE(cpu)
void cpu_index_add(const float *dy, const int64_t *idx, float *dx, int64_t n, int64_t row);

// loss.c (the boxes: TWIN_BOXES below)
// Returns the loss; writes each row's log-sum-exp to lse[rows].
float cpu_cross_entropy_forward(const float *logits, const int64_t *targets, const float *weight, float *lse,
                                int64_t rows, int64_t classes);
void cpu_cross_entropy_backward(const float *logits, const int64_t *targets, const float *weight, const float *lse,
                                float dloss, float *dlogits, int64_t rows, int64_t classes);
// Sigmoid focal loss summed over logits [rows, classes]; targets [rows] in [0, classes] (classes:
// no positive class in that row).
float cpu_focal_loss_forward(const float *logits, const int64_t *targets, int64_t rows, int64_t classes, float alpha,
                             float gamma);
void cpu_focal_loss_backward(const float *logits, const int64_t *targets, float dloss, float *dlogits, int64_t rows,
                             int64_t classes, float alpha, float gamma);
float cpu_l1_sum_forward(const float *a, const float *b, int64_t n);
void cpu_l1_sum_backward(const float *a, const float *b, float dloss, float *da, float *db, int64_t n);
TWIN_BOXES(cpu)

// enact.c: ENACT's clustering and smoothing.
TWIN_ENACT(cpu)

// optim.c: AdamW, scaling; the sum of squares in double.
TWIN_OPTIM(cpu)
double cpu_sum_squares(const float *x, int64_t n);
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
