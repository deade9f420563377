// The run directory is the user's data, and bad data fails before step 1: `detr train` as a user
// runs it into an existing run, after a crash, at its --max-steps, under Ctrl-C, and on data with
// the usual mistakes (images in the wrong folder, sizes or boxes written wrong, no annotations,
// one file under two ids, a folder where an image should be).
#define _DEFAULT_SOURCE  // mkdtemp, usleep, kill
#include <check.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/runtime.h"
#include "tests/shell.h"

#ifndef DETR_BIN
#error "DETR_BIN (the detr binary) must be defined by the build"
#endif

static const char *TINY =
    "--config tiny --set num_classes=100 --epochs 50 --eval-every 0 --checkpoint-every 2 --keep 20 "
    "--workers 2 --threads 2 --seed 5 --no-progress";
static char log_path[256];

static void setup_data(void) {
  if (test_root[0]) return;
  snprintf(test_root, sizeof test_root, "/tmp/detr-safety-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(test_root));
  snprintf(log_path, sizeof log_path, "%s/log.txt", test_root);
  ck_assert_int_eq(sh("%s synth --out %s/data --train 12 --val 4 --seed 3", DETR_BIN, test_root), 0);
}

// The log holds only what the next commands print.
static void clear_log(void) { ck_assert_int_eq(sh(": > %s", log_path), 0); }

static bool log_has(const char *pattern) { return sh("grep -Eq -- '%s' %s", pattern, log_path) == 0; }

#define ASSERT_LOG(pattern) ck_assert_msg(log_has(pattern), "the log lacks /%s/: see %s", pattern, log_path)

// Training lines in RUN/metrics.jsonl, and whether each step 1..n appears exactly once.
static int train_lines(const char *run) {
  return (int)sh_read_long(-1, "grep -c '\"type\": \"train\"' %s/%s/metrics.jsonl 2>/dev/null", test_root, run);
}

static bool each_step_once(const char *run, int steps) {
  char want[512] = "";
  for (int s = 1, n = 0; s <= steps && n < (int)sizeof want - 16; s++)
    n += snprintf(want + n, sizeof want - n, "%d ", s);
  return sh("grep '\"type\": \"train\"' %s/%s/metrics.jsonl | sed 's/.*\"step\": \\([0-9]*\\),.*/\\1/' | "
            "tr '\\n' ' ' | grep -qx '%s'",
            test_root, run, want) == 0;
}

// A run into a directory that holds another run (of another config, or without --resume) stops
// before it writes anything and says what is there and what to do; --move-old-run keeps the old run.
START_TEST(existing_run_is_never_overwritten) {
  setup_data();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/a --max-steps 4 %s", DETR_BIN, test_root, test_root, TINY), 0);
  ck_assert_int_eq(sh("(cd %s/a && md5sum ckpt-2.safetensors ckpt-4.safetensors metrics.jsonl > ../a.md5)", test_root),
                   0);
  clear_log();
  // Another model config with --resume auto: refused, naming the differing key.
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/a --max-steps 6 --resume auto %s --set hidden_dim=16", DETR_BIN,
                      test_root, test_root, TINY),
                   1);
  ASSERT_LOG("hidden_dim");
  ASSERT_LOG("--out");
  ck_assert_int_eq(sh("cd %s/a && md5sum -c --quiet ../a.md5", test_root), 0);
  // No --resume: refused with the three choices.
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/a --max-steps 2 %s", DETR_BIN, test_root, test_root, TINY), 1);
  ASSERT_LOG("--resume auto");
  ASSERT_LOG("--move-old-run");
  ASSERT_LOG("ckpt-4");
  ck_assert_int_eq(sh("cd %s/a && md5sum -c --quiet ../a.md5", test_root), 0);
  // --resume auto without --config: the checkpoint's model config, continued to step 6.
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/a --max-steps 6 --resume auto --epochs 50 --checkpoint-every 2 "
                      "--keep 20 --threads 2 --seed 5 --no-progress --eval-every 0",
                      DETR_BIN, test_root, test_root),
                   0);
  ck_assert_msg(each_step_once("a", 6), "metrics.jsonl does not hold steps 1-6 once each");
  ck_assert_int_eq(sh("(cd %s/a && md5sum *.safetensors metrics.jsonl > ../a.md5)", test_root), 0);
  // --move-old-run: the old run moved aside whole, a new one started; its starting backbone, kept
  // in the old run's directory, is read before the move.
  ck_assert_int_eq(sh("cp %s/a/ckpt-2.safetensors %s/a/backbone.safetensors", test_root, test_root), 0);
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/a --max-steps 2 --move-old-run --init-backbone "
                      "%s/a/backbone.safetensors %s",
                      DETR_BIN, test_root, test_root, test_root, TINY),
                   0);
  ck_assert_int_eq(train_lines("a"), 2);
  ck_assert_int_eq(sh("test $(ls -d %s/a.old-* | wc -l) -eq 1 && cd %s/a.old-* && md5sum -c --quiet ../a.md5 && "
                      "test -e ckpt-6.safetensors",
                      test_root, test_root),
                   0);
  // A run that stopped before its first checkpoint (its log written): --resume auto starts it again.
  ck_assert_int_eq(
      sh("mkdir %s/early && (head -1 %s/a/metrics.jsonl > %s/early/metrics.jsonl)", test_root, test_root, test_root),
      0);
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/early --max-steps 2 %s", DETR_BIN, test_root, test_root, TINY),
                   1);
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/early --max-steps 2 --resume auto %s", DETR_BIN, test_root, test_root, TINY),
      0);
  ck_assert(each_step_once("early", 2));
}
END_TEST

