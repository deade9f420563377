#include "tests/shell.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

char test_root[64];

int sh(const char *fmt, ...) {
  char cmd[4096], full[4400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  snprintf(full, sizeof full, "%s >> %s/log.txt 2>&1", cmd, test_root);
  int st = system(full);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
