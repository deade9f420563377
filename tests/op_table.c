#include "tests/op_table.h"

#include <stdio.h>
#include <string.h>

static Tensor *f_relu(Tensor *const *in, void *c) { return op_relu(in[0]); }
static Tensor *f_sigmoid(Tensor *const *in, void *c) { return op_sigmoid(in[0]); }
static Tensor *f_exp(Tensor *const *in, void *c) { return op_exp(in[0]); }
static Tensor *f_log(Tensor *const *in, void *c) { return op_log(in[0]); }
static Tensor *f_neg(Tensor *const *in, void *c) { return op_neg(in[0]); }
static Tensor *f_add_scalar(Tensor *const *in, void *c) { return op_add_scalar(in[0], 0.75f); }
static Tensor *f_mul_scalar(Tensor *const *in, void *c) { return op_mul_scalar(in[0], -1.7f); }
static Tensor *f_sqrt(Tensor *const *in, void *c) { return op_sqrt(in[0]); }
static Tensor *f_pow_scalar(Tensor *const *in, void *c) { return op_pow_scalar(in[0], 3.0f); }  // FLatten's p
static Tensor *f_softplus(Tensor *const *in, void *c) { return op_softplus(in[0]); }
static Tensor *f_sin(Tensor *const *in, void *c) { return op_sin(in[0]); }
static Tensor *f_cos(Tensor *const *in, void *c) { return op_cos(in[0]); }
static Tensor *f_inverse_sigmoid(Tensor *const *in, void *c) { return op_inverse_sigmoid(in[0], 1e-5f); }
static Tensor *f_abs(Tensor *const *in, void *c) { return op_abs(in[0]); }
static Tensor *f_add(Tensor *const *in, void *c) { return op_add(in[0], in[1]); }
static Tensor *f_sub(Tensor *const *in, void *c) { return op_sub(in[0], in[1]); }
static Tensor *f_mul(Tensor *const *in, void *c) { return op_mul(in[0], in[1]); }
static Tensor *f_div(Tensor *const *in, void *c) { return op_div(in[0], in[1]); }

// A unary op: its gradient-check range, then the kernel test's wider range and parameter. The
// kernel test has no finite differences, so it also covers the kinks, clamps and large arguments.
#define UNARY(n, fn, k, r, w, p)                                                                           \
  {                                                                                                        \
    .name = n, .kind = OP_UNARY, .f = fn, .kernel = UNARY_##k, .range = {r}, .wide = w, .kernel_param = p, \
    .cuda = true                                                                                           \
  }
