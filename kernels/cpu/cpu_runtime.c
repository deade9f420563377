// Settings libgomp reads once, as it loads: the program puts them in its environment and starts
// itself again (once). bench/README.md, "wait policy".
#define _POSIX_C_SOURCE 200809L  // setenv
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/cpu/cpu_kernels.h"

// OpenMP threads that spin briefly, then sleep, while they wait. libgomp's default spins 300000
// times first: with a busy core every barrier then waits for a time slice of the thread stuck
// there (the main job's 2-thread step 0.29-7.7 s instead of 0.19 s), and with the machine to
// itself a short spin is faster too (0.0375-0.039 s vs 0.045 s; PASSIVE, no spin: 0.074-0.096 s).
// A spin count or wait policy the user set is kept.
void cpu_runtime_setup(char **argv) {
  if (getenv("GOMP_SPINCOUNT") || getenv("OMP_WAIT_POLICY")) return;
  if (setenv("GOMP_SPINCOUNT", "1000", 1) != 0) return;
  execv("/proc/self/exe", argv);
  // Still here: the setting reaches child processes only; this one goes on with libgomp's default.
  fprintf(stderr, "cpu_runtime_setup: execv(/proc/self/exe) failed; libgomp's default spin stays\n");
}
