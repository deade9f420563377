// detr train: flags -> TrainOptions -> train_run (train/trainer.c).
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/commands.h"
#include "cli/setup.h"
#include "dist/dist.h"
#include "tensor/safetensors.h"
#include "train/run_dir.h"
#include "train/trainer.h"

static const char *USAGE =
    "--data DIR [--config PRESET|FILE] [--set key=value ...] [--enact] [--out DIR] [options]\n"
    "Trains DETR (or DETR+ENACT) on a COCO-format dataset: DIR/annotations/instances_<split>.json[.gz]\n"
    "and the images in DIR/<split>/ (`detr synth --out DIR` writes one). Metrics go to OUT/metrics.jsonl,\n"
    "checkpoints to OUT/ckpt-<step>.safetensors and OUT/best.safetensors. OUT must not hold another run:\n"
    "--resume auto continues it (its model config from the checkpoint), --move-old-run renames it first.\n"
    "The progress line: [bar] step S/T (steps done, of those this run takes) epoch E (of 0-K, from 0 as in\n"
    "metrics.jsonl), images per second, the time left, the loss and its ce, bbox and giou terms, and the\n"
    "encoder attention's statistics (ENACT: clusters per image, N/L pixels per cluster; docs/training.md).";

static bool has_flag(int argc, char **argv, const char *flag) {
  size_t len = strlen(flag);
  for (int i = 1; i < argc; i++)
    if (!strncmp(argv[i], flag, len) && (argv[i][len] == 0 || argv[i][len] == '=')) return true;
  return false;
}

