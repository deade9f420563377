// The training loop of `detr train`: AdamW with DETR's parameter groups, clipping, the step
// schedule, progress and JSON-lines metrics, evaluation every N epochs, atomic checkpoints
// (keep-last-K and best-by-AP) and exact resume.
#pragma once
#include <stdbool.h>

#include "datasets/loader.h"
#include "nn/detr.h"
#include "train/optim.h"

typedef struct {
  DetrConfig model;
  OptimConfig optim;
  int epochs;
  int batch_size;
  int workers;
  int threads;              // OpenMP threads (0: leave as is)
  uint64_t seed;
  Device device;
  const char *data_dir;     // DIR/annotations/instances_<split>.json[.gz] and DIR/<split>/
  const char *train_split, *val_split;
  AugConfig train_aug, val_aug;
  int pad_multiple;         // batches padded to a multiple of this many pixels (LoaderConfig; 1: none)
  BadInputPolicy bad_input;
  const char *out_dir;      // run directory: metrics.jsonl, checkpoints, results, chart
  int eval_every;           // epochs between evaluations (0: only at the end)
  int64_t checkpoint_every; // steps between checkpoints (0: at the end of every epoch)
  int keep_last;            // checkpoints kept (ckpt-<step>.safetensors), besides best.safetensors
  const char *init_weights; // model weights to start from (strict load; ENACT's W_prob optional)
  const char *init_backbone; // backbone weights to start from (`detr pretrain`; backbone.* tensors only)
  const char *resume;       // NULL, "auto" (newest valid checkpoint in out_dir) or a path
  int64_t max_steps;        // stop after this many steps in total (0: no limit), e.g. for tests
  bool calibrate_bn;        // from scratch: set the frozen BN statistics from a batch before training
  bool progress;            // progress bar on stderr
  char train_config_text[2048];  // the flags that made the run, stored in checkpoints
} TrainOptions;

TrainOptions train_options_default(void);
// Returns 0 on success, 1 on a failure (message printed; nothing already saved is lost).
int train_run(TrainOptions *o);
