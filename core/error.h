// The bottom of the project: how a failure that cannot be recovered from ends the process. Every
// layer includes this (kernels/ through cli/); it includes nothing of the project.
//
// Two kinds of failure, two conventions (docs/architecture.md, "Errors"):
// - programming errors and unrecoverable conditions (shape mismatches, CUDA failures, out of
//   memory) stop the process here with the file and line: DETR_CHECK, DETR_FAIL, detr_malloc;
// - problems with the user's input (files, flags, configs) are returned to the caller, which
//   decides: `int f(..., char *err, size_t err_cap)` returns 0, or -1 with a message in err.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// Prints "detr: FILE:LINE: message" to stderr and exits with status 1.
#if defined(__GNUC__)
__attribute__((noreturn, format(printf, 3, 4)))
#endif
void detr_fail(const char *file, int line, const char *fmt, ...);

// malloc/calloc/realloc that never return NULL: out of memory is fatal, with the caller's file and
// line and `what` was being allocated (llm.c's mallocCheck). A size of 0 allocates 1 byte, so
// the result is never NULL and can always be freed.
void *detr_malloc_at(size_t nbytes, const char *what, const char *file, int line);
void *detr_calloc_at(size_t n, size_t size, const char *what, const char *file, int line);
void *detr_realloc_at(void *p, size_t nbytes, const char *what, const char *file, int line);
// aligned_alloc's (align a power of two; the size is rounded up to a multiple of it); free() frees.
void *detr_aligned_malloc_at(size_t align, size_t nbytes, const char *what, const char *file, int line);
char *detr_strdup_at(const char *s, const char *what, const char *file, int line);

#ifdef __cplusplus
}
#endif

#define DETR_FAIL(...) detr_fail(__FILE__, __LINE__, __VA_ARGS__)
#define DETR_CHECK(cond, ...)                                \
  do {                                                       \
    if (!(cond)) detr_fail(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

#define detr_malloc(nbytes, what) detr_malloc_at((nbytes), (what), __FILE__, __LINE__)
#define detr_calloc(n, size, what) detr_calloc_at((n), (size), (what), __FILE__, __LINE__)
#define detr_realloc(p, nbytes, what) detr_realloc_at((p), (nbytes), (what), __FILE__, __LINE__)
#define detr_aligned_malloc(align, nbytes, what) detr_aligned_malloc_at((align), (nbytes), (what), __FILE__, __LINE__)
#define detr_strdup(s, what) detr_strdup_at((s), (what), __FILE__, __LINE__)
