// Shared by the datasets layer: the bad-input policy, error messages that name the file and item,
// rate-limited warnings (allocation is core/error.h's detr_malloc). Data errors are returned to
// the caller (a message in a DataError), never exit(): only programming errors and out-of-memory
// stop here.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

// What to do with a bad item (a malformed annotation, a missing or corrupt image, a box outside
// its image, an unknown category id): stop with an error, or skip it with a warning and count it.
typedef enum { BAD_INPUT_FAIL = 0, BAD_INPUT_SKIP = 1 } BadInputPolicy;

// "fail" or "skip" into *out; returns 0, or -1 for anything else.
int bad_input_policy_parse(const char *s, BadInputPolicy *out);

// Error codes of datasets functions: 0 is success.
enum { DATA_OK = 0, DATA_ERROR = -1 };

typedef struct {
  char msg[4400];  // "FILE: item: what is wrong": room for a path of PATH_MAX and the reason
} DataError;

// Formats into err->msg (err may be NULL). Returns DATA_ERROR so `return data_error(...)` reads.
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
int data_error(DataError *err, const char *fmt, ...);

// Prints "detr: warning: ..." to stderr, at most DATA_WARN_LIMIT times per process for each
// `stream` counter (the final counts are reported separately), thread-safe.
#define DATA_WARN_LIMIT 20
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void data_warn(int64_t *stream, const char *fmt, ...);

// "dir/name" (just name when dir is NULL or empty), malloc'd.
char *data_path_join(const char *dir, const char *name);
// Creates dir and its missing parents (mode 0777 less the umask, as mkdir -p). Returns 0 or
// DATA_ERROR with the reason. The project's one mkdir -p: detr synth, predict and train use it.
int data_mkdirs(const char *dir, DataError *err);
// The size of the regular file at path, or -1 with err set ("cannot open" with errno's words, or
// "not a regular file"). Opened without blocking: a named pipe with no writer would wait for one.
int64_t data_regular_file_size(const char *path, char *err, size_t err_cap);

// Grows *buf (elements of `elem` bytes, capacity *cap) to hold at least `need` elements.
void data_reserve(void **buf, int64_t *cap, int64_t need, size_t elem, const char *what);
