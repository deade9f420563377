// detr train: flags -> TrainOptions -> train_run (train/trainer.c).
#include <stdio.h>
#include <string.h>

#include "train/commands.h"
#include "train/setup.h"
#include "train/trainer.h"

static const char *USAGE =
    "--data DIR [--config PRESET|FILE] [--set key=value ...] [--enact] [--out DIR] [options]\n"
    "Trains DETR (or DETR+ENACT) on a COCO-format dataset: DIR/annotations/instances_<split>.json[.gz]\n"
    "and the images in DIR/<split>/ (`detr synth --out DIR` writes one). Metrics go to OUT/metrics.jsonl,\n"
    "checkpoints to OUT/ckpt-<step>.safetensors and OUT/best.safetensors.";

// The command line, stored in every checkpoint.
static void store_command_line(TrainOptions *o, int argc, char **argv) {
  size_t n = 0;
  for (int i = 1; i < argc && n < sizeof o->train_config_text - 2; i++)
    n += (size_t)snprintf(o->train_config_text + n, sizeof o->train_config_text - n, "%s%s", i > 1 ? " " : "", argv[i]);
}

// The model, device and input policy; the defaults that follow the model (model_run_defaults);
// the learning rates' constraints.
static int resolve(TrainOptions *o, const char *config, const CliList *sets, bool enact, const char *device,
                   const char *bad_input, int image_size, int max_size, bool augment) {
  char err[1024];
  if (setup_model_config(config, sets, &o->model, err, sizeof err) || setup_device(device, &o->device, err, sizeof err)) {
    fprintf(stderr, "detr train: %s\n", err);
    return 2;
  }
  setup_enact_shortcut(&o->model, enact);
  if (bad_input_policy_parse(bad_input, &o->bad_input)) {
    fprintf(stderr, "detr train: --bad-input %s: expected fail or skip\n", bad_input);
    return 2;
  }
  const OptimConfig *oc = &o->optim;
  if (!(oc->lr > 0 && oc->lr_backbone >= 0 && oc->weight_decay >= 0 && oc->clip_max_norm >= 0)) {
    fprintf(stderr, "detr train: --lr must be > 0 and --lr-backbone, --weight-decay, --clip >= 0\n");
    return 2;
  }
  if (oc->lr_backbone == 0) o->model.train_backbone = false;  // as the reference: lr_backbone 0 freezes it
  const RunDefaults *d = model_run_defaults(&o->model);
  if (o->epochs < 0) o->epochs = d->epochs;
  if (o->optim.lr_drop < 0)
    o->optim.lr_drop = d->lr_drop > 0 && o->epochs == d->epochs ? d->lr_drop : o->epochs * 2 / 3 > 0 ? o->epochs * 2 / 3 : 1;
  if (image_size < 0) image_size = d->image_size;
  if (max_size < 0) max_size = d->max_size;
  o->train_aug = aug_config_scaled(augment, image_size, max_size);
  o->val_aug = aug_config_scaled(false, image_size, max_size);
  return 0;
}

