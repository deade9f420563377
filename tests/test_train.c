// The optimizer (AdamW, clipping, step schedule) and checkpoints (round trip, corruption,
// truncation, foreign files, a write killed by SIGKILL).
#define _DEFAULT_SOURCE  // mkdtemp, fork, kill, usleep
#include <check.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/runtime.h"
#include "tests/gradcheck.h"
#include "nn/model_io.h"
#include "train/checkpoint.h"
#include "train/cpu_share.h"
#include "cli/setup.h"

START_TEST(adamw_matches_torch_formula) {
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  Tensor *w = params_add(&ps, SHAPE(5), PARAM_TRAINABLE, LR_GROUP_MAIN, "w");
  Tensor *b = params_add(&ps, SHAPE(3), PARAM_TRAINABLE, LR_GROUP_BACKBONE, "backbone.b");
  params_add(&ps, SHAPE(2), PARAM_BUFFER, LR_GROUP_BACKBONE, "buffer");
  Rng rng = rng_make(1);
  tensor_uniform_(w, &rng, -1, 1);
  tensor_uniform_(b, &rng, -1, 1);
  OptimConfig cfg = optim_config_default();
  cfg.lr = 1e-2f;
  cfg.lr_backbone = 1e-3f;
  cfg.weight_decay = 0.1f;
  AdamW opt;
  adamw_init(&opt, &ps, cfg);
  // Reference in double, torch.optim.AdamW's update.
  double p[8], m[8] = {0}, v[8] = {0};
  for (int i = 0; i < 5; i++) p[i] = w->data[i];
  for (int i = 0; i < 3; i++) p[5 + i] = b->data[i];
  for (int step = 1; step <= 3; step++) {
    double g[8];
    autograd_grad(w);
    autograd_grad(b);
    for (int i = 0; i < 8; i++) {
      g[i] = sin(step * 1.3 + i);
      *(i < 5 ? &w->grad->data[i] : &b->grad->data[i - 5]) = (float)g[i];
    }
    adamw_step(&opt);
    for (int i = 0; i < 8; i++) {
      double lr = i < 5 ? 1e-2 : 1e-3;
      p[i] *= 1 - lr * 0.1;
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.999 * v[i] + 0.001 * g[i] * g[i];
      double denom = sqrt(v[i]) / sqrt(1 - pow(0.999, step)) + 1e-8;
      p[i] -= lr / (1 - pow(0.9, step)) * m[i] / denom;
    }
  }
  for (int i = 0; i < 8; i++) ck_assert_double_eq_tol(i < 5 ? w->data[i] : b->data[i - 5], p[i], 1e-6);
  ck_assert_ptr_null(params_find(&ps, "buffer")->tensor->grad);
  // StepLR: x0.1 per lr_drop epochs.
  opt.cfg.lr_drop = 2;
  opt.epoch = 5;
  ck_assert_double_eq_tol(adamw_lr(&opt, LR_GROUP_MAIN), 1e-4, 1e-10);
  ck_assert_double_eq_tol(adamw_lr(&opt, LR_GROUP_BACKBONE), 1e-5, 1e-11);
  adamw_free(&opt);
  params_free(&ps);
}
END_TEST

START_TEST(clip_grad_norm_as_torch) {
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  Tensor *a = params_add(&ps, SHAPE(2), PARAM_TRAINABLE, LR_GROUP_MAIN, "a");
  Tensor *b = params_add(&ps, SHAPE(1), PARAM_TRAINABLE, LR_GROUP_MAIN, "b");
  autograd_grad(a)->data[0] = 3;
  a->grad->data[1] = 0;
  autograd_grad(b)->data[0] = 4;  // norm 5
  ck_assert_double_eq_tol(clip_grad_norm(&ps, 10.0f), 5.0, 1e-9);
  ck_assert_float_eq(a->grad->data[0], 3.0f);  // below the limit: untouched
  ck_assert_double_eq_tol(clip_grad_norm(&ps, 0.1f), 5.0, 1e-9);
  ck_assert_double_eq_tol(a->grad->data[0], 3 * 0.1 / (5 + 1e-6), 1e-7);
  ck_assert_double_eq_tol(b->grad->data[0], 4 * 0.1 / (5 + 1e-6), 1e-7);
  params_free(&ps);
}
END_TEST

