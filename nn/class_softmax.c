// DETR's classes (models/detr.py, models/matcher.py): softmax over C + 1 columns, the last "no
// object"; cross-entropy over every query with the no-object class weighted eos_coef; matcher cost
// -prob[target]; post-processing: per query the best real class and its probability.
#include <math.h>
#include <stdlib.h>

#include "nn/class_head.h"

static void probabilities(float *x, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; r++) {  // float32, as the reference
    float *row = x + r * cols, max = -INFINITY, sum = 0.0f;
    for (int64_t c = 0; c < cols; c++) max = row[c] > max ? row[c] : max;
    for (int64_t c = 0; c < cols; c++) sum += (row[c] = expf(row[c] - max));
    for (int64_t c = 0; c < cols; c++) row[c] /= sum;
  }
}

static float match_cost(const float *prob, int64_t label) { return -prob[label]; }

static Tensor *loss(Tensor *logits, const int64_t *classes, const ClassLossArgs *a) {
  int64_t cols = logits->shape.d[1];
  float *w = detr_malloc((size_t)cols * sizeof(float), "class_softmax w");  // [C + 1]
  for (int64_t c = 0; c < cols; c++) w[c] = c == a->num_classes ? a->eos_coef : 1.0f;
  Tensor *weight = op_constant(logits->device, SHAPE(cols), w);
  free(w);
  Tensor *ce = op_cross_entropy(logits, classes, weight);
  return a->ce_share != 1.0f ? op_mul_scalar(ce, a->ce_share) : ce;
}

static int64_t detections_per_image(int64_t queries, int64_t cols) { return queries; }

static void pick(const float *prob, int64_t queries, int64_t cols, ClassPick *picks) {
  for (int64_t q = 0; q < queries; q++) {
    const float *row = prob + q * cols;
    int64_t best = 0;  // the reference: prob[..., :-1].max(-1), the first of equal maxima
    for (int64_t c = 1; c < cols - 1; c++)
      if (row[c] > row[best]) best = c;
    picks[q] = (ClassPick){.query = q, .label = (int)best, .score = row[best]};
  }
}

const ClassHead class_head_softmax = {
    .name = "softmax",
    .extra_columns = 1,
    .weight_ce = 1.0f,
    .cost_class = 1.0f,
    .score_threshold = 0.5f,
    .probabilities = probabilities,
    .match_cost = match_cost,
    .loss = loss,
    .detections_per_image = detections_per_image,
    .pick = pick,
};