// word as the shell reads it back: as it is when every character is one the shell takes literally,
// else in single quotes (a ' inside as '\''), so that the resume command printed from the stored
// command line can be pasted whatever the paths hold (spaces, $, quotes). NULL when it does not fit.
static const char *shell_word(const char *word, char *out, size_t cap) {
  if (*word && strspn(word, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-") == strlen(word))
    return word;
  size_t n = 0;
  out[n++] = '\'';
  for (const char *c = word; *c; c++) {
    const char *piece = *c == '\'' ? "'\\''" : NULL;
    size_t len = piece ? 4 : 1;
    if (n + len + 2 > cap) return NULL;
    if (piece) memcpy(out + n, piece, len);
    else out[n] = *c;
    n += len;
  }
  out[n++] = '\'';
  out[n] = 0;
  return out;
}

// Appends " word" (no space first), quoted for the shell, when it fits whole: a value cut off
// would read as another one.
static bool append_word(char *text, size_t cap, size_t *n, const char *word) {
  char quoted[4200];
  const char *w = shell_word(word, quoted, sizeof quoted);
  if (!w) return false;
  size_t len = strlen(w) + (*n ? 1 : 0);
  if (*n + len >= cap) return false;
  *n += (size_t)snprintf(text + *n, cap - *n, "%s%s", *n ? " " : "", w);
  return true;
}

// The command line, stored in every checkpoint (`detr info` shows it, the resume hint prints it
// again), with the batch, padding and input sizes it ran with where it did not say them, right after
// the verb so that they are never the part cut off. (What a resumed run and `detr eval` read back is
// the typed run settings.)
static void store_command_line(TrainOptions *o, int argc, char **argv, int image_size, int max_size) {
  char *text = o->train_config_text;
  size_t n = 0, cap = sizeof o->train_config_text;
  text[0] = 0;
  append_word(text, cap, &n, argv[1]);
  const struct {
    const char *flag;
    int value;
  } ran_with[] = {{"--batch", o->batch_size},
                  {"--pad-multiple", o->pad_multiple},
                  {"--image-size", image_size},
                  {"--max-size", max_size}};
  for (size_t k = 0; k < sizeof ran_with / sizeof ran_with[0]; k++) {
    char value[24];
    snprintf(value, sizeof value, "%d", ran_with[k].value);
    if (!has_flag(argc, argv, ran_with[k].flag) && n + strlen(ran_with[k].flag) + strlen(value) + 2 < cap) {
      append_word(text, cap, &n, ran_with[k].flag);
      append_word(text, cap, &n, value);
    }
  }
  for (int i = 2; i < argc && append_word(text, cap, &n, argv[i]); i++) {}
}

// What --resume continues: the checkpoint (auto: the newest intact one in --out, none in an empty
// directory) and what it says of its run. Rank 0 picks (and renames damaged files); the other
// ranks take its step. Returns 0 (o->resume NULL: nothing to resume) or -1 on every rank.
static int find_resume(const Dist *g, TrainOptions *o, char *path, size_t cap, CheckpointInfo *ci, char *err,
                       size_t err_cap) {
  path[0] = 0;
  if (!o->resume) return 0;
  o->resume_auto = !strcmp(o->resume, "auto");
  if (o->resume_auto) {
    int64_t step = -1;
    int rc = dist_is_main(g) ? run_dir_newest_intact(o->out_dir, &step, err, err_cap) : 0;
    uint64_t shared[2] = {rc != 0, (uint64_t)(step + 1)};  // the max over ranks: rank 0's
    dist_allreduce_max_u64(g, shared, 2);
    if (shared[0]) {
      if (!dist_is_main(g)) snprintf(err, err_cap, "see the message of rank 0");
      return -1;
    }
    if (shared[1] == 0) {
      if (dist_is_main(g)) fprintf(stderr, "detr train: --resume auto: no checkpoint in %s: a new run\n", o->out_dir);
      o->resume = NULL;
      return 0;
    }
    run_dir_checkpoint_path(o->out_dir, (int64_t)shared[1] - 1, path, cap);
  } else {
    snprintf(path, cap, "%s", o->resume);
  }
  StFile *f = st_open(path, err, err_cap);
  int rc = f ? checkpoint_info_read(f, ci, err, err_cap) : -1;
  st_close(f);
  o->resume = path;
  o->resume_categories = ci->categories;
  return dist_all_ok(g, rc == 0) ? 0 : -1;
}

// --init FILE: when it is a checkpoint, what its run says (the model, its classes, its sizes).
// Returns 0 (ci->cfg valid only when *is_checkpoint) or -1.
static int read_init(const TrainOptions *o, CheckpointInfo *ci, bool *is_checkpoint, char *err, size_t err_cap) {
  *is_checkpoint = false;
  if (o->resume || !o->init_weights) return 0;
  StFile *f = st_open(o->init_weights, err, err_cap);
  if (!f) return -1;
  int rc = 0;
  if (checkpoint_is(f)) {
    rc = checkpoint_info_read(f, ci, err, err_cap);
    *is_checkpoint = rc == 0;
  }
  st_close(f);
  return rc;
}

// The keys whose values differ between two configs' "key=value" lines (detr_config_format),
// compared by key: " key=A in the checkpoint, key=B here;" each.
static size_t config_differences(const DetrConfig *here, const DetrConfig *checkpoint, char *out, size_t cap) {
  char mine[4096], theirs[4096];
  DetrConfig same_math = *here;  // the precision says how the model is computed, not which: it may change
  same_math.tf32 = checkpoint->tf32, same_math.bf16 = checkpoint->bf16;
  detr_config_format(&same_math, mine, sizeof mine);
  detr_config_format(checkpoint, theirs, sizeof theirs);
  size_t n = 0;
  out[0] = 0;
  for (int side = 0; side < 2; side++) {  // keys of mine (changed or new), then keys only in theirs
    const char *a = side ? theirs : mine, *b = side ? mine : theirs;
    for (const char *line = a; *line; line += strcspn(line, "\n") + (line[strcspn(line, "\n")] == '\n')) {
      size_t len = strcspn(line, "\n"), key = strcspn(line, "=");
      if (key >= len) continue;
      const char *other = NULL;  // the line of b with the same key
      for (const char *l = b; *l && !other; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] == '\n'))
        if (!strncmp(l, line, key + 1)) other = l;
      size_t olen = other ? strcspn(other, "\n") : 0;
      if (side == 1 && other) continue;  // compared from mine
      if (other && olen == len && !strncmp(other, line, len)) continue;
      if (n >= cap) break;
      if (side == 1) n += (size_t)snprintf(out + n, cap - n, " %.*s in the checkpoint only;", (int)len, line);
      else if (!other) n += (size_t)snprintf(out + n, cap - n, " %.*s here only;", (int)len, line);
      else
        n +=
            (size_t)snprintf(out + n, cap - n, " %.*s in the checkpoint, %.*s here;", (int)olen, other, (int)len, line);
    }
  }
  return n;
}

