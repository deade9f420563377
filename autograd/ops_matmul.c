// Matrix products on sgemm (oneDNN, or OpenBLAS without it: kernels/cpu/matmul.c) / cuBLAS: matmul,
// batched matmul, linear.
#include "autograd/op_util.h"

// C[M,N] = alpha op(A) op(B) + beta C on the tensors' device.
static void gemm(Device dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                 int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  DISPATCH(dev, cpu_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc),
           cuda_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
}

// --- matmul: a [..., M, K] x b [K, N]; the leading dims of a fold into M ---

typedef struct {
  int64_t rows, K, N;  // a [rows, K] x b [K, N]
} MatmulAttrs;

static void matmul_backward_node(TapeNode *n) {
  Tensor *a = n->in[0], *b = n->in[1], *y = n->out[0];
  const MatmulAttrs *at = NODE_ATTRS(n, MatmulAttrs);
  int64_t rows = at->rows, K = at->K, N = at->N;
  float *da = grad_data_or_null(a), *db = grad_data_or_null(b);
  if (da) gemm(a->device, false, true, rows, K, N, 1.0f, y->grad->data, N, b->data, N, 1.0f, da, K);
  if (db) gemm(a->device, true, false, K, N, rows, 1.0f, a->data, K, y->grad->data, N, 1.0f, db, N);
}

Tensor *op_matmul(Tensor *a, Tensor *b) {
  check_same_device("matmul", a, b);
  char sa[64], sb[64];
  DETR_CHECK(a->shape.ndim >= 2 && b->shape.ndim == 2 && a->shape.d[a->shape.ndim - 1] == b->shape.d[0],
             "matmul: cannot multiply %s by %s", shape_str(a->shape, sa, sizeof sa),
             shape_str(b->shape, sb, sizeof sb));
  int64_t K = b->shape.d[0], N = b->shape.d[1], rows = K ? a->numel / K : 0;
  Shape out = a->shape;
  out.d[out.ndim - 1] = N;
  Tensor *y = tensor_new_scoped(a->device, out);
  gemm(a->device, false, false, rows, N, K, 1.0f, a->data, K, b->data, N, 0.0f, y->data, N);
  Tensor *in[2] = {a, b};
  TapeNode *n = autograd_record("matmul", matmul_backward_node, y, 2, in);
  if (n) {
    autograd_save(n, a);
    autograd_save(n, b);
    *NODE_ATTRS(n, MatmulAttrs) = (MatmulAttrs){.rows = rows, .K = K, .N = N};
    n->flops = 2.0 * (double)rows * (double)K * (double)N;
  }
  return y;
}

// --- bmm: y[i] = op(a[i]) op(b[i]); dropout_bmm: y[i] = dropout(a[i]) b[i] ---
//
// dropout_bmm is attention's probabilities (a, kept by the softmax for its backward) dropped out
// and applied to the values. The dropped-out copy is made for the product and freed: backward
// draws it again from the same stream (for b's gradient) and takes a's gradient through the
// mask, as dropout's backward does. bmm(dropout(a), b) keeps that copy from forward to backward:
// 4 MB a DETR encoder layer at R50@512. The same floats as dropout then bmm.

typedef struct {
  bool trans_a, trans_b;
  int64_t B, M, K, N;     // y [B, M, N] = op(a) [B, M, K] op(b) [B, K, N]
  float dropout_p;        // of a (not transposed); 0: none
  uint64_t seed, offset;  // the stream position of its mask
} BmmAttrs;

