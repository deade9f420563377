#define _DEFAULT_SOURCE  // mkdtemp
#include "fuzz_util.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int report_fd = 2;

// Before libFuzzer's main, which may close fd 2.
__attribute__((constructor)) static void keep_stderr(void) {
  int fd = dup(2);
  if (fd >= 0) report_fd = fd;
}

void fuzz_report(const char *fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof buf - 1) n = (int)sizeof buf - 1;
  if (n > 0 && write(report_fd, buf, (size_t)n) < 0) abort();
}

static char scratch[256];
static char paths[8][512];  // fuzz_path's results: a few names in use at once

static void remove_scratch(void) {
  DIR *d = opendir(scratch);
  if (d) {
    struct dirent *e;
    char p[600];
    while ((e = readdir(d)))
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
        snprintf(p, sizeof p, "%s/%s", scratch, e->d_name);
        unlink(p);
      }
    closedir(d);
  }
  rmdir(scratch);
}

const char *fuzz_path(const char *name) {
  if (!scratch[0]) {
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(scratch, sizeof scratch, "%s/detr-fuzz.XXXXXX", base);
    if (!mkdtemp(scratch)) {
      fuzz_report("fuzz: mkdtemp(%s) failed: %s\n", scratch, strerror(errno));
      abort();
    }
    atexit(remove_scratch);
  }
  // One slot per distinct name, so callers can hold several paths.
  static const char *names[8];
  int slot = 0;
  while (slot < 8 && names[slot] && strcmp(names[slot], name)) slot++;
  if (slot == 8) {
    fuzz_report("fuzz: more than 8 scratch file names\n");
    abort();
  }
  names[slot] = name;
  snprintf(paths[slot], sizeof paths[slot], "%s/%s", scratch, name);
  return paths[slot];
}

const char *fuzz_write_file(const char *name, const uint8_t *data, size_t n) {
  const char *path = fuzz_path(name);
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
    fuzz_report("fuzz: cannot write %s: %s\n", path, strerror(errno));
    abort();
  }
  return path;
}

void fuzz_expect_error(const char *err, const char *path) {
  FUZZ_ASSERT(err[0], "a rejected input got no message");
  FUZZ_ASSERT(strstr(err, path), "the message does not name the file %s: %s", path, err);
}

// The tiny preset with the sizes of fuzz_util.h set by key, as `--set key=value` would.
void fuzz_model_config(DetrConfig *cfg) {
  static const char *const sets[][2] = {{"backbone_width", "4"}, {"hidden_dim", "8"}, {"nheads", "2"},
                                        {"enc_layers", "1"},     {"dec_layers", "1"}, {"ffn_dim", "8"},
                                        {"num_queries", "2"},    {"num_classes", "3"}};
  char err[512];
  detr_config_preset("tiny", cfg);
  for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
    FUZZ_ASSERT(!detr_config_set(cfg, sets[i][0], sets[i][1], err, sizeof err), "%s", err);
}

uint64_t fuzz_hash(const uint8_t *data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ data[i]) * 1099511628211ull;
  return h;
}
