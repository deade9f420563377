#include "train/optim.h"

#include <math.h>
#include <stdlib.h>

#include "autograd/autograd.h"
#include "kernels/cpu/cpu_kernels.h"
#if DETR_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

OptimConfig optim_config_default(void) {
  return (OptimConfig){.lr = 1e-4f,
                       .lr_backbone = 1e-5f,
                       .weight_decay = 1e-4f,
                       .beta1 = 0.9f,
                       .beta2 = 0.999f,
                       .eps = 1e-8f,
                       .clip_max_norm = 0.1f,
                       .lr_drop = 200};
}

void adamw_init(AdamW *opt, ParamStore *params, OptimConfig cfg) {
  *opt = (AdamW){.cfg = cfg, .params = params};
  opt->exp_avg = detr_calloc((size_t)(2 * params->count), sizeof(Tensor *), "adamw_init exp_avg");
  opt->exp_avg_sq = opt->exp_avg + params->count;
  for (int i = 0; i < params->count; i++) {
    const Param *p = &params->items[i];
    if (p->kind != PARAM_TRAINABLE) continue;
    opt->exp_avg[i] = tensor_zeros(params->device, p->tensor->shape);
    opt->exp_avg_sq[i] = tensor_zeros(params->device, p->tensor->shape);
  }
}

void adamw_free(AdamW *opt) {
  if (!opt->exp_avg) return;
  for (int i = 0; i < opt->params->count; i++) {
    tensor_release(opt->exp_avg[i]);
    tensor_release(opt->exp_avg_sq[i]);
  }
  free(opt->exp_avg);
  opt->exp_avg = opt->exp_avg_sq = NULL;
}

float adamw_lr(const AdamW *opt, LrGroup group) {
  float base = group == LR_GROUP_BACKBONE ? opt->cfg.lr_backbone : opt->cfg.lr;
  int drops = opt->cfg.lr_drop > 0 ? opt->epoch / opt->cfg.lr_drop : 0;
  for (int i = 0; i < drops; i++) base *= 0.1f;  // StepLR(gamma 0.1), applied per drop as torch
  return base;
}

// Sum of squares of the trainable gradients that live on dev. CPU: the gradients in a fixed order,
// each summed by cpu_sum_squares' fixed tree (any thread count gives the same double). CUDA: each
// gradient's CUDA_SUM_SQUARES_PARTIALS partial sums, then one fixed-order sum of them all, read
// back with one copy: the only synchronisation of the optimizer step.
static double grad_sum_squares(ParamStore *params, Device dev) {
  double sum = 0.0;
  int count = 0;
  for (int i = 0; i < params->count; i++) {
    Tensor *t = params->items[i].tensor;
    if (params->items[i].kind != PARAM_TRAINABLE || !t->grad || t->device != dev) continue;
    if (dev == DEVICE_CPU) sum += cpu_sum_squares(t->grad->data, t->numel);
    count++;
  }
#if DETR_HAVE_CUDA
  if (dev == DEVICE_CUDA && count > 0) {
    int64_t n_partials = (int64_t)count * CUDA_SUM_SQUARES_PARTIALS;
    size_t bytes = (size_t)(n_partials + 1) * sizeof(double);
    double *partials = detr_alloc(DEVICE_CUDA, bytes);  // [count * PARTIALS] then the total [1]
    int k = 0;
    for (int i = 0; i < params->count; i++) {
      Tensor *t = params->items[i].tensor;
      if (params->items[i].kind != PARAM_TRAINABLE || !t->grad || t->device != dev) continue;
      cuda_sum_squares_partials(t->grad->data, t->numel, partials + (int64_t)k++ * CUDA_SUM_SQUARES_PARTIALS);
    }
    cuda_sum_doubles(partials, n_partials, partials + n_partials);
    cuda_memcpy_d2h(&sum, partials + n_partials, sizeof sum);
    detr_free(DEVICE_CUDA, partials, bytes);
  }
#endif
  return sum;
}