// adamw_clip_step (the trainer's: one pass for the norm, one for the update, both over all tensors
// at once) against clip_grad_norm, adamw_step and releasing the gradients, bit for bit: tensors across several
// 16384-float units and within one, both learning-rate groups, a trainable tensor without a
// gradient and a frozen one with a gradient; with the clip active (max 0.1) and not (max 1e9, 0).
START_TEST(fused_clip_step_matches_the_three_steps) {
  const float max_norms[] = {0.1f, 1e9f, 0.0f};
  for (int c = 0; c < 3; c++) {
    ParamStore ps[2];
    AdamW opt[2];
    for (int k = 0; k < 2; k++) {
      params_init(&ps[k], DEVICE_CPU);
      Tensor *t[5] = {params_add(&ps[k], SHAPE(40000), PARAM_TRAINABLE, LR_GROUP_MAIN, "a"),
                      params_add(&ps[k], SHAPE(7), PARAM_TRAINABLE, LR_GROUP_BACKBONE, "backbone.b"),
                      params_add(&ps[k], SHAPE(16384), PARAM_TRAINABLE, LR_GROUP_BACKBONE, "backbone.c"),
                      params_add(&ps[k], SHAPE(5), PARAM_TRAINABLE, LR_GROUP_MAIN, "no_grad"),
                      params_add(&ps[k], SHAPE(9), PARAM_FROZEN, LR_GROUP_BACKBONE, "frozen")};
      Rng rng = rng_make(7);
      for (int i = 0; i < 5; i++) tensor_uniform_(t[i], &rng, -1, 1);
      OptimConfig cfg = optim_config_default();
      cfg.weight_decay = 0.05f;
      adamw_init(&opt[k], &ps[k], cfg);
    }
    for (int step = 1; step <= 3; step++) {
      for (int k = 0; k < 2; k++) {
        Rng rng = rng_make(100 + (uint64_t)step);
        const char *with_grad[] = {"a", "backbone.b", "backbone.c", "frozen"};
        for (int i = 0; i < 4; i++)
          tensor_uniform_(autograd_grad(params_find(&ps[k], with_grad[i])->tensor), &rng, -1, 1);
      }
      double norm0 = clip_grad_norm(&ps[0], max_norms[c]);
      adamw_step(&opt[0]);
      for (int i = 0; i < ps[0].count; i++) autograd_drop_grad(&ps[0].items[i].tensor, 1);
      double norm1 = adamw_clip_step(&opt[1], max_norms[c]);
      ck_assert(norm0 == norm1);
      for (int i = 0; i < ps[0].count; i++) {
        const Tensor *a = ps[0].items[i].tensor, *b = ps[1].items[i].tensor;
        ck_assert_msg(!memcmp(a->data, b->data, (size_t)a->numel * 4), "max %g step %d: %s differs", max_norms[c], step,
                      ps[0].items[i].name);
        ck_assert_msg(!a->grad && !b->grad, "%s: a gradient left after the step", ps[0].items[i].name);
        if (opt[0].exp_avg[i]) {
          ck_assert(!memcmp(opt[0].exp_avg[i]->data, opt[1].exp_avg[i]->data, (size_t)a->numel * 4));
          ck_assert(!memcmp(opt[0].exp_avg_sq[i]->data, opt[1].exp_avg_sq[i]->data, (size_t)a->numel * 4));
        }
      }
    }
    for (int k = 0; k < 2; k++) adamw_free(&opt[k]), params_free(&ps[k]);
  }
}
END_TEST

typedef struct {
  DetrModel *model;
  AdamW opt;
  TrainState state;
} Run;

static void run_make(Run *r, uint64_t seed) {
  DetrConfig cfg;
  ck_assert_int_eq(detr_config_preset("tiny", &cfg), 0);
  r->model = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(r->model, seed);
  adamw_init(&r->opt, &r->model->params, optim_config_default());
  r->state =
      (TrainState){.step = 7, .epoch = 2, .next_batch = 3, .seed = seed, .dropout_rng = {seed, 99}, .best_map = 0.25};
  // Non-trivial moments.
  for (int i = 0; i < r->model->params.count; i++)
    if (r->opt.exp_avg[i]) {
      Rng rng = rng_make(seed + (uint64_t)i);
      tensor_uniform_(r->opt.exp_avg[i], &rng, -1, 1);
      tensor_uniform_(r->opt.exp_avg_sq[i], &rng, 0, 1);
    }
  r->opt.step = 7;
}

static void run_free(Run *r) {
  adamw_free(&r->opt);
  detr_model_free(r->model);
}

static char dir[64];
static int owner_pid;  // the test runner's pid (forked tests inherit it): names its temp dirs

