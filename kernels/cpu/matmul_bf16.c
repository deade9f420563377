// GEMM with bf16 inputs and fp32 accumulation (cpu_set_bf16): A and B rounded to bf16 into copies,
// then oneDNN's matmul primitive (its AVX512-BF16 / AMX kernels) writes C = alpha op(A) op(B) +
// beta C in fp32, a strided batch in one call. PyTorch's CPU autocast runs the same ops on bf16
// tensors and rounds C to bf16 as well; here C stays fp32 (one rounding less, the same speed).
// And the inference path's linear layer in fp32 on the same primitive, its bias and ReLU fused as
// the matmul's epilogue (cpu_linear_fused).
#include "core/runtime.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

#if DETR_HAVE_ONEDNN
// AVX512-BF16 intrinsics: GCC 10 and clang 9 on.
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10))
#define HAVE_BF16_INTRINSICS 1
#include <immintrin.h>
#endif
#include <pthread.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/onednn.h"

// Below this many multiply-adds a GEMM stays fp32: the copies and the call cost more than bf16
// saves (a judgement, not swept; the bf16 step: bench/README.md#bench_step).
#define GEMM_BF16_MIN_MACS ((double)(1 << 20))
// A linear layer whose weight is kept in bf16 (tensor_keep_bf16) rounds only x: bf16 pays from fewer
// multiply-adds, per thread (and never from more than the rounding path's GEMM_BF16_MIN_MACS). Against
// the fp32 fused matmul, 24 weights cycled (bench/README.md#bench_serve): 1 thread 0.72x at 10x128x128
// (164k multiply-adds), 2 threads 1.12x there, 1.01x at 13x128x128 (213k), 0.74x at 10x128x512.
#define LINEAR_BF16_KEPT_MIN_MACS_PER_THREAD ((double)(1 << 17))

// A batch of narrow products that fp32 runs one per thread (as many as threads, each under
// GEMM_BATCH_PARALLEL_MAX_FLOPS) stays fp32 too: attention's per-head GEMMs whose output is a head
// (16-32 wide: probabilities x values, the gradients of queries, keys and values) run 0.95-1.9x the
// time of those sgemms in oneDNN's bf16 matmul over the batch, where the logits' products (a
// head-wide sum, k = 16-32, into a wide output) take 0.6-0.8x. Larger narrow heads (850 tokens: 23 M
// multiply-adds each) and single narrow GEMMs keep bf16: they gain (`bench_ops 21 --attention-bf16`,
// bench/README.md#bench_ops).
#define GEMM_BF16_MIN_BATCHED_WIDTH 48

// The width a benchmark sets (the bound runtime's, core/runtime.h), else GEMM_BF16_MIN_BATCHED_WIDTH.
static int64_t min_batched_width(void) {
  const Runtime *rt = runtime_bound();
  return rt && rt->gemm_bf16_min_batched_width >= 0 ? rt->gemm_bf16_min_batched_width : GEMM_BF16_MIN_BATCHED_WIDTH;
}

int64_t cpu_gemm_bf16_set_min_batched_width(int64_t width) {
  int64_t before = min_batched_width();
  runtime_current()->gemm_bf16_min_batched_width = width < 0 ? -1 : width;
  return before;
}

enum { EPILOGUE_BIAS = 1, EPILOGUE_RELU = 2 };  // GemmKey.epilogue: C = relu?(A B + bias)

typedef struct {  // no padding bytes: keys are compared with memcmp
  int64_t trans_a, trans_b, m, n, k, batch, lda, ldb, stride_a, stride_b, ldc, stride_c;
  int64_t f32;       // operands fp32 as given (cpu_linear_fused), else bf16
  int64_t epilogue;  // EPILOGUE_* bits
  float alpha, beta;
} GemmKey;