#define BINARY(n, fn, k, rb) \
  { .name = n, .kind = OP_BINARY, .f = fn, .kernel = BINARY_##k, .range = {UNIFORM(-1, 1), rb}, .cuda = true }
#define SUITE(n, c) \
  { .name = n, .kind = OP_SUITE, .cuda = c }

#define POSITIVE UNIFORM(0.1f, 4.0f)
#define SPREAD AWAY(0.05f, 3.0f)

const OpEntry OP_TABLE[] = {
    SUITE("harness", false),  // gradcheck itself: a right backward passes, wrong ones fail
    UNARY("relu", f_relu, RELU, AWAY(0.05f, 1.0f), SPREAD, 0.7f),  // |x| >= 5 eps: no kink
    UNARY("sigmoid", f_sigmoid, SIGMOID, AWAY(0.0f, 3.0f), SPREAD, 0.7f),
    UNARY("exp", f_exp, EXP, AWAY(0.0f, 2.0f), UNIFORM(-4.0f, 4.0f), 0.7f),
    UNARY("log", f_log, LOG, UNIFORM(0.3f, 3.0f), POSITIVE, 0.7f),  // x > 0.3: f''' bounded
    UNARY("neg", f_neg, NEG, AWAY(0.0f, 1.0f), SPREAD, 0.7f),
    UNARY("add_scalar", f_add_scalar, ADD_SCALAR, AWAY(0.0f, 1.0f), SPREAD, 0.7f),
    UNARY("mul_scalar", f_mul_scalar, MUL_SCALAR, AWAY(0.0f, 1.0f), SPREAD, 0.7f),
    UNARY("sqrt", f_sqrt, SQRT, UNIFORM(0.3f, 3.0f), POSITIVE, 0.7f),  // x > 0.3: f''' bounded
    UNARY("pow_scalar", f_pow_scalar, POW_SCALAR, UNIFORM(0.1f, 2.0f), POSITIVE, 0.7f),
    UNARY("softplus", f_softplus, SOFTPLUS, AWAY(0.0f, 3.0f), SPREAD, 0.7f),
    UNARY("sin", f_sin, SIN, AWAY(0.0f, 7.0f), SPREAD, 0.7f),
    UNARY("cos", f_cos, COS, AWAY(0.0f, 7.0f), SPREAD, 0.7f),
    // Gradient: inside (0, 1), away from the clamps and from 0 and 1 (where the higher derivatives
    // blow up; the clamped regions are checked by value in test_ops). Kernel: both clamps too.
    UNARY("inverse_sigmoid", f_inverse_sigmoid, INVERSE_SIGMOID, UNIFORM(0.1f, 0.9f), UNIFORM(-0.2f, 1.2f), 1e-3f),
    UNARY("abs", f_abs, ABS, AWAY(0.05f, 1.0f), SPREAD, 0.7f),  // |x| >= 5 eps: no kink
    BINARY("add", f_add, ADD, UNIFORM(-1, 1)),
    BINARY("sub", f_sub, SUB, UNIFORM(-1, 1)),
    BINARY("mul", f_mul, MUL, UNIFORM(-1, 1)),
    BINARY("div", f_div, DIV, AWAY(0.5f, 2.0f)),  // |b| >= 0.5: away from the pole
    SUITE("dropout", true),
    SUITE("sum", true),
    SUITE("mean", true),
    SUITE("sum_all", true),
    SUITE("mean_all", true),
    SUITE("matmul", true),
    SUITE("bmm", true),
    SUITE("dropout_bmm", true),
    SUITE("linear", true),
    SUITE("linear_relu", true),
    SUITE("linear_relu_dropout", true),
    SUITE("conv2d", true),
    SUITE("depthwise_conv2d", true),
    SUITE("maxpool2d", true),
    SUITE("frozen_batchnorm2d", true),
    SUITE("frozen_batchnorm2d_act", true),
    SUITE("softmax", true),
    SUITE("log_softmax", true),
    SUITE("layernorm", true),
    SUITE("reshape", true),
    SUITE("taken_buffers", false),  // the tape's buffer reuse, CPU
    SUITE("permute", true),
    SUITE("transpose", true),
    SUITE("concat", true),
    SUITE("slice", true),
    SUITE("index_select", true),
    SUITE("cross_entropy", true),
    SUITE("sigmoid_focal_loss", true),
    SUITE("l1_sum", true),
    SUITE("box_cxcywh_to_xyxy", true),
    SUITE("box_xyxy_to_cxcywh", true),
    SUITE("box_giou", true),
    // Composites: on CUDA they run inside test_gpu's model steps (not compared alone).
    SUITE("criterion", false),
    SUITE("attention", false),
    SUITE("encoder_decoder_layers", false),
    SUITE("bottleneck", false),
    SUITE("enact_cluster", true),
    SUITE("enact_smooth", true),
    SUITE("enact_attention", false),
    SUITE("cluster_attention", true),
    SUITE("encoder_attn.dense", false),
    SUITE("encoder_attn.enact", false),
    SUITE("encoder_attn.efficient", false),
    SUITE("encoder_attn.hydra", false),
    SUITE("encoder_attn.focused", false),
    SUITE("encoder_attn.sra", false),
    SUITE("encoder_attn.enact_official", false),
    SUITE("encoder_attn.swin", false),
    SUITE("cluster_argmax", true),
    SUITE("kmeans_cross_attn", false),
    SUITE("decoder.conditional", false),
    SUITE("rcda", false),
    SUITE("groupnorm", false),
    SUITE("decoder.anchor", false),
    SUITE("decoder.anchor_enact", false),
};
const int OP_TABLE_COUNT = (int)(sizeof OP_TABLE / sizeof OP_TABLE[0]);

// SHAPE() is a call: constant initializers spell the dimensions out.
#define SH(n, ...)                  \
  {                                 \
    .ndim = n, .d = { __VA_ARGS__ } \
  }
const Shape OP_UNARY_SHAPES[UNARY_SHAPES] = {SH(1, 1),          SH(1, 7),       SH(3, 3, 1, 5),
                                             SH(4, 2, 3, 4, 2), SH(2, 3, 1000), SH(1, 300007)};
const Shape OP_BINARY_PAIRS[BINARY_PAIRS][2] = {{SH(1, 5), SH(1, 5)},          {SH(2, 2, 3), SH(1, 3)},
                                                {SH(3, 2, 1, 4), SH(2, 3, 1)}, {SH(1, 1), SH(2, 2, 3)},
                                                {SH(2, 4, 1), SH(2, 1, 3)},    {SH(4, 2, 3, 1, 2), SH(3, 3, 5, 1)},
                                                {SH(2, 2000, 64), SH(1, 64)},  {SH(3, 8, 300, 4), SH(3, 8, 1, 4)}};

const OpEntry *op_table_find(const char *name) {
  for (int i = 0; i < OP_TABLE_COUNT; i++)
    if (!strcmp(OP_TABLE[i].name, name)) return &OP_TABLE[i];
  return NULL;
}

GradTol op_tol(const OpEntry *e) {
  if (e->tol.eps > 0) return e->tol;
  return (GradTol){.eps = 1e-2, .atol = 2e-3, .rtol = 1e-2};
}

Tensor *op_input(const OpEntry *e, int k, Shape s, uint64_t seed, bool requires_grad) {
  ValueRange r = e->range[k];
  return r.away ? test_uniform_away_from_zero(s, r.lo, r.hi, seed, requires_grad)
                : test_uniform(s, r.lo, r.hi, seed, requires_grad);
}

const char *op_table_problem(void) {
  static char why[160];
  int unary[UNARY_COUNT] = {0}, binary[BINARY_COUNT] = {0};
  for (int i = 0; i < OP_TABLE_COUNT; i++) {
    const OpEntry *e = &OP_TABLE[i];
    if (op_table_find(e->name) != e) {
      snprintf(why, sizeof why, "op table: '%s' twice", e->name);
      return why;
    }
    if (e->kind == OP_UNARY) unary[e->kernel]++;
    if (e->kind == OP_BINARY) binary[e->kernel]++;
  }
  for (int k = 0; k < UNARY_COUNT; k++)
    if (unary[k] != 1) {
      snprintf(why, sizeof why, "op table: unary kernel %s has %d entries, not 1", unary_op_name(k), unary[k]);
      return why;
    }
  for (int k = 0; k < BINARY_COUNT; k++)
    if (binary[k] != 1) {
      snprintf(why, sizeof why, "op table: binary kernel %s has %d entries, not 1", binary_op_name(k), binary[k]);
      return why;
    }
  return NULL;
}
