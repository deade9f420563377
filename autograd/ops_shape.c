// Reshape (a view), permute/transpose, concat, slice and row gather.
#include <stdlib.h>
#include <string.h>

#include "autograd/op_util.h"

// --- reshape: shares data; backward passes the gradient through with the input's shape ---

static void reshape_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *y = n->out[0];
  if (autograd_grad_take(x, y->grad)) return;
  float *dx = grad_data_or_null(x);
  if (!dx) return;
  DISPATCH(x->device, cpu_accumulate(dx, y->grad->data, x->numel), cuda_accumulate(dx, y->grad->data, x->numel));
}

Tensor *op_reshape(Tensor *x, Shape shape) {
  int infer = -1;
  int64_t known = 1;
  for (int d = 0; d < shape.ndim; d++) {
    if (shape.d[d] == -1) {
      DETR_CHECK(infer < 0, "reshape: more than one -1 dimension");
      infer = d;
    } else {
      known *= shape.d[d];
    }
  }
  if (infer >= 0) {
    DETR_CHECK(known > 0 && x->numel % known == 0, "reshape: cannot infer a dimension of %lld elements",
               (long long)x->numel);
    shape.d[infer] = x->numel / known;
  }
  Tensor *y = tensor_scoped(tensor_view(x, shape));
  autograd_record("reshape", reshape_backward_node, y, 1, &x);
  return y;
}

// --- permute: an explicit copy, so that every kernel sees contiguous data ---

typedef struct {
  int perm[DETR_MAX_DIMS];  // y dim d is x dim perm[d]
} PermuteAttrs;

static void permute_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *y = n->out[0];
  float *dx = grad_data_or_null(x);
  if (!dx) return;
  const int *perm = NODE_ATTRS(n, PermuteAttrs)->perm;
  int inverse[DETR_MAX_DIMS];
  for (int d = 0; d < x->shape.ndim; d++) inverse[perm[d]] = d;
  DISPATCH(x->device, cpu_permute(y->grad->data, dx, y->shape.ndim, y->shape.d, inverse, true),
           cuda_permute(y->grad->data, dx, y->shape.ndim, y->shape.d, inverse, true));
}

Tensor *op_permute(Tensor *x, const int *perm) {
  int nd = x->shape.ndim;
  bool seen[DETR_MAX_DIMS] = {false};
  Shape out = {.ndim = nd};
  for (int d = 0; d < nd; d++) {
    DETR_CHECK(perm[d] >= 0 && perm[d] < nd && !seen[perm[d]], "permute: not a permutation of %d dims", nd);
    seen[perm[d]] = true;
    out.d[d] = x->shape.d[perm[d]];
  }
  Tensor *y = tensor_new_scoped(x->device, out);
  DISPATCH(x->device, cpu_permute(x->data, y->data, nd, x->shape.d, perm, false),
           cuda_permute(x->data, y->data, nd, x->shape.d, perm, false));
  TapeNode *n = autograd_record("permute", permute_backward_node, y, 1, &x);
  if (n)
    for (int d = 0; d < nd; d++) NODE_ATTRS(n, PermuteAttrs)->perm[d] = perm[d];
  return y;
}

Tensor *op_transpose(Tensor *x, int dim0, int dim1) {
  int nd = x->shape.ndim, perm[DETR_MAX_DIMS];
  int a = normalize_axis("transpose", dim0, nd), b = normalize_axis("transpose", dim1, nd);
  for (int d = 0; d < nd; d++) perm[d] = d;
  perm[a] = b;
  perm[b] = a;
  return op_permute(x, perm);
}

// --- concat and slice: copies of [outer, axis range, inner] blocks (a slice of one block with
// nothing recorded: a view) ---

static void copy_range(Device dev, const float *src, float *dst, int64_t outer, int64_t src_axis, int64_t dst_axis,
                       int64_t inner, int64_t src_start, int64_t dst_start, int64_t len, bool accumulate) {
  DISPATCH(dev, cpu_copy_axis_range(src, dst, outer, src_axis, dst_axis, inner, src_start, dst_start, len, accumulate),
           cuda_copy_axis_range(src, dst, outer, src_axis, dst_axis, inner, src_start, dst_start, len, accumulate));
}