// dir/name in out (a buffer of 256).
static const char *tmp_path_into(char *out, const char *name) {
  if (!dir[0]) {
    snprintf(dir, sizeof dir, "/tmp/detr-ckpt-test-%d-XXXXXX", owner_pid);
    ck_assert_ptr_nonnull(mkdtemp(dir));
  }
  snprintf(out, 256, "%s/%s", dir, name);
  return out;
}
#define tmp_path(name) tmp_path_into((char[256]){0}, name)

START_TEST(checkpoint_round_trip) {
  Run a, b;
  run_make(&a, 1);
  run_make(&b, 2);
  char err[1024];
  const char *path = tmp_path("a.safetensors");
  ck_assert_int_eq(checkpoint_save(path, a.model, &a.opt, &a.state, "epochs=3\n", "1:circle", err, sizeof err), 0);
  ck_assert_msg(checkpoint_load(path, b.model, &b.opt, &b.state, err, sizeof err) == 0, "%s", err);
  for (int i = 0; i < a.model->params.count; i++) {
    Tensor *x = a.model->params.items[i].tensor, *y = b.model->params.items[i].tensor;
    ck_assert_mem_eq(x->data, y->data, (size_t)x->numel * sizeof(float));
    if (a.opt.exp_avg[i])
      ck_assert_mem_eq(a.opt.exp_avg_sq[i]->data, b.opt.exp_avg_sq[i]->data, (size_t)x->numel * sizeof(float));
  }
  ck_assert_int_eq(b.state.step, 7);
  ck_assert_int_eq(b.state.next_batch, 3);
  ck_assert_int_eq(b.state.dropout_rng.offset, 99);
  ck_assert_int_eq(b.opt.step, 7);
  ck_assert_double_eq(b.state.best_map, 0.25);
  char *mc, *tc;
  ck_assert_int_eq(checkpoint_read_configs(path, &mc, &tc, err, sizeof err), 0);
  ck_assert_str_eq(tc, "epochs=3\n");
  ck_assert_ptr_nonnull(strstr(mc, "hidden_dim=32"));
  free(mc);
  free(tc);
  run_free(&a);
  run_free(&b);
}
END_TEST

// A copy of checkpoint `from` with metadata key set to value (the crc covers the tensors only).
static void copy_with_metadata(const char *from, const char *to, const char *key, const char *value) {
  char err[1024];
  StFile *f = st_open(from, err, sizeof err);
  ck_assert_msg(f, "%s", err);
  StWriter *w = st_writer_new();
  for (int i = 0; i < st_count(f); i++) {
    const StEntry *e = st_entry(f, i);
    st_writer_add(w, e->name, e->dtype, e->ndim, e->shape, st_data(f, e));
  }
  for (int i = 0; i < st_metadata_count(f); i++)
    st_writer_set_metadata(w, st_metadata_key(f, i), st_metadata_value(f, i));
  st_writer_set_metadata(w, key, value);
  ck_assert_int_eq(st_writer_save(w, to, err, sizeof err), 0);
  st_writer_free(w);
  st_close(f);
}

static void write_text_file(const char *path, const char *text, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(text, 1, n, f), n);
  fclose(f);
}