// An operand's rounding into its dense bf16 copy: round_rows over the fp32 matrices as stored - AVX512-
// BF16's vcvtneps2bf16 (to nearest even, as bf16_from_float but for denormal inputs, which it takes as
// zero), as oneDNN's reorder did before it (3x a C loop's rate over a bf16 step:
// bench/README.md#bench_step) - or, on a CPU without that instruction, the reorder.
typedef struct {
  dnnl_primitive_t reorder;  // NULL where the CPU rounds directly (round_direct)
  dnnl_memory_desc_t from, to;
  int64_t batch;                   // copies made: 1 where the batch shares the operand (stride 0), then copied
  int64_t rows, cols, ld, stride;  // the operand as stored: [batch, rows, cols], row stride ld
} OperandCopy;

// AVX512-BF16's vcvtneps2bf16, 16 floats at a time: the instruction oneDNN's reorder runs (to nearest
// even, a denormal input taken as zero), so the same bits, without the reorder primitive's call and
// threading costs - at 2 threads 2.7x faster at 2M floats, 3.3x at 131k, 28x at 1280 (serving in
// bf16: bench/README.md#bench_serve). On a CPU with AVX512-BF16 or AMX (cpu_bf16_supported); elsewhere
// the reorder.
#if HAVE_BF16_INTRINSICS
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) static void round_run(const float *x, int64_t n,
                                                                                      uint16_t *out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
  if (i < n) {
    __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(out + i, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

static bool has_direct;
static pthread_once_t direct_once = PTHREAD_ONCE_INIT;
static void direct_check(void) { has_direct = cpu_bf16_supported(NULL, 0); }
static bool round_direct(void) {
  pthread_once(&direct_once, direct_check);
  return has_direct;
}
#else
static void round_run(const float *x, int64_t n, uint16_t *out) {
  (void)x, (void)n, (void)out;
  DETR_FAIL("round_run: no AVX512-BF16 intrinsics in this build (round_direct says no)");
}
static bool round_direct(void) { return false; }
#endif

enum { ROUND_CHUNK = 4096 };  // floats per task

// out [rows, cols] = x's rows (row stride ld) rounded, on all threads where long.
static void round_rows(const float *x, int64_t rows, int64_t cols, int64_t ld, uint16_t *out) {
  if (ld == cols || rows == 1) {  // dense: in chunks, whatever the row length
    int64_t n = rows * cols, chunks = (n + ROUND_CHUNK - 1) / ROUND_CHUNK;
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)
    for (int64_t c = 0; c < chunks; c++) {
      int64_t at = c * ROUND_CHUNK;
      round_run(x + at, n - at < ROUND_CHUNK ? n - at : ROUND_CHUNK, out + at);
    }
    return;
  }
#pragma omp parallel for schedule(static) if (rows * cols > PARALLEL_MIN_LIGHT)
  for (int64_t r = 0; r < rows; r++) round_run(x + r * ld, cols, out + r * cols);
}

typedef struct {
  GemmKey key;
  dnnl_primitive_t prim;
  dnnl_memory_desc_t a_md, b_md, c_md, bias_md;  // bias_md: with EPILOGUE_BIAS
  OperandCopy a_copy, b_copy;
  uint64_t used;  // LRU stamp; 0: empty
} GemmPrim;

// The primitives, the rounding reorders and the operands' copies are one process-wide cache (a
// primitive costs ~0.3 ms of oneDNN's JIT to make): every function below that uses them holds
// cache_lock for the whole call, from the lookup to the primitive's run, so another thread's call
// can neither evict the primitive nor overwrite the copies in between. Two threads' bf16 GEMMs and
// fused linear layers therefore take turns; each already runs on every core (OpenMP).
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
#define GEMM_CACHE_SIZE 64
static GemmPrim gemm_cache[GEMM_CACHE_SIZE];
static uint64_t gemm_clock;
static dnnl_engine_t engine;
static dnnl_stream_t stream;
static uint16_t *copies;    // A's and B's bf16 copies, grown to the largest call
static int64_t copies_cap;  // in bf16 elements

// copies, holding at least n bf16 elements.
static uint16_t *copies_reserve(int64_t n) {
  if (n > copies_cap) {
    free(copies);
    copies_cap = n;
    copies = detr_malloc((size_t)copies_cap * sizeof(uint16_t), "bf16 GEMM operands");
  }
  return copies;
}

// The copy of an operand stored [batch, rows, cols] (row stride ld, batch stride stride; 0: one
// matrix for the whole batch) as dense bf16 [batch, rows, cols].
static void operand_copy_create(OperandCopy *c, int64_t batch, int64_t rows, int64_t cols, int64_t ld, int64_t stride) {
  c->batch = stride == 0 ? 1 : batch;
  c->rows = rows, c->cols = cols, c->ld = ld, c->stride = stride;
  if (round_direct()) return;
  dnnl_dims_t d = {c->batch, rows, cols}, from = {c->batch > 1 ? stride : rows * ld, ld, 1};
  dnnl_dims_t to = {rows * cols, cols, 1};
  DNNL_CHECK(dnnl_memory_desc_init_by_strides(&c->from, 3, d, dnnl_f32, from));
  DNNL_CHECK(dnnl_memory_desc_init_by_strides(&c->to, 3, d, dnnl_bf16, to));
  dnnl_primitive_desc_t pd;
  DNNL_CHECK(dnnl_reorder_primitive_desc_create(&pd, &c->from, engine, &c->to, engine, NULL));
  DNNL_CHECK(dnnl_primitive_create(&c->reorder, pd));
  DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
}

// out [batch, rows, cols] = the operand x rounded to bf16 (c made for its shape).
static void operand_copy_run(const OperandCopy *c, const float *x, int64_t batch, uint16_t *out) {
  if (!c->reorder) {
    if (c->ld == c->cols && (c->batch == 1 || c->stride == c->rows * c->cols))  // the batch dense: one pass
      round_rows(x, c->batch * c->rows, c->cols, c->cols, out);
    else
      for (int64_t b = 0; b < c->batch; b++)
        round_rows(x + b * c->stride, c->rows, c->cols, c->ld, out + b * c->rows * c->cols);
    for (int64_t b = c->batch; b < batch; b++)  // the shared matrix, once per batch entry
      memcpy(out + b * c->rows * c->cols, out, (size_t)(c->rows * c->cols) * sizeof(uint16_t));
    return;
  }
  dnnl_memory_t mf, mt;
  DNNL_CHECK(dnnl_memory_create(&mf, &c->from, engine, (void *)x));
  DNNL_CHECK(dnnl_memory_create(&mt, &c->to, engine, out));
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, mf}, {DNNL_ARG_TO, mt}};
  DNNL_CHECK(dnnl_primitive_execute(c->reorder, stream, 2, args));
  DNNL_CHECK(dnnl_memory_destroy(mf));
  DNNL_CHECK(dnnl_memory_destroy(mt));
  size_t one = dnnl_memory_desc_get_size(&c->to);  // the shared matrix, once per batch entry
  for (int64_t b = c->batch; b < batch; b++) memcpy((char *)out + b * one, out, one);
}

