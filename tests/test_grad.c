// Finite-difference gradient tests, one suite per entry of the op table (tests/op_table.c;
// `test_grad OP` runs one, `test_grad --list` names them, and ctest registers each as grad.OP).
// Unary and binary elementwise entries are tested generically from the table's data.
// Tolerances: eps 1e-2 steps in float32 give truncation error ~eps^2 |f'''| and rounding error
// ~1e-7 |L| / eps, so smooth ops use atol 2e-3, rtol 1e-2 (op_tol's default) unless noted; a
// backward that is off by 2% or more in any element fails.
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "kernels/cpu/cpu_kernels.h"
#include "nn/criterion.h"
#include "nn/decoder.h"
#include "nn/enact.h"
#include "nn/resnet.h"
#include "nn/transformer.h"
#include "tests/gradcheck.h"
#include "tests/op_table.h"

static const GradTol TOL = {.eps = 1e-2, .atol = 2e-3, .rtol = 1e-2};

// Runs gradcheck and fails the test with its message; releases the inputs.
static void expect_grad(const char *what, GradFn f, Tensor **in, int n, void *ctx, GradTol tol) {
  GradReport r = gradcheck(f, in, n, ctx, tol);
  ck_assert_msg(r.ok, "%s: %s", what, r.message);
  ck_assert_msg(r.checked > 0, "%s: nothing was checked", what);
  for (int i = 0; i < n; i++) tensor_release(in[i]);
}

#define U(shape, seed) test_uniform(shape, -1.0f, 1.0f, seed, true)

// --- the harness itself: a correct op passes, deliberately wrong backwards fail ---

typedef enum { SQUARE_RIGHT, SQUARE_SCALED, SQUARE_WRONG_SIGN_ONE } SquareVariant;
typedef struct {
  SquareVariant variant;
} SquareAttrs;

static void square_backward(TapeNode *n) {
  Tensor *x = n->in[0], *y = n->out[0];
  Tensor *g = autograd_grad(x);
  SquareVariant v = NODE_ATTRS(n, SquareAttrs)->variant;
  for (int64_t i = 0; i < x->numel; i++) {
    float d = 2.0f * x->data[i] * y->grad->data[i];
    if (v == SQUARE_SCALED) d *= 1.03f;                           // 3% too large everywhere
    if (v == SQUARE_WRONG_SIGN_ONE && i == x->numel / 2) d = -d;  // one element wrong
    g->data[i] += d;
  }
}

static Tensor *square(Tensor *const *in, void *ctx) {
  Tensor *x = in[0], *y = tensor_new_scoped(DEVICE_CPU, x->shape);
  for (int64_t i = 0; i < x->numel; i++) y->data[i] = x->data[i] * x->data[i];
  TapeNode *n = autograd_record("square", square_backward, y, 1, &x);
  if (n) {
    NODE_ATTRS(n, SquareAttrs)->variant = *(SquareVariant *)ctx;
    autograd_save(n, x);
    autograd_save(n, y);
  }
  return y;
}

START_TEST(grad_harness) {
  Tensor *x = test_uniform_away_from_zero(SHAPE(3, 5), 0.2f, 1.5f, 1, true);
  SquareVariant v = SQUARE_RIGHT;
  GradReport r = gradcheck(square, &x, 1, &v, TOL);
  ck_assert_msg(r.ok, "correct backward rejected: %s", r.message);
  v = SQUARE_SCALED;
  r = gradcheck(square, &x, 1, &v, TOL);
  ck_assert_msg(!r.ok, "a backward 3%% too large passed: %s", r.message);
  v = SQUARE_WRONG_SIGN_ONE;
  r = gradcheck(square, &x, 1, &v, TOL);
  ck_assert_msg(!r.ok, "a backward with one wrong element passed: %s", r.message);
  ck_assert_int_eq(r.worst_index, 7);
  tensor_release(x);
}
END_TEST

// --- unary and binary elementwise ops: generic, from their tests/op_table.c entries ---

// Unary: the table's small shapes, values from its range; binary: its small broadcasting pairs.
START_TEST(grad_elementwise) {
  const OpEntry *e = &OP_TABLE[_i];
  GradTol tol = op_tol(e);
  if (e->kind == OP_UNARY)
    for (int s = 0; s < UNARY_SHAPES_FD; s++) {
      Tensor *x = op_input(e, 0, OP_UNARY_SHAPES[s], 10 + s, true);
      expect_grad(e->name, e->f, &x, 1, NULL, tol);
    }
  else
    for (int p = 0; p < BINARY_PAIRS_FD; p++) {
      Tensor *in[2] = {op_input(e, 0, OP_BINARY_PAIRS[p][0], 20 + p, true),
                       op_input(e, 1, OP_BINARY_PAIRS[p][1], 40 + p, true)};
      expect_grad(e->name, e->f, in, 2, NULL, tol);
    }
}
END_TEST

// --- dropout: with a fixed stream, dropout is linear in x; each evaluation redraws from the same
// (seed, offset) because the test resets the generator ---

static Tensor *f_dropout(Tensor *const *in, void *c) {
  Rng rng = rng_make(77);
  return op_dropout(in[0], *(float *)c, true, &rng);
}

START_TEST(grad_dropout) {
  float ps[] = {0.1f, 0.5f};
  for (int i = 0; i < 2; i++) {
    Tensor *x = U(SHAPE(4, 33), 3 + i);
    expect_grad("dropout", f_dropout, &x, 1, &ps[i], TOL);
  }
}
END_TEST

// --- reductions ---

typedef struct {
  int axis;
  bool keepdim;
} AxisArg;

static Tensor *f_sum(Tensor *const *in, void *c) {
  AxisArg *a = c;
  return op_sum(in[0], a->axis, a->keepdim);
}
static Tensor *f_mean(Tensor *const *in, void *c) {
  AxisArg *a = c;
  return op_mean(in[0], a->axis, a->keepdim);
}
static Tensor *f_sum_all(Tensor *const *in, void *c) { return op_sum_all(in[0]); }
static Tensor *f_mean_all(Tensor *const *in, void *c) { return op_mean_all(in[0]); }

static void check_reduce(const char *name, GradFn f) {
  AxisArg args[] = {{0, false}, {1, true}, {-1, false}, {2, true}};
  for (int i = 0; i < 4; i++) {
    Tensor *x = U(SHAPE(3, 4, 5), 50 + i);
    expect_grad(name, f, &x, 1, &args[i], TOL);
  }
  Tensor *x = U(SHAPE(1, 7), 60);
  AxisArg a = {0, false};
  expect_grad(name, f, &x, 1, &a, TOL);
}

START_TEST(grad_sum) { check_reduce("sum", f_sum); }
END_TEST
START_TEST(grad_mean) { check_reduce("mean", f_mean); }
END_TEST
START_TEST(grad_sum_all) {
  Tensor *x = U(SHAPE(3, 4, 5), 61);
  expect_grad("sum_all", f_sum_all, &x, 1, NULL, TOL);
}
END_TEST
START_TEST(grad_mean_all) {
  Tensor *x = U(SHAPE(2, 9), 62);
  expect_grad("mean_all", f_mean_all, &x, 1, NULL, TOL);
}
END_TEST

// --- matrix products ---

static Tensor *f_matmul(Tensor *const *in, void *c) { return op_matmul(in[0], in[1]); }

START_TEST(grad_matmul) {
  Shape cases[][2] = {{SHAPE(3, 4), SHAPE(4, 5)}, {SHAPE(2, 3, 4), SHAPE(4, 1)}, {SHAPE(1, 1), SHAPE(1, 6)}};
  for (int i = 0; i < 3; i++) {
    Tensor *in[2] = {U(cases[i][0], 70 + i), U(cases[i][1], 80 + i)};
    expect_grad("matmul", f_matmul, in, 2, NULL, TOL);
  }
}
END_TEST

static Tensor *f_bmm(Tensor *const *in, void *c) {
  bool *t = c;
  return op_bmm(in[0], in[1], t[0], t[1]);
}

START_TEST(grad_bmm) {
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      int64_t B = 2, M = 3, K = 4, N = 5;
      Tensor *in[2] = {U(ta ? SHAPE(B, K, M) : SHAPE(B, M, K), 90 + ta),
                       U(tb ? SHAPE(B, N, K) : SHAPE(B, K, N), 95 + tb)};
      bool t[2] = {ta, tb};
      expect_grad("bmm", f_bmm, in, 2, t, TOL);
    }
}
END_TEST

static Tensor *f_linear(Tensor *const *in, void *c) { return op_linear(in[0], in[1], in[2]); }

START_TEST(grad_linear) {
  Tensor *in[3] = {U(SHAPE(2, 3, 5), 100), U(SHAPE(4, 5), 101), U(SHAPE(4), 102)};
  expect_grad("linear", f_linear, in, 3, NULL, TOL);
  Tensor *nobias[3] = {U(SHAPE(7), 103), U(SHAPE(1, 7), 104), NULL};
  expect_grad("linear without bias", f_linear, nobias, 3, NULL, TOL);
}
END_TEST

static Tensor *f_linear_relu(Tensor *const *in, void *c) { return op_linear_relu(in[0], in[1], in[2]); }
static Tensor *f_relu_of_linear(Tensor *const *in, void *c) { return op_relu(op_linear(in[0], in[1], in[2])); }

// L = sum(f(in) * R) and the gradient of every input that requires one, into out[] (malloc'ed).
static void value_and_grads(GradFn f, Tensor *const *in, int n, Tensor *R, float **out) {
  ScopeMark mark = tensor_scope_mark();
  Tensor *y = f(in, NULL);
  out[0] = malloc((size_t)y->numel * sizeof(float));
  memcpy(out[0], y->data, (size_t)y->numel * sizeof(float));
  autograd_backward(op_sum_all(op_mul(y, R)));
  for (int i = 0; i < n; i++) {
    out[1 + i] = NULL;
    if (!in[i] || !in[i]->grad) continue;
    out[1 + i] = malloc((size_t)in[i]->numel * sizeof(float));
    memcpy(out[1 + i], in[i]->grad->data, (size_t)in[i]->numel * sizeof(float));
    tensor_release(in[i]->grad);
    in[i]->grad = NULL;
  }
  tensor_scope_release(mark);
}

// Fails unless the fused op's output and gradients (value_and_grads: out[0], out[1..]) are the
// unfused ops' bit for bit; frees both. what[i]: a name for part i.
static const char *const LINEAR_PARTS[4] = {"the output", "dx", "dW", "dbias"};
static void expect_same_bits(const char *fused_op, const char *unfused, float **fused, float **apart, const int64_t *n,
                             const char *const *what, int parts) {
  for (int i = 0; i < parts; i++) {
    ck_assert_msg(!memcmp(fused[i], apart[i], (size_t)n[i] * sizeof(float)), "%s: %s differs from %s", fused_op,
                  what[i], unfused);
    free(fused[i]), free(apart[i]);
  }
}

