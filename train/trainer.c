#define _DEFAULT_SOURCE  // SA_RESTART, sigaction
#include "train/trainer.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "dist/dist.h"
#include "eval/evaluate.h"
#include "kernels/cpu/cpu_kernels.h"
#include "nn/model_io.h"
#include "train/checkpoint.h"
#include "train/cpu_share.h"
#include "train/data_layout.h"
#include "train/finetune.h"
#include "train/history.h"
#include "train/progress.h"
#include "train/run_dir.h"
#include "train/run_lock.h"
#include "train/tensorboard.h"
#include "train/val_pictures.h"
#include "viz/draw.h"

TrainOptions train_options_default(void) {
  TrainOptions o = {.optim = optim_config_default(),
                    .epochs = 300,
                    .batch_size = CHECKPOINT_TRAIN_DEFAULT_BATCH,
                    .workers = 2,
                    .seed = 42,
                    .pad_multiple = 1,
                    .loss = LOSS_WEIGHTS_MODEL,
                    .device = DEVICE_CPU,
                    .train_split = "train",
                    .val_split = "val",
                    .bad_input = BAD_INPUT_FAIL,
                    .out_dir = "runs/detr",
                    .eval_every = 1,
                    .keep_last = 2,
                    .progress = true};
  detr_config_preset("detr-r50", &o.model);
  o.train_aug = aug_config_detr(true);
  o.val_aug = aug_config_detr(false);
  return o;
}

void loss_weights_apply(const LossWeights *w, CriterionConfig *c) {
  if (!isnan(w->ce)) c->weight_ce = w->ce;
  if (!isnan(w->bbox)) c->weight_bbox = w->bbox;
  if (!isnan(w->giou)) c->weight_giou = w->giou;
  if (!isnan(w->eos)) c->eos_coef = w->eos;
  if (!isnan(w->cost_class)) c->matcher.cost_class = w->cost_class;
  if (!isnan(w->cost_bbox)) c->matcher.cost_bbox = w->cost_bbox;
  if (!isnan(w->cost_giou)) c->matcher.cost_giou = w->cost_giou;
}

// A split, its layout and every image's presence, header and size checked before the first step
// (headers only: 0.9 s on a COCO-sized set, bench/README.md#bench_coco_parse).
static CocoDataset *open_split(const Dist *g, const TrainOptions *o, bool training, char *err, size_t err_cap) {
  const char *split = training ? o->train_split : o->val_split, *flag = training ? "--train-split" : "--val-split";
  if (setup_check_split_layout(o->data_dir, split, flag, err, err_cap)) return NULL;
  char ann[4096], img[4096];
  setup_split_paths(o->data_dir, split, ann, sizeof ann, img, sizeof img);
  CocoOpenConfig cc = {.ann_path = ann, .image_dir = img, .policy = o->bad_input, .check_images = true};
  CocoDataset *ds = NULL;
  DataError derr;
  if (coco_open(&cc, &ds, &derr)) {
    snprintf(err, err_cap, "%s", derr.msg);
    return NULL;
  }
  const CocoStats *s = &ds->stats;
  if (ds->n_images == 0 && s->skipped_images == 0) {  // the split itself is empty
    snprintf(err, err_cap, "%s: no images%s", ds->ann_path,
             training ? "" : ": to train without evaluating, pass --val-split none");
  } else if (ds->n_images == 0) {
    snprintf(err, err_cap,
             "%s: no image is left to %s (%lld skipped: %lld missing files, %lld unreadable or of another "
             "size than the file says, %lld named twice; see the warnings above)%s",
             ds->ann_path, training ? "train on" : "evaluate on", (long long)s->skipped_images,
             (long long)s->missing_images, (long long)s->corrupt_images, (long long)s->duplicate_files,
             training ? "" : "; --val-split none trains without evaluating");
  } else if (s->annotations - s->crowd_annotations == 0 && training) {
    snprintf(err, err_cap, "%s: no annotations (%lld images, none with a box%s): there is nothing to learn",
             ds->ann_path, (long long)ds->n_images, s->skipped_annotations ? " left after skipping" : "");
  } else {
    // A val split without boxes is a warning: training still works, but its AP would be -1 and
    // no best.safetensors written.
    if (s->annotations - s->crowd_annotations == 0 && dist_is_main(g))
      fprintf(stderr,
              "detr train: warning: %s has no annotations besides crowd ones: its evaluations will report AP -1 "
              "and no best.safetensors is written (--val-split none trains without evaluating)\n",
              ds->ann_path);
    return ds;
  }
  coco_free(ds);
  return NULL;
}

// --out and its missing parents (datasets/data_util.c's data_mkdirs, as detr synth and predict's).
static int mkdir_p(const char *dir, char *err, size_t err_cap) {
  DataError derr;
  if (data_mkdirs(dir, &derr) == DATA_OK) return 0;
  snprintf(err, err_cap, "%s", derr.msg);
  return -1;
}

static void ckpt_path(const TrainOptions *o, int64_t step, char *out, size_t cap) {
  run_dir_checkpoint_path(o->out_dir, step, out, cap);
}

static void prune_checkpoints(const Dist *g, const TrainOptions *o, int64_t current_step) {
  if (dist_is_main(g)) run_dir_prune(o->out_dir, o->keep_last, current_step);
}

static void print_resume_hint(const TrainOptions *o, const Dist *g, const char *how, const char *flag,
                              const char *value);

// Rank 0 writes (every rank holds the same state); every rank learns whether it worked. A failed
// write (a full disk) stops the run: what is kept and how to go on are said.
static int save(const Dist *g, const TrainOptions *o, const char *path, const DetrModel *m, const AdamW *opt,
                const TrainState *st, const char *categories) {
  char err[4400];
  bool ok = true;
  if (dist_is_main(g) && checkpoint_save(path, m, opt, st, o->train_config_text, categories, err, sizeof err)) {
    fprintf(stderr, "detr train: %s\n", err);
    fprintf(stderr,
            "detr train: stopping: the state of step %lld could not be saved; the newest checkpoint in %s is "
            "kept as it was, and a resumed run does the steps after it again\n",
            (long long)st->step, o->out_dir);
    print_resume_hint(o, g, "once the write can succeed (room on the disk), resume", NULL, NULL);
    ok = false;
  }
  return dist_all_ok(g, ok) ? 0 : -1;
}

// --- the history kept for the chart (train/history.c) ---

// A value as metrics.jsonl holds it (%.6f): the history is the same whether kept or read back.
static double as_logged(double v) {
  char text[64];
  snprintf(text, sizeof text, "%.6f", v);
  return strtod(text, NULL);
}

// OUT/chart.png: the loss (and its 50-step running mean) by step, AP and AP50 by epoch. A chart
// that cannot be written is reported and training goes on.
static void write_chart(const Dist *g, const TrainOptions *o, const TrainHistory *h) {
  if (!dist_is_main(g)) return;
  char title[96], path[4200], err[1024];
  snprintf(title, sizeof title, "%s training (encoder attention: %s)", detr_decoder(&o->model)->model,
           detr_encoder_attn(&o->model)->name);
  Image img;
  history_chart_render(h, title, &img);
  snprintf(path, sizeof path, "%s/chart.png", o->out_dir);
  if (image_save_png(path, &img, err, sizeof err)) fprintf(stderr, "detr train: chart: %s\n", err);
  image_free(&img);
}

// --- the run's state, shared by the stages ---

