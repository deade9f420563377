#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/rng_math.h"


void cpu_fill(float *x, int64_t n, float value) {
  if (fill_is_zero_bits(value)) {  // +0.0 only: -0.0 has its sign bit set
    memset(x, 0, (size_t)n * sizeof(float));
    return;
  }
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)
  for (int64_t i = 0; i < n; i++) x[i] = value;
}

void cpu_uniform(float *x, int64_t n, uint64_t seed, uint64_t offset, float low, float high) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_HEAVY)
  for (int64_t i = 0; i < n; i++) x[i] = low + (high - low) * rng_uniform_at(seed, offset, (uint64_t)i);
}

void cpu_normal(float *x, int64_t n, uint64_t seed, uint64_t offset, float mean, float std) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_HEAVY)
  for (int64_t i = 0; i < n; i++) x[i] = mean + std * rng_normal_at(seed, offset, (uint64_t)i);
}

void cpu_accumulate(float *dst, const float *src, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)
  for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

// One loop per op, the op a constant in each: unary_forward's switch folds away and the loop
// vectorizes (a switch per element made relu 2-3x slower: bench/README.md, "unary loops").
#define UNARY_FORWARD_CASE(id, name)                                     \
  case UNARY_##id:                                                       \
    _Pragma("omp parallel for schedule(static) if (n > parallel_min)")  \
    for (int64_t i = 0; i < n; i++) y[i] = unary_forward(UNARY_##id, x[i], param); \
    break;
#define UNARY_BACKWARD_CASE(id, name)                                    \
  case UNARY_##id:                                                       \
    _Pragma("omp parallel for schedule(static) if (n > parallel_min)")  \
    for (int64_t i = 0; i < n; i++) dx[i] += unary_backward(UNARY_##id, x[i], y[i], dy[i], param); \
    break;

// A few operations per element (light) or a transcendental, sqrt or division (heavy).
static int64_t unary_parallel_min(int op) {
  bool light = op == UNARY_RELU || op == UNARY_NEG || op == UNARY_ADD_SCALAR || op == UNARY_MUL_SCALAR;
  return light ? PARALLEL_MIN_LIGHT : PARALLEL_MIN_HEAVY;
}

void cpu_unary_forward(int op, const float *x, float *y, int64_t n, float param) {
  int64_t parallel_min = unary_parallel_min(op);
  switch (op) {
    UNARY_OPS(UNARY_FORWARD_CASE)
    default: DETR_FAIL("cpu_unary_forward: unknown op %d", op);
  }
}

void cpu_unary_backward(int op, const float *x, const float *y, const float *dy, float *dx,
                        int64_t n, float param) {
  int64_t parallel_min = unary_parallel_min(op);
  switch (op) {
    UNARY_OPS(UNARY_BACKWARD_CASE)
    default: DETR_FAIL("cpu_unary_backward: unknown op %d", op);
  }
}

static int64_t broadcast_numel(const Broadcast *bc) {
  int64_t n = 1;
  for (int d = 0; d < bc->ndim; d++) n *= bc->shape[d];
  return n;
}

// True when the operand with these strides is the full, unbroadcast output (offset == index).
static bool is_dense(const Broadcast *bc, const int64_t *stride) {
  int64_t expect = 1;
  for (int d = bc->ndim - 1; d >= 0; d--) {
    if (bc->shape[d] != 1 && stride[d] != expect) return false;
    expect *= bc->shape[d];
  }
  return true;
}

void cpu_binary_forward(int op, const float *a, const float *b, float *y, Broadcast bc) {
  int64_t n = broadcast_numel(&bc);
  if (is_dense(&bc, bc.stride_a) && is_dense(&bc, bc.stride_b)) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)
    for (int64_t i = 0; i < n; i++) y[i] = binary_forward(op, a[i], b[i]);
    return;
  }
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_HEAVY)
  for (int64_t i = 0; i < n; i++) {
    int64_t oa, ob;
    broadcast_offsets(&bc, i, &oa, &ob);
    y[i] = binary_forward(op, a[oa], b[ob]);
  }
}

void cpu_binary_backward(int op, const float *a, const float *b, const float *dy, float *da,
                         float *db, Broadcast bc) {
  int64_t n = broadcast_numel(&bc);
  bool dense_a = is_dense(&bc, bc.stride_a), dense_b = is_dense(&bc, bc.stride_b);
  if (dense_a && dense_b) {  // same shapes (residual adds): no index arithmetic
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)
    for (int64_t i = 0; i < n; i++) {
      if (da) da[i] += binary_backward_a(op, a[i], b[i], dy[i]);
      if (db) db[i] += binary_backward_b(op, a[i], b[i], dy[i]);
    }
    return;
  }
  // A dense gradient has one writer per element: parallel. A broadcast one sums many output
  // elements into one: a serial loop keeps the summation order, hence the result, fixed.
  if (da && dense_a) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_HEAVY)
    for (int64_t i = 0; i < n; i++) {
      int64_t oa, ob;
      broadcast_offsets(&bc, i, &oa, &ob);
      da[i] += binary_backward_a(op, a[i], b[ob], dy[i]);
    }
  }
  if (db && dense_b) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_HEAVY)
    for (int64_t i = 0; i < n; i++) {
      int64_t oa, ob;
      broadcast_offsets(&bc, i, &oa, &ob);
      db[i] += binary_backward_b(op, a[oa], b[i], dy[i]);
    }
  }
  if ((da && !dense_a) || (db && !dense_b)) {
    for (int64_t i = 0; i < n; i++) {
      int64_t oa, ob;
      broadcast_offsets(&bc, i, &oa, &ob);
      if (da && !dense_a) da[oa] += binary_backward_a(op, a[oa], b[ob], dy[i]);
      if (db && !dense_b) db[ob] += binary_backward_b(op, a[oa], b[ob], dy[i]);
    }
  }
}

// Dropout (kernels/elementwise_math.h) keeps element i when its uniform draw is >= p. The loops
// walk groups of 4 elements that share one Philox counter, computing it once (4x fewer Philox
// rounds than calling rng_uniform_at per element; the same numbers).
void cpu_dropout_forward(const float *x, float *y, int64_t n, float p, uint64_t seed,
                         uint64_t offset) {
  float keep_scale = dropout_keep_scale(p);
  int64_t groups = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_HEAVY)
  for (int64_t q = 0; q < groups; q++) {
    Philox4 r = philox4x32(offset + (uint64_t)q, seed);
    for (int64_t k = 0; k < 4 && 4 * q + k < n; k++) {
      int64_t i = 4 * q + k;
      y[i] = dropout_keeps(r.v[k], p) ? x[i] * keep_scale : 0.0f;
    }
  }
}

void cpu_dropout_backward(const float *dy, float *dx, int64_t n, float p, uint64_t seed,
                          uint64_t offset) {
  float keep_scale = dropout_keep_scale(p);
  int64_t groups = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_HEAVY)
  for (int64_t q = 0; q < groups; q++) {
    Philox4 r = philox4x32(offset + (uint64_t)q, seed);
    for (int64_t k = 0; k < 4 && 4 * q + k < n; k++) {
      int64_t i = 4 * q + k;
      if (dropout_keeps(r.v[k], p)) dx[i] += dy[i] * keep_scale;
    }
  }
}