// Pre-activations kept at least 1.4 from the ReLU's kink (biases of magnitude 1.5-2.5, half of
// them negative: dead units, whose gradient is 0; small x and W): the finite differences see no
// kink. 70 outputs: two of the bias gradient's 64-column blocks. Then the same floats as relu of
// linear, forward and every gradient, bit for bit.
START_TEST(grad_linear_relu) {
  Tensor *in[3] = {test_uniform(SHAPE(2, 3, 5), -0.1f, 0.1f, 105, true),
                   test_uniform(SHAPE(70, 5), -0.1f, 0.1f, 106, true),
                   test_uniform_away_from_zero(SHAPE(70), 1.5f, 2.5f, 107, true)};
  expect_grad("linear_relu", f_linear_relu, in, 3, NULL, TOL);
  Tensor *nobias[3] = {test_uniform_away_from_zero(SHAPE(7), 0.5f, 1.0f, 108, true),
                       test_uniform_away_from_zero(SHAPE(3, 7), 0.5f, 1.0f, 109, true), NULL};
  expect_grad("linear_relu without bias", f_linear_relu, nobias, 3, NULL, TOL);
  Tensor *R = test_uniform(SHAPE(2, 3, 70), -1.0f, 1.0f, 110, false);
  Tensor *wide[3] = {U(SHAPE(2, 3, 5), 111), U(SHAPE(70, 5), 112), U(SHAPE(70), 113)};
  float *fused[4], *apart[4];
  value_and_grads(f_linear_relu, wide, 3, R, fused);
  value_and_grads(f_relu_of_linear, wide, 3, R, apart);
  int64_t n[4] = {2 * 3 * 70, 2 * 3 * 5, 70 * 5, 70};
  expect_same_bits("linear_relu", "relu(linear)", fused, apart, n, LINEAR_PARTS, 4);
  tensor_release(R);
  for (int i = 0; i < 3; i++) tensor_release(wide[i]);
}
END_TEST

// The same with dropout after the ReLU, fused: a fixed stream (the generator reset per evaluation,
// as for dropout), p 0.3 (a third of the units dropped, so the mask matters). Gradients by finite
// differences; then the same floats as dropout of linear_relu, the same draws from the generator.
static uint64_t relu_dropout_rng_offset;
static Tensor *f_linear_relu_dropout(Tensor *const *in, void *c) {
  Rng rng = rng_make(78);
  Tensor *y = op_linear_relu_dropout(in[0], in[1], in[2], 0.3f, true, &rng);
  relu_dropout_rng_offset = rng.offset;
  return y;
}
static Tensor *f_dropout_of_linear_relu(Tensor *const *in, void *c) {
  Rng rng = rng_make(78);
  Tensor *y = op_dropout(op_linear_relu(in[0], in[1], in[2]), 0.3f, true, &rng);
  relu_dropout_rng_offset = rng.offset;
  return y;
}

START_TEST(grad_linear_relu_dropout) {
  Tensor *in[3] = {test_uniform(SHAPE(2, 3, 5), -0.1f, 0.1f, 114, true),
                   test_uniform(SHAPE(70, 5), -0.1f, 0.1f, 115, true),
                   test_uniform_away_from_zero(SHAPE(70), 1.5f, 2.5f, 116, true)};
  expect_grad("linear_relu_dropout", f_linear_relu_dropout, in, 3, NULL, TOL);
  Tensor *R = test_uniform(SHAPE(2, 3, 70), -1.0f, 1.0f, 117, false);
  Tensor *wide[3] = {U(SHAPE(2, 3, 5), 118), U(SHAPE(70, 5), 119), U(SHAPE(70), 120)};
  float *fused[4], *apart[4];
  value_and_grads(f_linear_relu_dropout, wide, 3, R, fused);
  uint64_t fused_offset = relu_dropout_rng_offset;
  value_and_grads(f_dropout_of_linear_relu, wide, 3, R, apart);
  ck_assert_uint_eq(fused_offset, relu_dropout_rng_offset);
  int64_t n[4] = {2 * 3 * 70, 2 * 3 * 5, 70 * 5, 70};
  int64_t zeros = 0, positive = 0;  // both kinds of output: dropped or dead units, and kept live ones
  for (int64_t i = 0; i < n[0]; i++) zeros += fused[0][i] == 0.0f, positive += fused[0][i] > 0.0f;
  ck_assert_int_gt(zeros, n[0] / 4);
  ck_assert_int_gt(positive, n[0] / 4);
  expect_same_bits("linear_relu_dropout", "dropout(linear_relu)", fused, apart, n, LINEAR_PARTS, 4);
  tensor_release(R);
  // Not training (or p 0): linear_relu itself, and the generator untouched.
  Tensor *x = U(SHAPE(4, 5), 130), *w = U(SHAPE(6, 5), 131), *b = U(SHAPE(6), 132);
  ScopeMark mark = tensor_scope_mark();
  Rng rng = rng_make(9);
  Tensor *off = op_linear_relu_dropout(x, w, b, 0.3f, false, &rng),
         *zero = op_linear_relu_dropout(x, w, b, 0.0f, true, &rng);
  Tensor *plain = op_linear_relu(x, w, b);
  ck_assert_uint_eq(rng.offset, rng_make(9).offset);
  ck_assert(!memcmp(off->data, plain->data, sizeof(float) * 24) &&
            !memcmp(zero->data, plain->data, sizeof(float) * 24));
  tensor_scope_release(mark);
  tensor_release(x), tensor_release(w), tensor_release(b);
  for (int i = 0; i < 3; i++) tensor_release(wide[i]);
}
END_TEST

// Attention's dropout on the probabilities, fused into the product with the values: finite
// differences for both inputs (a fixed stream), then the same floats and draws as bmm of dropout.
static uint64_t dropout_bmm_rng_offset;
static Tensor *f_dropout_bmm(Tensor *const *in, void *c) {
  Rng rng = rng_make(80);
  Tensor *y = op_dropout_bmm(in[0], in[1], 0.3f, true, &rng);
  dropout_bmm_rng_offset = rng.offset;
  return y;
}
static Tensor *f_bmm_of_dropout(Tensor *const *in, void *c) {
  Rng rng = rng_make(80);
  Tensor *y = op_bmm(op_dropout(in[0], 0.3f, true, &rng), in[1], false, false);
  dropout_bmm_rng_offset = rng.offset;
  return y;
}

START_TEST(grad_dropout_bmm) {
  Tensor *in[2] = {U(SHAPE(3, 4, 6), 121), U(SHAPE(3, 6, 5), 122)};
  expect_grad("dropout_bmm", f_dropout_bmm, in, 2, NULL, TOL);
  Tensor *R = test_uniform(SHAPE(3, 4, 5), -1.0f, 1.0f, 123, false);
  Tensor *wide[2] = {U(SHAPE(3, 4, 6), 124), U(SHAPE(3, 6, 5), 125)};
  float *fused[3], *apart[3];
  value_and_grads(f_dropout_bmm, wide, 2, R, fused);
  uint64_t fused_offset = dropout_bmm_rng_offset;
  value_and_grads(f_bmm_of_dropout, wide, 2, R, apart);
  ck_assert_uint_eq(fused_offset, dropout_bmm_rng_offset);
  int64_t n[3] = {3 * 4 * 5, 3 * 4 * 6, 3 * 6 * 5};
  int64_t dropped = 0;  // a's gradient is 0 exactly where its element was dropped
  for (int64_t i = 0; i < n[1]; i++) dropped += fused[1][i] == 0.0f;
  ck_assert_int_gt(dropped, n[1] / 8);
  static const char *const parts[3] = {"the output", "da", "db"};
  expect_same_bits("dropout_bmm", "bmm(dropout)", fused, apart, n, parts, 3);
  tensor_release(R);
  for (int i = 0; i < 2; i++) tensor_release(wide[i]);
  // One input without a gradient: the other's is still right.
  Tensor *frozen_b[2] = {U(SHAPE(2, 3, 4), 126), test_uniform(SHAPE(2, 4, 3), -1, 1, 127, false)};
  expect_grad("dropout_bmm, b frozen", f_dropout_bmm, frozen_b, 2, NULL, TOL);
  Tensor *frozen_a[2] = {test_uniform(SHAPE(2, 3, 4), -1, 1, 128, false), U(SHAPE(2, 4, 3), 129)};
  expect_grad("dropout_bmm, a frozen", f_dropout_bmm, frozen_a, 2, NULL, TOL);
  // Not training (or p 0): bmm itself, and the generator untouched.
  Tensor *a = U(SHAPE(2, 3, 4), 133), *b = U(SHAPE(2, 4, 5), 134);
  ScopeMark mark = tensor_scope_mark();
  Rng rng = rng_make(9);
  Tensor *off = op_dropout_bmm(a, b, 0.3f, false, &rng), *zero = op_dropout_bmm(a, b, 0.0f, true, &rng);
  Tensor *plain = op_bmm(a, b, false, false);
  ck_assert_uint_eq(rng.offset, rng_make(9).offset);
  ck_assert(!memcmp(off->data, plain->data, sizeof(float) * 30) &&
            !memcmp(zero->data, plain->data, sizeof(float) * 30));
  tensor_scope_release(mark);
  tensor_release(a), tensor_release(b);
}
END_TEST

// --- convolution, pooling, frozen batch norm ---

static Tensor *f_conv2d(Tensor *const *in, void *c) { return op_conv2d(in[0], in[1], in[2], *(Conv2dParams *)c); }

START_TEST(grad_conv2d) {
  struct {
    Shape x, w;
    Conv2dParams p;
    bool bias;
  } cases[] = {
      {SHAPE(2, 3, 6, 5), SHAPE(4, 3, 3, 3), {1, 1, 1, 1, 1, 1}, true},     // 3x3 same
      {SHAPE(1, 2, 7, 7), SHAPE(3, 2, 3, 3), {2, 2, 1, 1, 1, 1}, false},    // stride 2
      {SHAPE(1, 2, 7, 6), SHAPE(2, 2, 3, 3), {1, 1, 2, 2, 2, 2}, true},     // dilation 2
      {SHAPE(2, 4, 3, 3), SHAPE(5, 4, 1, 1), {1, 1, 0, 0, 1, 1}, true},     // 1x1 pointwise
      {SHAPE(1, 1, 9, 8), SHAPE(2, 1, 7, 7), {2, 2, 3, 3, 1, 1}, false},    // the ResNet stem shape
      {SHAPE(1, 3, 4, 5), SHAPE(2, 3, 1, 1), {2, 2, 0, 0, 1, 1}, false},    // strided 1x1 (downsample)
      {SHAPE(1, 16, 5, 6), SHAPE(16, 16, 3, 3), {1, 1, 1, 1, 1, 1}, true},  // oneDNN's Winograd (AVX-512)
  };
  // Every CPU implementation of this build: AUTO's per-shape choice, then each forced; both layouts
  // (channels last: x [B, H, W, C]).
  ConvImpl impls[] = {CONV_IMPL_AUTO, CONV_IMPL_IM2COL, CONV_IMPL_ONEDNN, CONV_IMPL_ONEDNN_PLAIN,
                      CONV_IMPL_ONEDNN_WINOGRAD};
  for (int last = 0; last < 2; last++)
    for (int k = 0; k < (DETR_HAVE_ONEDNN ? 5 : 2); k++) {
      cpu_conv2d_set_impl(impls[k]);
      for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Shape x = cases[i].x;
        if (last) x = SHAPE(x.d[0], x.d[2], x.d[3], x.d[1]);
        Conv2dParams p = cases[i].p;
        p.channels_last = last;
        Tensor *in[3] = {U(x, 110 + i), U(cases[i].w, 120 + i),
                         cases[i].bias ? U(SHAPE(cases[i].w.d[0]), 130 + i) : NULL};
        expect_grad(last ? "conv2d (channels last)" : "conv2d", f_conv2d, in, 3, &p, TOL);
      }
    }
  cpu_conv2d_set_impl(CONV_IMPL_AUTO);
}
END_TEST

static Tensor *f_dwconv(Tensor *const *in, void *c) { return op_depthwise_conv2d(in[0], in[1], in[2]); }

