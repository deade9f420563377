// Data-parallel training as a user runs it: `mpirun -np 2 detr train --batch b` follows the same
// loss curve as one process with --batch 2b (to float tolerance: the gradient sums are ordered
// differently), evaluates to the same COCO numbers, resumes exactly with the same number of
// processes, and refuses, with a clear message, a checkpoint of another number of processes;
// stopped by SIGUSR1 to mpirun, every process stops after the same step with a checkpoint.
// Skips (77) when the build has no MPI or mpirun is missing.
#define _DEFAULT_SOURCE  // mkdtemp, setenv
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>

#include "core/runtime.h"
#include "tests/shell.h"

#ifndef DETR_BIN
#error "DETR_BIN (the detr binary) must be defined by the build"
#endif

// Equal-size images, no augmentation, no dropout: with these the global batch is the same
// tensor whether one process or two hold it (padding and dropout masks would differ otherwise,
// as they do between the reference's GPUs too).
static const char *FLAGS =
    "--config tiny --enact --set num_classes=14 --set dropout=0 --no-augment --image-size 96 --max-size 96 "
    "--epochs 2 --eval-every 1 --lr 1e-3 --threads 1 --workers 1 --seed 7 --no-progress";
static const char *MPIRUN = "mpirun -np 2 --oversubscribe";

static void setup_data(void) {
  if (test_root[0]) return;
  snprintf(test_root, sizeof test_root, "/tmp/detr-dist-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(test_root));
  ck_assert_int_eq(
      sh("%s synth --out %s/data --train 16 --val 8 --min-side 96 --max-side 96 --seed 1", DETR_BIN, test_root), 0);
}

// Every number after "key": in the lines of type `type` of a metrics file, in order.
static int read_numbers(const char *run, const char *type, const char *key, double *out, int max) {
  char path[256], line[8192], tag[64], pattern[64];
  snprintf(path, sizeof path, "%s/%s/metrics.jsonl", test_root, run);
  snprintf(tag, sizeof tag, "\"type\": \"%s\"", type);
  snprintf(pattern, sizeof pattern, "\"%s\": ", key);
  FILE *f = fopen(path, "r");
  ck_assert_msg(f != NULL, "%s missing", path);
  int n = 0;
  while (n < max && fgets(line, sizeof line, f)) {
    const char *at = strstr(line, pattern);
    if (strstr(line, tag) && at) out[n++] = strtod(at + strlen(pattern), NULL);
  }
  fclose(f);
  return n;
}

static void expect_close(const char *run_a, const char *run_b, const char *type, const char *key, double rel) {
  double a[64], b[64];
  int na = read_numbers(run_a, type, key, a, 64), nb = read_numbers(run_b, type, key, b, 64);
  ck_assert_msg(na > 0 && na == nb, "%s %s: %d values in %s, %d in %s", type, key, na, run_a, nb, run_b);
  for (int i = 0; i < na; i++)
    ck_assert_msg(fabs(a[i] - b[i]) <= rel * fabs(a[i]) + 1e-6, "%s %s #%d: %s %.7g vs %s %.7g", type, key, i, run_a,
                  a[i], run_b, b[i]);
}

START_TEST(two_processes_equal_one_with_twice_the_batch) {
  setup_data();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/one %s --batch 4", DETR_BIN, test_root, test_root, FLAGS), 0);
  ck_assert_int_eq(
      sh("%s %s train --data %s/data --out %s/two %s --batch 2", MPIRUN, DETR_BIN, test_root, test_root, FLAGS), 0);
  // 16 images, 4 per step: 8 steps over 2 epochs, every loss term of the final and aux outputs.
  const char *keys[] = {"loss",        "loss_ce",   "loss_bbox",   "loss_giou",         "loss_ce_0",
                        "loss_giou_0", "grad_norm", "class_error", "clusters_per_image"};
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) expect_close("one", "two", "train", keys[k], 1e-4);
  double steps[64];
  ck_assert_int_eq(read_numbers("two", "train", "step", steps, 64), 8);
  // Evaluation split over the processes and merged: the same COCO numbers.
  const char *stats[] = {"AP", "AP50", "AR100"};
  for (size_t k = 0; k < 3; k++) expect_close("one", "two", "eval", stats[k], 1e-4);
  ck_assert_int_eq(sh("test -f %s/two/ckpt-8.safetensors && test -f %s/two/chart.png", test_root, test_root), 0);
}
END_TEST