// A crash between a step's log line and its checkpoint: the resumed run logs each step once.
// Resuming from an older checkpoint of the same directory would mix two histories: refused, with
// --out to branch off instead. A run at its --max-steps resumes to nothing and says so.
START_TEST(resume_keeps_one_history) {
  setup_data();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/c --max-steps 6 %s", DETR_BIN, test_root, test_root, TINY), 0);
  ck_assert_int_eq(sh("rm %s/c/ckpt-6.safetensors", test_root), 0);  // killed after logging step 6
  // ... while writing ckpt-6: its temporary file is removed; one of a process still running (this
  // test's) stays, and so does a file detr does not write.
  pid_t dead = fork();
  ck_assert_int_ge(dead, 0);
  if (dead == 0) _exit(0);
  waitpid(dead, NULL, 0);
  ck_assert_int_eq(sh("cd %s/c && head -c 100000 ckpt-4.safetensors > ckpt-6.safetensors.tmp.%d && touch "
                      "ckpt-6.safetensors.tmp.%d notes.txt.tmp.%d && touch -d '2 minutes ago' *.tmp.*",
                      test_root, (int)dead, (int)getpid(), (int)dead),
                   0);
  clear_log();
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/c --max-steps 8 --resume auto %s", DETR_BIN, test_root, test_root, TINY), 0);
  ck_assert_msg(each_step_once("c", 8), "metrics.jsonl does not hold steps 1-8 once each");
  ASSERT_LOG("stopped at step 8 .*--max-steps");
  ASSERT_LOG("removed [^ ]*/c/ckpt-6.safetensors.tmp.[0-9]+ \\(0.1 MB\\), left by process");
  ck_assert_int_eq(sh("cd %s/c && ! test -e ckpt-6.safetensors.tmp.%d && test -e ckpt-6.safetensors.tmp.%d && "
                      "test -e notes.txt.tmp.%d && rm ckpt-6.safetensors.tmp.%d notes.txt.tmp.%d",
                      test_root, (int)dead, (int)getpid(), (int)dead, (int)getpid(), (int)dead),
                   0);
  // At its --max-steps: nothing to do, nothing written.
  ck_assert_int_eq(sh("(cd %s/c && ls -l --time-style=full-iso > ../c.ls && md5sum * > ../c.md5)", test_root), 0);
  clear_log();
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/c --max-steps 8 --resume auto %s", DETR_BIN, test_root, test_root, TINY), 0);
  ASSERT_LOG("at step 8, which --max-steps 8 has reached: nothing to do");
  ck_assert_int_eq(
      sh("cd %s/c && md5sum -c --quiet ../c.md5 && ls -l --time-style=full-iso | cmp -s - ../c.ls", test_root), 0);
  // An older checkpoint of this directory: refused; into a new --out: a branch, the original kept.
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/c --max-steps 8 --resume %s/c/ckpt-2.safetensors %s", DETR_BIN,
                      test_root, test_root, test_root, TINY),
                   1);
  ASSERT_LOG("ckpt-8");
  ASSERT_LOG("--out");
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/c2 --max-steps 4 --resume %s/c/ckpt-2.safetensors %s", DETR_BIN,
                      test_root, test_root, test_root, TINY),
                   0);
  ck_assert_int_eq(sh("test -e %s/c2/ckpt-4.safetensors && test -e %s/c/ckpt-8.safetensors", test_root, test_root), 0);
  // Other categories in the data: a resumed run trains on its own classes (--init starts anew).
  ck_assert_int_eq(sh("cp -r %s/data %s/dc && sed -i 's/\"id\": 7, \"name\"/\"id\": 99, \"name\"/; "
                      "s/\"category_id\": 7,/\"category_id\": 99,/' %s/dc/annotations/instances_train.json",
                      test_root, test_root, test_root),
                   0);
  clear_log();
  ck_assert_int_eq(
      sh("%s train --data %s/dc --out %s/c --max-steps 10 --resume auto %s", DETR_BIN, test_root, test_root, TINY), 1);
  ASSERT_LOG("categories .* differ");
  ASSERT_LOG("--init");
}
END_TEST

// An epoch's checkpoint is written before its evaluation (a crash there loses nothing) and again
// when the evaluation finds a new best: a run resumed from it keeps that best AP, and so never
// replaces best.safetensors with a worse model.
START_TEST(epoch_checkpoint_knows_its_evaluation) {
  setup_data();
  // 12 images, 4 a step: the epoch ends at step 3, its evaluation the first (so a new best).
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/e --config tiny --set num_classes=100 --epochs 1 --batch 4 "
                      "--threads 2 --workers 2 --seed 5 --no-progress",
                      DETR_BIN, test_root, test_root),
                   0);
  const char *best_ap = "%s info %s/e/%s | grep 'best AP:'";
  char a[512], b[512];
  snprintf(a, sizeof a, best_ap, DETR_BIN, test_root, "ckpt-3.safetensors");
  snprintf(b, sizeof b, best_ap, DETR_BIN, test_root, "best.safetensors");
  ck_assert_int_eq(sh("%s && test \"$(%s)\" = \"$(%s)\"", a, a, b), 0);
}
END_TEST

