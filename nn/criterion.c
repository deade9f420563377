#include "nn/criterion.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

CriterionConfig criterion_config_for(int num_classes, const ClassHead *classes) {
  return (CriterionConfig){
      .num_classes = num_classes,
      .classes = classes,
      .eos_coef = 0.1f,
      .weight_ce = classes->weight_ce,
      .weight_bbox = 5.0f,
      .weight_giou = 2.0f,
      .ce_share = 1.0f,
      .matcher = {.cost_class = classes->cost_class, .cost_bbox = 5.0f, .cost_giou = 2.0f, .classes = classes}};
}

CriterionConfig criterion_config_default(int num_classes) {
  return criterion_config_for(num_classes, &class_head_softmax);
}

static void add_term(CriterionResult *r, const char *name, const char *suffix, Tensor *value, float weight) {
  DETR_CHECK(r->n_terms < DETR_MAX_LOSS_TERMS, "criterion: more than %d loss terms", DETR_MAX_LOSS_TERMS);
  LossTerm *t = &r->terms[r->n_terms++];
  snprintf(t->name, sizeof t->name, "%s%s", name, suffix);
  t->value = value;
  t->weight = weight;
}

// The three losses of one decoder output under `matches`, appended with `suffix`.
static void layer_losses(const CriterionConfig *cfg, DetrLayerOutput out, const DetrTarget *targets,
                         const DetrMatch *matches, float num_boxes, const char *suffix, CriterionResult *r) {
  int64_t B = out.logits->shape.d[0], Q = out.logits->shape.d[1], C1 = out.logits->shape.d[2];
  Device dev = out.logits->device;
  int64_t matched = 0;
  for (int64_t b = 0; b < B; b++) matched += matches[b].n;

  // Host index data: target class of every query [B*Q]; matched rows [M]; matched boxes [M, 4].
  int64_t *classes = detr_malloc((size_t)(B * Q + matched) * sizeof(int64_t), "criterion classes");
  float *tgt_boxes = detr_malloc((size_t)(matched ? matched : 1) * 4 * sizeof(float), "criterion tgt_boxes");
  int64_t *rows = classes + B * Q;
  for (int64_t i = 0; i < B * Q; i++) classes[i] = cfg->num_classes;
  int64_t m = 0;
  for (int64_t b = 0; b < B; b++) {
    for (int64_t k = 0; k < matches[b].n; k++) {
      int64_t q = matches[b].query[k], t = matches[b].target[k];
      classes[b * Q + q] = targets[b].labels[t];
      rows[m] = b * Q + q;
      memcpy(tgt_boxes + 4 * m, targets[b].boxes + 4 * t, 4 * sizeof(float));
      m++;
    }
  }
  ClassLossArgs args = {
      .num_classes = cfg->num_classes, .num_boxes = num_boxes, .eos_coef = cfg->eos_coef, .ce_share = cfg->ce_share};
  const ClassHead *head = class_head_or_softmax(cfg->classes);
  Tensor *loss_ce = head->loss(op_reshape(out.logits, SHAPE(B * Q, C1)), classes, &args);

  Tensor *src = op_index_select(op_reshape(out.boxes, SHAPE(B * Q, 4)), rows, matched);  // [M, 4]
  Tensor *tgt = op_constant(dev, SHAPE(matched, 4), tgt_boxes);
  Tensor *loss_bbox = op_mul_scalar(op_l1_sum(src, tgt), 1.0f / num_boxes);
  Tensor *giou = op_box_giou(op_box_cxcywh_to_xyxy(src), op_box_cxcywh_to_xyxy(tgt));  // [M]
  Tensor *loss_giou = op_mul_scalar(op_sum_all(op_add_scalar(op_neg(giou), 1.0f)), 1.0f / num_boxes);

  add_term(r, "loss_ce", suffix, loss_ce, cfg->weight_ce);
  add_term(r, "loss_bbox", suffix, loss_bbox, cfg->weight_bbox);
  add_term(r, "loss_giou", suffix, loss_giou, cfg->weight_giou);
  free(classes);
  free(tgt_boxes);
}

// mean |#queries predicting an object - #targets| over the images (logged only). A query predicts
// an object when its argmax is not the last column: DETR's no-object; with sigmoids (Conditional
// DETR's loss_cardinality, kept as the reference computes it) the last real class.
static float cardinality_error(const float *logits, int64_t B, int64_t Q, int64_t C1, const DetrTarget *targets) {
  double card = 0.0;
  for (int64_t b = 0; b < B; b++) {
    int64_t predicted_objects = 0;
    for (int64_t q = 0; q < Q; q++) {
      const float *row = logits + (b * Q + q) * C1;
      int64_t best = 0;
      for (int64_t c = 1; c < C1; c++)
        if (row[c] > row[best]) best = c;
      if (best != C1 - 1) predicted_objects++;
    }
    card += fabs((double)predicted_objects - (double)targets[b].n);
  }
  return (float)(card / (double)B);
}

