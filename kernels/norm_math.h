// Element math of frozen batch norm, layer norm and softmax, shared by CPU and CUDA kernels.
#pragma once
#include "kernels/common.h"

#include <math.h>

// FrozenBatchNorm2d folds its buffers into y = x * scale + shift (as the reference does).
DETR_HD void frozen_bn_scale_shift(float weight, float bias, float mean, float var, float eps,
                                   float *scale, float *shift) {
  float s = weight * (1.0f / sqrtf(var + eps));
  *scale = s;
  *shift = bias - mean * s;
}

// Layer norm: y = (x - mean) * rstd * w + b.
DETR_HD float layernorm_elem(float x, float mean, float rstd, float w, float b) {
  return (x - mean) * rstd * w + b;
}
// dx_i = rstd * (g_i - mean(g) - xhat_i * mean(g * xhat)) with g = dy * w.
DETR_HD float layernorm_backward_elem(float g, float xhat, float rstd, float mean_g,
                                      float mean_g_xhat) {
  return rstd * (g - mean_g - xhat * mean_g_xhat);
}

// Softmax: dx_i = y_i (dy_i - sum_j dy_j y_j). Log-softmax: dx_i = dy_i - exp(y_i) sum_j dy_j.
DETR_HD float softmax_backward_elem(float y, float dy, float dot) { return y * (dy - dot); }
DETR_HD float log_softmax_backward_elem(float y, float dy, float sum_dy) {
  return dy - expf(y) * sum_dy;
}
