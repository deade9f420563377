#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

void cpu_reduce_sum(const float *x, float *y, int64_t outer, int64_t n, int64_t inner, float scale) {
#pragma omp parallel for schedule(static) if (outer * n * inner > PARALLEL_MIN_LIGHT)
  for (int64_t o = 0; o < outer; o++) {
    for (int64_t i = 0; i < inner; i++) {
      double acc = 0.0;
      for (int64_t k = 0; k < n; k++) acc += x[(o * n + k) * inner + i];
      y[o * inner + i] = reduce_sum_finish(acc, scale);
    }
  }
}

void cpu_reduce_sum_backward(const float *dy, float *dx, int64_t outer, int64_t n, int64_t inner, float scale) {
#pragma omp parallel for schedule(static) if (outer * n * inner > PARALLEL_MIN_LIGHT)
  for (int64_t o = 0; o < outer; o++)
    for (int64_t k = 0; k < n; k++)
      for (int64_t i = 0; i < inner; i++) dx[(o * n + k) * inner + i] += scale * dy[o * inner + i];
}
