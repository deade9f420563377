// Timing helpers shared by the benchmarks.
#pragma once
#include <time.h>

// Monotonic wall-clock seconds.
static inline double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// qsort comparator for doubles, ascending (medians of repeated timings).
static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
