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

// The training chart (chart.png: the loss and its 50-step running mean by step, AP and AP50 by
// epoch) from a metrics.jsonl file, rendered into *out (free it with image_free). Reads the lines
// this program writes; anything else is tolerated: unknown or overlong lines are skipped, a
// missing or unparsable number leaves a gap, and at most METRICS_CHART_MAX_STEPS train lines and
// METRICS_CHART_MAX_EVALS eval lines are drawn (the first ones). Returns 0, or -1 with err
// naming the file (cannot open, out of memory).
#define METRICS_CHART_MAX_STEPS (1 << 22)
#define METRICS_CHART_MAX_EVALS 512
int metrics_chart_render(const char *metrics_path, const char *title, Image *out, char *err, size_t err_cap);
