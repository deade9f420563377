// Finite-difference gradient check (central differences over every input element), in the
// spirit of ggml's test-grad0: the op's analytic backward of L = sum(f(x) * R), with R fixed
// random weights, must agree with (L(x + eps e_i) - L(x - eps e_i)) / 2 eps for every element i
// of every input that requires grad, within |analytic - numeric| <= atol + rtol |numeric|.
#pragma once
#include <stdbool.h>

#include "autograd/ops.h"

typedef Tensor *(*GradFn)(Tensor *const *inputs, void *ctx);

typedef struct {
  double eps;   // finite-difference step
  double atol;  // absolute tolerance
  double rtol;  // relative tolerance
} GradTol;

typedef struct {
  bool ok;
  int checked;         // elements compared
  double max_abs_err;  // worst |analytic - numeric|
  int worst_input;     // where it was
  int64_t worst_index;
  double analytic, numeric;  // the worst pair
  char message[256];
} GradReport;

// Inputs must be CPU tensors owned by the caller; those with requires_grad are checked.
GradReport gradcheck(GradFn f, Tensor *const *inputs, int n_inputs, void *ctx, GradTol tol);

// Test data: uniform in [low, high) from `seed`, with requires_grad set as asked.
Tensor *test_uniform(Shape shape, float low, float high, uint64_t seed, bool requires_grad);
// Uniform with magnitudes in [margin, high): keeps points away from kinks at 0 (relu, |x|).
Tensor *test_uniform_away_from_zero(Shape shape, float margin, float high, uint64_t seed, bool requires_grad);
// Max relative difference max|a - b| / max(1, max|b|) of two host arrays.
double max_rel_diff(const float *a, const float *b, int64_t n);