typedef struct {
  TrainOptions *o;
  Dist dist;  // the processes of a data-parallel run (dist/dist.h)
  CocoDataset *train, *val;
  char *categories;  // "id:name;..." of the training categories, stored in every checkpoint
  DetrModel *m;
  AdamW opt;
  TrainState st;  // step, data position, dropout stream, best AP: what a checkpoint resumes
  bool resumed;
  FILE *metrics;  // OUT/metrics.jsonl (rank 0; NULL elsewhere)
  TbWriter *tb;   // OUT/events.out.tfevents.* (rank 0; NULL elsewhere, or when it cannot be written)
  DataLoader *loader;
  int64_t per_epoch;  // global batches per epoch
  CriterionConfig criterion;
  Progress progress;
  TrainHistory history;
  CpuShare cpu;        // compute threads: the cores other processes leave free
  int interrupted;     // the signal that stopped the run (SIGINT, SIGTERM, SIGUSR1), 0 if none
  int64_t saved_step;  // the step of the last ckpt-<step> this run wrote, -1 before the first
  RunLock lock;        // OUT/train.lock (rank 0): one process per run directory
  bool moved_old_run;  // --move-old-run renamed the directory (with the lock) aside
} Trainer;

// --- stage 1, set-up: data, model, optimizer; resume or initial weights; the log; the loader ---

// Also the categories against a resumed checkpoint's: a resumed run trains on the same classes.
static int open_data(Trainer *t, char *err, size_t err_cap) {
  const TrainOptions *o = t->o;
  t->train = open_split(&t->dist, o, true, err, err_cap);
  if (!t->train) return -1;
  if (strcmp(o->val_split, "none") && !(t->val = open_split(&t->dist, o, false, err, err_cap))) return -1;
  char diff[1024];
  // Fine-tuning a checkpoint's model: num_classes follows the data when its classes differ (with
  // no categories in the checkpoint, when the data has more).
  bool other_classes = o->init_categories ? categories_compare(o->init_categories, t->train, diff, sizeof diff) != 0
                                          : o->model.num_classes < t->train->num_classes;
  if (o->model_from_init && o->model.num_classes != t->train->num_classes && other_classes) {
    if (dist_is_main(&t->dist))
      fprintf(stderr, "detr train: num_classes %d for the data's categories (the --init checkpoint's model has %lld)\n",
              t->train->num_classes, (long long)o->model.num_classes);
    t->o->model.num_classes = t->train->num_classes;
  }
  if (o->model.num_classes < t->train->num_classes) {
    snprintf(err, err_cap,
             "the data has category ids up to %d but the model has num_classes %lld (set --set num_classes=%d)",
             t->train->num_classes - 1, (long long)o->model.num_classes, t->train->num_classes);
    return -1;
  }
  size_t bytes = 1;  // every name whole, however many (LVIS: 1203 categories)
  for (int i = 0; i < t->train->n_categories; i++) bytes += strlen(t->train->categories[i].name) + 16;
  t->categories = detr_malloc(bytes, "train categories");
  t->categories[0] = 0;
  for (int i = 0, n = 0; i < t->train->n_categories; i++)
    n += snprintf(t->categories + n, bytes - (size_t)n, "%s%d:%s", i ? ";" : "", t->train->categories[i].id,
                  t->train->categories[i].name);
  int same = o->resume ? categories_compare(o->resume_categories, t->train, diff, sizeof diff) : 0;
  if (same == 2) {
    snprintf(err, err_cap,
             "the categories of %s differ from those of the run in %s (%s): a resumed run trains on the "
             "same classes; to train on these, start a new run from its weights: --init %s --out NEW_DIR",
             t->train->ann_path, o->resume, diff, o->resume);
    return -1;
  }
  if (same == 1 && dist_is_main(&t->dist))
    fprintf(stderr, "detr train: warning: the category names differ from %s's: %s\n", o->resume, diff);
  return 0;
}

static void create_model(Trainer *t) {
  const TrainOptions *o = t->o;
  t->m = detr_model_create(&o->model, o->device);
  detr_model_init(t->m, o->seed);
  adamw_init(&t->opt, &t->m->params, o->optim);
  t->st = (TrainState){.seed = o->seed,
                       .dropout_rng = rng_make(o->seed ^ 0xd40bu),
                       .best_map = -1.0,
                       .best_epoch = -1,
                       .world_size = t->dist.world,
                       .global_batch = (int64_t)t->dist.world * o->batch_size};
}

// --resume: the state of a checkpoint, which every process must have read at the same step and
// with the same split of the global batch.
static int resume(Trainer *t, char *err, size_t err_cap) {
  const TrainOptions *o = t->o;
  TrainState *st = &t->st;
  if (o->resume) {
    char why[2048];
    if (checkpoint_load(o->resume, t->m, &t->opt, st, why, sizeof why)) {
      snprintf(err, err_cap, "--resume %s", why);
      return -1;
    }
    t->resumed = true;
    if (dist_is_main(&t->dist))
      fprintf(stderr, "detr train: resuming from %s (step %lld)\n", o->resume, (long long)st->step);
  }
  int64_t global_batch = (int64_t)t->dist.world * o->batch_size;
  if (t->resumed && (st->world_size != t->dist.world || (st->global_batch && st->global_batch != global_batch))) {
    // The data position counts global batches: another split of them would train on other data.
    snprintf(err, err_cap,
             "the checkpoint was written by a run of %d process%s with %lld images per step; this run has %d "
             "process%s with %lld: resume with the same number of processes and --batch, or start a new run directory",
             st->world_size, st->world_size == 1 ? "" : "es", (long long)st->global_batch, t->dist.world,
             t->dist.world == 1 ? "" : "es", (long long)global_batch);
    return -1;
  }
  if (t->resumed && st->seed != o->seed) {  // the data order and augmentation of the run: its own seed
    if (o->seed_given) {
      snprintf(err, err_cap,
               "the run's seed is %llu: --seed %llu would change its data order mid-run. Leave --seed out to "
               "continue it, or start a new run with --init %s",
               (unsigned long long)st->seed, (unsigned long long)o->seed, o->resume);
      return -1;
    }
    t->o->seed = st->seed;
  }
  uint64_t resumed_at[2] = {(uint64_t)st->step, ~(uint64_t)st->step};  // max of step and of -step: all equal?
  dist_allreduce_max_u64(&t->dist, resumed_at, 2);
  if (resumed_at[0] != (uint64_t)st->step || ~resumed_at[1] != (uint64_t)st->step) {
    snprintf(err, err_cap,
             "the processes resumed from different checkpoints (this one at step %lld): is %s one directory "
             "shared by all of them?",
             (long long)st->step, o->out_dir);
    return -1;
  }
  return 0;
}

// --move-old-run: the directory, with what it holds (`what`), renamed to OUT.old-<time>.
// The lock is held through the rename (no other process can take the directory meanwhile), then
// given up with the moved directory's lock file: lock_and_check_run_dir takes the new one's.
static int move_old_run(Trainer *t, const char *what, char *err, size_t err_cap) {
  char moved[4200];
  if (run_dir_move_aside(t->o->out_dir, moved, sizeof moved, err, err_cap)) return -1;
  run_lock_release_moved(&t->lock, moved);
  t->moved_old_run = true;
  fprintf(stderr, "detr train: moved the run in %s (%s) to %s\n", t->o->out_dir, what, moved);
  return 0;
}

