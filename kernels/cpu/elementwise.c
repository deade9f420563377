#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/rng_math.h"

void cpu_fill(float *x, int64_t n, float value) {
  if (fill_is_zero_bits(value)) {  // +0.0 only: -0.0 has its sign bit set
    memset(x, 0, (size_t)n * sizeof(float));
    return;
  }
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)
  for (int64_t i = 0; i < n; i++) x[i] = value;
}

void cpu_uniform(float *x, int64_t n, uint64_t seed, uint64_t offset, float low, float high) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_HEAVY)
  for (int64_t i = 0; i < n; i++) x[i] = low + (high - low) * rng_uniform_at(seed, offset, (uint64_t)i);
}

void cpu_normal(float *x, int64_t n, uint64_t seed, uint64_t offset, float mean, float std) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_HEAVY)
  for (int64_t i = 0; i < n; i++) x[i] = mean + std * rng_normal_at(seed, offset, (uint64_t)i);
}

void cpu_accumulate(float *dst, const float *src, int64_t n) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)
  for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

// One loop per op, the op a constant in each: unary_forward's switch folds away and the loop
// vectorizes (a switch per element made the ops 1.3-2.7x slower: bench/README.md#bench_unary).
// The _Pragma loops below are laid out by hand: clang-format would join each pragma to its loop.
// clang-format off
#define UNARY_FORWARD_CASE(id, name)                                     \
  case UNARY_##id:                                                       \
    _Pragma("omp parallel for schedule(static) if (n > parallel_min)")  \
    for (int64_t i = 0; i < n; i++) y[i] = unary_forward(UNARY_##id, x[i], param); \
    break;
#define UNARY_BACKWARD_CASE(id, name)                                    \
  case UNARY_##id:                                                       \
    _Pragma("omp parallel for schedule(static) if (n > parallel_min)")  \
    for (int64_t i = 0; i < n; i++) dx[i] += unary_backward(UNARY_##id, x[i], y[i], dy[i], param); \
    break;
// clang-format on

// A few operations per element (light) or a transcendental, sqrt or division (heavy).
static int64_t unary_parallel_min(int op) {
  bool light = op == UNARY_RELU || op == UNARY_NEG || op == UNARY_ADD_SCALAR || op == UNARY_MUL_SCALAR;
  return light ? PARALLEL_MIN_LIGHT : PARALLEL_MIN_HEAVY;
}

void cpu_unary_forward(int op, const float *x, float *y, int64_t n, float param) {
  int64_t parallel_min = unary_parallel_min(op);
  switch (op) {
    UNARY_OPS(UNARY_FORWARD_CASE)
    default: DETR_FAIL("cpu_unary_forward: unknown op %d", op);
  }
}

void cpu_unary_backward(int op, const float *x, const float *y, const float *dy, float *dx, int64_t n, float param) {
  int64_t parallel_min = unary_parallel_min(op);
  switch (op) {
    UNARY_OPS(UNARY_BACKWARD_CASE)
    default: DETR_FAIL("cpu_unary_backward: unknown op %d", op);
  }
}

// Rows of the output's last dim: each operand's element step along a row (0 where it is broadcast
// there, else 1), so that offsets are found once per row (broadcast_offsets of its first element).
typedef struct {
  int64_t len, rows, step_a, step_b;
} BroadcastRows;

static BroadcastRows broadcast_rows(const Broadcast *bc, int64_t n) {
  int last = bc->ndim - 1;
  int64_t len = last >= 0 ? bc->shape[last] : 1;
  return (BroadcastRows){.len = len,
                         .rows = len > 0 ? n / len : 0,
                         .step_a = last >= 0 ? bc->stride_a[last] : 0,
                         .step_b = last >= 0 ? bc->stride_b[last] : 0};
}

// y = a op b: one loop per op with the op a literal (as the unary loops: an OpenMP region is
// outlined before inlining, so a variable op kept binary_forward's switch in every element; an add
// of 196 x 128 took 14.5 us instead of 3.0 in the served forward, bench/README.md#bench_serve).
// Broadcast operands go by rows of the output's last dim, each operand's offset found once per row
// and its step along the row 0 or 1 (a bias or per-query term: 0), so the row loops vectorize too.
// clang-format off
#define BINARY_FORWARD_LOOPS(OP)                                                                          \
  if (dense) {                                                                                             \
    _Pragma("omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)")                              \
    for (int64_t i = 0; i < n; i++) y[i] = binary_forward(OP, a[i], b[i]);                                \
  } else {                                                                                                 \
    _Pragma("omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)")                              \
    for (int64_t r = 0; r < rows; r++) {                                                                   \
      int64_t oa, ob;                                                                                      \
      broadcast_offsets(&bc, r * len, &oa, &ob);                                                           \
      const float *ar = a + oa, *br = b + ob;                                                              \
      float *yr = y + r * len;                                                                             \
      if (step_a == 1 && step_b == 1)                                                                      \
        for (int64_t j = 0; j < len; j++) yr[j] = binary_forward(OP, ar[j], br[j]);                        \
      else if (step_a == 1 && step_b == 0)                                                                 \
        for (int64_t j = 0; j < len; j++) yr[j] = binary_forward(OP, ar[j], br[0]);                        \
      else if (step_a == 0 && step_b == 1)                                                                 \
        for (int64_t j = 0; j < len; j++) yr[j] = binary_forward(OP, ar[0], br[j]);                        \
      else                                                                                                 \
        for (int64_t j = 0; j < len; j++) yr[j] = binary_forward(OP, ar[j * step_a], br[j * step_b]);      \
    }                                                                                                      \
  }
#define BINARY_FORWARD_CASE(id, name, fwd, da, db) \
  case BINARY_##id:                                \
    BINARY_FORWARD_LOOPS(BINARY_##id)              \
    break;
// clang-format on

void cpu_binary_forward(int op, const float *a, const float *b, float *y, Broadcast bc) {
  int64_t n = broadcast_numel(&bc);
  bool dense = broadcast_is_dense(&bc, bc.stride_a) && broadcast_is_dense(&bc, bc.stride_b);
  BroadcastRows br = broadcast_rows(&bc, n);
  int64_t len = br.len, rows = br.rows, step_a = br.step_a, step_b = br.step_b;
  switch (op) {
    BINARY_OPS(BINARY_FORWARD_CASE)
    default: DETR_FAIL("cpu_binary_forward: unknown op %d", op);
  }
}
#undef BINARY_FORWARD_CASE
#undef BINARY_FORWARD_LOOPS

// clang-format off
#define BINARY_DENSE_BACKWARD_CASE(id, name, fwd, da_expr, db_expr)                  \
  case BINARY_##id:                                                                 \
    _Pragma("omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)")       \
    for (int64_t i = 0; i < n; i++) {                                               \
      if (da) da[i] += binary_backward_a(BINARY_##id, a[i], b[i], dy[i]);           \
      if (db) db[i] += binary_backward_b(BINARY_##id, a[i], b[i], dy[i]);           \
    }                                                                               \
    break;
// clang-format on

void cpu_binary_backward(int op, const float *a, const float *b, const float *dy, float *da, float *db, Broadcast bc) {
  int64_t n = broadcast_numel(&bc);
  bool dense_a = broadcast_is_dense(&bc, bc.stride_a), dense_b = broadcast_is_dense(&bc, bc.stride_b);
  if (dense_a && dense_b) {  // same shapes (residual adds): no index arithmetic, a loop per op
    switch (op) {
      BINARY_OPS(BINARY_DENSE_BACKWARD_CASE)
      default: DETR_FAIL("cpu_binary_backward: unknown op %d", op);
    }
    return;
  }
  // By rows (broadcast_rows): each operand's offset found once per row instead of per element,
  // which was most of the time (a [2, 100, 256] + [100, 256] add's backward 1083 -> 102 us on one
  // thread, the same bits; bench/README.md#bench_step, `--profile`). A dense gradient has one
  // writer per element: rows in parallel. A broadcast one sums many output elements into one: rows
  // in order, the element order of a loop over i, so the sums are fixed.
  BroadcastRows br = broadcast_rows(&bc, n);
  int64_t len = br.len, rows = br.rows, step_a = br.step_a, step_b = br.step_b;
  if ((da && dense_a) || (db && dense_b)) {
    float *set_a = da && dense_a ? da : NULL, *set_b = db && dense_b ? db : NULL;
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_HEAVY)
    for (int64_t r = 0; r < rows; r++) {
      int64_t oa, ob;
      broadcast_offsets(&bc, r * len, &oa, &ob);
      for (int64_t j = 0; j < len; j++) {
        int64_t i = r * len + j, ia = oa + j * step_a, ib = ob + j * step_b;
        if (set_a) set_a[i] += binary_backward_a(op, a[ia], b[ib], dy[i]);
        if (set_b) set_b[i] += binary_backward_b(op, a[ia], b[ib], dy[i]);
      }
    }
  }
  if ((da && !dense_a) || (db && !dense_b)) {
    float *sum_a = da && !dense_a ? da : NULL, *sum_b = db && !dense_b ? db : NULL;
    for (int64_t r = 0; r < rows; r++) {
      int64_t oa, ob;
      broadcast_offsets(&bc, r * len, &oa, &ob);
      const float *dyr = dy + r * len;
      for (int64_t j = 0; j < len; j++) {
        int64_t ia = oa + j * step_a, ib = ob + j * step_b;
        if (sum_a) sum_a[ia] += binary_backward_a(op, a[ia], b[ib], dyr[j]);
        if (sum_b) sum_b[ib] += binary_backward_b(op, a[ia], b[ib], dyr[j]);
      }
    }
  }
}
#undef BINARY_DENSE_BACKWARD_CASE

// Dropout (kernels/elementwise_math.h) keeps element i when its uniform draw is >= p; its word is
// v[i % 4] of Philox counter offset + i / 4. Philox (rng_math.h) is ten rounds of 32x32->64-bit
// multiplies per counter, almost the whole cost of the op: one counter at a time it ran at 3.1 ns
// per element on one thread. With AVX2 (chosen at run time; the build targets baseline x86-64),
// a block of 16 counters runs four to a vector (vpmuludq multiplies the low 32 bits of each 64-bit
// lane: the state words sit zero-extended in 64-bit lanes). The same arithmetic per counter as
// philox4x32: the same words, so the same masks as the CUDA kernel and as the backward's
// regenerated mask (tests/test_ops.c compares every word). 4.2x: bench/README.md#bench_unary.
#define DROPOUT_LANES 16                    // counters per block
#define DROPOUT_BLOCK (4 * DROPOUT_LANES)   // elements per block
#define DROPOUT_CHUNK (64 * DROPOUT_BLOCK)  // elements per parallel work item

// words[4 * l + k] = philox4x32(ctr0 + l, seed).v[k] for l < DROPOUT_LANES.
static void philox4x32_block_scalar(uint64_t ctr0, uint64_t seed, uint32_t *words) {
  for (int l = 0; l < DROPOUT_LANES; l++) {
    Philox4 r = philox4x32(ctr0 + (uint64_t)l, seed);
    for (int k = 0; k < 4; k++) words[4 * l + k] = r.v[k];
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define DROPOUT_HAVE_AVX2_PATH 1
__attribute__((target("avx2"))) static void philox4x32_block_avx2(uint64_t ctr0, uint64_t seed, uint32_t *words) {
  enum { V = DROPOUT_LANES / 4 };  // vectors of 4 counters
  const __m256i lo32 = _mm256_set1_epi64x(0xFFFFFFFF);
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53), m1 = _mm256_set1_epi64x(0xCD9E8D57);
  __m256i c0[V], c1[V], c2[V], c3[V];  // [4 counters] each, one 32-bit word per 64-bit lane
  for (int v = 0; v < V; v++) {
    uint64_t c = ctr0 + 4 * (uint64_t)v;
    __m256i ctr = _mm256_set_epi64x((long long)(c + 3), (long long)(c + 2), (long long)(c + 1), (long long)c);
    c0[v] = _mm256_and_si256(ctr, lo32), c1[v] = _mm256_srli_epi64(ctr, 32);
    c2[v] = _mm256_setzero_si256(), c3[v] = _mm256_setzero_si256();
  }
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int round = 0; round < 10; round++) {
    __m256i kv0 = _mm256_set1_epi64x(k0), kv1 = _mm256_set1_epi64x(k1);
    for (int v = 0; v < V; v++) {
      __m256i p0 = _mm256_mul_epu32(c0[v], m0), p1 = _mm256_mul_epu32(c2[v], m1);
      __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1[v]), kv0);
      __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3[v]), kv1);
      c0[v] = n0, c1[v] = _mm256_and_si256(p1, lo32), c2[v] = n2, c3[v] = _mm256_and_si256(p0, lo32);
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  for (int v = 0; v < V; v++) {
    // Lane j of c_k is word k of counter 4v + j: pack the four words of each counter together.
    __m256i a = _mm256_or_si256(c0[v], _mm256_slli_epi64(c1[v], 32));  // per lane: words 0, 1
    __m256i b = _mm256_or_si256(c2[v], _mm256_slli_epi64(c3[v], 32));  // per lane: words 2, 3
    __m256i lo = _mm256_unpacklo_epi64(a, b);                          // counters 4v, 4v + 2
    __m256i hi = _mm256_unpackhi_epi64(a, b);                          // counters 4v + 1, 4v + 3
    _mm256_storeu_si256((__m256i *)(words + 16 * v), _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_storeu_si256((__m256i *)(words + 16 * v + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
  }
}
#endif

// Elements [i0, i1) of the forward (backward: dx += mask * dy * scale); i0 is a multiple of
// DROPOUT_BLOCK.
static void dropout_range(bool backward, const float *in, float *out, int64_t i0, int64_t i1, float p, uint64_t seed,
                          uint64_t offset) {
  void (*block)(uint64_t, uint64_t, uint32_t *) = philox4x32_block_scalar;
#ifdef DROPOUT_HAVE_AVX2_PATH
  if (__builtin_cpu_supports("avx2")) block = philox4x32_block_avx2;
#endif
  float keep_scale = dropout_keep_scale(p);
  uint32_t threshold = dropout_threshold(p);
  uint32_t words[DROPOUT_BLOCK];
  for (int64_t b0 = i0; b0 < i1; b0 += DROPOUT_BLOCK) {
    block(offset + (uint64_t)(b0 / 4), seed, words);
    int64_t len = i1 - b0 < DROPOUT_BLOCK ? i1 - b0 : DROPOUT_BLOCK;
    const float *src = in + b0;
    float *dst = out + b0;
    // A bit mask selects between the product and zero (or the old gradient): GCC vectorizes that,
    // where it keeps `keep ? x * s : 0` a branch (a float multiply under -ftrapping-math is not
    // speculated), and a branch on a random mask mispredicts.
    for (int64_t j = 0; j < len; j++) {
      uint32_t keep = 0u - (uint32_t)dropout_keeps(words[j], threshold), kept_bits, old_bits;
      float kept = backward ? dst[j] + src[j] * keep_scale : src[j] * keep_scale, old = backward ? dst[j] : 0.0f;
      memcpy(&kept_bits, &kept, 4);
      memcpy(&old_bits, &old, 4);
      uint32_t bits = (kept_bits & keep) | (old_bits & ~keep);
      memcpy(&dst[j], &bits, 4);
    }
  }
}

static void dropout_run(bool backward, const float *in, float *out, int64_t n, float p, uint64_t seed,
                        uint64_t offset) {
  const int64_t chunk = DROPOUT_CHUNK;
  int64_t chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_HEAVY)
  for (int64_t c = 0; c < chunks; c++)
    dropout_range(backward, in, out, c * chunk, c * chunk + chunk < n ? c * chunk + chunk : n, p, seed, offset);
}

void cpu_dropout_forward(const float *x, float *y, int64_t n, float p, uint64_t seed, uint64_t offset) {
  dropout_run(false, x, y, n, p, seed, offset);
}

void cpu_dropout_backward(const float *dy, float *dx, int64_t n, float p, uint64_t seed, uint64_t offset) {
  dropout_run(true, dy, dx, n, p, seed, offset);
}
