// Unary ops on the CPU: relu, sigmoid, mul_scalar and dropout (p = 0.1) forward and backward over
// 590k floats (the main job's first activation, 4 x 16 x 96 x 96), best of 30. Figures and the
// choices they made: bench/README.md#bench_unary.
//   OMP_NUM_THREADS=1 build/bench/bench_unary
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/runtime.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/elementwise_math.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  int64_t n = 4 * 16 * 96 * 96;
  float *x = detr_malloc((size_t)n * 4, "x"), *y = detr_malloc((size_t)n * 4, "y");
  float *dy = detr_malloc((size_t)n * 4, "dy"), *dx = detr_calloc((size_t)n, 4, "dx");
  for (int64_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f, dy[i] = 0.5f;  // [-1, 1]
  int ops[3] = {UNARY_RELU, UNARY_SIGMOID, UNARY_MUL_SCALAR};
  for (int o = 0; o < 3; o++) {
    double best_f = 1e9, best_b = 1e9;
    for (int r = 0; r < 30; r++) {
      double t0 = now();
      cpu_unary_forward(ops[o], x, y, n, 0.5f);
      double t1 = now();
      cpu_unary_backward(ops[o], x, y, dy, dx, n, 0.5f);
      double t2 = now();
      if (t1 - t0 < best_f) best_f = t1 - t0;
      if (t2 - t1 < best_b) best_b = t2 - t1;
    }
    printf("%-10s n=%lld forward %.3f ms backward %.3f ms\n", unary_op_name(ops[o]), (long long)n, best_f * 1e3,
           best_b * 1e3);
  }
  double best_f = 1e9, best_b = 1e9;
  for (int r = 0; r < 30; r++) {
    double t0 = now();
    cpu_dropout_forward(x, y, n, 0.1f, 1234, (uint64_t)r * 1000003);
    double t1 = now();
    cpu_dropout_backward(dy, dx, n, 0.1f, 1234, (uint64_t)r * 1000003);
    double t2 = now();
    if (t1 - t0 < best_f) best_f = t1 - t0;
    if (t2 - t1 < best_b) best_b = t2 - t1;
  }
  printf("%-10s n=%lld forward %.3f ms backward %.3f ms\n", "dropout", (long long)n, best_f * 1e3, best_b * 1e3);
  free(x), free(y), free(dy), free(dx);
  return 0;
}
