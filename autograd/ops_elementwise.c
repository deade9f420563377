// Unary, scalar, binary (broadcasting) ops and dropout.
#include "autograd/op_util.h"
#include "kernels/rng_math.h"

// --- unary and scalar ops: y = f(x); dx += f'(x) dy (kernels/elementwise_math.h) ---

// What each unary backward reads, and so saves: relu, sigmoid, exp and sqrt need only y (x > 0
// exactly where y > 0); log, pow, softplus, sin, cos, inverse_sigmoid and abs need x; the affine ones nothing. The unread argument
// gets any valid pointer.
static bool unary_needs_y(int op) {
  return op == UNARY_RELU || op == UNARY_SIGMOID || op == UNARY_EXP || op == UNARY_SQRT;
}
static bool unary_needs_x(int op) {
  return op == UNARY_LOG || op == UNARY_POW_SCALAR || op == UNARY_SOFTPLUS || op == UNARY_SIN || op == UNARY_COS ||
         op == UNARY_INVERSE_SIGMOID || op == UNARY_ABS;
}

typedef struct {
  UnaryOp op;
  float param;
} UnaryAttrs;

static void unary_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *y = n->out[0];
  const UnaryAttrs *at = NODE_ATTRS(n, UnaryAttrs);
  UnaryOp op = at->op;
  float param = at->param;
  float *dx = grad_data_or_null(x);
  if (!dx) return;
  const float *dy = y->grad->data;
  const float *xs = unary_needs_x(op) ? x->data : unary_needs_y(op) ? y->data : dy;
  const float *ys = unary_needs_y(op) ? y->data : xs;
  DISPATCH(x->device, cpu_unary_backward(op, xs, ys, dy, dx, x->numel, param),
           cuda_unary_backward(op, xs, ys, dy, dx, x->numel, param));
}

static Tensor *unary(Tensor *x, UnaryOp op, float param) {
  Tensor *y = tensor_new_scoped(x->device, x->shape);
  DISPATCH(x->device, cpu_unary_forward(op, x->data, y->data, x->numel, param),
           cuda_unary_forward(op, x->data, y->data, x->numel, param));
  TapeNode *n = autograd_record(unary_op_name(op), unary_backward_node, y, 1, &x);
  if (n) {
    *NODE_ATTRS(n, UnaryAttrs) = (UnaryAttrs){.op = op, .param = param};
    if (unary_needs_x(op)) autograd_save(n, x);
    if (unary_needs_y(op)) autograd_save(n, y);
  }
  return y;
}

Tensor *op_relu(Tensor *x) { return unary(x, UNARY_RELU, 0.0f); }
Tensor *op_sigmoid(Tensor *x) { return unary(x, UNARY_SIGMOID, 0.0f); }
Tensor *op_exp(Tensor *x) { return unary(x, UNARY_EXP, 0.0f); }
Tensor *op_log(Tensor *x) { return unary(x, UNARY_LOG, 0.0f); }
Tensor *op_neg(Tensor *x) { return unary(x, UNARY_NEG, 0.0f); }
Tensor *op_add_scalar(Tensor *x, float s) { return unary(x, UNARY_ADD_SCALAR, s); }
Tensor *op_mul_scalar(Tensor *x, float s) { return unary(x, UNARY_MUL_SCALAR, s); }
Tensor *op_sqrt(Tensor *x) { return unary(x, UNARY_SQRT, 0.0f); }
Tensor *op_pow_scalar(Tensor *x, float p) { return unary(x, UNARY_POW_SCALAR, p); }
Tensor *op_softplus(Tensor *x) { return unary(x, UNARY_SOFTPLUS, 0.0f); }
Tensor *op_sin(Tensor *x) { return unary(x, UNARY_SIN, 0.0f); }
Tensor *op_cos(Tensor *x) { return unary(x, UNARY_COS, 0.0f); }
Tensor *op_inverse_sigmoid(Tensor *x, float eps) { return unary(x, UNARY_INVERSE_SIGMOID, eps); }
Tensor *op_abs(Tensor *x) { return unary(x, UNARY_ABS, 0.0f); }

// --- binary ops with numpy broadcasting ---

static Broadcast make_broadcast(const char *op, Shape a, Shape b) {
  Broadcast bc = {.ndim = a.ndim > b.ndim ? a.ndim : b.ndim};
  int64_t sa = 1, sb = 1;
  for (int d = bc.ndim - 1; d >= 0; d--) {
    int da = d - (bc.ndim - a.ndim), db = d - (bc.ndim - b.ndim);
    int64_t na = da >= 0 ? a.d[da] : 1, nb = db >= 0 ? b.d[db] : 1;
    char x[64], y[64];
    DETR_CHECK(na == nb || na == 1 || nb == 1, "%s: shapes %s and %s do not broadcast", op, shape_str(a, x, sizeof x),
               shape_str(b, y, sizeof y));
    bc.shape[d] = na > nb ? na : nb;
    if (na == 0 || nb == 0) bc.shape[d] = 0;
    bc.stride_a[d] = na == 1 ? 0 : sa;
    bc.stride_b[d] = nb == 1 ? 0 : sb;
    sa *= na;
    sb *= nb;
  }
  return bc;
}

