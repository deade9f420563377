// Linear assignment time against matrix size: O(n^3) means doubling n costs ~8x.
//   build/bench/bench_hungarian
// Costs are DETR-like (uniform floats) and integer (many ties); rectangular 100 x n shapes are
// the matcher's (queries x targets) and its transpose.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/runtime.h"
#include "nn/hungarian.h"
#include "tensor/tensor.h"
#include "bench/bench_util.h"

static double time_lsa(int64_t r, int64_t c, int integer, int reps) {
  double *cost = malloc((size_t)(r * c) * sizeof(double));
  int64_t *ro = malloc((size_t)(r < c ? r : c) * sizeof(int64_t)),
          *co = malloc((size_t)(r < c ? r : c) * sizeof(int64_t));
  Rng rng = rng_make(11);
  double best = 1e30;
  for (int k = 0; k < reps; k++) {
    for (int64_t i = 0; i < r * c; i++) cost[i] = integer ? (double)rng_next_below(&rng, 10) : rng_next_uniform(&rng);
    double t0 = now();
    if (linear_sum_assignment(r, c, cost, ro, co, NULL, NULL) != LSA_OK) {
      fprintf(stderr, "bench_hungarian: solve failed\n");
      exit(1);
    }
    double t = now() - t0;
    if (t < best) best = t;
  }
  free(cost), free(ro), free(co);
  return best;
}

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  int sizes[] = {25, 50, 100, 200, 300};
  printf("%-14s %12s %12s %18s\n", "shape", "float (ms)", "int (ms)", "float t / t(n/2)");
  double prev = 0;
  for (int k = 0; k < 5; k++) {
    int n = sizes[k];
    double tf = time_lsa(n, n, 0, 5), ti = time_lsa(n, n, 1, 5);
    char shape[32];
    snprintf(shape, sizeof shape, "%dx%d", n, n);
    if (k >= 2 && sizes[k] == 2 * sizes[k - 1])
      printf("%-14s %12.3f %12.3f %18.1f\n", shape, tf * 1e3, ti * 1e3, tf / prev);
    else printf("%-14s %12.3f %12.3f %18s\n", shape, tf * 1e3, ti * 1e3, "");
    prev = tf;
  }
  int64_t rect[][2] = {{100, 10}, {100, 50}, {300, 100}, {100, 300}};
  for (int k = 0; k < 4; k++) {
    char shape[32];
    snprintf(shape, sizeof shape, "%lldx%lld", (long long)rect[k][0], (long long)rect[k][1]);
    printf("%-14s %12.3f %12.3f\n", shape, time_lsa(rect[k][0], rect[k][1], 0, 5) * 1e3,
           time_lsa(rect[k][0], rect[k][1], 1, 5) * 1e3);
  }
  return 0;
}