// Logged only: the cardinality error of one output and, for the final output, the class error
// (100 - top-1 accuracy over matched queries).
static void logging_metrics(const CriterionConfig *cfg, DetrLayerOutput out, const DetrTarget *targets,
                            const DetrMatch *matches, int layer, CriterionResult *r) {
  int64_t B = out.logits->shape.d[0], Q = out.logits->shape.d[1], C1 = out.logits->shape.d[2];
  float *logits = detr_malloc((size_t)out.logits->numel * sizeof(float), "criterion logits");
  tensor_to_host(out.logits, logits);
  float card = cardinality_error(logits, B, Q, C1, targets);
  if (layer >= 0) {
    r->aux_cardinality_error[layer] = card;
    free(logits);
    return;
  }
  r->cardinality_error = card;
  int64_t correct = 0, matched = 0;
  for (int64_t b = 0; b < B; b++) {
    for (int64_t k = 0; k < matches[b].n; k++) {
      const float *row = logits + (b * Q + matches[b].query[k]) * C1;
      int64_t best = 0;
      for (int64_t c = 1; c < C1; c++)
        if (row[c] > row[best]) best = c;
      correct += best == targets[b].labels[matches[b].target[k]];
      matched++;
    }
  }
  // The reference reports 100 - accuracy, with accuracy 0 for no matched query.
  r->class_error = 100.0f - (matched ? 100.0f * (float)correct / (float)matched : 0.0f);
  free(logits);
}

int criterion_forward(const CriterionConfig *cfg, DetrLayerOutput final, const DetrLayerOutput *aux, int n_aux,
                      const DetrTarget *targets, float num_boxes, const DetrMatch *const *fixed_matches,
                      CriterionResult *out, char *err, size_t err_cap) {
  memset(out, 0, sizeof *out);
  DETR_CHECK(n_aux >= 0 && n_aux < DETR_MAX_LOSS_TERMS / 3 - 1, "criterion: %d auxiliary outputs", n_aux);
  DETR_CHECK(num_boxes >= 1.0f, "criterion: num_boxes %g < 1", num_boxes);
  int B = (int) final.logits->shape.d[0];
  int cols = cfg->num_classes + class_head_or_softmax(cfg->classes)->extra_columns;
  DETR_CHECK(final.logits->shape.ndim == 3 && final.logits->shape.d[2] == cols, "criterion: logits must be [B, Q, %d]",
             cols);
  DetrMatch *matches = detr_calloc((size_t)B, sizeof(DetrMatch), "criterion matches");
  Tensor *total = NULL;
  for (int layer = -1; layer < n_aux; layer++) {  // -1: the final output
    DetrLayerOutput o = layer < 0 ? final : aux[layer];
    const DetrMatch *use = fixed_matches ? fixed_matches[layer + 1] : matches;
    if (!fixed_matches && detr_hungarian_match(o.logits, o.boxes, targets, cfg->matcher, matches, err, err_cap)) {
      free(matches);
      criterion_result_free(out);
      return -1;
    }
    char suffix[12] = "";
    if (layer >= 0) snprintf(suffix, sizeof suffix, "_%d", layer);
    // The metrics read the logits on the host: before the loss ops are queued, so that on a GPU
    // this copy waits for nothing the matcher's copy did not already wait for.
    logging_metrics(cfg, o, targets, use, layer, out);
    layer_losses(cfg, o, targets, use, num_boxes, suffix, out);  // the order of criterion_term_names
    if (layer < 0) {
      out->n_images = B;
      out->matches = detr_calloc((size_t)B, sizeof(DetrMatch), "criterion matches");
      for (int b = 0; b < B; b++) {  // keep the final output's matches for the caller
        int64_t n = use[b].n;
        out->matches[b].n = n;
        out->matches[b].query = detr_malloc((size_t)(n ? n : 1) * sizeof(int64_t), "criterion query");
        out->matches[b].target = detr_malloc((size_t)(n ? n : 1) * sizeof(int64_t), "criterion target");
        memcpy(out->matches[b].query, use[b].query, (size_t)n * sizeof(int64_t));
        memcpy(out->matches[b].target, use[b].target, (size_t)n * sizeof(int64_t));
      }
    }
    if (!fixed_matches) detr_matches_free(matches, B);
  }
  free(matches);
  for (int i = 0; i < out->n_terms; i++) {
    Tensor *weighted = op_mul_scalar(out->terms[i].value, out->terms[i].weight);
    total = total ? op_add(total, weighted) : weighted;
  }
  out->total = total;
  return 0;
}

int criterion_term_names(int n_aux, char names[][24]) {
  static const char *base[3] = {"loss_ce", "loss_bbox", "loss_giou"};
  int n = 0;
  for (int layer = -1; layer < n_aux; layer++)
    for (int k = 0; k < 3; k++) {
      if (layer < 0) snprintf(names[n++], 24, "%s", base[k]);
      else snprintf(names[n++], 24, "%s_%d", base[k], layer);
    }
  return n;
}

void criterion_result_free(CriterionResult *r) {
  if (r->matches) detr_matches_free(r->matches, r->n_images);
  free(r->matches);
  r->matches = NULL;
  r->n_images = 0;
}

float criterion_term(const CriterionResult *r, const char *name) {
  for (int i = 0; i < r->n_terms; i++)
    if (!strcmp(r->terms[i].name, name)) return tensor_item(r->terms[i].value);
  return NAN;
}
