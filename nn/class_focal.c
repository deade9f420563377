// Conditional DETR's classes (models/conditional_detr.py, models/matcher.py; from Deformable
// DETR): C sigmoids, no "no object" column. Loss: sigmoid focal loss (alpha 0.25, gamma 2) summed
// over every query and class, over num_boxes (the reference takes the mean over queries,
// loss.mean(1), then multiplies by src_logits.shape[1] = Q); weight 2 (cls_loss_coef). Matcher cost
// alpha (1-p)^2 (-log(p + 1e-8)) - (1-alpha) p^2 (-log(1 - p + 1e-8)) at the target class, weight 2
// (set_cost_class). Post-processing: the 100 best (query, class) sigmoid scores of the image.
#include <math.h>
#include <stdlib.h>

#include "nn/class_head.h"

#define FOCAL_ALPHA 0.25f
#define FOCAL_GAMMA 2.0f
#define FOCAL_TOP_K 100  // PostProcess's topk(prob, 100)

static void probabilities(float *x, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows * cols; i++) x[i] = 1.0f / (1.0f + expf(-x[i]));
}

static float match_cost(const float *prob, int64_t label) {
  float p = prob[label];
  float neg = (1.0f - FOCAL_ALPHA) * (p * p) * -logf(1.0f - p + 1e-8f);
  float pos = FOCAL_ALPHA * ((1.0f - p) * (1.0f - p)) * -logf(p + 1e-8f);
  return pos - neg;
}

static Tensor *loss(Tensor *logits, const int64_t *classes, const ClassLossArgs *a) {
  return op_mul_scalar(op_sigmoid_focal_loss(logits, classes, FOCAL_ALPHA, FOCAL_GAMMA), 1.0f / a->num_boxes);
}

static int64_t detections_per_image(int64_t queries, int64_t cols) {
  return queries * cols < FOCAL_TOP_K ? queries * cols : FOCAL_TOP_K;
}

// Best first; equal scores in index order (torch.topk does not promise an order among ties).
static int by_score_desc(const void *a, const void *b) {
  const ClassPick *x = a, *y = b;
  if (x->score != y->score) return x->score < y->score ? 1 : -1;
  if (x->query != y->query) return x->query < y->query ? -1 : 1;
  return (x->label > y->label) - (x->label < y->label);
}

static void pick(const float *prob, int64_t queries, int64_t cols, ClassPick *picks) {
  int64_t n = queries * cols, k = detections_per_image(queries, cols);
  ClassPick *all = detr_malloc((size_t)n * sizeof(ClassPick), "class_focal all");  // [Q * C]
  for (int64_t i = 0; i < n; i++) all[i] = (ClassPick){.query = i / cols, .label = (int)(i % cols), .score = prob[i]};
  qsort(all, (size_t)n, sizeof *all, by_score_desc);
  for (int64_t i = 0; i < k; i++) picks[i] = all[i];
  free(all);
}

const ClassHead class_head_focal = {
    .name = "focal",
    .extra_columns = 0,
    .weight_ce = 2.0f,
    .cost_class = 2.0f,
    .score_threshold = 0.3f,  // sigmoid scores run lower than softmax's (tools/main.sh uses 0.3)
    .probabilities = probabilities,
    .match_cost = match_cost,
    .loss = loss,
    .detections_per_image = detections_per_image,
    .pick = pick,
};
