// detr step: one forward + loss + backward on a batch read from a safetensors file, writing
// the outputs, matches, loss terms and every trainable parameter's gradient: the interface for
// parity tests against other implementations (tools/parity_step.py compares with the reference).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/model_io.h"
#include "train/step_batch.h"
#include "train/commands.h"
#include "train/setup.h"

static const char *USAGE =
    "--config PRESET|FILE [--set key=value ...] [--weights W.safetensors] --batch B.safetensors\n"
    "       --out O.safetensors [--no-dropout] [--seed N] [--device cpu|cuda]\n"
    "Batch file: images F32 [B,3,H,W] (normalized), mask U8 [B,H,W] (1 = padding),\n"
    "targets.{i}.boxes F32 [n,4] (normalized cxcywh), targets.{i}.labels I64 [n].";

static int fail(const char *msg) {
  fprintf(stderr, "detr step: %s\n", msg);
  return 1;
}

int cmd_step(int argc, char **argv) {
  const char *config = NULL, *weights = NULL, *batch_path = NULL, *out_path = NULL, *device = "cpu";
  long long seed = 0;
  bool no_dropout = false;
  CliList sets = {0};
  CliFlag flags[] = {
      {"config", FLAG_STRING, &config, "model preset (detr-r50, detr-r18-small, tiny) or key=value file"},
      {"set", FLAG_LIST, &sets, "override one config field, e.g. --set hidden_dim=64"},
      {"weights", FLAG_STRING, &weights, "model safetensors (reference names); default: reference init from --seed"},
      {"batch", FLAG_STRING, &batch_path, "input batch safetensors"},
      {"out", FLAG_STRING, &out_path, "output safetensors"},
      {"no-dropout", FLAG_BOOL, &no_dropout, "run with dropout off (for parity tests)"},
      {"seed", FLAG_INT, &seed, "seed of the initialisation and of dropout (default 0)"},
      {"device", FLAG_STRING, &device, "cpu or cuda (default cpu)"},
  };
  int n_flags = (int)(sizeof flags / sizeof flags[0]), n_pos = 0;
  int rc = cli_parse("step", USAGE, argc, argv, 2, flags, n_flags, NULL, 0, &n_pos);
  if (rc) return rc == 1 ? 0 : 2;
  if (!config || !batch_path || !out_path) {
    fprintf(stderr, "detr step: --config, --batch and --out are required (see detr step --help)\n");
    return 2;
  }
  char err[4096];
  DetrConfig cfg;
  Device dev;
  if (setup_model_config(config, &sets, &cfg, err, sizeof err) || setup_device(device, &dev, err, sizeof err))
    return fail(err);

  DetrModel *model = detr_model_create(&cfg, dev);
  detr_model_init(model, (uint64_t)seed);
  if (weights && params_load_file(&model->params, weights, err, sizeof err)) {
    detr_model_free(model);
    return fail(err);
  }
  StFile *bf = st_open(batch_path, err, sizeof err);
  StepBatch batch;
  if (!bf || step_batch_read(bf, dev, cfg.num_classes, &batch, err, sizeof err)) {
    if (bf) {
      step_batch_free(&batch);
      st_close(bf);
    }
    detr_model_free(model);
    return fail(err);
  }
  st_close(bf);

  Rng dropout_rng = rng_make((uint64_t)seed ^ 0xd40bu);
  NnCtx ctx = {.training = !no_dropout, .dropout_rng = &dropout_rng};
  DetrOutput out;
  if (detr_model_forward(model, &ctx, batch.images, batch.mask, &out, err, sizeof err)) {
    step_batch_free(&batch);
    detr_model_free(model);
    return fail(err);
  }
  int64_t total_boxes = 0;
  for (int64_t i = 0; i < batch.B; i++) total_boxes += batch.targets[i].n;
  float num_boxes = total_boxes > 1 ? (float)total_boxes : 1.0f;
  CriterionConfig ccfg = criterion_config_default((int)cfg.num_classes);
  CriterionResult loss;
  int n_aux = cfg.aux_loss ? out.n_layers - 1 : 0;
  if (criterion_forward(&ccfg, out.layers[out.n_layers - 1], out.layers, n_aux, batch.targets, num_boxes, NULL, &loss,
                        err, sizeof err)) {
    detr_output_free(&out);
    step_batch_free(&batch);
    detr_model_free(model);
    return fail(err);
  }
  float total = tensor_item(loss.total);
  if (!isfinite(total)) fprintf(stderr, "detr step: warning: the loss is %g\n", total);
  autograd_backward(loss.total);

  StWriter *w = st_writer_new();
  char name[160];
  st_writer_add_tensor(w, "pred_logits", out.layers[out.n_layers - 1].logits);
  st_writer_add_tensor(w, "pred_boxes", out.layers[out.n_layers - 1].boxes);
  for (int l = 0; l < out.n_layers - 1; l++) {
    snprintf(name, sizeof name, "aux.%d.pred_logits", l);
    st_writer_add_tensor(w, name, out.layers[l].logits);
    snprintf(name, sizeof name, "aux.%d.pred_boxes", l);
    st_writer_add_tensor(w, name, out.layers[l].boxes);
  }
  for (int i = 0; i < loss.n_images; i++) {
    const DetrMatch *m = &loss.matches[i];
    int64_t *pairs = malloc((size_t)(m->n ? m->n : 1) * 2 * sizeof(int64_t));
    DETR_CHECK(pairs, "detr step: out of host memory");
    for (int64_t k = 0; k < m->n; k++) pairs[2 * k] = m->query[k], pairs[2 * k + 1] = m->target[k];
    snprintf(name, sizeof name, "match.%d", i);
    st_writer_add(w, name, ST_I64, 2, (int64_t[]){m->n, 2}, pairs);
    free(pairs);
  }
  for (int i = 0; i < loss.n_terms; i++) {
    snprintf(name, sizeof name, "loss.%s", loss.terms[i].name);
    st_writer_add_tensor(w, name, loss.terms[i].value);
  }
  st_writer_add_tensor(w, "loss.total", loss.total);
  st_writer_add(w, "loss.class_error", ST_F32, 0, NULL, &loss.class_error);
  st_writer_add(w, "loss.cardinality_error", ST_F32, 0, NULL, &loss.cardinality_error);
  for (int l = 0; l < n_aux; l++) {
    snprintf(name, sizeof name, "loss.cardinality_error_%d", l);
    st_writer_add(w, name, ST_F32, 0, NULL, &loss.aux_cardinality_error[l]);
  }
  for (int l = 0; l < out.n_attn; l++) {  // what the attention variant reports of each encoder layer
    for (int e = 0; e < out.attn[l].n_exports; e++) {
      const AttnExport *x = &out.attn[l].exports[e];
      snprintf(name, sizeof name, "%s.%d.%s", detr_encoder_attn(&cfg)->name, l, x->name);
      if (x->f32) st_writer_add_tensor(w, name, x->f32);
      else st_writer_add(w, name, ST_I64, 1, (int64_t[]){x->n}, x->i64);
    }
  }
  for (int i = 0; i < model->params.count; i++) {
    const Param *p = &model->params.items[i];
    if (p->kind != PARAM_TRAINABLE) continue;
    snprintf(name, sizeof name, "grad.%s", p->name);
    if (p->tensor->grad) {
      st_writer_add_tensor(w, name, p->tensor->grad);
    } else {  // no path from the loss (e.g. a layer the loss does not reach): zeros
      Tensor *z = tensor_zeros(dev, p->tensor->shape);
      st_writer_add_tensor(w, name, z);
      tensor_release(z);
    }
  }
  char cfg_text[2048];
  detr_config_format(&cfg, cfg_text, sizeof cfg_text);
  st_writer_set_metadata(w, "config", cfg_text);
  rc = st_writer_save(w, out_path, err, sizeof err);
  st_writer_free(w);
  detr_output_free(&out);
  criterion_result_free(&loss);
  step_batch_free(&batch);
  detr_model_free(model);
  if (rc) return fail(err);
  printf("detr step: loss %.6f (%d terms), wrote %s\n", total, loss.n_terms, out_path);
  return 0;
}