START_TEST(resume_needs_the_same_number_of_processes) {
  setup_data();
  // Stop after 3 steps, resume to the end: the same log as the uninterrupted two-process run.
  ck_assert_int_eq(
      sh("%s %s train --data %s/data --out %s/full %s --batch 2", MPIRUN, DETR_BIN, test_root, test_root, FLAGS), 0);
  ck_assert_int_eq(sh("%s %s train --data %s/data --out %s/cut %s --batch 2 --max-steps 3 --checkpoint-every 1", MPIRUN,
                      DETR_BIN, test_root, test_root, FLAGS),
                   0);
  ck_assert_int_eq(sh("%s %s train --data %s/data --out %s/cut %s --batch 2 --resume auto", MPIRUN, DETR_BIN, test_root,
                      test_root, FLAGS),
                   0);
  expect_close("full", "cut", "train", "loss", 0.0);
  expect_close("full", "cut", "train", "loss_giou_0", 0.0);
  // One process on a two-process checkpoint: refused, saying why, and nothing removed.
  ck_assert_int_ne(
      sh("%s train --data %s/data --out %s/cut %s --batch 4 --resume auto", DETR_BIN, test_root, test_root, FLAGS), 0);
  ck_assert_int_eq(sh("grep -q 'written by a run of 2 processes' %s/log.txt", test_root), 0);
  ck_assert_int_eq(sh("test -f %s/cut/ckpt-8.safetensors", test_root), 0);
}
END_TEST

// mpirun answers a Ctrl-C by killing its processes a second after asking them to stop; SIGUSR1 it
// passes on. Every process stops after the same step, rank 0 checkpoints it, says so once and how
// to resume, leaves no half-written file, and the resumed run logs each step once.
START_TEST(sigusr1_to_mpirun_stops_every_process_with_a_checkpoint) {
  setup_data();
  char ckpt2[256];
  snprintf(ckpt2, sizeof ckpt2, "%s/u/ckpt-2.safetensors", test_root);
  // --max-steps: a backstop, should the signal not stop it.
  pid_t pid = sh_start(
      "%s %s train --data %s/data --out %s/u %s --batch 2 --epochs 1000 --eval-every 0 "
      "--checkpoint-every 2 --max-steps 400 > %s/u.log 2>&1",
      MPIRUN, DETR_BIN, test_root, test_root, FLAGS, test_root);
  ck_assert_msg(sh_wait_for_file(ckpt2, 120) || (kill(pid, SIGTERM), sh_wait(pid, 30), false),
                "no checkpoint after 120 s: see %s/u.log", test_root);
  kill(pid, SIGUSR1);  // mpirun's pid: sh_start exec's the command
  int status = sh_wait(pid, 300);
  ck_assert_msg(status == 128 + SIGUSR1, "mpirun's status %d", status);
  ck_assert_int_eq(sh("grep -q 'kill -USR1 %d' %s/u.log", (int)pid, test_root), 0);  // said at the start (OpenMPI 4)
  ck_assert_int_eq(sh("test $(grep -c 'SIGUSR1: stopping after this step' %s/u.log) -eq 1", test_root), 0);
  ck_assert_int_eq(sh("grep -q 'resume with the same 2 processes' %s/u.log", test_root), 0);
  int step = (int)sh_read_long(0, "grep -o 'interrupted at step [0-9]* (SIGUSR1)' %s/u.log | grep -o '[0-9][0-9]*'",
                               test_root);
  ck_assert_int_ge(step, 2);
  ck_assert_int_eq(sh("test -s %s/u/ckpt-%d.safetensors && ! ls %s/u | grep -q '[.]tmp'", test_root, step, test_root),
                   0);
  ck_assert_int_eq(
      sh("%s %s train --data %s/data --out %s/u %s --batch 2 --epochs 1000 --eval-every 0 --checkpoint-every 2 "
         "--max-steps %d --resume auto",
         MPIRUN, DETR_BIN, test_root, test_root, FLAGS, step + 2),
      0);
  double steps[64];
  int n = read_numbers("u", "train", "step", steps, 64);
  ck_assert_int_eq(n, step + 2);
  for (int i = 0; i < n; i++) ck_assert_int_eq((int)steps[i], i + 1);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
#if !DETR_HAVE_MPI
  printf("this build has no MPI: skipped\n");
  return 77;
#endif
  if (system("command -v mpirun > /dev/null 2>&1") != 0) {
    printf("no mpirun: skipped\n");
    return 77;
  }
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);  // CI runs as test_root
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
  Suite *s = suite_create("distributed");
  TCase *tc = tcase_create("mpirun");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, two_processes_equal_one_with_twice_the_batch);
  tcase_add_test(tc, resume_needs_the_same_number_of_processes);
  tcase_add_test(tc, sigusr1_to_mpirun_stops_every_process_with_a_checkpoint);
  suite_add_tcase(s, tc);
  SRunner *r = srunner_create(s);
  srunner_set_fork_status(r, CK_NOFORK);  // test_root[] persists across the tests
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  if (failed == 0) sh("rm -rf %s", test_root);
  return failed ? 1 : 0;
}