// The model: the checkpoint's (resumed, or fine-tuned without --config) with --set/--enact over
// it, else --config's (the default preset without one) with them.
static int model_config(TrainOptions *o, const char *config, const CliList *sets, const CheckpointInfo *ci, char *err,
                        size_t err_cap) {
  if (ci && !config) {
    o->model = ci->cfg;
    if (setup_apply_sets(&o->model, sets, err, err_cap)) return -1;
  } else if (setup_model_config(config ? config : SETUP_DEFAULT_PRESET, sets, &o->model, err, err_cap)) {
    return -1;
  }
  if (o->optim.lr_backbone == 0) o->model.train_backbone = false;  // as the reference: lr_backbone 0 freezes it
  if (o->resume) {  // a resumed run is its checkpoint's model: --config/--set may only restate it
    // ... and goes on in its precision unless --precision or --set says otherwise.
    if (!detr_config_sets_name(sets->items, sets->count, "tf32")) o->model.tf32 = ci->cfg.tf32;
    if (!detr_config_sets_name(sets->items, sets->count, "bf16")) o->model.bf16 = ci->cfg.bf16;
    char diff[2048];
    if (config_differences(&o->model, &ci->cfg, diff, sizeof diff)) {
      snprintf(err, err_cap,
               "%s is a run of another model config:%s resume it without --config/--set (its config is "
               "read from the checkpoint), or start this model in a new directory with --out NEW_DIR",
               o->resume, diff);
      return -1;
    }
  } else if (ci && !config) {  // fine-tuning a checkpoint's model: num_classes follows the data unless set
    o->model.train_backbone = o->optim.lr_backbone > 0;
    o->model_from_init = !detr_config_sets_name(sets->items, sets->count, "num_classes");
  }
  return detr_config_validate(&o->model, err, err_cap);
}

// The model, device and input policy; the defaults that follow the model (detr_run_defaults)
// or, when resuming (or fine-tuning without --config), the checkpoint's run settings; the learning
// rates' constraints.
// ci: the resumed checkpoint's info, or the --init checkpoint's (fine-tuning), or NULL.
static int resolve(const Dist *job, TrainOptions *o, const char *config, const CliList *sets, bool enact,
                   const char *device, const char *precision, const char *bad_input, int *image_size_io,
                   int *max_size_io, bool augment, const CheckpointInfo *ci) {
  int image_size = *image_size_io, max_size = *max_size_io;
  char err[4608];
  CliList all_sets = *sets;  // with --precision's keys, then --enact's, last
  if (setup_device(job, device, &o->device, err, sizeof err) ||
      setup_precision(precision, false, o->device, &all_sets, err, sizeof err) ||
      setup_enact(enact, &all_sets, err, sizeof err)) {
    fprintf(stderr, "detr train: %s\n", err);
    return 2;
  }
  if (model_config(o, config, &all_sets, ci, err, sizeof err)) {
    fprintf(stderr, "detr train: %s\n", err);
    return o->resume ? 1 : 2;
  }
  if (!o->resume && ci) o->init_categories = ci->categories;
  if (bad_input_policy_parse(bad_input, &o->bad_input)) {
    fprintf(stderr, "detr train: --bad-input %s: expected fail or skip\n", bad_input);
    return 2;
  }
  const OptimConfig *oc = &o->optim;
  if (!(oc->lr > 0 && oc->lr_backbone >= 0 && oc->weight_decay >= 0 && oc->clip_max_norm >= 0)) {
    fprintf(stderr, "detr train: --lr must be > 0 and --lr-backbone, --weight-decay, --clip >= 0\n");
    return 2;
  }
  const LossWeights *w = &o->loss;
  const float weights[] = {w->ce, w->bbox, w->giou, w->eos, w->cost_class, w->cost_bbox, w->cost_giou};
  for (size_t i = 0; i < sizeof weights / sizeof weights[0]; i++)
    if (!(isnan(weights[i]) || (weights[i] >= 0 && weights[i] < 1e6f))) {
      fprintf(stderr,
              "detr train: the loss and matcher weights (--*-loss-coef, --eos-coef, --cost-*) lie in [0, 1e6)\n");
      return 2;
    }
  const RunDefaults *d = detr_run_defaults(&o->model);
  if (ci && ci->run.known && (o->resume || !config)) {  // the run's settings, where this command gives none
    if (image_size < 0) image_size = ci->run.image_size;
    if (max_size < 0) max_size = ci->run.max_size;
    if (o->pad_multiple < 0) o->pad_multiple = ci->run.pad_multiple;
    if (o->resume && o->batch_size < 0) o->batch_size = ci->run.batch;
  }
  if (o->pad_multiple < 1 || o->pad_multiple > 256) o->pad_multiple = 1;
  if (o->batch_size < 0) o->batch_size = CHECKPOINT_TRAIN_DEFAULT_BATCH;
  if (o->epochs < 0) o->epochs = d->epochs;
  if (o->optim.lr_drop < 0)
    o->optim.lr_drop = d->lr_drop > 0 && o->epochs == d->epochs ? d->lr_drop
                       : o->epochs * 2 / 3 > 0                  ? o->epochs * 2 / 3
                                                                : 1;
  if (image_size < 32) image_size = d->image_size;
  if (max_size < 32) max_size = d->max_size;
  o->train_aug = aug_config_scaled(augment, image_size, max_size);
  o->val_aug = aug_config_scaled(false, image_size, max_size);
  o->train_aug.resize_transformers = o->val_aug.resize_transformers = o->model.resize_transformers;
  *image_size_io = image_size;
  *max_size_io = max_size;
  return 0;
}

