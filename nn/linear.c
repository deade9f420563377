// Linear layer, and dropout for every layer (it has no parameters).
#include <stdio.h>

#include "nn/layers.h"

Tensor *nn_dropout(const NnCtx *ctx, Tensor *x, float p) {
  if (!ctx->training || p == 0.0f) return x;
  return op_dropout(x, p, true, ctx->dropout_rng);
}

Tensor *nn_dropout_bmm(const NnCtx *ctx, Tensor *a, Tensor *b, float p) {
  return op_dropout_bmm(a, b, p, ctx->training, ctx->dropout_rng);
}

Linear linear_create(ParamStore *ps, const char *prefix, int64_t in, int64_t out, bool bias, ParamKind kind,
                     LrGroup group) {
  Linear l = {.weight = params_add(ps, SHAPE(out, in), kind, group, "%s.weight", prefix)};
  if (bias) l.bias = params_add(ps, SHAPE(out), kind, group, "%s.bias", prefix);
  return l;
}

Linear linear_create_named(ParamStore *ps, const char *prefix, const char *name, int64_t in, int64_t out) {
  char full[112];
  param_name_join(full, sizeof full, prefix, name);
  return linear_create(ps, full, in, out, true, PARAM_TRAINABLE, LR_GROUP_MAIN);
}

Tensor *linear_forward(const Linear *l, Tensor *x) { return op_linear(x, l->weight, l->bias); }
Tensor *linear_relu_forward(const Linear *l, Tensor *x) { return op_linear_relu(x, l->weight, l->bias); }

Tensor *linear_relu_dropout_forward(const NnCtx *ctx, const Linear *l, Tensor *x, float p) {
  return op_linear_relu_dropout(x, l->weight, l->bias, p, ctx->training, ctx->dropout_rng);
}