// Config files and a checkpoint's stored config and state are hostile input too (fuzz/): values
// that would wrap, lines that would be split, configs that ask for more than the file holds.
START_TEST(configs_and_metadata_checked) {
  char err[1024] = "";
  DetrConfig cfg;
  const char *conf = tmp_path("model.conf");
  const char *cases[][2] = {
      {"backbone=4294967314\n", "config backbone: 4294967314 is out of range"},  // was read as 18
      {"hidden_dim=16384\n", "hidden_dim must be positive, even and at most 8192"},
      {"num_classes=2000000\n", "num_classes must be in 1..1048577"},
      {"num_queries=100000\n", "num_queries must be in 1..65536"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_text_file(conf, cases[i][0], strlen(cases[i][0]));
    ck_assert_int_eq(setup_model_config(conf, NULL, &cfg, err, sizeof err), -1);
    ck_assert_msg(strstr(err, cases[i][1]), "expected '%s' in: %s", cases[i][1], err);
  }
  // A comment longer than the old 511-byte line buffer used to leave its tail as a line of its own.
  char line[1200];
  memset(line, ' ', sizeof line);
  line[0] = '#';
  memcpy(line + 1100, "hidden_dim=64\n", 14);
  write_text_file(conf, line, 1114);
  ck_assert_int_eq(setup_model_config(conf, NULL, &cfg, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "model.conf:1: line longer than the limit of 1024 bytes"), "%s", err);
  write_text_file(conf, "nheads=4\0hidden_dim=64\n", 24);
  ck_assert_int_eq(setup_model_config(conf, NULL, &cfg, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "model.conf:1: a NUL byte"), "%s", err);
  write_text_file(conf, "hidden_dim=64\n# ok\n", 19);
  ck_assert_msg(setup_model_config(conf, NULL, &cfg, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(cfg.hidden_dim, 64);

  // A checkpoint whose stored config does not match its tensors is refused before a model is
  // built from it; metadata numbers must be plain decimal.
  Run a;
  run_make(&a, 3);
  const char *path = tmp_path("c.safetensors"), *bad = tmp_path("bad.safetensors");
  ck_assert_int_eq(checkpoint_save(path, a.model, &a.opt, &a.state, "", NULL, err, sizeof err), 0);
  DetrModel *m = NULL;
  ck_assert_msg(model_file_load(path, NULL, NULL, NULL, 0, DEVICE_CPU, &m, NULL, err, sizeof err) == DETR_OK, "%s",
                err);
  detr_model_free(m);
  char text[4096];
  detr_config_format(&a.model->cfg, text, sizeof text);
  char *q = strstr(text, "num_queries=10\n");
  ck_assert_ptr_nonnull(q);
  memcpy(q, "num_queries=60000\n", 18);  // overwrites "num_queries=10\n" and the next field's start
  q[18] = 0;
  copy_with_metadata(path, bad, "model_config", text);
  ck_assert_int_eq(model_file_load(bad, NULL, NULL, NULL, 0, DEVICE_CPU, &m, NULL, err, sizeof err), DETR_ERR_MISMATCH);
  ck_assert_ptr_null(m);
  ck_assert_msg(strstr(err, "does not match the checkpoint's tensors (query_embed.weight has another shape)"), "%s",
                err);
  copy_with_metadata(path, bad, "step", "-7");
  ck_assert_int_eq(checkpoint_load(bad, a.model, &a.opt, &a.state, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "metadata 'step' is missing or not a number"), "%s", err);
  copy_with_metadata(path, bad, "world_size", "2x");
  ck_assert_int_eq(checkpoint_load(bad, a.model, &a.opt, &a.state, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "metadata 'world_size' is missing or not a number"), "%s", err);
  run_free(&a);
}
END_TEST

static long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

START_TEST(checkpoint_damage_is_detected) {
  Run a;
  run_make(&a, 3);
  char err[1024], cmd[600];
  const char *good = tmp_path("good.safetensors");
  ck_assert_int_eq(checkpoint_save(good, a.model, &a.opt, &a.state, "", NULL, err, sizeof err), 0);
  long size = file_size(good);
  // A flipped byte in the data: the checksum catches it.
  const char *bad = tmp_path("flipped.safetensors");
  snprintf(cmd, sizeof cmd, "cp %s %s", good, bad);
  ck_assert_int_eq(system(cmd), 0);
  FILE *f = fopen(bad, "r+b");
  fseek(f, size - 100, SEEK_SET);
  int c = fgetc(f);
  fseek(f, size - 100, SEEK_SET);
  fputc(c ^ 0x40, f);
  fclose(f);
  ck_assert_int_eq(checkpoint_load(bad, a.model, &a.opt, &a.state, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "checksum mismatch") && strstr(err, bad), "%s", err);
  // Truncated: refused, naming the file.
  const char *cut = tmp_path("cut.safetensors");
  snprintf(cmd, sizeof cmd, "head -c %ld %s > %s", size / 2, good, cut);
  ck_assert_int_eq(system(cmd), 0);
  ck_assert_int_eq(checkpoint_load(cut, a.model, &a.opt, &a.state, err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, cut));
  // Foreign: plain model weights (no checkpoint format tag).
  const char *weights = tmp_path("weights.safetensors");
  StWriter *w = st_writer_new();
  params_save(&a.model->params, w, "");
  ck_assert_int_eq(st_writer_save(w, weights, err, sizeof err), 0);
  st_writer_free(w);
  ck_assert_int_eq(checkpoint_load(weights, a.model, &a.opt, &a.state, err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "not a detr-c checkpoint"));
  // A checkpoint of another model configuration: refused by tensor name and shape.
  Run other;
  DetrConfig cfg;
  detr_config_preset("tiny", &cfg);
  cfg.hidden_dim = 16;
  other.model = detr_model_create(&cfg, DEVICE_CPU);
  adamw_init(&other.opt, &other.model->params, optim_config_default());
  ck_assert_int_eq(checkpoint_load(good, other.model, &other.opt, &other.state, err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "wrong shape"));
  run_free(&other);
  run_free(&a);
}
END_TEST

// A process writing checkpoints over the same path is killed at random moments: the path always
// holds a complete checkpoint that loads.
START_TEST(checkpoint_survives_sigkill) {
  Run a;
  run_make(&a, 4);
  char err[1024];
  const char *path = tmp_path("killed.safetensors");
  ck_assert_int_eq(checkpoint_save(path, a.model, &a.opt, &a.state, "", NULL, err, sizeof err), 0);
  for (int trial = 0; trial < 6; trial++) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
      for (;;) {
        a.state.step++;
        if (checkpoint_save(path, a.model, &a.opt, &a.state, "", NULL, err, sizeof err)) _exit(3);
      }
    }
    usleep(20000 + 15000 * trial);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    ck_assert(WIFSIGNALED(status));
    Run b;
    run_make(&b, 5);
    ck_assert_msg(checkpoint_load(path, b.model, &b.opt, &b.state, err, sizeof err) == 0, "after SIGKILL %d: %s", trial,
                  err);
    run_free(&b);
  }
  run_free(&a);
}
END_TEST

// /proc/stat's per-CPU lines: busy = user + nice + system + irq + softirq of the CPUs in the set;
// the "cpu " total line and CPUs outside the set are not counted.
START_TEST(cpu_share_reads_proc_stat) {
  const char *text =
      "cpu  5 1 2 900 1 0 0 0 0 0\n"
      "cpu0 100 10 20 5000 7 1 2 3 0 0\n"
      "cpu1 200 20 40 6000 9 3 4 5 0 0\n"
      "intr 12345\n";
  uint64_t set[1] = {0x2};  // cpu1 only
  ck_assert_int_eq(cpu_share_busy_ticks(text, set, 1), 200 + 20 + 40 + 3 + 4);
  set[0] = 0x3;
  ck_assert_int_eq(cpu_share_busy_ticks(text, set, 1), 133 + 267);
  set[0] = 0x4;  // a CPU the text does not list
  ck_assert_int_eq(cpu_share_busy_ticks(text, set, 1), -1);
  ck_assert_int_eq(cpu_share_busy_ticks("garbage\n", set, 1), -1);
}
END_TEST

// A fixed count is kept; with none, a process keeping a core busy takes a compute thread away.
START_TEST(cpu_share_yields_to_a_busy_process) {
  CpuShare s;
  cpu_share_init(&s, 1);
  ck_assert(!s.adapt);
  ck_assert_int_eq(s.threads, 1);
  unsetenv("OMP_NUM_THREADS");
  omp_set_num_threads(omp_get_num_procs());
  cpu_share_init(&s, 0);
  if (!s.adapt) return;  // one core, or no /proc/stat: nothing to adapt
  pid_t busy = fork();
  ck_assert_int_ge(busy, 0);
  if (busy == 0) {
    for (volatile uint64_t i = 0;; i++) {}
  }
  usleep(2100 * 1000);
  bool changed = cpu_share_update(&s);
  kill(busy, SIGKILL);
  waitpid(busy, NULL, 0);
  // Other tests running beside this one only add to what the others use.
  ck_assert_msg(changed && s.threads <= s.max_threads - 1, "others %.2f cores: %d of %d threads", s.others, s.threads,
                s.max_threads);
  ck_assert_double_ge(s.others, 0.8);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  owner_pid = (int)getpid();
  Suite *s = suite_create("train");
  TCase *tc = tcase_create("train");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, adamw_matches_torch_formula);
  tcase_add_test(tc, clip_grad_norm_as_torch);
  tcase_add_test(tc, fused_clip_step_matches_the_three_steps);
  tcase_add_test(tc, checkpoint_round_trip);
  tcase_add_test(tc, checkpoint_damage_is_detected);
  tcase_add_test(tc, configs_and_metadata_checked);
  tcase_add_test(tc, checkpoint_survives_sigkill);
  tcase_add_test(tc, cpu_share_reads_proc_stat);
  tcase_add_test(tc, cpu_share_yields_to_a_busy_process);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  // The checkpoints (hundreds of MB) are written by the forked tests, one directory each: remove
  // this run's on success.
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf /tmp/detr-ckpt-test-%d-*", owner_pid);
  if (!failed && system(cmd) != 0) fprintf(stderr, "test_train: cleanup failed\n");
  return failed ? 1 : 0;
}
