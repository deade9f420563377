// detr info: what a safetensors file holds. A detr-c checkpoint: its training state, whether its
// checksum holds, the model config, the training command, tensor and parameter counts. Any other
// safetensors file (converted weights, `detr step` outputs): its metadata and a tensor table.
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "tensor/safetensors.h"
#include "train/checkpoint.h"

static const char *USAGE =
    "FILE [--all]\n"
    "Describes a safetensors file: for a detr-c checkpoint the step, epoch, data position, best AP, checksum\n"
    "status, model config, training command and tensor/parameter counts; for any other file its metadata and\n"
    "tensors (name, dtype, shape). Exit status 1 for an unreadable, truncated or corrupted file.";

#define TABLE_ROWS 40

static void print_size(const char *label, long long bytes) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int u = 0;
  while (v >= 1024.0 && u < 4) v /= 1024.0, u++;
  printf("%-15s%lld bytes (%.1f %s)\n", label, bytes, v, unit[u]);
}

static void print_shape(const StEntry *e, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int d = 0; d < e->ndim && n < cap; d++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)e->shape[d]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
}

// Name, dtype, shape of the first TABLE_ROWS tensors (all with `all`), then how many were left out.
static void print_table(const StFile *f, bool all) {
  int n = st_count(f), shown = all || n <= TABLE_ROWS ? n : TABLE_ROWS, name_w = 4;
  for (int i = 0; i < shown; i++) {
    int len = (int)strlen(st_entry(f, i)->name);
    name_w = len > name_w ? len : name_w;
  }
  if (name_w > 64) name_w = 64;  // longer names overflow their column rather than widen every row
  printf("  %-*s  %-5s  %s\n", name_w, "name", "dtype", "shape");
  for (int i = 0; i < shown; i++) {
    const StEntry *e = st_entry(f, i);
    char shape[200];
    print_shape(e, shape, sizeof shape);
    printf("  %-*s  %-5s  %s\n", name_w, e->name, st_dtype_name(e->dtype), shape);
  }
  if (shown < n) printf("  ... and %d more (--all lists them)\n", n - shown);
}

// A metadata value, indented under its key when it spans lines.
static void print_value(const char *key, const char *value) {
  if (!strchr(value, '\n')) {
    printf("  %s: %s\n", key, value);
    return;
  }
  printf("  %s:\n", key);
  for (const char *p = value; *p;) {
    size_t len = strcspn(p, "\n");
    if (len) printf("    %.*s\n", (int)len, p);
    p += len + (p[len] == '\n');
  }
}

static bool is_key(const char *key, const char *const *keys) {
  for (int i = 0; keys[i]; i++)
    if (!strcmp(key, keys[i])) return true;
  return false;
}

static int describe_checkpoint(const char *path, StFile *f, bool all) {
  long long model_tensors = 0, optim_tensors = 0, params = 0;
  for (int i = 0; i < st_count(f); i++) {
    const StEntry *e = st_entry(f, i);
    if (!strncmp(e->name, "optim.", 6)) {
      optim_tensors++;
    } else {
      model_tensors++;
      params += e->numel;
    }
  }
#define META(key) (st_metadata(f, key) ? st_metadata(f, key) : "?")
  printf("%-15s%s\n", "format:", META("format"));
  printf("%-15sstep %s, epoch %s, next batch %s\n", "position:", META("step"), META("epoch"), META("next_batch"));
  const char *best = st_metadata(f, "best_map");
  double best_map = best ? strtod(best, NULL) : -1.0;
  if (best_map >= 0) printf("%-15s%.4f\n", "best AP:", best_map);
  else printf("%-15snone yet\n", "best AP:");
  printf("%-15s%lld tensors, %lld parameters (numel)\n", "model:", model_tensors, params);
  printf("%-15s%lld tensors (AdamW moments)\n", "optimizer:", optim_tensors);
  const char *train = st_metadata(f, "train_config");
  printf("%-15s%s%s\n", "command:", train && *train ? "detr " : "", train && *train ? train : "(not recorded)");
  printf("model config:\n");
  const char *mc = st_metadata(f, "model_config");
  for (const char *p = mc ? mc : ""; *p;) {
    size_t len = strcspn(p, "\n");
    if (len) printf("  %.*s\n", (int)len, p);
    p += len + (p[len] == '\n');
  }
  static const char *const SHOWN[] = {"format",       "step",         "epoch", "next_batch", "best_map",
                                      "train_config", "model_config", "crc32", NULL};
  bool header = false;
  for (int i = 0; i < st_metadata_count(f); i++) {
    const char *k = st_metadata_key(f, i);
    if (is_key(k, SHOWN)) continue;
    if (!header) printf("other metadata:\n"), header = true;
    print_value(k, st_metadata_value(f, i));
  }
  if (all) {
    printf("tensors (%d):\n", st_count(f));
    print_table(f, true);
  }
  char stored[32];
  snprintf(stored, sizeof stored, "%s", META("crc32"));
#undef META
  st_close(f);  // the check below reads the file again: one copy in memory at a time
  char err[4608], *model_config = NULL, *train_config = NULL;
  int rc = checkpoint_read_configs(path, &model_config, &train_config, err, sizeof err);
  free(model_config);
  free(train_config);
  if (rc) {
    printf("%-15sFAILED: %s\n", "crc32:", err);
    fprintf(stderr, "detr info: %s\n", err);
    return 1;
  }
  printf("%-15sok (%s)\n", "crc32:", stored);
  return 0;
}

static int describe_safetensors(StFile *f, bool all) {
  long long numel = 0;
  for (int i = 0; i < st_count(f); i++) numel += st_entry(f, i)->numel;
  printf("%-15ssafetensors (not a detr-c checkpoint)\n", "format:");
  printf("%-15s%d tensors, %lld elements\n", "tensors:", st_count(f), numel);
  if (st_metadata_count(f)) {
    printf("metadata (%d):\n", st_metadata_count(f));
    for (int i = 0; i < st_metadata_count(f); i++) print_value(st_metadata_key(f, i), st_metadata_value(f, i));
  } else {
    printf("metadata:      none\n");
  }
  if (st_count(f)) print_table(f, all);
  st_close(f);
  return 0;
}

int cmd_info(int argc, char **argv, const Dist *job) {
  bool all = false;
  CliFlag flags[] = {{"all", FLAG_BOOL, &all, "list every tensor (default: the first 40; checkpoints: none)"}};
  const char *pos[1];
  int n_pos = 0, rc = cli_parse("info", USAGE, argc, argv, 2, flags, 1, pos, 1, &n_pos);
  if (rc) return rc == 1 ? 0 : 2;
  if (n_pos != 1) {
    fprintf(stderr, "detr info: expected one FILE (see detr info --help)\n");
    return 2;
  }
  const char *path = pos[0];
  char err[4608];
  StFile *f = st_open(path, err, sizeof err);
  if (!f) {
    fprintf(stderr, "detr info: %s\n", err);
    return 1;
  }
  struct stat st;
  printf("%-15s%s\n", "file:", path);
  if (stat(path, &st) == 0) print_size("size:", (long long)st.st_size);
  const char *format = st_metadata(f, "format");
  if (format && !strncmp(format, "detr-c checkpoint", 17)) return describe_checkpoint(path, f, all);
  return describe_safetensors(f, all);
}
