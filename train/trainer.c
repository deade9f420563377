#define _DEFAULT_SOURCE  // mkdir, opendir
#include "train/trainer.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/cpu_kernels.h"
#include "nn/model_io.h"
#include "train/checkpoint.h"
#include "train/dist.h"
#include "train/evaluate.h"
#include "train/draw.h"
#include "train/progress.h"
#include "train/setup.h"

TrainOptions train_options_default(void) {
  TrainOptions o = {.optim = optim_config_default(), .epochs = 300, .batch_size = 2, .workers = 2, .seed = 42,
                    .device = DEVICE_CPU, .train_split = "train", .val_split = "val", .bad_input = BAD_INPUT_FAIL,
                    .out_dir = "runs/detr", .eval_every = 1, .keep_last = 2, .progress = true};
  detr_config_preset("detr-r50", &o.model);
  o.train_aug = aug_config_detr(true);
  o.val_aug = aug_config_detr(false);
  return o;
}

static CocoDataset *open_split(const TrainOptions *o, const char *split, char *err, size_t cap) {
  char ann[4096], img[4096];
  setup_split_paths(o->data_dir, split, ann, sizeof ann, img, sizeof img);
  CocoOpenConfig cc = {.ann_path = ann, .image_dir = img, .policy = o->bad_input};
  CocoDataset *ds = NULL;
  DataError derr;
  if (coco_open(&cc, &ds, &derr)) {
    snprintf(err, cap, "%s", derr.msg);
    return NULL;
  }
  return ds;
}

static int mkdir_p(const char *dir, char *err, size_t cap) {
  char path[4096];
  snprintf(path, sizeof path, "%s", dir);
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    if (mkdir(path, 0777) && errno != EEXIST) goto fail;
    *p = '/';
  }
  if (mkdir(path, 0777) && errno != EEXIST) goto fail;
  return 0;
fail:
  if (snprintf(err, cap, "%s: cannot create the directory: %s", path, strerror(errno)) >= (int)cap) err[cap - 1] = 0;
  return -1;
}

// Checkpoint steps in the run directory (ckpt-<step>.safetensors), newest first.
static int list_checkpoints(const char *dir, int64_t *steps, int cap) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < cap) {
    long long step;
    char tail[32];
    if (sscanf(e->d_name, "ckpt-%lld.%31s", &step, tail) == 2 && !strcmp(tail, "safetensors")) steps[n++] = step;
  }
  closedir(d);
  for (int i = 1; i < n; i++)  // insertion sort, descending
    for (int j = i; j > 0 && steps[j] > steps[j - 1]; j--) {
      int64_t t = steps[j];
      steps[j] = steps[j - 1];
      steps[j - 1] = t;
    }
  return n;
}

static void ckpt_path(const TrainOptions *o, int64_t step, char *out, size_t cap) {
  snprintf(out, cap, "%s/ckpt-%lld.safetensors", o->out_dir, (long long)step);
}

static void prune_checkpoints(const TrainOptions *o) {
  if (!dist_is_main()) return;
  int64_t steps[1024];
  int n = list_checkpoints(o->out_dir, steps, 1024);
  for (int i = o->keep_last; i < n; i++) {
    char path[4200];
    ckpt_path(o, steps[i], path, sizeof path);
    remove(path);
  }
}

// Rank 0 writes (every rank holds the same state); every rank learns whether it worked.
static int save(const TrainOptions *o, const char *path, const DetrModel *m, const AdamW *opt, const TrainState *st,
                const char *categories) {
  char err[1024];
  bool ok = true;
  if (dist_is_main() && checkpoint_save(path, m, opt, st, o->train_config_text, categories, err, sizeof err)) {
    fprintf(stderr, "detr train: %s\n", err);
    ok = false;
  }
  return dist_all_ok(ok) ? 0 : -1;
}

