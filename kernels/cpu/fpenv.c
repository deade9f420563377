#include "kernels/cpu/cpu_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>

static void set_mxcsr(bool on) {
  const unsigned ftz_daz = 0x8040;  // flush-to-zero (bit 15) and denormals-are-zero (bit 6)
  unsigned csr = _mm_getcsr();
  _mm_setcsr(on ? (csr | ftz_daz) : (csr & ~ftz_daz));
}
#else
static void set_mxcsr(bool on) { (void)on; }
#endif

void cpu_flush_denormals(bool on) {
  set_mxcsr(on);
#pragma omp parallel
  set_mxcsr(on);
}