// The matmul of a key: src [batch, m, k] and weights [batch, k, n] dense bf16 (transposed ones by
// their strides; fp32 for an f32 key), dst [batch, m, n] fp32 at C's strides; alpha as output
// scale, beta as a sum, then the epilogue's bias [n] and ReLU.
static void gemm_prim_create(GemmPrim *p, const GemmKey *key) {
  int64_t m = key->m, n = key->n, k = key->k, B = key->batch;
  dnnl_dims_t ad = {B, m, k}, bd = {B, k, n}, cd = {B, m, n};
  dnnl_dims_t as = {m * k, key->trans_a ? 1 : k, key->trans_a ? m : 1};  // stored [k, m] when transposed
  dnnl_dims_t bs = {k * n, key->trans_b ? 1 : n, key->trans_b ? k : 1};  // stored [n, k] when transposed
  dnnl_dims_t cs = {key->stride_c, key->ldc, 1};
  dnnl_data_type_t operands = key->f32 ? dnnl_f32 : dnnl_bf16;
  DNNL_CHECK(dnnl_memory_desc_init_by_strides(&p->a_md, 3, ad, operands, as));
  DNNL_CHECK(dnnl_memory_desc_init_by_strides(&p->b_md, 3, bd, operands, bs));
  DNNL_CHECK(dnnl_memory_desc_init_by_strides(&p->c_md, 3, cd, dnnl_f32, cs));
  dnnl_dims_t biasd = {1, 1, n};  // broadcast over the batch and the rows
  if (key->epilogue & EPILOGUE_BIAS)
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&p->bias_md, 3, biasd, dnnl_f32, dnnl_abc));
  dnnl_matmul_desc_t d;
  DNNL_CHECK(
      dnnl_matmul_desc_init(&d, &p->a_md, &p->b_md, key->epilogue & EPILOGUE_BIAS ? &p->bias_md : NULL, &p->c_md));
  dnnl_primitive_attr_t attr;
  DNNL_CHECK(dnnl_primitive_attr_create(&attr));
  if (key->alpha != 1.0f) DNNL_CHECK(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &key->alpha));
  if (key->beta != 0.0f || (key->epilogue & EPILOGUE_RELU)) {  // C = relu?(alpha AB + bias + beta C)
    dnnl_post_ops_t po;
    DNNL_CHECK(dnnl_post_ops_create(&po));
    if (key->beta != 0.0f) DNNL_CHECK(dnnl_post_ops_append_sum(po, key->beta));
    if (key->epilogue & EPILOGUE_RELU)
      DNNL_CHECK(dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f));
    DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, po));
    DNNL_CHECK(dnnl_post_ops_destroy(po));
  }
  dnnl_primitive_desc_t pd;
  DNNL_CHECK(dnnl_primitive_desc_create(&pd, &d, attr, engine, NULL));
  DNNL_CHECK(dnnl_primitive_create(&p->prim, pd));
  DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
  DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
  // As stored: A [m, k] (or [k, m] transposed) rows of lda; B [k, n] (or [n, k]) rows of ldb. A key
  // of lda 0 is a GEMM on operands given in bf16 (cpu_gemm_bf16), an f32 key one on operands read as
  // given: nothing to convert.
  if (key->lda && !key->f32) {
    operand_copy_create(&p->a_copy, B, key->trans_a ? k : m, key->trans_a ? m : k, key->lda, key->stride_a);
    operand_copy_create(&p->b_copy, B, key->trans_b ? n : k, key->trans_b ? k : n, key->ldb, key->stride_b);
  }
  p->key = *key;
}

