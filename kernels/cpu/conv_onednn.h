// Convolution on oneDNN (conv_onednn.c), one pass at a time; conv.c chooses where it runs. Buffers
// are plain: x [B, C, H, W], w [O, C, KH, KW], y [B, O, HO, WO], bias [O] (channels last: x
// [B, H, W, C], y [B, HO, WO, O]).
#pragma once
#include "kernels/cpu/cpu_kernels.h"

#if DETR_HAVE_ONEDNN
// impl (cpu_kernels.h): CONV_IMPL_ONEDNN runs oneDNN's direct convolution on the layouts it picks
// (nChw16c activations and blocked weights on AVX-512; channels last on nhwc itself), with reorders
// from and to the plain buffers; CONV_IMPL_ONEDNN_PLAIN on nchw/oihw itself;
// CONV_IMPL_ONEDNN_WINOGRAD its Winograd convolution on the layouts it picks, or where oneDNN has
// none for the geometry (or the CPU), what CONV_IMPL_ONEDNN runs.
//   CONV_PASS_FWD:          in0 x, in1 w, out y (overwritten), bias [O] added, or NULL.
//   CONV_PASS_BWD_DATA:     in0 dy, in1 w, out dx (accumulated, or written when !accumulate), bias NULL.
//   CONV_PASS_BWD_WEIGHTS:  in0 x, in1 dy, out dw (accumulated, or written when !accumulate), bias
//                           dbias (accumulated) or NULL.
// accumulate: false for the forward. workspace: onednn_conv2d_workspace_floats(g, pass, impl,
// accumulate, bias != NULL) floats, 64-byte aligned (the reordered copies and oneDNN's scratchpad).
// in16: NULL, or {in0's, in1's} dense bf16 copies on the plain layout, either NULL: read as they
// are instead of the pass converting in0 (in1) itself, where the pass reads that input in bf16 on
// its plain layout (CONV_IMPL_ONEDNN_BF16 on channels-last activations; it fails elsewhere). The
// fp32 input may then be NULL.
void onednn_conv2d_run(const ConvGeom *g, ConvPass pass, ConvImpl impl, bool accumulate, const float *in0,
                       const float *in1, const uint16_t *const *in16, float *out, float *bias, float *workspace);
int64_t onednn_conv2d_workspace_floats(const ConvGeom *g, ConvPass pass, ConvImpl impl, bool accumulate, bool bias);
// The forward with a fused epilogue (inference: no backward reads it): y = relu?(conv(x, w) + bias
// + y), post CONV_POST_* or'ed; with CONV_POST_SUM y holds the residual before the call. The same
// primitive as onednn_conv2d_run's forward with oneDNN's sum and eltwise post-ops (where oneDNN's
// Winograd takes no post-ops, its direct convolution).
// pack: w's kept copies (cpu_kernels.h; the workspace then holds no weight copy), or NULL
// (reordered into the workspace each call).
void onednn_conv2d_forward_post(const ConvGeom *g, ConvImpl impl, unsigned post, const float *x, const float *w,
                                float *y, const float *bias, float *workspace, ConvWeightPack *pack);
int64_t onednn_conv2d_forward_post_workspace_floats(const ConvGeom *g, ConvImpl impl, bool bias, unsigned post,
                                                    bool packed);
// Whether oneDNN has Winograd on this CPU (AVX-512; probed once).
bool onednn_conv2d_has_winograd(void);
// The workspace (onednn_conv2d_workspace_floats) a Winograd pass of g would take, or -1 where
// oneDNN has no Winograd for it; from the descriptor, no primitive is made.
int64_t onednn_conv2d_winograd_workspace_floats(const ConvGeom *g, ConvPass pass);
// The implementation oneDNN chose for the pass, e.g. "jit:avx512_core" or "jit_wino_4x3:avx512_core"
// (bench_ops prints it; the tests check that Winograd runs where the CPU has it).
const char *onednn_conv2d_impl(const ConvGeom *g, ConvPass pass, ConvImpl impl);
// Passes whose whole batch of x and y fits in `bytes` run as one primitive, larger ones one image
// at a time (default 8 MiB; negative: the default; 0: always per image, which tests use). Returns
// the setting before.
int64_t onednn_conv2d_set_whole_batch_bytes(int64_t bytes);
#else
// Without oneDNN cpu_conv2d_impl never chooses it: conv.c's calls compile but never run.
static inline int64_t onednn_conv2d_set_whole_batch_bytes(int64_t bytes) {
  (void)bytes;
  return 0;
}
static inline bool onednn_conv2d_has_winograd(void) { return false; }
static inline int64_t onednn_conv2d_winograd_workspace_floats(const ConvGeom *g, ConvPass pass) {
  (void)g, (void)pass;
  return -1;
}
static inline const char *onednn_conv2d_impl(const ConvGeom *g, ConvPass pass, ConvImpl impl) {
  (void)g, (void)pass, (void)impl;
  DETR_FAIL("conv2d: this build has no oneDNN");
}
static inline void onednn_conv2d_run(const ConvGeom *g, ConvPass pass, ConvImpl impl, bool accumulate, const float *in0,
                                     const float *in1, const uint16_t *const *in16, float *out, float *bias,
                                     float *workspace) {
  DETR_FAIL("conv2d: this build has no oneDNN");
}
static inline void onednn_conv2d_forward_post(const ConvGeom *g, ConvImpl impl, unsigned post, const float *x,
                                              const float *w, float *y, const float *bias, float *workspace,
                                              ConvWeightPack *pack) {
  DETR_FAIL("conv2d: this build has no oneDNN");
}
static inline int64_t onednn_conv2d_forward_post_workspace_floats(const ConvGeom *g, ConvImpl impl, bool bias,
                                                                  unsigned post, bool packed) {
  (void)g, (void)impl, (void)bias, (void)post;
  DETR_FAIL("conv2d: this build has no oneDNN");
}
static inline int64_t onednn_conv2d_workspace_floats(const ConvGeom *g, ConvPass pass, ConvImpl impl, bool accumulate,
                                                     bool bias) {
  (void)g, (void)pass, (void)impl, (void)accumulate, (void)bias;
  DETR_FAIL("conv2d: this build has no oneDNN");
}
#endif
