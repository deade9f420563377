// detr pretrain: trains a detector's ResNet backbone as a classifier of the training set's object
// crops (global average pool + linear head, cross-entropy, AdamW) and writes the backbone's
// tensors under DETR's names, for `detr train --init-backbone`. DETR itself starts from an
// ImageNet-trained backbone; trained from scratch it stays for a long time in the phase where its
// predictions ignore the image (docs/training.md). With nothing to download, the dataset's own
// boxes give the backbone that start.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/ops.h"
#include "cli/commands.h"
#include "cli/out_file.h"
#include "cli/setup.h"
#include "core/clock.h"
#include "datasets/crops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "nn/model_io.h"
#include "nn/resnet.h"
#include "train/cpu_share.h"
#include "train/data_layout.h"
#include "train/optim.h"

static const char *USAGE =
    "--data DIR --out FILE [--config PRESET|FILE] [--set key=value ...] [options]\n"
    "Pretrains the backbone of a DETR config as a classifier of the object crops of DIR's training\n"
    "split and writes its tensors (DETR's names, batch-norm statistics included) to FILE, for\n"
    "`detr train --init-backbone FILE` with the same config.";

typedef struct {
  ResNet resnet;
  Linear head;
  ParamStore params;  // backbone.0.body.* and head.*
} Classifier;

// logits [B, classes] of the images [B, S, S, 3].
static Tensor *classify(const Classifier *m, Tensor *images) {
  Tensor *feat = resnet_forward(&m->resnet, images);  // [B, h, w, C]
  int64_t B = feat->shape.d[0], C = feat->shape.d[3];
  Tensor *pooled = op_mean(op_reshape(feat, SHAPE(B, -1, C)), 1, false);  // [B, C]
  return linear_forward(&m->head, pooled);
}

// Top-1 accuracy on crops (centre windows, no gradient), in batches of `batch`.
static double accuracy(const Classifier *m, const CropSet *c, int crop, int batch, Device dev, float *host) {
  bool was = autograd_set_grad_enabled(false);
  int64_t correct = 0, *index = detr_malloc(sizeof(int64_t) * (size_t)batch, "pretrain indices");
  float *logits = detr_malloc(sizeof(float) * (size_t)batch * (size_t)c->num_classes, "pretrain logits");
  for (int64_t start = 0; start < c->n; start += batch) {
    int n = (int)(c->n - start < batch ? c->n - start : batch);
    for (int i = 0; i < n; i++) index[i] = start + i;
    crops_batch(c, index, n, crop, false, NULL, host);
    ScopeMark mark = tensor_scope_mark();
    Tensor *x = op_constant(dev, SHAPE(n, crop, crop, 3), host);
    Tensor *y = classify(m, x);
    tensor_to_host(y, logits);
    for (int i = 0; i < n; i++) {
      int best = 0;
      for (int k = 1; k < c->num_classes; k++)
        if (logits[i * c->num_classes + k] > logits[i * c->num_classes + best]) best = k;
      correct += best == c->labels[start + i];
    }
    tensor_scope_release(mark);
  }
  free(index);
  free(logits);
  autograd_set_grad_enabled(was);
  return (double)correct / (double)c->n;
}

static int open_crops(const char *data, const char *split, int side, CropSet *out, char *err, size_t err_cap) {
  char ann[4200], img[4200];
  setup_split_paths(data, split, ann, sizeof ann, img, sizeof img);
  CocoOpenConfig cc = {.ann_path = ann, .image_dir = img, .policy = BAD_INPUT_FAIL, .quiet = true};
  CocoDataset *ds = NULL;
  DataError derr;
  if (coco_open(&cc, &ds, &derr) || crops_extract(ds, side, 0.3f, out, &derr)) {
    snprintf(err, err_cap, "%s", derr.msg);
    coco_free(ds);
    return -1;
  }
  coco_free(ds);
  return 0;
}