// What the run directory holds decides what this run may do there, before anything is written:
// a new run needs a directory without a run (or --move-old-run, which renames it: nothing is
// deleted); a run resumed from a checkpoint of the directory continues that history only.
static int check_run_dir(Trainer *t, char *err, size_t err_cap) {
  const TrainOptions *o = t->o;
  RunDirContents c;
  run_dir_scan(o->out_dir, &c);
  char what[1024];
  if (!run_dir_has_run(&c)) {
    if (!run_dir_foreign_outputs(o->out_dir, what, sizeof what)) return 0;
    if (!o->move_old_run) {
      snprintf(err, err_cap,
               "%s holds %s, which this run would write over, and no run that wrote them (no metrics.jsonl or "
               "checkpoint): choose another --out, move them away, or pass --move-old-run to rename the directory "
               "to %s.old-<time> first (nothing is deleted)",
               o->out_dir, what, o->out_dir);
      return -1;
    }
    return move_old_run(t, what, err, err_cap);
  }
  run_dir_describe(&c, what, sizeof what);
  if (t->resumed && run_dir_contains(o->out_dir, o->resume)) {
    if (o->move_old_run) {
      snprintf(err, err_cap, "--move-old-run would move away the run that --resume %s continues: leave it out",
               o->resume);
      return -1;
    }
    if (c.n_checkpoints > 0 && c.steps[0] > t->st.step) {
      snprintf(err, err_cap,
               "%s holds ckpt-%lld.safetensors, newer than %s (step %lld): going on from an older checkpoint "
               "here would mix two histories. Continue the newest with --resume auto, or branch off from this one into "
               "a new directory with --out NEW_DIR",
               o->out_dir, (long long)c.steps[0], o->resume, (long long)t->st.step);
      return -1;
    }
    return 0;
  }
  if (o->resume_auto && !t->resumed && c.n_checkpoints == 0 && !c.best) {
    fprintf(stderr,
            "detr train: %s holds a run that stopped before its first checkpoint (%s): it starts again from "
            "step 0\n",
            o->out_dir, what);
    return 0;
  }
  if (o->move_old_run) return move_old_run(t, what, err, err_cap);
  if (t->resumed)
    snprintf(err, err_cap,
             "%s already holds another run (%s): resuming %s into it would mix two runs. Choose an empty "
             "--out, or pass --move-old-run to rename that run to %s.old-<time> first (nothing is deleted)",
             o->out_dir, what, o->resume, o->out_dir);
  else
    snprintf(err, err_cap,
             "%s already holds a run (%s). Continue it with --resume auto (its model config is read from the "
             "checkpoint), start a new run with --out NEW_DIR, or pass --move-old-run to rename the directory to "
             "%s.old-<time> first (nothing is deleted)",
             o->out_dir, what, o->out_dir);
  return -1;
}

// The directory, its lock (before anything in it is judged or changed: a live run there is
// refused), and what it holds; after --move-old-run, the lock of the new directory.
static int lock_and_check_run_dir(Trainer *t, char *err, size_t err_cap) {
  const TrainOptions *o = t->o;
  char command[sizeof o->train_config_text + 8];
  snprintf(command, sizeof command, "detr %s", o->train_config_text);
  if (mkdir_p(o->out_dir, err, err_cap) ||
      (!t->lock.held && run_lock_acquire(&t->lock, o->out_dir, command, err, err_cap)) ||
      check_run_dir(t, err, err_cap))
    return -1;
  if (!t->moved_old_run) return 0;
  return mkdir_p(o->out_dir, err, err_cap) || run_lock_acquire(&t->lock, o->out_dir, command, err, err_cap) ? -1 : 0;
}

// Rank 0 decides (and moves an old run aside); every rank learns the outcome.
static int claim_run_dir(Trainer *t, char *err, size_t err_cap) {
  bool ok = !dist_is_main(&t->dist) || lock_and_check_run_dir(t, err, err_cap) == 0;
  if (ok && dist_is_main(&t->dist)) run_dir_remove_dead_temps(t->o->out_dir, t->lock.held);
  if (dist_all_ok(&t->dist, ok)) return 0;
  if (ok) snprintf(err, err_cap, "the run directory was refused (see the message of rank 0)");
  return -1;
}

// --calibrate-bn: the frozen batch norms' statistics from the first 8 training images, resized
// as for evaluation.
static int calibrate_batch_norms(Trainer *t, char *err, size_t err_cap) {
  const TrainOptions *o = t->o;
  LoaderConfig cal = loader_config_make(false, 8, 0, o->val_aug, o->bad_input);
  cal.quiet = true;
  cal.pad_multiple = o->pad_multiple;
  DataLoader *cl = NULL;
  const Batch *cb;
  DataError cerr;
  if (loader_create(t->train, &cal, (LoaderPosition){0, 0}, &cl, &cerr) || loader_next(cl, &cb, &cerr) != DATA_OK) {
    snprintf(err, err_cap, "--calibrate-bn: %s", cerr.msg);
    loader_free(cl);
    return -1;
  }
  Tensor *x = batch_images_tensor(cb, o->device);
  resnet_calibrate(&t->m->backbone, x);
  tensor_release(x);
  if (dist_is_main(&t->dist))
    fprintf(stderr, "detr train: frozen batch norms calibrated on %d training images\n", cb->size);
  loader_free(cl);
  return 0;
}

// A fresh run's starting weights: --init, --init-backbone, --calibrate-bn.

// --init-backbone: the file's backbone.* tensors. A model whose decoder kind names its backbone
// otherwise (Anchor DETR: backbone.body) reads a file that names it as DETR does (backbone.0.body:
// `detr pretrain`, a DETR checkpoint) under those names.
static int load_init_backbone(DetrModel *m, const char *path, char *err, size_t err_cap) {
  const char *own = decoder_layout(detr_decoder(&m->cfg))->backbone;
  if (!strcmp(own, "backbone.0.body")) return params_load_file_prefix(&m->params, path, "backbone.", err, err_cap);
  char prefix[112], conv1[128];
  snprintf(prefix, sizeof prefix, "%s.", own);
  snprintf(conv1, sizeof conv1, "%sconv1.weight", prefix);
  StFile *f = st_open(path, err, err_cap);
  if (!f) return -1;
  bool same = st_find(f, conv1) != NULL;
  st_close(f);
  return params_load_file_prefix_as(&m->params, path, prefix, same ? NULL : "backbone.0.body.", err, err_cap);
}

static int initial_weights(Trainer *t, char *err, size_t err_cap) {
  const TrainOptions *o = t->o;
  char why[2048];
  if (o->init_weights && finetune_load(t->m, o->init_weights, o->init_categories, t->train, o->init_partial,
                                       dist_is_main(&t->dist), why, sizeof why)) {
    snprintf(err, err_cap, "--init %s", why);
    return -1;
  }
  if (o->init_backbone && load_init_backbone(t->m, o->init_backbone, why, sizeof why)) {
    snprintf(err, err_cap, "--init-backbone %s", why);
    return -1;
  }
  return o->calibrate_bn ? calibrate_batch_norms(t, err, err_cap) : 0;
}

// OpenMPI's mpirun answers a Ctrl-C by sending its processes SIGTERM a second later and SIGKILL a
// second after that: too soon to finish a step and write its checkpoint, so the steps since the last
// one are lost (and a checkpoint being written is left as a temporary file). Say so once, with what
// stops the run with a checkpoint. (A larger odls_base_sigkill_timeout T delays the SIGTERM by T
// too, so it is no cure.)
static void say_how_to_stop_under_mpirun(void) {
  int grace = dist_mpirun_kill_grace_s();
  if (grace < 0 || grace >= 60) return;
  char who[64] = "<mpirun's pid>";
  int pid = dist_mpirun_pid();
  if (pid > 0) snprintf(who, sizeof who, "%d", pid);
  fprintf(stderr,
          "detr train: a Ctrl-C to mpirun kills its processes %d s after asking them to stop (OpenMPI's "
          "odls_base_sigkill_timeout), too soon to checkpoint: stop this run with `kill -USR1 %s` instead (mpirun "
          "passes SIGUSR1 on, and every process stops after the same step with a checkpoint)\n",
          grace, who);
}

// The run's TensorBoard events (rank 0, once it is known to train): its event files cut back to the
// resumed step, as metrics.jsonl is, and a new file. A failure is said, and the run goes on without one.
static void open_tensorboard(Trainer *t) {
  char err[4608];
  if (tb_cut(t->o->out_dir, t->st.step, err, sizeof err))
    fprintf(stderr,
            "detr train: TensorBoard: %s; its events past step %lld stay, but TensorBoard's reader drops them (the new "
            "file starts with a SessionLog START at step %lld)\n",
            err, (long long)t->st.step, (long long)t->st.step + 1);
  t->tb = tb_open(t->o->out_dir, t->st.step, err, sizeof err);
  if (!t->tb) fprintf(stderr, "detr train: TensorBoard: %s: the run goes on without an event file\n", err);
}

