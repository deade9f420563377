// `detr train` as a user runs it: exact resume (stopped, and killed with SIGKILL), and the clear
// failures (bad flags, missing data, foreign and truncated checkpoints, a NaN loss).
#define _DEFAULT_SOURCE  // mkdtemp, usleep, kill
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/runtime.h"
#include "tensor/safetensors.h"
#include "kernels/cpu/cpu_kernels.h"
#include "tests/shell.h"

#ifndef DETR_BIN
#error "DETR_BIN (the detr binary) must be defined by the build"
#endif

static const char *TRAIN_FLAGS =
    "--config tiny --set num_classes=100 --epochs 50 --eval-every 0 --checkpoint-every 2 --keep 20 "
    "--workers 2 --threads 2 --seed 5 --no-progress";

static void setup_data(void) {
  if (test_root[0]) return;
  snprintf(test_root, sizeof test_root, "/tmp/detr-cli-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(test_root));
  ck_assert_int_eq(sh("%s synth --out %s/data --train 12 --val 4 --seed 3", DETR_BIN, test_root), 0);
}

// The loss fields of each train line of a metrics file, by step (the last line of a step wins:
// a killed run may have logged steps past its last checkpoint, which the resumed run redoes).
static int read_losses(const char *path, char lines[][512], int max) {
  FILE *f = fopen(path, "r");
  ck_assert_msg(f != NULL, "%s missing", path);
  char buf[8192];
  int n = 0;
  while (fgets(buf, sizeof buf, f)) {
    if (!strstr(buf, "\"type\": \"train\"")) continue;
    int step = atoi(strstr(buf, "\"step\": ") + 8);
    ck_assert_int_le(step, max);
    char *cut = strstr(buf, ", \"images_per_s\"");  // wall-clock rates differ between runs
    if (cut) *cut = 0;
    ck_assert_int_lt(strlen(buf), 512);
    memcpy(lines[step - 1], buf, strlen(buf) + 1);
    if (step > n) n = step;
  }
  fclose(f);
  return n;
}

// The model and optimizer tensors of two checkpoints are byte-identical.
static void same_checkpoint(const char *a, const char *b) {
  char err[1024];
  StFile *fa = st_open(a, err, sizeof err), *fb = st_open(b, err, sizeof err);
  ck_assert_msg(fa && fb, "%s", err);
  ck_assert_int_eq(st_count(fa), st_count(fb));
  for (int i = 0; i < st_count(fa); i++) {
    const StEntry *ea = st_entry(fa, i), *eb = st_find(fb, ea->name);
    ck_assert_msg(eb && eb->nbytes == ea->nbytes, "%s differs", ea->name);
    ck_assert_msg(!memcmp(st_data(fa, ea), st_data(fb, eb), ea->nbytes), "%s: values differ", ea->name);
  }
  st_close(fa);
  st_close(fb);
}

static void same_losses(const char *run_a, const char *run_b, int steps) {
  static char la[64][512], lb[64][512];
  char pa[256], pb[256];
  snprintf(pa, sizeof pa, "%s/%s/metrics.jsonl", test_root, run_a);
  snprintf(pb, sizeof pb, "%s/%s/metrics.jsonl", test_root, run_b);
  ck_assert_int_eq(read_losses(pa, la, 64), steps);
  ck_assert_int_eq(read_losses(pb, lb, 64), steps);
  for (int s = 0; s < steps; s++) ck_assert_msg(!strcmp(la[s], lb[s]), "step %d:\n%s\n%s", s + 1, la[s], lb[s]);
}

START_TEST(resume_is_exact) {
  setup_data();
  // Straight through 8 steps; 4 steps then resumed to 8.
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/straight --max-steps 8 %s", DETR_BIN, test_root, test_root, TRAIN_FLAGS), 0);
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/stopped --max-steps 4 %s", DETR_BIN, test_root, test_root, TRAIN_FLAGS), 0);
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/stopped --max-steps 8 --resume auto %s", DETR_BIN, test_root,
                      test_root, TRAIN_FLAGS),
                   0);
  same_losses("straight", "stopped", 8);
  char a[256], b[256];
  snprintf(a, sizeof a, "%s/straight/ckpt-8.safetensors", test_root);
  snprintf(b, sizeof b, "%s/stopped/ckpt-8.safetensors", test_root);
  same_checkpoint(a, b);

  // Killed with SIGKILL once its step-4 checkpoint exists, then resumed to 8.
  char cmd[2048], ckpt4[256];
  snprintf(cmd, sizeof cmd, "exec %s train --data %s/data --out %s/killed --max-steps 8 %s", DETR_BIN, test_root,
           test_root, TRAIN_FLAGS);
  snprintf(ckpt4, sizeof ckpt4, "%s/killed/ckpt-4.safetensors", test_root);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    if (!freopen("/dev/null", "w", stderr)) _exit(126);
    execl("/bin/sh", "sh", "-c", cmd, NULL);
    _exit(127);
  }
  struct stat st;
  for (int i = 0; i < 6000 && stat(ckpt4, &st) != 0; i++) usleep(10000);
  usleep(150000);  // somewhere in step 5 or 6, or writing the step-6 checkpoint
  kill(pid, SIGKILL);
  int status;
  waitpid(pid, &status, 0);
  ck_assert_msg(WIFSIGNALED(status), "the run finished before it could be killed");
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/killed --max-steps 8 --resume auto %s", DETR_BIN, test_root,
                      test_root, TRAIN_FLAGS),
                   0);
  same_losses("straight", "killed", 8);
  snprintf(b, sizeof b, "%s/killed/ckpt-8.safetensors", test_root);
  same_checkpoint(a, b);
}
END_TEST

