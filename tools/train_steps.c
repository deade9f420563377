// train_steps: trains a model from given weights over given batch files with the trainer's own
// arithmetic (the forward, the set criterion, the backward, adamw_clip_step), for the loss-curve
// parity with the official code (tools/parity_train.py, docs/training.md). Step s reads
// DIR/batch-NNNN.safetensors with NNNN = s % --pool (`detr step`'s batch format, train/step_batch.h),
// prints "step S loss L grad_norm G [exports a,b]" per step (exports: ENACT's cluster size per
// encoder layer) and writes the final weights under the reference names.
//   train_steps --config PRESET|FILE [--set k=v ...] --weights W.safetensors --batches DIR --pool K
//               --steps N [--lr 1e-4] [--lr-backbone 1e-5] [--weight-decay 1e-4] [--clip 0.1]
//               [--lr-drop-step S] --out FINAL.safetensors
// Dropout is off (the parity's setting). The learning rates are x0.1 from step S on (torch's StepLR
// stepped once per optimizer step: AdamW's epoch counter is the step here).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "autograd/autograd.h"
#include "cli/cli.h"
#include "cli/setup.h"
#include "core/runtime.h"
#include "kernels/cpu/cpu_kernels.h"
#include "nn/model_io.h"
#include "train/optim.h"
#include "train/step_batch.h"

static const char *USAGE =
    "--config PRESET|FILE [--set k=v ...] --weights W.safetensors --batches DIR --pool K --steps N\n"
    "       [--lr 1e-4] [--lr-backbone 1e-5] [--weight-decay 1e-4] [--clip 0.1] [--lr-drop-step S]\n"
    "       --out FINAL.safetensors";

// The encoder attention's one-value integer exports of every layer (ENACT's cluster_size), as
// " name=v,v" for the step's line: where a clustering variant's discrete choice changes.
static void format_exports(const DetrOutput *out, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = 0;
  for (int l = 0; l < out->n_attn; l++) {
    for (int e = 0; e < out->attn[l].n_exports && len + 64 < cap; e++) {
      const AttnExport *x = &out->attn[l].exports[e];
      if (x->f32 || x->n != 1) continue;
      len += (size_t)snprintf(buf + len, cap - len, "%s%lld", l ? "," : " exports ", (long long)x->i64[0]);
    }
  }
}

// One optimizer step on the batch file at path: `detr step`'s forward (dropout off), criterion and
// backward (step_forward_backward), then clipping and AdamW. Returns 0 with the loss and the norm
// before clipping, or -1 with err set.
static int train_one(DetrModel *m, AdamW *opt, const char *path, float *loss_out, double *norm_out, char *exports,
                     size_t exports_cap, char *err, size_t err_cap) {
  StFile *f = st_open(path, err, err_cap);
  if (!f) return -1;
  StepBatch b = {0};
  int rc = step_batch_read(f, m->params.device, m->cfg.num_classes, &b, err, err_cap);
  ScopeMark mark = tensor_scope_mark();
  DetrOutput out;
  CriterionResult loss;
  NnCtx ctx = {.training = false};  // dropout off; training changes nothing else in the forward
  if (!rc) rc = step_forward_backward(m, &ctx, b.images, b.mask, b.targets, b.B, &out, &loss, err, err_cap);
  if (!rc) {
    *loss_out = tensor_item(loss.total);
    format_exports(&out, exports, exports_cap);
    *norm_out = adamw_clip_step(opt, opt->cfg.clip_max_norm);  // clipping, AdamW, gradients released
    criterion_result_free(&loss);
    detr_output_free(&out);
  }
  tensor_scope_release(mark);
  step_batch_free(&b);
  st_close(f);
  return rc;
}

static int save_weights(const DetrModel *m, const char *path, char *err, size_t err_cap) {
  StWriter *w = st_writer_new();
  params_save(&m->params, w, "");
  int rc = st_writer_save(w, path, err, err_cap);
  st_writer_free(w);
  return rc;
}

int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  cpu_runtime_setup(argv);         // libgomp's spin setting, as the detr command has it
  const char *config = NULL, *weights = NULL, *dir = NULL, *out_path = NULL;
  int steps = 0, pool = 0, drop_step = 0;
  OptimConfig oc = optim_config_default();
  CliList sets = {0};
  CliFlag flags[] = {
      {"config", FLAG_STRING, &config, "model preset or key=value file"},
      {"set", FLAG_LIST, &sets, "override one config field"},
      {"weights", FLAG_STRING, &weights, "initial weights (reference names)"},
      {"batches", FLAG_STRING, &dir, "directory of batch-NNNN.safetensors"},
      {"pool", FLAG_I32, &pool, "number of batch files (step s reads s % pool)", 1, 9999},
      {"steps", FLAG_I32, &steps, "optimizer steps", 1, 1000000},
      {"lr", FLAG_F32, &oc.lr, "learning rate (default 1e-4)"},
      {"lr-backbone", FLAG_F32, &oc.lr_backbone, "backbone learning rate (default 1e-5)"},
      {"weight-decay", FLAG_F32, &oc.weight_decay, "AdamW weight decay (default 1e-4)"},
      {"clip", FLAG_F32, &oc.clip_max_norm, "gradient clipping max norm (default 0.1)"},
      {"lr-drop-step", FLAG_I32, &drop_step, "learning rates x0.1 from this step on (0: never)", 0, 1000000},
      {"out", FLAG_STRING, &out_path, "final weights safetensors"},
  };
  int n_pos = 0, rc = cli_parse("train_steps", USAGE, argc, argv, 1, flags, (int)(sizeof flags / sizeof flags[0]), NULL,
                                0, &n_pos);
  if (rc) return rc == 1 ? 0 : 2;
  if (!config || !weights || !dir || !out_path || steps <= 0 || pool <= 0) {
    fprintf(stderr, "train_steps: --config, --weights, --batches, --pool, --steps and --out are required\n");
    return 2;
  }
  char err[4608];
  DetrConfig cfg;
  if (setup_model_config(config, &sets, &cfg, err, sizeof err)) {
    fprintf(stderr, "train_steps: setup_model_config: %s\n", err);
    return 1;
  }
  cpu_flush_denormals(true);  // as `detr train` runs
  DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(m, 0);
  if (params_load_file(&m->params, weights, err, sizeof err)) {
    fprintf(stderr, "train_steps: params_load_file %s: %s\n", weights, err);
    detr_model_free(m);
    return 1;
  }
  oc.lr_drop = drop_step;  // AdamW's StepLR counts "epochs": here each step is one
  AdamW opt;
  adamw_init(&opt, &m->params, oc);
  for (int s = 0; s < steps && !rc; s++) {
    char path[4200];
    snprintf(path, sizeof path, "%s/batch-%04d.safetensors", dir, s % pool);
    opt.epoch = s;
    float loss = 0.0f;
    double norm = 0.0;
    char exports[512] = "";
    rc = train_one(m, &opt, path, &loss, &norm, exports, sizeof exports, err, sizeof err);
    if (rc) fprintf(stderr, "train_steps: step %d (%s): %s\n", s, path, err);
    else printf("step %d loss %.9g grad_norm %.9g%s\n", s, loss, norm, exports);
  }
  if (!rc && save_weights(m, out_path, err, sizeof err)) {
    fprintf(stderr, "train_steps: st_writer_save %s: %s\n", out_path, err);
    rc = 1;
  }
  adamw_free(&opt);
  detr_model_free(m);
  return rc ? 1 : 0;
}