// The newest checkpoint in the run directory that loads, skipping damaged ones with a message.
static int resume_auto(const TrainOptions *o, DetrModel *m, AdamW *opt, TrainState *st, bool *resumed) {
  int64_t steps[1024];
  int n = list_checkpoints(o->out_dir, steps, 1024);
  for (int i = 0; i < n; i++) {
    char path[4200], err[2048];
    ckpt_path(o, steps[i], path, sizeof path);
    if (checkpoint_load(path, m, opt, st, err, sizeof err) == 0) {
      if (dist_is_main()) fprintf(stderr, "detr train: resuming from %s (step %lld)\n", path, (long long)st->step);
      *resumed = true;
      return 0;
    }
    fprintf(stderr, "detr train: skipping %s: %s\n", path, err);
  }
  *resumed = false;
  return 0;
}

// A number after `"key": ` in a JSON line, or NAN.
static double json_number(const char *line, const char *key) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"%s\": ", key);
  const char *at = strstr(line, pattern);
  return at ? strtod(at + strlen(pattern), NULL) : NAN;
}

int metrics_chart_render(const char *metrics_path, const char *title, Image *out, char *err, size_t err_cap) {
  *out = (Image){0};
  FILE *f = fopen(metrics_path, "r");
  if (!f) {
    snprintf(err, err_cap, "%s: cannot open: %s", metrics_path, strerror(errno));
    return -1;
  }
  int cap = 0, n = 0, ne = 0;
  double *step = NULL, *loss = NULL, *mean = NULL;
  double epoch[METRICS_CHART_MAX_EVALS], ap[METRICS_CHART_MAX_EVALS], ap50[METRICS_CHART_MAX_EVALS];
  char line[8192];
  bool ok = true, partial = false;
  while (ok && fgets(line, sizeof line, f)) {
    // A line longer than the buffer (not one this program writes) is skipped whole: its
    // continuation must not be read as a line of its own.
    bool complete = strchr(line, '\n') || feof(f);
    bool skip = partial;
    partial = !complete;
    if (skip || !complete) continue;
    if (strstr(line, "\"type\": \"eval\"")) {
      if (ne == METRICS_CHART_MAX_EVALS) continue;
      epoch[ne] = json_number(line, "epoch") + 1, ap[ne] = json_number(line, "AP"), ap50[ne] = json_number(line, "AP50");
      ne++;
    } else if (strstr(line, "\"type\": \"train\"")) {
      if (n == METRICS_CHART_MAX_STEPS) continue;
      if (n == cap) {
        cap = cap ? 2 * cap : 1024;
        double *a = realloc(step, sizeof(double) * (size_t)cap), *b = a ? realloc(loss, sizeof(double) * (size_t)cap) : NULL;
        if (a) step = a;
        if (b) loss = b;
        ok = a && b;
        if (!ok) break;
      }
      step[n] = json_number(line, "step"), loss[n] = json_number(line, "loss");
      n++;
    }
  }
  fclose(f);
  mean = ok ? malloc(sizeof(double) * (size_t)(n ? n : 1)) : NULL;
  if (!mean) {
    snprintf(err, err_cap, "%s: out of memory reading %d steps", metrics_path, n);
    free(step), free(loss);
    return -1;
  }
  double run = 0;
  for (int i = 0; i < n; i++) {  // running mean over the last 50 steps
    run += loss[i] - (i >= 50 ? loss[i - 50] : 0.0);
    mean[i] = run / (i + 1 < 50 ? i + 1 : 50);
  }
  ChartSpec spec = {.title = title, .n_panels = 2};
  spec.panels[0] = (ChartPanel){.title = "loss", .x_label = "step", .y_label = "weighted loss", .n_series = 2};
  spec.panels[0].series[0] = (ChartSeries){.name = "step", .x = step, .y = loss, .n = n, .colour = {190, 200, 230}};
  spec.panels[0].series[1] = (ChartSeries){.name = "mean of 50", .x = step, .y = mean, .n = n, .colour = {30, 80, 200}};
  spec.panels[1] = (ChartPanel){.title = "COCO AP (val)", .x_label = "epoch", .y_label = "AP", .n_series = 2};
  spec.panels[1].series[0] = (ChartSeries){.name = "AP", .x = epoch, .y = ap, .n = ne, .colour = {200, 60, 40}};
  spec.panels[1].series[1] = (ChartSeries){.name = "AP50", .x = epoch, .y = ap50, .n = ne, .colour = {40, 160, 60}};
  chart_render(&spec, out);
  free(step), free(loss), free(mean);
  return 0;
}