START_TEST(clear_failures) {
  setup_data();
  char log[256];
  snprintf(log, sizeof log, "%s/log.txt", test_root);
  ck_assert_int_eq(sh("%s train --data %s/data --bogus", DETR_BIN, test_root), 2);
  ck_assert_int_eq(sh("%s train --data %s/nowhere --out %s/r0 %s", DETR_BIN, test_root, test_root, TRAIN_FLAGS), 1);
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/r1 --epochs 0 %s", DETR_BIN, test_root, test_root, "--config tiny"), 2);
  // A foreign file and a truncated checkpoint as --resume: refused with the file named.
  char weights[256];
  snprintf(weights, sizeof weights, "%s/data/annotations/instances_val.json", test_root);
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/r2 --resume %s %s", DETR_BIN, test_root, test_root, weights, TRAIN_FLAGS),
      1);
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/r3 --max-steps 2 %s", DETR_BIN, test_root, test_root, TRAIN_FLAGS), 0);
  ck_assert_int_eq(sh("head -c 100000 %s/r3/ckpt-2.safetensors > %s/cut.safetensors", test_root, test_root), 0);
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/r4 --resume %s/cut.safetensors %s", DETR_BIN, test_root,
                      test_root, test_root, TRAIN_FLAGS),
                   1);
  ck_assert_int_eq(sh("grep -q 'cut.safetensors' %s", log), 0);
  // --resume auto skips a damaged newest checkpoint with a message and takes the previous one.
  ck_assert_int_eq(sh("cp %s/cut.safetensors %s/r3/ckpt-3.safetensors", test_root, test_root), 0);
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/r3 --max-steps 4 --resume auto %s", DETR_BIN, test_root,
                      test_root, TRAIN_FLAGS),
                   0);
  ck_assert_int_eq(sh("grep -q 'skipping .*ckpt-3.safetensors' %s", log), 0);
  ck_assert_int_eq(sh("grep -q 'resuming from .*ckpt-2.safetensors' %s", log), 0);
  // A diverging run (the first step's update blows the weights up) stops at the first non-finite
  // prediction or loss, names the step, and keeps the checkpoint from before it, which resumes.
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/nan --max-steps 30 --lr 1e30 --clip 0 %s --checkpoint-every 1",
                      DETR_BIN, test_root, test_root, TRAIN_FLAGS),
                   1);
  ck_assert_int_eq(sh("grep -Eq 'step 2 .*(NaN|nan|loss is)' %s", log), 0);
  ck_assert_int_eq(
      sh("%s info %s/nan/ckpt-1.safetensors || test -s %s/nan/ckpt-1.safetensors", DETR_BIN, test_root, test_root), 0);
}
END_TEST

