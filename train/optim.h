// AdamW with DETR's two parameter groups (backbone at lr_backbone), gradient clipping at a global
// norm, and the step learning-rate schedule, with torch's arithmetic.
#pragma once
#include "nn/params.h"

typedef struct {
  float lr;                 // 1e-4
  float lr_backbone;        // 1e-5 (layer2-4 of the ResNet)
  float weight_decay;       // 1e-4
  float beta1, beta2, eps;  // 0.9, 0.999, 1e-8
  float clip_max_norm;      // 0.1; <= 0 disables clipping
  int lr_drop;              // multiply the learning rates by 0.1 every lr_drop epochs (StepLR)
} OptimConfig;

OptimConfig optim_config_default(void);

typedef struct {
  OptimConfig cfg;
  ParamStore *params;
  Tensor **exp_avg, **exp_avg_sq;  // [params->count]; NULL for non-trainable entries
  int64_t step;                    // steps taken (AdamW's bias-correction counter)
  int epoch;                       // sets the StepLR factor
} AdamW;

void adamw_init(AdamW *opt, ParamStore *params, OptimConfig cfg);
void adamw_free(AdamW *opt);
// The learning rate of a group at the current epoch.
float adamw_lr(const AdamW *opt, LrGroup group);
// Global L2 norm of all trainable gradients; when max_norm > 0 scales them by
// max_norm / (norm + 1e-6) if that is below 1 (torch's clip_grad_norm_). Returns the norm before.
double clip_grad_norm(ParamStore *params, float max_norm);
// One AdamW step on every trainable parameter with a gradient (clipping is the caller's).
void adamw_step(AdamW *opt);
// The training step's update: clip_grad_norm(max_norm), adamw_step, then every gradient released
// (autograd_drop_grad: as torch's zero_grad(set_to_none=True), a parameter that the next backward
// does not reach gets no gradient and so no AdamW step, where a zeroed gradient would still decay
// it; DETR's parameters all take part in every step). The same floats as the three calls, but on
// the CPU in two passes over the parameters (the norm; the update, which scales each gradient as
// it reads it), each one parallel region for all tensors. Returns the norm before clipping. (With
// several processes dist_allreduce_gradients gives every trainable parameter a gradient first -
// zeros where the backward did not reach it - so that the ranks reduce the same tensors.)
double adamw_clip_step(AdamW *opt, float max_norm);
