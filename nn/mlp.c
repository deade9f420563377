// Multi-layer perceptron with ReLU between layers (DETR's box head: hidden -> hidden -> 4).
#include <stdio.h>

#include "nn/layers.h"

Mlp mlp_create(ParamStore *ps, const char *prefix, int64_t in, int64_t hidden, int64_t out, int n_layers) {
  DETR_CHECK(n_layers >= 1 && n_layers <= MLP_MAX_LAYERS, "mlp: %d layers, expected 1..%d", n_layers, MLP_MAX_LAYERS);
  Mlp m = {.n_layers = n_layers};
  for (int i = 0; i < n_layers; i++) {
    char name[112];
    snprintf(name, sizeof name, "%s.layers.%d", prefix, i);
    m.layers[i] = linear_create(ps, name, i == 0 ? in : hidden, i == n_layers - 1 ? out : hidden, true, PARAM_TRAINABLE,
                                LR_GROUP_MAIN);
  }
  return m;
}

Tensor *mlp_forward(const Mlp *m, Tensor *x) {
  for (int i = 0; i < m->n_layers; i++)
    x = i < m->n_layers - 1 ? linear_relu_forward(&m->layers[i], x) : linear_forward(&m->layers[i], x);
  return x;
}