typedef struct {
  const char *data, *out, *config, *device, *train_split, *val_split;
  CliList sets;
  int epochs, batch, crop, threads;
  uint64_t seed;
  double lr, weight_decay;
  bool no_progress;
} PretrainOptions;

// The run: the crops, the classifier, its optimizer and the batch buffers.
typedef struct {
  const PretrainOptions *o;
  DetrConfig cfg;
  Device dev;
  CropSet train, val;
  Classifier m;
  AdamW opt;
  int B;                    // crops per step (the whole set when smaller than --batch)
  int64_t *order, *labels;  // [train.n], [B]
  float *host;              // [B, crop, crop, 3]
  CpuShare cpu;             // compute threads: the cores other processes leave free
} Pretrainer;

// The classifier on the config's ResNet, its frozen batch norms set from the first batch's inputs
// (as `detr train --calibrate-bn`), and AdamW (x0.1 for the last third of the epochs).
static void build_classifier(Pretrainer *p) {
  const PretrainOptions *o = p->o;
  Classifier *m = &p->m;
  params_init(&m->params, p->dev);
  resnet_create(&m->resnet, &m->params, "backbone.0.body", p->cfg.backbone_depth, p->cfg.backbone_width,
                p->cfg.backbone_layers, p->cfg.dilation, true, 0);
  m->head = linear_create(&m->params, "head", m->resnet.out_channels, p->train.num_classes, true, PARAM_TRAINABLE,
                          LR_GROUP_MAIN);
  Rng init = rng_make(o->seed);
  resnet_init(&m->resnet, &init);
  init_torch_default(m->head.weight, m->head.bias, &init);
  p->B = (int)(o->batch < p->train.n ? o->batch : p->train.n);
  p->order = detr_malloc(sizeof(int64_t) * (size_t)p->train.n, "pretrain order");
  p->labels = detr_malloc(sizeof(int64_t) * (size_t)p->B, "pretrain labels");
  p->host = detr_malloc(sizeof(float) * (size_t)p->B * 3 * (size_t)o->crop * (size_t)o->crop, "pretrain images");
  for (int i = 0; i < p->B; i++) p->order[i] = i;
  crops_batch(&p->train, p->order, p->B, o->crop, false, NULL, p->host);
  Tensor *x = tensor_from_host(p->dev, SHAPE(p->B, o->crop, o->crop, 3), p->host);
  resnet_calibrate(&m->resnet, x);
  tensor_release(x);
  OptimConfig oc = optim_config_default();
  oc.lr = oc.lr_backbone = (float)o->lr;
  oc.weight_decay = (float)o->weight_decay;
  oc.clip_max_norm = 0.0f;
  oc.lr_drop = o->epochs * 2 / 3 > 0 ? o->epochs * 2 / 3 : 1;
  adamw_init(&p->opt, &m->params, oc);
}

// One pass over the shuffled crops (the last partial batch dropped). Returns 0 with the mean loss
// in *loss_mean, or -1 when the loss is not finite.
static int pretrain_epoch(Pretrainer *p, int epoch, Rng *rng, double *loss_mean) {
  const PretrainOptions *o = p->o;
  int64_t n = p->train.n, *order = p->order;
  for (int64_t i = 0; i < n; i++) order[i] = i;
  for (int64_t i = n - 1; i > 0; i--) {  // Fisher-Yates
    int64_t j = (int64_t)rng_next_below(rng, (uint64_t)i + 1), t = order[i];
    order[i] = order[j], order[j] = t;
  }
  double loss_sum = 0.0;
  int64_t steps = 0;
  for (int64_t start = 0; start + p->B <= n; start += p->B) {
    crops_batch(&p->train, order + start, p->B, o->crop, true, rng, p->host);
    for (int i = 0; i < p->B; i++) p->labels[i] = p->train.labels[order[start + i]];
    ScopeMark mark = tensor_scope_mark();
    Tensor *x = op_constant(p->dev, SHAPE(p->B, o->crop, o->crop, 3), p->host);
    Tensor *loss = op_cross_entropy(classify(&p->m, x), p->labels, NULL);
    float l = tensor_item(loss);
    if (!isfinite(l)) {
      fprintf(stderr, "detr pretrain: the loss is %g at epoch %d step %lld: stopping (nothing written)\n", (double)l,
              epoch + 1, (long long)steps);
      tensor_scope_release(mark);
      return -1;
    }
    autograd_backward(loss);
    adamw_clip_step(&p->opt, 0.0f);  // no clipping; releases the gradients
    tensor_scope_release(mark);
    loss_sum += l;
    steps++;
    if (cpu_share_update(&p->cpu) && !o->no_progress) cpu_share_log(&p->cpu, "detr pretrain");
  }
  *loss_mean = steps ? loss_sum / (double)steps : 0.0;
  return 0;
}

