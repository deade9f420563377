// detr eval: COCO bbox evaluation of a checkpoint or weights on a dataset split.
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/out_file.h"
#include "cli/setup.h"
#include "dist/dist.h"
#include "eval/evaluate.h"
#include "kernels/cpu/cpu_kernels.h"
#include "train/cpu_share.h"
#include "train/data_layout.h"

static const char *USAGE =
    "(--checkpoint C.safetensors | --weights W.safetensors [--config PRESET|FILE] [--set k=v ...] [--enact])\n"
    "       --data DIR [--split val] [--results R.json] [--json OUT.json] [--image-size N] [--max-size M]\n"
    "       [--batch B] [--workers W] [--threads T] [--device cpu|cuda] [--bad-input fail|skip]\n"
    "       [--allow-other-categories]\n"
    "Prints the 12 COCO numbers as pycocotools does; --results writes the detections as a COCO results\n"
    "JSON, --json the numbers as {\"AP\": ..., ..., \"ARl\": ...}. With --checkpoint the defaults of\n"
    "--image-size, --max-size, --pad-multiple and --batch are the training run's, so the numbers are the\n"
    "run's own evaluation's (a DETR's output depends on the padding, which depends on the batch).";

// Opens the split's annotations into *ds and compares their categories with those the checkpoint
// (ci) was trained on: 1 with a message when the file cannot be opened or the category ids differ
// without --allow-other-categories; a warning when only the names differ.
static int open_eval_data(const Dist *g, const char *data, const char *split, BadInputPolicy policy,
                          const char *checkpoint, const CheckpointInfo *ci, bool other_categories, CocoDataset **ds) {
  char ann[4096], img[4096];
  setup_split_paths(data, split, ann, sizeof ann, img, sizeof img);
  CocoOpenConfig cc = {.ann_path = ann, .image_dir = img, .policy = policy};
  DataError derr;
  if (coco_open(&cc, ds, &derr)) {
    fprintf(stderr, "detr eval: %s\n", derr.msg);
    return 1;
  }
  char diff[1024];
  int same = categories_compare(ci->categories, *ds, diff, sizeof diff);
  if (same == 2 && !other_categories) {
    fprintf(stderr,
            "detr eval: %s: the category ids differ from those %s was trained on (%s): AP against them "
            "would be meaningless (--allow-other-categories evaluates anyway)\n",
            ann, checkpoint, diff);
    coco_free(*ds);
    return 1;
  }
  if (same && dist_is_main(g))
    fprintf(stderr, "detr eval: warning: %s: the categories differ from %s's: %s\n", ann, checkpoint, diff);
  return 0;
}

// Evaluates m on ds; rank 0 (the only process without mpirun) prints the timing, the encoder
// attention statistics and the 12 numbers, and writes them to json if asked. 0, or 1 with a message.
static int evaluate_and_report(const DetrModel *m, const CocoDataset *ds, const EvalConfig *ec, long long batch,
                               long long pad_multiple, const char *json) {
  char err[4608];
  EvalReport rep;
  int rc = evaluate_model(m, ds, ec, &rep, err, sizeof err);
  if (rc == 0 && dist_is_main(&ec->dist)) {  // under mpirun the processes split the images; rank 0 reports
    fprintf(stderr,
            "detr eval: %lld images in batches of %lld (padded to multiples of %lld), %lld detections in "
            "%.1f s\n",
            (long long)rep.images, batch, pad_multiple, (long long)rep.detections, rep.seconds);
    for (int i = 0; i < rep.attn.n; i++)
      fprintf(stderr, "detr eval: encoder attention %s %.2f\n", rep.attn.name[i], attn_stats_mean(&rep.attn, i));
    coco_print_summary(&rep.coco, stdout);
    if (json) rc = coco_write_stats_json(json, &rep.coco, err, sizeof err);
  }
  if (rc) fprintf(stderr, "detr eval: %s\n", err);
  return rc ? 1 : 0;
}

// Before the evaluation: a --results or --json that would replace an input (or the other) fails
// now, not after it. Returns 0, or -1 with err set.
static int check_outputs(const char *data, const char *split, const char *checkpoint, const char *weights,
                         const char *config, const char *results, const char *json, char *err, size_t err_cap) {
  char ann[4200], img[4200];
  setup_split_paths(data, split, ann, sizeof ann, img, sizeof img);
  const char *inputs[] = {ann, checkpoint, weights, config};
  static const JsonShape detections = {'[', "\"image_id\""}, numbers = {'{', "\"AP\""};
  if ((results && out_file_check(results, "results", &detections, inputs, 4, err, err_cap)) ||
      (json && out_file_check(json, "json", &numbers, inputs, 4, err, err_cap)))
    return -1;
  if (results && json && out_file_same(results, json)) {
    snprintf(err, err_cap, "--results and --json name one file, %s", json);
    return -1;
  }
  return 0;
}

// The flags of `detr eval`, with their defaults.
typedef struct {
  const char *checkpoint, *weights, *config, *data, *split, *results, *json, *device, *bad_input, *precision;
  CliList sets;
  bool enact, other_categories;
  long long image_size, max_size, pad_multiple, batch, workers;  // -1: from the checkpoint's training run
  int threads;
} EvalArgs;