static void engine_init(void) {
  if (engine) return;
  DNNL_CHECK(dnnl_engine_create(&engine, dnnl_cpu, 0));
  DNNL_CHECK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
}

static GemmPrim *gemm_prim_get(const GemmKey *key) {
  engine_init();
  GemmPrim *victim = &gemm_cache[0];
  for (int i = 0; i < GEMM_CACHE_SIZE; i++) {
    GemmPrim *p = &gemm_cache[i];
    if (p->used && !memcmp(&p->key, key, sizeof *key)) {
      p->used = ++gemm_clock;
      return p;
    }
    if (p->used < victim->used) victim = p;
  }
  if (victim->used) {
    DNNL_CHECK(dnnl_primitive_destroy(victim->prim));
    if (victim->a_copy.reorder) DNNL_CHECK(dnnl_primitive_destroy(victim->a_copy.reorder));  // NULL: rounded directly
    if (victim->b_copy.reorder) DNNL_CHECK(dnnl_primitive_destroy(victim->b_copy.reorder));
  }
  memset(victim, 0, sizeof *victim);
  gemm_prim_create(victim, key);
  victim->used = ++gemm_clock;
  return victim;
}

static bool bf16_wanted(int64_t m, int64_t n, int64_t k, int64_t batch) {
  // Inside a parallel region (a caller's per-thread GEMMs) the shared copies and cache cannot be used.
  if (!cpu_bf16_enabled() || omp_in_parallel() || (double)m * n * k * batch < GEMM_BF16_MIN_MACS || k < 16)
    return false;
  // cpu_gemm_batched's fp32 runs one matrix per thread where there are as many and each is small.
  bool per_thread = batch >= omp_get_max_threads() && 2.0 * m * n * k < GEMM_BATCH_PARALLEL_MAX_FLOPS;
  int64_t width = min_batched_width();
  bool narrow = m < width || n < width;
  return batch == 1 || !narrow || !per_thread;
}