START_TEST(grad_depthwise_conv2d) {
  // The forward against the definition (a direct loop), then finite differences: 5x5 (FLatten's),
  // 3x3 without bias, 1x1, and a kernel wider than the plane (every tap reads some padding).
  struct {
    Shape x;
    int k;
    bool bias;
  } cases[] = {{SHAPE(2, 3, 6, 5), 5, true},
               {SHAPE(1, 2, 4, 7), 3, false},
               {SHAPE(2, 2, 3, 3), 1, true},
               {SHAPE(1, 2, 2, 3), 5, true}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    Shape xs = cases[i].x;
    int64_t M = xs.d[0], C = xs.d[1], H = xs.d[2], W = xs.d[3], k = cases[i].k, r = k / 2;
    Tensor *in[3] = {U(xs, 140 + i), U(SHAPE(C, 1, k, k), 150 + i), cases[i].bias ? U(SHAPE(C), 160 + i) : NULL};
    Tensor *y = op_depthwise_conv2d(in[0], in[1], in[2]);
    for (int64_t m = 0; m < M; m++)
      for (int64_t c = 0; c < C; c++)
        for (int64_t py = 0; py < H; py++)
          for (int64_t px = 0; px < W; px++) {
            double ref = in[2] ? in[2]->data[c] : 0.0;
            for (int64_t ky = 0; ky < k; ky++)
              for (int64_t kx = 0; kx < k; kx++) {
                int64_t iy = py + ky - r, ix = px + kx - r;
                if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                  ref += (double)in[0]->data[((m * C + c) * H + iy) * W + ix] * in[1]->data[(c * k + ky) * k + kx];
              }
            ck_assert_double_eq_tol(y->data[((m * C + c) * H + py) * W + px], ref, 1e-5);
          }
    autograd_clear_tape();
    expect_grad("depthwise_conv2d", f_dwconv, in, 3, NULL, TOL);
  }
}
END_TEST

static Tensor *f_maxpool(Tensor *const *in, void *c) {
  int *k = c;  // kernel, stride, pad, channels last
  return op_maxpool2d(in[0], k[0], k[1], k[2], k[3]);
}

// Distinct values spaced 0.05 apart (> 2 eps... with eps 1e-2 the argmax cannot flip).
static Tensor *spaced_values(Shape s, uint64_t seed) {
  Tensor *x = tensor_new(DEVICE_CPU, s);
  Rng rng = rng_make(seed);
  for (int64_t i = 0; i < x->numel; i++) x->data[i] = 0.05f * (float)i;
  for (int64_t i = x->numel - 1; i > 0; i--) {  // shuffle
    int64_t j = (int64_t)rng_next_below(&rng, (uint64_t)i + 1);
    float t = x->data[i];
    x->data[i] = x->data[j];
    x->data[j] = t;
  }
  tensor_set_requires_grad(x, true);
  return x;
}

START_TEST(grad_maxpool2d) {
  int params[][4] = {{3, 2, 1, 0}, {2, 2, 0, 0}, {3, 1, 1, 0}, {3, 2, 1, 1}, {2, 2, 0, 1}};
  Shape shapes[] = {SHAPE(2, 2, 7, 6), SHAPE(1, 3, 4, 6), SHAPE(1, 1, 5, 5), SHAPE(2, 7, 6, 3), SHAPE(1, 4, 6, 5)};
  for (int i = 0; i < 5; i++) {
    Tensor *x = spaced_values(shapes[i], 140 + i);
    expect_grad(params[i][3] ? "maxpool2d (channels last)" : "maxpool2d", f_maxpool, &x, 1, params[i], TOL);
  }
}
END_TEST

static Tensor *f_frozen_bn(Tensor *const *in, void *c) {
  return op_frozen_batchnorm2d(in[0], in[1], in[2], in[3], in[4], 1e-5f);
}

START_TEST(grad_frozen_batchnorm2d) {
  Tensor *in[5] = {U(SHAPE(2, 3, 4, 5), 150), test_uniform(SHAPE(3), 0.5f, 1.5f, 151, false),
                   test_uniform(SHAPE(3), -1, 1, 152, false), test_uniform(SHAPE(3), -1, 1, 153, false),
                   test_uniform(SHAPE(3), 0.2f, 2.0f, 154, false)};
  expect_grad("frozen_batchnorm2d", f_frozen_bn, in, 5, NULL, TOL);
}
END_TEST

// The fused form: relu?(frozen_bn(x) + residual). c: {has residual, relu}.
static Tensor *f_frozen_bn_act(Tensor *const *in, void *c) {
  const bool *flags = c;  // residual, relu, channels last
  return op_frozen_batchnorm2d_act(in[0], in[1], in[2], in[3], in[4], 1e-5f, flags[0] ? in[5] : NULL, flags[1],
                                   flags[2]);
}

START_TEST(grad_frozen_batchnorm2d_act) {
  for (int last = 0; last < 2; last++) {  // [2, 3, 4, 5], then channels last [2, 4, 5, 3]
    Shape xs = last ? SHAPE(2, 4, 5, 3) : SHAPE(2, 3, 4, 5);
    // Residual without ReLU: random statistics, no kink.
    bool add_only[3] = {true, false, last};
    Tensor *a[6] = {U(xs, 155),
                    test_uniform(SHAPE(3), 0.5f, 1.5f, 156, false),
                    test_uniform(SHAPE(3), -1, 1, 157, false),
                    test_uniform(SHAPE(3), -1, 1, 158, false),
                    test_uniform(SHAPE(3), 0.2f, 2.0f, 159, false),
                    U(xs, 160)};
    expect_grad(last ? "frozen_bn_add (channels last)" : "frozen_bn_add", f_frozen_bn_act, a, 6, add_only, TOL);
    // ReLU, with and without the residual: weight in [0.5, 1.5], bias and mean 0, var 1 (scale about
    // the weight, shift 0), x at least 0.3 from zero and the residual within 0.1: every
    // pre-activation is at least 0.05 from the kink, past the finite differences' step.
    bool add_relu[3] = {true, true, last}, relu_only[3] = {false, true, last};
    for (int k = 0; k < 2; k++) {  // expect_grad releases its inputs: a set per call
      uint64_t seed = 161 + 10 * (uint64_t)k;
      Tensor *b[6] = {
          test_uniform_away_from_zero(xs, 0.3f, 1.0f, seed, true), test_uniform(SHAPE(3), 0.5f, 1.5f, seed + 1, false),
          test_uniform(SHAPE(3), 0, 0, seed + 2, false),           test_uniform(SHAPE(3), 0, 0, seed + 3, false),
          test_uniform(SHAPE(3), 1, 1, seed + 4, false),           test_uniform(xs, -0.1f, 0.1f, seed + 5, true)};
      if (k == 0) expect_grad("frozen_bn_add_relu", f_frozen_bn_act, b, 6, add_relu, TOL);
      else {
        tensor_release(b[5]);
        expect_grad("frozen_bn_relu", f_frozen_bn_act, b, 5, relu_only, TOL);
      }
    }
  }
}
END_TEST

// --- softmax family and layer norm ---

static Tensor *f_softmax(Tensor *const *in, void *c) { return op_softmax(in[0], c ? (Tensor *)c : NULL); }
static Tensor *f_log_softmax(Tensor *const *in, void *c) { return op_log_softmax(in[0], c ? (Tensor *)c : NULL); }

// A key-padding style mask [2, 5]: -inf on the last keys of the second image.
static Tensor *padding_mask(void) {
  float m[10] = {0, 0, 0, 0, 0, 0, 0, 0, -INFINITY, -INFINITY};
  return tensor_from_host(DEVICE_CPU, SHAPE(2, 5), m);
}

static void check_softmax(const char *name, GradFn f) {
  Tensor *x = test_uniform(SHAPE(3, 7), -2, 2, 160, true);
  expect_grad(name, f, &x, 1, NULL, TOL);
  Tensor *one = test_uniform(SHAPE(4, 1), -2, 2, 161, true);
  expect_grad(name, f, &one, 1, NULL, TOL);
  Tensor *mask = padding_mask();  // x [2, 3, 5] = [images, queries, keys]
  Tensor *xm = test_uniform(SHAPE(2, 3, 5), -2, 2, 162, true);
  expect_grad(name, f, &xm, 1, mask, TOL);
  tensor_release(mask);
}

START_TEST(grad_softmax) { check_softmax("softmax", f_softmax); }
END_TEST
START_TEST(grad_log_softmax) { check_softmax("log_softmax", f_log_softmax); }
END_TEST

static Tensor *f_layernorm(Tensor *const *in, void *c) { return op_layernorm(in[0], in[1], in[2], 1e-5f); }

START_TEST(grad_layernorm) {
  Tensor *in[3] = {test_uniform(SHAPE(3, 2, 8), -2, 2, 170, true), test_uniform(SHAPE(8), 0.5f, 1.5f, 171, true),
                   U(SHAPE(8), 172)};
  expect_grad("layernorm", f_layernorm, in, 3, NULL, TOL);
  Tensor *plain[3] = {test_uniform(SHAPE(4, 5), -2, 2, 173, true), NULL, NULL};
  expect_grad("layernorm without affine", f_layernorm, plain, 3, NULL, TOL);
}
END_TEST

// --- shapes ---

static Tensor *f_reshape(Tensor *const *in, void *c) {
  return op_mul(op_reshape(in[0], SHAPE(4, -1)), op_reshape(in[0], SHAPE(4, 6)));
}
static Tensor *f_permute(Tensor *const *in, void *c) { return op_permute(in[0], (int *)c); }
static Tensor *f_transpose(Tensor *const *in, void *c) { return op_transpose(in[0], 0, -1); }

START_TEST(grad_reshape) {
  Tensor *x = U(SHAPE(2, 3, 4), 180);  // the reshaped tensor is used twice: gradients add up
  expect_grad("reshape", f_reshape, &x, 1, NULL, TOL);
}
END_TEST

// add, sub and reshape on inputs made by an op (not leaves): there an input without a gradient
// yet takes the output's gradient buffer (autograd_grad_take) instead of a zero fill and an add.
// u = 1.5 x and v = x * y are non-leaves; u feeds u + u (one buffer for both), u - v, then a
// reshape of it, and v + 0.5: each later use accumulates into a buffer an earlier one took.
static Tensor *f_taken_gradients(Tensor *const *in, void *c) {
  (void)c;
  Tensor *u = op_mul_scalar(in[0], 1.5f), *v = op_mul(in[0], in[1]);
  Tensor *twice = op_add(u, u);                          // [2, 3]
  Tensor *diff = op_reshape(op_sub(u, v), SHAPE(3, 2));  // [3, 2]
  Tensor *w = op_add_scalar(v, 0.5f);                    // [2, 3]
  Tensor *sum = op_add(op_mul(twice, w), op_reshape(diff, SHAPE(2, 3)));
  return op_add(sum, op_reshape(op_reshape(op_add(v, sum), SHAPE(6)), SHAPE(2, 3)));
}

// Frozen batch norm + residual + ReLU whose residual u = 1.5 x is made by an op, and one without a
// residual whose input z is: the residual (the input) takes the output's gradient buffer and the
// kernel writes its gradient there in place; u's (z's) other use, recorded earlier, runs its
// backward later and accumulates into that buffer. Channel 0's shift +5 keeps every unit alive,
// channel 1's -5 every unit dead (|x| <= 1.5): no kink for the finite differences.
static Tensor *f_taken_bn_residual(Tensor *const *in, void *c) {
  Tensor *const *stats = c;  // weight, bias, mean, var [2]
  Tensor *u = op_mul_scalar(in[0], 1.5f);
  Tensor *uu = op_mul(u, u);  // recorded before the norm: its backward runs after the norm's
  Tensor *bn = op_frozen_batchnorm2d_act(op_mul_scalar(in[0], 0.5f), stats[0], stats[1], stats[2], stats[3], 1e-5f, u,
                                         true, false);
  // Without a residual the norm's own input takes the buffer (z, used again before it).
  Tensor *z = op_mul_scalar(in[0], -0.8f);
  Tensor *zz = op_mul(z, z);
  Tensor *bn2 = op_frozen_batchnorm2d_act(z, stats[0], stats[1], stats[2], stats[3], 1e-5f, NULL, true, false);
  return op_add(op_add(bn, uu), op_add(bn2, zz));
}