// metrics.jsonl (appended to when resuming; the history read back first), the loader at the saved
// data position, and the run's summary line.
static int open_log_and_loader(Trainer *t, char *err, size_t err_cap) {
  const TrainOptions *o = t->o;
  char path[4200];
  snprintf(path, sizeof path, "%s/metrics.jsonl", o->out_dir);
  bool ok = true;
  if (dist_is_main(&t->dist)) {  // rank 0 logs; the others compute
    // A crash after logging steps past the checkpoint: those lines go, the resumed run logs them again.
    char why[4400];
    if (t->resumed && run_dir_cut_metrics(path, t->st.step, why, sizeof why)) {
      fprintf(stderr, "detr train: %s\n", why);
      ok = false;
    } else {
      if (t->resumed) history_load(&t->history, path);
      t->metrics = fopen(path, t->resumed ? "a" : "w");
      if (!t->metrics) fprintf(stderr, "detr train: %s: cannot write: %s\n", path, strerror(errno));
      ok = t->metrics != NULL;
    }
  }
  if (!dist_all_ok(&t->dist, ok)) {
    snprintf(err, err_cap, "no metrics log: stopping (see the message above%s)",
             dist_is_main(&t->dist) ? "" : ", of rank 0");
    return -1;
  }
  LoaderConfig lc = loader_config_make(true, o->batch_size, o->workers, o->train_aug, o->bad_input);
  lc.seed = o->seed;
  lc.pad_multiple = o->pad_multiple;
  lc.shard = t->dist.rank;  // each process: its slice of every global batch
  lc.shards = t->dist.world;
  DataError derr;
  if (loader_create(t->train, &lc, (LoaderPosition){t->st.epoch, 0}, &t->loader, &derr)) {
    snprintf(err, err_cap, "%s", derr.msg);
    return -1;
  }
  t->per_epoch = loader_batches_per_epoch(t->loader);
  if (t->per_epoch == 0) {
    snprintf(err, err_cap, "%s has fewer images than one batch of %d", t->train->ann_path, o->batch_size);
    return -1;
  }
  // Fewer batches than the run had (images it read then are skipped at start-up now): the rest of
  // the checkpoint's epoch no longer exists in this order; the next epoch starts anew.
  if (t->st.next_batch >= t->per_epoch) {
    if (dist_is_main(&t->dist))
      fprintf(stderr,
              "detr train: %s has %lld batches per epoch now, fewer than the %lld this run had trained of epoch "
              "%lld: going on from the start of epoch %lld\n",
              t->train->ann_path, (long long)t->per_epoch, (long long)t->st.next_batch, (long long)t->st.epoch,
              (long long)t->st.epoch + 1);
    t->st.epoch++;
    t->st.next_batch = 0;
  }
  if (t->st.next_batch > 0 &&
      loader_seek(t->loader, (LoaderPosition){t->st.epoch, t->st.next_batch}, &derr) != DATA_OK) {
    snprintf(err, err_cap, "%s", derr.msg);
    return -1;
  }
  if (dist_is_main(&t->dist)) {
    fprintf(stderr,
            "detr train: %lld training images (%lld batches of %lld per epoch), %lld val images, %lld trainable "
            "parameters, encoder attention %s, run directory %s\n",
            (long long)t->train->n_images, (long long)t->per_epoch, (long long)t->dist.world * o->batch_size,
            t->val ? (long long)t->val->n_images : 0LL, (long long)params_numel(&t->m->params, PARAM_TRAINABLE),
            detr_encoder_attn(&t->m->cfg)->name, o->out_dir);
    if (t->dist.world > 1)
      fprintf(stderr, "detr train: data parallel over %d processes (%s), %d images each per step\n", t->dist.world,
              dist_backend_name(), o->batch_size);
    say_how_to_stop_under_mpirun();
  }
  return 0;
}

static int trainer_setup(Trainer *t, char *err, size_t err_cap) {
  const TrainOptions *o = t->o;
  cpu_share_init(&t->cpu, o->threads);
  cpu_flush_denormals(true);
  if (dist_setup_device(&t->dist, o->device, err, err_cap) || open_data(t, err, err_cap)) return -1;
  create_model(t);
  // The starting weights are read before the run directory is claimed: --move-old-run may move
  // a file they come from (a backbone kept in the run directory).
  if (resume(t, err, err_cap) || (!t->resumed && initial_weights(t, err, err_cap)) || claim_run_dir(t, err, err_cap) ||
      open_log_and_loader(t, err, err_cap))
    return -1;
  t->st.run = o->run;  // what every checkpoint of this run records of its settings
  t->criterion = detr_criterion_config(&o->model);
  loss_weights_apply(&o->loss, &t->criterion);
  int64_t total_steps = (int64_t)o->epochs * t->per_epoch;
  if (o->max_steps > 0 && o->max_steps < total_steps) total_steps = o->max_steps;
  progress_init(&t->progress, o->progress && dist_is_main(&t->dist), t->st.step, total_steps);
  return 0;
}

static void trainer_free(Trainer *t) {
  if (t->metrics) fclose(t->metrics);
  tb_close(t->tb);
  run_lock_release(&t->lock);
  loader_free(t->loader);
  if (t->m) adamw_free(&t->opt);
  detr_model_free(t->m);
  coco_free(t->train);
  coco_free(t->val);
  free(t->categories);
  history_free(&t->history);
}

// --- stage 2, the step ---

// The global batch's normalisers, summed over the processes (one all-reduce of 4 doubles).
typedef struct {
  double boxes;      // target boxes
  double ce_weight;  // the queries' cross-entropy class weights: 1 matched, eos_coef "no object"
  double matched;    // matched queries (every target is matched when it has at most Q boxes)
  double images;
} BatchTotals;
_Static_assert(sizeof(BatchTotals) == 4 * sizeof(double), "BatchTotals is all-reduced as 4 doubles");

// One step's forward results, summed over the processes (all-reduced as one array of doubles).
typedef struct {
  double failed;  // processes whose forward or loss failed
  double total, terms[DETR_MAX_LOSS_TERMS];
  double class_error_x_matched;  // class_error is a percentage of the matched queries
  double cardinality_error_x_images;
  double attn_images, attn_sum[ATTN_TRACE_MAX];
} StepSums;
#define STEP_SUMS_COUNT (sizeof(StepSums) / sizeof(double))
_Static_assert(sizeof(StepSums) == STEP_SUMS_COUNT * sizeof(double), "StepSums is all-reduced as doubles");

// What one step reports for logging: the loss terms, the logged errors, the attention variant's
// statistics (every process's), the gradient norm before clipping.
typedef struct {
  double total, terms[DETR_MAX_LOSS_TERMS];
  char names[DETR_MAX_LOSS_TERMS][24];
  int n_terms;
  double class_error, cardinality_error;  // means over the global batch's images
  AttnStatSums attn;
  double grad_norm;
  int images;
} StepLog;

// What the step needs besides the batch: targets, normalisers, the criterion's share.
typedef struct {
  DetrTarget targets[64];     // [images]
  BatchTotals local, global;  // this process's slice, and summed over the processes
  CriterionConfig criterion;  // with this process's share of the cross-entropy normaliser
  float num_boxes;            // the global batch's boxes (at least 1): the box losses' normaliser
  int n_aux;                  // auxiliary decoder outputs with a loss
} StepPlan;

// This process's forward pass and loss.
typedef struct {
  DetrOutput out;
  CriterionResult loss;
  bool have_loss;
  AttnStatSums attn;
  uint64_t dropout_offset;  // the dropout stream's position after this process's draws
} StepForward;

