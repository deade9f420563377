#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void detr_fail(const char *file, int line, const char *fmt, ...) {
  fflush(stdout);
  fprintf(stderr, "detr: %s:%d: ", file, line);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  exit(1);
}

void *detr_malloc_at(size_t nbytes, const char *what, const char *file, int line) {
  void *p = malloc(nbytes ? nbytes : 1);
  if (!p) detr_fail(file, line, "out of host memory allocating %zu bytes for %s", nbytes, what);
  return p;
}

void *detr_calloc_at(size_t n, size_t size, const char *what, const char *file, int line) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (!p) detr_fail(file, line, "out of host memory allocating %zu x %zu bytes for %s", n, size, what);
  return p;
}

void *detr_aligned_malloc_at(size_t align, size_t nbytes, const char *what, const char *file, int line) {
  size_t bytes = (nbytes + align - 1) / align * align;  // C11: a multiple of the alignment
  void *p = aligned_alloc(align, bytes ? bytes : align);
  if (!p) detr_fail(file, line, "out of host memory allocating %zu bytes (aligned to %zu) for %s", nbytes, align, what);
  return p;
}

void *detr_realloc_at(void *p, size_t nbytes, const char *what, const char *file, int line) {
  void *q = realloc(p, nbytes ? nbytes : 1);
  if (!q) detr_fail(file, line, "out of host memory growing %s to %zu bytes", what, nbytes);
  return q;
}

char *detr_strdup_at(const char *s, const char *what, const char *file, int line) {
  size_t n = strlen(s) + 1;
  char *c = detr_malloc_at(n, what, file, line);
  memcpy(c, s, n);
  return c;
}
