// Element math of frozen batch norm, layer norm and softmax, shared by CPU and CUDA kernels. The
// kernels own the reductions (row sums in double, in an order fixed by the shape); these functions
// turn the reduced statistics into outputs and gradients.
#pragma once
#include "kernels/common.h"
#include "kernels/elementwise_math.h"  // the ReLU the fused frozen batch norm ends in
#include "kernels/exp_math.h"          // the softmaxes' exponential

#include <math.h>

// FrozenBatchNorm2d folds its buffers into y = x * scale + shift (as the reference does).
DETR_HD void frozen_bn_scale_shift(float weight, float bias, float mean, float var, float eps, float *scale,
                                   float *shift) {
  float s = weight * (1.0f / sqrtf(var + eps));
  *scale = s;
  *shift = bias - mean * s;
}
DETR_HD float frozen_bn_elem(float x, float scale, float shift) { return x * scale + shift; }
// Fused with what follows it in a ResNet block (op_frozen_batchnorm2d_act): the residual added,
// then op_relu's own element function - the same float operations, in the same order, as the
// three ops one after another.
DETR_HD float frozen_bn_act_elem(float x, float scale, float shift, const float *residual, int64_t i, bool relu) {
  float v = frozen_bn_elem(x, scale, shift);
  if (residual) v = v + residual[i];
  return relu ? unary_forward(UNARY_RELU, v, 0.0f) : v;
}
// The ReLU's mask, kept for the backward in place of its output: bit i % 8 of byte i / 8 is y_i > 0
// (ceil(n / 8) bytes for n elements; the last byte's bits past n are 0). 1/32 of y's bytes, and y
// itself need not outlive the forward (in bf16 mode the next convolution keeps its bf16 copy).
DETR_HD uint8_t relu_mask_byte(const float *y, int64_t n) {  // y's first min(n, 8) elements
  uint8_t bits = 0;
  for (int t = 0; t < 8 && t < n; t++) bits |= (uint8_t)((y[t] > 0.0f) << t);
  return bits;
}
DETR_HD bool relu_mask_bit(const uint8_t *mask, int64_t i) { return (mask[i >> 3] >> (i & 7)) & 1; }
// The ReLU's gradient at the pre-activation from its mask, as op_relu's backward computes it (it
// passes y for x: y > 0 exactly where x > 0).
DETR_HD float frozen_bn_relu_grad(bool positive, float dy) {
  return unary_backward(UNARY_RELU, positive ? 1.0f : 0.0f, 0.0f, dy, 0.0f);
}

// Layer norm: y = (x - mean) * rstd * w + b, with the biased variance (torch) of the row.
DETR_HD float layernorm_rstd(double sum_sq_dev, int64_t n, float eps) {
  return (float)(1.0 / sqrt(sum_sq_dev / (double)n + eps));
}
DETR_HD float layernorm_xhat(float x, float mean, float rstd) { return (x - mean) * rstd; }
DETR_HD float layernorm_elem(float x, float mean, float rstd, float w, float b) { return (x - mean) * rstd * w + b; }
// dx_i = rstd * (g_i - mean(g) - xhat_i * mean(g * xhat)) with g = dy * w.
DETR_HD float layernorm_backward_elem(float g, float xhat, float rstd, float mean_g, float mean_g_xhat) {
  return rstd * (g - mean_g - xhat * mean_g_xhat);
}

// Softmax of a row: v = x + mask; m = max v; s = sum exp(v - m) (in double).
// y = exp(v - m) / s, log-softmax y = v - (m + log s). A row with m = -inf (every entry masked)
// has no distribution: zeros (log: -inf), and no gradient.
DETR_HD float softmax_input(float x, const float *mask_row, int64_t j) { return mask_row ? x + mask_row[j] : x; }
DETR_HD float log_sum_exp(float max, double sum) { return max + logf((float)sum); }
DETR_HD float softmax_inv_sum(double sum) { return (float)(1.0 / sum); }
DETR_HD float softmax_exp(float v, float max) { return exp_poly(v - max); }
DETR_HD float softmax_elem(float v, float max, float inv_sum) { return softmax_exp(v, max) * inv_sum; }

// Softmax: dx_i = y_i (dy_i - sum_j dy_j y_j). Log-softmax: dx_i = dy_i - exp(y_i) sum_j dy_j.
DETR_HD float softmax_backward_elem(float y, float dy, float dot) { return y * (dy - dot); }
DETR_HD float log_softmax_backward_elem(float y, float dy, float sum_dy) { return dy - expf(y) * sum_dy; }

// Cluster-wise argmax (kMaX-DeepLab's k-means assignment, op_cluster_argmax): logits x [Q, L] of
// one image and head; pixel l goes to the query with the largest logit in column l (the first on
// ties, as torch's max), or to none (-1) when the mask marks it padded (mask_row[l] != 0).
DETR_HD int cluster_winner(const float *x, int64_t Q, int64_t L, int64_t l, const float *mask_row) {
  if (mask_row && mask_row[l] != 0.0f) return -1;
  int best = 0;
  float m = x[l];
  for (int64_t q = 1; q < Q; q++) {
    float v = x[q * L + l];
    if (v > m) {
      m = v;
      best = (int)q;
    }
  }
  return best;
}
// The assignment weight of (query q, pixel l) given the pixel's winner and q's pixel count:
// 1 (sum) or 1 / count (mean) when the pixel went to q, else 0.
DETR_HD float cluster_weight(float winner, int64_t q, float count, bool mean) {
  if (winner != (float)q) return 0.0f;
  return mean ? 1.0f / count : 1.0f;
}