// OUT/chart.png from OUT/metrics.jsonl. A chart that fails to render is reported and training
// goes on.
static void write_chart(const TrainOptions *o) {
  if (!dist_is_main()) return;
  char path[4200], err[1024], title[96];
  snprintf(path, sizeof path, "%s/metrics.jsonl", o->out_dir);
  snprintf(title, sizeof title, "DETR training (encoder attention: %s)", detr_encoder_attn(&o->model)->name);
  Image img;
  if (access(path, F_OK) != 0) return;  // no metrics yet
  if (metrics_chart_render(path, title, &img, err, sizeof err)) {
    fprintf(stderr, "detr train: chart: %s\n", err);
    return;
  }
  snprintf(path, sizeof path, "%s/chart.png", o->out_dir);
  if (image_save_png(path, &img, err, sizeof err)) fprintf(stderr, "detr train: chart: %s\n", err);
  image_free(&img);
}

static void log_eval(FILE *metrics, int64_t epoch, int64_t step, const EvalReport *r) {
  if (!metrics) return;  // not rank 0
  fprintf(metrics, "{\"type\": \"eval\", \"epoch\": %lld, \"step\": %lld", (long long)epoch, (long long)step);
  for (int k = 0; k < COCO_N_STATS; k++) fprintf(metrics, ", \"%s\": %.6f", coco_stat_names[k], r->coco.stats[k]);
  fprintf(metrics, ", \"images\": %lld, \"seconds\": %.2f", (long long)r->images, r->seconds);
  for (int i = 0; i < r->attn.n; i++) fprintf(metrics, ", \"%s\": %.2f", r->attn.name[i], attn_stats_mean(&r->attn, i));
  fprintf(metrics, "}\n");
  fflush(metrics);
}

static int run_eval(const TrainOptions *o, const DetrModel *m, const CocoDataset *val, int64_t epoch, int64_t step,
                    FILE *metrics, EvalReport *rep) {
  char results[4200], err[2048];
  snprintf(results, sizeof results, "%s/results-epoch%lld.json", o->out_dir, (long long)epoch);
  EvalConfig ec = {.batch_size = o->batch_size, .num_workers = o->workers, .aug = o->val_aug,
                   .policy = o->bad_input, .results_path = results, .progress = o->progress && dist_is_main(),
                   .distributed = true};
  if (evaluate_model(m, val, &ec, rep, err, sizeof err)) {
    fprintf(stderr, "detr train: evaluation failed: %s\n", err);
    return -1;
  }
  if (dist_is_main()) {
    fprintf(stderr, "epoch %lld: COCO evaluation of %lld images (%.1f s)\n", (long long)epoch,
            (long long)rep->images, rep->seconds);
    coco_print_summary(&rep->coco, stderr);
  }
  log_eval(metrics, epoch, step, rep);
  write_chart(o);
  return 0;
}

// The loss terms of one step summed over the processes, for logging (see train_step).
typedef struct {
  double total, terms[DETR_MAX_LOSS_TERMS];
  char names[DETR_MAX_LOSS_TERMS][24];
  int n_terms;
  double class_error, cardinality_error;  // means over the global batch's images
  AttnStatSums attn;                      // the encoder-attention variant's statistics
  double grad_norm;                       // before clipping
  int images;
} StepLog;

