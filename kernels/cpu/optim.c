// Optimizer kernels: AdamW update, gradient norms, gradient scaling (clipping).
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

void cpu_adamw(float *p, float *m, float *v, const float *g, int64_t n, AdamWStep s) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_HEAVY)
  for (int64_t i = 0; i < n; i++) adamw_update(&p[i], &m[i], &v[i], g[i], s);
}

double cpu_sum_squares(const float *x, int64_t n) {
  double acc = 0.0;  // one thread, fixed order: the clip factor is bit-reproducible
  for (int64_t i = 0; i < n; i++) acc += sum_squares_term(x[i]);
  return acc;
}

void cpu_scale(float *x, int64_t n, float s) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}
