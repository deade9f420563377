// Geometry of 2-D convolution and pooling, shared by the CPU (im2col + sgemm) and CUDA (cuDNN,
// custom pooling) kernels.
#pragma once
#include "kernels/common.h"

typedef struct {
  int64_t batch, in_ch, in_h, in_w;   // input [batch, in_ch, in_h, in_w]
  int64_t out_ch, kh, kw;             // weight [out_ch, in_ch, kh, kw] (pooling: out_ch = in_ch)
  int64_t out_h, out_w;               // output [batch, out_ch, out_h, out_w]
  int stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
} ConvGeom;

// torch's output size: floor((in + 2 pad - dil (k - 1) - 1) / stride) + 1.
DETR_HD int64_t conv_out_size(int64_t in, int64_t k, int stride, int pad, int dil) {
  return (in + 2 * pad - (int64_t)dil * (k - 1) - 1) / stride + 1;
}

// Input coordinate read by output coordinate o through kernel tap k (may be out of range: padding).
DETR_HD int64_t conv_in_coord(int64_t o, int64_t k, int stride, int pad, int dil) {
  return o * stride - pad + k * dil;
}

// Max pooling's running choice over a window (torch semantics): v replaces the best so far when
// nothing is taken yet, when it is larger, or when it is NaN (NaN propagates). best_at < 0: none.
DETR_HD int maxpool_takes(float v, float best, int32_t best_at) {
  return best_at < 0 || v > best || v != v;
}

// The output coordinates o whose window can read input coordinate i (o * stride - pad + k * dil
// == i for some tap k < kernel): o in [*lo, *hi], empty when *lo > *hi. A superset where
// dil > 1 (taps skip inputs); the max-pool backward tests each candidate's argmax anyway.
DETR_HD void conv_out_range(int64_t i, int64_t kernel, int stride, int pad, int dil, int64_t out,
                            int64_t *lo, int64_t *hi) {
  int64_t first = i + pad - (kernel - 1) * dil;  // o * stride >= first
  *lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  int64_t last = (i + pad) / stride;  // o * stride <= i + pad (i + pad >= 0)
  *hi = last < out - 1 ? last : out - 1;
}
