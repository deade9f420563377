#define _DEFAULT_SOURCE  // realpath
#include "cli/out_file.h"

#include <ctype.h>
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

// The file's first 64 KiB (an earlier output's key comes early) shows `shape`: its first non-space
// character is shape->open and it holds shape->key, or it is empty ("", "[]", "{}").
static bool has_shape(const char *path, const JsonShape *shape) {
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  char head[65537];
  size_t n = fread(head, 1, sizeof head - 1, f);
  fclose(f);
  head[n] = 0;
  size_t i = 0;
  while (i < n && isspace((unsigned char)head[i])) i++;
  if (i == n) return true;
  if (head[i] != shape->open) return false;
  size_t j = i + 1;
  while (j < n && isspace((unsigned char)head[j])) j++;
  if (j < n && head[j] == (shape->open == '[' ? ']' : '}')) return true;
  return strstr(head + i, shape->key) != NULL;
}

int out_file_check(const char *path, const char *flag, const JsonShape *shape, const char *const *inputs, int n_inputs,
                   char *err, size_t err_cap) {
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
  if (!shape) {
    snprintf(err, err_cap, "--%s %s exists: not overwritten; give another path, or move or remove it first", flag,
             path);
    return -1;
  }
  if (!has_shape(path, shape)) {
    snprintf(err, err_cap,
             "--%s %s exists and is not this command's earlier output (a JSON %s with %s): not "
             "overwritten; give another path",
             flag, path, shape->open == '[' ? "array" : "object", shape->key);
    return -1;
  }
  return 0;
}

// dir/name with dir resolved (the file itself may not exist yet); false when dir does not exist.
static bool canonical(const char *path, char *out, size_t cap) {
  const char *slash = strrchr(path, '/');
  char dir[PATH_MAX], real[PATH_MAX];
  snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) + (slash == path) : 1, slash ? path : ".");
  if (!realpath(dir, real)) return false;
  return (size_t)snprintf(out, cap, "%s/%s", real, slash ? slash + 1 : path) < cap;
}

bool out_file_same(const char *a, const char *b) {
  char x[2 * PATH_MAX], y[2 * PATH_MAX];
  return canonical(a, x, sizeof x) && canonical(b, y, sizeof y) ? !strcmp(x, y) : !strcmp(a, b);
}
