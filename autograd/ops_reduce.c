// Sums and means over one axis or all elements.
#include "autograd/op_util.h"

// x viewed as [outer, n, inner] for a reduction over `axis`.
static void reduce_geometry(Shape s, int axis, int64_t *outer, int64_t *n, int64_t *inner) {
  *outer = dims_product(s, 0, axis);
  *n = s.d[axis];
  *inner = dims_product(s, axis + 1, s.ndim);
}

typedef struct {
  int64_t outer, len, inner;  // x viewed as [outer, len, inner], summed over len
  float scale;                // 1 for a sum, 1 / len for a mean
} ReduceAttrs;

static void sum_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *y = n->out[0];
  float *dx = grad_data_or_null(x);
  if (!dx) return;
  const ReduceAttrs *at = NODE_ATTRS(n, ReduceAttrs);
  int64_t outer = at->outer, len = at->len, inner = at->inner;
  float scale = at->scale;
  DISPATCH(x->device, cpu_reduce_sum_backward(y->grad->data, dx, outer, len, inner, scale),
           cuda_reduce_sum_backward(y->grad->data, dx, outer, len, inner, scale));
}

// y = scale * sum over the [outer, n, inner] middle axis, with output shape `out`.
static Tensor *reduce(const char *name, Tensor *x, int64_t outer, int64_t len, int64_t inner, float scale, Shape out) {
  Tensor *y = tensor_new_scoped(x->device, out);
  DISPATCH(x->device, cpu_reduce_sum(x->data, y->data, outer, len, inner, scale),
           cuda_reduce_sum(x->data, y->data, outer, len, inner, scale));
  TapeNode *node = autograd_record(name, sum_backward_node, y, 1, &x);
  if (node) *NODE_ATTRS(node, ReduceAttrs) = (ReduceAttrs){.outer = outer, .len = len, .inner = inner, .scale = scale};
  return y;
}

static Tensor *reduce_axis(const char *name, Tensor *x, int axis, bool keepdim, bool mean) {
  int a = normalize_axis(name, axis, x->shape.ndim);
  int64_t outer, len, inner;
  reduce_geometry(x->shape, a, &outer, &len, &inner);
  Shape out = {.ndim = 0};
  for (int d = 0; d < x->shape.ndim; d++) {
    if (d != a) out.d[out.ndim++] = x->shape.d[d];
    else if (keepdim) out.d[out.ndim++] = 1;
  }
  float scale = mean ? (len ? 1.0f / (float)len : NAN) : 1.0f;
  return reduce(name, x, outer, len, inner, scale, out);
}

Tensor *op_sum(Tensor *x, int axis, bool keepdim) { return reduce_axis("sum", x, axis, keepdim, false); }
Tensor *op_mean(Tensor *x, int axis, bool keepdim) { return reduce_axis("mean", x, axis, keepdim, true); }

Tensor *op_sum_all(Tensor *x) { return reduce("sum_all", x, 1, x->numel, 1, 1.0f, (Shape){0}); }
Tensor *op_mean_all(Tensor *x) {
  return reduce("mean_all", x, 1, x->numel, 1, x->numel ? 1.0f / (float)x->numel : NAN, (Shape){0});
}