START_TEST(grad_taken_buffers) {
  Tensor *in[2] = {U(SHAPE(2, 3), 190), U(SHAPE(2, 3), 191)};
  expect_grad("add/sub/reshape on non-leaf inputs", f_taken_gradients, in, 2, NULL, TOL);
  float w[2] = {1, 1}, b[2] = {5, -5}, mean[2] = {0, 0}, var[2] = {1, 1};
  Tensor *stats[4] = {tensor_from_host(DEVICE_CPU, SHAPE(2), w), tensor_from_host(DEVICE_CPU, SHAPE(2), b),
                      tensor_from_host(DEVICE_CPU, SHAPE(2), mean), tensor_from_host(DEVICE_CPU, SHAPE(2), var)};
  Tensor *x = U(SHAPE(2, 2, 3, 3), 192);
  expect_grad("frozen batch norm with a non-leaf residual", f_taken_bn_residual, &x, 1, stats, TOL);
  for (int i = 0; i < 4; i++) tensor_release(stats[i]);
}
END_TEST

START_TEST(grad_permute) {
  int perms[][4] = {{1, 0, 2, 3}, {0, 2, 3, 1}, {3, 2, 1, 0}};
  for (int i = 0; i < 3; i++) {
    Tensor *x = U(SHAPE(2, 3, 1, 4), 181 + i);
    expect_grad("permute", f_permute, &x, 1, perms[i], TOL);
  }
}
END_TEST

START_TEST(grad_transpose) {
  Tensor *x = U(SHAPE(3, 2, 5), 185);
  expect_grad("transpose", f_transpose, &x, 1, NULL, TOL);
}
END_TEST

static Tensor *f_concat(Tensor *const *in, void *c) { return op_concat(in, 3, *(int *)c); }

START_TEST(grad_concat) {
  int axis0 = 0, axis1 = 1, axis_last = -1;
  Tensor *a[3] = {U(SHAPE(1, 3, 2), 190), U(SHAPE(2, 3, 2), 191), U(SHAPE(3, 3, 2), 192)};
  expect_grad("concat axis 0", f_concat, a, 3, &axis0, TOL);
  Tensor *b[3] = {U(SHAPE(2, 1, 2), 193), U(SHAPE(2, 4, 2), 194), U(SHAPE(2, 2, 2), 195)};
  expect_grad("concat axis 1", f_concat, b, 3, &axis1, TOL);
  Tensor *c[3] = {U(SHAPE(2, 3, 1), 196), U(SHAPE(2, 3, 2), 197), U(SHAPE(2, 3, 3), 198)};
  expect_grad("concat last axis", f_concat, c, 3, &axis_last, TOL);
}
END_TEST

static Tensor *f_slice(Tensor *const *in, void *c) {
  int64_t *a = c;
  return op_slice(in[0], (int)a[0], a[1], a[2]);
}

START_TEST(grad_slice) {
  int64_t cases[][3] = {{0, 1, 3}, {1, 0, 2}, {2, 3, 5}, {-1, 0, 5}};
  for (int i = 0; i < 4; i++) {
    Tensor *x = U(SHAPE(4, 3, 5), 200 + i);
    expect_grad("slice", f_slice, &x, 1, cases[i], TOL);
  }
}
END_TEST

static Tensor *f_index_select(Tensor *const *in, void *c) {
  static const int64_t idx[] = {2, 0, 2, 3, 1, 2};  // repeats: gradients of a row add up
  return op_index_select(in[0], idx, 6);
}

START_TEST(grad_index_select) {
  Tensor *x = U(SHAPE(4, 3), 210);
  expect_grad("index_select", f_index_select, &x, 1, NULL, TOL);
  Tensor *v = U(SHAPE(4), 211);
  expect_grad("index_select 1-d", f_index_select, &v, 1, NULL, TOL);
}
END_TEST

// --- losses and boxes ---

static Tensor *f_cross_entropy(Tensor *const *in, void *c) {
  static const int64_t targets[] = {0, 4, 2, 4, 1};
  return op_cross_entropy(in[0], targets, c);
}

START_TEST(grad_cross_entropy) {
  Tensor *x = test_uniform(SHAPE(5, 5), -2, 2, 220, true);
  float w[5] = {1, 1, 1, 1, 0.1f};  // DETR's no-object weight on the last class
  Tensor *weight = tensor_from_host(DEVICE_CPU, SHAPE(5), w);
  expect_grad("cross_entropy weighted", f_cross_entropy, &x, 1, weight, TOL);
  Tensor *x2 = test_uniform(SHAPE(5, 5), -2, 2, 221, true);
  expect_grad("cross_entropy", f_cross_entropy, &x2, 1, NULL, TOL);
  tensor_release(weight);
}
END_TEST

static Tensor *f_focal(Tensor *const *in, void *c) {
  static const int64_t targets[] = {0, 4, 2, 4, 1, 3};  // 4 = C: a row with no positive class
  return op_sigmoid_focal_loss(in[0], targets, *(const float *)c, 2.0f);
}

START_TEST(grad_sigmoid_focal_loss) {
  float alpha = 0.25f, none = -1.0f;  // Conditional DETR's alpha, and no alpha weighting
  Tensor *x = test_uniform(SHAPE(6, 4), -3, 3, 225, true);
  expect_grad("sigmoid_focal_loss", f_focal, &x, 1, &alpha, TOL);
  Tensor *x2 = test_uniform(SHAPE(6, 4), -3, 3, 226, true);
  expect_grad("sigmoid_focal_loss, alpha < 0", f_focal, &x2, 1, &none, TOL);
}
END_TEST

static Tensor *f_l1(Tensor *const *in, void *c) { return op_l1_sum(in[0], in[1]); }

START_TEST(grad_l1_sum) {
  // b = a + d with |d| >= 0.05: no element sits on the kink |a - b| = 0.
  Tensor *a = U(SHAPE(6, 4), 230);
  Tensor *d = test_uniform_away_from_zero(SHAPE(6, 4), 0.05f, 0.5f, 231, false);
  Tensor *b = tensor_new(DEVICE_CPU, a->shape);
  for (int64_t i = 0; i < a->numel; i++) b->data[i] = a->data[i] + d->data[i];
  tensor_set_requires_grad(b, true);
  tensor_release(d);
  Tensor *in[2] = {a, b};
  expect_grad("l1_sum", f_l1, in, 2, NULL, TOL);
}
END_TEST

static Tensor *f_to_xyxy(Tensor *const *in, void *c) { return op_box_cxcywh_to_xyxy(in[0]); }
static Tensor *f_to_cxcywh(Tensor *const *in, void *c) { return op_box_xyxy_to_cxcywh(in[0]); }

START_TEST(grad_box_cxcywh_to_xyxy) {
  Tensor *b = test_uniform(SHAPE(2, 3, 4), 0.1f, 0.9f, 240, true);
  expect_grad("box_cxcywh_to_xyxy", f_to_xyxy, &b, 1, NULL, TOL);
}
END_TEST
START_TEST(grad_box_xyxy_to_cxcywh) {
  Tensor *b = test_uniform(SHAPE(5, 4), 0.1f, 0.9f, 241, true);
  expect_grad("box_xyxy_to_cxcywh", f_to_cxcywh, &b, 1, NULL, TOL);
}
END_TEST

static Tensor *f_giou(Tensor *const *in, void *c) { return op_box_giou(in[0], in[1]); }

// Pairs of xyxy boxes chosen so that no coordinate of a is within 0.05 of b's (no min/max tie),
// covering overlap, containment and disjoint boxes (where the intersection is clamped at 0).
START_TEST(grad_box_giou) {
  float a[] = {0.10f, 0.10f, 0.50f, 0.60f, 0.20f, 0.30f, 0.90f, 0.80f,
               0.05f, 0.05f, 0.25f, 0.30f, 0.30f, 0.20f, 0.70f, 0.45f};
  float b[] = {0.30f, 0.20f, 0.70f, 0.90f, 0.40f, 0.45f, 0.60f, 0.65f,
               0.55f, 0.50f, 0.85f, 0.95f, 0.10f, 0.35f, 0.90f, 0.95f};
  Tensor *in[2] = {tensor_from_host(DEVICE_CPU, SHAPE(4, 4), a), tensor_from_host(DEVICE_CPU, SHAPE(4, 4), b)};
  tensor_set_requires_grad(in[0], true);
  tensor_set_requires_grad(in[1], true);
  GradTol tol = {.eps = 5e-3, .atol = 2e-3, .rtol = 1e-2};  // eps below the 0.05 tie margin
  expect_grad("box_giou", f_giou, in, 2, NULL, tol);
}
END_TEST

// --- DETR's set criterion as a whole (final + one auxiliary output), matching held fixed ---

typedef struct {
  CriterionConfig cfg;
  DetrTarget targets[2];
  const DetrMatch *matches[2];  // [final, aux0][image]
} CriterionCtx;

static Tensor *f_criterion(Tensor *const *in, void *c) {
  CriterionCtx *ctx = c;
  CriterionResult r;
  char err[128];
  DetrLayerOutput final = {in[0], in[1]}, aux = {in[2], in[3]};
  ck_assert_int_eq(criterion_forward(&ctx->cfg, final, &aux, 1, ctx->targets, 3.0f, ctx->matches, &r, err, sizeof err),
                   0);
  criterion_result_free(&r);
  return r.total;
}

START_TEST(grad_criterion) {
  // Two images, 5 queries, 3 classes + no-object; image 0 has 2 targets, image 1 has 1.
  float boxes0[8] = {0.3f, 0.4f, 0.2f, 0.3f, 0.6f, 0.5f, 0.25f, 0.2f}, boxes1[4] = {0.5f, 0.5f, 0.4f, 0.3f};
  int64_t labels0[2] = {1, 0}, labels1[1] = {2};
  CriterionCtx ctx = {.cfg = criterion_config_default(3)};
  ctx.targets[0] = (DetrTarget){2, boxes0, labels0};
  ctx.targets[1] = (DetrTarget){1, boxes1, labels1};
  Tensor *in[4] = {
      test_uniform(SHAPE(2, 5, 4), -2, 2, 250, true), test_uniform(SHAPE(2, 5, 4), 0.15f, 0.85f, 251, true),
      test_uniform(SHAPE(2, 5, 4), -2, 2, 252, true), test_uniform(SHAPE(2, 5, 4), 0.15f, 0.85f, 253, true)};
  DetrMatch m[2][2];
  char err[128];
  for (int l = 0; l < 2; l++) {
    ck_assert_int_eq(
        detr_hungarian_match(in[2 * l], in[2 * l + 1], ctx.targets, ctx.cfg.matcher, m[l], err, sizeof err), 0);
    ctx.matches[l] = m[l];
  }
  GradTol tol = {.eps = 2e-3, .atol = 2e-3, .rtol = 1e-2};  // small eps: no |pred - target| kink crossed
  expect_grad("criterion", f_criterion, in, 4, &ctx, tol);
  detr_matches_free(m[0], 2);
  detr_matches_free(m[1], 2);
}
END_TEST