// The settings of detr train's flags that resolve() turns into TrainOptions.
typedef struct {
  const char *config, *device, *bad_input, *precision;
  CliList sets;
  bool enact, no_progress, no_augment;
  int image_size, max_size;
} TrainFlags;

// A float setting as a person writes it (5e-4, not 0.000500000024), unless that would hide a difference.
static void setting_text(double v, char *out, size_t cap) {
  if (isnan(v)) snprintf(out, cap, "the model's");
  else if (snprintf(out, cap, "%g", v), (float)strtod(out, NULL) != (float)v) snprintf(out, cap, "%.9g", v);
}

// Appends " --flag VALUE (the run's: STORED)" to the list of settings this command changes.
static void note_change(char *out, size_t cap, size_t *n, const char *flag, double now, double stored) {
  if (*n >= cap) return;
  char a[32], b[32];
  setting_text(now, a, sizeof a);
  setting_text(stored, b, sizeof b);
  *n += (size_t)snprintf(out + *n, cap - *n, " %s %s (the run's: %s);", flag, a, b);
}

// The run settings a flag sets: the flag, the setting's place in RunSettings, and where detr train
// keeps its value (a float or an int option). continue_run restores a resumed run's settings through
// this list and run_settings_of records this run's, so the two cannot name a flag differently.
typedef struct {
  const char *flag;
  size_t offset;  // in RunSettings
  float *f;       // the option: one of f and i
  int *i;
} SettingBinding;

enum { N_SETTING_BINDINGS = 16 };

static void setting_bindings(TrainOptions *o, TrainFlags *f, SettingBinding out[N_SETTING_BINDINGS]) {
#define FLOAT_SETTING(flag, field, option) \
  { flag, offsetof(RunSettings, field), option, NULL }
#define INT_SETTING(flag, field, option) \
  { flag, offsetof(RunSettings, field), NULL, option }
  const SettingBinding all[] = {
      FLOAT_SETTING("--lr", lr, &o->optim.lr),
      FLOAT_SETTING("--lr-backbone", lr_backbone, &o->optim.lr_backbone),
      FLOAT_SETTING("--weight-decay", weight_decay, &o->optim.weight_decay),
      FLOAT_SETTING("--clip", clip, &o->optim.clip_max_norm),
      FLOAT_SETTING("--ce-loss-coef", ce, &o->loss.ce),
      FLOAT_SETTING("--bbox-loss-coef", bbox, &o->loss.bbox),
      FLOAT_SETTING("--giou-loss-coef", giou, &o->loss.giou),
      FLOAT_SETTING("--eos-coef", eos, &o->loss.eos),
      FLOAT_SETTING("--cost-class", cost_class, &o->loss.cost_class),
      FLOAT_SETTING("--cost-bbox", cost_bbox, &o->loss.cost_bbox),
      FLOAT_SETTING("--cost-giou", cost_giou, &o->loss.cost_giou),
      INT_SETTING("--epochs", epochs, &o->epochs),
      INT_SETTING("--lr-drop", lr_drop, &o->optim.lr_drop),
      INT_SETTING("--image-size", image_size, &f->image_size),
      INT_SETTING("--max-size", max_size, &f->max_size),
      INT_SETTING("--pad-multiple", pad_multiple, &o->pad_multiple),
  };
#undef FLOAT_SETTING
#undef INT_SETTING
  _Static_assert(sizeof all / sizeof all[0] == N_SETTING_BINDINGS, "N_SETTING_BINDINGS");
  memcpy(out, all, sizeof all);
}

