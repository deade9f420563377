#define _DEFAULT_SOURCE  // realpath, getline
#include "train/run_dir.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "api/model_file.h"  // checkpoint_verify
#include "tensor/safetensors.h"

// dir/name exists (and, with non_empty, holds a byte: a log created by a run that stopped before
// its first line is no run).
static bool exists_in(const char *dir, const char *name, bool non_empty) {
  char path[4200];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return stat(path, &st) == 0 && (!non_empty || st.st_size > 0);
}

void run_dir_scan(const char *dir, RunDirContents *c) {
  *c = (RunDirContents){0};
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) && c->n_checkpoints < RUN_DIR_MAX_CHECKPOINTS) {
    long long step;
    char tail[32];
    if (sscanf(e->d_name, "ckpt-%lld.%31s", &step, tail) == 2 && !strcmp(tail, "safetensors") && step >= 0)
      c->steps[c->n_checkpoints++] = step;
  }
  closedir(d);
  for (int i = 1; i < c->n_checkpoints; i++)  // insertion sort, newest first
    for (int j = i; j > 0 && c->steps[j] > c->steps[j - 1]; j--) {
      int64_t t = c->steps[j];
      c->steps[j] = c->steps[j - 1];
      c->steps[j - 1] = t;
    }
  c->best = exists_in(dir, "best.safetensors", false);
  c->metrics = exists_in(dir, "metrics.jsonl", true);
}

int run_dir_foreign_outputs(const char *dir, char *buf, size_t cap) {
  buf[0] = 0;
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  size_t len = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    int64_t k;
    if (!run_dir_is_results(e->d_name, &k) && strcmp(e->d_name, "chart.png")) continue;
    if (len < cap) len += (size_t)snprintf(buf + len, cap - len, "%s%s", n ? ", " : "", e->d_name);
    n++;
  }
  closedir(d);
  return n;
}

bool run_dir_has_run(const RunDirContents *c) { return c->n_checkpoints > 0 || c->best || c->metrics; }

void run_dir_describe(const RunDirContents *c, char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = 0;
#define ADD(...) n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, __VA_ARGS__)
  if (c->n_checkpoints == 1) ADD("ckpt-%lld.safetensors", (long long)c->steps[0]);
  if (c->n_checkpoints > 1)
    ADD("ckpt-%lld.safetensors (the newest of %d checkpoints)", (long long)c->steps[0], c->n_checkpoints);
  if (c->best) ADD("%sbest.safetensors", n ? ", " : "");
  if (c->metrics) ADD("%smetrics.jsonl", n ? ", " : "");
#undef ADD
}

void run_dir_checkpoint_path(const char *dir, int64_t step, char *out, size_t cap) {
  snprintf(out, cap, "%s/ckpt-%lld.safetensors", dir, (long long)step);
}

int run_dir_move_aside(const char *dir, char *moved_to, size_t moved_cap, char *err, size_t err_cap) {
  char stamp[32], base[4200];
  time_t now = time(NULL);
  struct tm tm;
  strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime_r(&now, &tm));
  size_t len = strlen(dir);
  while (len > 1 && dir[len - 1] == '/') len--;  // "runs/a/" moves to "runs/a.old-...", not inside itself
  snprintf(base, sizeof base, "%.*s.old-%s", (int)len, dir, stamp);
  snprintf(moved_to, moved_cap, "%s", base);
  for (int k = 2; access(moved_to, F_OK) == 0 && k < 1000; k++) snprintf(moved_to, moved_cap, "%s-%d", base, k);
  if (access(moved_to, F_OK) == 0) {
    snprintf(err, err_cap, "--move-old-run: cannot rename %s: %s and 998 more names are taken", dir, base);
    return -1;
  }
  if (rename(dir, moved_to) != 0) {
    snprintf(err, err_cap, "--move-old-run: cannot rename %s to %s: %s", dir, moved_to, strerror(errno));
    return -1;
  }
  return 0;
}

int run_dir_newest_intact(const char *dir, int64_t *step, char *err, size_t err_cap) {
  *step = -1;
  RunDirContents c;
  run_dir_scan(dir, &c);
  for (int i = 0; i < c.n_checkpoints; i++) {
    char candidate[4200], why[2048];
    run_dir_checkpoint_path(dir, c.steps[i], candidate, sizeof candidate);
    StFile *f = st_open(candidate, why, sizeof why);
    int rc = f ? checkpoint_verify(f, NULL, why, sizeof why) : -1;
    st_close(f);
    if (rc == 0) {
      *step = c.steps[i];
      return 0;
    }
    // Renamed: a later --resume auto would meet it again, and it is kept (never deleted).
    char damaged[4300];
    snprintf(damaged, sizeof damaged, "%s.damaged", candidate);
    if (rename(candidate, damaged) != 0) {  // left in place it would count as the newest: stop here
      snprintf(err, err_cap,
               "%s is damaged (%s) and cannot be renamed aside: %s. Training could not write in %s "
               "either: make it writable, or copy the run elsewhere and resume there",
               candidate, why, strerror(errno), dir);
      return -1;
    }
    fprintf(stderr, "detr train: skipping %s: %s; renamed to %s\n", candidate, why, damaged);
  }
  if (c.n_checkpoints > 0) {
    snprintf(err, err_cap,
             "every checkpoint in %s is damaged (see above; renamed to *.damaged): resume from another "
             "with --resume FILE, or start anew with --out NEW_DIR or --move-old-run",
             dir);
    return -1;
  }
  return 0;
}