typedef struct {
  int axis;  // normalised
} ConcatAttrs;

static void concat_backward_node(TapeNode *n) {
  Tensor *y = n->out[0];
  int axis = NODE_ATTRS(n, ConcatAttrs)->axis;
  int64_t outer = dims_product(y->shape, 0, axis), inner = dims_product(y->shape, axis + 1, y->shape.ndim);
  int64_t start = 0;
  for (int i = 0; i < n->n_in; i++) {
    Tensor *x = n->in[i];
    float *dx = grad_data_or_null(x);
    int64_t len = x->shape.d[axis];
    if (dx) copy_range(y->device, y->grad->data, dx, outer, y->shape.d[axis], len, inner, start, 0, len, true);
    start += len;
  }
}

Tensor *op_concat(Tensor *const *xs, int n, int axis) {
  DETR_CHECK(n >= 1 && n <= NODE_MAX_INPUTS, "concat: %d inputs, expected 1..%d", n, NODE_MAX_INPUTS);
  if (n == 1) return xs[0];
  Shape out = xs[0]->shape;
  int a = normalize_axis("concat", axis, out.ndim);
  out.d[a] = 0;
  char s0[64], si[64];
  for (int i = 0; i < n; i++) {
    check_same_device("concat", xs[0], xs[i]);
    bool ok = xs[i]->shape.ndim == out.ndim;
    for (int d = 0; ok && d < out.ndim; d++) ok = d == a || xs[i]->shape.d[d] == xs[0]->shape.d[d];
    DETR_CHECK(ok, "concat: shapes %s and %s differ off axis %d", shape_str(xs[0]->shape, s0, sizeof s0),
               shape_str(xs[i]->shape, si, sizeof si), a);
    out.d[a] += xs[i]->shape.d[a];
  }
  Tensor *y = tensor_new_scoped(xs[0]->device, out);
  int64_t outer = dims_product(out, 0, a), inner = dims_product(out, a + 1, out.ndim), start = 0;
  for (int i = 0; i < n; i++) {
    int64_t len = xs[i]->shape.d[a];
    copy_range(y->device, xs[i]->data, y->data, outer, len, out.d[a], inner, 0, start, len, false);
    start += len;
  }
  TapeNode *node = autograd_record("concat", concat_backward_node, y, n, xs);
  if (node) NODE_ATTRS(node, ConcatAttrs)->axis = a;
  return y;
}

typedef struct {
  int axis;       // normalised
  int64_t start;  // y is x[start, start + y's extent) along axis
} SliceAttrs;

static void slice_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *y = n->out[0];
  float *dx = grad_data_or_null(x);
  if (!dx) return;
  const SliceAttrs *at = NODE_ATTRS(n, SliceAttrs);
  int axis = at->axis;
  int64_t outer = dims_product(x->shape, 0, axis), inner = dims_product(x->shape, axis + 1, x->shape.ndim);
  copy_range(x->device, y->grad->data, dx, outer, y->shape.d[axis], x->shape.d[axis], inner, 0, at->start,
             y->shape.d[axis], true);
}

Tensor *op_slice(Tensor *x, int axis, int64_t start, int64_t end) {
  int a = normalize_axis("slice", axis, x->shape.ndim);
  DETR_CHECK(start >= 0 && start <= end && end <= x->shape.d[a],
             "slice: range [%lld, %lld) outside axis %d of size %lld", (long long)start, (long long)end, a,
             (long long)x->shape.d[a]);
  Shape out = x->shape;
  out.d[a] = end - start;
  int64_t outer = dims_product(x->shape, 0, a), inner = dims_product(x->shape, a + 1, x->shape.ndim);
  // One block of x's elements, and nothing recorded: a view (a layer's rows of a packed weight at
  // inference, e.g. the attention's q, k, v projections) rather than a copy.
  if (outer == 1 && !autograd_records(1, &x)) return tensor_scoped(tensor_view_range(x, start * inner, out));
  Tensor *y = tensor_new_scoped(x->device, out);
  copy_range(x->device, x->data, y->data, outer, x->shape.d[a], out.d[a], inner, start, 0, out.d[a], false);
  TapeNode *n = autograd_record("slice", slice_backward_node, y, 1, &x);
  if (n) *NODE_ATTRS(n, SliceAttrs) = (SliceAttrs){.axis = a, .start = start};
  return y;
}

