// Geometry of 2-D convolution and pooling, shared by the CPU (im2col + sgemm) and CUDA (cuDNN,
// custom pooling) kernels.
#pragma once
#include "kernels/common.h"

typedef struct {
  int64_t batch, in_ch, in_h, in_w;  // input [batch, in_ch, in_h, in_w]
  int64_t out_ch, kh, kw;            // weight [out_ch, in_ch, kh, kw] (pooling: out_ch = in_ch)
  int64_t out_h, out_w;              // output [batch, out_ch, out_h, out_w]
  int stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  // 1: input and output are channels last, [batch, in_h, in_w, in_ch] and [batch, out_h, out_w,
  // out_ch] (the weight stays [out_ch, in_ch, kh, kw]); 0: as above.
  int channels_last;
  int unused;  // zero: keeps the struct free of padding bytes (caches compare geometries bytewise)
} ConvGeom;

// A constant weight's reordered copies, kept by the CPU's inference convolution (cpu_kernels.h).
typedef struct ConvWeightPack ConvWeightPack;

// The three passes of a convolution (each backend chooses its algorithm per pass).
typedef enum { CONV_PASS_FWD, CONV_PASS_BWD_DATA, CONV_PASS_BWD_WEIGHTS } ConvPass;

// Offset of element (b, c, s) of a map with `channels` channels and `plane` = h * w positions
// (s = y * w + x): [B, C, h, w] or, channels last, [B, h, w, C].
DETR_HD int64_t conv_offset(int channels_last, int64_t b, int64_t c, int64_t s, int64_t channels, int64_t plane) {
  return channels_last ? (b * plane + s) * channels + c : (b * channels + c) * plane + s;
}

// Channels last, the weight's taps move last for the sgemm (CPU) and cuDNN's NHWC filters (CUDA):
// element i of w [O, C, KH*KW] is element conv_weight_tap_major(i) of w' [O, KH*KW, C].
DETR_HD int64_t conv_weight_tap_major(int64_t i, int64_t channels, int64_t taps) {
  int64_t t = i % taps, c = (i / taps) % channels, o = i / (taps * channels);
  return (o * taps + t) * channels + c;
}

// The inverse: the (b, c, s) of flat index i of such a map.
DETR_HD void conv_decode(int channels_last, int64_t i, int64_t channels, int64_t plane, int64_t *b, int64_t *c,
                         int64_t *s) {
  if (channels_last) {
    *c = i % channels;
    *s = (i / channels) % plane;
    *b = i / (channels * plane);
  } else {
    *s = i % plane;
    *c = (i / plane) % channels;
    *b = i / (plane * channels);
  }
}

// torch's output size: floor((in + 2 pad - dil (k - 1) - 1) / stride) + 1.
DETR_HD int64_t conv_out_size(int64_t in, int64_t k, int stride, int pad, int dil) {
  return (in + 2 * pad - (int64_t)dil * (k - 1) - 1) / stride + 1;
}

// Input coordinate read by output coordinate o through kernel tap k (may be out of range: padding).
DETR_HD int64_t conv_in_coord(int64_t o, int64_t k, int stride, int pad, int dil) { return o * stride - pad + k * dil; }

// Max pooling's running choice over a window (torch semantics): v replaces the best so far when
// nothing is taken yet, when it is larger, or when it is NaN (NaN propagates). best_at < 0: none.
// Bitwise ors, not ||: no branch to mispredict (which tap wins is data).
DETR_HD int maxpool_takes(float v, float best, int32_t best_at) { return (best_at < 0) | (v > best) | (v != v); }

// The output coordinates o whose window can read input coordinate i (o * stride - pad + k * dil
// == i for some tap k < kernel): o in [*lo, *hi], empty when *lo > *hi. A superset where
// dil > 1 (taps skip inputs); the max-pool backward tests each candidate's argmax anyway.
DETR_HD void conv_out_range(int64_t i, int64_t kernel, int stride, int pad, int dil, int64_t out, int64_t *lo,
                            int64_t *hi) {
  int64_t first = i + pad - (kernel - 1) * dil;  // o * stride >= first
  *lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  int64_t last = (i + pad) / stride;  // o * stride <= i + pad (i + pad >= 0)
  *hi = last < out - 1 ? last : out - 1;
}

// --- depthwise convolution: stride 1, zero padding k / 2 (odd k), one k x k filter per channel ---
// Planes are [H, W]; w_c is the channel's filter [k, k]. The output has the input's size.

typedef struct {
  int64_t planes, channels, H, W;  // x and y [planes / channels, channels, H, W]
  int k;                           // odd
} DwConvGeom;

// The output at (y, x) of one plane, before the bias: the taps over the zero-padded plane.
DETR_HD float dwconv_at(const float *plane, const float *w_c, int64_t H, int64_t W, int k, int64_t y, int64_t x) {
  int r = k / 2;
  float acc = 0.0f;
  for (int ky = 0; ky < k; ky++) {
    int64_t iy = y + ky - r;
    if (iy < 0 || iy >= H) continue;
    for (int kx = 0; kx < k; kx++) {
      int64_t ix = x + kx - r;
      if (ix >= 0 && ix < W) acc += plane[iy * W + ix] * w_c[ky * k + kx];
    }
  }
  return acc;
}

// The input gradient at (y, x) of one plane: every output that read it, each through its tap
// (the filter mirrored over dy).
DETR_HD float dwconv_input_grad_at(const float *dy_plane, const float *w_c, int64_t H, int64_t W, int k, int64_t y,
                                   int64_t x) {
  int r = k / 2;
  float acc = 0.0f;
  for (int ky = 0; ky < k; ky++) {
    int64_t oy = y - ky + r;
    if (oy < 0 || oy >= H) continue;
    for (int kx = 0; kx < k; kx++) {
      int64_t ox = x - kx + r;
      if (ox >= 0 && ox < W) acc += dy_plane[oy * W + ox] * w_c[ky * k + kx];
    }
  }
  return acc;
}

// Part of one plane's contribution to the filter gradient at tap (ky, kx): the sum over the
// output pixels first, first + step, ... of dy times the input the tap read, in double.
DETR_HD double dwconv_weight_grad_part(const float *x_plane, const float *dy_plane, int64_t H, int64_t W, int k, int ky,
                                       int kx, int64_t first, int64_t step) {
  int r = k / 2;
  double acc = 0.0;
  for (int64_t p = first; p < H * W; p += step) {
    int64_t y = p / W, x = p % W, iy = y + ky - r, ix = x + kx - r;
    if (iy >= 0 && iy < H && ix >= 0 && ix < W) acc += (double)dy_plane[p] * (double)x_plane[iy * W + ix];
  }
  return acc;
}