bool cpu_gemm_bf16_wanted(int64_t m, int64_t n, int64_t k) { return bf16_wanted(m, n, k, 1); }

// C = relu?(alpha A B + bias + beta C) by p's matmul on its operands (dense bf16, or fp32 for an
// f32 key); bias [n] where the key's epilogue has one, else NULL.
static void gemm_prim_run(const GemmPrim *p, const void *a, const void *b, const float *bias, float *c) {
  dnnl_memory_t mem[4];
  DNNL_CHECK(dnnl_memory_create(&mem[0], &p->a_md, engine, (void *)a));
  DNNL_CHECK(dnnl_memory_create(&mem[1], &p->b_md, engine, (void *)b));
  DNNL_CHECK(dnnl_memory_create(&mem[2], &p->c_md, engine, c));
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]}};
  int n_args = 3;
  if (p->key.epilogue & EPILOGUE_BIAS) {
    DNNL_CHECK(dnnl_memory_create(&mem[3], &p->bias_md, engine, (void *)bias));
    args[n_args++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, mem[3]};
  }
  DNNL_CHECK(dnnl_primitive_execute(p->prim, stream, n_args, args));
  for (int i = 0; i < n_args; i++) DNNL_CHECK(dnnl_memory_destroy(mem[i]));
}

bool cpu_gemm_bf16_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                           int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, float beta,
                           float *c, int64_t ldc, int64_t stride_c, int64_t batch) {
  if (!bf16_wanted(m, n, k, batch)) return false;
  _Static_assert(sizeof(GemmKey) == 14 * sizeof(int64_t) + 2 * sizeof(float), "GemmKey has padding bytes");
  GemmKey key = {.trans_a = trans_a,
                 .trans_b = trans_b,
                 .m = m,
                 .n = n,
                 .k = k,
                 .batch = batch,
                 .lda = lda,
                 .ldb = ldb,
                 .stride_a = batch > 1 ? stride_a : 0,
                 .stride_b = batch > 1 ? stride_b : 0,
                 .ldc = ldc,
                 .stride_c = batch > 1 ? stride_c : m * ldc,
                 .alpha = alpha,
                 .beta = beta};
  pthread_mutex_lock(&cache_lock);
  GemmPrim *p = gemm_prim_get(&key);
  int64_t na = batch * m * k, nb = batch * k * n;
  uint16_t *a16 = copies_reserve(na + nb), *b16 = a16 + na;
  operand_copy_run(&p->a_copy, a, batch, a16);
  operand_copy_run(&p->b_copy, b, batch, b16);
  gemm_prim_run(p, a16, b16, NULL, c);
  pthread_mutex_unlock(&cache_lock);
  return true;
}

// The conversions of cpu_round_bf16, by shape: the last ROUND_CACHE_SIZE, least recently used dropped.
#define ROUND_CACHE_SIZE 32
static struct {
  int64_t rows, cols;
  OperandCopy copy;
  uint64_t used;  // 0: empty
} round_cache[ROUND_CACHE_SIZE];
static uint64_t round_clock;