static void bmm_backward_node(TapeNode *n) {
  Tensor *a = n->in[0], *b = n->in[1], *y = n->out[0];
  const BmmAttrs *at = NODE_ATTRS(n, BmmAttrs);
  bool ta = at->trans_a, tb = at->trans_b;
  int64_t B = at->B, M = at->M, K = at->K, N = at->N;
  float *da = grad_data_or_null(a), *db = grad_data_or_null(b);
  const float *dy = y->grad->data;
  Device dev = a->device;
  float p = at->dropout_p;
  // With dropout: the dropped-out copy of a drawn again (for db), and its gradient (for da).
  Tensor *dropped = NULL, *d_dropped = NULL;
  float *da_through_mask = NULL;
  if (p > 0.0f && db) {
    dropped = tensor_new(dev, a->shape);
    DISPATCH(dev, cpu_dropout_forward(a->data, dropped->data, a->numel, p, at->seed, at->offset),
             cuda_dropout_forward(a->data, dropped->data, a->numel, p, at->seed, at->offset));
  }
  float da_beta = 1.0f;  // da accumulates; the dropped copy's gradient is written (beta 0), not added to zeros
  if (p > 0.0f && da) {
    da_through_mask = da;
    d_dropped = tensor_new(dev, a->shape);
    da = d_dropped->data;
    da_beta = 0.0f;
  }
  const float *a_data = dropped ? dropped->data : a->data;  // op(a) as the product used it
  int64_t lda = ta ? M : K, ldb = tb ? K : N;
#define BMM(tA, tB, m_, n_, k_, A, ldA, sA, Bm, ldB, sB, beta, C, ldC, sC)                                \
  DISPATCH(dev, cpu_gemm_batched(tA, tB, m_, n_, k_, 1.0f, A, ldA, sA, Bm, ldB, sB, beta, C, ldC, sC, B), \
           cuda_gemm_batched(tA, tB, m_, n_, k_, 1.0f, A, ldA, sA, Bm, ldB, sB, beta, C, ldC, sC, B))
  // With Y = A B (A = op(a), B = op(b)): dA = dY B^T, dB = A^T dY; transposed storage swaps roles.
  if (da) {
    if (!ta)  // da [M, K] (+)= dY [M, N] op(b)^T
      BMM(false, !tb, M, K, N, dy, N, M * N, b->data, ldb, K * N, da_beta, da, K, M * K);
    else  // da [K, M] (+)= op(b) [K, N] dY^T [N, M]
      BMM(tb, true, K, M, N, b->data, ldb, K * N, dy, N, M * N, da_beta, da, M, M * K);
  }
  if (db) {
    if (!tb)  // db [K, N] += op(a)^T [K, M] dY [M, N]
      BMM(!ta, false, K, N, M, a_data, lda, M * K, dy, N, M * N, 1.0f, db, N, K * N);
    else  // db [N, K] += dY^T [N, M] op(a) [M, K]
      BMM(true, ta, N, K, M, dy, N, M * N, a_data, lda, M * K, 1.0f, db, K, K * N);
  }
#undef BMM
  if (da_through_mask)
    DISPATCH(dev, cpu_dropout_backward(da, da_through_mask, a->numel, p, at->seed, at->offset),
             cuda_dropout_backward(da, da_through_mask, a->numel, p, at->seed, at->offset));
  tensor_release(dropped);
  tensor_release(d_dropped);
}

// dropout_p > 0 (trans_a false): a dropped out with rng first.
static Tensor *bmm(Tensor *a, Tensor *b, bool trans_a, bool trans_b, float dropout_p, Rng *rng) {
  check_same_device("bmm", a, b);
  char sa[64], sb[64];
  DETR_CHECK(a->shape.ndim == 3 && b->shape.ndim == 3 && a->shape.d[0] == b->shape.d[0],
             "bmm: need [B, ., .] operands, got %s and %s", shape_str(a->shape, sa, sizeof sa),
             shape_str(b->shape, sb, sizeof sb));
  int64_t B = a->shape.d[0];
  int64_t M = trans_a ? a->shape.d[2] : a->shape.d[1], K = trans_a ? a->shape.d[1] : a->shape.d[2];
  int64_t Kb = trans_b ? b->shape.d[2] : b->shape.d[1], N = trans_b ? b->shape.d[1] : b->shape.d[2];
  DETR_CHECK(K == Kb, "bmm: inner dimensions differ (%s%s x %s%s)", shape_str(a->shape, sa, sizeof sa),
             trans_a ? "^T" : "", shape_str(b->shape, sb, sizeof sb), trans_b ? "^T" : "");
  Tensor *y = tensor_new_scoped(a->device, SHAPE(B, M, N));
  int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  uint64_t seed = 0, offset = 0;
  Tensor *dropped = NULL;  // dropout(a): for the product only
  if (dropout_p > 0.0f) {
    seed = rng->seed, offset = rng->offset;
    rng->offset += rng_counters_uniform((uint64_t)a->numel);
    dropped = tensor_new(a->device, a->shape);
    DISPATCH(a->device, cpu_dropout_forward(a->data, dropped->data, a->numel, dropout_p, seed, offset),
             cuda_dropout_forward(a->data, dropped->data, a->numel, dropout_p, seed, offset));
  }
  const float *a_data = dropped ? dropped->data : a->data;
  DISPATCH(a->device,
           cpu_gemm_batched(trans_a, trans_b, M, N, K, 1.0f, a_data, lda, M * K, b->data, ldb, K * N, 0.0f, y->data, N,
                            M * N, B),
           cuda_gemm_batched(trans_a, trans_b, M, N, K, 1.0f, a_data, lda, M * K, b->data, ldb, K * N, 0.0f, y->data, N,
                             M * N, B));
  tensor_release(dropped);
  Tensor *in[2] = {a, b};
  TapeNode *n = autograd_record(dropout_p > 0.0f ? "dropout_bmm" : "bmm", bmm_backward_node, y, 2, in);
  if (n) {
    autograd_save(n, a);
    autograd_save(n, b);
    *NODE_ATTRS(n, BmmAttrs) = (BmmAttrs){.trans_a = trans_a,
                                          .trans_b = trans_b,
                                          .B = B,
                                          .M = M,
                                          .K = K,
                                          .N = N,
                                          .dropout_p = dropout_p,
                                          .seed = seed,
                                          .offset = offset};
    n->flops = 2.0 * (double)B * (double)M * (double)K * (double)N;
  }
  return y;
}

