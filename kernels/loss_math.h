// Element math of DETR's losses (weighted cross-entropy, L1, sigmoid focal), shared by the CPU kernels
// (kernels/cpu/loss.c) and the CUDA kernels (kernels/cuda/loss.cu). Box math: box_math.h.
#pragma once
#include "kernels/common.h"
#include "kernels/norm_math.h"

#include <math.h>

// Cross-entropy of row r with target t and class weight w: w * (lse_r - x_rt), summed in double;
// the loss is that sum over the sum of the weights (torch's weighted mean).
DETR_HD float cross_entropy_weight(const float *weight, int64_t target) { return weight ? weight[target] : 1.0f; }
DETR_HD double cross_entropy_term(float w, float lse, float x_target) { return (double)w * (lse - x_target); }
// d loss / d x_rc = w_r / sum(w) * (softmax_rc - [c == t_r]); w_scaled = w_r * dloss / sum(w).
DETR_HD float cross_entropy_backward_elem(float x, float lse, float w_scaled, int is_target) {
  return w_scaled * (expf(x - lse) - (is_target ? 1.0f : 0.0f));
}

// L1: |a - b| summed in double; its gradient is the sign (0 at the kink, as torch) times dloss.
DETR_HD float l1_elem(float a, float b) { return fabsf(a - b); }
DETR_HD float l1_backward_elem(float a, float b, float dloss) { return a > b ? dloss : (a < b ? -dloss : 0.0f); }

// Sigmoid focal loss of one logit x and binary target t (RetinaNet; Conditional DETR's
// models/segmentation.py sigmoid_focal_loss): alpha_t * BCE(x, t) * (1 - p_t)^gamma with
// p = sigmoid(x), p_t = t ? p : 1 - p, alpha_t = t ? alpha : 1 - alpha (alpha < 0: 1), and BCE as
// torch's binary_cross_entropy_with_logits, max(x, 0) - x t + log1p(exp(-|x|)).
DETR_HD float focal_alpha_t(int t, float alpha) { return alpha < 0.0f ? 1.0f : (t ? alpha : 1.0f - alpha); }
DETR_HD float focal_elem(float x, int t, float alpha, float gamma) {
  float p = 1.0f / (1.0f + expf(-x));
  float ce = fmaxf(x, 0.0f) - (t ? x : 0.0f) + log1pf(expf(-fabsf(x)));
  float m = t ? 1.0f - p : p;  // 1 - p_t
  return focal_alpha_t(t, alpha) * ce * powf(m, gamma);
}
// d/dx = alpha_t ((p - t) m^gamma + ce gamma m^(gamma-1) dm/dx), dm/dx = (t ? -1 : 1) p (1 - p).
DETR_HD float focal_backward_elem(float x, int t, float alpha, float gamma, float dloss) {
  float p = 1.0f / (1.0f + expf(-x));
  float ce = fmaxf(x, 0.0f) - (t ? x : 0.0f) + log1pf(expf(-fabsf(x)));
  float m = t ? 1.0f - p : p;
  float dm = (t ? -1.0f : 1.0f) * p * (1.0f - p);
  float modulated = m > 0.0f ? gamma * powf(m, gamma - 1.0f) * dm * ce : 0.0f;
  return dloss * focal_alpha_t(t, alpha) * ((p - (t ? 1.0f : 0.0f)) * powf(m, gamma) + modulated);
}
