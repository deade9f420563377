#include "tests/shell.h"

#include <check.h>
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

int sh_run_suite(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  if (!failed && test_root[0]) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", test_root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", test_root);
  }
  return failed ? 1 : 0;
}
