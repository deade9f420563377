// Where a CPU loop starts paying for its parallel region: each loop class of kernels/cpu at sizes
// from 1k to 1M floats, on one thread and forced onto all threads (the kernels' own loop bodies,
// from kernels/elementwise_math.h; only the `if` clause that picks between the two is left out),
// best of 200 runs each after warm-up. The thresholds in kernels/cpu/parallel.h come from this:
//   build/bench/bench_parallel            (OMP_NUM_THREADS: the threads of the parallel runs)
// The process sets libgomp's spin as the detr command does (cpu_runtime_setup), since the cost of
// a parallel region depends on it.
#include <math.h>
#include <omp.h>
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

enum { ACCUMULATE, RELU_FORWARD, SIGMOID_FORWARD, LAYERNORM_ROWS, N_LOOPS };
static const char *LOOP_NAMES[N_LOOPS] = {"accumulate (dst += src)", "relu forward", "sigmoid forward (expf)",
                                          "layernorm, rows of 128"};

// One loop of class `which` over n floats; `parallel` forces the region on (else one thread).
static void run_loop(int which, bool parallel, const float *x, float *y, int64_t n) {
  switch (which) {
    case ACCUMULATE:
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t i = 0; i < n; i++) y[i] += x[i];
      break;
    case RELU_FORWARD:
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t i = 0; i < n; i++) y[i] = unary_forward(UNARY_RELU, x[i], 0.0f);
      break;
    case SIGMOID_FORWARD:
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t i = 0; i < n; i++) y[i] = unary_forward(UNARY_SIGMOID, x[i], 0.0f);
      break;
    case LAYERNORM_ROWS: {  // cpu_layernorm_forward's work without affine (in float, not double)
      const int64_t cols = 128, rows = n / cols;
#pragma omp parallel for schedule(static) if (parallel)
      for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float mean = 0.0f, var = 0.0f;
        for (int64_t j = 0; j < cols; j++) mean += xr[j];
        mean /= (float)cols;
        for (int64_t j = 0; j < cols; j++) var += (xr[j] - mean) * (xr[j] - mean);
        float rstd = 1.0f / sqrtf(var / (float)cols + 1e-5f);
        for (int64_t j = 0; j < cols; j++) yr[j] = (xr[j] - mean) * rstd;
      }
      break;
    }
  }
}

// Best of 200 runs; with `pause`, 100 microseconds of the main thread's own work before each run,
// long enough for the other threads to stop spinning and sleep (as between a step's ops, where a
// thread's serial work - tape, allocation, the next op's set-up - separates the parallel loops).
static double best_seconds(int which, bool parallel, bool pause, const float *x, float *y, int64_t n) {
  double best = 1e9;
  for (int r = -20; r < 200; r++) {
    if (pause)
      for (double t = now(); now() - t < 100e-6;) {}
    double t0 = now();
    run_loop(which, parallel, x, y, n);
    double t = now() - t0;
    if (r >= 0 && t < best) best = t;
  }
  return best;
}

int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  cpu_runtime_setup(argv);
  const int64_t max_n = 1 << 20;
  float *x = detr_malloc(sizeof(float) * max_n, "x"), *y = detr_calloc(max_n, sizeof(float), "y");
  for (int64_t i = 0; i < max_n; i++) x[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
  int threads = omp_get_max_threads();
  printf(
      "microseconds on 1 thread / on %d threads (speed-up); back to back, and each run after a\n"
      "pause in which the other threads went to sleep\n",
      threads);
  for (int which = 0; which < N_LOOPS; which++) {
    printf("%-28s %-32s %s\n", LOOP_NAMES[which], "back to back", "after a pause");
    int64_t first_gain[2] = {0, 0};
    for (int64_t n = 1024; n <= max_n; n *= 2) {
      printf("  %8lld floats          ", (long long)n);
      for (int pause = 0; pause < 2; pause++) {
        double t1 = best_seconds(which, false, pause, x, y, n), tp = best_seconds(which, true, pause, x, y, n);
        printf("  %8.2f / %8.2f (%.2fx)", t1 * 1e6, tp * 1e6, t1 / tp);
        if (!first_gain[pause] && t1 / tp >= 1.2) first_gain[pause] = n;
      }
      printf("\n");
    }
    printf("  first size with a 1.2x gain: %lld floats back to back, %lld after a pause\n", (long long)first_gain[0],
           (long long)first_gain[1]);
  }
  free(x), free(y);
  return 0;
}
