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

int cmd_train(int argc, char **argv) {
  TrainOptions o = train_options_default();
  const char *config = "detr-r18-small", *device = "cpu", *bad_input = "fail";
  CliList sets = {0};
  bool enact = false, no_progress = false, no_augment = false, calibrate_bn = false;
  long long epochs = -1, batch = o.batch_size, workers = o.workers, threads = 0, seed = (long long)o.seed,
            eval_every = o.eval_every, ckpt_every = 0, keep = o.keep_last, max_steps = 0, lr_drop = -1,
            image_size = -1, max_size = -1;
  double lr = o.optim.lr, lr_backbone = o.optim.lr_backbone, wd = o.optim.weight_decay, clip = o.optim.clip_max_norm;
  CliFlag flags[] = {
      {"data", FLAG_STRING, &o.data_dir, "dataset root (annotations/instances_<split>.json and <split>/)"},
      {"train-split", FLAG_STRING, &o.train_split, "training split name (default train; COCO: train2017)"},
      {"val-split", FLAG_STRING, &o.val_split, "validation split name (default val; COCO: val2017)"},
      {"config", FLAG_STRING, &config, "model preset (detr-r50, detr-r18-small, tiny) or key=value file (default detr-r18-small)"},
      {"set", FLAG_LIST, &sets, "override one model config field, e.g. --set num_queries=20"},
      {"enact", FLAG_BOOL, &enact, SETUP_ENACT_HELP},
      {"out", FLAG_STRING, &o.out_dir, "run directory (default runs/detr)"},
      {"epochs", FLAG_INT, &epochs, "epochs (default 300 for detr-r50, 50 for the small presets)"},
      {"batch", FLAG_INT, &batch, "images per batch (default 2)"},
      {"lr", FLAG_FLOAT, &lr, "learning rate (default 1e-4)"},
      {"lr-backbone", FLAG_FLOAT, &lr_backbone, "backbone learning rate (default 1e-5; 0 freezes the backbone)"},
      {"weight-decay", FLAG_FLOAT, &wd, "AdamW weight decay (default 1e-4)"},
      {"clip", FLAG_FLOAT, &clip, "gradient clipping max norm (default 0.1; 0 disables)"},
      {"lr-drop", FLAG_INT, &lr_drop, "epochs between learning-rate drops x0.1 (default 2/3 of --epochs)"},
      {"image-size", FLAG_INT, &image_size, "val shortest side; train scales follow (default 800, 320 small, 128 tiny)"},
      {"max-size", FLAG_INT, &max_size, "longest image side (default 1333, 512 small, 192 tiny)"},
      {"device", FLAG_STRING, &device, "cpu or cuda (default cpu)"},
      {"threads", FLAG_INT, &threads, "CPU threads (default: OMP_NUM_THREADS or all cores)"},
      {"workers", FLAG_INT, &workers, "data loader threads (default 2)"},
      {"seed", FLAG_INT, &seed, "seed of initialisation, data order, augmentation and dropout (default 42)"},
      {"eval-every", FLAG_INT, &eval_every, "epochs between COCO evaluations (default 1; 0: at the end only)"},
      {"checkpoint-every", FLAG_INT, &ckpt_every, "steps between checkpoints (default 0: every epoch)"},
      {"keep", FLAG_INT, &keep, "checkpoints kept besides best.safetensors (default 2)"},
      {"init", FLAG_STRING, &o.init_weights, "start from these model weights (safetensors, reference names)"},
      {"init-backbone", FLAG_STRING, &o.init_backbone,
       "start the backbone from this file (detr pretrain; its batch-norm statistics included)"},
      {"resume", FLAG_STRING, &o.resume, "auto (newest valid checkpoint in --out) or a checkpoint path"},
      {"max-steps", FLAG_INT, &max_steps, "stop after this many steps in total (default: no limit)"},
      {"bad-input", FLAG_STRING, &bad_input, "fail or skip (with a warning and a count) bad annotations/images"},
      {"calibrate-bn", FLAG_BOOL, &calibrate_bn,
       "training from scratch: set the frozen batch norms' statistics from 8 training images first"},
      {"no-augment", FLAG_BOOL, &no_augment, "train on the val transform (resize only): no flips, crops, scales"},
      {"no-progress", FLAG_BOOL, &no_progress, "no progress line"},
  };
  int n_flags = (int)(sizeof flags / sizeof flags[0]), n_pos = 0;
  int rc = cli_parse("train", USAGE, argc, argv, 2, flags, n_flags, NULL, 0, &n_pos);
  if (rc) return rc == 1 ? 0 : 2;
  char err[1024];
  if (!o.data_dir) {
    fprintf(stderr, "detr train: --data DIR is required (see detr train --help)\n");
    return 2;
  }
  if (setup_model_config(config, &sets, &o.model, err, sizeof err) || setup_device(device, &o.device, err, sizeof err)) {
    fprintf(stderr, "detr train: %s\n", err);
    return 2;
  }
  setup_enact_shortcut(&o.model, enact);
  if (bad_input_policy_parse(bad_input, &o.bad_input)) {
    fprintf(stderr, "detr train: --bad-input %s: expected fail or skip\n", bad_input);
    return 2;
  }
  bool small = o.model.backbone_depth < 50, tiny = o.model.hidden_dim <= 32;
  if (epochs < 0) epochs = small ? 50 : 300;
  if (image_size < 0) image_size = tiny ? 128 : small ? 320 : 800;
  if (max_size < 0) max_size = tiny ? 192 : small ? 512 : 1333;
  if (lr_drop < 0) lr_drop = epochs * 2 / 3 > 0 ? epochs * 2 / 3 : 1;
  const CliRange ranges[] = {
      {"epochs", epochs, 1, 100000}, {"batch", batch, 1, 64}, {"workers", workers, 0, 64},
      {"threads", threads, 0, 1024}, {"eval-every", eval_every, 0, 100000},
      {"checkpoint-every", ckpt_every, 0, 1LL << 40}, {"keep", keep, 1, 1000},
      {"max-steps", max_steps, 0, 1LL << 40}, {"lr-drop", lr_drop, 1, 1000000},
      {"image-size", image_size, 32, 4096}, {"max-size", max_size, 32, 8192}, {"seed", seed, 0, 1LL << 62}};
  if (cli_check_ranges("train", ranges, (int)(sizeof ranges / sizeof ranges[0]))) return 2;
  if (!(lr > 0 && lr_backbone >= 0 && wd >= 0 && clip >= 0)) {
    fprintf(stderr, "detr train: --lr must be > 0 and --lr-backbone, --weight-decay, --clip >= 0\n");
    return 2;
  }
  if (lr_backbone == 0) o.model.train_backbone = false;  // as the reference: lr_backbone 0 freezes it
  o.epochs = (int)epochs;
  o.batch_size = (int)batch;
  o.workers = (int)workers;
  o.threads = (int)threads;
  o.seed = (uint64_t)seed;
  o.eval_every = (int)eval_every;
  o.checkpoint_every = ckpt_every;
  o.keep_last = (int)keep;
  o.max_steps = max_steps;
  o.progress = !no_progress;
  o.calibrate_bn = calibrate_bn;
  o.optim.lr = (float)lr;
  o.optim.lr_backbone = (float)lr_backbone;
  o.optim.weight_decay = (float)wd;
  o.optim.clip_max_norm = (float)clip;
  o.optim.lr_drop = (int)lr_drop;
  o.train_aug = aug_config_scaled(!no_augment, (int)image_size, (int)max_size);
  o.val_aug = aug_config_scaled(false, (int)image_size, (int)max_size);
  size_t n = 0;  // the command line, stored in every checkpoint
  for (int i = 1; i < argc && n < sizeof o.train_config_text - 2; i++)
    n += (size_t)snprintf(o.train_config_text + n, sizeof o.train_config_text - n, "%s%s", i > 1 ? " " : "", argv[i]);
  return train_run(&o);
}