// Evaluates a loaded model on the flags' data: sizes, batch and padding from the flags, else from
// the checkpoint's training run (ci). Frees the model and ci.
static int eval_loaded_model(const Dist *job, DetrModel *m, CheckpointInfo *ci, EvalArgs *a, BadInputPolicy policy) {
  detr_model_prepare_inference(m);  // evaluation only (docs/inference.md)
  int is, ms;                       // the training run's sizes when the checkpoint says them
  model_eval_sizes(&m->cfg, ci, &is, &ms);
  if (a->pad_multiple < 0) a->pad_multiple = ci->run.known ? ci->run.pad_multiple : 1;
  if (a->batch < 0) a->batch = ci->run.known ? ci->run.batch : CHECKPOINT_TRAIN_DEFAULT_BATCH;
  if (a->image_size > 0) is = (int)a->image_size;
  if (a->max_size > 0) ms = (int)a->max_size;
  CocoDataset *ds = NULL;
  int rc = open_eval_data(job, a->data, a->split, policy, a->checkpoint, ci, a->other_categories, &ds);
  checkpoint_info_free(ci);
  if (rc) {
    detr_model_free(m);
    return 1;
  }
  CpuShare cpu;  // a fixed --threads; else OpenMP's default (no adapting: an evaluation is short)
  cpu_share_init(&cpu, a->threads);
  cpu_flush_denormals(true);
  EvalConfig ec = {.batch_size = (int)a->batch,
                   .num_workers = (int)a->workers,
                   .aug = aug_config_scaled(false, is, ms),
                   .pad_multiple = (int)a->pad_multiple,
                   .policy = policy,
                   .results_path = a->results,
                   .dist = *job};
  ec.aug.resize_transformers = m->cfg.resize_transformers;
  ec.progress = dist_is_main(&ec.dist);
  rc = evaluate_and_report(m, ds, &ec, a->batch, a->pad_multiple, a->json);
  coco_free(ds);
  detr_model_free(m);
  return rc;
}

int cmd_eval(int argc, char **argv, const Dist *job) {
  EvalArgs a = {.config = SETUP_DEFAULT_PRESET,
                .split = "val",
                .device = "cpu",
                .bad_input = "fail",
                .image_size = -1,
                .max_size = -1,
                .pad_multiple = -1,
                .batch = -1,
                .workers = 2};
  CliFlag flags[] = {
      {"checkpoint", FLAG_STRING, &a.checkpoint, "a detr-c checkpoint (its config is used)"},
      {"weights", FLAG_STRING, &a.weights, "model weights (safetensors, reference or transformers names)"},
      {"config", FLAG_STRING, &a.config,
       "model preset (" DETR_PRESET_LIST ") or key=value file, with --weights (default " SETUP_DEFAULT_PRESET ")"},
      {"set", FLAG_LIST, &a.sets, "override one config field, with --weights"},
      {"enact", FLAG_BOOL, &a.enact, SETUP_ENACT_HELP},
      {"precision", FLAG_STRING, &a.precision, SETUP_PRECISION_HELP},
      {"data", FLAG_STRING, &a.data, "dataset root (annotations/instances_<split>.json and <split>/)"},
      {"split", FLAG_STRING, &a.split, "split name (default val)"},
      {"results", FLAG_STRING, &a.results, "write the detections as a COCO results JSON"},
      {"json", FLAG_STRING, &a.json, "write the 12 numbers as a JSON object"},
      {"image-size", FLAG_INT, &a.image_size,
       "shortest side (default: the checkpoint's training run, else as detr train)"},
      {"max-size", FLAG_INT, &a.max_size, "longest side (default from the model)"},
      {"pad-multiple", FLAG_INT, &a.pad_multiple,
       "pad each batch to a multiple of N pixels, 1..256 (default: the checkpoint's training run, else 1)", 1, 256},
      {"batch", FLAG_INT, &a.batch, "images per batch (default: the checkpoint's training run, else 2)", 1, 64},
      {"workers", FLAG_INT, &a.workers, "loader threads (default 2)", 0, 64},
      {"threads", FLAG_I32, &a.threads, "CPU threads (default: OMP_NUM_THREADS, or every core)", 0, 1024},
      {"device", FLAG_STRING, &a.device, "cpu or cuda"},
      {"bad-input", FLAG_STRING, &a.bad_input, "fail or skip unreadable images"},
      {"allow-other-categories", FLAG_BOOL, &a.other_categories,
       "evaluate even when the data's category ids differ from the checkpoint's"},
  };
  int n_pos = 0,
      rc = cli_parse("eval", USAGE, argc, argv, 2, flags, (int)(sizeof flags / sizeof flags[0]), NULL, 0, &n_pos);
  if (rc) return rc == 1 ? 0 : 2;
  char err[4608];
  BadInputPolicy policy;
  Device dev;
  if (!a.data || bad_input_policy_parse(a.bad_input, &policy)) {
    fprintf(stderr, "detr eval: %s (see detr eval --help)\n",
            !a.data ? "--data DIR is required" : "--bad-input: expected fail or skip");
    return 2;
  }
  if (setup_check_split_layout(a.data, a.split, "--split", err, sizeof err) ||
      setup_device(job, a.device, &dev, err, sizeof err) ||
      setup_precision(a.precision, true, dev, &a.sets, err, sizeof err) ||
      setup_enact(a.enact, &a.sets, err, sizeof err) ||
      check_outputs(a.data, a.split, a.checkpoint, a.weights, a.config, a.results, a.json, err, sizeof err)) {
    fprintf(stderr, "detr eval: %s\n", err);
    return 2;
  }
  DetrModel *m;
  CheckpointInfo ci = {0};
  if (setup_load_model(a.checkpoint, a.weights, a.config, &a.sets, dev, &m, &ci, err, sizeof err)) {
    fprintf(stderr, "detr eval: %s\n", err);
    return 1;
  }
  return eval_loaded_model(job, m, &ci, &a, policy);
}
