#include "kernels/common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

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