// add and sub read neither operand in backward (nothing is saved for them); mul and div both.
static bool binary_reads_operands(int op) { return op == BINARY_MUL || op == BINARY_DIV; }

typedef struct {
  BinaryOp op;
} BinaryAttrs;

static void binary_backward_node(TapeNode *n) {
  Tensor *a = n->in[0], *b = n->in[1], *y = n->out[0];
  BinaryOp op = NODE_ATTRS(n, BinaryAttrs)->op;
  Broadcast bc = make_broadcast(binary_op_name(op), a->shape, b->shape);
  // add's da and db and sub's da are dy itself where not broadcast: an input without a gradient
  // yet takes dy's buffer (one of them: two would share one buffer) and the kernel skips it.
  bool a_took = (op == BINARY_ADD || op == BINARY_SUB) && a->numel == y->numel && autograd_grad_take(a, y->grad);
  bool b_took = !a_took && op == BINARY_ADD && b->numel == y->numel && autograd_grad_take(b, y->grad);
  float *da = a_took ? NULL : grad_data_or_null(a), *db = b_took ? NULL : grad_data_or_null(b);
  if (!da && !db) return;
  // add and sub: a and b were not saved (their data may be gone), but the kernels still load
  // a[oa] and b[ob] and pass them to derivatives that ignore them. One uninitialised buffer
  // (detr_alloc) the size of the larger operand covers both extents; its contents never matter.
  const float *av = a->data, *bv = b->data;
  float *dummy = NULL;
  size_t dummy_bytes = 0;
  if (!binary_reads_operands(op)) {
    dummy_bytes = (size_t)(a->numel > b->numel ? a->numel : b->numel) * sizeof(float);
    dummy = detr_alloc(y->device, dummy_bytes);
    av = bv = dummy;
  }
  DISPATCH(y->device, cpu_binary_backward(op, av, bv, y->grad->data, da, db, bc),
           cuda_binary_backward(op, av, bv, y->grad->data, da, db, bc));
  if (dummy) detr_free(y->device, dummy, dummy_bytes);
}

static Tensor *binary(Tensor *a, Tensor *b, BinaryOp op) {
  const char *name = binary_op_name(op);
  check_same_device(name, a, b);
  Broadcast bc = make_broadcast(name, a->shape, b->shape);
  Shape out = {.ndim = bc.ndim};
  for (int d = 0; d < bc.ndim; d++) out.d[d] = bc.shape[d];
  Tensor *y = tensor_new_scoped(a->device, out);
  DISPATCH(a->device, cpu_binary_forward(op, a->data, b->data, y->data, bc),
           cuda_binary_forward(op, a->data, b->data, y->data, bc));
  Tensor *in[2] = {a, b};
  TapeNode *n = autograd_record(name, binary_backward_node, y, 2, in);
  if (n) {
    NODE_ATTRS(n, BinaryAttrs)->op = op;
    if (binary_reads_operands(op)) {
      autograd_save(n, a);
      autograd_save(n, b);
    }
  }
  return y;
}

Tensor *op_add(Tensor *a, Tensor *b) { return binary(a, b, BINARY_ADD); }
Tensor *op_sub(Tensor *a, Tensor *b) { return binary(a, b, BINARY_SUB); }
Tensor *op_mul(Tensor *a, Tensor *b) { return binary(a, b, BINARY_MUL); }
Tensor *op_div(Tensor *a, Tensor *b) { return binary(a, b, BINARY_DIV); }

// --- dropout: the mask is regenerated from (seed, offset) in backward ---

typedef struct {
  float p;
  uint64_t seed, offset;  // the rng position the forward's mask was drawn at
} DropoutAttrs;

static void dropout_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *y = n->out[0];
  float *dx = grad_data_or_null(x);
  if (!dx) return;
  const DropoutAttrs *at = NODE_ATTRS(n, DropoutAttrs);
  float p = at->p;
  uint64_t seed = at->seed, offset = at->offset;
  DISPATCH(x->device, cpu_dropout_backward(y->grad->data, dx, x->numel, p, seed, offset),
           cuda_dropout_backward(y->grad->data, dx, x->numel, p, seed, offset));
}

Tensor *op_dropout(Tensor *x, float p, bool training, Rng *rng) {
  DETR_CHECK(p >= 0.0f && p < 1.0f, "dropout: probability %g is not in [0, 1)", p);
  if (!training || p == 0.0f) return x;
  Tensor *y = tensor_new_scoped(x->device, x->shape);
  uint64_t seed = rng->seed, offset = rng->offset;
  rng->offset += rng_counters_uniform((uint64_t)x->numel);
  // The same (seed, offset) gives the same mask on every device (kernels/rng_math.h).
  DISPATCH(x->device, cpu_dropout_forward(x->data, y->data, x->numel, p, seed, offset),
           cuda_dropout_forward(x->data, y->data, x->numel, p, seed, offset));
  TapeNode *n = autograd_record("dropout", dropout_backward_node, y, 1, &x);
  if (n) *NODE_ATTRS(n, DropoutAttrs) = (DropoutAttrs){.p = p, .seed = seed, .offset = offset};
  return y;
}