Tensor *op_bmm(Tensor *a, Tensor *b, bool trans_a, bool trans_b) { return bmm(a, b, trans_a, trans_b, 0.0f, NULL); }

Tensor *op_dropout_bmm(Tensor *a, Tensor *b, float p, bool training, Rng *rng) {
  DETR_CHECK(p >= 0.0f && p < 1.0f, "dropout_bmm: probability %g is not in [0, 1)", p);
  DETR_CHECK(rng || !training || p == 0.0f, "dropout_bmm: training with dropout %g needs a generator", p);
  return bmm(a, b, false, false, training ? p : 0.0f, rng);
}

// --- linear: y = x W^T + bias, all rows of x in one sgemm; linear_relu: relu of that ---
//
// linear_relu adds the bias and applies the ReLU in one pass over y, and its backward takes dy
// through the ReLU (the mask from y, saved: the next layer keeps it anyway) and sums the bias
// gradient in one pass, in place in y's gradient (dead after this node): two passes fewer than
// linear then relu, and no pre-activation kept. The same floats (kernels/elementwise_math.h).
// linear_relu_dropout applies dropout to that in place (the stream drawn as op_dropout draws it)
// and takes its backward from the dropout's output too: the ReLU's output, which relu then
// dropout keep for the ReLU's mask beside the dropout's output (the next layer's input), is not
// kept at all. DETR's feed-forward layers: 4 MB less per encoder layer at R50@512.

typedef struct {
  int64_t rows, in, out;  // x [rows, in], W [out, in]
  bool relu;
  float dropout_p;  // after the ReLU; 0: none
  bool rounded;     // bf16 operands rounded once (linear_rounds_once): node->buf holds W [out, in]
                    // and x [rows, in] (at a 64-element boundary) rounded
} LinearAttrs;

// In bf16 mode each GEMM rounds its operands into bf16 copies: six conversions a layer, x and W
// twice each and dy twice. Where all three GEMMs run in bf16, the forward rounds x and W once and
// the node keeps the copies for the backward (x's in place of x itself), which rounds dy once for
// both of its GEMMs: three conversions, the same arithmetic (the bf16 step:
// bench/README.md#bench_step). The backward runs as its forward chose, whatever the precision then.
static bool gemm_bf16_wanted(Device dev, int64_t m, int64_t n, int64_t k) {
  bool wanted = false;
  DISPATCH(dev, wanted = cpu_gemm_bf16_wanted(m, n, k), wanted = cuda_gemm_bf16_wanted(m, n, k));
  return wanted;
}

static bool linear_rounds_once(Device dev, int64_t rows, int64_t in, int64_t out) {
  return gemm_bf16_wanted(dev, rows, out, in) && gemm_bf16_wanted(dev, rows, in, out) &&
         gemm_bf16_wanted(dev, out, in, rows);
}

// x [rows, cols] rounded to bf16 into out, and C = op(A) op(B) + beta C on such copies.
static void round_bf16(Device dev, const float *x, int64_t rows, int64_t cols, uint16_t *out) {
  DISPATCH(dev, cpu_round_bf16(x, rows, cols, out), cuda_round_bf16(x, rows, cols, out));
}
static void gemm_bf16(Device dev, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const uint16_t *a,
                      const uint16_t *b, float beta, float *c, int64_t ldc) {
  DISPATCH(dev, cpu_gemm_bf16(ta, tb, m, n, k, 1.0f, a, b, beta, c, ldc),
           cuda_gemm_bf16(ta, tb, m, n, k, 1.0f, a, b, beta, c, ldc));
}

// W's copy in the kept block takes this many elements: x's starts at a 64-element (128-byte) boundary.
static int64_t w16_span(int64_t out, int64_t in) { return (out * in + 63) / 64 * 64; }