static void plan_step(const Trainer *t, const Batch *b, StepPlan *p) {
  const DetrConfig *mc = &t->o->model;
  int64_t Q = mc->num_queries;
  DETR_CHECK(b->size <= 64, "train: batch of %d images", b->size);
  BatchTotals *l = &p->local;
  *l = (BatchTotals){.images = (double)b->size};
  for (int i = 0; i < b->size; i++) {
    p->targets[i] = (DetrTarget){.n = b->targets[i].n, .boxes = b->targets[i].boxes, .labels = b->targets[i].labels};
    l->boxes += b->targets[i].n;
    l->matched += b->targets[i].n < Q ? b->targets[i].n : Q;
  }
  l->ce_weight = l->matched + t->criterion.eos_coef * ((double)b->size * (double)Q - l->matched);
  p->global = *l;
  dist_allreduce_sum_f64(&t->dist, (double *)&p->global, 4);
  p->criterion = t->criterion;
  p->criterion.ce_share = t->dist.world > 1 ? (float)(l->ce_weight / p->global.ce_weight) : 1.0f;
  p->num_boxes = p->global.boxes > 1.0 ? (float)p->global.boxes : 1.0f;
  p->n_aux = mc->aux_loss ? (int)mc->dec_layers - 1 : 0;
}

// Forward and loss of this process's slice; its numbers into sums (failed = 1 on an error).
// Each process draws its own dropout masks (the rank picks the stream; rank 0's is the
// single-process one), all from the saved position, so a resumed run draws the same.
static void forward_loss(const Trainer *t, const Batch *b, const StepPlan *p, int n_terms, StepForward *f,
                         StepSums *sums, char *err, size_t err_cap) {
  Rng dropout = t->st.dropout_rng;
  dropout.seed ^= 0x9E3779B97F4A7C15ull * (uint64_t)t->dist.rank;
  NnCtx ctx = {.training = true, .dropout_rng = &dropout};
  Tensor *images = tensor_scoped(batch_images_tensor(b, t->o->device));
  if (detr_model_forward(t->m, &ctx, images, b->mask, &f->out, err, err_cap) ||
      criterion_forward(&p->criterion, f->out.layers[f->out.n_layers - 1], f->out.layers, p->n_aux, p->targets,
                        p->num_boxes, NULL, &f->loss, err, err_cap)) {
    sums->failed = 1.0;
  } else {
    f->have_loss = true;
    sums->total = tensor_item(f->loss.total);
    DETR_CHECK(f->loss.n_terms == n_terms, "train: %d loss terms, expected %d", f->loss.n_terms, n_terms);
    for (int i = 0; i < n_terms; i++) sums->terms[i] = tensor_item(f->loss.terms[i].value);
    sums->class_error_x_matched = f->loss.class_error * p->local.matched;
    sums->cardinality_error_x_images = f->loss.cardinality_error * b->size;
    attn_stats_add(&f->attn, f->out.attn, f->out.n_attn, b->size);
    sums->attn_images = f->attn.images;
    for (int i = 0; i < ATTN_TRACE_MAX; i++) sums->attn_sum[i] = f->attn.sum[i];
  }
  f->dropout_offset = dropout.offset;
}

// The update, once every process's forward succeeded: backward, gradient all-reduce, clipping,
// AdamW, and the log of the step from the summed numbers.
static void update(Trainer *t, const StepPlan *p, const StepForward *f, const StepSums *sums, StepLog *log) {
  if (f->have_loss) autograd_backward(f->loss.total);
  dist_allreduce_gradients(&t->dist, &t->m->params);
  log->total = sums->total;
  for (int i = 0; i < log->n_terms; i++) log->terms[i] = sums->terms[i];
  log->images = (int)p->global.images;
  log->class_error = p->global.matched > 0 ? sums->class_error_x_matched / p->global.matched : 100.0;
  log->cardinality_error = sums->cardinality_error_x_images / p->global.images;
  log->attn = f->attn;  // names from this process's forward, sums from every process's
  log->attn.images = sums->attn_images;
  for (int i = 0; i < ATTN_TRACE_MAX; i++) log->attn.sum[i] = sums->attn_sum[i];
  log->grad_norm = adamw_clip_step(&t->opt, t->o->optim.clip_max_norm);  // releases the gradients
  // Every process's stream moved by its own draws: continue from the furthest, so the state
  // (saved by rank 0) is one every rank can resume from.
  uint64_t offset = f->dropout_offset;
  dist_allreduce_max_u64(&t->dist, &offset, 1);
  t->st.dropout_rng.offset = offset;
}

// One optimizer step on this process's slice of the global batch. An empty slice (all its images
// skipped) contributes nothing but still takes part. Returns 0, or -1 with err set; a failure on
// any process fails the step on every process, so all stop together.
static int train_step(Trainer *t, const Batch *b, StepLog *log, char *err, size_t err_cap) {
  StepPlan plan;
  plan_step(t, b, &plan);
  log->n_terms = criterion_term_names(plan.n_aux, log->names);
  StepSums sums = {0};
  StepForward f = {.dropout_offset = t->st.dropout_rng.offset};
  ScopeMark mark = tensor_scope_mark();
  if (b->size > 0) forward_loss(t, b, &plan, log->n_terms, &f, &sums, err, err_cap);
  dist_allreduce_sum_f64(&t->dist, (double *)&sums, (int)STEP_SUMS_COUNT);
  int rc = 0;
  if (sums.failed > 0) {
    if (!(b->size > 0 && !f.have_loss)) snprintf(err, err_cap, "another process failed at this step (see its message)");
    rc = -1;
  } else if (!isfinite(sums.total)) {
    snprintf(err, err_cap, "the loss is %g", sums.total);
    rc = -1;
  } else {
    update(t, &plan, &f, &sums, log);
  }
  if (f.have_loss) criterion_result_free(&f.loss);
  if (f.out.n_layers) detr_output_free(&f.out);
  autograd_clear_tape();
  tensor_scope_release(mark);
  return rc;
}

// --- stage 3, logging ---

// A metrics.jsonl row (rank 0) and its TensorBoard scalars: each value as the row prints it, under
// the tag "<type>/<key>" (train/loss, eval/AP50, ...), so that the two match one to one.
typedef struct {
  FILE *f;
  TbWriter *tb;      // NULL: no event file
  const char *type;  // "train" or "eval"
  int64_t step;
} LogRow;

static void row_value(const LogRow *r, const char *key, const char *fmt, double v) {
  char text[64], tag[96];
  snprintf(text, sizeof text, fmt, v);
  fprintf(r->f, ", \"%s\": %s", key, text);
  snprintf(tag, sizeof tag, "%s/%s", r->type, key);
  tb_scalar(r->tb, r->step, tag, strtod(text, NULL));
}

static void row_end(const LogRow *r) {
  fprintf(r->f, "}\n");
  fflush(r->f);
  tb_flush(r->tb);
}

static void log_train_step(Trainer *t, const Batch *b, const StepLog *log, double seconds) {
  if (t->metrics) {  // every loss term, the logged errors, rates and the attention variant's statistics
    LogRow r = {t->metrics, t->tb, "train", t->st.step};
    fprintf(r.f, "{\"type\": \"train\", \"step\": %lld, \"epoch\": %lld, \"batch\": %lld", (long long)t->st.step,
            (long long)t->st.epoch, (long long)b->index);
    row_value(&r, "loss", "%.6f", log->total);
    for (int i = 0; i < log->n_terms; i++) row_value(&r, log->names[i], "%.6f", log->terms[i]);
    row_value(&r, "class_error", "%.4f", log->class_error);
    row_value(&r, "cardinality_error", "%.4f", log->cardinality_error);
    row_value(&r, "grad_norm", "%.6f", log->grad_norm);
    row_value(&r, "lr", "%.3g", (double)adamw_lr(&t->opt, LR_GROUP_MAIN));
    row_value(&r, "images_per_s", "%.3f", log->images / seconds);
    for (int i = 0; i < log->attn.n; i++) row_value(&r, log->attn.name[i], "%.2f", attn_stats_mean(&log->attn, i));
    row_end(&r);
  }
  history_add_step(&t->history, (double)t->st.step, as_logged(log->total));
  double shown[4] = {log->total, log->terms[0], log->terms[1], log->terms[2]};  // total, ce, bbox, giou
  progress_update(&t->progress, t->st.step, t->st.epoch, t->o->epochs, log->images, seconds, shown, &log->attn);
}

