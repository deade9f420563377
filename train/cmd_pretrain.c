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
#include "datasets/crops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "nn/model_io.h"
#include "nn/resnet.h"
#include "train/commands.h"
#include "train/optim.h"
#include "train/progress.h"
#include "train/setup.h"

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

// logits [B, classes] of the images [B, 3, S, S].
static Tensor *classify(const Classifier *m, Tensor *images) {
  Tensor *feat = resnet_forward(&m->resnet, images);  // [B, C, h, w]
  int64_t B = feat->shape.d[0], C = feat->shape.d[1];
  Tensor *pooled = op_mean(op_reshape(feat, SHAPE(B, C, -1)), 2, false);  // [B, C]
  return linear_forward(&m->head, pooled);
}

// Top-1 accuracy on crops (centre windows, no gradient), in batches of `batch`.
static double accuracy(const Classifier *m, const CropSet *c, int crop, int batch, Device dev, float *host) {
  bool was = autograd_set_grad_enabled(false);
  int64_t correct = 0, *index = malloc(sizeof(int64_t) * (size_t)batch);
  float *logits = malloc(sizeof(float) * (size_t)batch * (size_t)c->num_classes);
  DETR_CHECK(index && logits, "detr pretrain: out of host memory");
  for (int64_t start = 0; start < c->n; start += batch) {
    int n = (int)(c->n - start < batch ? c->n - start : batch);
    for (int i = 0; i < n; i++) index[i] = start + i;
    crops_batch(c, index, n, crop, false, NULL, host);
    ScopeMark mark = tensor_scope_mark();
    Tensor *x = tensor_scoped(tensor_from_host(dev, SHAPE(n, 3, crop, crop), host));
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

static int open_crops(const char *data, const char *split, int side, CropSet *out, char *err, size_t cap) {
  char ann[4200], img[4200];
  setup_split_paths(data, split, ann, sizeof ann, img, sizeof img);
  CocoOpenConfig cc = {.ann_path = ann, .image_dir = img, .policy = BAD_INPUT_FAIL, .quiet = true};
  CocoDataset *ds = NULL;
  DataError derr;
  if (coco_open(&cc, &ds, &derr) || crops_extract(ds, side, 0.3f, out, &derr)) {
    snprintf(err, cap, "%s", derr.msg);
    coco_free(ds);
    return -1;
  }
  coco_free(ds);
  return 0;
}

int cmd_pretrain(int argc, char **argv) {
  const char *data = NULL, *out = NULL, *config = "detr-r18-small", *device = "cpu";
  const char *train_split = "train", *val_split = "val";
  CliList sets = {0};
  long long epochs = 10, batch = 32, crop = 64, threads = 0, seed = 42;
  double lr = 1e-3, wd = 1e-4;
  bool no_progress = false;
  CliFlag flags[] = {
      {"data", FLAG_STRING, &data, "dataset root (annotations/instances_<split>.json and <split>/)"},
      {"out", FLAG_STRING, &out, "output safetensors file (the backbone's tensors)"},
      {"config", FLAG_STRING, &config, "model preset or key=value file whose backbone to train (default detr-r18-small)"},
      {"set", FLAG_LIST, &sets, "override one model config field, as for detr train"},
      {"train-split", FLAG_STRING, &train_split, "split whose boxes are cut out (default train)"},
      {"val-split", FLAG_STRING, &val_split, "split for the held-out accuracy (default val; 'none' skips it)"},
      {"epochs", FLAG_INT, &epochs, "passes over the crops (default 10)"},
      {"batch", FLAG_INT, &batch, "crops per step (default 32)"},
      {"crop", FLAG_INT, &crop, "crop side in pixels fed to the network (default 64)"},
      {"lr", FLAG_FLOAT, &lr, "AdamW learning rate (default 1e-3; x0.1 for the last third of the epochs)"},
      {"weight-decay", FLAG_FLOAT, &wd, "AdamW weight decay (default 1e-4)"},
      {"device", FLAG_STRING, &device, "cpu or cuda (default cpu)"},
      {"threads", FLAG_INT, &threads, "CPU threads (default: OMP_NUM_THREADS or all cores)"},
      {"seed", FLAG_INT, &seed, "seed of initialisation, crop order and augmentation (default 42)"},
      {"no-progress", FLAG_BOOL, &no_progress, "no per-epoch lines"},
  };
  int n_pos = 0;
  int rc = cli_parse("pretrain", USAGE, argc, argv, 2, flags, (int)(sizeof flags / sizeof flags[0]), NULL, 0, &n_pos);
  if (rc) return rc == 1 ? 0 : 2;
  char err[1024];
  if (!data || !out) {
    fprintf(stderr, "detr pretrain: --data DIR and --out FILE are required (see detr pretrain --help)\n");
    return 2;
  }
  const CliRange ranges[] = {
      {"epochs", epochs, 1, 100000}, {"batch", batch, 1, 4096}, {"crop", crop, 32, 512},
      {"threads", threads, 0, 1024}, {"seed", seed, 0, 1LL << 62}};
  if (cli_check_ranges("pretrain", ranges, (int)(sizeof ranges / sizeof ranges[0]))) return 2;
  if (!(lr > 0 && wd >= 0)) {
    fprintf(stderr, "detr pretrain: --lr must be > 0 and --weight-decay >= 0\n");
    return 2;
  }
  DetrConfig cfg;
  Device dev;
  if (setup_model_config(config, &sets, &cfg, err, sizeof err) || setup_device(device, &dev, err, sizeof err)) {
    fprintf(stderr, "detr pretrain: %s\n", err);
    return 2;
  }
  if (threads > 0) omp_set_num_threads((int)threads);
  cpu_flush_denormals(true);

  // Crops are stored 25% larger than --crop: training reads a random window of them.
  const int side = (int)(crop + crop / 4);
  CropSet train = {0}, val = {0};
  double t0 = now_s();
  if (open_crops(data, train_split, side, &train, err, sizeof err) ||
      (strcmp(val_split, "none") && open_crops(data, val_split, side, &val, err, sizeof err))) {
    fprintf(stderr, "detr pretrain: %s\n", err);
    crops_free(&train);
    return 1;
  }
  fprintf(stderr, "detr pretrain: %lld training crops, %lld held-out, %d classes (%.1f s to cut out)\n",
          (long long)train.n, (long long)val.n, train.num_classes, now_s() - t0);

  Classifier m;
  params_init(&m.params, dev);
  resnet_create(&m.resnet, &m.params, "backbone.0.body", cfg.backbone_depth, cfg.backbone_width, cfg.dilation, true, 0);
  m.head = linear_create(&m.params, "head", m.resnet.out_channels, train.num_classes, true, PARAM_TRAINABLE,
                         LR_GROUP_MAIN);
  Rng init = rng_make((uint64_t)seed);
  resnet_init(&m.resnet, &init);
  init_torch_default(m.head.weight, m.head.bias, &init);

  const int B = (int)(batch < train.n ? batch : train.n);  // a set smaller than a batch: one batch of all
  int64_t *order = malloc(sizeof(int64_t) * (size_t)train.n);
  int64_t *labels = malloc(sizeof(int64_t) * (size_t)B);
  float *host = malloc(sizeof(float) * (size_t)B * 3 * (size_t)crop * (size_t)crop);  // [B, 3, crop, crop]
  DETR_CHECK(order && labels && host, "detr pretrain: out of host memory");
  {  // frozen batch norms: statistics of the first batch's inputs, as `detr train --calibrate-bn`
    for (int i = 0; i < B; i++) order[i] = i;
    crops_batch(&train, order, B, (int)crop, false, NULL, host);
    Tensor *x = tensor_from_host(dev, SHAPE(B, 3, crop, crop), host);
    resnet_calibrate(&m.resnet, x);
    tensor_release(x);
  }
  OptimConfig oc = optim_config_default();
  oc.lr = oc.lr_backbone = (float)lr;
  oc.weight_decay = (float)wd;
  oc.clip_max_norm = 0.0f;
  oc.lr_drop = (int)(epochs * 2 / 3 > 0 ? epochs * 2 / 3 : 1);
  AdamW opt;
  adamw_init(&opt, &m.params, oc);
  Rng rng = rng_make((uint64_t)seed ^ 0x9e3779b97f4a7c15ULL);
  int status = 0;
  double held_out = -1.0;  // the accuracy of the current weights on val, once measured
  for (int epoch = 0; epoch < epochs && !status; epoch++) {
    opt.epoch = epoch;
    for (int64_t i = 0; i < train.n; i++) order[i] = i;
    for (int64_t i = train.n - 1; i > 0; i--) {  // Fisher-Yates
      int64_t j = (int64_t)rng_next_below(&rng, (uint64_t)i + 1), t = order[i];
      order[i] = order[j], order[j] = t;
    }
    double loss_sum = 0.0, te = now_s();
    int64_t steps = 0;
    for (int64_t start = 0; start + B <= train.n; start += B) {  // the last partial batch is dropped
      crops_batch(&train, order + start, B, (int)crop, true, &rng, host);
      for (int i = 0; i < B; i++) labels[i] = train.labels[order[start + i]];
      ScopeMark mark = tensor_scope_mark();
      Tensor *x = tensor_scoped(tensor_from_host(dev, SHAPE(B, 3, crop, crop), host));
      Tensor *loss = op_cross_entropy(classify(&m, x), labels, NULL);
      float l = tensor_item(loss);
      if (!isfinite(l)) {
        fprintf(stderr, "detr pretrain: the loss is %g at epoch %d step %lld: stopping (nothing written)\n",
                (double)l, epoch + 1, (long long)steps);
        status = 1;
        tensor_scope_release(mark);
        break;
      }
      autograd_backward(loss);
      adamw_step(&opt);
      for (int i = 0; i < m.params.count; i++) autograd_zero_grad(&m.params.items[i].tensor, 1);
      tensor_scope_release(mark);
      loss_sum += l;
      steps++;
    }
    if (status || no_progress) continue;
    double secs = now_s() - te;
    fprintf(stderr, "epoch %d/%lld  loss %.4f  %.0f crops/s", epoch + 1, epochs, steps ? loss_sum / (double)steps : 0.0,
            (double)(steps * B) / (secs > 0 ? secs : 1));
    if (val.n) {
      held_out = accuracy(&m, &val, (int)crop, B, dev, host);
      fprintf(stderr, "  held-out accuracy %.3f", held_out);
    }
    fprintf(stderr, "\n");
  }
  if (!status) {
    if (val.n && held_out < 0) held_out = accuracy(&m, &val, (int)crop, B, dev, host);  // --no-progress
    if (val.n) printf("held-out top-1 accuracy %.4f on %lld crops\n", held_out, (long long)val.n);
    StWriter *w = st_writer_new();
    for (int i = 0; i < m.params.count; i++)
      if (!strncmp(m.params.items[i].name, "backbone.", 9))
        st_writer_add_tensor(w, m.params.items[i].name, m.params.items[i].tensor);
    char cfg_text[2048];
    detr_config_format(&cfg, cfg_text, sizeof cfg_text);
    st_writer_set_metadata(w, "format", "detr-c backbone");
    st_writer_set_metadata(w, "config", cfg_text);
    if (st_writer_save(w, out, err, sizeof err)) {
      fprintf(stderr, "detr pretrain: %s\n", err);
      status = 1;
    } else {
      printf("wrote the backbone to %s\n", out);
    }
    st_writer_free(w);
  }
  adamw_free(&opt);
  params_free(&m.params);
  free(order), free(labels), free(host);
  crops_free(&train);
  crops_free(&val);
  return status;
}
