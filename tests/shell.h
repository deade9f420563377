// Running the `detr` binary from a test as a user would: shell commands whose output is appended
// to one log file in the test's temporary folder.
#pragma once
#include <check.h>
#include <stdbool.h>
#include <sys/types.h>

// The test's temporary folder (set by the test, e.g. with mkdtemp); its log.txt gets the output.
extern char test_root[64];

// Runs a shell command (printf-style); returns its exit status, -1 if it did not exit.
int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Starts `sh -c "exec COMMAND"` without waiting (printf-style; COMMAND redirects its own output):
// the pid returned is the command's own, to be signalled, and waited for with sh_wait.
pid_t sh_start(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Waits up to `seconds` for `path` to appear; whether it did.
bool sh_wait_for_file(const char *path, double seconds);
// The exit status of a command sh_start began (128 + the signal that ended it), after it ends; a
// command still running after `seconds` is sent SIGTERM, then SIGKILL 10 s later, and fails the test.
int sh_wait(pid_t pid, double seconds);

// The first integer a shell command prints (printf-style), or `otherwise` when it prints none.
long sh_read_long(long otherwise, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Runs a suite of tests that fork and exec `detr` themselves (Check's CK_NOFORK), then removes
// test_root when every test passed (the runs' checkpoints take room; a failure keeps them).
// Returns the process exit status: 0 when every test passed.
int sh_run_suite(Suite *s);