// --- index_select: rows by host indices, copied to x's device. The backward adds gradient rows
// back: on the CPU a serial scatter over the kept indices; on the GPU a gather over their inverse
// (for each row of x, the positions that picked it, increasing), so that no two threads add into
// one element and the sums come out in the CPU's order. Node buffer: CPU idx [count]; CUDA
// offsets [rows + 1] then positions [count] (int64). ---

// The inverse of idx [count] over rows: inv = [offsets rows+1][positions count], the positions i
// with idx[i] == r at positions[offsets[r] .. offsets[r+1]), increasing (a stable counting sort).
static int64_t *inverse_index(const int64_t *idx, int64_t count, int64_t rows) {
  int64_t *inv = detr_malloc((size_t)(rows + 1 + count) * sizeof(int64_t), "index_select inverse index");
  int64_t *offsets = inv, *positions = inv + rows + 1;
  memset(offsets, 0, (size_t)(rows + 1) * sizeof(int64_t));
  for (int64_t i = 0; i < count; i++) offsets[idx[i] + 1]++;
  for (int64_t r = 0; r < rows; r++) offsets[r + 1] += offsets[r];       // offsets[r]: start of row r
  for (int64_t i = 0; i < count; i++) positions[offsets[idx[i]]++] = i;  // offsets[r]: end of row r
  for (int64_t r = rows; r > 0; r--) offsets[r] = offsets[r - 1];
  offsets[0] = 0;
  return inv;
}

typedef struct {
  int64_t count;  // rows selected
} IndexSelectAttrs;

static void index_select_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *y = n->out[0];
  float *dx = grad_data_or_null(x);
  if (!dx) return;
  int64_t count = NODE_ATTRS(n, IndexSelectAttrs)->count;
  int64_t rows = x->shape.d[0], row = rows ? x->numel / rows : 0;
  const int64_t *buf = n->buf;
  DISPATCH(x->device, cpu_index_add(y->grad->data, buf, dx, count, row),
           cuda_index_add(y->grad->data, buf, buf + rows + 1, dx, rows, row));
}

Tensor *op_index_select(Tensor *x, const int64_t *idx, int64_t count) {
  DETR_CHECK(x->shape.ndim >= 1, "index_select: input must have at least one dimension");
  int64_t rows = x->shape.d[0], row = rows ? x->numel / rows : 0;
  for (int64_t i = 0; i < count; i++)
    DETR_CHECK(idx[i] >= 0 && idx[i] < rows,
               "index_select: index %lld at position %lld is outside "
               "[0, %lld)",
               (long long)idx[i], (long long)i, (long long)rows);
  Shape out = x->shape;
  out.d[0] = count;
  Device dev = x->device;
  Tensor *y = tensor_new_scoped(dev, out);
  size_t idx_bytes = (size_t)count * sizeof(int64_t);
  int64_t *dev_idx = upload_block(dev, idx, idx_bytes);  // [count] on x's device
  DISPATCH(dev, cpu_index_select(x->data, dev_idx, y->data, count, row),
           cuda_index_select(x->data, dev_idx, y->data, count, row));
  TapeNode *n = autograd_record("index_select", index_select_backward_node, y, 1, &x);
  if (n) NODE_ATTRS(n, IndexSelectAttrs)->count = count;
  if (n && dev != DEVICE_CPU) {  // the GPU's backward reads the inverse instead
    detr_free(dev, dev_idx, idx_bytes);
    int64_t *inv = inverse_index(idx, count, rows);
    size_t inv_bytes = (size_t)(rows + 1 + count) * sizeof(int64_t);
    node_take_block(n, dev, upload_block(dev, inv, inv_bytes), inv_bytes);
    free(inv);
  } else {
    node_take_block(n, dev, dev_idx, idx_bytes);
  }
  return y;
}

// --- constants ---

Tensor *op_constant(Device dev, Shape shape, const float *host) {
  return tensor_scoped(tensor_from_host(dev, shape, host));
}

Tensor *op_zeros(Device dev, Shape shape) { return tensor_scoped(tensor_zeros(dev, shape)); }