bool run_dir_contains(const char *dir, const char *file) {
  char d[PATH_MAX], f[PATH_MAX];
  if (!realpath(dir, d) || !realpath(file, f)) return false;
  char *slash = strrchr(f, '/');
  if (!slash) return false;
  *slash = 0;
  return !strcmp(d, f[0] ? f : "/");
}

// The "step" of a metrics.jsonl line, or -1 for a line without one.
static long long line_step(const char *line) {
  const char *s = strstr(line, "\"step\": ");
  return s ? strtoll(s + 8, NULL, 10) : -1;
}

int run_dir_cut_metrics(const char *path, int64_t step, char *err, size_t err_cap) {
  FILE *in = fopen(path, "r");
  if (!in) return 0;
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *out = NULL;
  char *line = NULL;
  size_t line_cap = 0;
  long long cut = 0;
  ssize_t len;
  bool torn = false;  // the last line was cut off mid-write: the resumed run's "a" would glue onto it
  int rc = 0;
  // A first pass finds whether anything is past the step: most resumes change nothing.
  while ((len = getline(&line, &line_cap, in)) > 0) {
    torn = line[len - 1] != '\n';
    cut += torn || line_step(line) > step;
  }
  if (cut > 0) {
    rewind(in);
    out = fopen(tmp, "w");
    if (!out) rc = -1;
    while (!rc && (len = getline(&line, &line_cap, in)) > 0)
      if (line[len - 1] == '\n' && line_step(line) <= step && fputs(line, out) == EOF) rc = -1;
    if (out && (fflush(out) || fsync(fileno(out)))) rc = -1;
    if (out && fclose(out)) rc = -1;
    if (!rc && rename(tmp, path)) rc = -1;
    if (rc) {
      snprintf(err, err_cap, "%s: cannot cut it back to step %lld: %s", path, (long long)step, strerror(errno));
      remove(tmp);
    } else {
      fprintf(stderr, "detr train: %s: dropped %lld line%s past step %lld (logged again now)%s\n", path, cut,
              cut == 1 ? "" : "s", (long long)step, torn ? ", the last one cut off mid-write" : "");
    }
  }
  free(line);
  fclose(in);
  return rc;
}

// "ckpt-10.safetensors.tmp.8183" -> 8183 when the name before ".tmp." is one that detr writes
// through a temporary file; 0 otherwise.
static long dead_temp_pid(const char *name) {
  const char *tmp = strstr(name, ".tmp.");
  if (!tmp || tmp == name) return 0;
  char *end = NULL;
  long pid = strtol(tmp + 5, &end, 10);
  if (end == tmp + 5 || *end || pid <= 0) return 0;
  static const char *const written[] = {".safetensors", ".json", ".png"};
  for (size_t i = 0; i < sizeof written / sizeof written[0]; i++) {
    size_t n = strlen(written[i]);
    if ((size_t)(tmp - name) > n && !strncmp(tmp - n, written[i], n)) return pid;
  }
  return 0;
}

int run_dir_remove_dead_temps(const char *dir, bool locked) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int removed = 0;
  struct dirent *e;
  time_t now = time(NULL);
  while ((e = readdir(d))) {
    long pid = dead_temp_pid(e->d_name);
    if (!pid || pid > INT_MAX || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;  // running (or not ours to ask)
    char path[4200];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    // Untouched for a minute as well, unless this process holds the run's lock (no other run can be
    // writing here): a writer on another host (a shared --out) is no pid here.
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || (!locked && now - st.st_mtime < 60)) continue;
    if (unlink(path) != 0) {
      fprintf(stderr, "detr train: cannot remove %s, left by process %ld that ended mid-write: %s\n", path, pid,
              strerror(errno));
      continue;
    }
    fprintf(stderr, "detr train: removed %s (%.1f MB), left by process %ld that ended while writing it\n", path,
            (double)st.st_size / 1e6, pid);
    removed++;
  }
  closedir(d);
  return removed;
}

void run_dir_prune(const char *dir, int keep, int64_t current_step) {
  RunDirContents c;
  run_dir_scan(dir, &c);
  for (int i = 0, kept = 0; i < c.n_checkpoints; i++) {
    if (c.steps[i] > current_step) continue;
    if (kept++ < keep) continue;
    char path[4200];
    run_dir_checkpoint_path(dir, c.steps[i], path, sizeof path);
    remove(path);
  }
}

void run_dir_results_path(const char *dir, int64_t epoch, char *out, size_t cap) {
  snprintf(out, cap, "%s/results-epoch%lld.json", dir, (long long)epoch);
}

bool run_dir_is_results(const char *name, int64_t *epoch) {
  long long k;
  int end = 0;
  if (sscanf(name, "results-epoch%lld.json%n", &k, &end) != 1 || name[end] || k < 0) return false;
  *epoch = (int64_t)k;
  return true;
}

void run_dir_prune_results(const char *dir, int64_t epoch, int64_t keep_epoch) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[4400];
  while ((e = readdir(d))) {
    int64_t k;
    if (!run_dir_is_results(e->d_name, &k) || k >= epoch || k == keep_epoch) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (unlink(path) != 0 && errno != ENOENT)
      fprintf(stderr, "detr train: %s: cannot remove: %s\n", path, strerror(errno));
  }
  closedir(d);
}
