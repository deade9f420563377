// `detr train`'s TensorBoard event files, read back here without the writer's code: the TFRecord
// framing and both crcs, each record decoded by protobuf-c, every scalar against metrics.jsonl (one
// to one, as the row prints it), the pictures at each evaluation; a resumed run (its newest
// checkpoints gone and a record cut off mid-write, or killed with SIGKILL) with each step once and
// nothing left for TensorBoard's purge; a write that fails leaves the caller running.
#define _DEFAULT_SOURCE  // mkdtemp, usleep, kill
#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/runtime.h"
#include "tests/shell.h"
#include "train/tensorboard.h"

#if DETR_HAVE_TENSORBOARD
#include <tensorboard/compat/proto/event.pb-c.h>
#endif

#ifndef DETR_BIN
#error "DETR_BIN (the detr binary) must be defined by the build"
#endif

// 12 training images in batches of 4: 3 steps an epoch, an evaluation of the 4 val images after each.
static const char *TRAIN_FLAGS =
    "--config tiny --set num_classes=100 --epochs 3 --batch 4 --eval-every 1 "
    "--checkpoint-every 2 --keep 20 --workers 1 --threads 2 --seed 5 --no-progress";

// RFC 3720 (iSCSI) B.4's CRC-32C examples, and the standard check value.
START_TEST(crc32c_known_values) {
  uint8_t zeros[32] = {0}, ones[32], up[32];
  for (int i = 0; i < 32; i++) ones[i] = 0xff, up[i] = (uint8_t)i;
  ck_assert_uint_eq(tb_crc32c("123456789", 9), 0xe3069283u);
  ck_assert_uint_eq(tb_crc32c(zeros, 32), 0x8a9136aau);
  ck_assert_uint_eq(tb_crc32c(ones, 32), 0x62a8ab43u);
  ck_assert_uint_eq(tb_crc32c(up, 32), 0x46dd794eu);
  uint32_t c = tb_crc32c("123456789", 9);
  ck_assert_uint_eq(tb_masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}
END_TEST

#if DETR_HAVE_TENSORBOARD

static void setup_data(void) {
  if (test_root[0]) return;
  snprintf(test_root, sizeof test_root, "/tmp/detr-tb-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(test_root));
  ck_assert_int_eq(sh("%s synth --out %s/data --train 12 --val 4 --seed 3", DETR_BIN, test_root), 0);
}

// --- reading the event files back ---

typedef struct {
  char tag[128];
  int64_t step;
  double value;  // scalars
  bool image;    // an image summary (a PNG of the size it states)
} Summary;

typedef struct {
  Summary *s;
  int n, cap;
  int files, purged;  // event files read; summaries a SessionLog START retired
} Events;

static uint64_t le(const uint8_t *p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static void add_summary(Events *ev, const char *tag, int64_t step, double value, bool image) {
  if (ev->n == ev->cap) {
    ev->cap = ev->cap ? 2 * ev->cap : 256;
    ev->s = realloc(ev->s, (size_t)ev->cap * sizeof *ev->s);
    ck_assert_ptr_nonnull(ev->s);
  }
  Summary *s = &ev->s[ev->n++];
  ck_assert_int_lt(strlen(tag), sizeof s->tag);
  snprintf(s->tag, sizeof s->tag, "%s", tag);
  s->step = step, s->value = value, s->image = image;
}

// TensorBoard's purge: a START at step S retires every summary read before it with a step >= S.
static void purge_from(Events *ev, int64_t step) {
  int kept = 0;
  for (int i = 0; i < ev->n; i++)
    if (ev->s[i].step < step) ev->s[kept++] = ev->s[i];
  ev->purged += ev->n - kept;
  ev->n = kept;
}

static void check_png(const Tensorboard__Summary__Image *im) {
  const uint8_t *p = im->encoded_image_string.data;
  ck_assert_uint_ge(im->encoded_image_string.len, 24);
  ck_assert_int_eq(memcmp(p, "\x89PNG\r\n\x1a\n", 8), 0);
  ck_assert_int_eq((int)(p[16] << 24 | p[17] << 16 | p[18] << 8 | p[19]), im->width);
  ck_assert_int_eq((int)(p[20] << 24 | p[21] << 16 | p[22] << 8 | p[23]), im->height);
  ck_assert_int_eq(im->colorspace, 3);
}

static void take_event(Events *ev, const Tensorboard__Event *e, int record, const char *path) {
  if (record == 0) {  // the file's version, with the writer's name
    ck_assert_int_eq(e->what_case, TENSORBOARD__EVENT__WHAT_FILE_VERSION);
    ck_assert_str_eq(e->file_version, "brain.Event:2");
    ck_assert_ptr_nonnull(e->source_metadata);
    ck_assert_str_eq(e->source_metadata->writer, TB_WRITER_NAME);
    return;
  }
  if (e->what_case == TENSORBOARD__EVENT__WHAT_SESSION_LOG) {
    ck_assert_int_eq(e->session_log->status, TENSORBOARD__SESSION_LOG__SESSION_STATUS__START);
    purge_from(ev, e->step);
    return;
  }
  ck_assert_msg(e->what_case == TENSORBOARD__EVENT__WHAT_SUMMARY, "%s: record %d is neither", path, record);
  for (size_t i = 0; i < e->summary->n_value; i++) {
    const Tensorboard__Summary__Value *v = e->summary->value[i];
    if (v->value_case == TENSORBOARD__SUMMARY__VALUE__VALUE_IMAGE) check_png(v->image);
    else ck_assert_int_eq(v->value_case, TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE);
    add_summary(ev, v->tag, e->step, v->simple_value, v->value_case == TENSORBOARD__SUMMARY__VALUE__VALUE_IMAGE);
  }
}

// Every record of one file: length, its masked crc32c, the event, its masked crc32c.
static void read_file(Events *ev, const char *path) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "%s", path);
  uint8_t head[12], tail[4];
  for (int record = 0;; record++) {
    size_t got = fread(head, 1, sizeof head, f);
    if (got == 0) break;
    ck_assert_msg(got == sizeof head, "%s: record %d cut off in its length", path, record);
    ck_assert_msg(le(head + 8, 4) == tb_masked_crc32c(head, 8), "%s: record %d: length crc", path, record);
    size_t n = le(head, 8);
    uint8_t *data = malloc(n + 1);
    ck_assert_ptr_nonnull(data);
    ck_assert_msg(fread(data, 1, n, f) == n && fread(tail, 1, 4, f) == 4, "%s: record %d cut off", path, record);
    ck_assert_msg(le(tail, 4) == tb_masked_crc32c(data, n), "%s: record %d: data crc", path, record);
    Tensorboard__Event *e = tensorboard__event__unpack(NULL, n, data);
    ck_assert_msg(e != NULL, "%s: record %d does not decode as an Event", path, record);
    take_event(ev, e, record, path);
    tensorboard__event__free_unpacked(e, NULL);
    free(data);
  }
  fclose(f);
  ev->files++;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// The run's event files in name order, as TensorBoard reads a directory.
static Events read_run(const char *run) {
  Events ev = {0};
  char dir[256], *names[16];
  int n = 0;
  snprintf(dir, sizeof dir, "%s/%s", test_root, run);
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  for (struct dirent *e; (e = readdir(d));)
    if (!strncmp(e->d_name, "events.out.tfevents.", 20) && n < 16) names[n++] = strdup(e->d_name);
  closedir(d);
  qsort(names, (size_t)n, sizeof names[0], by_name);
  for (int i = 0; i < n; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    read_file(&ev, path);
    free(names[i]);
  }
  return ev;
}

// --- against metrics.jsonl ---

// The summary of tag at step: exactly one.
static const Summary *find_once(const Events *ev, const char *tag, int64_t step) {
  const Summary *found = NULL;
  for (int i = 0; i < ev->n; i++)
    if (ev->s[i].step == step && !strcmp(ev->s[i].tag, tag)) {
      ck_assert_msg(!found, "%s at step %lld twice", tag, (long long)step);
      found = &ev->s[i];
    }
  ck_assert_msg(found != NULL, "no %s at step %lld", tag, (long long)step);
  return found;
}

// One metrics.jsonl line: each number but step, epoch and batch has its scalar "<type>/<key>" at the
// row's step, with the value the row prints (float32). Returns the scalars checked.
static int check_row(const Events *ev, char *line, bool *is_eval, int64_t *step) {
  char type[16];
  ck_assert_int_eq(sscanf(line, "{\"type\": \"%15[a-z]\"", type), 1);
  *step = atoll(strstr(line, "\"step\": ") + 8);
  *is_eval = !strcmp(type, "eval");
  int checked = 0;
  for (char *at = strchr(line + 1, ','); at; at = strchr(at + 1, ',')) {
    char key[64], tag[96];
    int used = 0;
    if (sscanf(at, ", \"%63[^\"]\": %n", key, &used) != 1 || !used) continue;
    if (!strcmp(key, "step") || !strcmp(key, "epoch") || !strcmp(key, "batch")) continue;
    snprintf(tag, sizeof tag, "%s/%s", type, key);
    float want = (float)strtod(at + used, NULL);
    const Summary *s = find_once(ev, tag, *step);
    ck_assert_msg((float)s->value == want, "%s at step %lld: %.9g, metrics.jsonl %.9g", tag, (long long)*step, s->value,
                  (double)want);
    checked++;
  }
  return checked;
}

// Every row's scalars, nothing more, and pictures at every evaluation. Returns the rows.
static int check_run(const char *run) {
  Events ev = read_run(run);
  ck_assert_int_ge(ev.files, 1);
  ck_assert_msg(ev.purged == 0, "%s: %d summaries past a resumed step were left for TensorBoard's purge", run,
                ev.purged);
  char path[256], line[8192];
  snprintf(path, sizeof path, "%s/%s/metrics.jsonl", test_root, run);
  FILE *f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  int rows = 0, scalars = 0, images = 0;
  while (fgets(line, sizeof line, f)) {
    bool is_eval;
    int64_t step;
    scalars += check_row(&ev, line, &is_eval, &step);
    rows++;
    if (!is_eval) continue;
    int here = 0;
    for (int i = 0; i < ev.n; i++) here += ev.s[i].image && ev.s[i].step == step;
    ck_assert_msg(here >= 1, "%s: no picture at the evaluation of step %lld", run, (long long)step);
    images += here;
  }
  fclose(f);
  ck_assert_msg(scalars + images == ev.n, "%s: %d summaries, metrics.jsonl accounts for %d scalars and %d pictures",
                run, ev.n, scalars, images);
  free(ev.s);
  return rows;
}

START_TEST(scalars_match_metrics) {
  setup_data();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/straight %s", DETR_BIN, test_root, test_root, TRAIN_FLAGS), 0);
  ck_assert_int_eq(check_run("straight"), 9 + 3);  // 9 steps, 3 evaluations
}
END_TEST

// A run whose last steps were logged but never checkpointed (the newest checkpoints removed, as a
// kill would leave it), with a record cut off mid-write at the end of its event file: the resumed
// run cuts the file back, the user's own file of the same name pattern stays as it was.
START_TEST(resume_cuts_orphans) {
  setup_data();
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/cut --max-steps 8 %s", DETR_BIN, test_root, test_root, TRAIN_FLAGS), 0);
  ck_assert_int_eq(sh("rm %s/cut/ckpt-8.safetensors %s/cut/ckpt-6.safetensors", test_root, test_root), 0);
  ck_assert_int_eq(sh("for f in %s/cut/events.out.tfevents.1*; do printf 'torn record' >> \"$f\"; done", test_root), 0);
  ck_assert_int_eq(sh("{ echo mine > %s/cut/events.out.tfevents.0000000001.elsewhere; }", test_root), 0);
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/cut --resume auto %s", DETR_BIN, test_root, test_root, TRAIN_FLAGS), 0);
  ck_assert_int_eq(sh("grep -q 'dropped .* events past step 4 .*cut off mid-write' %s/log.txt", test_root), 0);
  ck_assert_int_eq(sh("grep -qx mine %s/cut/events.out.tfevents.0000000001.elsewhere", test_root), 0);
  ck_assert_int_eq(sh("rm %s/cut/events.out.tfevents.0000000001.elsewhere", test_root), 0);
  ck_assert_int_eq(check_run("cut"), 9 + 3);
}
END_TEST

// Killed with SIGKILL once it has logged step 3, past its step-2 checkpoint (so that the file holds
// events the resumed run must cut), then resumed.
START_TEST(killed_and_resumed) {
  setup_data();
  char ckpt2[256];
  snprintf(ckpt2, sizeof ckpt2, "%s/killed/ckpt-2.safetensors", test_root);
  pid_t pid =
      sh_start("%s train --data %s/data --out %s/killed %s 2>/dev/null", DETR_BIN, test_root, test_root, TRAIN_FLAGS);
  ck_assert(sh_wait_for_file(ckpt2, 120));
  bool past = false;
  for (int i = 0; i < 2400 && !past; i++) {
    past = sh("grep -q '\"step\": 3,' %s/killed/metrics.jsonl", test_root) == 0;
    if (!past) usleep(50000);
  }
  ck_assert_msg(past, "step 3 was never logged");
  usleep(50000);  // its events follow its metrics.jsonl row
  kill(pid, SIGKILL);
  ck_assert_int_eq(sh_wait(pid, 60), 128 + SIGKILL);
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/killed --resume auto %s", DETR_BIN, test_root, test_root, TRAIN_FLAGS), 0);
  ck_assert_int_eq(sh("grep -q 'killed/events.*dropped .* events past step [24] ' %s/log.txt", test_root), 0);
  ck_assert_int_eq(check_run("killed"), 9 + 3);
}
END_TEST

// A file that cannot grow (a file-size limit, as a full disk): the failing call returns -1, says so
// once, and every later call returns at once; the process goes on.
START_TEST(write_failure_is_survived) {
  setup_data();
  char dir[256];
  snprintf(dir, sizeof dir, "%s/full", test_root);
  ck_assert_int_eq(mkdir(dir, 0755), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {.rlim_cur = 4096, .rlim_max = RLIM_INFINITY};
    char err[1024];
    TbWriter *w = tb_open(dir, 0, err, sizeof err);
    if (!w || setrlimit(RLIMIT_FSIZE, &lim) || tb_scalar(w, 1, "train/loss", 1.0) || tb_flush(w)) _exit(2);
    Image img = image_alloc(256, 256);
    for (int i = 0; i < 256 * 256 * 3; i++) img.data[i] = (uint8_t)(i * 2654435761u >> 24);  // noise: no compression
    int failed = tb_image(w, 1, "eval/predictions/x", &img) || tb_flush(w);
    int after = tb_scalar(w, 2, "train/loss", 2.0);
    _exit(failed && after == -1 && tb_close(w) == -1 ? 0 : 3);
  }
  int status;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
}
END_TEST

#endif

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("tensorboard");
  TCase *tc = tcase_create("tensorboard");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, crc32c_known_values);
#if DETR_HAVE_TENSORBOARD
  tcase_add_test(tc, scalars_match_metrics);
  tcase_add_test(tc, resume_cuts_orphans);
  tcase_add_test(tc, killed_and_resumed);
  tcase_add_test(tc, write_failure_is_survived);
#endif
  suite_add_tcase(s, tc);
  int rc = sh_run_suite(s);
  if (rc == 0 && !tb_available()) {
    printf("tensorboard: skipped the event files' tests: this build has no protobuf-c (DETR_TENSORBOARD)\n");
    return 77;
  }
  return rc;
}