// The evaluation's row, then its pictures in the event file: the model's detections on the first
// val images (train/val_pictures.h), under "eval/predictions/<file name>".
static void log_eval(Trainer *t, int64_t epoch, const EvalReport *r) {
  if (!t->metrics) return;  // not rank 0
  LogRow row = {t->metrics, t->tb, "eval", t->st.step};
  fprintf(row.f, "{\"type\": \"eval\", \"epoch\": %lld, \"step\": %lld", (long long)epoch, (long long)t->st.step);
  for (int k = 0; k < COCO_N_STATS; k++) row_value(&row, coco_stat_names[k], "%.6f", r->coco.stats[k]);
  row_value(&row, "images", "%.0f", (double)r->images);
  row_value(&row, "seconds", "%.2f", r->seconds);
  for (int i = 0; i < r->attn.n; i++) row_value(&row, r->attn.name[i], "%.2f", attn_stats_mean(&r->attn, i));
  row_end(&row);
  if (!t->tb) return;
  ValPictures pics;
  char err[2048], tag[160];
  if (val_pictures_draw(t->m, t->val, t->o->val_aug, t->o->pad_multiple, 3, &pics, err, sizeof err)) {
    fprintf(stderr, "detr train: TensorBoard: the pictures of the val images: %s (the run goes on)\n", err);
    return;
  }
  for (int i = 0; i < pics.n; i++) {
    snprintf(tag, sizeof tag, "eval/predictions/%s", pics.name[i]);
    tb_image(t->tb, t->st.step, tag, &pics.img[i]);
  }
  tb_flush(t->tb);
  val_pictures_free(&pics);
}

// --- the epoch: steps, their log, checkpoints ---

// SIGINT, SIGTERM or SIGUSR1: the step in progress finishes and is checkpointed, then the run stops;
// a second signal ends the process at once (the checkpoints written so far are whole: writes are
// atomic). SIGUSR1 is the one OpenMPI's mpirun passes on to every process without killing them a
// second later, as it does after the SIGTERM it sends on a Ctrl-C (dist_mpirun_kill_grace_s); it
// is also what a batch scheduler can be asked to send before a job's time runs out.
// The signals are taken by one thread of their own (sigwait) and blocked in the threads train_run
// makes or reaches: oneDNN's AVX2 sgemm kernel runs with its stack pointer in a heap buffer, so a
// signal delivered to a compute thread there writes its frame into the heap (glibc then aborts on a
// corrupted chunk: about 1 in 40 runs stopped by Ctrl-C did, before this). Threads made before
// train_run (MPI's and the CUDA runtime's) do not block them: the kernel may deliver a signal there,
// and a handler passes it on to the signal thread (with the default action it would end the process:
// rank 1 of an mpirun job died of the first SIGUSR1 so).
static const int stop_signals[] = {SIGINT, SIGTERM, SIGUSR1};
#define N_STOP_SIGNALS (int)(sizeof stop_signals / sizeof stop_signals[0])
static volatile sig_atomic_t stop_signal;
static struct sigaction saved_actions[N_STOP_SIGNALS];  // the actions before train_run's
static sigset_t stop_set;                               // the signals the thread takes (not the ignored ones)
static pthread_t stop_thread;
static atomic_int stop_thread_alive;    // 1 while it runs: the handler may pthread_kill it
static atomic_int handlers_passing;     // handlers between reading stop_thread_alive and their pthread_kill
static sigset_t saved_mask;             // the calling thread's mask before train_run's
static bool stop_thread_speaks;         // rank 0 says that it stops (mpirun passes a signal to every rank)
static volatile sig_atomic_t stepping;  // set-up is over: a signal now stops after a step

static const char *stop_signal_name(int sig) {
  return sig == SIGINT ? "Ctrl-C" : sig == SIGTERM ? "SIGTERM" : "SIGUSR1";
}

static void *stop_signal_thread(void *arg) {
  (void)arg;
  static const char on_int[] =
      "\ndetr train: stopping after this step (and the evaluation due with it) to write a "
      "checkpoint; Ctrl-C again quits now, the last checkpoint kept\n";
  static const char in_setup[] = "\ndetr train: stopping before the first step\n";
  static const char on_term[] = "\ndetr train: SIGTERM: stopping after this step to write a checkpoint\n";
  static const char on_usr1[] = "\ndetr train: SIGUSR1: stopping after this step to write a checkpoint\n";
  for (;;) {
    int sig;
    if (sigwait(&stop_set, &sig) != 0) continue;
    if (stop_signal) {  // the second: its default action, now (this thread alone unblocks it)
      signal(sig, SIG_DFL);
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, sig);
      pthread_sigmask(SIG_UNBLOCK, &one, NULL);
      raise(sig);
      continue;
    }
    stop_signal = sig;
    const char *say = !stepping ? in_setup : sig == SIGINT ? on_int : sig == SIGTERM ? on_term : on_usr1;
    size_t len = strlen(say);
    if (stop_thread_speaks) {
      ssize_t ignored = write(STDERR_FILENO, say, len);
      (void)ignored;
    }
  }
  return NULL;
}

// Runs in a thread that does not block the signal (one made before train_run); async-signal-safe
// (lock-free atomics). Teardown waits for handlers_passing to reach 0 before the thread goes, so
// no pthread_kill reaches a joined thread; before the thread runs, the signal is noted here.
static void pass_on_stop_signal(int sig) {
  int saved_errno = errno;
  atomic_fetch_add(&handlers_passing, 1);
  if (atomic_load(&stop_thread_alive)) pthread_kill(stop_thread, sig);  // pending there until its sigwait takes it
  else if (!stop_signal) stop_signal = sig;
  atomic_fetch_sub(&handlers_passing, 1);
  errno = saved_errno;
}

// The mask in the calling thread and in every OpenMP thread (threads made later inherit it from the
// thread that makes them: the main thread's).
static void mask_stop_signals(int how) {
  pthread_sigmask(how, &stop_set, NULL);
#pragma omp parallel
  pthread_sigmask(how, &stop_set, NULL);
}

// A signal the caller ignores (a background job's SIGINT under nohup) stays ignored.
static void catch_stop_signals(bool on) {
  if (!on) {
    if (!atomic_exchange(&stop_thread_alive, 0)) return;  // none started (every stop signal ignored)
    for (int i = 0; i < N_STOP_SIGNALS; i++) sigaction(stop_signals[i], &saved_actions[i], NULL);
    while (atomic_load(&handlers_passing)) sched_yield();  // a handler still passing one on finishes first
    pthread_cancel(stop_thread);                           // sigwait is a cancellation point
    pthread_join(stop_thread, NULL);
    mask_stop_signals(SIG_UNBLOCK);                   // the OpenMP threads: train_run's own
    pthread_sigmask(SIG_SETMASK, &saved_mask, NULL);  // the caller's mask as it was (a signal still pending acts now)
    return;
  }
  sigemptyset(&stop_set);
  int taken = 0;
  for (int i = 0; i < N_STOP_SIGNALS; i++) {
    sigaction(stop_signals[i], NULL, &saved_actions[i]);
    if (saved_actions[i].sa_handler != SIG_IGN) taken += sigaddset(&stop_set, stop_signals[i]) == 0;
  }
  if (!taken) return;  // all ignored: nothing to take
  pthread_sigmask(SIG_BLOCK, &stop_set, &saved_mask);
  mask_stop_signals(SIG_BLOCK);
  // The handler before the thread: no moment where a signal to another thread has its default action.
  struct sigaction pass = {.sa_handler = pass_on_stop_signal, .sa_flags = SA_RESTART};
  sigfillset(&pass.sa_mask);
  for (int i = 0; i < N_STOP_SIGNALS; i++)
    if (sigismember(&stop_set, stop_signals[i])) sigaction(stop_signals[i], &pass, NULL);
  int rc = pthread_create(&stop_thread, NULL, stop_signal_thread, NULL);
  DETR_CHECK(rc == 0, "train_run: cannot start the signal thread: %s", strerror(rc));
  atomic_store(&stop_thread_alive, 1);
}

