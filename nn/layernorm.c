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

GroupNorm groupnorm_create(ParamStore *ps, const char *prefix, int64_t groups, int64_t channels) {
  DETR_CHECK(groups > 0 && channels % groups == 0, "groupnorm: %lld channels in %lld groups", (long long)channels,
             (long long)groups);
  GroupNorm g = {.weight = params_add(ps, SHAPE(channels), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.weight", prefix),
                 .bias = params_add(ps, SHAPE(channels), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.bias", prefix),
                 .groups = groups};
  tensor_fill_(g.weight, 1.0f);
  return g;
}

// A layer norm over each (image, group)'s N * C/G values, without affine terms, then the
// per-channel weight and bias.
Tensor *groupnorm_forward(const GroupNorm *g, Tensor *x) {
  int64_t B = x->shape.d[0], N = x->shape.d[1], C = x->shape.d[2], G = g->groups, cg = C / G;
  int perm[4] = {0, 2, 1, 3};
  Tensor *t = op_permute(op_reshape(x, SHAPE(B, N, G, cg)), perm);  // [B, G, N, cg]
  t = op_layernorm(op_reshape(t, SHAPE(B * G, N * cg)), NULL, NULL, 1e-5f);
  t = op_permute(op_reshape(t, SHAPE(B, G, N, cg)), perm);  // [B, N, G, cg]
  return op_add(op_mul(op_reshape(t, SHAPE(B, N, C)), g->weight), g->bias);
}
