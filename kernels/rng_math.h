// Counter-based RNG (Philox-4x32-10, Salmon et al. 2011). The value of element i of a draw
// depends only on (seed, offset, i), so the CPU and CUDA kernels produce the same stream and a
// draw can be regenerated in backward (dropout) instead of storing its mask.
#pragma once
#include "kernels/common.h"

#include <math.h>

typedef struct {
  uint32_t v[4];
} Philox4;

DETR_HD uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t *hi) {
  uint64_t p = (uint64_t)a * (uint64_t)b;
  *hi = (uint32_t)(p >> 32);
  return (uint32_t)p;
}

// 4 random 32-bit words for counter `ctr` under key `seed`.
DETR_HD Philox4 philox4x32(uint64_t ctr, uint64_t seed) {
  uint32_t c0 = (uint32_t)ctr, c1 = (uint32_t)(ctr >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int round = 0; round < 10; round++) {
    uint32_t hi0, hi1;
    uint32_t lo0 = philox_mulhilo(0xD2511F53u, c0, &hi0);
    uint32_t lo1 = philox_mulhilo(0xCD9E8D57u, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  Philox4 r = {{c0, c1, c2, c3}};
  return r;
}

// Uniform in [0, 1): the top 24 bits of the word, exactly representable in float32.
DETR_HD float rng_word_to_unit(uint32_t w) { return (float)(w >> 8) * (1.0f / 16777216.0f); }

// Element i of a uniform [0,1) draw that starts at counter `offset`.
DETR_HD float rng_uniform_at(uint64_t seed, uint64_t offset, uint64_t i) {
  Philox4 r = philox4x32(offset + i / 4, seed);
  return rng_word_to_unit(r.v[i % 4]);
}

// Element i of a standard normal draw (Box-Muller: elements 2k and 2k+1 share one counter).
DETR_HD float rng_normal_at(uint64_t seed, uint64_t offset, uint64_t i) {
  Philox4 r = philox4x32(offset + i / 2, seed);
  float u1 = ((float)(r.v[0] >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]: log is finite
  float u2 = rng_word_to_unit(r.v[1]);
  float radius = sqrtf(-2.0f * logf(u1));
  float angle = 6.28318530717958647692f * u2;
  return (i % 2 == 0) ? radius * cosf(angle) : radius * sinf(angle);
}

// Counters a draw of n elements consumes (the stream advances by this much).
DETR_HD uint64_t rng_counters_uniform(uint64_t n) { return (n + 3) / 4; }
DETR_HD uint64_t rng_counters_normal(uint64_t n) { return (n + 1) / 2; }

// splitmix64's finalizer: decorrelates nearby inputs (seed + epoch + index, pixel coordinates)
// into independent keys.
DETR_HD uint64_t rng_mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x;
}
