// detr step: one forward + loss + backward on a batch read from a safetensors file, writing
// the outputs, matches, loss terms and every trainable parameter's gradient: the interface for
// parity tests against other implementations (tools/parity_step.py compares with the reference).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/setup.h"
#include "nn/model_io.h"
#include "train/step_batch.h"

static const char *USAGE =
    "--config PRESET|FILE [--set key=value ...] [--weights W.safetensors] --batch B.safetensors\n"
    "       --out O.safetensors [--no-dropout] [--seed N] [--device cpu|cuda]\n"
    "Batch file: images F32 [B,3,H,W] (normalized), mask U8 [B,H,W] (1 = padding),\n"
    "targets.{i}.boxes F32 [n,4] (normalized cxcywh), targets.{i}.labels I64 [n].";

static int fail(const char *msg) {
  fprintf(stderr, "detr step: %s\n", msg);
  return 1;
}

// Outputs, matches, losses, the attention variant's exports and every trainable parameter's
// gradient, under the names tools/parity_step.py reads.
static void add_outputs(StWriter *w, const DetrOutput *out) {
  char name[160];
  st_writer_add_tensor(w, "pred_logits", out->layers[out->n_layers - 1].logits);
  st_writer_add_tensor(w, "pred_boxes", out->layers[out->n_layers - 1].boxes);
  for (int l = 0; l < out->n_layers - 1; l++) {
    snprintf(name, sizeof name, "aux.%d.pred_logits", l);
    st_writer_add_tensor(w, name, out->layers[l].logits);
    snprintf(name, sizeof name, "aux.%d.pred_boxes", l);
    st_writer_add_tensor(w, name, out->layers[l].boxes);
  }
}

static void add_losses(StWriter *w, const CriterionResult *loss, int n_aux) {
  char name[160];
  for (int i = 0; i < loss->n_images; i++) {
    const DetrMatch *m = &loss->matches[i];
    int64_t *pairs = detr_malloc((size_t)m->n * 2 * sizeof(int64_t), "match pairs");  // [n, 2]: query, target
    for (int64_t k = 0; k < m->n; k++) pairs[2 * k] = m->query[k], pairs[2 * k + 1] = m->target[k];
    snprintf(name, sizeof name, "match.%d", i);
    st_writer_add(w, name, ST_I64, 2, (int64_t[]){m->n, 2}, pairs);
    free(pairs);
  }
  for (int i = 0; i < loss->n_terms; i++) {
    snprintf(name, sizeof name, "loss.%s", loss->terms[i].name);
    st_writer_add_tensor(w, name, loss->terms[i].value);
  }
  st_writer_add_tensor(w, "loss.total", loss->total);
  st_writer_add(w, "loss.class_error", ST_F32, 0, NULL, &loss->class_error);
  st_writer_add(w, "loss.cardinality_error", ST_F32, 0, NULL, &loss->cardinality_error);
  for (int l = 0; l < n_aux; l++) {
    snprintf(name, sizeof name, "loss.cardinality_error_%d", l);
    st_writer_add(w, name, ST_F32, 0, NULL, &loss->aux_cardinality_error[l]);
  }
}

static void add_attention_exports(StWriter *w, const DetrOutput *out, const DetrConfig *cfg) {
  char name[160];
  for (int l = 0; l < out->n_attn; l++) {  // what the attention variant reports of each encoder layer
    for (int e = 0; e < out->attn[l].n_exports; e++) {
      const AttnExport *x = &out->attn[l].exports[e];
      snprintf(name, sizeof name, "%s.%d.%s", detr_encoder_attn(cfg)->name, l, x->name);
      if (x->f32) st_writer_add_tensor(w, name, x->f32);
      else st_writer_add(w, name, ST_I64, 1, (int64_t[]){x->n}, x->i64);
    }
  }
}

static void add_gradients(StWriter *w, const DetrModel *model) {
  char name[160];
  for (int i = 0; i < model->params.count; i++) {
    const Param *p = &model->params.items[i];
    if (p->kind != PARAM_TRAINABLE) continue;
    snprintf(name, sizeof name, "grad.%s", p->name);
    if (p->tensor->grad) {
      st_writer_add_tensor(w, name, p->tensor->grad);
    } else {  // no path from the loss (e.g. a layer the loss does not reach): zeros
      Tensor *z = tensor_zeros(model->params.device, p->tensor->shape);
      st_writer_add_tensor(w, name, z);
      tensor_release(z);
    }
  }
}