// --- composite blocks at tiny sizes: every input and parameter element is checked ---

// The inputs of a block's check: its data inputs followed by all its parameters.
static int block_inputs(Tensor **in, int n_data, const ParamStore *ps) {
  int n = n_data;
  for (int i = 0; i < ps->count; i++)
    if (ps->items[i].kind == PARAM_TRAINABLE) in[n++] = tensor_retain(ps->items[i].tensor);
  return n;
}

// Random parameters: weights U(-0.5, 0.5), layer-norm weights around 1, batch-norm statistics
// with variances away from 0.
static void randomize_params(ParamStore *ps, uint64_t seed) {
  Rng rng = rng_make(seed);
  for (int i = 0; i < ps->count; i++) {
    Param *p = &ps->items[i];
    bool var = strstr(p->name, "running_var") != NULL, scale = strstr(p->name, "norm") && strstr(p->name, "weight");
    tensor_uniform_(p->tensor, &rng, var || scale ? 0.5f : -0.5f, var || scale ? 1.5f : 0.5f);
  }
}

static const NnCtx EVAL_CTX = {.training = false};

typedef struct {
  MultiheadAttention mha;
  Tensor *mask;
} MhaCtx;

static Tensor *f_mha(Tensor *const *in, void *c) {
  MhaCtx *m = c;
  return mha_forward(&m->mha, &EVAL_CTX, in[0], in[1], in[1], m->mask);
}

START_TEST(grad_attention) {
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  MhaCtx c = {.mha = mha_create(&ps, "attn", 8, 2, 0.1f)};
  randomize_params(&ps, 300);
  float m[2 * 5] = {0, 0, 0, 0, 0, 0, 0, 0, -INFINITY, -INFINITY};  // image 1: 2 padded keys
  c.mask = tensor_from_host(DEVICE_CPU, SHAPE(2, 5), m);
  Tensor *in[16] = {U(SHAPE(2, 3, 8), 301), U(SHAPE(2, 5, 8), 302)};
  int n = block_inputs(in, 2, &ps);
  expect_grad("attention", f_mha, in, n, &c, TOL);
  tensor_release(c.mask);
  params_free(&ps);
}
END_TEST

typedef struct {
  EncoderLayer enc;
  DecoderLayer dec;
  FeatureGeometry geom;
  Tensor *mask, *pos, *query_pos;
} LayerCtx;

static Tensor *f_encoder(Tensor *const *in, void *c) {
  LayerCtx *l = c;
  char err[128];
  return encoder_layer_forward(&l->enc, &EVAL_CTX, in[0], l->pos, &l->geom, NULL, err, sizeof err);
}

static Tensor *f_decoder(Tensor *const *in, void *c) {
  LayerCtx *l = c;
  return decoder_layer_forward(&l->dec, &EVAL_CTX, in[0], in[1], l->mask, l->pos, l->query_pos, NULL);
}

static void check_layers(bool pre_norm) {
  TransformerShape s = {.dim = 8, .heads = 2, .ffn_dim = 12, .dropout = 0.1f, .pre_norm = pre_norm};
  float m[2 * 6] = {0, 0, 0, 0, 0, 0, 0, 0, -INFINITY, 0, 0, -INFINITY};  // image 1: 2x2 of a 2x3 map
  uint8_t pad[2 * 6];
  for (int i = 0; i < 12; i++) pad[i] = m[i] != 0.0f;
  LayerCtx c = {.mask = tensor_from_host(DEVICE_CPU, SHAPE(2, 6), m),
                .pos = test_uniform(SHAPE(2, 6, 8), -1, 1, 310, false),
                .query_pos = test_uniform(SHAPE(3, 8), -1, 1, 311, false)};
  ParamStore pe, pd;
  params_init(&pe, DEVICE_CPU);
  params_init(&pd, DEVICE_CPU);
  feature_geometry_make(pad, 2, 2, 3, DEVICE_CPU, &c.geom);
  c.enc = encoder_layer_create(&pe, "enc", s, NULL, NULL);
  c.dec = decoder_layer_create(&pd, "dec", s);
  randomize_params(&pe, 312);
  randomize_params(&pd, 313);
  // eps 1e-3: the FFN's 144 ReLU inputs must not cross 0 within a step.
  GradTol tol = {.eps = 1e-3, .atol = 3e-3, .rtol = 1e-2};
  Tensor *in[40] = {U(SHAPE(2, 6, 8), 314)};
  int n = block_inputs(in, 1, &pe);
  expect_grad(pre_norm ? "encoder layer (pre-norm)" : "encoder layer", f_encoder, in, n, &c, tol);
  Tensor *din[48] = {U(SHAPE(2, 3, 8), 315), U(SHAPE(2, 6, 8), 316)};
  n = block_inputs(din, 2, &pd);
  expect_grad(pre_norm ? "decoder layer (pre-norm)" : "decoder layer", f_decoder, din, n, &c, tol);
  params_free(&pe);
  params_free(&pd);
  feature_geometry_free(&c.geom);
  tensor_release(c.mask);
  tensor_release(c.pos);
  tensor_release(c.query_pos);
}

START_TEST(grad_encoder_layer_and_decoder_layer) {
  check_layers(false);
  check_layers(true);
}
END_TEST

static Tensor *f_bottleneck(Tensor *const *in, void *c) { return resblock_forward(c, in[0]); }

START_TEST(grad_bottleneck) {
  // A ResNet-50 layer2-style first block at tiny width: 1x1 (8->4), 3x3 stride 2 (4->4),
  // 1x1 (4->16), downsample 1x1 stride 2 (8->16), frozen batch norms with random statistics; nchw,
  // then channels last (as resnet.c builds it).
  for (int last = 0; last < 2; last++) {
    ParamStore ps;
    params_init(&ps, DEVICE_CPU);
    ResBlock b = {.bottleneck = true, .has_downsample = true};
    b.conv1 = conv2d_create(&ps, "b.conv1", 8, 4, 1, 1, 0, 1, false, PARAM_TRAINABLE, LR_GROUP_BACKBONE);
    b.bn1 = frozen_bn_create(&ps, "b.bn1", 4);
    b.conv2 = conv2d_create(&ps, "b.conv2", 4, 4, 3, 2, 1, 1, false, PARAM_TRAINABLE, LR_GROUP_BACKBONE);
    b.bn2 = frozen_bn_create(&ps, "b.bn2", 4);
    b.conv3 = conv2d_create(&ps, "b.conv3", 4, 16, 1, 1, 0, 1, false, PARAM_TRAINABLE, LR_GROUP_BACKBONE);
    b.bn3 = frozen_bn_create(&ps, "b.bn3", 16);
    b.down_conv = conv2d_create(&ps, "b.downsample.0", 8, 16, 1, 2, 0, 1, false, PARAM_TRAINABLE, LR_GROUP_BACKBONE);
    b.down_bn = frozen_bn_create(&ps, "b.downsample.1", 16);
    Conv2d *convs[4] = {&b.conv1, &b.conv2, &b.conv3, &b.down_conv};
    FrozenBn *bns[4] = {&b.bn1, &b.bn2, &b.bn3, &b.down_bn};
    for (int i = 0; i < 4; i++) convs[i]->p.channels_last = bns[i]->channels_last = last;
    randomize_params(&ps, 320);
    Tensor *in[8] = {U(last ? SHAPE(1, 5, 5, 8) : SHAPE(1, 8, 5, 5), 321)};
    int n = block_inputs(in, 1, &ps);
    // eps 1e-3: the block has ~300 ReLU inputs; a smaller step keeps them from crossing 0.
    GradTol tol = {.eps = 1e-3, .atol = 3e-3, .rtol = 1e-2};
    expect_grad(last ? "bottleneck (channels last)" : "bottleneck", f_bottleneck, in, n, &b, tol);
    params_free(&ps);
  }
}
END_TEST

// --- ENACT: the clustering op (both sign options), the smoothing, the attention over clusters
// and a whole ENACT encoder layer; batches with padding and regions of length 1 ---

// 2 images of 3x4 pixels; image 1 is padded to its top-left 2x3 (pixels 16,17,18, 20,21,22).
// Regions: image 0 [0,3) [3,4) [4,9) [9,12); image 1 [12,15) [16,17) [17,19) [20,21) [21,23).
static const int64_t REGION_STARTS[] = {0, 3, 4, 9, 12, 16, 17, 20, 21};
static const int64_t REGION_LENGTHS[] = {3, 1, 5, 3, 3, 1, 2, 1, 2};
#define N_REGIONS 9
static const float SIGNS[24] = {1, 1, 1, -1, 1, 1, 1, 1, 1, -1, -1, -1, 1, 1, 1, 0, -1, 1, 1, 0, 1, -1, -1, 0};

static const int64_t REGION_IMAGES[] = {0, N_REGIONS};  // one image of all 24 rows

static Tensor *f_enact_cluster(Tensor *const *in, void *c) {
  Tensor *vc;
  EnactRegionIndex index =
      enact_region_index_upload(DEVICE_CPU, REGION_STARTS, REGION_LENGTHS, N_REGIONS, REGION_IMAGES, 1);
  Tensor *signs = c ? op_constant(DEVICE_CPU, SHAPE(24), SIGNS) : NULL;
  Tensor *kc = op_enact_cluster(in[0], in[1], in[2], signs, &index, &vc);
  Tensor *both[2] = {kc, vc};
  return op_concat(both, 2, 0);
}

START_TEST(grad_enact_cluster) {
  for (int with_sign = 0; with_sign < 2; with_sign++) {
    Tensor *in[3] = {U(SHAPE(24, 5), 400 + with_sign), U(SHAPE(24, 5), 402 + with_sign),
                     test_uniform(SHAPE(24), -2, 2, 404 + with_sign, true)};
    expect_grad(with_sign ? "enact_cluster (sign factor)" : "enact_cluster", f_enact_cluster, in, 3,
                with_sign ? (void *)SIGNS : NULL, TOL);
  }
}
END_TEST

typedef struct {
  int64_t vh[2], vw[2];
  float taps[64];
  int ntaps;
  bool one_d;
} SmoothCtx;

static Tensor *f_enact_smooth(Tensor *const *in, void *c) {
  SmoothCtx *s = c;
  return op_enact_smooth(in[0], 3, 4, s->vh, s->vw, s->taps, s->ntaps, s->one_d);
}

START_TEST(grad_enact_smooth) {
  for (int one_d = 0; one_d < 2; one_d++) {
    SmoothCtx c = {.vh = {3, 2}, .vw = {4, 3}, .one_d = one_d};
    c.ntaps = enact_gaussian_taps(1.0f, c.taps);  // 3 taps: the 3x4 map sees the kernel's edges
    Tensor *x = U(SHAPE(2, 12), 410 + one_d);
    expect_grad(one_d ? "enact_smooth (1-D)" : "enact_smooth", f_enact_smooth, &x, 1, &c, TOL);
  }
}
END_TEST

typedef struct {
  MultiheadAttention mha;
  EnactRegions regions;
} ClusterAttnCtx;

static Tensor *f_cluster_attention(Tensor *const *in, void *c) {
  ClusterAttnCtx *a = c;
  EnactRegionIndex index = enact_regions_upload(DEVICE_CPU, &a->regions);
  return enact_cluster_attention(&a->mha, &EVAL_CTX, in[0], in[1], in[2], &index);
}

// The op alone: both scalings (ENACT's 1/sqrt(hd) inside, the authors' 1/hd outside), attention
// dropout, and an image of one cluster.
typedef struct {
  float scale, out_scale, p;  // p: attention dropout, the same draw every call
} ClusterAttnOpCtx;