// The reference's loss and matcher weights are flags; --val-split none trains without evaluation.
START_TEST(loss_weights_and_no_val_split) {
  setup_data();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/w1 --max-steps 1 %s", DETR_BIN, test_root, test_root, TINY), 0);
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/w2 --max-steps 1 %s --bbox-loss-coef 0 --giou-loss-coef 0",
                      DETR_BIN, test_root, test_root, TINY),
                   0);
  // The same first step's terms, another weighted total.
  const char *terms = "grep -o '\"loss_bbox\": [0-9.]*' %s/%s/metrics.jsonl";
  char a[512], b[512];
  snprintf(a, sizeof a, terms, test_root, "w1");
  snprintf(b, sizeof b, terms, test_root, "w2");
  ck_assert_int_eq(sh("test \"$(%s)\" = \"$(%s)\"", a, b), 0);
  ck_assert_int_ne(sh("test \"$(grep -o '\"loss\": [0-9.]*' %s/w1/metrics.jsonl)\" = "
                      "\"$(grep -o '\"loss\": [0-9.]*' %s/w2/metrics.jsonl)\"",
                      test_root, test_root),
                   0);
  // The no-object weight changes the class loss itself.
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/w3 --max-steps 1 %s --eos-coef 0.5", DETR_BIN, test_root, test_root, TINY),
      0);
  ck_assert_int_ne(sh("test \"$(grep -o '\"loss_ce\": [0-9.]*' %s/w1/metrics.jsonl)\" = "
                      "\"$(grep -o '\"loss_ce\": [0-9.]*' %s/w3/metrics.jsonl)\"",
                      test_root, test_root),
                   0);
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/w4 --max-steps 1 %s --bbox-loss-coef -1", DETR_BIN, test_root,
                      test_root, TINY),
                   2);
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/nv --config tiny --set num_classes=100 --epochs 1 --threads 2 "
                      "--no-progress --val-split none",
                      DETR_BIN, test_root, test_root),
                   0);
  ck_assert_int_eq(
      sh("test -e %s/nv/best.safetensors || grep -q '\"type\": \"eval\"' %s/nv/metrics.jsonl", test_root, test_root),
      1);
}
END_TEST

// Ctrl-C: the step in progress finishes, a checkpoint is written, the message says how to resume,
// and the exit status is 130.
START_TEST(ctrl_c_saves_and_says_how_to_resume) {
  setup_data();
  char ckpt2[256];
  snprintf(ckpt2, sizeof ckpt2, "%s/i/ckpt-2.safetensors", test_root);
  clear_log();
  pid_t pid = sh_start("%s train --data %s/data --out %s/i --max-steps 100000 %s >> %s 2>&1", DETR_BIN, test_root,
                       test_root, TINY, log_path);
  ck_assert_msg(sh_wait_for_file(ckpt2, 60) || (kill(pid, SIGKILL), sh_wait(pid, 10), false),
                "no checkpoint after 60 s: see %s", log_path);
  usleep(100000);
  kill(pid, SIGINT);
  int status = sh_wait(pid, 120);
  ck_assert_msg(status == 130, "exit status %d", status);
  ASSERT_LOG("interrupted at step [0-9]+");
  ASSERT_LOG("--resume auto");
  // The checkpoint it names exists and resumes: two more steps, each step logged once.
  ck_assert_int_eq(sh("f=$(grep -o '[^ ]*/i/ckpt-[0-9]*.safetensors' %s | tail -1) && test -s \"$f\"", log_path), 0);
  int step = (int)sh_read_long(0, "grep -o 'interrupted at step [0-9]*' %s | tail -1 | grep -o '[0-9]*$'", log_path);
  ck_assert_int_ge(step, 2);
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/i --max-steps %d --resume auto %s", DETR_BIN, test_root,
                      test_root, step + 2, TINY),
                   0);
  ck_assert_msg(each_step_once("i", step + 2), "steps 1-%d are not each logged once", step + 2);
}
END_TEST

// The losses of a run's training steps (its metrics.jsonl without the timings), for comparing runs.
static bool same_losses(const char *a, const char *b) {
  const char *runs[] = {a, b};
  for (int i = 0; i < 2; i++)
    if (sh("(grep '\"type\": \"train\"' %s/%s/metrics.jsonl | sed 's/, \"images_per_s.*//' > %s/%s.losses)", test_root,
           runs[i], test_root, runs[i]))
      return false;
  return sh("cmp %s/%s.losses %s/%s.losses", test_root, a, test_root, b) == 0;
}

