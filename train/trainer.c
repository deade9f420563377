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

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
  int64_t steps[1024];
  int n = list_checkpoints(o->out_dir, steps, 1024);
  for (int i = o->keep_last; i < n; i++) {
    char path[4200];
    ckpt_path(o, steps[i], path, sizeof path);
    remove(path);
  }
}

static int save(const TrainOptions *o, const char *path, const DetrModel *m, const AdamW *opt, const TrainState *st,
                const char *categories) {
  char err[1024];
  if (checkpoint_save(path, m, opt, st, o->train_config_text, categories, err, sizeof err)) {
    fprintf(stderr, "detr train: %s\n", err);
    return -1;
  }
  return 0;
}

// The newest checkpoint in the run directory that loads, skipping damaged ones with a message.
static int resume_auto(const TrainOptions *o, DetrModel *m, AdamW *opt, TrainState *st, bool *resumed) {
  int64_t steps[1024];
  int n = list_checkpoints(o->out_dir, steps, 1024);
  for (int i = 0; i < n; i++) {
    char path[4200], err[2048];
    ckpt_path(o, steps[i], path, sizeof path);
    if (checkpoint_load(path, m, opt, st, err, sizeof err) == 0) {
      fprintf(stderr, "detr train: resuming from %s (step %lld)\n", path, (long long)st->step);
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

// OUT/chart.png from OUT/metrics.jsonl: the loss (a 50-step running mean) by step, and AP and AP50
// by epoch. A chart that fails to render is reported and training goes on.
static void write_chart(const TrainOptions *o) {
  char path[4200];
  snprintf(path, sizeof path, "%s/metrics.jsonl", o->out_dir);
  FILE *f = fopen(path, "r");
  if (!f) return;
  int cap = 0, n = 0, ne = 0;
  double *step = NULL, *loss = NULL, *mean = NULL;
  double epoch[512], ap[512], ap50[512];
  char line[8192];
  bool ok = true;
  while (ok && fgets(line, sizeof line, f)) {
    if (strstr(line, "\"type\": \"eval\"") && ne < 512) {
      epoch[ne] = json_number(line, "epoch") + 1, ap[ne] = json_number(line, "AP"), ap50[ne] = json_number(line, "AP50");
      ne++;
    } else if (strstr(line, "\"type\": \"train\"")) {
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
    fprintf(stderr, "detr train: chart: out of memory\n");
    free(step), free(loss);
    return;
  }
  double run = 0;
  for (int i = 0; i < n; i++) {  // running mean over the last 50 steps
    run += loss[i] - (i >= 50 ? loss[i - 50] : 0.0);
    mean[i] = run / (i + 1 < 50 ? i + 1 : 50);
  }
  ChartSpec spec = {.title = o->model.enact ? "DETR+ENACT training" : "DETR training", .n_panels = 2};
  spec.panels[0] = (ChartPanel){.title = "loss", .x_label = "step", .y_label = "weighted loss", .n_series = 2};
  spec.panels[0].series[0] = (ChartSeries){.name = "step", .x = step, .y = loss, .n = n, .colour = {190, 200, 230}};
  spec.panels[0].series[1] = (ChartSeries){.name = "mean of 50", .x = step, .y = mean, .n = n, .colour = {30, 80, 200}};
  spec.panels[1] = (ChartPanel){.title = "COCO AP (val)", .x_label = "epoch", .y_label = "AP", .n_series = 2};
  spec.panels[1].series[0] = (ChartSeries){.name = "AP", .x = epoch, .y = ap, .n = ne, .colour = {200, 60, 40}};
  spec.panels[1].series[1] = (ChartSeries){.name = "AP50", .x = epoch, .y = ap50, .n = ne, .colour = {40, 160, 60}};
  char err[1024];
  snprintf(path, sizeof path, "%s/chart.png", o->out_dir);
  if (chart_write_png(path, &spec, err, sizeof err)) fprintf(stderr, "detr train: chart: %s\n", err);
  free(step), free(loss), free(mean);
}

static void log_eval(FILE *metrics, int64_t epoch, int64_t step, const EvalReport *r) {
  fprintf(metrics, "{\"type\": \"eval\", \"epoch\": %lld, \"step\": %lld", (long long)epoch, (long long)step);
  for (int k = 0; k < COCO_N_STATS; k++) fprintf(metrics, ", \"%s\": %.6f", coco_stat_names[k], r->coco.stats[k]);
  fprintf(metrics, ", \"images\": %lld, \"seconds\": %.2f", (long long)r->images, r->seconds);
  if (r->compression > 0)
    fprintf(metrics, ", \"clusters_per_image\": %.2f, \"compression\": %.2f", r->clusters_per_image, r->compression);
  fprintf(metrics, "}\n");
  fflush(metrics);
}

static int run_eval(const TrainOptions *o, const DetrModel *m, const CocoDataset *val, int64_t epoch, int64_t step,
                    FILE *metrics, EvalReport *rep) {
  char results[4200], err[2048];
  snprintf(results, sizeof results, "%s/results-epoch%lld.json", o->out_dir, (long long)epoch);
  EvalConfig ec = {.batch_size = o->batch_size, .num_workers = o->workers, .aug = o->val_aug,
                   .policy = o->bad_input, .results_path = results, .progress = o->progress};
  if (evaluate_model(m, val, &ec, rep, err, sizeof err)) {
    fprintf(stderr, "detr train: evaluation failed: %s\n", err);
    return -1;
  }
  fprintf(stderr, "epoch %lld: COCO evaluation of %lld images (%.1f s)\n", (long long)epoch, (long long)rep->images,
          rep->seconds);
  coco_print_summary(&rep->coco, stderr);
  log_eval(metrics, epoch, step, rep);
  write_chart(o);
  return 0;
}

int train_run(TrainOptions *o) {
  char err[4096];
  if (o->threads > 0) omp_set_num_threads(o->threads);
  cpu_flush_denormals(true);
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
  TrainState st = {.seed = o->seed, .dropout_rng = rng_make(o->seed ^ 0xd40bu), .best_map = -1.0};
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
  if (!resumed && o->init_weights && params_load_file(&m->params, o->init_weights, err, sizeof err)) {
    fprintf(stderr, "detr train: --init %s\n", err);
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
    fprintf(stderr, "detr train: frozen batch norms calibrated on %d training images\n", cb->size);
  }
  char path[4200];
  snprintf(path, sizeof path, "%s/metrics.jsonl", o->out_dir);
  metrics = fopen(path, resumed ? "a" : "w");
  if (!metrics) {
    fprintf(stderr, "detr train: %s: cannot write: %s\n", path, strerror(errno));
    goto done;
  }
  LoaderConfig lc = loader_config_default(true);
  lc.batch_size = o->batch_size;
  lc.num_workers = o->workers;
  lc.seed = o->seed;
  lc.aug = o->train_aug;
  lc.policy = o->bad_input;
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
  fprintf(stderr, "detr train: %lld training images (%lld batches of %d per epoch), %lld val images, %lld trainable "
          "parameters%s, run directory %s\n", (long long)train->n_images, (long long)per_epoch, o->batch_size,
          (long long)val->n_images, (long long)params_numel(&m->params, PARAM_TRAINABLE), o->model.enact ? ", ENACT on" : "",
          o->out_dir);
  CriterionConfig ccfg = criterion_config_default((int)o->model.num_classes);
  Progress prog;
  int64_t total_steps = (int64_t)o->epochs * per_epoch;
  if (o->max_steps > 0 && o->max_steps < total_steps) total_steps = o->max_steps;
  progress_init(&prog, o->progress, st.step, total_steps);
  bool stop = false;
  while (!stop && st.epoch < o->epochs) {
    opt.epoch = (int)st.epoch;
    double epoch_t0 = now_s();
    while (!stop) {
      const Batch *b;
      int s = loader_next(loader, &b, &derr);
      if (s == DATA_ERROR) {
        fprintf(stderr, "\ndetr train: %s\n", derr.msg);
        goto done;
      }
      if (b->epoch != st.epoch) break;  // the loader moved on: this epoch is complete
      double t0 = now_s();
      ScopeMark mark = tensor_scope_mark();
      NnCtx ctx = {.training = true, .dropout_rng = &st.dropout_rng};
      Tensor *images = tensor_scoped(batch_images_tensor(b, o->device));
      DetrTarget targets[64];
      DETR_CHECK(b->size <= 64, "train: batch of %d images", b->size);
      int64_t boxes = 0;
      for (int i = 0; i < b->size; i++) {
        targets[i] = (DetrTarget){.n = b->targets[i].n, .boxes = b->targets[i].boxes, .labels = b->targets[i].labels};
        boxes += b->targets[i].n;
      }
      DetrOutput out;
      CriterionResult loss;
      int n_aux = o->model.aux_loss ? (int)o->model.dec_layers - 1 : 0;
      if (detr_model_forward(m, &ctx, images, b->mask, &out, err, sizeof err) ||
          criterion_forward(&ccfg, out.layers[out.n_layers - 1], out.layers, n_aux, targets,
                            boxes > 1 ? (float)boxes : 1.0f, NULL, &loss, err, sizeof err)) {
        fprintf(stderr, "\ndetr train: step %lld (epoch %lld, batch %lld): %s; stopping. The checkpoints in %s are "
                "from before this step.\n", (long long)st.step + 1, (long long)st.epoch, (long long)b->index, err,
                o->out_dir);
        goto done;
      }
      float total = tensor_item(loss.total);
      if (!isfinite(total)) {
        fprintf(stderr, "\ndetr train: the loss is %g at step %lld (epoch %lld, batch %lld); stopping. The last "
                "checkpoint in %s is from before it.\n", total, (long long)st.step + 1, (long long)st.epoch,
                (long long)b->index, o->out_dir);
        criterion_result_free(&loss);
        detr_output_free(&out);
        tensor_scope_release(mark);
        goto done;
      }
      autograd_backward(loss.total);
      double grad_norm = clip_grad_norm(&m->params, o->optim.clip_max_norm);
      adamw_step(&opt);
      for (int i = 0; i < m->params.count; i++) autograd_zero_grad(&m->params.items[i].tensor, 1);
      st.step++;
      st.next_batch = b->index + 1;
      double dt = now_s() - t0;
      // Metrics: every loss term, the logged errors, rates and ENACT's clusters.
      fprintf(metrics, "{\"type\": \"train\", \"step\": %lld, \"epoch\": %lld, \"batch\": %lld, \"loss\": %.6f",
              (long long)st.step, (long long)st.epoch, (long long)b->index, total);
      for (int i = 0; i < loss.n_terms; i++) fprintf(metrics, ", \"%s\": %.6f", loss.terms[i].name, tensor_item(loss.terms[i].value));
      fprintf(metrics, ", \"class_error\": %.4f, \"cardinality_error\": %.4f, \"grad_norm\": %.6f, \"lr\": %.3g, "
              "\"images_per_s\": %.3f", loss.class_error, loss.cardinality_error, grad_norm,
              (double)adamw_lr(&opt, LR_GROUP_MAIN), b->size / dt);
      double clusters = 0.0, ratio = 0.0;
      for (int l = 0; l < out.n_enact; l++) {
        const EnactRegions *r = &out.enact[l].regions;
        clusters += (double)r->count / b->size / out.n_enact;
        ratio += enact_pixels_per_cluster(r) / out.n_enact;
      }
      if (out.n_enact) fprintf(metrics, ", \"clusters_per_image\": %.2f, \"compression\": %.2f", clusters, ratio);
      fprintf(metrics, "}\n");
      fflush(metrics);
      progress_update(&prog, st.step, st.epoch, o->epochs, b->size, dt, total, &loss, out.n_enact ? ratio : 0.0);
      criterion_result_free(&loss);
      detr_output_free(&out);
      tensor_scope_release(mark);
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
    if (epoch_finished)
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