static double binding_option(const SettingBinding *b) { return b->f ? *b->f : *b->i; }

static double binding_stored(const SettingBinding *b, const RunSettings *r) {
  const char *p = (const char *)r + b->offset;
  return b->f ? *(const float *)p : *(const int *)p;
}

// A resumed run continues the run it resumes (docs/cli.md, "Stopping and resuming"): every setting
// this command does not give is the run's own, as its checkpoint recorded it - the schedule (so a
// larger --epochs keeps the learning-rate drop where the run had it), the optimizer, the loss and
// matcher weights, the image sizes and augmentation. One it gives that differs is applied, and
// said. (--batch: restored, or refused when it differs, by resume() in train/trainer.c.)
static void continue_run(const Dist *g, TrainOptions *o, TrainFlags *f, const RunSettings *r, int argc, char **argv) {
  SettingBinding b[N_SETTING_BINDINGS];
  setting_bindings(o, f, b);
  char changed[2048] = "";
  size_t n = 0;
  for (int k = 0; k < N_SETTING_BINDINGS; k++) {
    double now = binding_option(&b[k]), stored = binding_stored(&b[k], r);
    if (!has_flag(argc, argv, b[k].flag)) {
      if (b[k].f) *b[k].f = (float)stored;
      else *b[k].i = (int)stored;
    } else if (!(now == stored || (isnan(now) && isnan(stored)))) {
      note_change(changed, sizeof changed, &n, b[k].flag, now, stored);
    }
  }
  if (!has_flag(argc, argv, "--no-augment")) f->no_augment = !r->augment;
  else if (r->augment && n < sizeof changed)
    n += (size_t)snprintf(changed + n, sizeof changed - n, " --no-augment (the run augmented);");
  if (n && dist_is_main(g))
    fprintf(stderr, "detr train: resuming with settings of its own instead of the run's:%.*s\n", (int)n - 1, changed);
}

// What the checkpoints of this run record of its settings (after resolve()).
static RunSettings run_settings_of(TrainOptions *o, TrainFlags *f) {
  RunSettings r = {.known = true, .batch = o->batch_size, .augment = !f->no_augment};
  SettingBinding b[N_SETTING_BINDINGS];
  setting_bindings(o, f, b);
  for (int k = 0; k < N_SETTING_BINDINGS; k++) {
    char *p = (char *)&r + b[k].offset;
    if (b[k].f) *(float *)p = *b[k].f;
    else *(int *)p = *b[k].i;
  }
  return r;
}

// Resuming a run directory that exists: its lock (rank 0), before a checkpoint in it is read or a
// damaged one renamed, so that a live run there refuses this one first (the trainer takes it
// otherwise). Returns 0 or -1 on every rank.
static int lock_to_resume(const Dist *g, const TrainOptions *o, int argc, char **argv, RunLock *lock) {
  struct stat st;
  bool ok = true;
  if (o->resume && dist_is_main(g) && stat(o->out_dir, &st) == 0 && S_ISDIR(st.st_mode)) {
    char command[4096] = "detr", err[4608];
    size_t n = strlen(command);
    for (int i = 1; i < argc && append_word(command, sizeof command, &n, argv[i]); i++) {}
    ok = run_lock_acquire(lock, o->out_dir, command, err, sizeof err) == 0;
    if (!ok) fprintf(stderr, "detr train: %s\n", err);
  }
  return dist_all_ok(g, ok) ? 0 : -1;
}