static Tensor *f_cluster_attention_op(Tensor *const *in, void *c) {
  ClusterAttnOpCtx *a = c;
  int64_t starts[4] = {0, 2, 3, 7}, lengths[4] = {2, 1, 4, 1}, offsets[3] = {0, 3, 4};
  EnactRegionIndex index = enact_region_index_upload(DEVICE_CPU, starts, lengths, 4, offsets, 2);
  Rng rng = rng_make(431);
  return op_cluster_attention(in[0], in[1], in[2], &index, 2, a->scale, a->out_scale, a->p, &rng);
}

START_TEST(grad_cluster_attention) {
  ClusterAttnOpCtx c[3] = {{0.5f, 1.0f, 0.0f}, {1.0f, 0.25f, 0.0f}, {0.5f, 1.0f, 0.4f}};
  static const char *what[3] = {"cluster attention", "cluster attention (outside scale)",
                                "cluster attention (dropout)"};
  for (int k = 0; k < 3; k++) {
    Tensor *in[3] = {U(SHAPE(2, 5, 6), 425 + k), U(SHAPE(4, 6), 428 + k), U(SHAPE(4, 6), 431 + k)};
    expect_grad(what[k], f_cluster_attention_op, in, 3, &c[k], TOL);
  }
}
END_TEST

START_TEST(grad_enact_attention) {
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  ClusterAttnCtx c = {.mha = mha_create(&ps, "attn", 8, 2, 0.1f)};
  randomize_params(&ps, 420);
  int64_t starts[5] = {0, 2, 3, 7, 9}, lengths[5] = {2, 1, 4, 2, 1}, offsets[3] = {0, 3, 5};
  c.regions = (EnactRegions){.count = 5, .starts = starts, .lengths = lengths, .image_offset = offsets, .B = 2};
  // Queries [2, 6, 8]; clusters [5, 8]: image 0 has 3, image 1 has 2.
  Tensor *in[16] = {U(SHAPE(2, 6, 8), 421), U(SHAPE(5, 8), 422), U(SHAPE(5, 8), 423)};
  int n = block_inputs(in, 3, &ps);
  expect_grad("enact attention", f_cluster_attention, in, n, &c, TOL);
  params_free(&ps);
}
END_TEST

typedef struct {
  EncoderLayer layer;
  EnactGeometry geom;
  EnactTrace fixed;
  Tensor *pos;
} EnactLayerCtx;

// The encoder layer with ENACT's attention on regions held fixed.
static Tensor *enact_layer(EnactLayerCtx *e, Tensor *src, const EnactTrace *fixed, EnactTrace *trace) {
  Tensor *x = encoder_layer_attn_input(&e->layer, src);
  Tensor *attn =
      enact_attention(e->layer.attn_extras, &e->layer.self_attn, &EVAL_CTX, x, e->pos, &e->geom, fixed, trace);
  return encoder_layer_finish(&e->layer, &EVAL_CTX, src, attn);
}

static Tensor *f_enact_layer(Tensor *const *in, void *c) {
  EnactLayerCtx *e = c;
  return enact_layer(e, in[0], &e->fixed, NULL);
}

START_TEST(grad_enact_layer) {
  for (int with_sign = 0; with_sign < 2; with_sign++) {
    TransformerShape s = {.dim = 8, .heads = 2, .ffn_dim = 12, .dropout = 0.1f};
    AttnSettings settings;
    attn_settings_default(&settings);
    char err[128];
    ck_assert_int_eq(attn_settings_set(&settings, "enact_sigma", "1", err, sizeof err), 1);
    ck_assert_int_eq(attn_settings_set(&settings, "enact_sign_factor", with_sign ? "true" : "false", err, sizeof err),
                     1);
    ParamStore ps;
    params_init(&ps, DEVICE_CPU);
    EnactLayerCtx c = {0};
    c.layer = encoder_layer_create(&ps, "enc", s, encoder_attn_find("enact"), &settings);
    randomize_params(&ps, 450 + with_sign);
    // FFN biases of +-4: each hidden ReLU is on or off for every token, none sits within a step of
    // its kink (288 ReLU inputs would otherwise put one there by chance); both branches are checked.
    for (int64_t k = 0; k < c.layer.linear1.bias->numel; k++) c.layer.linear1.bias->data[k] = k % 2 ? 4.0f : -4.0f;
    uint8_t pad[24] = {0};
    for (int i = 0; i < 24; i++) {
      int y = (i % 12) / 4, x = i % 4;
      pad[i] = i >= 12 && (y >= 2 || x >= 3);
    }
    ck_assert_int_eq(enact_geometry(pad, 2, 3, 4, &c.geom, err, sizeof err), 0);
    c.pos = test_uniform(SHAPE(2, 12, 8), -1, 1, 432, false);
    Tensor *in[24] = {U(SHAPE(2, 12, 8), 433)};
    // The regions (and signs) of the unperturbed input, held fixed while differencing.
    ScopeMark mark = tensor_scope_mark();
    bool was = autograd_set_grad_enabled(false);
    enact_layer(&c, in[0], NULL, &c.fixed);
    enact_trace_to_host(&c.fixed);  // the host copies outlive the scope; its tensors do not
    c.fixed.entropy = c.fixed.signs_t = NULL;
    c.fixed.index = (EnactRegionIndex){0};
    autograd_set_grad_enabled(was);
    tensor_scope_release(mark);
    ck_assert_int_gt(c.fixed.regions.count, 2);
    int n = block_inputs(in, 1, &ps);
    expect_grad(with_sign ? "enact encoder layer (sign factor)" : "enact encoder layer", f_enact_layer, in, n, &c, TOL);
    enact_trace_free(&c.fixed);
    enact_geometry_free(&c.geom);
    encoder_layer_free(&c.layer);
    tensor_release(c.pos);
    params_free(&ps);
  }
}
END_TEST

// --- the encoder-attention variants (nn/encoder_attn.h): each one's encoder layer, input and every
// parameter, on two images of different sizes (image 1 valid in the top-left 2x3 of a 3x4 map).
// ENACT's is grad_enact_layer above (its regions are held fixed while differencing). ---

typedef struct {
  EncoderLayer layer;
  FeatureGeometry geom;
  Tensor *pos;
} VariantCtx;

static Tensor *f_variant_layer(Tensor *const *in, void *c) {
  VariantCtx *v = c;
  char err[128];
  Tensor *y = encoder_layer_forward(&v->layer, &EVAL_CTX, in[0], v->pos, &v->geom, NULL, err, sizeof err);
  ck_assert_msg(y != NULL, "%s", err);
  return y;
}

// key=value (key NULL: none) sets one of the variant's settings; index: the layer's place in the encoder.
static void check_variant_with(const char *name, const char *key, const char *value, int index) {
  TransformerShape s = {.dim = 8, .heads = 2, .ffn_dim = 12, .dropout = 0.1f};
  AttnSettings settings;
  attn_settings_default(&settings);
  char serr[128];  // enact_official: sigma 1 (5 taps), so that a 12-pixel map has more than one run
  ck_assert_int_eq(attn_settings_set(&settings, "enact_official_sigma", "1", serr, sizeof serr), 1);
  if (key) ck_assert_int_eq(attn_settings_set(&settings, key, value, serr, sizeof serr), 1);
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  VariantCtx c = {.pos = test_uniform(SHAPE(2, 12, 8), -1, 1, 470, false)};
  c.layer = encoder_layer_create(&ps, "enc", s, encoder_attn_find(name), &settings);
  c.layer.index = index;
  ck_assert_ptr_nonnull(c.layer.attn);
  randomize_params(&ps, 471);
  // FFN biases of +-4 keep every hidden ReLU away from its kink (grad_enact_layer says why).
  for (int64_t k = 0; k < c.layer.linear1.bias->numel; k++) c.layer.linear1.bias->data[k] = k % 2 ? 4.0f : -4.0f;
  // FLatten's ReLU on q and k: biases of +2 keep those inputs positive (relu's kink is tested alone).
  if (!strcmp(name, "focused"))
    for (int64_t k = 0; k < 16; k++) c.layer.self_attn.in_proj_bias->data[k] = 2.0f;
  uint8_t pad[24] = {0};
  for (int i = 12; i < 24; i++) pad[i] = (i - 12) / 4 >= 2 || (i - 12) % 4 >= 3;
  feature_geometry_make(pad, 2, 3, 4, DEVICE_CPU, &c.geom);
  Tensor *in[40] = {U(SHAPE(2, 12, 8), 472)};
  if (c.layer.attn->own_projections) {  // enact_official: chunks of 2+ pixels, 2+ per image (the weights matter)
    ScopeMark mark = tensor_scope_mark();
    AttnTrace t;
    char err[128];
    ck_assert_msg(encoder_layer_forward(&c.layer, &EVAL_CTX, in[0], c.pos, &c.geom, &t, err, sizeof err), "%s", err);
    attn_trace_resolve(&t);
    ck_assert_int_eq(t.n_exports, 2);
    int64_t size = t.exports[1].i64[0];
    ck_assert_msg(size >= 2 && 12 / size >= 2, "%s: cluster size %lld", name, (long long)size);
    attn_trace_free(&t);
    tensor_scope_release(mark);
  }
  int n = block_inputs(in, 1, &ps);
  GradTol tol = {.eps = 1e-3, .atol = 3e-3, .rtol = 1e-2};
  char what[96];
  snprintf(what, sizeof what, "encoder layer %d, %s attention%s%s%s%s", index, name, key ? " " : "", key ? key : "",
           key ? "=" : "", key ? value : "");
  expect_grad(what, f_variant_layer, in, n, &c, tol);
  feature_geometry_free(&c.geom);
  encoder_layer_free(&c.layer);
  tensor_release(c.pos);
  params_free(&ps);
}

static void check_variant(const char *name) { check_variant_with(name, NULL, NULL, 0); }

// --- k-means cross-attention (nn/cross_attn_kmeans.c, docs/kmeans_cross_attention.md) ---

// op_cluster_argmax against a direct loop: logits [4, 3, 5] = [2 images x 2 heads, queries, pixels],
// image 1's last 2 pixels padded, a planted tie (the first query wins, as torch's max). Padded
// pixels go to no query; sum: every unpadded column holds one 1; mean: 1 / the query's pixel count.
// The output is a constant (no gradient) even when the logits take one.
START_TEST(grad_cluster_argmax) {
  Tensor *x = test_uniform(SHAPE(4, 3, 5), -2, 2, 170, true), *mask = padding_mask();
  x->data[0 * 15 + 0 * 5 + 1] = x->data[0 * 15 + 2 * 5 + 1] = 5.0f;  // image 0, head 0, pixel 1: queries 0 and 2 tie
  for (int mean = 0; mean < 2; mean++) {
    ScopeMark mark = tensor_scope_mark();
    Tensor *winners = NULL, *y = op_cluster_argmax(x, mask, mean, &winners);
    ck_assert(!y->requires_grad);
    ck_assert_int_eq(autograd_tape_size(), 0);
    for (int64_t n = 0; n < 4; n++) {
      int want[5], count[3] = {0, 0, 0};
      for (int64_t l = 0; l < 5; l++) {
        bool padded = n >= 2 && l >= 3;
        int best = 0;
        for (int q = 1; q < 3; q++)
          if (x->data[n * 15 + q * 5 + l] > x->data[n * 15 + best * 5 + l]) best = q;
        want[l] = padded ? -1 : best;
        if (!padded) count[best]++;
        ck_assert_msg(winners->data[n * 5 + l] == (float)want[l], "winner of row %lld pixel %lld", (long long)n,
                      (long long)l);
      }
      if (n == 0) ck_assert_int_eq(want[1], 0);  // the tie
      for (int q = 0; q < 3; q++)
        for (int64_t l = 0; l < 5; l++) {
          float w = want[l] == q ? (mean ? 1.0f / (float)count[q] : 1.0f) : 0.0f;
          ck_assert_msg(y->data[n * 15 + q * 5 + l] == w, "%s: y[%lld, %d, %lld] = %g, expected %g",
                        mean ? "mean" : "sum", (long long)n, q, (long long)l, y->data[n * 15 + q * 5 + l], w);
          if (want[l] < 0) ck_assert(y->data[n * 15 + q * 5 + l] == 0.0f);  // padded: never assigned
        }
    }
    tensor_scope_release(mark);
  }
  tensor_release(x);
  tensor_release(mask);
}
END_TEST