// The model (initialised from seed, then the weights file if any) and the batch.
static int load_model_and_batch(const DetrConfig *cfg, Device dev, uint64_t seed, const char *weights,
                                const char *batch_path, DetrModel **model, StepBatch *batch, char *err,
                                size_t err_cap) {
  *model = detr_model_create(cfg, dev);
  detr_model_init(*model, seed);
  if (weights && params_load_file(&(*model)->params, weights, err, err_cap)) return -1;
  StFile *bf = st_open(batch_path, err, err_cap);
  if (!bf) return -1;
  int rc =
      step_batch_read(bf, dev, cfg->num_classes, batch, err, err_cap);  // on failure the caller frees what it holds
  st_close(bf);
  return rc;
}

// Forward, loss (the batch's boxes as the normaliser) and backward, with dropout from seed's stream.
static int forward_backward(DetrModel *model, const StepBatch *batch, bool dropout, uint64_t seed, DetrOutput *out,
                            CriterionResult *loss, char *err, size_t err_cap) {
  Rng dropout_rng = rng_make(seed ^ 0xd40bu);
  NnCtx ctx = {.training = dropout, .dropout_rng = &dropout_rng};
  if (step_forward_backward(model, &ctx, batch->images, batch->mask, batch->targets, batch->B, out, loss, err, err_cap))
    return -1;
  float total = tensor_item(loss->total);
  if (!isfinite(total)) fprintf(stderr, "detr step: warning: the loss is %g\n", total);
  return 0;
}

int cmd_step(int argc, char **argv, const Dist *job) {
  const char *config = NULL, *weights = NULL, *batch_path = NULL, *out_path = NULL, *device = "cpu";
  uint64_t seed = 0;
  bool no_dropout = false;
  CliList sets = {0};
  CliFlag flags[] = {
      {"config", FLAG_STRING, &config, "model preset (" DETR_PRESET_LIST ") or key=value file"},
      {"set", FLAG_LIST, &sets, "override one config field, e.g. --set hidden_dim=64"},
      {"weights", FLAG_STRING, &weights,
       "model safetensors (reference or transformers names); default: reference init from --seed"},
      {"batch", FLAG_STRING, &batch_path, "input batch safetensors"},
      {"out", FLAG_STRING, &out_path, "output safetensors"},
      {"no-dropout", FLAG_BOOL, &no_dropout, "run with dropout off (for parity tests)"},
      {"seed", FLAG_U64, &seed, "seed of the initialisation and of dropout (default 0)"},
      {"device", FLAG_STRING, &device, "cpu or cuda (default cpu)"},
  };
  int n_flags = (int)(sizeof flags / sizeof flags[0]), n_pos = 0;
  int rc = cli_parse("step", USAGE, argc, argv, 2, flags, n_flags, NULL, 0, &n_pos);
  if (rc) return rc == 1 ? 0 : 2;
  if (!config || !batch_path || !out_path) {
    fprintf(stderr, "detr step: --config, --batch and --out are required (see detr step --help)\n");
    return 2;
  }
  char err[4608];
  DetrConfig cfg;
  Device dev;
  if (setup_model_config(config, &sets, &cfg, err, sizeof err) || setup_device(job, device, &dev, err, sizeof err))
    return fail(err);
  DetrModel *model = NULL;
  StepBatch batch = {0};
  DetrOutput out;
  CriterionResult loss;
  if (load_model_and_batch(&cfg, dev, seed, weights, batch_path, &model, &batch, err, sizeof err) ||
      forward_backward(model, &batch, !no_dropout, seed, &out, &loss, err, sizeof err)) {
    step_batch_free(&batch);
    detr_model_free(model);
    return fail(err);
  }
  StWriter *w = st_writer_new();
  add_outputs(w, &out);
  add_losses(w, &loss, cfg.aux_loss ? out.n_layers - 1 : 0);
  add_attention_exports(w, &out, &cfg);
  add_gradients(w, model);
  char cfg_text[2048];
  detr_config_format(&cfg, cfg_text, sizeof cfg_text);
  st_writer_set_metadata(w, "config", cfg_text);
  rc = st_writer_save(w, out_path, err, sizeof err);
  st_writer_free(w);
  float total = tensor_item(loss.total);
  int n_terms = loss.n_terms;
  detr_output_free(&out);
  criterion_result_free(&loss);
  step_batch_free(&batch);
  detr_model_free(model);
  if (rc) return fail(err);
  printf("detr step: loss %.6f (%d terms), wrote %s\n", total, n_terms, out_path);
  return 0;
}