// The backbone's tensors (DETR's names) and the config they belong to.
static int save_backbone(const Pretrainer *p) {
  StWriter *w = st_writer_new();
  for (int i = 0; i < p->m.params.count; i++)
    if (!strncmp(p->m.params.items[i].name, "backbone.", 9))
      st_writer_add_tensor(w, p->m.params.items[i].name, p->m.params.items[i].tensor);
  char cfg_text[2048], err[1024];
  detr_config_format(&p->cfg, cfg_text, sizeof cfg_text);
  st_writer_set_metadata(w, "format", "detr-c backbone");
  st_writer_set_metadata(w, "config", cfg_text);
  int rc = st_writer_save(w, p->o->out, err, sizeof err);
  if (rc) fprintf(stderr, "detr pretrain: %s\n", err);
  else printf("wrote the backbone to %s\n", p->o->out);
  st_writer_free(w);
  return rc ? 1 : 0;
}

static int pretrain_run(Pretrainer *p) {
  const PretrainOptions *o = p->o;
  build_classifier(p);
  Rng rng = rng_make(o->seed ^ 0x9e3779b97f4a7c15ULL);
  double held_out = -1.0;  // the accuracy of the current weights on val, once measured
  for (int epoch = 0; epoch < o->epochs; epoch++) {
    p->opt.epoch = epoch;
    double loss, t0 = now_s();
    if (pretrain_epoch(p, epoch, &rng, &loss)) return 1;
    if (o->no_progress) continue;
    double secs = now_s() - t0;
    int64_t crops = p->train.n / p->B * p->B;
    fprintf(stderr, "epoch %d/%d  loss %.4f  %.0f crops/s", epoch + 1, o->epochs, loss,
            (double)crops / (secs > 0 ? secs : 1));
    if (p->val.n) {
      held_out = accuracy(&p->m, &p->val, o->crop, p->B, p->dev, p->host);
      fprintf(stderr, "  held-out accuracy %.3f", held_out);
    }
    fprintf(stderr, "\n");
  }
  if (p->val.n && held_out < 0) held_out = accuracy(&p->m, &p->val, o->crop, p->B, p->dev, p->host);  // --no-progress
  if (p->val.n) printf("held-out top-1 accuracy %.4f on %lld crops\n", held_out, (long long)p->val.n);
  return save_backbone(p);
}

static void pretrainer_free(Pretrainer *p) {
  if (p->m.params.count) adamw_free(&p->opt);
  params_free(&p->m.params);
  free(p->order), free(p->labels), free(p->host);
  crops_free(&p->train);
  crops_free(&p->val);
}

