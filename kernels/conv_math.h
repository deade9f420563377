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
