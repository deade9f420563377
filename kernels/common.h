// Lowest layer: error reporting and the host/device qualifier shared by CPU and CUDA kernels.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DETR_HD static inline __host__ __device__
#else
#define DETR_HD static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

// Prints "detr: FILE:LINE: message" to stderr and exits with status 1. Used for programming
// errors and unrecoverable conditions (shape mismatches, CUDA failures, out of memory).
#if defined(__GNUC__)
__attribute__((noreturn, format(printf, 3, 4)))
#endif
void detr_fail(const char *file, int line, const char *fmt, ...);

#ifdef __cplusplus
}
#endif

#define DETR_FAIL(...) detr_fail(__FILE__, __LINE__, __VA_ARGS__)
#define DETR_CHECK(cond, ...)                                                                        \
  do {                                                                                             \
    if (!(cond)) detr_fail(__FILE__, __LINE__, __VA_ARGS__);                                       \
  } while (0)

// Maximum tensor rank; broadcasting index math is unrolled over this many dims.
#define DETR_MAX_DIMS 6
// Deepest JSON nesting a reader accepts (safetensors headers, COCO instances and results files):
// the formats need at most 5 levels (a COCO polygon list); deeper input is refused with the file
// and the limit rather than walked level by level.
#define DETR_MAX_JSON_DEPTH 64
