// The compute threads' share of a machine that other processes may be using.
//
// An OpenMP step with more threads than free cores waits at every barrier for a thread that has
// no core (the main job's 2-thread step took 0.19 s instead of 0.039 s beside one CPU-bound
// process; one thread: 0.058 s either way; bench/README.md#bench_step). CpuShare measures,
// from /proc/stat and getrusage, how many of this process's cores other processes kept busy since
// the last look, and sets the compute threads to the cores left (at least 1, at most the maximum).
// Only when the user fixed no thread count (--threads, OMP_NUM_THREADS): a fixed count is kept.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#define CPU_SHARE_SET_WORDS (1024 / 64)  // CPUs 0..1023, a bit each

typedef struct {
  bool adapt;                             // false: a fixed thread count, or no /proc/stat
  uint64_t allowed[CPU_SHARE_SET_WORDS];  // the CPUs this process may run on (sched_getaffinity)
  int max_threads, threads;               // the ceiling (cores this process may run on) and the current count
  double last_wall, last_own;             // seconds: wall clock and this process's CPU time at the last look
  uint64_t last_busy;                     // clock ticks the allowed cores were busy (all processes), last look
  double others;                          // cores the other processes used over the last interval
} CpuShare;

// fixed_threads > 0: the user's count, kept (so is OMP_NUM_THREADS).
void cpu_share_init(CpuShare *s, int fixed_threads);

// At most once per interval (2 s): measure, and change the thread count when the cores the others
// leave free call for it. Returns true when it changed (s->threads, s->others say to what and why).
bool cpu_share_update(CpuShare *s);
// The line on stderr that says a change: what the others use and the compute threads now,
// headed by `command` (e.g. "detr train").
void cpu_share_log(const CpuShare *s, const char *command);

// The busy ticks of the cpuN lines of /proc/stat text for the CPUs in the set (a bit per CPU,
// up to 1024). Returns -1 on text it cannot read. Exposed for its test.
int64_t cpu_share_busy_ticks(const char *proc_stat, const uint64_t *cpu_set_bits, int set_words);
