// Training checkpoints: one safetensors file holding the model under its reference names, the
// AdamW moments ("optim.exp_avg.<name>", "optim.exp_avg_sq.<name>"), and in __metadata__ the
// training state (step, epoch, data position, RNG states, best mAP), the model config and a crc32
// of every tensor's name and bytes, so a truncated or corrupted file is detected on load. Writes
// are atomic (temp file, fsync, rename): a crash mid-write leaves the previous checkpoint intact.
#pragma once
#include "api/model_file.h"  // RunSettings
#include "nn/detr.h"
#include "train/optim.h"

typedef struct {
  int64_t step;          // optimizer steps taken
  int64_t epoch;         // current epoch
  int64_t next_batch;    // data position: the next batch of `epoch` to train on
  uint64_t seed;         // the run's seed (data order, augmentation)
  Rng dropout_rng;       // the dropout stream's state
  double best_map;       // best evaluation AP so far (-1 if none)
  int64_t best_epoch;    // the epoch of that evaluation (-1: none, or a checkpoint that did not say)
  int world_size;        // processes of the run (data parallel), 1 without
  int64_t global_batch;  // images per step over all processes (0: not recorded)
  RunSettings run;       // the run's settings (run.known false: not written; set by no training run)
} TrainState;

// extra_config: the command line that made the run; categories: "id:name;id:name;..." of the
// training data (predict names classes with it). Either may be NULL.
int checkpoint_save(const char *path, const DetrModel *model, const AdamW *opt, const TrainState *state,
                    const char *extra_config, const char *categories, char *err, size_t err_cap);
// Loads into an existing model and optimizer of the checkpoint's configuration. Refuses (with the
// reason and the file) a truncated, corrupted or foreign file, or one that does not fit.
int checkpoint_load(const char *path, DetrModel *model, AdamW *opt, TrainState *state, char *err, size_t err_cap);
// Reads only the stored configs (model config text and the training config text), for resuming
// with the same settings and for `detr info`. Returns 0 or -1 with err set. Caller frees *texts.
int checkpoint_read_configs(const char *path, char **model_config, char **train_config, char *err, size_t err_cap);
