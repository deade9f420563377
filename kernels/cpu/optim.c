// Optimizer kernels: AdamW update, gradient norms, gradient scaling (clipping).
#include <stdlib.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

void cpu_adamw(float *p, float *m, float *v, const float *g, int64_t n, AdamWStep s) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_HEAVY)
  for (int64_t i = 0; i < n; i++) adamw_update(&p[i], &m[i], &v[i], g[i], s);
}

double cpu_sum_squares(const float *x, int64_t n) {
  // A fixed summation tree, whatever the thread count (the clip factor is bit-reproducible):
  // blocks of SUM_BLOCK floats, each summed in 8 interleaved double lanes (independent chains the
  // compiler can vectorize; one chain waited on each add's latency: 2% of the main job's step),
  // then the lanes and the blocks in order.
  enum { SUM_BLOCK = 16384, LANES = 8 };
  int64_t blocks = (n + SUM_BLOCK - 1) / SUM_BLOCK;
  double partial_stack[64], *partial = blocks <= 64 ? partial_stack : malloc(sizeof(double) * (size_t)blocks);
  DETR_CHECK(partial, "cpu_sum_squares: out of memory for %lld partial sums", (long long)blocks);
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)
  for (int64_t b = 0; b < blocks; b++) {
    const float *xb = x + b * SUM_BLOCK;
    int64_t len = n - b * SUM_BLOCK < SUM_BLOCK ? n - b * SUM_BLOCK : SUM_BLOCK;
    double lane[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= len; i += LANES)
      for (int k = 0; k < LANES; k++) lane[k] += sum_squares_term(xb[i + k]);
    for (; i < len; i++) lane[0] += sum_squares_term(xb[i]);
    double s = 0.0;
    for (int k = 0; k < LANES; k++) s += lane[k];
    partial[b] = s;
  }
  double acc = 0.0;
  for (int64_t b = 0; b < blocks; b++) acc += partial[b];
  if (partial != partial_stack) free(partial);
  return acc;
}

void cpu_scale(float *x, int64_t n, float s) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}