// detr pretrain learns (its held-out accuracy, here measured on the training crops themselves,
// beats chance by far), writes only backbone tensors, and detr train --init-backbone starts from
// exactly them (a frozen backbone keeps their bytes); a file for another backbone is refused.
START_TEST(pretrain_then_init_backbone) {
  setup_data();
  char log[256], bb[256];
  snprintf(log, sizeof log, "%s/log.txt", test_root);
  snprintf(bb, sizeof bb, "%s/backbone.safetensors", test_root);
  const char *cfg = "--config tiny --set backbone_width=16";
  ck_assert_int_eq(sh("%s pretrain --data %s/data --out %s %s --epochs 25 --batch 8 --crop 32 --lr 2e-3 --threads 2 "
                      "--val-split train",
                      DETR_BIN, test_root, bb, cfg),
                   0);
  ck_assert_msg(sh("grep -a 'held-out top-1 accuracy' %s | tail -1 | awk '{ exit !($4 > 0.6) }'", log) == 0,
                "pretrain's accuracy on its own crops is not above 0.6 (6 classes: chance 0.17); see %s", log);
  char err[1024];
  StFile *w = st_open(bb, err, sizeof err);
  ck_assert_msg(w != NULL, "%s", err);
  ck_assert_ptr_nonnull(st_find(w, "backbone.0.body.conv1.weight"));
  ck_assert_ptr_nonnull(st_find(w, "backbone.0.body.bn1.running_var"));
  for (int i = 0; i < st_count(w); i++) ck_assert_int_eq(strncmp(st_entry(w, i)->name, "backbone.", 9), 0);
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/bb %s --set num_classes=100 --epochs 1 --max-steps 2 "
                      "--eval-every 0 --lr-backbone 0 --threads 2 --no-progress --init-backbone %s",
                      DETR_BIN, test_root, test_root, cfg, bb),
                   0);
  char path[256];
  snprintf(path, sizeof path, "%s/bb/ckpt-2.safetensors", test_root);
  StFile *c = st_open(path, err, sizeof err);
  ck_assert_msg(c != NULL, "%s", err);
  for (int i = 0; i < st_count(w); i++) {
    const StEntry *e = st_entry(w, i), *g = st_find(c, e->name);
    ck_assert_msg(g && g->nbytes == e->nbytes && !memcmp(st_data(w, e), st_data(c, g), e->nbytes), "%s differs",
                  e->name);
  }
  st_close(c);
  st_close(w);
  // Another width: refused before training, naming the tensor; no run directory content lost.
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/bb2 --config tiny --set num_classes=100 --max-steps 1 "
                      "--no-progress --init-backbone %s",
                      DETR_BIN, test_root, test_root, bb),
                   1);
  ck_assert_int_eq(sh("grep -q 'init-backbone.*backbone.0.body.conv1.weight' %s", log), 0);
  ck_assert_int_eq(sh("%s pretrain --data %s/data", DETR_BIN, test_root), 2);
  ck_assert_int_eq(sh("%s pretrain --data %s/data --out %s/x.safetensors --crop 8", DETR_BIN, test_root, test_root), 2);
  ck_assert_int_eq(sh("%s pretrain --data %s/nowhere --out %s/x.safetensors", DETR_BIN, test_root, test_root), 1);
  ck_assert_int_eq(sh("test -e %s/x.safetensors", test_root), 1);
  // A diverging pretraining stops at the first non-finite loss, says so, and writes no file.
  ck_assert_int_eq(sh("%s pretrain --data %s/data --out %s/x.safetensors %s --epochs 5 --batch 8 --crop 32 --lr 1e30 "
                      "--threads 2 --val-split none",
                      DETR_BIN, test_root, test_root, cfg),
                   1);
  ck_assert_int_eq(sh("grep -aq 'detr pretrain: the loss is .*nothing written' %s", log), 0);
  ck_assert_int_eq(sh("test -e %s/x.safetensors", test_root), 1);
}
END_TEST

// --precision: bf16 where the CPU has it (the run's config keeps it, so a resumed run goes on in
// bf16 and repeats the straight run's losses; it may also be resumed in fp32), a clear refusal where
// it has not; an unknown precision is a usage error.
START_TEST(precision_flag) {
  setup_data();
  char log[256];
  snprintf(log, sizeof log, "%s/log.txt", test_root);
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/p0 --precision fp16 %s", DETR_BIN, test_root, test_root, TRAIN_FLAGS), 2);
  ck_assert_int_eq(sh("grep -q 'expected fp32, tf32 or bf16' %s", log), 0);
  char why[256];
  if (!cpu_bf16_supported(why, sizeof why)) {
    ck_assert_int_eq(
        sh("%s train --data %s/data --out %s/p1 --precision bf16 %s", DETR_BIN, test_root, test_root, TRAIN_FLAGS), 2);
    ck_assert_int_eq(sh("grep -q 'AVX512-BF16' %s", log), 0);
    return;
  }
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/bf_straight --max-steps 6 --precision bf16 %s", DETR_BIN,
                      test_root, test_root, TRAIN_FLAGS),
                   0);
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/bf_stopped --max-steps 4 --precision bf16 %s", DETR_BIN,
                      test_root, test_root, TRAIN_FLAGS),
                   0);
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/bf_stopped --max-steps 6 --resume auto %s", DETR_BIN, test_root,
                      test_root, TRAIN_FLAGS),
                   0);
  same_losses("bf_straight", "bf_stopped", 6);
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/bf_stopped --max-steps 8 --resume auto --precision fp32 %s",
                      DETR_BIN, test_root, test_root, TRAIN_FLAGS),
                   0);
  ck_assert_int_eq(
      sh("%s eval --data %s/data --checkpoint %s/bf_stopped/ckpt-8.safetensors --precision bf16 --threads 2", DETR_BIN,
         test_root, test_root),
      0);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("cli_train");
  TCase *tc = tcase_create("cli_train");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, resume_is_exact);
  tcase_add_test(tc, precision_flag);
  tcase_add_test(tc, clear_failures);
  tcase_add_test(tc, pretrain_then_init_backbone);
  suite_add_tcase(s, tc);
  return sh_run_suite(s);
}
