// Files a verb writes at a path the user names (eval's --results and --json, predict's --json,
// pretrain's --out): such a path may name an earlier output of the same verb, never one of the
// command's inputs or a file of another kind (a mistyped --json naming the checkpoint replaced it).
#pragma once
#include <stdbool.h>
#include <stddef.h>

// What the verb's own JSON looks like: its first character ('{' or '[') and a key every such file
// holds unless it is empty ("\"AP\"" for eval's numbers, "\"image_id\"" for COCO results).
typedef struct {
  char open;
  const char *key;
} JsonShape;

// Checks, before any work, that `path` (given as --<flag>) may be written: not a folder, not one
// of inputs[0..n_inputs) (NULL entries skipped; compared as files, however spelled), and, when it
// exists, a JSON file of `shape` (an earlier output); with shape NULL it must not exist (an output
// that took long to make is never replaced). Returns 0, or -1 with err set to what to do.
int out_file_check(const char *path, const char *flag, const JsonShape *shape, const char *const *inputs, int n_inputs,
                   char *err, size_t err_cap);

// Whether two output paths name one file, however spelled ("r.json", "./r.json", "d/../r.json"),
// whether or not it exists yet.
bool out_file_same(const char *a, const char *b);
