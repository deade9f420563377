#define _DEFAULT_SOURCE  // usleep
#include "tests/shell.h"

#include <check.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

char test_root[64];

int sh(const char *fmt, ...) {
  char cmd[12288], full[12800];  // room for a path past PATH_MAX (the tests of a too-long --out)
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  snprintf(full, sizeof full, "%s >> %s/log.txt 2>&1", cmd, test_root);
  int st = system(full);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

pid_t sh_start(const char *fmt, ...) {
  char cmd[4096], full[4200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  snprintf(full, sizeof full, "exec %s", cmd);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", full, (char *)NULL);
    _exit(127);
  }
  return pid;
}

bool sh_wait_for_file(const char *path, double seconds) {
  struct stat st;
  for (int i = 0; i < (int)(seconds * 100); i++) {
    if (stat(path, &st) == 0) return true;
    usleep(10000);
  }
  return stat(path, &st) == 0;
}

int sh_wait(pid_t pid, double seconds) {
  int st = 0;
  pid_t done = 0;
  for (int i = 0; i < (int)(seconds * 100) && (done = waitpid(pid, &st, WNOHANG)) == 0; i++) usleep(10000);
  if (done == 0) {  // mpirun passes SIGTERM on to its processes; SIGKILL would leave them running
    kill(pid, SIGTERM);
    for (int i = 0; i < 1000 && (done = waitpid(pid, &st, WNOHANG)) == 0; i++) usleep(10000);
    if (done == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
    }
    ck_abort_msg("pid %d still ran after %.0f s: stopped", (int)pid, seconds);
  }
  ck_assert_int_eq(done, pid);
  return WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
}

long sh_read_long(long otherwise, const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  FILE *p = popen(cmd, "r");
  long value = otherwise;
  if (p && fscanf(p, "%ld", &value) != 1) value = otherwise;
  if (p) pclose(p);
  return value;
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
