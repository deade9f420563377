// Element math of DETR's losses (weighted cross-entropy, L1), shared by the CPU kernels
// (kernels/cpu/loss.c) and the CUDA kernels (kernels/cuda/loss.cu). Box math: box_math.h.
#pragma once
#include "kernels/common.h"
#include "kernels/norm_math.h"

#include <math.h>

// Cross-entropy of row r with target t and class weight w: w * (lse_r - x_rt), summed in double;
// the loss is that sum over the sum of the weights (torch's weighted mean).
DETR_HD float cross_entropy_weight(const float *weight, int64_t target) {
  return weight ? weight[target] : 1.0f;
}
DETR_HD double cross_entropy_term(float w, float lse, float x_target) {
  return (double)w * (lse - x_target);
}
// d loss / d x_rc = w_r / sum(w) * (softmax_rc - [c == t_r]); w_scaled = w_r * dloss / sum(w).
DETR_HD float cross_entropy_backward_elem(float x, float lse, float w_scaled, int is_target) {
  return w_scaled * (expf(x - lse) - (is_target ? 1.0f : 0.0f));
}

// L1: |a - b| summed in double; its gradient is the sign (0 at the kink, as torch) times dloss.
DETR_HD float l1_elem(float a, float b) { return fabsf(a - b); }
DETR_HD float l1_backward_elem(float a, float b, float dloss) {
  return a > b ? dloss : (a < b ? -dloss : 0.0f);
}