// An image that fails to load mid-run (its header is whole, so the start-up check passes it) under
// --bad-input fail: the finished steps are saved, the message names the file and the two commands
// that go on. Resumed after the file is fixed, the run logs every step once and the same losses as
// a run that never met the bad file; resumed with --bad-input skip, it trains past it.
START_TEST(bad_image_mid_run_keeps_the_finished_steps) {
  setup_data();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/good --max-steps 12 %s", DETR_BIN, test_root, test_root, TINY),
                   0);
  // Image 11 comes in the 6th batch of seed 5's first epoch.
  ck_assert_int_eq(sh("cp -r %s/data %s/dbad && (head -c 20000 %s/data/train/000000000011.jpg > "
                      "%s/dbad/train/000000000011.jpg)",
                      test_root, test_root, test_root, test_root),
                   0);
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/dbad --out %s/bad --max-steps 12 %s", DETR_BIN, test_root, test_root, TINY),
                   1);
  ASSERT_LOG("dbad/train/000000000011.jpg: truncated or corrupt JPEG");
  ASSERT_LOG(
      "stopped before step 6 on the data error above: the finished steps are saved in [^ ]*/bad/ckpt-5.safetensors");
  ASSERT_LOG("replace the file with a readable one and resume with: detr train .* --resume auto$");
  ASSERT_LOG("leave out every unreadable image .* --bad-input skip --resume auto$");
  ck_assert_int_eq(sh("test -s %s/bad/ckpt-5.safetensors && cp -r %s/bad %s/badskip && cp -r %s/bad %s/badzero",
                      test_root, test_root, test_root, test_root, test_root),
                   0);
  ck_assert_msg(each_step_once("bad", 5), "steps 1-5 are not each logged once");
  // Fixed: the run goes on from step 5 as if nothing had happened.
  ck_assert_int_eq(sh("cp %s/data/train/000000000011.jpg %s/dbad/train/", test_root, test_root), 0);
  ck_assert_int_eq(
      sh("%s train --data %s/dbad --out %s/bad --max-steps 12 --resume auto %s", DETR_BIN, test_root, test_root, TINY),
      0);
  ck_assert_msg(each_step_once("bad", 12), "steps 1-12 are not each logged once");
  ck_assert_msg(same_losses("good", "bad"), "the resumed run's losses differ from the uninterrupted run's");
  // Skipped instead (the file still broken): the run trains on past it and counts it.
  ck_assert_int_eq(
      sh("(head -c 20000 %s/data/train/000000000011.jpg > %s/dbad/train/000000000011.jpg)", test_root, test_root), 0);
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/dbad --out %s/badskip --max-steps 12 --bad-input skip --resume auto %s",
                      DETR_BIN, test_root, test_root, TINY),
                   0);
  ck_assert_msg(each_step_once("badskip", 12), "steps 1-12 are not each logged once");
  ASSERT_LOG("000000000011.jpg");
  ASSERT_LOG("the loader skipped 1 unreadable image \\(2 times, over the epochs\\)");  // it said 2 images
  // Unreadable at start-up (empty) under skip: 5 batches per epoch instead of 6, so the position in
  // epoch 0 (5 batches done) no longer exists; the run goes on from epoch 1 (it looped on forever).
  ck_assert_int_eq(sh(": > %s/dbad/train/000000000011.jpg", test_root), 0);
  clear_log();
  ck_assert_int_eq(sh("timeout -s KILL 120 %s train --data %s/dbad --out %s/badzero --max-steps 12 --bad-input skip "
                      "--resume auto %s",
                      DETR_BIN, test_root, test_root, TINY),
                   0);
  ASSERT_LOG(
      "has 5 batches per epoch now, fewer than the 5 this run had trained of epoch 0: going on from the start "
      "of epoch 1");
  ck_assert_msg(each_step_once("badzero", 12), "steps 1-12 are not each logged once");
}
END_TEST

// The resume command a stopped run prints can be pasted as it is: the data and run directories here
// hold a space and a quote, and the printed command, run by the shell, resumes the run.
START_TEST(printed_resume_command_can_be_pasted) {
  setup_data();
  ck_assert_int_eq(sh("cp -r %s/data \"%s/my data\" && mkdir -p \"%s/it's here\" && (head -c 20000 "
                      "%s/data/train/000000000011.jpg > \"%s/my data/train/000000000011.jpg\")",
                      test_root, test_root, test_root, test_root, test_root),
                   0);
  clear_log();
  ck_assert_int_eq(sh("%s train --data \"%s/my data\" --out \"%s/it's here/run\" --max-steps 8 %s", DETR_BIN, test_root,
                      test_root, TINY),
                   1);
  ASSERT_LOG("replace the file with a readable one and resume with: detr train .* --resume auto$");
  ck_assert_int_eq(sh("cp %s/data/train/000000000011.jpg \"%s/my data/train/\"", test_root, test_root), 0);
  ck_assert_int_eq(sh("(cmd=$(grep -o 'resume with: detr train .*' %s | head -1 | sed 's/^resume with: detr //') && "
                      "eval \"%s $cmd\")",
                      log_path, DETR_BIN),
                   0);
  ck_assert_int_eq(sh("test -s \"%s/it's here/run/ckpt-8.safetensors\"", test_root), 0);
}
END_TEST