// The backward's two GEMMs on the forward's bf16 copies (block: linear_forward_rounded's, NULL where
// neither gradient is wanted) and dy rounded.
static void linear_backward_rounded(Device dev, const LinearAttrs *at, const uint16_t *block, const float *dy,
                                    float *dx, bool set_dx, float *dw, bool set_dw) {
  if (!dx && !dw) return;
  int64_t rows = at->rows, in = at->in, out = at->out;
  const uint16_t *w16 = block, *x16 = block + w16_span(out, in);  // [out, in], [rows, in]
  size_t dy_bytes = (size_t)(rows * out) * sizeof(uint16_t);
  uint16_t *dy16 = detr_alloc(dev, dy_bytes);  // [rows, out]
  round_bf16(dev, dy, rows, out, dy16);
  if (dx) gemm_bf16(dev, false, false, rows, in, out, dy16, w16, set_dx ? 0.0f : 1.0f, dx, in);
  if (dw) gemm_bf16(dev, true, false, out, in, rows, dy16, x16, set_dw ? 0.0f : 1.0f, dw, in);
  detr_free(dev, dy16, dy_bytes);
}

// y [rows, out] = x W^T on bf16 copies of W and x, in one block (*block, *block_bytes): W's, then x's at
// a 64-element boundary. The node keeps both even where the backward reads one (x or W without a
// gradient): a separate block for the other, freed at once, raised detr-r50@512's peak RSS by 36 MB
// for the same live bytes (measured), while such layers are few (DETR's first decoder layer's values).
// On the CPU the bias (may be NULL) and ReLU are the GEMM's epilogue (returns true: done), a pass over
// y fewer; elsewhere the caller adds them.
static bool linear_forward_rounded(Device dev, const Tensor *x, const Tensor *w, const Tensor *bias, bool relu,
                                   int64_t rows, int64_t in, int64_t out, float *y, uint16_t **block,
                                   size_t *block_bytes) {
  int64_t nw = w16_span(out, in);
  *block_bytes = (size_t)(nw + rows * in) * sizeof(uint16_t);
  *block = detr_alloc(dev, *block_bytes);
  uint16_t *w16 = *block, *x16 = *block + nw;
  round_bf16(dev, w->data, out, in, w16);
  round_bf16(dev, x->data, rows, in, x16);
  if (dev == DEVICE_CPU) {
    cpu_linear_bf16_rounded(x16, w16, bias ? bias->data : NULL, relu, y, rows, in, out);
    return true;
  }
  gemm_bf16(dev, false, true, rows, out, in, x16, w16, 0.0f, y, out);
  return false;
}

static void linear_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *w = n->in[1], *bias = n->in[2], *y = n->out[0];
  const LinearAttrs *at = NODE_ATTRS(n, LinearAttrs);
  int64_t rows = at->rows, in = at->in, out = at->out;
  bool set_dx, set_dw;  // a fresh gradient is written (GEMM beta 0), not added to zeros
  float *dx = autograd_grad_to_write(x, &set_dx), *dw = autograd_grad_to_write(w, &set_dw);
  float *db = grad_data_or_null(bias);
  if (at->relu) {  // dy <- relu'(y) dy in place (through the dropout too), db from it in the same pass
    float *g = y->grad->data;
    float keep_scale = at->dropout_p > 0.0f ? dropout_keep_scale(at->dropout_p) : 1.0f;
    DISPATCH(x->device, cpu_relu_row_bias_backward(y->data, g, keep_scale, g, db, rows, out),
             cuda_relu_row_bias_backward(y->data, g, keep_scale, g, db, rows, out));
    db = NULL;
  }
  const float *dy = y->grad->data;
  if (at->rounded) {
    linear_backward_rounded(x->device, at, n->buf, dy, dx, set_dx, dw, set_dw);
  } else {
    if (dx) gemm(x->device, false, false, rows, in, out, 1.0f, dy, out, w->data, in, set_dx ? 0.0f : 1.0f, dx, in);
    if (dw) gemm(x->device, true, false, out, in, rows, 1.0f, dy, out, x->data, in, set_dw ? 0.0f : 1.0f, dw, in);
  }
  if (db) DISPATCH(x->device, cpu_row_bias_backward(dy, db, rows, out), cuda_row_bias_backward(dy, db, rows, out));
}

