// exp(x) in float without a library call or a branch, so that a loop of it vectorizes: the
// softmaxes' exponentials (kernels/norm_math.h's softmax_exp), CPU and CUDA alike. glibc's expf is
// a call per element that GCC cannot vectorize; in the encoder's attention softmax (8 heads x N^2
// per layer, N = 850 at 800x1066) it was 3.5% of a DETR-R50 forward and the loop around it 5%
// (bench/README.md#bench_serve).
//
// Cephes' expf: x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2 (ln2 in two parts, so that
// n * ln2_hi is exact), e^r by a degree-7 polynomial, times 2^n built in the exponent bits - as two
// factors 2^a 2^b (a + b = n), so that results from overflow down to the smallest denormal come
// out right. Within 1.5 ulp of exp over [-104, 88.72] (tests/test_ops.c, exp_poly_accuracy;
// measured 0.98); 0 below, +inf above, NaN kept. The CPU build (ISO C) does not contract a * b + c
// into an FMA, so the result is the same on every x86 CPU and vector width. A loop of it vectorizes only where GCC may
// evaluate its float operations for elements whose result is then selected away (0 below lo):
// -fno-trapping-math, which changes no value (CMakeLists.txt sets it for kernels/cpu/softmax.c).
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/common.h"

// 2^k as a float for k in [-126, 127].
DETR_HD float exp_poly_pow2(int32_t k) {
  uint32_t bits = (uint32_t)(k + 127) << 23;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

DETR_HD float exp_poly(float x) {
  const float lo = -104.0f;       // exp(-104) = 6.8e-46: below half the smallest denormal, rounds to 0
  const float hi = 88.72283935f;  // ln(FLT_MAX): above it, +inf
  float xc = x < lo ? lo : (x > hi ? hi : x);
  xc = x == x ? xc : 0.0f;  // NaN: compute on 0 (no NaN-to-int conversion), return x below
  // n = round(xc / ln2): adding 1.5 * 2^23 leaves the integer part in the low mantissa bits.
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;  // ln2's first 9 bits: n * them is exact
  r = r - n * -2.12194440e-4f;      // ln2 - 0.693359375
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float e = p * (r * r) + r + 1.0f;
  int32_t k = (int32_t)n;        // in [-150, 128]
  int32_t a = k / 2, b = k - a;  // each in [-75, 64]
  float y = (e * exp_poly_pow2(a)) * exp_poly_pow2(b);
  y = x < lo ? 0.0f : y;
  y = x > hi ? (float)INFINITY : y;
  return x == x ? y : x;
}
