#define _GNU_SOURCE  // sched_getaffinity, CPU_ISSET
#include "train/cpu_share.h"

#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"

#define CPU_SHARE_INTERVAL_S 2.0

static double own_cpu_s(void) {  // every thread of this process: compute, loader, spinning
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru)) return 0.0;
  return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
         1e-6 * (double)ru.ru_stime.tv_usec;
}

int64_t cpu_share_busy_ticks(const char *text, const uint64_t *set, int set_words) {
  int64_t busy = 0;
  int seen = 0;
  for (const char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
    unsigned cpu;
    unsigned long long user, nice, system, idle, iowait, irq, softirq;
    // "cpuN user nice system idle iowait irq softirq steal guest guest_nice": busy is what ran,
    // not idle, iowait or steal (guest time is already inside user).
    if (strncmp(line, "cpu", 3) || line[3] < '0' || line[3] > '9') continue;  // not the "cpu " total
    if (sscanf(line, "cpu%u %llu %llu %llu %llu %llu %llu %llu", &cpu, &user, &nice, &system, &idle, &iowait, &irq,
               &softirq) != 8)
      continue;
    if (cpu >= (unsigned)set_words * 64 || !(set[cpu / 64] >> (cpu % 64) & 1)) continue;
    busy += (int64_t)(user + nice + system + irq + softirq);
    seen++;
  }
  return seen ? busy : -1;
}

// The busy ticks of the allowed CPUs now, or -1.
static int64_t read_busy(const uint64_t *set) {
  FILE *f = fopen("/proc/stat", "r");
  if (!f) return -1;
  enum { TEXT_CAP = 1 << 16 };  // a line per CPU: room for about 600 of them
  char *text = detr_malloc(TEXT_CAP, "/proc/stat's text");
  size_t n = fread(text, 1, TEXT_CAP - 1, f);
  fclose(f);
  text[n] = '\0';
  int64_t busy = cpu_share_busy_ticks(text, set, CPU_SHARE_SET_WORDS);
  free(text);
  return busy;
}

void cpu_share_init(CpuShare *s, int fixed_threads) {
  *s = (CpuShare){0};
  if (fixed_threads > 0) omp_set_num_threads(fixed_threads);
  s->max_threads = s->threads = omp_get_max_threads();
  cpu_set_t cs;
  if (fixed_threads > 0 || getenv("OMP_NUM_THREADS") || sched_getaffinity(0, sizeof cs, &cs)) return;
  for (int c = 0; c < CPU_SHARE_SET_WORDS * 64 && c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &cs)) s->allowed[c / 64] |= 1ull << (c % 64);
  int64_t busy = read_busy(s->allowed);
  if (busy < 0 || s->max_threads < 2) return;
  s->adapt = true;
  s->last_busy = (uint64_t)busy;
  s->last_wall = now_s();
  s->last_own = own_cpu_s();
}

bool cpu_share_update(CpuShare *s) {
  if (!s->adapt) return false;
  double wall = now_s();
  if (wall - s->last_wall < CPU_SHARE_INTERVAL_S) return false;
  int64_t busy = read_busy(s->allowed);
  if (busy < 0) return false;
  double own = own_cpu_s(), tick = 1.0 / (double)sysconf(_SC_CLK_TCK);
  // Cores the others used: all busy time on our CPUs minus ours, over the interval. Ticks are
  // coarse (10 ms): a 2 s interval reads to about 0.01 core.
  double others = ((double)((uint64_t)busy - s->last_busy) * tick - (own - s->last_own)) / (wall - s->last_wall);
  s->others = others > 0.0 ? others : 0.0;
  s->last_busy = (uint64_t)busy;
  s->last_wall = wall;
  s->last_own = own;
  int want = (int)((double)s->max_threads - s->others + 0.5);  // the free cores, rounded
  if (want < 1) want = 1;
  if (want > s->max_threads) want = s->max_threads;
  if (want == s->threads) return false;
  s->threads = want;
  omp_set_num_threads(want);
  return true;
}

void cpu_share_log(const CpuShare *s, const char *command) {
  fprintf(stderr, "%s: other processes use %.1f of %d cores: %d compute thread%s\n", command, s->others, s->max_threads,
          s->threads, s->threads > 1 ? "s" : "");
}
