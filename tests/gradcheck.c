#include "tests/gradcheck.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// L = sum(y * R) in double on the host.
static double weighted_sum(const Tensor *y, const float *r) {
  float *host = malloc((size_t)(y->numel ? y->numel : 1) * sizeof(float));
  tensor_to_host(y, host);
  double s = 0.0;
  for (int64_t i = 0; i < y->numel; i++) s += (double)host[i] * r[i];
  free(host);
  return s;
}

GradReport gradcheck(GradFn f, Tensor *const *inputs, int n_inputs, void *ctx, GradTol tol) {
  GradReport rep = {.ok = true, .worst_input = -1};
  ScopeMark mark = tensor_scope_mark();
  for (int k = 0; k < n_inputs; k++)
    if (inputs[k] && inputs[k]->grad) tensor_fill_(inputs[k]->grad, 0.0f);

  // Analytic: backward of L = sum(y * R).
  Tensor *y = f(inputs, ctx);
  Tensor *r = tensor_new_scoped(DEVICE_CPU, y->shape);
  Rng rng = rng_make(0x5eed);
  tensor_uniform_(r, &rng, -1.0f, 1.0f);
  float *rhost = malloc((size_t)(y->numel ? y->numel : 1) * sizeof(float));
  tensor_to_host(r, rhost);
  if (!y->requires_grad) {
    snprintf(rep.message, sizeof rep.message, "output does not require grad");
    rep.ok = false;
    free(rhost);
    autograd_clear_tape();
    tensor_scope_release(mark);
    return rep;
  }
  autograd_backward(op_sum_all(op_mul(y, r)));
  tensor_scope_release(mark);

  bool was = autograd_set_grad_enabled(false);
  for (int k = 0; k < n_inputs; k++) {
    Tensor *x = inputs[k];
    if (!x || !x->requires_grad) continue;
    float *analytic = calloc((size_t)(x->numel ? x->numel : 1), sizeof(float));
    if (x->grad) tensor_to_host(x->grad, analytic);
    for (int64_t i = 0; i < x->numel; i++) {
      float saved = x->data[i];
      x->data[i] = saved + (float)tol.eps;
      double plus = (x->data[i] - saved);  // the step actually taken in float
      double lp = weighted_sum(f(inputs, ctx), rhost);
      tensor_scope_release(mark);
      x->data[i] = saved - (float)tol.eps;
      double minus = (saved - x->data[i]);
      double lm = weighted_sum(f(inputs, ctx), rhost);
      tensor_scope_release(mark);
      x->data[i] = saved;
      double numeric = (lp - lm) / (plus + minus);
      double err = fabs(analytic[i] - numeric);
      rep.checked++;
      if (err > rep.max_abs_err) {
        rep.max_abs_err = err;
        rep.worst_input = k;
        rep.worst_index = i;
        rep.analytic = analytic[i];
        rep.numeric = numeric;
      }
      if (err > tol.atol + tol.rtol * fabs(numeric) && rep.ok) {
        rep.ok = false;
        snprintf(rep.message, sizeof rep.message,
                 "input %d element %lld: analytic %.6g vs numeric %.6g (|diff| %.3g > %.3g + %.3g |num|)", k,
                 (long long)i, analytic[i], numeric, err, tol.atol, tol.rtol);
      }
    }
    free(analytic);
  }
  autograd_set_grad_enabled(was);
  free(rhost);
  if (rep.ok) snprintf(rep.message, sizeof rep.message, "%d elements, max |diff| %.3g", rep.checked, rep.max_abs_err);
  return rep;
}

Tensor *test_uniform(Shape shape, float low, float high, uint64_t seed, bool requires_grad) {
  Tensor *t = tensor_new(DEVICE_CPU, shape);
  Rng rng = rng_make(seed);
  tensor_uniform_(t, &rng, low, high);
  tensor_set_requires_grad(t, requires_grad);
  return t;
}

Tensor *test_uniform_away_from_zero(Shape shape, float margin, float high, uint64_t seed, bool requires_grad) {
  Tensor *t = test_uniform(shape, -1.0f, 1.0f, seed, requires_grad);
  for (int64_t i = 0; i < t->numel; i++) {
    float u = t->data[i];
    t->data[i] = (u < 0 ? -1.0f : 1.0f) * (margin + fabsf(u) * (high - margin));
  }
  return t;
}

double max_rel_diff(const float *a, const float *b, int64_t n) {
  double worst = 0.0, scale = 1.0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d > worst || d != d) worst = d != d ? INFINITY : d;
    if (fabs(b[i]) > scale) scale = fabs(b[i]);
  }
  return worst / scale;
}