typedef struct {
  MultiheadAttention mha;
  Tensor *mask, *assign;
} KmeansCtx;

static void drop_grad(Tensor *t) {
  tensor_release(t->grad);
  t->grad = NULL;
}

static Tensor *f_kmeans_update(Tensor *const *in, void *c) {
  KmeansCtx *k = c;
  return kmeans_cross_attention_update(&k->mha, k->assign, in[0]);
}

// The k-means cross-attention in double from the parameters (the definition in
// docs/kmeans_cross_attention.md): out [B, Lq, d].
static void kmeans_direct(const MultiheadAttention *a, const Tensor *query, const Tensor *key, const Tensor *value,
                          const float *mask, double *out) {
  int64_t B = query->shape.d[0], Lq = query->shape.d[1], Lk = key->shape.d[1], d = a->dim, h = a->heads, hd = d / h;
  const float *W = a->in_proj_weight->data, *bias = a->in_proj_bias->data;
  double *q = calloc((size_t)(Lq * d), sizeof *q), *k = calloc((size_t)(Lk * d), sizeof *k),
         *v = calloc((size_t)(Lk * d), sizeof *v), *mix = calloc((size_t)(Lq * d), sizeof *mix);
  for (int64_t b = 0; b < B; b++) {
    for (int64_t o = 0; o < d; o++) {
      for (int64_t i = 0; i < Lq; i++) {
        double s = bias[o];
        for (int64_t c = 0; c < d; c++) s += (double)W[o * d + c] * query->data[(b * Lq + i) * d + c];
        q[i * d + o] = s / sqrt((double)hd);
      }
      for (int64_t j = 0; j < Lk; j++) {
        double sk = bias[d + o], sv = bias[2 * d + o];
        for (int64_t c = 0; c < d; c++) {
          sk += (double)W[(d + o) * d + c] * key->data[(b * Lk + j) * d + c];
          sv += (double)W[(2 * d + o) * d + c] * value->data[(b * Lk + j) * d + c];
        }
        k[j * d + o] = sk;
        v[j * d + o] = sv;
      }
    }
    for (int64_t i = 0; i < Lq * d; i++) mix[i] = 0;
    for (int64_t hh = 0; hh < h; hh++) {
      int win[64], count[64] = {0};
      for (int64_t j = 0; j < Lk; j++) {
        win[j] = -1;
        if (mask && mask[b * Lk + j] != 0.0f) continue;
        double best = -INFINITY;
        for (int64_t i = 0; i < Lq; i++) {
          double s = 0;
          for (int64_t c = 0; c < hd; c++) s += q[i * d + hh * hd + c] * k[j * d + hh * hd + c];
          if (s > best) best = s, win[j] = (int)i;
        }
        count[win[j]]++;
      }
      for (int64_t j = 0; j < Lk; j++)
        if (win[j] >= 0)
          for (int64_t c = 0; c < hd; c++) mix[win[j] * d + hh * hd + c] += v[j * d + hh * hd + c] / count[win[j]];
    }
    for (int64_t i = 0; i < Lq; i++)
      for (int64_t o = 0; o < d; o++) {
        double s = a->out_proj.bias->data[o];
        for (int64_t c = 0; c < d; c++) s += (double)a->out_proj.weight->data[o * d + c] * mix[i * d + c];
        out[(b * Lq + i) * d + o] = s;
      }
  }
  free(q), free(k), free(v), free(mix);
}

// k-means cross-attention: the forward against the direct loop (with padding), finite differences
// of its differentiable part with the assignment held fixed (value and every parameter; the query
// and key rows of in_proj have zero gradient there), and the full op passing no gradient to the
// query or key inputs.
START_TEST(grad_kmeans_cross_attn) {
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  KmeansCtx c = {.mha = mha_create(&ps, "attn", 8, 2, 0.1f)};
  randomize_params(&ps, 320);
  c.mask = padding_mask();  // image 1: 2 padded pixels
  Tensor *query = U(SHAPE(2, 3, 8), 321), *key = U(SHAPE(2, 5, 8), 322), *value = U(SHAPE(2, 5, 8), 323);
  // Forward against the definition.
  ScopeMark mark = tensor_scope_mark();
  Tensor *out = kmeans_cross_attention(&c.mha, &EVAL_CTX, query, key, value, c.mask, NULL);
  double want[2 * 3 * 8];
  kmeans_direct(&c.mha, query, key, value, c.mask->data, want);
  for (int64_t i = 0; i < out->numel; i++)
    ck_assert_msg(fabs(out->data[i] - want[i]) <= 1e-5 * (1 + fabs(want[i])), "out[%lld] = %.7g, expected %.7g",
                  (long long)i, out->data[i], want[i]);
  // The full path: gradient into value and the parameters only.
  autograd_backward(op_sum_all(out));
  ck_assert_msg(!query->grad && !key->grad, "the assignment passed a gradient to the query or key");
  ck_assert(value->grad);
  tensor_scope_release(mark);
  for (int i = 0; i < ps.count; i++) drop_grad(ps.items[i].tensor);
  drop_grad(value);
  // Padded pixels are never assigned, in any head.
  Tensor *winners = NULL;
  c.assign = tensor_retain(kmeans_cross_attention_assign(&c.mha, query, key, c.mask, &winners));
  for (int64_t n = 2; n < 4; n++)
    for (int64_t l = 3; l < 5; l++) ck_assert(winners->data[n * 5 + l] == -1.0f);
  // Finite differences with the assignment fixed.
  Tensor *in[16] = {value};
  int n = block_inputs(in, 1, &ps);
  expect_grad("kmeans cross-attention (assignment fixed)", f_kmeans_update, in, n, &c, TOL);
  tensor_release(c.assign);
  tensor_release(c.mask);
  tensor_release(query);
  tensor_release(key);
  params_free(&ps);
}
END_TEST

START_TEST(grad_attn_dense) { check_variant("dense"); }
END_TEST
START_TEST(grad_attn_efficient) { check_variant("efficient"); }
END_TEST
START_TEST(grad_attn_hydra) { check_variant("hydra"); }
END_TEST
START_TEST(grad_attn_focused) { check_variant("focused"); }
END_TEST
START_TEST(grad_attn_sra) { check_variant("sra"); }
END_TEST
// The official ENACT (nn/attn_enact_official.c): its cluster size is piecewise constant in the input;
// at these inputs it does not change within a difference step (check_variant would fail if it did).
START_TEST(grad_attn_enact_official) { check_variant("enact_official"); }
END_TEST
// Swin: one 7x7 window (the default) holds the whole 3x4 map; with W = 2 the map is padded to 4x4,
// four windows, and layer 1 shifts them by 1 (Swin's mask between the rolled-together regions).
START_TEST(grad_attn_swin) {
  check_variant("swin");
  check_variant_with("swin", "swin_window", "2", 0);
  check_variant_with("swin", "swin_window", "2", 1);
}
END_TEST

// --- Conditional DETR's decoder (nn/decoder_conditional.c): two layers, every parameter, the
// memory and the queries, two images of different sizes (padding); the output holds both layers'
// normed outputs and boxes from the last, so the reference points' path is checked too ---

typedef struct {
  const DecoderKind *kind;
  void *state;
  Tensor *pos, *mask;
} CondCtx;

static Tensor *f_conditional(Tensor *const *in, void *c) {
  const CondCtx *k = c;
  DecoderInput din = {.memory = in[0], .pos = k->pos, .key_mask = k->mask, .query_embed = in[1], .batch = 2};
  DecoderOutput out;
  k->kind->forward(k->state, &EVAL_CTX, &din, &out);
  Tensor *boxes = k->kind->boxes(k->state, op_slice(out.hs[1], 2, 0, 4), &out, 1);  // [2, 3, 4]
  Tensor *parts[3] = {out.hs[0], out.hs[1], boxes};
  return op_concat(parts, 3, 2);
}

START_TEST(grad_decoder_conditional) {
  float m[2 * 6] = {0, 0, 0, 0, 0, 0, 0, 0, -INFINITY, 0, 0, -INFINITY};  // image 1: 2x2 of a 2x3 map
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  CondCtx c = {.kind = decoder_find("conditional"),
               .pos = test_uniform(SHAPE(2, 6, 8), -1, 1, 340, false),
               .mask = tensor_from_host(DEVICE_CPU, SHAPE(2, 6), m)};
  ck_assert_ptr_nonnull(c.kind);
  c.state = calloc(1, c.kind->state_size);
  DecoderShape shape = {.s = {.dim = 8, .heads = 2, .ffn_dim = 12, .dropout = 0.1f}, .layers = 2};
  c.kind->create(c.state, &ps, "dec", &shape);
  randomize_params(&ps, 341);
  GradTol tol = {.eps = 1e-3, .atol = 3e-3, .rtol = 1e-2};         // eps: no ReLU input crosses 0 within a step
  Tensor *in[96] = {U(SHAPE(2, 6, 8), 342), U(SHAPE(3, 8), 343)};  // + 80 parameters
  int n = block_inputs(in, 2, &ps);
  ck_assert_int_eq(n, 82);
  expect_grad("conditional decoder", f_conditional, in, n, &c, tol);
  params_free(&ps);
  free(c.state);
  tensor_release(c.pos);
  tensor_release(c.mask);
}
END_TEST

// --- Anchor DETR (nn/decoder_anchor.c, nn/attn_rcda.c): RCDA alone on maps taller and wider
// than long (both summation orders), with padding; the GroupNorm input projection; the whole
// transformer (one RCDA encoder layer, two decoder layers, every parameter, the anchors' path
// through the query positions and the boxes) on a padded batch ---

typedef struct {
  MultiheadRcda a;
  Tensor *row_mask, *col_mask;
  int64_t H, W;
} RcdaCtx;

static Tensor *f_rcda(Tensor *const *in, void *c) {  // in: queries [2, 3, 8] x2, map [2, H, W, 8]
  const RcdaCtx *k = c;
  Tensor *w = NULL;
  Tensor *y =
      rcda_forward(&k->a, &EVAL_CTX, in[0], in[1], op_add(in[2], in[2]), in[2], in[2], k->row_mask, k->col_mask, &w);
  Tensor *parts[2] = {op_reshape(y, SHAPE(2, 3 * 8)), op_reshape(w, SHAPE(2, -1))};
  return op_concat(parts, 2, 1);
}