// A resumed run continues its run's settings, recorded typed in its checkpoints: a larger --epochs
// keeps the learning rate and its drop where the run had them (StepLR every 2 epochs of the 3, at
// --lr 5e-4), and a flag that differs from the run's is applied and said.
START_TEST(resume_continues_the_runs_schedule) {
  setup_data();
  const char *flags = "--config tiny --set num_classes=100 --eval-every 0 --workers 2 --threads 2 --no-progress";
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/s --epochs 3 --lr 5e-4 --seed 5 %s", DETR_BIN, test_root, test_root, flags),
      0);
  clear_log();
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/s --epochs 6 --resume auto %s", DETR_BIN, test_root, test_root, flags), 0);
  ASSERT_LOG("resuming with settings of its own instead of the run.s: --epochs 6 \\(the run.s: 3\\)$");
  const char *lr_by_epoch = "0.0005 0.0005 5e-05 5e-05 5e-06 5e-06 ";
  ck_assert_int_eq(sh("grep -o '\"epoch\": [0-9]*, \"batch\": 0,.*\"lr\": [^,]*' %s/s/metrics.jsonl | "
                      "sed 's/.*\"lr\": //' | tr '\\n' ' ' | grep -qx '%s'",
                      test_root, lr_by_epoch),
                   0);
  // --lr given again, differing: applied, and said.
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/s --epochs 7 --lr 1e-3 --resume auto %s", DETR_BIN, test_root,
                      test_root, flags),
                   0);
  ASSERT_LOG("--lr 0.001 \\(the run.s: 0.0005\\)");
  ck_assert_int_eq(sh("grep '\"epoch\": 6, \"batch\": 0,' %s/s/metrics.jsonl | grep -q '\"lr\": 1e-06'", test_root), 0);
  // The run's seed (its data order) is its own: kept without --seed, another one refused.
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/s --epochs 8 --seed 6 --resume auto %s", DETR_BIN, test_root,
                      test_root, flags),
                   1);
  ASSERT_LOG("seed is 5: --seed 6 would change its data order mid-run");
}
END_TEST

// The run directory holds only what the run wrote: a new run into a folder with files of the names
// it writes (a chart, results) that no run there wrote is refused before it writes anything; the
// results of every evaluation but the best's and the last's are removed as the run goes (each holds
// every detection of every val image), unless --keep-all-results.
START_TEST(run_directory_holds_only_what_the_run_wrote) {
  setup_data();
  ck_assert_int_eq(sh("mkdir %s/u && echo mine > %s/u/chart.png && echo '[]' > %s/u/results-epoch0.json && "
                      "(cd %s/u && md5sum * > ../u.md5)",
                      test_root, test_root, test_root, test_root),
                   0);
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/u --max-steps 2 %s", DETR_BIN, test_root, test_root, TINY), 1);
  ASSERT_LOG("holds (chart.png, results-epoch0.json|results-epoch0.json, chart.png), which this run would write over");
  ck_assert_int_eq(sh("cd %s/u && md5sum -c --quiet ../u.md5 && test $(ls | wc -l) -eq 2", test_root), 0);
  const char *flags =
      "--config tiny --set num_classes=100 --epochs 3 --eval-every 1 --workers 2 --threads 2 --seed 5 "
      "--no-progress";
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/ev %s", DETR_BIN, test_root, test_root, flags), 0);
  // The best evaluation: the first with the highest AP.
  long best = sh_read_long(-1,
                           "grep '\"type\": \"eval\"' %s/ev/metrics.jsonl | sed 's/.*\"epoch\": \\([0-9]*\\),.*\"AP\": "
                           "\\([-0-9.]*\\),.*/\\2 \\1/' | awk '$1 > m || NR == 1 {m = $1; e = $2} END {print e}'",
                           test_root);
  ck_assert_int_ge(best, 0);
  char want[96];
  snprintf(want, sizeof want, best == 2 ? "results-epoch2.json" : "results-epoch%ld.json results-epoch2.json", best);
  ck_assert_msg(
      sh("test \"$(cd %s/ev && ls results-epoch*.json | sort | tr '\\n' ' ')\" = '%s '", test_root, want) == 0,
      "%s/ev should hold only %s", test_root, want);
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/ev2 --keep-all-results %s", DETR_BIN, test_root, test_root, flags), 0);
  ck_assert_int_eq(sh("test $(ls %s/ev2/results-epoch*.json | wc -l) -eq 3", test_root), 0);
}
END_TEST