// Reads the checkpoint to resume and the --init weights, resolves the options against them and
// trains: the verb's exit status.
static int resolve_and_train(const Dist *job, TrainOptions *o, TrainFlags *f, int argc, char **argv) {
  char resume_path[4200], err[4096];
  CheckpointInfo ci = {0};
  const char *resume_arg = o->resume;
  Dist g = *job;
  RunLock lock = {0};
  if (lock_to_resume(&g, o, argc, argv, &lock)) return 1;
  if (find_resume(&g, o, resume_path, sizeof resume_path, &ci, err, sizeof err)) {
    if (dist_is_main(&g)) fprintf(stderr, "detr train: --resume %s: %s\n", resume_arg, err);
    run_lock_release(&lock);
    return 1;
  }
  CheckpointInfo init_ci = {0};
  bool init_is_checkpoint;
  if (read_init(o, &init_ci, &init_is_checkpoint, err, sizeof err)) {
    if (dist_is_main(&g)) fprintf(stderr, "detr train: --init %s\n", err);
    checkpoint_info_free(&ci);
    run_lock_release(&lock);
    return 1;
  }
  if (o->resume && ci.run.known) continue_run(&g, o, f, &ci.run, argc, argv);
  int rc = resolve(job, o, f->config, &f->sets, f->enact, f->device, f->precision, f->bad_input, &f->image_size,
                   &f->max_size, !f->no_augment,
                   o->resume            ? &ci
                   : init_is_checkpoint ? &init_ci
                                        : NULL);
  if (rc == 0) {
    o->progress = !f->no_progress;
    store_command_line(o, argc, argv, f->image_size, f->max_size);
    o->run = run_settings_of(o, f);
    o->seed_given = has_flag(argc, argv, "--seed");
    rc = train_run(o, &g, &lock);
  }
  run_lock_release(&lock);  // not handed over: resolve() refused the command
  checkpoint_info_free(&ci);
  checkpoint_info_free(&init_ci);
  return rc;
}

// --data is given, and --out is short enough for the run's files (OUT/ckpt-<step>.safetensors.tmp.<pid>
// the longest: a longer one failed at the first checkpoint, an epoch in). 0, or -1 with the message.
static int check_paths(const TrainOptions *o) {
  if (!o->data_dir) {
    fprintf(stderr, "detr train: --data DIR is required (see detr train --help)\n");
    return -1;
  }
  size_t out_len = strlen(o->out_dir);
  if (out_len > RUN_DIR_MAX_PATH) {
    fprintf(stderr, "detr train: --out is %zu characters long: a run directory's path may have at most %d\n", out_len,
            RUN_DIR_MAX_PATH);
    return -1;
  }
  return 0;
}