int cmd_pretrain(int argc, char **argv, const Dist *job) {
  PretrainOptions o = {.config = SETUP_DEFAULT_PRESET,
                       .device = "cpu",
                       .train_split = "train",
                       .val_split = "val",
                       .epochs = 10,
                       .batch = 32,
                       .crop = 64,
                       .seed = 42,
                       .lr = 1e-3,
                       .weight_decay = 1e-4};
  CliFlag flags[] = {
      {"data", FLAG_STRING, &o.data, "dataset root (annotations/instances_<split>.json and <split>/)"},
      {"out", FLAG_STRING, &o.out, "output safetensors file (the backbone's tensors)"},
      {"config", FLAG_STRING, &o.config,
       "model preset or key=value file whose backbone to train (default " SETUP_DEFAULT_PRESET ")"},
      {"set", FLAG_LIST, &o.sets, "override one model config field, as for detr train"},
      {"train-split", FLAG_STRING, &o.train_split, "split whose boxes are cut out (default train)"},
      {"val-split", FLAG_STRING, &o.val_split, "split for the held-out accuracy (default val; 'none' skips it)"},
      {"epochs", FLAG_I32, &o.epochs, "passes over the crops (default 10)", 1, 100000},
      {"batch", FLAG_I32, &o.batch, "crops per step (default 32)", 1, 4096},
      {"crop", FLAG_I32, &o.crop, "crop side in pixels fed to the network (default 64)", 32, 512},
      {"lr", FLAG_FLOAT, &o.lr, "AdamW learning rate (default 1e-3; x0.1 for the last third of the epochs)"},
      {"weight-decay", FLAG_FLOAT, &o.weight_decay, "AdamW weight decay (default 1e-4)"},
      {"device", FLAG_STRING, &o.device, "cpu or cuda (default cpu)"},
      {"threads", FLAG_I32, &o.threads,
       "CPU threads (default: OMP_NUM_THREADS, or the cores other processes leave free)", 0, 1024},
      {"seed", FLAG_U64, &o.seed, "seed of initialisation, crop order and augmentation (default 42)", 0, 1LL << 62},
      {"no-progress", FLAG_BOOL, &o.no_progress, "no per-epoch lines"},
  };
  int n_pos = 0;
  int rc = cli_parse("pretrain", USAGE, argc, argv, 2, flags, (int)(sizeof flags / sizeof flags[0]), NULL, 0, &n_pos);
  if (rc) return rc == 1 ? 0 : 2;
  if (!o.data || !o.out) {
    fprintf(stderr, "detr pretrain: --data DIR and --out FILE are required (see detr pretrain --help)\n");
    return 2;
  }
  if (!(o.lr > 0 && o.weight_decay >= 0)) {  // infinity and nan: refused by cli_parse
    fprintf(stderr, "detr pretrain: --lr must be > 0 and --weight-decay >= 0\n");
    return 2;
  }
  Pretrainer p = {.o = &o};
  char err[4400];
  char ann[4200], img[4200];
  setup_split_paths(o.data, o.train_split, ann, sizeof ann, img, sizeof img);
  const char *inputs[] = {ann};
  if (out_file_check(o.out, "out", NULL, inputs, 1, err, sizeof err)) {  // a backbone takes long to make
    fprintf(stderr, "detr pretrain: %s\n", err);
    return 2;
  }
  if (setup_model_config(o.config, &o.sets, &p.cfg, err, sizeof err) ||
      setup_device(job, o.device, &p.dev, err, sizeof err)) {
    fprintf(stderr, "detr pretrain: %s\n", err);
    return 2;
  }
  cpu_share_init(&p.cpu, o.threads);
  cpu_flush_denormals(true);
  // Crops are stored 25% larger than --crop: training reads a random window of them.
  const int side = o.crop + o.crop / 4;
  double t0 = now_s();
  if (open_crops(o.data, o.train_split, side, &p.train, err, sizeof err) ||
      (strcmp(o.val_split, "none") && open_crops(o.data, o.val_split, side, &p.val, err, sizeof err))) {
    fprintf(stderr, "detr pretrain: %s\n", err);
    pretrainer_free(&p);
    return 1;
  }
  fprintf(stderr, "detr pretrain: %lld training crops, %lld held-out, %d classes (%.1f s to cut out)\n",
          (long long)p.train.n, (long long)p.val.n, p.train.num_classes, now_s() - t0);
  rc = pretrain_run(&p);
  pretrainer_free(&p);
  return rc;
}