// The small mistakes of a long run's set-up, each with a message that leads to the fix: an
// annotation file saved with a UTF-8 byte-order mark trains (yajl stopped at byte 1); --data naming
// the annotation file says what --data takes; a val split without images suggests --val-split
// none; a named pipe given as a checkpoint or results file is refused, not waited on forever.
START_TEST(small_mistakes_get_clear_messages) {
  setup_data();
  ck_assert_int_eq(sh("cp -r %s/data %s/dbom && for f in %s/dbom/annotations/*.json; do (printf '\\357\\273\\277'; "
                      "cat $f) > $f.bom && mv $f.bom $f; done",
                      test_root, test_root, test_root),
                   0);
  ck_assert_int_eq(sh("%s train --data %s/dbom --out %s/bom --max-steps 1 %s", DETR_BIN, test_root, test_root, TINY),
                   0);
  clear_log();
  ck_assert_int_ne(sh("%s train --data %s/data/annotations/instances_train.json --out %s/x1 %s", DETR_BIN, test_root,
                      test_root, TINY),
                   0);
  ASSERT_LOG("not a folder: --data takes the dataset.s root");
  ck_assert_int_eq(sh("cp -r %s/data %s/dv0 && (echo '{\"images\": [], \"annotations\": [], \"categories\": []}' > "
                      "%s/dv0/annotations/instances_val.json)",
                      test_root, test_root, test_root),
                   0);
  clear_log();
  ck_assert_int_ne(
      sh("%s train --data %s/dv0 --out %s/x2 --config tiny --set num_classes=100", DETR_BIN, test_root, test_root), 0);
  ASSERT_LOG("instances_val.json: no images: to train without evaluating, pass --val-split none");
  ck_assert_int_eq(sh("mkfifo %s/fifo", test_root), 0);
  clear_log();
  ck_assert_int_eq(sh("timeout 20 %s info %s/fifo", DETR_BIN, test_root), 1);
  ck_assert_int_eq(sh("timeout 20 %s cocoeval --ann %s/data/annotations/instances_val.json --results %s/fifo", DETR_BIN,
                      test_root, test_root),
                   1);
  ck_assert_int_eq(sh("timeout 20 %s train --data %s/data --out %s/x3 --init %s/fifo %s", DETR_BIN, test_root,
                      test_root, test_root, TINY),
                   1);
  ck_assert_int_eq((int)sh_read_long(0, "grep -c 'fifo: not a regular file' %s", log_path), 3);
  // An --out too long for the run's files: refused at once (it failed at the first checkpoint).
  char longest[4100];
  memset(longest, 'a', 4050);
  longest[4050] = 0;
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/%s %s", DETR_BIN, test_root, test_root, longest, TINY), 2);
  ASSERT_LOG("--out is [0-9]+ characters long: a run directory.s path may have at most 4000");
  // Weights of another preset: the message names the preset they fit and what --init-partial
  // would load, in counts (it listed every mismatch and suggested --init-partial alone).
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/pre --max-steps 1 %s", DETR_BIN, test_root, test_root, TINY),
                   0);
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/x4 --init %s/pre/ckpt-1.safetensors --config detr-r18-small "
                      "--set num_classes=100 --max-steps 1 --no-progress",
                      DETR_BIN, test_root, test_root, test_root),
                   1);
  ASSERT_LOG("the file.s tensors are those of the preset tiny: --config tiny");
  ASSERT_LOG("--init-partial would load the [0-9]+ of the model.s [0-9]+ tensors that fit");
}
END_TEST

// One process per run directory: while a run lives, a second run into its directory, a --resume
// auto and a --move-old-run are refused before they touch or read anything, naming the live run's pid and
// command; the lock of a run killed with SIGKILL is taken over with a line that says so.
START_TEST(second_process_is_refused_while_the_run_lives) {
  setup_data();
  char ckpt2[256];
  snprintf(ckpt2, sizeof ckpt2, "%s/l/ckpt-2.safetensors", test_root);
  // One run as started with OMP_WAIT_POLICY set, the others without: detr restarts itself (as
  // "exe") only without it, so the processes' names differ, and the lock must not depend on them.
  pid_t pid = sh_start(
      "env OMP_WAIT_POLICY=PASSIVE %s train --data %s/data --out %s/l --max-steps 100000 %s > "
      "%s/l.log 2>&1",
      DETR_BIN, test_root, test_root, TINY, test_root);
  ck_assert_msg(sh_wait_for_file(ckpt2, 60) || (kill(pid, SIGKILL), sh_wait(pid, 10), false),
                "no checkpoint after 60 s: see %s/l.log", test_root);
  char holder[64];
  snprintf(holder, sizeof holder, "process %d on ", (int)pid);
  const char *tries[] = {"", "--resume auto", "--move-old-run"};
  for (int i = 0; i < 3; i++) {
    clear_log();
    ck_assert_int_eq(
        sh("env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT %s train --data %s/data --out %s/l --max-steps 4 %s %s", DETR_BIN,
           test_root, test_root, TINY, tries[i]),
        1);
    ASSERT_LOG(holder);
    ASSERT_LOG("is running in this directory: detr train ");
    ck_assert(!log_has("dropped"));        // the live run's metrics.jsonl untouched
    ck_assert(!log_has("resuming from"));  // refused before a checkpoint of the live run was read
  }
  ck_assert_int_eq(sh("test -d %s/l && ! ls -d %s/l.old-* 2>/dev/null", test_root, test_root), 0);
  kill(pid, SIGKILL);
  ck_assert_int_eq(sh_wait(pid, 30), 128 + SIGKILL);
  ck_assert_int_eq(sh("grep -q '^pid %d$' %s/l/train.lock", (int)pid, test_root), 0);  // left behind
  int step =
      (int)sh_read_long(0, "ls %s/l | sed -n 's/^ckpt-\\([0-9]*\\).safetensors$/\\1/p' | sort -n | tail -1", test_root);
  ck_assert_int_ge(step, 2);
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/l --max-steps %d --resume auto %s", DETR_BIN, test_root,
                      test_root, step + 2, TINY),
                   0);
  ASSERT_LOG("train.lock was left by a run that has ended \\(process [0-9]+ on .*: detr train .*\\): taking it over");
  ck_assert_msg(each_step_once("l", step + 2), "steps 1-%d are not each logged once", step + 2);
  ck_assert_int_eq(sh("test ! -e %s/l/train.lock", test_root), 0);  // released at the end
}
END_TEST

