// The training loop of `detr train`: AdamW with DETR's parameter groups, clipping, the step
// schedule, progress and JSON-lines metrics, evaluation every N epochs, atomic checkpoints
// (keep-last-K and best-by-AP) and exact resume.
#pragma once
#include <math.h>
#include <stdbool.h>

#include "api/model_file.h"  // RunSettings
#include "train/run_lock.h"
#include "datasets/loader.h"
#include "dist/dist.h"
#include "nn/criterion.h"
#include "nn/detr.h"
#include "train/optim.h"

// The loss and matcher weights of the reference's flags (--bbox_loss_coef, --set_cost_class, ...);
// NAN keeps the model's own (DETR: ce 1, bbox 5, giou 2, eos 0.1, costs 1/5/2; Conditional DETR:
// ce 2, class cost 2).
typedef struct {
  float ce, bbox, giou, eos, cost_class, cost_bbox, cost_giou;
} LossWeights;
#define LOSS_WEIGHTS_MODEL ((LossWeights){NAN, NAN, NAN, NAN, NAN, NAN, NAN})
void loss_weights_apply(const LossWeights *w, CriterionConfig *c);

typedef struct {
  DetrConfig model;
  OptimConfig optim;
  int epochs;
  int batch_size;
  int workers;
  int threads;  // OpenMP threads (0: leave as is)
  uint64_t seed;
  Device device;
  const char *data_dir;                 // DIR/annotations/instances_<split>.json[.gz] and DIR/<split>/
  const char *train_split, *val_split;  // val_split "none": no evaluation (and no best.safetensors)
  AugConfig train_aug, val_aug;
  int pad_multiple;  // batches padded to a multiple of this many pixels (LoaderConfig; 1: none)
  BadInputPolicy bad_input;
  const char *out_dir;            // run directory: metrics.jsonl, checkpoints, results, chart
  int eval_every;                 // epochs between evaluations (0: only at the end)
  int64_t checkpoint_every;       // steps between checkpoints (0: at the end of every epoch)
  int keep_last;                  // checkpoints kept (ckpt-<step>.safetensors), besides best.safetensors
  const char *init_weights;       // model weights or a checkpoint to start from (fine-tuning: train/finetune.c)
  const char *init_categories;    // the --init checkpoint's "id:name;..." (NULL: plain weights, unknown)
  bool init_partial;              // --init-partial: tensors that do not fit keep their initialisation (listed)
  bool model_from_init;           // the model config is the --init checkpoint's: num_classes follows the data
  const char *init_backbone;      // backbone weights to start from (`detr pretrain`; backbone.* tensors only)
  const char *resume;             // NULL or the checkpoint to resume (`detr train` resolves --resume auto)
  bool resume_auto;               // --resume auto was given (with no checkpoint: a run that never reached one restarts)
  const char *resume_categories;  // the resumed checkpoint's "id:name;..." (NULL: unknown)
  bool move_old_run;              // a run already in out_dir is renamed to out_dir.old-<time> first
  LossWeights loss;
  int64_t max_steps;             // stop after this many steps in total (0: no limit), e.g. for tests
  bool calibrate_bn;             // from scratch: set the frozen BN statistics from a batch before training
  bool progress;                 // progress bar on stderr
  char train_config_text[2048];  // the flags that made the run, stored in checkpoints
  RunSettings run;               // the settings resolved from them, stored typed in checkpoints
  bool seed_given;               // --seed was given (else a resumed run keeps its own)
  bool keep_all_results;         // every evaluation's results-epoch<E>.json (else the best's and the last's)
} TrainOptions;

TrainOptions train_options_default(void);
// Returns 0 on success, 1 on a failure (message printed; nothing already saved is lost), 130 or
// 143 after SIGINT or SIGTERM (the step in progress finished and checkpointed first).
// group: the processes that train together (dist_init's; DIST_SINGLE alone), every one of them
// calling this. lock: the run directory's lock where the caller took it already (resuming: before
// choosing the checkpoint), handed over to the run; NULL or not held: the run takes it.
int train_run(TrainOptions *o, const Dist *group, RunLock *lock);
