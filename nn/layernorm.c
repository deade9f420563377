// Layer norm over the last dimension, eps 1e-5 (torch's default), weight 1 and bias 0 at init.
#include "nn/layers.h"

LayerNorm layernorm_create(ParamStore *ps, const char *prefix, int64_t d) {
  LayerNorm ln = {.weight = params_add(ps, SHAPE(d), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.weight", prefix),
                  .bias = params_add(ps, SHAPE(d), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.bias", prefix)};
  tensor_fill_(ln.weight, 1.0f);
  return ln;
}

LayerNorm layernorm_create_named(ParamStore *ps, const char *prefix, const char *name, int64_t d) {
  char full[112];
  param_name_join(full, sizeof full, prefix, name);
  return layernorm_create(ps, full, d);
}

Tensor *layernorm_forward(const LayerNorm *ln, Tensor *x) { return op_layernorm(x, ln->weight, ln->bias, 1e-5f); }
