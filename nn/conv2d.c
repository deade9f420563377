// 2-D convolution layer.
#include "nn/layers.h"

Conv2d conv2d_create(ParamStore *ps, const char *prefix, int64_t in, int64_t out, int kernel, int stride, int pad,
                     int dilation, bool bias, ParamKind kind, LrGroup group) {
  Conv2d c = {.weight = params_add(ps, SHAPE(out, in, kernel, kernel), kind, group, "%s.weight", prefix),
              .p = {stride, stride, pad, pad, dilation, dilation}};
  if (bias) c.bias = params_add(ps, SHAPE(out), kind, group, "%s.bias", prefix);
  return c;
}

Tensor *conv2d_forward(const Conv2d *c, Tensor *x) { return op_conv2d(x, c->weight, c->bias, c->p); }
