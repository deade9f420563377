// The run directory is the user's data: what `detr train --out DIR` finds there, which checkpoint
// a --resume means, and the few ways the trainer changes a directory (moving an old run aside,
// cutting metrics.jsonl back to a resumed step, pruning its own old checkpoints, removing what a
// killed process left half-written). Nothing here deletes what another run wrote or is writing.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RUN_DIR_MAX_CHECKPOINTS 1024
// The longest run directory path: the files in it (the longest, a checkpoint's temporary file,
// "/ckpt-<step>.safetensors.tmp.<pid>") must stay within PATH_MAX (4096) and the trainer's 4200-byte
// path buffers.
#define RUN_DIR_MAX_PATH 4000

// What a directory holds of a run.
typedef struct {
  int64_t steps[RUN_DIR_MAX_CHECKPOINTS];  // ckpt-<step>.safetensors, newest first
  int n_checkpoints;
  bool best;     // best.safetensors
  bool metrics;  // metrics.jsonl, not empty
} RunDirContents;

void run_dir_scan(const char *dir, RunDirContents *c);
// The files of dir that a run writes but that no run there wrote (chart.png, results-epoch<E>.json
// in a directory without a run's metrics.jsonl or checkpoints: the user's own), as "chart.png,
// results-epoch0.json"; how many.
int run_dir_foreign_outputs(const char *dir, char *buf, size_t cap);
bool run_dir_has_run(const RunDirContents *c);
// "ckpt-4.safetensors (the newest of 2 checkpoints), best.safetensors, metrics.jsonl".
void run_dir_describe(const RunDirContents *c, char *buf, size_t cap);
// DIR/ckpt-<step>.safetensors.
void run_dir_checkpoint_path(const char *dir, int64_t step, char *out, size_t cap);

// Renames DIR to DIR.old-<YYYYmmdd-HHMMSS>[-N] (a name not yet taken). Returns 0 with the new name
// in moved_to, or -1 with err set.
int run_dir_move_aside(const char *dir, char *moved_to, size_t moved_cap, char *err, size_t err_cap);

// What --resume auto continues: the step of the newest checkpoint in dir whose file is intact (the
// damaged ones are renamed *.damaged with a message on stderr), -1 when dir has none. Returns 0, or
// -1 with err set when every checkpoint is damaged.
int run_dir_newest_intact(const char *dir, int64_t *step, char *err, size_t err_cap);
// Whether the checkpoint file lies in dir (the same directory, however either is spelled).
bool run_dir_contains(const char *dir, const char *file);

// Cuts metrics.jsonl back to the lines of steps <= step (the lines of an interrupted run past its
// last checkpoint, which the resumed run logs again) and drops a last line cut off mid-write,
// atomically. A missing file is no error.
int run_dir_cut_metrics(const char *path, int64_t step, char *err, size_t err_cap);

// Removes the temporary files (NAME.tmp.PID, NAME a checkpoint, a results JSON or a picture) that a
// process which has ended (PID no longer running here) was writing when it was killed: a SIGKILL, or
// mpirun's kill a second after a Ctrl-C, cuts a checkpoint's write short, leaving a file as large
// as the checkpoint that nothing will ever read. A file of a process still running here stays, and
// so does one written to in the last minute (a writer on another host of a shared file system)
// unless `locked`: the caller holds the run's lock (train/run_lock.h), so no other run writes here.
// Says what it removed on stderr; returns how many.
int run_dir_remove_dead_temps(const char *dir, bool locked);

// Removes this run's checkpoints beyond the newest `keep` among those at steps <= current_step;
// never a checkpoint from past current_step (not this run's).
void run_dir_prune(const char *dir, int keep, int64_t current_step);

// DIR/results-epoch<E>.json: an evaluation's COCO results.
void run_dir_results_path(const char *dir, int64_t epoch, char *out, size_t cap);
// Whether name is results-epoch<E>.json (exactly), with E in *epoch.
bool run_dir_is_results(const char *name, int64_t *epoch);
// Removes the results files of the evaluations before `epoch` but keep_epoch's.
void run_dir_prune_results(const char *dir, int64_t epoch, int64_t keep_epoch);