// dropout_p > 0 (relu only): dropout with rng after the ReLU.
static Tensor *linear(Tensor *x, Tensor *weight, Tensor *bias, bool relu, float dropout_p, Rng *rng) {
  check_same_device("linear", x, weight);
  char sx[64], sw[64];
  int64_t in = weight->shape.d[1], out = weight->shape.d[0];
  DETR_CHECK(weight->shape.ndim == 2 && x->shape.ndim >= 1 && x->shape.d[x->shape.ndim - 1] == in,
             "linear: input %s does not fit weight %s", shape_str(x->shape, sx, sizeof sx),
             shape_str(weight->shape, sw, sizeof sw));
  if (bias) {
    check_same_device("linear", x, bias);
    DETR_CHECK(bias->numel == out, "linear: bias has %lld elements, expected %lld", (long long)bias->numel,
               (long long)out);
  }
  int64_t rows = in ? x->numel / in : 0;
  Shape os = x->shape;
  os.d[os.ndim - 1] = out;
  Tensor *y = tensor_new_scoped(x->device, os);
  Tensor *inputs[3] = {x, weight, bias};
  bool rounded = linear_rounds_once(x->device, rows, in, out);
  uint16_t *rounded_block = NULL;
  size_t rounded_bytes = 0;
  // fused: the bias and ReLU applied by the GEMM's epilogue. Inference (nothing recorded) on the CPU:
  // in bf16 where the weight is kept in bf16 (a model prepared for inference in bf16 mode: x alone is
  // rounded, and from smaller GEMMs on, as cpu_linear_bf16 decides), else where the GEMM runs in fp32
  // (bf16 mode rounds larger ones, on the path below, whose CPU GEMM has the epilogue too).
  const float *b_data = bias ? bias->data : NULL;
  bool fused = x->device == DEVICE_CPU && !autograd_records(3, inputs) &&
               ((weight->bf16 && cpu_linear_bf16(x->data, weight->bf16, b_data, relu, y->data, rows, in, out)) ||
                (!gemm_bf16_wanted(x->device, rows, out, in) &&
                 cpu_linear_fused(x->data, weight->data, b_data, relu, y->data, rows, in, out)));
  if (fused) rounded = false;  // nothing is recorded: no copies to keep
  if (rounded) {
    fused = linear_forward_rounded(x->device, x, weight, bias, relu, rows, in, out, y->data, &rounded_block,
                                   &rounded_bytes);
  } else if (!fused) {
    gemm(x->device, false, true, rows, out, in, 1.0f, x->data, in, weight->data, in, 0.0f, y->data, out);
  }
  if ((bias || relu) && !fused) {
    const float *b = bias ? bias->data : NULL;
    DISPATCH(x->device, cpu_add_row_bias(y->data, b, rows, out, relu), cuda_add_row_bias(y->data, b, rows, out, relu));
  }
  if (dropout_p > 0.0f) {
    uint64_t seed = rng->seed, offset = rng->offset;
    rng->offset += rng_counters_uniform((uint64_t)y->numel);
    DISPATCH(x->device, cpu_dropout_forward(y->data, y->data, y->numel, dropout_p, seed, offset),
             cuda_dropout_forward(y->data, y->data, y->numel, dropout_p, seed, offset));
  }
  const char *name = dropout_p > 0.0f ? "linear_relu_dropout" : relu ? "linear_relu" : "linear";
  TapeNode *n = autograd_record(name, linear_backward_node, y, 3, inputs);
  if (n) {
    if (!rounded && weight->requires_grad) autograd_save(n, x);  // dW = dY^T x
    if (!rounded && x->requires_grad) autograd_save(n, weight);  // dx = dY W
    if (relu) autograd_save(n, y);                               // the ReLU's (and dropout's) mask
    *NODE_ATTRS(n, LinearAttrs) =
        (LinearAttrs){.rows = rows, .in = in, .out = out, .relu = relu, .dropout_p = dropout_p, .rounded = rounded};
    n->flops = 2.0 * (double)rows * (double)in * (double)out;
  }
  // The backward's operands (where only the bias takes a gradient: freed now), or freed with no node.
  if (rounded) {
    bool needed = n && (x->requires_grad || weight->requires_grad);
    node_take_block(needed ? n : NULL, x->device, rounded_block, rounded_bytes);
  }
  return y;
}

Tensor *op_linear(Tensor *x, Tensor *weight, Tensor *bias) { return linear(x, weight, bias, false, 0.0f, NULL); }
Tensor *op_linear_relu(Tensor *x, Tensor *weight, Tensor *bias) { return linear(x, weight, bias, true, 0.0f, NULL); }

Tensor *op_linear_relu_dropout(Tensor *x, Tensor *weight, Tensor *bias, float p, bool training, Rng *rng) {
  DETR_CHECK(p >= 0.0f && p < 1.0f, "linear_relu_dropout: probability %g is not in [0, 1)", p);
  DETR_CHECK(rng || !training || p == 0.0f, "linear_relu_dropout: training with dropout %g needs a generator", p);
  return linear(x, weight, bias, true, training ? p : 0.0f, rng);
}
