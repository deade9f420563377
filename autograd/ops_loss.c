// Losses (weighted cross-entropy, sigmoid focal, L1) and the box ops of DETR's GIoU loss.
#include "autograd/op_util.h"

// --- weighted cross-entropy, mean over the weights of the targets (torch semantics) ---
// The targets go to the logits' device (node buffer, int64 [rows]). The loss is written and its
// gradient read in device memory: no synchronisation in either direction.

static void cross_entropy_backward_node(TapeNode *n) {
  Tensor *logits = n->in[0], *weight = n->in[1], *y = n->out[0], *lse = n->saved[0];
  float *dlogits = grad_data_or_null(logits);
  if (!dlogits) return;
  int64_t rows = logits->shape.d[0], classes = logits->shape.d[1];
  const float *w = weight ? weight->data : NULL;
  DISPATCH(logits->device,
           cpu_cross_entropy_backward(logits->data, n->buf, w, lse->data, y->grad->data[0], dlogits, rows, classes),
           cuda_cross_entropy_backward(logits->data, n->buf, w, lse->data, y->grad->data, dlogits, rows, classes));
}

Tensor *op_cross_entropy(Tensor *logits, const int64_t *targets, Tensor *class_weight) {
  char s[64];
  DETR_CHECK(logits->shape.ndim == 2 && logits->shape.d[0] > 0, "cross_entropy: logits must be [N > 0, C], got %s",
             shape_str(logits->shape, s, sizeof s));
  int64_t rows = logits->shape.d[0], classes = logits->shape.d[1];
  for (int64_t r = 0; r < rows; r++)
    DETR_CHECK(targets[r] >= 0 && targets[r] < classes, "cross_entropy: target %lld of row %lld is outside [0, %lld)",
               (long long)targets[r], (long long)r, (long long)classes);
  if (class_weight) {
    check_same_device("cross_entropy", logits, class_weight);
    DETR_CHECK(class_weight->numel == classes, "cross_entropy: %lld class weights for %lld classes",
               (long long)class_weight->numel, (long long)classes);
    DETR_CHECK(!class_weight->requires_grad, "cross_entropy: class weights take no gradient");
  }
  Device dev = logits->device;
  Tensor *y = tensor_new_scoped(dev, (Shape){0});
  Tensor *lse = tensor_new_scoped(dev, SHAPE(rows));
  size_t target_bytes = (size_t)rows * sizeof(int64_t);
  int64_t *dev_targets = upload_block(dev, targets, target_bytes);  // [rows] on dev
  const float *w = class_weight ? class_weight->data : NULL;
  DISPATCH(dev, y->data[0] = cpu_cross_entropy_forward(logits->data, dev_targets, w, lse->data, rows, classes),
           cuda_cross_entropy_forward(logits->data, dev_targets, w, lse->data, y->data, rows, classes));
  Tensor *in[2] = {logits, class_weight};
  TapeNode *n = autograd_record("cross_entropy", cross_entropy_backward_node, y, 2, in);
  if (n) {
    autograd_save(n, lse);
    autograd_save(n, logits);
    if (class_weight) autograd_save(n, class_weight);
  }
  node_take_block(n, dev, dev_targets, target_bytes);
  return y;
}

// --- sigmoid focal loss, summed (Conditional DETR's classification loss) ---
// Targets on the logits' device as for cross-entropy; alpha and gamma in the node's attributes.

typedef struct {
  float alpha, gamma;
} FocalAttrs;

static void focal_loss_backward_node(TapeNode *n) {
  Tensor *logits = n->in[0], *y = n->out[0];
  float *dlogits = grad_data_or_null(logits);
  if (!dlogits) return;
  const FocalAttrs *at = NODE_ATTRS(n, FocalAttrs);
  int64_t rows = logits->shape.d[0], classes = logits->shape.d[1];
  DISPATCH(
      logits->device,
      cpu_focal_loss_backward(logits->data, n->buf, y->grad->data[0], dlogits, rows, classes, at->alpha, at->gamma),
      cuda_focal_loss_backward(logits->data, n->buf, y->grad->data, dlogits, rows, classes, at->alpha, at->gamma));
}

Tensor *op_sigmoid_focal_loss(Tensor *logits, const int64_t *targets, float alpha, float gamma) {
  char s[64];
  DETR_CHECK(logits->shape.ndim == 2 && logits->shape.d[0] > 0 && logits->shape.d[1] > 0,
             "sigmoid_focal_loss: logits must be [N > 0, C > 0], got %s", shape_str(logits->shape, s, sizeof s));
  DETR_CHECK(alpha <= 1.0f && gamma >= 0.0f, "sigmoid_focal_loss: alpha %g (<= 1) or gamma %g (>= 0) out of range",
             alpha, gamma);
  int64_t rows = logits->shape.d[0], classes = logits->shape.d[1];
  for (int64_t r = 0; r < rows; r++)
    DETR_CHECK(targets[r] >= 0 && targets[r] <= classes,
               "sigmoid_focal_loss: target %lld of row %lld is outside [0, %lld]", (long long)targets[r], (long long)r,
               (long long)classes);
  Device dev = logits->device;
  Tensor *y = tensor_new_scoped(dev, (Shape){0});
  size_t target_bytes = (size_t)rows * sizeof(int64_t);
  int64_t *dev_targets = upload_block(dev, targets, target_bytes);  // [rows] on dev
  DISPATCH(dev, y->data[0] = cpu_focal_loss_forward(logits->data, dev_targets, rows, classes, alpha, gamma),
           cuda_focal_loss_forward(logits->data, dev_targets, y->data, rows, classes, alpha, gamma));
  TapeNode *n = autograd_record("sigmoid_focal_loss", focal_loss_backward_node, y, 1, &logits);
  if (n) {
    *NODE_ATTRS(n, FocalAttrs) = (FocalAttrs){.alpha = alpha, .gamma = gamma};
    autograd_save(n, logits);
  }
  node_take_block(n, dev, dev_targets, target_bytes);
  return y;
}

