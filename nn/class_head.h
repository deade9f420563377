// How the class head's logits are read (the focal head: docs/conditional_detr.md): DETR's softmax
// over C + 1 columns whose last is "no object" (class_softmax.c), or Conditional DETR's C independent
// sigmoids trained with a focal loss (class_focal.c). The decoder kind names its head
// (nn/decoder.h); the criterion's classification loss, the matcher's class cost and the
// post-processing ask the head and nothing else.
#pragma once
#include "autograd/ops.h"

typedef struct {
  int num_classes;  // C; a query's class C means "no object"
  float num_boxes;  // the global batch's targets (at least 1)
  float eos_coef;   // softmax: the no-object class's cross-entropy weight
  float ce_share;   // softmax, data parallel: this process's share of the global CE weight
} ClassLossArgs;

// One detection before boxes are attached: which query, which class, its score.
typedef struct {
  int64_t query;
  int label;
  float score;
} ClassPick;

typedef struct ClassHead {
  const char *name;
  int extra_columns;            // logits columns beyond the C classes (softmax: 1, the no-object)
  float weight_ce, cost_class;  // the loss's weight in the total and the matcher's class-cost weight
  float score_threshold;        // a detection's score worth showing (detr predict's default --threshold)
  // Host logits [rows, cols] -> probabilities in place (softmax over the row, or sigmoids).
  void (*probabilities)(float *x, int64_t rows, int64_t cols);
  // The matcher's class cost of a query with probabilities prob [cols] for a target of class label.
  float (*match_cost)(const float *prob, int64_t label);
  // The classification loss over every query: logits [B*Q, cols], classes [B*Q] (C: no object).
  Tensor *(*loss)(Tensor *logits, const int64_t *classes, const ClassLossArgs *a);
  // Detections per image from Q queries of `cols` columns, and the picks themselves from one
  // image's probabilities [Q, cols] (picks [detections_per_image], best first or in query order).
  int64_t (*detections_per_image)(int64_t queries, int64_t cols);
  void (*pick)(const float *prob, int64_t queries, int64_t cols, ClassPick *picks);
} ClassHead;

extern const ClassHead class_head_softmax;  // DETR (models/detr.py)
extern const ClassHead class_head_focal;    // Conditional DETR (models/conditional_detr.py)

// An unset head (NULL in a config, a matcher's weights or a decoder kind) is DETR's softmax.
static inline const ClassHead *class_head_or_softmax(const ClassHead *head) {
  return head ? head : &class_head_softmax;
}
