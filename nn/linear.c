// Linear layer, and dropout for every layer (it has no parameters).
#include <stdio.h>

#include "nn/layers.h"

Tensor *nn_dropout(const NnCtx *ctx, Tensor *x, float p) {
  if (!ctx->training || p == 0.0f) return x;
  return op_dropout(x, p, true, ctx->dropout_rng);
}

Linear linear_create(ParamStore *ps, const char *prefix, int64_t in, int64_t out, bool bias, ParamKind kind,
                     LrGroup group) {
  Linear l = {.weight = params_add(ps, SHAPE(out, in), kind, group, "%s.weight", prefix)};
  if (bias) l.bias = params_add(ps, SHAPE(out), kind, group, "%s.bias", prefix);
  return l;
}

Tensor *linear_forward(const Linear *l, Tensor *x) { return op_linear(x, l->weight, l->bias); }