// Whether any process was asked to stop (every process must stop at the same step).
static int stop_requested(const Dist *g) {
  uint64_t sig = (uint64_t)stop_signal;
  dist_allreduce_max_u64(g, &sig, 1);
  return (int)sig;
}

// How to go on from the run's last checkpoint: the command that made the run, with --resume auto
// for its --resume and without --move-old-run; with `flag value` (NULL: none) instead of the
// run's own value of that flag.
// The next word of a stored command line (cli/cmd_train.c quotes each for the shell: a quoted one may
// hold spaces), NUL-terminated in place with its quotes kept; NULL at the end.
static char *next_word(char **at) {
  char *w = *at + strspn(*at, " ");
  if (!*w) return NULL;
  char *c = w;
  for (bool quoted = false; *c && (quoted || *c != ' '); c++)
    if (*c == '\'') quoted = !quoted;
  *at = *c ? c + 1 : c;
  *c = 0;
  return w;
}

static void print_resume_hint(const TrainOptions *o, const Dist *g, const char *how, const char *flag,
                              const char *value) {
  char text[sizeof o->train_config_text], *at = text;
  snprintf(text, sizeof text, "%s", o->train_config_text);
  if (g->world > 1)  // the launcher's own options (a host file, say) are not known here
    fprintf(stderr,
            "detr train: %s with the same %d processes and --batch, through your launcher (mpirun -np %d ...): "
            "detr",
            how, g->world, g->world);
  else fprintf(stderr, "detr train: %s with: detr", how);
  size_t flag_len = flag ? strlen(flag) : 0;
  for (char *w = next_word(&at); w; w = next_word(&at)) {
    bool replaced = flag && !strncmp(w, flag, flag_len) && (w[flag_len] == 0 || w[flag_len] == '=');
    if (!strcmp(w, "--resume") || (replaced && w[flag_len] == 0)) w = next_word(&at);  // and its value
    else if (strncmp(w, "--resume=", 9) && strncmp(w, "'--resume=", 10) && strcmp(w, "--move-old-run") && !replaced)
      fprintf(stderr, " %s", w);
    if (!w) break;
  }
  if (flag) fprintf(stderr, " %s %s", flag, value);
  fprintf(stderr, " --resume auto\n");
}

// The state at this step in ckpt-<step>, unless this run has written it already (the same on every
// rank, where a file check might not be); older checkpoints beyond --keep pruned.
static int save_final(Trainer *t) {
  char path[4200];
  ckpt_path(t->o, t->st.step, path, sizeof path);
  if (t->saved_step == t->st.step) return 0;
  if (save(&t->dist, t->o, path, t->m, &t->opt, &t->st, t->categories)) return -1;
  t->saved_step = t->st.step;
  prune_checkpoints(&t->dist, t->o, t->st.step);
  return 0;
}

// An image that failed to load mid-run under --bad-input fail (the loader's message, naming the
// file, is above): the finished steps are saved, then the two ways on are said. Returns -1.
static int stop_on_bad_data(Trainer *t) {
  const TrainOptions *o = t->o;
  if (t->st.step > 0 && save_final(t)) return -1;
  bool saved = t->saved_step == t->st.step;
  char path[4200];
  ckpt_path(o, t->st.step, path, sizeof path);
  if (!dist_is_main(&t->dist)) return -1;
  if (saved)
    fprintf(stderr,
            "detr train: stopped before step %lld on the data error above: the finished steps are saved in %s\n",
            (long long)t->st.step + 1, path);
  else fprintf(stderr, "detr train: stopped on the data error above before the first step: nothing had been trained\n");
  if (o->bad_input != BAD_INPUT_FAIL) {  // not one image (skip): nothing to skip past
    print_resume_hint(o, &t->dist, "resume once the data is readable", NULL, NULL);
    return -1;
  }
  print_resume_hint(o, &t->dist, "replace the file with a readable one and resume", NULL, NULL);
  print_resume_hint(o, &t->dist, "or leave out every unreadable image (counted at the end)", "--bad-input", "skip");
  return -1;
}

// Trains until the epoch ends, max_steps is reached (*stop) or a step fails (-1).
static int train_epoch(Trainer *t, bool *stop) {
  const TrainOptions *o = t->o;
  TrainState *st = &t->st;
  char err[4608], path[4200];
  while (!*stop) {
    const Batch *b;
    DataError derr;
    int s = loader_next(t->loader, &b, &derr);
    if (!dist_all_ok(&t->dist, s != DATA_ERROR)) {  // a data error on any process stops them all here
      if (s == DATA_ERROR) fprintf(stderr, "\ndetr train: %s\n", derr.msg);
      return stop_on_bad_data(t);
    }
    if (b->epoch != st->epoch) break;  // the loader moved on: this epoch is complete
    double t0 = now_s();
    StepLog log;
    if (train_step(t, b, &log, err, sizeof err)) {
      char kept[4300];
      if (t->saved_step >= 0 || (t->resumed && run_dir_contains(o->out_dir, o->resume)))
        snprintf(kept, sizeof kept, "The checkpoints in %s are from before this step.", o->out_dir);
      else
        snprintf(kept, sizeof kept,
                 "No checkpoint was written (the first comes at --checkpoint-every or the epoch's end).");
      fprintf(stderr, "\ndetr train: step %lld (epoch %lld, batch %lld): %s; stopping. %s\n", (long long)st->step + 1,
              (long long)st->epoch, (long long)b->index, err, kept);
      return -1;
    }
    st->step++;
    st->next_batch = b->index + 1;
    log_train_step(t, b, &log, now_s() - t0);
    if (cpu_share_update(&t->cpu) && dist_is_main(&t->dist)) {
      progress_end_line(&t->progress);
      cpu_share_log(&t->cpu, "detr train");
    }
    bool epoch_done = st->next_batch >= t->per_epoch;
    if (epoch_done) {
      st->epoch++;
      st->next_batch = 0;
    }
    if (o->max_steps > 0 && st->step >= o->max_steps) *stop = true;
    t->interrupted = stop_requested(&t->dist);
    if (t->interrupted) *stop = true;
    if ((o->checkpoint_every > 0 && st->step % o->checkpoint_every == 0) || (o->checkpoint_every == 0 && epoch_done) ||
        t->interrupted) {
      ckpt_path(o, st->step, path, sizeof path);
      if (save(&t->dist, o, path, t->m, &t->opt, st, t->categories)) return -1;
      t->saved_step = st->step;
      prune_checkpoints(&t->dist, o, st->step);
    }
    if (epoch_done) break;
  }
  return 0;
}

// --- stage 4, evaluation: COCO AP on the val split, its log, the best checkpoint ---

// Whether the epochs done so far end at an evaluation: every --eval-every epochs, and the last.
static bool evaluation_due(const TrainOptions *o, int64_t epochs_done, bool last) {
  return (o->eval_every > 0 && epochs_done % o->eval_every == 0) || last;
}

// Whether the run owes the evaluation due at the end of its checkpoint's epoch: killed during it,
// the run resumes from the checkpoint saved before it, and the evaluation's line was never written
// (metrics.jsonl's history, read by rank 0; every rank gets its answer).
static bool owes_evaluation(Trainer *t) {
  const TrainOptions *o = t->o;
  uint64_t owes = 0;
  if (t->resumed && t->val && t->st.next_batch == 0 && t->st.epoch > 0 && dist_is_main(&t->dist)) {
    bool due = evaluation_due(o, t->st.epoch, t->st.epoch >= o->epochs);
    bool logged = false;
    for (int i = 0; i < t->history.n_evals; i++) logged = logged || t->history.epoch[i] == (double)t->st.epoch;
    owes = due && !logged;
  }
  dist_allreduce_max_u64(&t->dist, &owes, 1);
  return owes != 0;
}

