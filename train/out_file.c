#include "train/out_file.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

// The first byte that is not white space is { or [ (an empty file counts: nothing to lose).
static bool looks_like_json(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  int c;
  while ((c = fgetc(f)) != EOF && isspace(c)) {
  }
  fclose(f);
  return c == EOF || c == '{' || c == '[';
}

int out_file_check(const char *path, const char *flag, OutFileKind kind, const char *const *inputs, int n_inputs,
                   char *err, size_t err_cap) {
  if (!strcmp(path, "-")) return 0;
  struct stat st;
  if (stat(path, &st) != 0) return 0;  // a new file (a folder that is missing fails at the write, saying so)
  if (S_ISDIR(st.st_mode)) {
    snprintf(err, err_cap, "--%s %s is a folder: give a file name", flag, path);
    return -1;
  }
  for (int i = 0; i < n_inputs; i++) {
    struct stat in;
    if (inputs[i] && stat(inputs[i], &in) == 0 && in.st_dev == st.st_dev && in.st_ino == st.st_ino) {
      snprintf(err, err_cap, "--%s %s is this command's input %s: not overwritten; give another path", flag, path,
               inputs[i]);
      return -1;
    }
  }
  if (kind == OUT_FILE_NEW) {
    snprintf(err, err_cap, "--%s %s exists: not overwritten; give another path, or move or remove it first", flag, path);
    return -1;
  }
  if (!looks_like_json(path)) {
    snprintf(err, err_cap, "--%s %s exists and is not a JSON file: not overwritten; give another path", flag, path);
    return -1;
  }
  return 0;
}
