// Running the `detr` binary from a test as a user would: shell commands whose output is appended
// to one log file in the test's temporary folder.
#pragma once
#include <check.h>

// The test's temporary folder (set by the test, e.g. with mkdtemp); its log.txt gets the output.
extern char test_root[64];

// Runs a shell command (printf-style); returns its exit status, -1 if it did not exit.
int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Runs a suite of tests that fork and exec `detr` themselves (Check's CK_NOFORK), then removes
// test_root when every test passed (the runs' checkpoints take room; a failure keeps them).
// Returns the process exit status: 0 when every test passed.
int sh_run_suite(Suite *s);
