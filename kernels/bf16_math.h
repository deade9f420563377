// bf16 (bfloat16: fp32's sign and 8-bit exponent, 7 mantissa bits) rounding, as the mixed-precision
// kernels round their inputs: to nearest, ties to even, NaN kept NaN. Compiled as C and as CUDA C++.
#pragma once
#include <stdint.h>
#include <string.h>

#include "kernels/common.h"

DETR_HD uint16_t bf16_from_float(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);  // NaN: quiet, never Inf
  u += 0x7fffu + ((u >> 16) & 1u);  // to nearest, ties to even (carries into the exponent as it should)
  return (uint16_t)(u >> 16);
}

DETR_HD float bf16_to_float(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

// x rounded to the nearest bf16, as a float.
DETR_HD float bf16_round(float x) { return bf16_to_float(bf16_from_float(x)); }
