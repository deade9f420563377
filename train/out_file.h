// Files a verb writes at a path the user names (eval's --results and --json, predict's --json,
// pretrain's --out): such a path may name an earlier output of the same verb, never one of the
// command's inputs or a file of another kind (a mistyped --json naming the checkpoint replaced it).
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef enum {
  OUT_FILE_JSON,  // may replace a JSON file (a previous output) that is none of the inputs
  OUT_FILE_NEW,   // must not exist (an output that took long to make: it is never replaced)
} OutFileKind;

// Checks, before any work, that `path` (given as --<flag>) may be written: not a folder, not one
// of inputs[0..n_inputs) (NULL entries skipped; compared as files, however spelled), and per kind.
// "-" (stdout) always may. Returns 0, or -1 with err set to a message that says what to do.
int out_file_check(const char *path, const char *flag, OutFileKind kind, const char *const *inputs, int n_inputs,
                   char *err, size_t err_cap);
