// AdamW's element update (torch.optim.AdamW, decoupled weight decay), shared by the CPU and CUDA
// optimizer kernels.
#pragma once
#include "kernels/common.h"

#include <math.h>

typedef struct {
  float lr, beta1, beta2, eps, weight_decay;
  float bias_correction1;       // 1 - beta1^step
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
} AdamWStep;

// torch's order of operations: p *= 1 - lr wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps).
DETR_HD void adamw_update(float *p, float *m, float *v, float g, AdamWStep s) {
  float param = *p * (1.0f - s.lr * s.weight_decay);
  float mm = *m * s.beta1 + g * (1.0f - s.beta1);
  float vv = *v * s.beta2 + g * g * (1.0f - s.beta2);
  float denom = sqrtf(vv) / s.bias_correction2_sqrt + s.eps;
  *p = param - (s.lr / s.bias_correction1) * (mm / denom);
  *m = mm;
  *v = vv;
}

// Gradient clipping (torch's clip_grad_norm_): the global norm is sqrt of the sum over all
// gradients of x^2 (in double); gradients are scaled by this coefficient when it is below 1.
DETR_HD double sum_squares_term(float x) { return (double)x * x; }
DETR_HD double clip_coefficient(float max_norm, double norm) { return max_norm / (norm + 1e-6); }
