// DETR's SetCriterion: Hungarian matching per decoder output, then the class head's loss over all
// queries (DETR: cross-entropy with no-object weight eos_coef; Conditional DETR: sigmoid focal,
// nn/class_head.h), L1 and GIoU losses over matched pairs divided by num_boxes, for the final
// output and each auxiliary output (suffix _0, _1, ...). An autograd composite: the total's
// gradient flows to every layer's logits and boxes.
#pragma once
#include "autograd/ops.h"
#include "nn/matcher.h"

typedef struct {
  int num_classes;                            // logits have num_classes + classes->extra_columns columns
  const ClassHead *classes;                   // how logits are read (NULL: DETR's softmax with "no object")
  float eos_coef;                             // softmax: cross-entropy weight of the no-object class (0.1)
  float weight_ce, weight_bbox, weight_giou;  // DETR 1, 5, 2; Conditional DETR 2, 5, 2
  MatcherWeights matcher;                     // DETR 1, 5, 2; Conditional DETR 2, 5, 2
  // Data parallelism: this process's share of the global batch's cross-entropy weight (sum of the
  // class weights of its queries' targets over the global batch's), 1 in one process. The mean
  // over the global batch is then the sum over processes of share * local mean, as for L1/GIoU
  // with the global num_boxes.
  float ce_share;
} CriterionConfig;

CriterionConfig criterion_config_default(int num_classes);  // DETR's (softmax)
// The criterion of a class head: its loss and class-cost weights, the rest DETR's.
CriterionConfig criterion_config_for(int num_classes, const ClassHead *classes);

// One decoder output: logits [B, Q, C + extra columns], boxes [B, Q, 4] (sigmoid, normalized cxcywh).
typedef struct {
  Tensor *logits, *boxes;
} DetrLayerOutput;

#define DETR_MAX_LOSS_TERMS 48

typedef struct {
  char name[24];  // loss_ce, loss_bbox, loss_giou, loss_ce_0, ...
  Tensor *value;  // one-element scoped tensor
  float weight;   // its weight in the total
} LossTerm;

typedef struct {
  Tensor *total;  // sum of weight * value over the terms (one element, scoped)
  LossTerm terms[DETR_MAX_LOSS_TERMS];
  int n_terms;
  float class_error;        // 100 - top-1 accuracy (%) of the final output's matched queries
  float cardinality_error;  // mean |#queries whose argmax is not the last column - #targets| per image
  float aux_cardinality_error[DETR_MAX_LOSS_TERMS / 3];  // the same for each auxiliary output
  DetrMatch *matches;  // [n_images], the final output's matches (owned: criterion_result_free)
  int n_images;
} CriterionResult;

// final: the last decoder output; aux[n_aux]: the earlier ones in order. num_boxes: total
// targets in the global batch, at least 1. fixed_matches: NULL to match, or [1 + n_aux][B]
// matches to use as given (final first), e.g. to hold matching fixed in a gradient check.
// Returns 0, or -1 with err set (matching failures name the image; the caller adds the step).
int criterion_forward(const CriterionConfig *cfg, DetrLayerOutput final, const DetrLayerOutput *aux, int n_aux,
                      const DetrTarget *targets, float num_boxes, const DetrMatch *const *fixed_matches,
                      CriterionResult *out, char *err, size_t err_cap);
void criterion_result_free(CriterionResult *r);
// The names of the terms criterion_forward makes for n_aux auxiliary outputs, in its order
// (final then auxiliary, each ce, bbox, giou). Returns their number, 3 * (1 + n_aux).
int criterion_term_names(int n_aux, char names[][24]);
// The value of a term by name, or NAN when absent.
float criterion_term(const CriterionResult *r, const char *name);