// One optimizer step on this process's slice b of the global batch: forward, loss, backward,
// gradient all-reduce (data parallel), clipping, AdamW. An empty slice (all its images skipped)
// contributes nothing but still takes part. Returns 0, or -1 with err set; a failure on any
// process fails the step on every process, so all stop together.
static int train_step(const TrainOptions *o, DetrModel *m, AdamW *opt, const CriterionConfig *ccfg, const Batch *b,
                      TrainState *st, StepLog *log, char *err, size_t err_cap) {
  int world = dist_world_size();
  int64_t Q = o->model.num_queries;
  int n_aux = o->model.aux_loss ? (int)o->model.dec_layers - 1 : 0;
  // The global batch's normalisers: its boxes, and the sum of its queries' cross-entropy class
  // weights (1 for a matched query's class, eos_coef for "no object"; every target is matched
  // when it has at most Q boxes).
  DetrTarget targets[64];
  DETR_CHECK(b->size <= 64, "train: batch of %d images", b->size);
  double boxes = 0.0, matched = 0.0;
  for (int i = 0; i < b->size; i++) {
    targets[i] = (DetrTarget){.n = b->targets[i].n, .boxes = b->targets[i].boxes, .labels = b->targets[i].labels};
    boxes += b->targets[i].n;
    matched += b->targets[i].n < Q ? b->targets[i].n : Q;
  }
  double ce_weight = matched + ccfg->eos_coef * ((double)b->size * (double)Q - matched);
  double global[4] = {boxes, ce_weight, matched, (double)b->size};  // summed over the processes
  dist_allreduce_sum_f64(global, 4);
  CriterionConfig cc = *ccfg;
  cc.ce_share = world > 1 ? (float)(ce_weight / global[1]) : 1.0f;
  float num_boxes = global[0] > 1.0 ? (float)global[0] : 1.0f;

  // [failed, total, terms..., class_error * matched, cardinality_error * images, images with
  //  attention stats, the attention stats' sums...]
  enum { S_FAILED, S_TOTAL, S_TERMS };
  log->n_terms = criterion_term_names(n_aux, log->names);
  int T = log->n_terms, n_stats = S_TERMS + T + 3 + ATTN_TRACE_MAX;
  double stats[S_TERMS + DETR_MAX_LOSS_TERMS + 3 + ATTN_TRACE_MAX] = {0};
  AttnStatSums attn = {0};
  ScopeMark mark = tensor_scope_mark();
  DetrOutput out = {0};
  CriterionResult loss = {0};
  bool have_loss = false;
  uint64_t dropout_offset = st->dropout_rng.offset;
  if (b->size > 0) {
    // Each process draws its own dropout masks (the rank picks the stream; rank 0's is the
    // single-process one), all from the saved position, so a resumed run draws the same.
    Rng dropout = st->dropout_rng;
    dropout.seed ^= 0x9E3779B97F4A7C15ull * (uint64_t)dist_rank();
    NnCtx ctx = {.training = true, .dropout_rng = &dropout};
    Tensor *images = tensor_scoped(batch_images_tensor(b, o->device));
    if (detr_model_forward(m, &ctx, images, b->mask, &out, err, err_cap) ||
        criterion_forward(&cc, out.layers[out.n_layers - 1], out.layers, n_aux, targets, num_boxes, NULL, &loss, err,
                          err_cap)) {
      stats[S_FAILED] = 1.0;
    } else {
      have_loss = true;
      stats[S_TOTAL] = tensor_item(loss.total);
      DETR_CHECK(loss.n_terms == T, "train: %d loss terms, expected %d", loss.n_terms, T);
      for (int i = 0; i < T; i++) stats[S_TERMS + i] = tensor_item(loss.terms[i].value);
      stats[S_TERMS + T] = loss.class_error * matched;  // a percentage of the matched queries
      stats[S_TERMS + T + 1] = loss.cardinality_error * b->size;
      attn_stats_add(&attn, out.attn, out.n_attn, b->size);
      stats[S_TERMS + T + 2] = attn.images;
      for (int i = 0; i < ATTN_TRACE_MAX; i++) stats[S_TERMS + T + 3 + i] = attn.sum[i];
    }
    dropout_offset = dropout.offset;
  }
  dist_allreduce_sum_f64(stats, n_stats);
  int rc = 0;
  if (stats[S_FAILED] > 0) {
    if (!(b->size > 0 && !have_loss)) snprintf(err, err_cap, "another process failed at this step (see its message)");
    rc = -1;
  } else if (!isfinite(stats[S_TOTAL])) {
    snprintf(err, err_cap, "the loss is %g", stats[S_TOTAL]);
    rc = -1;
  }
  if (rc == 0) {
    if (have_loss) autograd_backward(loss.total);
    dist_allreduce_gradients(&m->params);
    log->total = stats[S_TOTAL];
    for (int i = 0; i < T; i++) log->terms[i] = stats[S_TERMS + i];
    double images = global[3];
    log->images = (int)images;
    log->class_error = global[2] > 0 ? stats[S_TERMS + T] / global[2] : 100.0;
    log->cardinality_error = stats[S_TERMS + T + 1] / images;
    log->attn = attn;  // names from this process's forward, sums from every process's
    log->attn.images = stats[S_TERMS + T + 2];
    for (int i = 0; i < ATTN_TRACE_MAX; i++) log->attn.sum[i] = stats[S_TERMS + T + 3 + i];
    log->grad_norm = clip_grad_norm(&m->params, o->optim.clip_max_norm);
    adamw_step(opt);
    for (int i = 0; i < m->params.count; i++) autograd_zero_grad(&m->params.items[i].tensor, 1);
    // Every process's stream moved by its own draws: continue from the furthest, so the state
    // (saved by rank 0) is one every rank can resume from.
    uint64_t offset = dropout_offset;
    dist_allreduce_max_u64(&offset, 1);
    st->dropout_rng.offset = offset;
  }
  if (have_loss) criterion_result_free(&loss);
  if (out.n_layers) detr_output_free(&out);
  autograd_clear_tape();
  tensor_scope_release(mark);
  return rc;
}