static void check_rcda(int64_t H, int64_t W, uint64_t seed) {
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  float *m = calloc((size_t)(2 * H * W), sizeof(float));  // image 1: its last row and column padded
  for (int64_t y = 0; y < H; y++)
    for (int64_t x = 0; x < W; x++) m[H * W + y * W + x] = (y == H - 1 || x == W - 1) ? -INFINITY : 0.0f;
  Tensor *mask = tensor_from_host(DEVICE_CPU, SHAPE(2, H * W), m);
  free(m);
  RcdaCtx c = {.a = rcda_create(&ps, "rcda", 8, 2, 0.0f), .H = H, .W = W};
  rcda_masks(mask, H, W, &c.row_mask, &c.col_mask);
  randomize_params(&ps, seed);
  Tensor *in[8] = {U(SHAPE(2, 3, 8), seed + 1), U(SHAPE(2, 3, 8), seed + 2), U(SHAPE(2, H, W, 8), seed + 3)};
  int n = block_inputs(in, 3, &ps);
  ck_assert_int_eq(n, 7);
  expect_grad("rcda", f_rcda, in, n, &c, (GradTol){.eps = 1e-3, .atol = 2e-3, .rtol = 1e-2});
  params_free(&ps);
  tensor_release(mask);
}

START_TEST(grad_rcda) {
  check_rcda(2, 3, 400);  // H < W: the rows summed first
  check_rcda(3, 2, 410);  // H >= W: the columns first
}
END_TEST

static Tensor *f_groupnorm(Tensor *const *in, void *c) {
  GroupNorm g = {.weight = in[1], .bias = in[2], .groups = 2};
  return groupnorm_forward(&g, in[0]);
}

START_TEST(grad_groupnorm) {
  Tensor *in[3] = {test_uniform(SHAPE(2, 5, 6), -2, 2, 420, true), test_uniform(SHAPE(6), 0.5f, 1.5f, 421, true),
                   U(SHAPE(6), 422)};
  expect_grad("groupnorm", f_groupnorm, in, 3, NULL, TOL);
}
END_TEST

typedef struct {
  const DecoderKind *kind;
  void *state;
  FeatureGeometry g;
} AnchorCtx;

static Tensor *f_anchor(Tensor *const *in, void *c) {
  const AnchorCtx *k = c;
  Tensor *pos = NULL;
  Tensor *memory = k->kind->encode(k->state, &EVAL_CTX, in[0], &k->g, &pos);
  DecoderInput din = {.memory = memory, .pos = pos, .key_mask = k->g.key_mask, .batch = 2, .geom = &k->g};
  DecoderOutput out;
  k->kind->forward(k->state, &EVAL_CTX, &din, &out);
  Tensor *boxes = k->kind->boxes(k->state, op_slice(out.hs[1], 2, 0, 4), &out, 1);  // [2, 6, 4]
  Tensor *parts[3] = {out.hs[0], out.hs[1], boxes};
  return op_concat(parts, 3, 2);
}

// The anchor kind's encoder, decoder and box head on a batch of 2 h x w maps (mask [2 * h * w], 1 =
// padding) with hidden 8, 2 heads, 2 decoder layers, 1 encoder layer and 6 queries; encoder_attn NULL
// (RCDA) or the variant the kind takes; `param` (NULL: none) must be among its n_params parameters.
static void check_anchor_grad(const char *what, const uint8_t *mask, int64_t h, int64_t w,
                              const EncoderAttnKind *encoder_attn, const char *param, int n_params, uint64_t seed) {
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  AnchorCtx c = {.kind = decoder_find("anchor")};
  ck_assert_ptr_nonnull(c.kind);
  feature_geometry_make(mask, 2, h, w, DEVICE_CPU, &c.g);
  c.state = calloc(1, c.kind->state_size);
  DecoderShape shape = {.s = {.dim = 8, .heads = 2, .ffn_dim = 12},
                        .layers = 2,
                        .enc_layers = 1,
                        .queries = 6,
                        .encoder_attn = encoder_attn};
  ck_assert_ptr_null(c.kind->unsupported(&shape));
  c.kind->create(c.state, &ps, "t", &shape);
  if (param) ck_assert_ptr_nonnull(params_find(&ps, param));
  randomize_params(&ps, seed);
  tensor_uniform_(params_find(&ps, "t.position.weight")->tensor, &(Rng){.seed = seed + 1}, 0.1f,
                  0.9f);                                    // anchors in (0, 1)
  GradTol tol = {.eps = 1e-3, .atol = 3e-3, .rtol = 1e-2};  // eps: no ReLU input crosses 0 within a step
  Tensor *in[96] = {U(SHAPE(2, h * w, 8), seed + 2)};
  int n = block_inputs(in, 1, &ps);
  ck_assert_int_eq(n, 1 + n_params);
  expect_grad(what, f_anchor, in, n, &c, tol);
  params_free(&ps);
  free(c.state);
  feature_geometry_free(&c.g);
}

START_TEST(grad_decoder_anchor) {
  uint8_t m[2 * 6] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1};  // image 1: 2x2 of a 2x3 map
  check_anchor_grad("anchor transformer", m, 2, 3, NULL, NULL, 58, 430);
}
END_TEST

// Anchor-DETR-ENACT's encoder (encoder_attn=enact_official on the anchor kind): the row/column keys
// and values clustered before RCDA, W_prob's gradient through the chunks' entropy weights. A 3x4
// map (N = 12) so that several chunks remain; the cluster size is computed (these seeds keep it
// fixed within a step).
START_TEST(grad_decoder_anchor_enact) {
  uint8_t m[2 * 12] = {0};
  for (int x = 0; x < 4; x++) m[12 + 8 + x] = 1;  // image 1: 2x4 of a 3x4 map
  const EncoderAttnKind *enact = encoder_attn_find("enact_official");
  ck_assert_ptr_nonnull(enact);
  check_anchor_grad("anchor transformer with ENACT", m, 3, 4, enact, "t.encoder_layers.0.ENACT.W_prob.weight", 60, 440);
}
END_TEST

// --- registry: `test_grad NAME` runs one op's suite, no argument runs all ---

// The hand-written tests of tests/op_table.c's OP_SUITE entries (unary and binary entries need
// none). `test_grad --list` fails when an entry has no test here or a test no entry, so the build
// (which runs it to register the ctest entries) fails too.
typedef struct {
  const char *name;
  const TTest *test;
} GradSuite;

// Check's test handles are not constants: the list is built at run time.
#define MAX_SUITES 64
static int grad_suites(GradSuite *out) {
  const GradSuite all[] = {
      {"harness", grad_harness},
      {"dropout", grad_dropout},
      {"sum", grad_sum},
      {"mean", grad_mean},
      {"sum_all", grad_sum_all},
      {"mean_all", grad_mean_all},
      {"matmul", grad_matmul},
      {"bmm", grad_bmm},
      {"linear", grad_linear},
      {"linear_relu", grad_linear_relu},
      {"linear_relu_dropout", grad_linear_relu_dropout},
      {"dropout_bmm", grad_dropout_bmm},
      {"conv2d", grad_conv2d},
      {"depthwise_conv2d", grad_depthwise_conv2d},
      {"maxpool2d", grad_maxpool2d},
      {"frozen_batchnorm2d", grad_frozen_batchnorm2d},
      {"frozen_batchnorm2d_act", grad_frozen_batchnorm2d_act},
      {"softmax", grad_softmax},
      {"log_softmax", grad_log_softmax},
      {"layernorm", grad_layernorm},
      {"reshape", grad_reshape},
      {"taken_buffers", grad_taken_buffers},
      {"permute", grad_permute},
      {"transpose", grad_transpose},
      {"concat", grad_concat},
      {"slice", grad_slice},
      {"index_select", grad_index_select},
      {"cross_entropy", grad_cross_entropy},
      {"sigmoid_focal_loss", grad_sigmoid_focal_loss},
      {"l1_sum", grad_l1_sum},
      {"box_cxcywh_to_xyxy", grad_box_cxcywh_to_xyxy},
      {"box_xyxy_to_cxcywh", grad_box_xyxy_to_cxcywh},
      {"box_giou", grad_box_giou},
      {"criterion", grad_criterion},
      {"attention", grad_attention},
      {"encoder_decoder_layers", grad_encoder_layer_and_decoder_layer},
      {"bottleneck", grad_bottleneck},
      {"enact_cluster", grad_enact_cluster},
      {"enact_smooth", grad_enact_smooth},
      {"enact_attention", grad_enact_attention},
      {"cluster_attention", grad_cluster_attention},
      {"encoder_attn.dense", grad_attn_dense},
      {"encoder_attn.enact", grad_enact_layer},
      {"encoder_attn.efficient", grad_attn_efficient},
      {"encoder_attn.hydra", grad_attn_hydra},
      {"encoder_attn.focused", grad_attn_focused},
      {"encoder_attn.sra", grad_attn_sra},
      {"encoder_attn.enact_official", grad_attn_enact_official},
      {"encoder_attn.swin", grad_attn_swin},
      {"cluster_argmax", grad_cluster_argmax},
      {"kmeans_cross_attn", grad_kmeans_cross_attn},
      {"decoder.conditional", grad_decoder_conditional},
      {"rcda", grad_rcda},
      {"groupnorm", grad_groupnorm},
      {"decoder.anchor", grad_decoder_anchor},
      {"decoder.anchor_enact", grad_decoder_anchor_enact},
  };
  _Static_assert(sizeof all / sizeof all[0] <= MAX_SUITES, "raise MAX_SUITES");
  memcpy(out, all, sizeof all);
  return (int)(sizeof all / sizeof all[0]);
}

static GradSuite SUITES[MAX_SUITES];
static int N_SUITES;

static const TTest *suite_test(const char *name) {
  for (int i = 0; i < N_SUITES; i++)
    if (!strcmp(SUITES[i].name, name)) return SUITES[i].test;
  return NULL;
}

// The table against the tests above; prints what is wrong.
static bool table_consistent(void) {
  const char *why = op_table_problem();
  if (why) fprintf(stderr, "test_grad: %s\n", why);
  bool ok = !why;
  for (int i = 0; i < OP_TABLE_COUNT; i++)
    if (OP_TABLE[i].kind == OP_SUITE && !suite_test(OP_TABLE[i].name)) {
      fprintf(stderr, "test_grad: tests/op_table.c's suite '%s' has no test in SUITES\n", OP_TABLE[i].name);
      ok = false;
    }
  for (int i = 0; i < N_SUITES; i++) {
    const OpEntry *e = op_table_find(SUITES[i].name);
    if (!e || e->kind != OP_SUITE) {
      fprintf(stderr, "test_grad: the test '%s' has no OP_SUITE entry in tests/op_table.c\n", SUITES[i].name);
      ok = false;
    }
  }
  return ok;
}

// test_grad [NAME | --list]: every entry of the op table, one of them, or their names (one a
// line; what tests/op_ctest.cmake registers as grad.NAME).
int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  N_SUITES = grad_suites(SUITES);
  if (!table_consistent()) return 2;
  const char *only = argc > 1 ? argv[1] : NULL;
  if (only && !strcmp(only, "--list")) {
    for (int i = 0; i < OP_TABLE_COUNT; i++) printf("%s\n", OP_TABLE[i].name);
    return 0;
  }
  SRunner *sr = srunner_create(NULL);
  int added = 0;
  for (int i = 0; i < OP_TABLE_COUNT; i++) {
    const OpEntry *e = &OP_TABLE[i];
    if (only && strcmp(only, e->name)) continue;
    Suite *s = suite_create(e->name);
    TCase *tc = tcase_create("grad");
    tcase_set_timeout(tc, 120);
    if (e->kind == OP_SUITE) tcase_add_test(tc, suite_test(e->name));
    else tcase_add_loop_test(tc, grad_elementwise, i, i + 1);
    suite_add_tcase(s, tc);
    srunner_add_suite(sr, s);
    added++;
  }
  if (!added) {
    fprintf(stderr, "test_grad: no gradient test named '%s'\n", only);
    srunner_free(sr);
    return 2;
  }
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