// cpu_round_bf16 under cache_lock.
static void round_bf16_locked(const float *x, int64_t rows, int64_t cols, uint16_t *out) {
  if (rows == 0 || cols == 0) return;
  DETR_CHECK(!omp_in_parallel(), "cpu_round_bf16: called inside a parallel region (its cache is shared)");
  if (round_direct()) {
    round_rows(x, rows, cols, cols, out);
    return;
  }
  engine_init();
  int victim = 0;
  for (int i = 0; i < ROUND_CACHE_SIZE; i++) {
    if (round_cache[i].used && round_cache[i].rows == rows && round_cache[i].cols == cols) {
      round_cache[i].used = ++round_clock;
      operand_copy_run(&round_cache[i].copy, x, 1, out);
      return;
    }
    if (round_cache[i].used < round_cache[victim].used) victim = i;
  }
  if (round_cache[victim].used) DNNL_CHECK(dnnl_primitive_destroy(round_cache[victim].copy.reorder));
  operand_copy_create(&round_cache[victim].copy, 1, rows, cols, cols, 0);
  round_cache[victim].rows = rows, round_cache[victim].cols = cols;
  round_cache[victim].used = ++round_clock;
  operand_copy_run(&round_cache[victim].copy, x, 1, out);
}

void cpu_round_bf16(const float *x, int64_t rows, int64_t cols, uint16_t *out) {
  pthread_mutex_lock(&cache_lock);
  round_bf16_locked(x, rows, cols, out);
  pthread_mutex_unlock(&cache_lock);
}

void cpu_gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                   const uint16_t *b, float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  DETR_CHECK(k > 0, "cpu_gemm_bf16: %lld x %lld x %lld: no sum (cpu_gemm_bf16_wanted says no)", (long long)m,
             (long long)n, (long long)k);
  DETR_CHECK(!omp_in_parallel(), "cpu_gemm_bf16: called inside a parallel region (its cache is shared)");
  GemmKey key = {.trans_a = trans_a,
                 .trans_b = trans_b,
                 .m = m,
                 .n = n,
                 .k = k,
                 .batch = 1,
                 .ldc = ldc,
                 .stride_c = m * ldc,
                 .alpha = alpha,
                 .beta = beta};  // lda 0: operands already bf16
  pthread_mutex_lock(&cache_lock);
  gemm_prim_run(gemm_prim_get(&key), a, b, NULL, c);
  pthread_mutex_unlock(&cache_lock);
}

bool cpu_linear_fused(const float *x, const float *w, const float *bias, bool relu, float *y, int64_t rows, int64_t in,
                      int64_t out) {
  if (rows == 0 || in == 0 || out == 0 || omp_in_parallel()) return false;  // the caller's loops cover those
  // A primitive per row count, as a convolution's per input size: a new one costs ~0.3 ms (oneDNN's
  // JIT, 2 threads), ENACT's cluster counts and the pictures' sizes make a few dozen. oneDNN's
  // run-time row count (DNNL_RUNTIME_DIM_VAL) took as long for a new count and ran 1.5x slower.
  GemmKey key = {.trans_b = 1,
                 .m = rows,
                 .n = out,
                 .k = in,
                 .batch = 1,
                 .lda = in,
                 .ldb = in,
                 .ldc = out,
                 .stride_c = rows * out,
                 .f32 = 1,
                 .epilogue = (bias ? EPILOGUE_BIAS : 0) | (relu ? EPILOGUE_RELU : 0),
                 .alpha = 1.0f,
                 .beta = 0.0f};
  pthread_mutex_lock(&cache_lock);
  gemm_prim_run(gemm_prim_get(&key), x, w, bias, y);
  pthread_mutex_unlock(&cache_lock);
  return true;
}

static void linear_bf16_rounded_locked(const uint16_t *x16, const uint16_t *w16, const float *bias, bool relu, float *y,
                                       int64_t rows, int64_t in, int64_t out);

bool cpu_linear_bf16(const float *x, const uint16_t *w16, const float *bias, bool relu, float *y, int64_t rows,
                     int64_t in, int64_t out) {
  if (!cpu_bf16_enabled() || rows == 0 || in == 0 || out == 0 || omp_in_parallel() ||
      (double)rows * in * out < fmin(LINEAR_BF16_KEPT_MIN_MACS_PER_THREAD * omp_get_max_threads(), GEMM_BF16_MIN_MACS))
    return false;
  pthread_mutex_lock(&cache_lock);
  uint16_t *x16 = copies_reserve(rows * in);  // [rows, in]
  round_bf16_locked(x, rows, in, x16);
  linear_bf16_rounded_locked(x16, w16, bias, relu, y, rows, in, out);
  pthread_mutex_unlock(&cache_lock);
  return true;
}