// The files a verb writes where the user says (eval's --results and --json, predict's --json and
// pictures, pretrain's --out, synth's folder) never replace an input, a file of another kind, or
// a file an earlier run of the verb did not write; each refusal comes before any work.
START_TEST(outputs_never_replace_what_the_user_made) {
  setup_data();
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/o --max-steps 1 %s", DETR_BIN, test_root, test_root, TINY), 0);
  ck_assert_int_eq(
      sh("cd %s && mkdir photos && cp data/val/000000000001.jpg photos/a.jpg && echo mine > photos/a.png && "
         "echo notes > notes.txt && (md5sum o/ckpt-1.safetensors data/annotations/instances_*.json "
         "photos/* notes.txt > sums.md5)",
         test_root),
      0);
  const char *eval = "%s eval --checkpoint %s/o/ckpt-1.safetensors --data %s/data --threads 2 %s %s/%s";
  clear_log();
  ck_assert_int_eq(sh(eval, DETR_BIN, test_root, test_root, "--results", test_root, "o/ckpt-1.safetensors"), 2);
  ASSERT_LOG("is this command.s input");
  ck_assert_int_eq(sh(eval, DETR_BIN, test_root, test_root, "--json", test_root, "data/annotations/instances_val.json"),
                   2);
  ck_assert_int_eq(sh(eval, DETR_BIN, test_root, test_root, "--json", test_root, "notes.txt"), 2);
  ASSERT_LOG("is not this command.s earlier output");
  clear_log();
  ck_assert_int_eq(
      sh("%s eval --checkpoint %s/o/ckpt-1.safetensors --data %s/data --results %s/r.json --json %s/./r.json", DETR_BIN,
         test_root, test_root, test_root, test_root),
      2);
  ASSERT_LOG("--results and --json name one file");
  // JSON of another kind: the training split's annotations are no earlier output of eval.
  ck_assert_int_eq(
      sh(eval, DETR_BIN, test_root, test_root, "--results", test_root, "data/annotations/instances_train.json"), 2);
  const char *predict =
      "%s predict --checkpoint %s/o/ckpt-1.safetensors --threads 2 %s/photos/a.jpg --out %s/photos %s";
  char json[300];
  snprintf(json, sizeof json, "--json %s/photos/a.jpg", test_root);
  ck_assert_int_eq(sh(predict, DETR_BIN, test_root, test_root, test_root, json), 2);
  // The user's a.png beside a.jpg stays; the picture goes to a-2.png, which a second run replaces.
  ck_assert_int_eq(sh(predict, DETR_BIN, test_root, test_root, test_root, ""), 0);
  ck_assert_int_eq(sh(predict, DETR_BIN, test_root, test_root, test_root, ""), 0);
  ck_assert_int_eq(sh("cd %s/photos && test -s a-2.png && ! test -e a-3.png && grep -q '\"output\": \"a-2.png\"' "
                      "predictions.json",
                      test_root),
                   0);
  clear_log();
  ck_assert_int_eq(sh("%s pretrain --data %s/data --out %s/notes.txt --config tiny --epochs 1 --threads 2", DETR_BIN,
                      test_root, test_root),
                   2);
  ASSERT_LOG("exists: not overwritten");
  ck_assert_int_eq(sh("%s synth --out %s/photos --train 2 --val 1", DETR_BIN, test_root), 2);
  ASSERT_LOG("is not empty");
  ck_assert_int_eq(sh("cd %s && md5sum -c --quiet sums.md5", test_root), 0);
  // No flag takes infinity; a checkpoint given as weights says so first.
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/o2 --max-steps 1 %s --lr inf", DETR_BIN, test_root, test_root, TINY), 2);
  ASSERT_LOG("--lr: .inf. is not a finite number");
  clear_log();
  ck_assert_int_ne(sh("%s eval --weights %s/o/ckpt-1.safetensors --config tiny --set num_classes=100 --data %s/data "
                      "--threads 2",
                      DETR_BIN, test_root, test_root),
                   0);
  ASSERT_LOG("^detr eval: [^ ]*ckpt-1.safetensors is a detr-c checkpoint, not weights");
}
END_TEST

