// Batch norm with frozen statistics and affine parameters (all four are buffers), eps 1e-5 as
// DETR's FrozenBatchNorm2d. Identity until weights are loaded: weight 1, bias 0, mean 0, var 1.
#include <stdlib.h>

#include "kernels/cpu/cpu_kernels.h"  // conv_weight_pack_new
#include "kernels/norm_math.h"
#include "nn/layers.h"

FrozenBn frozen_bn_create(ParamStore *ps, const char *prefix, int64_t channels) {
  FrozenBn bn = {
      .weight = params_add(ps, SHAPE(channels), PARAM_BUFFER, LR_GROUP_BACKBONE, "%s.weight", prefix),
      .bias = params_add(ps, SHAPE(channels), PARAM_BUFFER, LR_GROUP_BACKBONE, "%s.bias", prefix),
      .running_mean = params_add(ps, SHAPE(channels), PARAM_BUFFER, LR_GROUP_BACKBONE, "%s.running_mean", prefix),
      .running_var = params_add(ps, SHAPE(channels), PARAM_BUFFER, LR_GROUP_BACKBONE, "%s.running_var", prefix),
  };
  tensor_fill_(bn.weight, 1.0f);
  tensor_fill_(bn.running_var, 1.0f);
  return bn;
}

Tensor *frozen_bn_forward(const FrozenBn *bn, Tensor *x) { return frozen_bn_act_forward(bn, x, NULL, false); }

Tensor *frozen_bn_act_forward(const FrozenBn *bn, Tensor *x, Tensor *residual, bool relu) {
  return op_frozen_batchnorm2d_act(x, bn->weight, bn->bias, bn->running_mean, bn->running_var, FROZEN_BN_EPS, residual,
                                   relu, bn->channels_last);
}

// Folding: y = (conv(x, W) + b) * s + t = conv(x, W * s) + (b * s + t) per output channel. The
// folded weight is rounded once per element (W[o] * s[o] in float); the rest of the difference from
// the training path's conv-then-norm is the summation's rounding at another scale
// (tests/test_infer.c: folded_conv_within_bound derives the bound).
FoldedConv frozen_bn_fold(const Conv2d *c, const FrozenBn *bn, TensorOwner *owner) {
  int64_t O = c->weight->shape.d[0], per = c->weight->numel / O;
  DETR_CHECK(bn->weight->numel == O, "frozen_bn_fold: a norm of %lld channels after a convolution of %lld outputs",
             (long long)bn->weight->numel, (long long)O);
  float *w = detr_malloc((size_t)(c->weight->numel + 6 * O) * sizeof(float), "frozen_bn_fold");  // W, then 6 [O]
  float *gamma = w + c->weight->numel, *beta = gamma + O, *mean = beta + O, *var = mean + O, *b = var + O, *cb = b + O;
  tensor_to_host(c->weight, w);
  tensor_to_host(bn->weight, gamma);
  tensor_to_host(bn->bias, beta);
  tensor_to_host(bn->running_mean, mean);
  tensor_to_host(bn->running_var, var);
  if (c->bias) tensor_to_host(c->bias, cb);
  for (int64_t o = 0; o < O; o++) {
    float s, t;
    frozen_bn_scale_shift(gamma[o], beta[o], mean[o], var[o], FROZEN_BN_EPS, &s, &t);
    for (int64_t i = 0; i < per; i++) w[o * per + i] *= s;
    b[o] = c->bias ? cb[o] * s + t : t;
  }
  FoldedConv f = {.weight = tensor_owner_adopt(owner, tensor_from_host(c->weight->device, c->weight->shape, w)),
                  .bias = tensor_owner_adopt(owner, tensor_from_host(c->weight->device, SHAPE(O), b)),
                  .pack = c->weight->device == DEVICE_CPU ? conv_weight_pack_new() : NULL,
                  .p = c->p};
  free(w);
  return f;
}

void folded_conv_free(FoldedConv *f) {
  conv_weight_pack_free(f->pack);  // the tensors are the owner's
  *f = (FoldedConv){0};
}

Tensor *folded_conv_forward(const FoldedConv *f, Tensor *x, Tensor *residual, bool relu, bool residual_dead) {
  if (residual && residual_dead) return op_conv2d_fused_into(x, f->weight, f->bias, residual, relu, f->p, f->pack);
  return op_conv2d_fused(x, f->weight, f->bias, residual, relu, f->p, f->pack);
}
