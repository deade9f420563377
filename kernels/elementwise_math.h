// Element math of the unary, scalar and binary (broadcasting) ops. Compiled into both the CPU
// kernels (kernels/cpu/elementwise.c) and the CUDA kernels (kernels/cuda/elementwise.cu), so
// the CPU tests exercise the arithmetic the GPU runs.
#pragma once
#include "kernels/common.h"
#include "kernels/rng_math.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

// A fill with value can be a memset to zero bytes only when value's bits are all zero: +0.0f. Not
// -0.0f, which compares equal to 0.0f but has the sign bit set (1 / -0.0f is -inf). Both fills
// (cpu_fill, cuda_fill) ask this, so each writes exactly value's bits.
static inline int fill_is_zero_bits(float value) {
  unsigned int bits;
  memcpy(&bits, &value, sizeof bits);
  return bits == 0u;
}

// The unary ops, one list: the enum and the name table are generated from it.
#define UNARY_OPS(X)                                                               \
  X(RELU, "relu")                                                                  \
  X(SIGMOID, "sigmoid")                                                            \
  X(EXP, "exp")                                                                    \
  X(LOG, "log")                                                                    \
  X(NEG, "neg")                                                                    \
  X(ADD_SCALAR, "add_scalar") /* x + param */                                      \
  X(MUL_SCALAR, "mul_scalar") /* x * param */                                      \
  X(SQRT, "sqrt")                                                                  \
  X(POW_SCALAR, "pow_scalar") /* x ^ param, x > 0 */                               \
  X(SOFTPLUS, "softplus")     /* log(1 + e^x), x for x > 20 (torch's threshold) */ \
  X(SIN, "sin")                                                                    \
  X(COS, "cos")                                                                    \
  X(INVERSE_SIGMOID, "inverse_sigmoid") /* log(x1 / x2), param = eps (below) */    \
  X(ABS, "abs")                         /* |x|; derivative sign(x), 0 at 0 (torch) */

#define UNARY_ENUM_ENTRY(id, name) UNARY_##id,
typedef enum { UNARY_OPS(UNARY_ENUM_ENTRY) UNARY_COUNT } UnaryOp;
#undef UNARY_ENUM_ENTRY

static inline const char *unary_op_name(int op) {
#define UNARY_NAME_ENTRY(id, name) name,
  static const char *const names[UNARY_COUNT] = {UNARY_OPS(UNARY_NAME_ENTRY)};
#undef UNARY_NAME_ENTRY
  return op >= 0 && op < UNARY_COUNT ? names[op] : "unknown";
}

// Conditional DETR's inverse_sigmoid (util/misc.py): x clamped to [0, 1], then
// log(max(x, eps) / max(1 - x, eps)). Its gradient is what torch's clamps pass: nothing outside
// [0, 1], and each clamp passes where its input is at or above eps (torch: min <= x inclusive).
DETR_HD float inverse_sigmoid_forward(float x, float eps) {
  x = fminf(fmaxf(x, 0.0f), 1.0f);
  return logf(fmaxf(x, eps) / fmaxf(1.0f - x, eps));
}
DETR_HD float inverse_sigmoid_backward(float x, float dy, float eps) {
  if (!(x >= 0.0f && x <= 1.0f)) return 0.0f;
  float g = 0.0f;
  if (x >= eps) g += 1.0f / x;
  if (1.0f - x >= eps) g += 1.0f / (1.0f - x);
  return dy * g;
}

// y = f(x).
DETR_HD float unary_forward(int op, float x, float param) {
  switch (op) {
    case UNARY_RELU: return x > 0.0f ? x : 0.0f;
    case UNARY_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case UNARY_EXP: return expf(x);
    case UNARY_LOG: return logf(x);
    case UNARY_NEG: return -x;
    case UNARY_ADD_SCALAR: return x + param;
    case UNARY_MUL_SCALAR: return x * param;
    case UNARY_SQRT: return sqrtf(x);
    case UNARY_POW_SCALAR: return powf(x, param);
    case UNARY_SOFTPLUS: return x > 20.0f ? x : log1pf(expf(x));
    case UNARY_SIN: return sinf(x);
    case UNARY_COS: return cosf(x);
    case UNARY_INVERSE_SIGMOID: return inverse_sigmoid_forward(x, param);
    case UNARY_ABS: return fabsf(x);
    default: return NAN;
  }
}

// dL/dx given x, y = f(x) and dL/dy. Each derivative is written once, here.
DETR_HD float unary_backward(int op, float x, float y, float dy, float param) {
  switch (op) {
    case UNARY_RELU: return x > 0.0f ? dy : 0.0f;
    case UNARY_SIGMOID: return dy * y * (1.0f - y);
    case UNARY_EXP: return dy * y;
    case UNARY_LOG: return dy / x;
    case UNARY_NEG: return -dy;
    case UNARY_ADD_SCALAR: return dy;
    case UNARY_MUL_SCALAR: return dy * param;
    case UNARY_SQRT: return dy * 0.5f / y;
    case UNARY_POW_SCALAR: return dy * param * powf(x, param - 1.0f);
    case UNARY_SOFTPLUS: return x > 20.0f ? dy : dy / (1.0f + expf(-x));
    case UNARY_SIN: return dy * cosf(x);
    case UNARY_COS: return -dy * sinf(x);
    case UNARY_INVERSE_SIGMOID: return inverse_sigmoid_backward(x, dy, param);
    case UNARY_ABS: return x > 0.0f ? dy : x < 0.0f ? -dy : 0.0f;
    default: return NAN;
  }
}

