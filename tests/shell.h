// Running the `detr` binary from a test as a user would: shell commands whose output is appended
// to one log file in the test's temporary folder.
#pragma once

// The test's temporary folder (set by the test, e.g. with mkdtemp); its log.txt gets the output.
extern char test_root[64];

// Runs a shell command (printf-style); returns its exit status, -1 if it did not exit.
int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
