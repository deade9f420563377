// Softmax and log-softmax over the last axis (optional additive mask), layer norm.
#include "autograd/op_util.h"

typedef struct {
  bool log;  // log-softmax
} SoftmaxAttrs;

static void softmax_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *y = n->out[0];
  float *dx = grad_data_or_null(x);
  if (!dx) return;
  int64_t cols = x->shape.d[x->shape.ndim - 1], rows = cols ? x->numel / cols : 0;
  bool log = NODE_ATTRS(n, SoftmaxAttrs)->log;
  DISPATCH(x->device, cpu_softmax_backward(y->data, y->grad->data, dx, rows, cols, log),
           cuda_softmax_backward(y->data, y->grad->data, dx, rows, cols, log));
}

static Tensor *softmax(const char *name, Tensor *x, Tensor *mask, bool log) {
  char sx[64], sm[64];
  DETR_CHECK(x->shape.ndim >= 1, "%s: input must have at least one dimension", name);
  int64_t cols = x->shape.d[x->shape.ndim - 1], rows = cols ? x->numel / cols : 0;
  int64_t rows_per_mask = rows;
  if (mask) {
    check_same_device(name, x, mask);
    int64_t mask_rows = cols ? mask->numel / cols : 0;
    DETR_CHECK(mask->shape.d[mask->shape.ndim - 1] == cols && mask_rows > 0 && rows % mask_rows == 0,
               "%s: mask %s does not group the rows of %s", name, shape_str(mask->shape, sm, sizeof sm),
               shape_str(x->shape, sx, sizeof sx));
    rows_per_mask = rows / mask_rows;
  }
  Tensor *y = tensor_new_scoped(x->device, x->shape);
  const float *m = mask ? mask->data : NULL;
  int64_t group = rows_per_mask ? rows_per_mask : 1;
  DISPATCH(x->device, cpu_softmax_forward(x->data, m, y->data, rows, cols, group, log),
           cuda_softmax_forward(x->data, m, y->data, rows, cols, group, log));
  TapeNode *n = autograd_record(name, softmax_backward_node, y, 1, &x);  // the mask is constant
  if (n) {
    NODE_ATTRS(n, SoftmaxAttrs)->log = log;
    autograd_save(n, y);  // both backwards read only the output
  }
  return y;
}

Tensor *op_softmax(Tensor *x, Tensor *mask) { return softmax("softmax", x, mask, false); }
Tensor *op_log_softmax(Tensor *x, Tensor *mask) { return softmax("log_softmax", x, mask, true); }

static void layernorm_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *w = n->in[1], *b = n->in[2], *y = n->out[0];
  Tensor *mean = n->saved[0], *rstd = n->saved[1];
  int64_t cols = x->shape.d[x->shape.ndim - 1], rows = cols ? x->numel / cols : 0;
  const float *wd = w ? w->data : NULL;
  float *dx = grad_data_or_null(x), *dw = grad_data_or_null(w), *db = grad_data_or_null(b);
  DISPATCH(x->device,
           cpu_layernorm_backward(x->data, wd, mean->data, rstd->data, y->grad->data, dx, dw, db, rows, cols),
           cuda_layernorm_backward(x->data, wd, mean->data, rstd->data, y->grad->data, dx, dw, db, rows, cols));
}

Tensor *op_layernorm(Tensor *x, Tensor *weight, Tensor *bias, float eps) {
  DETR_CHECK(x->shape.ndim >= 1, "layernorm: input must have at least one dimension");
  int64_t cols = x->shape.d[x->shape.ndim - 1], rows = cols ? x->numel / cols : 0;
  Tensor *affine[2] = {weight, bias};
  for (int i = 0; i < 2; i++)
    if (affine[i]) {
      check_same_device("layernorm", x, affine[i]);
      DETR_CHECK(affine[i]->numel == cols, "layernorm: %s has %lld elements, expected %lld", i ? "bias" : "weight",
                 (long long)affine[i]->numel, (long long)cols);
    }
  Tensor *y = tensor_new_scoped(x->device, x->shape);
  Tensor *mean = tensor_new_scoped(x->device, SHAPE(rows));
  Tensor *rstd = tensor_new_scoped(x->device, SHAPE(rows));
  const float *wd = weight ? weight->data : NULL, *bd = bias ? bias->data : NULL;
  DISPATCH(x->device, cpu_layernorm_forward(x->data, wd, bd, y->data, mean->data, rstd->data, rows, cols, eps),
           cuda_layernorm_forward(x->data, wd, bd, y->data, mean->data, rstd->data, rows, cols, eps));
  Tensor *in[3] = {x, weight, bias};
  TapeNode *n = autograd_record("layernorm", layernorm_backward_node, y, 3, in);
  if (n) {
    autograd_save(n, mean);
    autograd_save(n, rstd);
    autograd_save(n, x);  // xhat is recomputed from x, mean, rstd
    if (weight) autograd_save(n, weight);
  }
  return y;
}

Tensor *op_cluster_argmax(Tensor *x, Tensor *mask, bool mean, Tensor **winners) {
  char sx[64], sm[64];
  DETR_CHECK(x->shape.ndim == 3, "cluster_argmax: logits %s must be [N, Q, L]", shape_str(x->shape, sx, sizeof sx));
  int64_t n = x->shape.d[0], q = x->shape.d[1], l = x->shape.d[2], per_mask = n ? n : 1;
  if (mask) {
    check_same_device("cluster_argmax", x, mask);
    int64_t mask_rows = l ? mask->numel / l : 0;
    DETR_CHECK(mask->shape.d[mask->shape.ndim - 1] == l && mask_rows > 0 && n % mask_rows == 0,
               "cluster_argmax: mask %s does not group the rows of %s", shape_str(mask->shape, sm, sizeof sm),
               shape_str(x->shape, sx, sizeof sx));
    per_mask = n / mask_rows;
  }
  Tensor *y = tensor_new_scoped(x->device, x->shape);
  Tensor *w = tensor_new_scoped(x->device, SHAPE(n, l)), *counts = tensor_new_scoped(x->device, SHAPE(n, q));
  const float *m = mask ? mask->data : NULL;
  if (n * q * l > 0)
    DISPATCH(x->device,
             cpu_cluster_argmax(x->data, m, y->data, w->data, counts->data, n, q, l, per_mask ? per_mask : 1, mean),
             cuda_cluster_argmax(x->data, m, y->data, w->data, counts->data, n, q, l, per_mask ? per_mask : 1, mean));
  if (winners) *winners = w;
  return y;  // no tape node: the assignment is a constant (kMaX computes it under torch.no_grad())
}