// --- L1: sum |a - b| ---

static void l1_backward_node(TapeNode *n) {
  Tensor *a = n->in[0], *b = n->in[1], *y = n->out[0];
  float *da = grad_data_or_null(a), *db = grad_data_or_null(b);
  DISPATCH(a->device, cpu_l1_sum_backward(a->data, b->data, y->grad->data[0], da, db, a->numel),
           cuda_l1_sum_backward(a->data, b->data, y->grad->data, da, db, a->numel));
}

Tensor *op_l1_sum(Tensor *a, Tensor *b) {
  check_same_device("l1_sum", a, b);
  char sa[64], sb[64];
  DETR_CHECK(shape_equal(a->shape, b->shape), "l1_sum: shapes %s and %s differ", shape_str(a->shape, sa, sizeof sa),
             shape_str(b->shape, sb, sizeof sb));
  Tensor *y = tensor_new_scoped(a->device, (Shape){0});
  DISPATCH(a->device, y->data[0] = cpu_l1_sum_forward(a->data, b->data, a->numel),
           cuda_l1_sum_forward(a->data, b->data, y->data, a->numel));
  Tensor *in[2] = {a, b};
  TapeNode *n = autograd_record("l1_sum", l1_backward_node, y, 2, in);
  if (n) {
    autograd_save(n, a);
    autograd_save(n, b);
  }
  return y;
}

// --- boxes ---

static int64_t box_count(const char *op, const Tensor *t) {
  char s[64];
  DETR_CHECK(t->shape.ndim >= 1 && t->shape.d[t->shape.ndim - 1] == 4, "%s: boxes must be [..., 4], got %s", op,
             shape_str(t->shape, s, sizeof s));
  return t->numel / 4;
}

typedef struct {
  bool to_xyxy;  // else to cxcywh
} BoxConvertAttrs;

static void box_convert_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *y = n->out[0];
  float *dx = grad_data_or_null(x);
  if (!dx) return;
  bool to_xyxy = NODE_ATTRS(n, BoxConvertAttrs)->to_xyxy;
  DISPATCH(x->device, cpu_box_convert_backward(y->grad->data, dx, x->numel / 4, to_xyxy),
           cuda_box_convert_backward(y->grad->data, dx, x->numel / 4, to_xyxy));
}

static Tensor *box_convert(const char *name, Tensor *boxes, bool to_xyxy) {
  int64_t count = box_count(name, boxes);
  Tensor *y = tensor_new_scoped(boxes->device, boxes->shape);
  DISPATCH(boxes->device, cpu_box_convert_forward(boxes->data, y->data, count, to_xyxy),
           cuda_box_convert_forward(boxes->data, y->data, count, to_xyxy));
  TapeNode *n = autograd_record(name, box_convert_backward_node, y, 1, &boxes);
  if (n) NODE_ATTRS(n, BoxConvertAttrs)->to_xyxy = to_xyxy;
  return y;
}

Tensor *op_box_cxcywh_to_xyxy(Tensor *boxes) { return box_convert("box_cxcywh_to_xyxy", boxes, true); }
Tensor *op_box_xyxy_to_cxcywh(Tensor *boxes) { return box_convert("box_xyxy_to_cxcywh", boxes, false); }

static void giou_backward_node(TapeNode *n) {
  Tensor *a = n->in[0], *b = n->in[1], *y = n->out[0];
  float *da = grad_data_or_null(a), *db = grad_data_or_null(b);
  DISPATCH(a->device, cpu_box_giou_backward(a->data, b->data, y->grad->data, da, db, a->numel / 4),
           cuda_box_giou_backward(a->data, b->data, y->grad->data, da, db, a->numel / 4));
}

Tensor *op_box_giou(Tensor *a, Tensor *b) {
  check_same_device("box_giou", a, b);
  int64_t count = box_count("box_giou", a);
  DETR_CHECK(a->shape.ndim == 2 && shape_equal(a->shape, b->shape),
             "box_giou: expected two [N, 4] tensors of matched pairs");
  Tensor *y = tensor_new_scoped(a->device, SHAPE(count));
  DISPATCH(a->device, cpu_box_giou_forward(a->data, b->data, y->data, count),
           cuda_box_giou_forward(a->data, b->data, y->data, count));
  Tensor *in[2] = {a, b};
  TapeNode *n = autograd_record("box_giou", giou_backward_node, y, 2, in);
  if (n) {
    autograd_save(n, a);
    autograd_save(n, b);
  }
  return y;
}