// The binary ops, one list: each op's name, y = a op b, and dy times d y/da and d y/db, in terms
// of a, b and dy. The enum, the name table and the three functions below are generated from it.
// Laid out by hand: clang-format spaces the formulas (a * b) as declarations.
// clang-format off
#define BINARY_OPS(X)                             \
  X(ADD, "add", a + b, dy, dy)                    \
  X(SUB, "sub", a - b, dy, -dy)                   \
  X(MUL, "mul", a * b, dy * b, dy * a)            \
  X(DIV, "div", a / b, dy / b, -dy * a / (b * b))
// clang-format on

#define BINARY_ENUM_ENTRY(id, name, ...) BINARY_##id,
typedef enum { BINARY_OPS(BINARY_ENUM_ENTRY) BINARY_COUNT } BinaryOp;
#undef BINARY_ENUM_ENTRY

static inline const char *binary_op_name(int op) {
#define BINARY_NAME_ENTRY(id, name, ...) name,
  static const char *const names[BINARY_COUNT] = {BINARY_OPS(BINARY_NAME_ENTRY)};
#undef BINARY_NAME_ENTRY
  return op >= 0 && op < BINARY_COUNT ? names[op] : "unknown";
}

// One case per macro, by hand: clang-format would join them and space the switches' labels.
// clang-format off
#define BINARY_FORWARD_CASE(id, name, y, da, db) case BINARY_##id: return y;
#define BINARY_DA_CASE(id, name, y, da, db) case BINARY_##id: return da;
#define BINARY_DB_CASE(id, name, y, da, db) case BINARY_##id: return db;
DETR_HD float binary_forward(int op, float a, float b) {
  switch (op) { BINARY_OPS(BINARY_FORWARD_CASE) default: return NAN; }
}
// d(a op b)/da and d(a op b)/db, times dy.
DETR_HD float binary_backward_a(int op, float a, float b, float dy) {
  switch (op) { BINARY_OPS(BINARY_DA_CASE) default: return NAN; }
}
DETR_HD float binary_backward_b(int op, float a, float b, float dy) {
  switch (op) { BINARY_OPS(BINARY_DB_CASE) default: return NAN; }
}
#undef BINARY_FORWARD_CASE
#undef BINARY_DA_CASE
#undef BINARY_DB_CASE
// clang-format on

// Broadcasting geometry: the output shape and, for each operand, its element stride along each
// output dim (0 where the operand has size 1 there). Passed by value to kernels.
typedef struct {
  int ndim;
  int64_t shape[DETR_MAX_DIMS];
  int64_t stride_a[DETR_MAX_DIMS];
  int64_t stride_b[DETR_MAX_DIMS];
} Broadcast;

// Offsets into a and b of output element i.
DETR_HD void broadcast_offsets(const Broadcast *bc, int64_t i, int64_t *off_a, int64_t *off_b) {
  int64_t oa = 0, ob = 0;
  for (int d = bc->ndim - 1; d >= 0; d--) {
    int64_t coord = i % bc->shape[d];
    i /= bc->shape[d];
    oa += coord * bc->stride_a[d];
    ob += coord * bc->stride_b[d];
  }
  *off_a = oa;
  *off_b = ob;
}

// Elements of the output.
DETR_HD int64_t broadcast_numel(const Broadcast *bc) {
  int64_t n = 1;
  for (int d = 0; d < bc->ndim; d++) n *= bc->shape[d];
  return n;
}

// True when the operand with these strides is the full, unbroadcast output (offset == index).
DETR_HD bool broadcast_is_dense(const Broadcast *bc, const int64_t *stride) {
  int64_t expect = 1;
  for (int d = bc->ndim - 1; d >= 0; d--) {
    if (bc->shape[d] != 1 && stride[d] != expect) return false;
    expect *= bc->shape[d];
  }
  return true;
}

// Dropout keeps element i when its uniform draw u = (word >> 8) / 2^24 (rng_math.h: the word of
// its Philox counter) is >= p, and scales what it keeps by 1 / (1 - p). The test runs on integers:
// u >= p exactly when word >> 8 >= ceil(p * 2^24) (p * 2^24 is exact in double), and an integer
// compare vectorizes where a float compare under -ftrapping-math does not.
DETR_HD float dropout_keep_scale(float p) { return 1.0f / (1.0f - p); }
DETR_HD uint32_t dropout_threshold(float p) { return (uint32_t)ceil((double)p * 16777216.0); }
DETR_HD int dropout_keeps(uint32_t word, uint32_t threshold) { return (word >> 8) >= threshold; }

// Linear + bias + ReLU in one op (op_linear_relu): y = relu(z + b) (no bias: b = 0, which gives
// relu(z) exactly), and the ReLU's gradient from its output: y > 0 exactly where z + b > 0.
DETR_HD float bias_relu_forward(float z, float b) { return unary_forward(UNARY_RELU, z + b, 0.0f); }
DETR_HD float relu_backward_from_output(float y, float dy) { return unary_backward(UNARY_RELU, y, y, dy, 0.0f); }
// Dropout after it (op_linear_relu_dropout), from that op's output d = dropout(y): d > 0 exactly
// where the element was kept and y > 0 (keep_scale >= 1 keeps a positive y positive), and that is
// where the gradient passes, scaled: relu'(y) dropout'(dy) without the mask or y. keep_scale 1: no
// dropout.
DETR_HD float relu_dropout_backward_from_output(float d, float dd, float keep_scale) {
  return relu_backward_from_output(d, dd * keep_scale);
}

// Sum and mean over an axis: terms are summed in double (long sums such as loss terms stay exact to
// float precision), then scaled (1 or 1/n) and rounded once.
DETR_HD float reduce_sum_finish(double acc, float scale) { return (float)(acc * scale); }