int cmd_train(int argc, char **argv) {
  TrainOptions o = train_options_default();
  o.epochs = o.optim.lr_drop = -1;  // from the model (resolve)
  const char *config = "detr-r18-small", *device = "cpu", *bad_input = "fail";
  CliList sets = {0};
  bool enact = false, no_progress = false, no_augment = false;
  int image_size = -1, max_size = -1;
  CliFlag flags[] = {
      {"data", FLAG_STRING, &o.data_dir, "dataset root (annotations/instances_<split>.json and <split>/)"},
      {"train-split", FLAG_STRING, &o.train_split, "training split name (default train; COCO: train2017)"},
      {"val-split", FLAG_STRING, &o.val_split, "validation split name (default val; COCO: val2017)"},
      {"config", FLAG_STRING, &config, "model preset (" DETR_PRESET_LIST ") or key=value file (default detr-r18-small)"},
      {"set", FLAG_LIST, &sets, "override one model config field, e.g. --set num_queries=20"},
      {"enact", FLAG_BOOL, &enact, SETUP_ENACT_HELP},
      {"out", FLAG_STRING, &o.out_dir, "run directory (default runs/detr)"},
      {"epochs", FLAG_I32, &o.epochs, "epochs (default 300 for detr-r50, 50 for the small presets)", 1, 100000},
      {"batch", FLAG_I32, &o.batch_size, "images per batch (default 2)", 1, 64},
      {"lr", FLAG_F32, &o.optim.lr, "learning rate (default 1e-4)"},
      {"lr-backbone", FLAG_F32, &o.optim.lr_backbone, "backbone learning rate (default 1e-5; 0 freezes the backbone)"},
      {"weight-decay", FLAG_F32, &o.optim.weight_decay, "AdamW weight decay (default 1e-4)"},
      {"clip", FLAG_F32, &o.optim.clip_max_norm, "gradient clipping max norm (default 0.1; 0 disables)"},
      {"lr-drop", FLAG_I32, &o.optim.lr_drop, "epochs between learning-rate drops x0.1 (default 2/3 of --epochs)", 1,
       1000000},
      {"image-size", FLAG_I32, &image_size, "val shortest side; train scales follow (default 800, 320 small, 128 tiny)",
       32, 4096},
      {"max-size", FLAG_I32, &max_size, "longest image side (default 1333, 512 small, 192 tiny)", 32, 8192},
      {"pad-multiple", FLAG_I32, &o.pad_multiple,
       "pad each batch to a multiple of N pixels (default 1: to its largest image, as the reference; e.g. 16: "
       "fewer distinct input sizes, faster on the CPU)", 1, 256},
      {"device", FLAG_STRING, &device, "cpu or cuda (default cpu)"},
      {"threads", FLAG_I32, &o.threads, "CPU threads (default: OMP_NUM_THREADS, or the cores other processes leave free)", 0, 1024},
      {"workers", FLAG_I32, &o.workers, "data loader threads (default 2)", 0, 64},
      {"seed", FLAG_U64, &o.seed, "seed of initialisation, data order, augmentation and dropout (default 42)", 0,
       1LL << 62},
      {"eval-every", FLAG_I32, &o.eval_every, "epochs between COCO evaluations (default 1; 0: at the end only)", 0,
       100000},
      {"checkpoint-every", FLAG_I64, &o.checkpoint_every, "steps between checkpoints (default 0: every epoch)", 0,
       1LL << 40},
      {"keep", FLAG_I32, &o.keep_last, "checkpoints kept besides best.safetensors (default 2)", 1, 1000},
      {"init", FLAG_STRING, &o.init_weights, "start from these model weights (safetensors, reference names)"},
      {"init-backbone", FLAG_STRING, &o.init_backbone,
       "start the backbone from this file (detr pretrain; its batch-norm statistics included)"},
      {"resume", FLAG_STRING, &o.resume, "auto (newest valid checkpoint in --out) or a checkpoint path"},
      {"max-steps", FLAG_I64, &o.max_steps, "stop after this many steps in total (default: no limit)", 0, 1LL << 40},
      {"bad-input", FLAG_STRING, &bad_input, "fail or skip (with a warning and a count) bad annotations/images"},
      {"calibrate-bn", FLAG_BOOL, &o.calibrate_bn,
       "training from scratch: set the frozen batch norms' statistics from 8 training images first"},
      {"no-augment", FLAG_BOOL, &no_augment, "train on the val transform (resize only): no flips, crops, scales"},
      {"no-progress", FLAG_BOOL, &no_progress, "no progress line"},
  };
  int n_flags = (int)(sizeof flags / sizeof flags[0]), n_pos = 0;
  int rc = cli_parse("train", USAGE, argc, argv, 2, flags, n_flags, NULL, 0, &n_pos);
  if (rc) return rc == 1 ? 0 : 2;
  if (!o.data_dir) {
    fprintf(stderr, "detr train: --data DIR is required (see detr train --help)\n");
    return 2;
  }
  if (resolve(&o, config, &sets, enact, device, bad_input, image_size, max_size, !no_augment)) return 2;
  o.progress = !no_progress;
  store_command_line(&o, argc, argv);
  return train_run(&o);
}