static int evaluate_epoch(Trainer *t) {
  const TrainOptions *o = t->o;
  int64_t epoch = t->st.epoch - 1;
  char results[4200], err[2048];
  run_dir_results_path(o->out_dir, epoch, results, sizeof results);
  EvalConfig ec = {.batch_size = o->batch_size,
                   .num_workers = o->workers,
                   .aug = o->val_aug,
                   .pad_multiple = o->pad_multiple,
                   .policy = o->bad_input,
                   .results_path = results,
                   .progress = o->progress && dist_is_main(&t->dist),
                   .dist = t->dist};
  EvalReport rep;
  if (evaluate_model(t->m, t->val, &ec, &rep, err, sizeof err)) {
    fprintf(stderr, "detr train: evaluation failed: %s\n", err);
    return -1;
  }
  if (dist_is_main(&t->dist)) {
    fprintf(stderr, "epoch %lld: COCO evaluation of %lld images (%.1f s)\n", (long long)epoch, (long long)rep.images,
            rep.seconds);
    coco_print_summary(&rep.coco, stderr);
  }
  log_eval(t, epoch, &rep);
  history_add_eval(&t->history, (double)epoch, as_logged(rep.coco.stats[COCO_AP]),
                   as_logged(rep.coco.stats[COCO_AP50]));
  write_chart(&t->dist, o, &t->history);
  double ap = rep.coco.stats[COCO_AP];
  bool best = ap > t->st.best_map;
  if (best) t->st.best_map = ap, t->st.best_epoch = epoch;
  // Each results file holds every detection of every val image (about 117 bytes each: COCO
  // val2017's 100 an image make 58 MB an evaluation, 17 GB over 300 epochs): the best's and this
  // one's are kept. A best from a checkpoint that did not record its epoch keeps them all.
  bool best_known = t->st.best_epoch >= 0 || t->st.best_map < 0;
  if (!o->keep_all_results && best_known && dist_is_main(&t->dist))
    run_dir_prune_results(o->out_dir, epoch, t->st.best_epoch);
  if (!best) return 0;
  char path[4200];
  snprintf(path, sizeof path, "%s/best.safetensors", o->out_dir);
  if (save(&t->dist, o, path, t->m, &t->opt, &t->st, t->categories)) return -1;
  // The step's checkpoint, written before this evaluation (so that a crash in it loses nothing),
  // holds the best AP from before it: written again, so that a run resumed from it knows this best
  // and does not replace best.safetensors with a worse model at its next evaluation.
  if (t->saved_step != t->st.step) return 0;
  ckpt_path(o, t->st.step, path, sizeof path);
  return save(&t->dist, o, path, t->m, &t->opt, &t->st, t->categories);
}

// --- stage 5, the final checkpoint: the last state, whatever the checkpoint interval ---

// Nothing to train: the run is at its --max-steps or past its last epoch.
static bool run_complete(const Trainer *t) {
  const TrainOptions *o = t->o;
  if (o->max_steps > 0 && t->st.step >= o->max_steps) {
    if (dist_is_main(&t->dist))
      fprintf(stderr,
              "detr train: %s is at step %lld, which --max-steps %lld has reached: nothing to do (a larger "
              "--max-steps trains on)\n",
              o->out_dir, (long long)t->st.step, (long long)o->max_steps);
    return true;
  }
  if (t->st.epoch >= o->epochs) {
    if (dist_is_main(&t->dist))
      fprintf(stderr,
              "detr train: %s has finished its %d epochs (step %lld): nothing to do (a larger --epochs trains "
              "on)\n",
              o->out_dir, o->epochs, (long long)t->st.step);
    return true;
  }
  return false;
}

// Why the run stopped, where its state is, and how to go on.
static void report_end(const Trainer *t, int rc) {
  const TrainOptions *o = t->o;
  if (!dist_is_main(&t->dist) || rc) return;
  char path[4200];
  ckpt_path(o, t->st.step, path, sizeof path);
  if (t->interrupted) {
    fprintf(stderr, "detr train: interrupted at step %lld (%s): the state is in %s\n", (long long)t->st.step,
            stop_signal_name(t->interrupted), path);
    print_resume_hint(o, &t->dist, "resume", NULL, NULL);
  } else if (o->max_steps > 0 && t->st.step >= o->max_steps) {
    fprintf(stderr,
            "detr train: stopped at step %lld (--max-steps %lld): the state is in %s; continue with --resume "
            "auto and a larger --max-steps\n",
            (long long)t->st.step, (long long)o->max_steps, path);
  } else if (t->val && t->st.best_map >= 0) {
    fprintf(stderr,
            "detr train: finished %d epochs at step %lld: the state is in %s, the best AP %.4f in "
            "%s/best.safetensors\n",
            o->epochs, (long long)t->st.step, path, t->st.best_map, o->out_dir);
  } else {
    fprintf(stderr, "detr train: finished %d epochs at step %lld: the state is in %s\n", o->epochs,
            (long long)t->st.step, path);
  }
}

int train_run(TrainOptions *o, const Dist *group, RunLock *lock) {
  Trainer t = {.o = o, .dist = *group, .saved_step = -1};
  if (lock && lock->held) t.lock = *lock, *lock = (RunLock){0};
  char err[4608];
  stop_signal = 0;
  stepping = 0;
  stop_thread_speaks = dist_is_main(group);
  catch_stop_signals(true);
  int rc = trainer_setup(&t, err, sizeof err);
  if (rc) fprintf(stderr, "detr train: %s\n", err);
  // During set-up: nothing trained, nothing to checkpoint. Every rank must agree (a signal passed on
  // by mpirun reaches them a moment apart).
  if (rc == 0 && (t.interrupted = stop_requested(&t.dist))) {
    if (dist_is_main(&t.dist)) fprintf(stderr, "detr train: interrupted before the first step: nothing trained\n");
    rc = -1;
  }
  bool complete = rc == 0 && run_complete(&t), stop = complete;
  if (rc == 0 && !complete && t.metrics) open_tensorboard(&t);  // a run with nothing to do writes nothing
  if (rc == 0 && !complete && owes_evaluation(&t)) rc = evaluate_epoch(&t);
  stepping = 1;
  while (rc == 0 && !stop && t.st.epoch < o->epochs) {
    t.opt.epoch = (int)t.st.epoch;
    double epoch_t0 = now_s();
    rc = train_epoch(&t, &stop);
    if (rc) break;
    progress_end_line(&t.progress);
    // The last epoch, or a --max-steps stop at an epoch's end, is evaluated; a signal stops at once
    // (an evaluation would delay it, and a run left alone would not have made it).
    bool epoch_finished = t.st.next_batch == 0, last = t.st.epoch >= o->epochs || (stop && !t.interrupted);
    if (epoch_finished && dist_is_main(&t.dist))
      fprintf(stderr, "epoch %lld done in %.1f s\n", (long long)t.st.epoch - 1, now_s() - epoch_t0);
    if (epoch_finished && t.val && evaluation_due(o, t.st.epoch, last)) rc = evaluate_epoch(&t);
  }
  if (rc == 0 && !complete) rc = save_final(&t);
  if (rc == 0 && !complete) write_chart(&t.dist, o, &t.history);
  if (!complete) report_end(&t, rc);
  run_lock_release(&t.lock);  // before the stop signals act again: a Ctrl-C now must not leave it
  catch_stop_signals(false);
  int interrupted = t.interrupted;
  trainer_free(&t);
  return interrupted ? 128 + interrupted : rc ? 1 : 0;
}