int cmd_train(int argc, char **argv, const Dist *job) {
  TrainOptions o = train_options_default();
  o.epochs = o.optim.lr_drop = -1;     // from the model (resolve)
  o.batch_size = o.pad_multiple = -1;  // the resumed run's settings, else 2 and 1 (resolve)
  TrainFlags f = {.device = "cpu", .bad_input = "fail", .image_size = -1, .max_size = -1};
  CliFlag flags[] = {
      {"data", FLAG_STRING, &o.data_dir, "dataset root (annotations/instances_<split>.json and <split>/)"},
      {"train-split", FLAG_STRING, &o.train_split, "training split name (default train; COCO: train2017)"},
      {"val-split", FLAG_STRING, &o.val_split,
       "validation split name (default val; COCO: val2017; none: no evaluation)"},
      {"config", FLAG_STRING, &f.config,
       "model preset (" DETR_PRESET_LIST ") or key=value file (default " SETUP_DEFAULT_PRESET
       "; resuming: the checkpoint's)"},
      {"set", FLAG_LIST, &f.sets, "override one model config field, e.g. --set num_queries=20"},
      {"enact", FLAG_BOOL, &f.enact, SETUP_ENACT_HELP},
      {"precision", FLAG_STRING, &f.precision, SETUP_PRECISION_HELP},
      {"out", FLAG_STRING, &o.out_dir, "run directory (default runs/detr)"},
      {"epochs", FLAG_I32, &o.epochs, "epochs (default 300 for detr-r50, 50 for the small presets)", 1, 100000},
      {"batch", FLAG_I32, &o.batch_size, "images per batch (default 2; resuming: the run's)", 1, 64},
      {"lr", FLAG_F32, &o.optim.lr, "learning rate (default 1e-4)"},
      {"lr-backbone", FLAG_F32, &o.optim.lr_backbone, "backbone learning rate (default 1e-5; 0 freezes the backbone)"},
      {"weight-decay", FLAG_F32, &o.optim.weight_decay, "AdamW weight decay (default 1e-4)"},
      {"clip", FLAG_F32, &o.optim.clip_max_norm, "gradient clipping max norm (default 0.1; 0 disables)"},
      {"lr-drop", FLAG_I32, &o.optim.lr_drop, "epochs between learning-rate drops x0.1 (default 2/3 of --epochs)", 1,
       1000000},
      {"image-size", FLAG_I32, &f.image_size,
       "val shortest side; train scales follow (default 800, 320 small, 128 tiny)", 32, 4096},
      {"max-size", FLAG_I32, &f.max_size, "longest image side (default 1333, 512 small, 192 tiny)", 32, 8192},
      {"pad-multiple", FLAG_I32, &o.pad_multiple,
       "pad each batch to a multiple of N pixels (default 1: to its largest image, as the reference; e.g. 16: "
       "fewer distinct input sizes, faster on the CPU; resuming: the run's)",
       1, 256},
      {"device", FLAG_STRING, &f.device, "cpu or cuda (default cpu)"},
      {"threads", FLAG_I32, &o.threads,
       "CPU threads (default: OMP_NUM_THREADS, or the cores other processes leave free)", 0, 1024},
      {"workers", FLAG_I32, &o.workers, "data loader threads (default 2)", 0, 64},
      {"seed", FLAG_U64, &o.seed, "seed of initialisation, data order, augmentation and dropout (default 42)", 0,
       1LL << 62},
      {"eval-every", FLAG_I32, &o.eval_every, "epochs between COCO evaluations (default 1; 0: at the end only)", 0,
       100000},
      {"checkpoint-every", FLAG_I64, &o.checkpoint_every, "steps between checkpoints (default 0: every epoch)", 0,
       1LL << 40},
      {"keep", FLAG_I32, &o.keep_last, "checkpoints kept besides best.safetensors (default 2)", 1, 1000},
      {"keep-all-results", FLAG_BOOL, &o.keep_all_results,
       "keep every evaluation's results-epoch<E>.json (default: the best's and the last's)"},
      {"init", FLAG_STRING, &o.init_weights,
       "start from these weights (safetensors, reference or transformers names) or a checkpoint's model "
       "(fine-tuning: a class head for other classes, query embeddings for another num_queries are re-initialised; "
       "docs/finetune.md)"},
      {"init-partial", FLAG_BOOL, &o.init_partial,
       "with --init: tensors that do not fit the model keep their initialisation (listed) instead of an error"},
      {"init-backbone", FLAG_STRING, &o.init_backbone,
       "start the backbone from this file (detr pretrain; its batch-norm statistics included)"},
      {"resume", FLAG_STRING, &o.resume, "auto (newest valid checkpoint in --out) or a checkpoint path"},
      {"move-old-run", FLAG_BOOL, &o.move_old_run,
       "a run already in --out is renamed to OUT.old-<time> first (nothing is deleted)"},
      {"ce-loss-coef", FLAG_F32, &o.loss.ce, "class loss weight (default 1; Conditional DETR 2)"},
      {"bbox-loss-coef", FLAG_F32, &o.loss.bbox, "L1 box loss weight (default 5)"},
      {"giou-loss-coef", FLAG_F32, &o.loss.giou, "GIoU loss weight (default 2)"},
      {"eos-coef", FLAG_F32, &o.loss.eos, "softmax head: the no-object class's cross-entropy weight (default 0.1)"},
      {"cost-class", FLAG_F32, &o.loss.cost_class, "matcher: class cost weight (default 1; Conditional DETR 2)"},
      {"cost-bbox", FLAG_F32, &o.loss.cost_bbox, "matcher: L1 box cost weight (default 5)"},
      {"cost-giou", FLAG_F32, &o.loss.cost_giou, "matcher: GIoU cost weight (default 2)"},
      {"max-steps", FLAG_I64, &o.max_steps, "stop after this many steps in total (default 0: no limit)", 0, 1LL << 40},
      {"bad-input", FLAG_STRING, &f.bad_input, "fail or skip (with a warning and a count) bad annotations/images"},
      {"calibrate-bn", FLAG_BOOL, &o.calibrate_bn,
       "training from scratch: set the frozen batch norms' statistics from 8 training images first"},
      {"no-augment", FLAG_BOOL, &f.no_augment, "train on the val transform (resize only): no flips, crops, scales"},
      {"no-progress", FLAG_BOOL, &f.no_progress, "no progress line"},
  };
  int n_flags = (int)(sizeof flags / sizeof flags[0]), n_pos = 0;
  int rc = cli_parse("train", USAGE, argc, argv, 2, flags, n_flags, NULL, 0, &n_pos);
  if (rc) return rc == 1 ? 0 : 2;
  if (check_paths(&o)) return 2;
  return resolve_and_train(job, &o, &f, argc, argv);
}