double clip_grad_norm(ParamStore *params, float max_norm) {
  double norm = sqrt(grad_sum_squares(params, DEVICE_CPU) + grad_sum_squares(params, DEVICE_CUDA));
  if (max_norm > 0.0f) {
    double coef = clip_coefficient(max_norm, norm);
    if (coef < 1.0)
      for (int i = 0; i < params->count; i++) {
        Tensor *t = params->items[i].tensor;
        if (params->items[i].kind != PARAM_TRAINABLE || !t->grad) continue;
        if (t->device == DEVICE_CPU) {
          cpu_scale(t->grad->data, t->numel, (float)coef);
        } else {
#if DETR_HAVE_CUDA
          cuda_scale(t->grad->data, t->numel, (float)coef);
#endif
        }
      }
  }
  return norm;
}

// The element constants of this step for parameter p (opt->step already counts it).
static AdamWStep step_constants(const AdamW *opt, const Param *p) {
  double bc1 = 1.0 - pow(opt->cfg.beta1, (double)opt->step), bc2 = 1.0 - pow(opt->cfg.beta2, (double)opt->step);
  return (AdamWStep){.lr = adamw_lr(opt, p->group),
                     .beta1 = opt->cfg.beta1,
                     .beta2 = opt->cfg.beta2,
                     .eps = opt->cfg.eps,
                     .weight_decay = opt->cfg.weight_decay,
                     .bias_correction1 = (float)bc1,
                     .bias_correction2_sqrt = (float)sqrt(bc2)};
}

void adamw_step(AdamW *opt) {
  opt->step++;
  for (int i = 0; i < opt->params->count; i++) {
    Param *p = &opt->params->items[i];
    if (p->kind != PARAM_TRAINABLE || !p->tensor->grad) continue;
    DETR_CHECK(!p->tensor->bf16, "adamw_step: %s is kept in bf16 for inference (tensor_keep_bf16): it cannot train",
               p->name);
    AdamWStep s = step_constants(opt, p);
    Tensor *t = p->tensor;
    float *m = opt->exp_avg[i]->data, *v = opt->exp_avg_sq[i]->data;
    if (t->device == DEVICE_CPU) {
      cpu_adamw(t->data, m, v, t->grad->data, t->numel, s);
    } else {
#if DETR_HAVE_CUDA
      cuda_adamw(t->data, m, v, t->grad->data, t->numel, s);  // queued: no synchronisation
#endif
    }
  }
}

double adamw_clip_step(AdamW *opt, float max_norm) {
  ParamStore *params = opt->params;
  if (params->device != DEVICE_CPU) {  // CUDA: the three steps, queued without synchronisation
    double norm = clip_grad_norm(params, max_norm);
    adamw_step(opt);
    for (int i = 0; i < params->count; i++) autograd_drop_grad(&params->items[i].tensor, 1);
    return norm;
  }
  AdamWTensor *ts = detr_malloc(sizeof(AdamWTensor) * (size_t)params->count, "adamw_clip_step tensors");
  const float **grads = detr_malloc(sizeof(float *) * (size_t)params->count, "adamw_clip_step grads");
  int64_t *sizes = detr_malloc(sizeof(int64_t) * (size_t)params->count, "adamw_clip_step sizes");
  opt->step++;
  int n = 0;
  for (int i = 0; i < params->count; i++) {
    Param *p = &params->items[i];
    Tensor *t = p->tensor;
    if (p->kind != PARAM_TRAINABLE || !t->grad) continue;
    DETR_CHECK(!t->bf16, "adamw_clip_step: %s is kept in bf16 for inference (tensor_keep_bf16): it cannot train",
               p->name);
    ts[n] = (AdamWTensor){.p = t->data,
                          .m = opt->exp_avg[i]->data,
                          .v = opt->exp_avg_sq[i]->data,
                          .g = t->grad->data,
                          .n = t->numel,
                          .s = step_constants(opt, p)};
    grads[n] = t->grad->data, sizes[n] = t->numel, n++;
  }
  double norm = sqrt(cpu_sum_squares_multi(grads, sizes, n));
  double coef = max_norm > 0.0f ? clip_coefficient(max_norm, norm) : 1.0;
  cpu_adamw_multi(ts, n, coef < 1.0 ? (float)coef : 1.0f);
  // Every gradient is released (those of parameters the step skips too): the next backward makes
  // them afresh (autograd_drop_grad).
  for (int i = 0; i < params->count; i++) autograd_drop_grad(&params->items[i].tensor, 1);
  free(ts), free(grads), free(sizes);
  return norm;
}