// Data with the usual mistakes fails before step 1, saying what is wrong and where.
START_TEST(bad_data_fails_before_step_one) {
  setup_data();
  const char *ann = "annotations/instances_train.json";
  // The images in images/ instead of train/: the layout and --train-split in the message.
  ck_assert_int_eq(sh("cp -r %s/data %s/d1 && mv %s/d1/train %s/d1/images", test_root, test_root, test_root, test_root),
                   0);
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/d1 --out %s/r1 %s", DETR_BIN, test_root, test_root, TINY), 1);
  ASSERT_LOG("--train-split");
  ck_assert_int_eq(train_lines("r1"), -1);
  // Under skip, a folder without one readable image is an error, not a loader spinning forever.
  ck_assert_int_eq(sh("mkdir %s/d1/train", test_root), 0);
  clear_log();
  ck_assert_int_eq(
      sh("timeout 120 %s train --data %s/d1 --out %s/r1b --bad-input skip %s", DETR_BIN, test_root, test_root, TINY),
      1);
  ASSERT_LOG("no image is left to train on \\(12 skipped: 12 missing");
  // One image's width and height doubled in the file.
  ck_assert_int_eq(
      sh("cp -r %s/data %s/d2 && sed -i 's/\"width\": 425, \"height\": 416/\"width\": 850, \"height\": 832/' "
         "%s/d2/%s",
         test_root, test_root, test_root, ann),
      0);
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/d2 --out %s/r2 %s", DETR_BIN, test_root, test_root, TINY), 1);
  ASSERT_LOG("425x416 but the annotation file says 850x832");
  ck_assert_int_eq(train_lines("r2"), -1);
  // Boxes written as [x0, y0, x1, y1].
  ck_assert_int_eq(sh("cp -r %s/data %s/d3 && (awk '{ if (match($0, /\"bbox\": \\[[^]]*\\]/)) { "
                      "split(substr($0, RSTART + 9, RLENGTH - 10), b, \", \"); $0 = substr($0, 1, RSTART - 1) "
                      "\"\\\"bbox\\\": [\" b[1] \", \" b[2] \", \" b[1] + b[3] \", \" b[2] + b[4] \"]\" "
                      "substr($0, RSTART + RLENGTH) } print }' %s/data/%s > %s/d3/%s)",
                      test_root, test_root, test_root, ann, test_root, ann),
                   0);
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/d3 --out %s/r3 %s --bad-input skip", DETR_BIN, test_root, test_root, TINY),
                   1);
  ASSERT_LOG("\\[x, y, width, height\\]");
  // No annotations at all.
  ck_assert_int_eq(sh("cp -r %s/data %s/d4 && sed -i '/\"image_id\"/d' %s/d4/%s", test_root, test_root, test_root, ann),
                   0);
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/d4 --out %s/r4 %s", DETR_BIN, test_root, test_root, TINY), 1);
  ASSERT_LOG("no annotations");
  // One file under two image ids.
  ck_assert_int_eq(
      sh("cp -r %s/data %s/d5 && sed -i 's/\"file_name\": \"000000000002.jpg\", \"width\": 395, \"height\": "
         "440/\"file_name\": \"000000000001.jpg\", \"width\": 425, \"height\": 416/' %s/d5/%s",
         test_root, test_root, test_root, ann),
      0);
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/d5 --out %s/r5 %s", DETR_BIN, test_root, test_root, TINY), 1);
  ASSERT_LOG("000000000001.jpg");
  ASSERT_LOG("image ids 1 and 2");
  // A folder where an image file should be: named as such, for train and for predict.
  ck_assert_int_eq(sh("cp -r %s/data %s/d6 && mkdir %s/d6/train/sub && sed -i "
                      "'s/\"file_name\": \"000000000003.jpg\"/\"file_name\": \"sub\"/' %s/d6/%s",
                      test_root, test_root, test_root, test_root, ann),
                   0);
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/d6 --out %s/r6 %s", DETR_BIN, test_root, test_root, TINY), 1);
  ASSERT_LOG("sub.*folder");
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/p --max-steps 1 %s", DETR_BIN, test_root, test_root, TINY), 0);
  clear_log();
  // A folder for predict: a usage error that says how to give its images, before --out is made.
  ck_assert_int_eq(sh("%s predict --checkpoint %s/p/ckpt-1.safetensors --out %s/pred %s/data/val", DETR_BIN, test_root,
                      test_root, test_root),
                   2);
  ASSERT_LOG("data/val is a folder: give its images .*data/val/[*].jpg");
  ck_assert(!log_has("bytes for encoded image"));
  ck_assert_int_eq(sh("test -e %s/pred", test_root), 1);
}
END_TEST

// Two cases, each its own ctest entry (CK_RUN_CASE), so that ctest runs them side by side: the
// directory's rules, and the faults a long run meets.
int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("run_safety");
  TCase *dir = tcase_create("directory"), *faults = tcase_create("faults");
  tcase_set_timeout(dir, 600);
  tcase_set_timeout(faults, 600);
  tcase_add_test(dir, existing_run_is_never_overwritten);
  tcase_add_test(dir, resume_keeps_one_history);
  tcase_add_test(dir, loss_weights_and_no_val_split);
  tcase_add_test(dir, epoch_checkpoint_knows_its_evaluation);
  tcase_add_test(dir, outputs_never_replace_what_the_user_made);
  tcase_add_test(dir, run_directory_holds_only_what_the_run_wrote);
  tcase_add_test(dir, small_mistakes_get_clear_messages);
  tcase_add_test(faults, ctrl_c_saves_and_says_how_to_resume);
  tcase_add_test(faults, bad_data_fails_before_step_one);
  tcase_add_test(faults, second_process_is_refused_while_the_run_lives);
  tcase_add_test(faults, bad_image_mid_run_keeps_the_finished_steps);
  tcase_add_test(faults, resume_continues_the_runs_schedule);
  tcase_add_test(faults, printed_resume_command_can_be_pasted);
  suite_add_tcase(s, dir);
  suite_add_tcase(s, faults);
  return sh_run_suite(s);
}
