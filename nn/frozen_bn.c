// Batch norm with frozen statistics and affine parameters (all four are buffers), eps 1e-5 as
// DETR's FrozenBatchNorm2d. Identity until weights are loaded: weight 1, bias 0, mean 0, var 1.
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
  return op_frozen_batchnorm2d_act(x, bn->weight, bn->bias, bn->running_mean, bn->running_var, 1e-5f, residual,
                                   relu, bn->channels_last);
}
