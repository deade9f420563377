// Optimizer kernels: AdamW update, gradient norms, gradient scaling (clipping).
#include <stdlib.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

void cpu_adamw(float *p, float *m, float *v, const float *g, int64_t n, AdamWStep s) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_HEAVY)
  for (int64_t i = 0; i < n; i++) adamw_update(&p[i], &m[i], &v[i], g[i], s);
}

// The gradient norm's fixed summation tree, whatever the thread count (the clip factor is
// bit-reproducible): blocks of SUM_BLOCK floats, each summed in SUM_LANES interleaved double lanes
// (independent chains the compiler can vectorize; one chain waited on each add's latency: 2% of the
// main job's step), then the lanes and the blocks in order.
enum { SUM_BLOCK = 16384, SUM_LANES = 8 };

static double block_sum_squares(const float *xb, int64_t len) {
  double lane[SUM_LANES] = {0};
  int64_t i = 0;
  for (; i + SUM_LANES <= len; i += SUM_LANES)
    for (int k = 0; k < SUM_LANES; k++) lane[k] += sum_squares_term(xb[i + k]);
  for (; i < len; i++) lane[0] += sum_squares_term(xb[i]);
  double s = 0.0;
  for (int k = 0; k < SUM_LANES; k++) s += lane[k];
  return s;
}

double cpu_sum_squares(const float *x, int64_t n) { return cpu_sum_squares_multi(&x, &n, 1); }

// The multi-tensor forms run every tensor's elements in one parallel region, in units of
// SUM_BLOCK floats: one region per tensor cost a thread wake-up each (12-25 us on a 2-core VM,
// bench/README.md#bench_parallel), over the 100-200 tensors of a DETR.
typedef struct {
  int tensor;
  int64_t start, len;
} OptimUnit;

// The units of tensors of n[count] elements, in order: [*n_units], to free.
static OptimUnit *optim_units(const int64_t *n, int count, int64_t *n_units) {
  int64_t total = 0;
  for (int t = 0; t < count; t++) total += (n[t] + SUM_BLOCK - 1) / SUM_BLOCK;
  OptimUnit *u = detr_malloc(sizeof(OptimUnit) * (size_t)(total > 0 ? total : 1), "optimizer units");
  int64_t k = 0;
  for (int t = 0; t < count; t++)
    for (int64_t start = 0; start < n[t]; start += SUM_BLOCK)
      u[k++] = (OptimUnit){t, start, n[t] - start < SUM_BLOCK ? n[t] - start : SUM_BLOCK};
  *n_units = total;
  return u;
}

double cpu_sum_squares_multi(const float *const *x, const int64_t *n, int count) {
  int64_t n_units, total_n = 0;
  OptimUnit *u = optim_units(n, count, &n_units);
  for (int t = 0; t < count; t++) total_n += n[t];
  double *partial = detr_malloc(sizeof(double) * (size_t)(n_units > 0 ? n_units : 1), "partial sums of squares");
#pragma omp parallel for schedule(static) if (total_n > PARALLEL_MIN_LIGHT)
  for (int64_t k = 0; k < n_units; k++) partial[k] = block_sum_squares(x[u[k].tensor] + u[k].start, u[k].len);
  double total = 0.0;  // each tensor's blocks in order, then the tensors in order
  for (int64_t k = 0; k < n_units;) {
    double acc = 0.0;
    int t = u[k].tensor;
    for (; k < n_units && u[k].tensor == t; k++) acc += partial[k];
    total += acc;
  }
  free(partial);
  free(u);
  return total;
}

void cpu_adamw_multi(const AdamWTensor *t, int count, float grad_scale) {
  int64_t n_units, total_n = 0;
  int64_t *n = detr_malloc(sizeof(int64_t) * (size_t)(count > 0 ? count : 1), "tensor sizes");
  for (int i = 0; i < count; i++) n[i] = t[i].n, total_n += t[i].n;
  OptimUnit *u = optim_units(n, count, &n_units);
#pragma omp parallel for schedule(static) if (total_n > PARALLEL_MIN_HEAVY)
  for (int64_t k = 0; k < n_units; k++) {
    const AdamWTensor *a = &t[u[k].tensor];
    // g * 1.0f is g: the unclipped step's floats too.
    for (int64_t i = u[k].start; i < u[k].start + u[k].len; i++)
      adamw_update(&a->p[i], &a->m[i], &a->v[i], a->g[i] * grad_scale, a->s);
  }
  free(u);
  free(n);
}

void cpu_scale(float *x, int64_t n, float s) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}
