// DETR's Hungarian matcher: per image, the query-target assignment minimising
// cost_bbox * L1(cxcywh) + cost_class * class cost + cost_giou * (-GIoU), the class cost the class
// head's (DETR: -softmax prob of the target class; Conditional DETR: the focal cost), computed
// without gradients and solved exactly on the host (nn/hungarian.h).
#pragma once
#include <stddef.h>

#include "nn/class_head.h"

// Ground truth of one image, in host memory: normalized cxcywh boxes [n, 4], labels [n].
typedef struct {
  int64_t n;
  const float *boxes;
  const int64_t *labels;
} DetrTarget;

// Matched pairs of one image: query[k] <-> target[k] for k < n, query ascending (as the
// reference's scipy call returns them).
typedef struct {
  int64_t n;
  int64_t *query;
  int64_t *target;
} DetrMatch;

typedef struct {
  float cost_class, cost_bbox, cost_giou;  // DETR: 1, 5, 2; Conditional DETR: 2, 5, 2
  const ClassHead *classes;                // how logits give the class cost (NULL: DETR's softmax)
} MatcherWeights;

// logits [B, Q, C + extra columns], boxes [B, Q, 4] on any device; targets [B]; fills matches [B] (free with
// detr_matches_free). Returns 0, or -1 with err naming the image and the bad entry (NaN or -inf
// cost, out-of-range label, infeasible matrix).
int detr_hungarian_match(const Tensor *logits, const Tensor *boxes, const DetrTarget *targets, MatcherWeights w,
                         DetrMatch *matches, char *err, size_t err_cap);
void detr_matches_free(DetrMatch *matches, int n_images);