void cpu_linear_bf16_rounded(const uint16_t *x16, const uint16_t *w16, const float *bias, bool relu, float *y,
                             int64_t rows, int64_t in, int64_t out) {
  pthread_mutex_lock(&cache_lock);
  linear_bf16_rounded_locked(x16, w16, bias, relu, y, rows, in, out);
  pthread_mutex_unlock(&cache_lock);
}

// cpu_linear_bf16_rounded under cache_lock.
static void linear_bf16_rounded_locked(const uint16_t *x16, const uint16_t *w16, const float *bias, bool relu, float *y,
                                       int64_t rows, int64_t in, int64_t out) {
  if (rows == 0 || out == 0) return;
  DETR_CHECK(in > 0 && !omp_in_parallel(), "cpu_linear_bf16_rounded: %lld inputs, %s a parallel region", (long long)in,
             omp_in_parallel() ? "inside" : "outside");
  GemmKey key = {.trans_b = 1,
                 .m = rows,
                 .n = out,
                 .k = in,
                 .batch = 1,
                 .ldc = out,
                 .stride_c = rows * out,
                 .epilogue = (bias ? EPILOGUE_BIAS : 0) | (relu ? EPILOGUE_RELU : 0),
                 .alpha = 1.0f,
                 .beta = 0.0f};
  gemm_prim_run(gemm_prim_get(&key), x16, w16, bias, y);  // lda 0: operands already bf16
}
#else
int64_t cpu_gemm_bf16_set_min_batched_width(int64_t width) {
  (void)width;
  return 0;
}

bool cpu_gemm_bf16_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                           int64_t lda, int64_t stride_a, const float *b, int64_t ldb, int64_t stride_b, float beta,
                           float *c, int64_t ldc, int64_t stride_c, int64_t batch) {
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)lda, (void)stride_a;
  (void)b, (void)ldb, (void)stride_b, (void)beta, (void)c, (void)ldc, (void)stride_c, (void)batch;
  return false;  // cpu_set_bf16 refuses a build without oneDNN
}

bool cpu_gemm_bf16_wanted(int64_t m, int64_t n, int64_t k) {
  (void)m, (void)n, (void)k;
  return false;
}

void cpu_round_bf16(const float *x, int64_t rows, int64_t cols, uint16_t *out) {
  (void)x, (void)rows, (void)cols, (void)out;
  DETR_FAIL("cpu_round_bf16: this build has no oneDNN (bf16 is refused without it)");
}

bool cpu_linear_bf16(const float *x, const uint16_t *w16, const float *bias, bool relu, float *y, int64_t rows,
                     int64_t in, int64_t out) {
  (void)x, (void)w16, (void)bias, (void)relu, (void)y, (void)rows, (void)in, (void)out;
  return false;  // no bf16 without oneDNN
}

void cpu_linear_bf16_rounded(const uint16_t *x16, const uint16_t *w16, const float *bias, bool relu, float *y,
                             int64_t rows, int64_t in, int64_t out) {
  (void)x16, (void)w16, (void)bias, (void)relu, (void)y, (void)rows, (void)in, (void)out;
  DETR_FAIL("cpu_linear_bf16_rounded: this build has no oneDNN (bf16 is refused without it)");
}

bool cpu_linear_fused(const float *x, const float *w, const float *bias, bool relu, float *y, int64_t rows, int64_t in,
                      int64_t out) {
  (void)x, (void)w, (void)bias, (void)relu, (void)y, (void)rows, (void)in, (void)out;
  return false;  // sgemm and the bias pass, as in training
}

void cpu_gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a,
                   const uint16_t *b, float beta, float *c, int64_t ldc) {
  (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)b, (void)beta, (void)c,
      (void)ldc;
  DETR_FAIL("cpu_gemm_bf16: this build has no oneDNN (bf16 is refused without it)");
}
#endif
