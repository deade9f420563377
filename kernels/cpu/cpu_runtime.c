// Settings libgomp reads once, as it loads: the program puts them in its environment and starts
// itself again (once). Why these settings: the wait policy in bench/README.md#bench_step.
#define _POSIX_C_SOURCE 200809L  // setenv
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/runtime.h"
#include "kernels/cpu/cpu_kernels.h"
#if DETR_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

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

bool cpu_has_avx512(void) {
#if DETR_HAVE_ONEDNN
  static _Atomic int known = -1;  // -1: not asked yet; a race asks twice and stores the same answer
  int has = atomic_load_explicit(&known, memory_order_relaxed);
  if (has < 0) {
    has = (dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;  // nested masks
    atomic_store_explicit(&known, has, memory_order_relaxed);
  }
  return has;
#else
  return false;
#endif
}

// bf16 needs oneDNN's AVX512-BF16 kernels (Cooper Lake, Zen 4, Zen 5, Sapphire Rapids' AVX-512
// part) or AMX. oneDNN also runs bf16 by emulation on plain AVX-512 and not at all on AVX2: slower
// than fp32 there, so it is refused rather than run (the caller names the instructions).

bool cpu_bf16_supported(char *why, size_t why_cap) {
#if DETR_HAVE_ONEDNN
  dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
  bool has = (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16 ||
             (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx;
  if (!has && why)
    snprintf(why, why_cap,
             "this CPU has neither AVX512-BF16 nor AMX-BF16 (oneDNN's best instruction set here: %s), "
             "so bf16 would run slower than fp32",
             isa == dnnl_cpu_isa_avx2               ? "AVX2"
             : isa == dnnl_cpu_isa_avx512_core      ? "AVX-512 without BF16"
             : isa == dnnl_cpu_isa_avx512_core_vnni ? "AVX-512 VNNI without BF16"
             : isa == dnnl_cpu_isa_avx2_vnni        ? "AVX2 VNNI"
                                                    : "older than AVX2");
  return has;
#else
  if (why) snprintf(why, why_cap, "this build has no oneDNN, whose bf16 kernels it needs");
  return false;
#endif
}

void cpu_set_bf16(bool on) {
  char why[256];
  DETR_CHECK(!on || cpu_bf16_supported(why, sizeof why), "cpu_set_bf16: %s", why);
  runtime_current()->bf16_cpu = on;
}

// The bound runtime's mode (core/runtime.h). Kernels ask before their parallel regions: an OpenMP
// worker has no runtime and gets fp32.
bool cpu_bf16_enabled(void) {
  const Runtime *rt = runtime_bound();
  return rt && rt->bf16_cpu;
}
