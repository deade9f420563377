#define _POSIX_C_SOURCE 200809L  // clock_gettime under -std=c11
#include "core/clock.h"

#include <time.h>

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
