// The smallest CPU loop, counted in floats it touches, that runs on all threads; shorter loops run
// on the calling thread. Two classes, measured (bench/bench_parallel.c, bench/README.md#bench_parallel;
// AMD family 26, 2 threads, libgomp spinning 1000 rounds as the detr command sets):
//  - light: a few operations per float (copies, adds, ReLU, max-pool taps, bias, frozen BN). On
//    all threads from 8-16k floats back to back, but only from 512k-1M when the other thread
//    must first be woken (12-25 us on this VM). The main job's step: the same time (within the
//    VM's +-10% noise) at 8k-64k, slower at 512k (0.026-0.034 s vs 0.023-0.031 s).
//  - heavy: a transcendental, sqrt, index arithmetic or a row reduction per float (sigmoid, exp,
//    softmax, layernorm, AdamW, broadcast binary ops, dropout, ENACT). Dense binary ops, division
//    included, count as light: one loop serves all four, and add dominates them. 1.3-1.9x
//    from 1-2k floats back to back, from 32-64k after a wake-up.
#pragma once
#include <stdint.h>

#define PARALLEL_MIN_LIGHT ((int64_t)32768)
#define PARALLEL_MIN_HEAVY ((int64_t)8192)

// Below this a batch of GEMMs (cpu_gemm_batched) runs one matrix per thread. Measured with oneDNN's
// sgemm, 2 threads (bench/README.md#bench_ops): one per thread 1.05-1.9x one after another at
// 0.6-10.6 MFLOP per matrix (attention's per-head products: 0.66 MFLOP, 1.5-1.9x), 1.0x at 67 MFLOP.
#define GEMM_BATCH_PARALLEL_MAX_FLOPS 16e6

// A loop function compiled twice, for baseline x86-64 (what the build targets) and for AVX2, the
// copy chosen at run time (GCC's target_clones). The same source: without FMA contraction (ISO C
// here), the same operations and the same bits on either path. Not under ThreadSanitizer: the
// clones' resolver runs while the program is loaded, before the sanitizer's runtime, and crashes it.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define CPU_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CPU_AVX2_CLONES
#endif
