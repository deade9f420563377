// Shared by the libFuzzer harnesses: the readers take paths, so each input is written to a file in
// a per-process folder (tmpfs when there is one) first; checks of what a rejected input must get
// (a message naming the file); the small DETR model the loader harnesses load into.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "nn/detr.h"

// A failed property: prints the message and aborts, which libFuzzer reports as a crash with the
// input that caused it.
#define FUZZ_ASSERT(cond, ...)                                                  \
  do {                                                                          \
    if (!(cond)) {                                                              \
      fuzz_report("%s:%d: assertion '%s' failed: ", __FILE__, __LINE__, #cond); \
      fuzz_report(__VA_ARGS__);                                                 \
      fuzz_report("\n");                                                        \
      abort();                                                                  \
    }                                                                           \
  } while (0)
// printf to the stderr the process started with: still open when libFuzzer runs with
// -close_fd_mask=3 (tools/fuzz.sh does, to drop the readers' output).
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
void fuzz_report(const char *fmt, ...);

// Writes data to NAME inside this process's scratch folder (removed at exit); returns its path,
// valid until the next call with the same name.
const char *fuzz_write_file(const char *name, const uint8_t *data, size_t n);
// The path NAME would have in the scratch folder (for outputs).
const char *fuzz_path(const char *name);
// A reader's error for a rejected input: non-empty and naming `path` (SPEC section 9).
void fuzz_expect_error(const char *err, const char *path);

// The model the loader harnesses load into, and the seeds are written from: DETR with every part
// of the real one (ResNet-18 backbone at width 4, one encoder and one decoder layer of width 8,
// 2 queries, 3 classes) so its file has the real names and a small header.
void fuzz_model_config(DetrConfig *cfg);
// 64-bit FNV-1a of the input: a seed for choices a harness derives from it.
uint64_t fuzz_hash(const uint8_t *data, size_t n);