int train_run(TrainOptions *o) {
  char err[4096];
  if (o->threads > 0) omp_set_num_threads(o->threads);
  cpu_flush_denormals(true);
  int world = dist_world_size();
  if (dist_setup_device(o->device, err, sizeof err)) {
    fprintf(stderr, "detr train: %s\n", err);
    return 1;
  }
  if (mkdir_p(o->out_dir, err, sizeof err)) {
    fprintf(stderr, "detr train: %s\n", err);
    return 1;
  }
  CocoDataset *train = open_split(o, o->train_split, err, sizeof err), *val = NULL;
  if (train) val = open_split(o, o->val_split, err, sizeof err);
  if (!train || !val) {
    fprintf(stderr, "detr train: %s\n", err);
    coco_free(train);
    return 1;
  }
  if (o->model.num_classes < train->num_classes) {
    fprintf(stderr, "detr train: the data has category ids up to %d but the model has num_classes %lld "
            "(set --set num_classes=%d)\n", train->num_classes - 1, (long long)o->model.num_classes, train->num_classes);
    coco_free(train);
    coco_free(val);
    return 1;
  }
  // "id:name;..." of the training categories, stored in every checkpoint for `detr predict`.
  char categories[4096] = "";
  for (int i = 0, n = 0; i < train->n_categories && n < (int)sizeof categories - 1; i++)
    n += snprintf(categories + n, sizeof categories - (size_t)n, "%s%d:%s", i ? ";" : "", train->categories[i].id,
                  train->categories[i].name);
  DetrModel *m = detr_model_create(&o->model, o->device);
  detr_model_init(m, o->seed);
  AdamW opt;
  adamw_init(&opt, &m->params, o->optim);
  TrainState st = {.seed = o->seed, .dropout_rng = rng_make(o->seed ^ 0xd40bu), .best_map = -1.0,
                   .world_size = world, .global_batch = (int64_t)world * o->batch_size};
  int rc = 1;
  FILE *metrics = NULL;
  DataLoader *loader = NULL;
  bool resumed = false;
  if (o->resume && !strcmp(o->resume, "auto")) {
    resume_auto(o, m, &opt, &st, &resumed);
  } else if (o->resume) {
    if (checkpoint_load(o->resume, m, &opt, &st, err, sizeof err)) {
      fprintf(stderr, "detr train: --resume %s\n", err);
      goto done;
    }
    resumed = true;
  }
  if (resumed && (st.world_size != world || (st.global_batch && st.global_batch != (int64_t)world * o->batch_size))) {
    // The data position counts global batches: another split of them would train on other data.
    fprintf(stderr, "detr train: the checkpoint was written by a run of %d process%s with %lld images per step; this "
            "run has %d process%s with %lld: resume with the same number of processes and --batch, or start a new "
            "run directory\n", st.world_size, st.world_size == 1 ? "" : "es", (long long)st.global_batch, world,
            world == 1 ? "" : "es", (long long)world * o->batch_size);
    goto done;
  }
  uint64_t resumed_at[2] = {(uint64_t)st.step, ~(uint64_t)st.step};  // max of step and of -step: all equal?
  dist_allreduce_max_u64(resumed_at, 2);
  if (resumed_at[0] != (uint64_t)st.step || ~resumed_at[1] != (uint64_t)st.step) {
    fprintf(stderr, "detr train: the processes resumed from different checkpoints (this one at step %lld): is %s "
            "one directory shared by all of them?\n", (long long)st.step, o->out_dir);
    goto done;
  }
  if (!resumed && o->init_weights && params_load_file(&m->params, o->init_weights, err, sizeof err)) {
    fprintf(stderr, "detr train: --init %s\n", err);
    goto done;
  }
  if (!resumed && o->init_backbone &&
      params_load_file_prefix(&m->params, o->init_backbone, "backbone.", err, sizeof err)) {
    fprintf(stderr, "detr train: --init-backbone %s\n", err);
    goto done;
  }
  if (!resumed && o->calibrate_bn) {  // the first 8 training images, resized as for evaluation
    LoaderConfig cal = loader_config_default(false);
    cal.batch_size = 8;
    cal.num_workers = 0;
    cal.aug = o->val_aug;
    cal.policy = o->bad_input;
    cal.quiet = true;
    DataLoader *cl = NULL;
    const Batch *cb;
    DataError cerr;
    if (loader_create(train, &cal, (LoaderPosition){0, 0}, &cl, &cerr) || loader_next(cl, &cb, &cerr) != DATA_OK) {
      fprintf(stderr, "detr train: --calibrate-bn: %s\n", cerr.msg);
      loader_free(cl);
      goto done;
    }
    Tensor *x = batch_images_tensor(cb, o->device);
    resnet_calibrate(&m->backbone, x);
    tensor_release(x);
    loader_free(cl);
    if (dist_is_main()) fprintf(stderr, "detr train: frozen batch norms calibrated on %d training images\n", cb->size);
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/metrics.jsonl", o->out_dir);
  if (dist_is_main()) {  // rank 0 logs; the others compute
    metrics = fopen(path, resumed ? "a" : "w");
    if (!metrics) fprintf(stderr, "detr train: %s: cannot write: %s\n", path, strerror(errno));
  }
  if (!dist_all_ok(metrics || !dist_is_main())) goto done;
  LoaderConfig lc = loader_config_default(true);
  lc.batch_size = o->batch_size;
  lc.num_workers = o->workers;
  lc.seed = o->seed;
  lc.aug = o->train_aug;
  lc.policy = o->bad_input;
  lc.shard = dist_rank();  // each process: its slice of every global batch
  lc.shards = world;
  DataError derr;
  if (loader_create(train, &lc, (LoaderPosition){st.epoch, st.next_batch}, &loader, &derr)) {
    fprintf(stderr, "detr train: %s\n", derr.msg);
    goto done;
  }
  int64_t per_epoch = loader_batches_per_epoch(loader);
  if (per_epoch == 0) {
    fprintf(stderr, "detr train: %s has fewer images than one batch of %d\n", train->ann_path, o->batch_size);
    goto done;
  }
  if (dist_is_main()) {
    fprintf(stderr, "detr train: %lld training images (%lld batches of %lld per epoch), %lld val images, %lld trainable "
            "parameters, encoder attention %s, run directory %s\n", (long long)train->n_images, (long long)per_epoch,
            (long long)world * o->batch_size, (long long)val->n_images,
            (long long)params_numel(&m->params, PARAM_TRAINABLE), detr_encoder_attn(&m->cfg)->name, o->out_dir);
    if (world > 1)
      fprintf(stderr, "detr train: data parallel over %d processes (%s), %d images each per step\n", world,
              dist_backend_name(), o->batch_size);
  }
  CriterionConfig ccfg = criterion_config_default((int)o->model.num_classes);
  Progress prog;
  int64_t total_steps = (int64_t)o->epochs * per_epoch;
  if (o->max_steps > 0 && o->max_steps < total_steps) total_steps = o->max_steps;
  progress_init(&prog, o->progress && dist_is_main(), st.step, total_steps);
  bool stop = false;
  while (!stop && st.epoch < o->epochs) {
    opt.epoch = (int)st.epoch;
    double epoch_t0 = now_s();
    while (!stop) {
      const Batch *b;
      int s = loader_next(loader, &b, &derr);
      if (!dist_all_ok(s != DATA_ERROR)) {  // a data error on any process stops them all here
        if (s == DATA_ERROR) fprintf(stderr, "\ndetr train: %s\n", derr.msg);
        goto done;
      }
      if (b->epoch != st.epoch) break;  // the loader moved on: this epoch is complete
      double t0 = now_s();
      StepLog log;
      if (train_step(o, m, &opt, &ccfg, b, &st, &log, err, sizeof err)) {
        fprintf(stderr, "\ndetr train: step %lld (epoch %lld, batch %lld): %s; stopping. The checkpoints in %s are "
                "from before this step.\n", (long long)st.step + 1, (long long)st.epoch, (long long)b->index, err,
                o->out_dir);
        goto done;
      }
      st.step++;
      st.next_batch = b->index + 1;
      double dt = now_s() - t0;
      if (metrics) {  // every loss term, the logged errors, rates and the attention variant's statistics
        fprintf(metrics, "{\"type\": \"train\", \"step\": %lld, \"epoch\": %lld, \"batch\": %lld, \"loss\": %.6f",
                (long long)st.step, (long long)st.epoch, (long long)b->index, log.total);
        for (int i = 0; i < log.n_terms; i++) fprintf(metrics, ", \"%s\": %.6f", log.names[i], log.terms[i]);
        fprintf(metrics, ", \"class_error\": %.4f, \"cardinality_error\": %.4f, \"grad_norm\": %.6f, \"lr\": %.3g, "
                "\"images_per_s\": %.3f", log.class_error, log.cardinality_error, log.grad_norm,
                (double)adamw_lr(&opt, LR_GROUP_MAIN), log.images / dt);
        for (int i = 0; i < log.attn.n; i++)
          fprintf(metrics, ", \"%s\": %.2f", log.attn.name[i], attn_stats_mean(&log.attn, i));
        fprintf(metrics, "}\n");
        fflush(metrics);
      }
      double shown[4] = {log.total, log.terms[0], log.terms[1], log.terms[2]};  // total, ce, bbox, giou
      progress_update(&prog, st.step, st.epoch, o->epochs, log.images, dt, shown, &log.attn);
      bool epoch_done = st.next_batch >= per_epoch;
      if (epoch_done) {
        st.epoch++;
        st.next_batch = 0;
      }
      if (o->max_steps > 0 && st.step >= o->max_steps) stop = true;
      if ((o->checkpoint_every > 0 && st.step % o->checkpoint_every == 0) || (o->checkpoint_every == 0 && epoch_done)) {
        ckpt_path(o, st.step, path, sizeof path);
        if (save(o, path, m, &opt, &st, categories)) goto done;
        prune_checkpoints(o);
      }
      if (epoch_done) break;
    }
    progress_end_line(&prog);
    bool epoch_finished = st.next_batch == 0;
    if (epoch_finished && dist_is_main())
      fprintf(stderr, "epoch %lld done in %.1f s\n", (long long)st.epoch - 1, now_s() - epoch_t0);
    bool last = st.epoch >= o->epochs || stop;
    if (epoch_finished && ((o->eval_every > 0 && st.epoch % o->eval_every == 0) || last)) {
      EvalReport rep;
      if (run_eval(o, m, val, st.epoch - 1, st.step, metrics, &rep)) goto done;
      double ap = rep.coco.stats[COCO_AP];
      if (ap > st.best_map) {
        st.best_map = ap;
        snprintf(path, sizeof path, "%s/best.safetensors", o->out_dir);
        if (save(o, path, m, &opt, &st, categories)) goto done;
      }
    }
  }
  // The final state, whatever the checkpoint interval.
  ckpt_path(o, st.step, path, sizeof path);
  if (access(path, F_OK) != 0) {
    if (save(o, path, m, &opt, &st, categories)) goto done;
    prune_checkpoints(o);
  }
  rc = 0;
done:
  if (metrics) fclose(metrics);
  if (rc == 0) write_chart(o);
  loader_free(loader);
  adamw_free(&opt);
  detr_model_free(m);
  coco_free(train);
  coco_free(val);
  return rc;
}
