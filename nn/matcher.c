#include "nn/matcher.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/box_math.h"
#include "nn/hungarian.h"

int detr_hungarian_match(const Tensor *logits, const Tensor *boxes, const DetrTarget *targets, MatcherWeights w,
                         DetrMatch *matches, char *err, size_t err_cap) {
  char s1[64], s2[64];
  DETR_CHECK(logits->shape.ndim == 3 && boxes->shape.ndim == 3 && boxes->shape.d[2] == 4 &&
                 logits->shape.d[0] == boxes->shape.d[0] && logits->shape.d[1] == boxes->shape.d[1],
             "detr_hungarian_match: logits %s and boxes %s are not [B, Q, C'] and [B, Q, 4]",
             shape_str(logits->shape, s1, sizeof s1), shape_str(boxes->shape, s2, sizeof s2));
  int64_t B = logits->shape.d[0], Q = logits->shape.d[1], C = logits->shape.d[2];
  memset(matches, 0, (size_t)B * sizeof(DetrMatch));
  // Only these two small tensors cross to the host: prob [B*Q, C], box [B*Q, 4].
  float *prob = detr_malloc((size_t)(logits->numel + boxes->numel) * sizeof(float), "detr_hungarian_match prob");
  float *box = prob + logits->numel;
  tensor_to_host(logits, prob);
  tensor_to_host(boxes, box);
  const ClassHead *head = class_head_or_softmax(w.classes);
  head->probabilities(prob, B * Q, C);
  int status = 0;
  int64_t n_classes = C - head->extra_columns;  // a target's label is one of them
  for (int64_t b = 0; b < B && status == 0; b++) {
    const DetrTarget *t = &targets[b];
    int64_t n = t->n;
    double *cost = detr_malloc((size_t)(Q * (n ? n : 1)) * sizeof(double), "detr_hungarian_match cost");  // [Q, n]
    matches[b].query = detr_malloc((size_t)(n ? n : 1) * sizeof(int64_t), "detr_hungarian_match query");
    matches[b].target = detr_malloc((size_t)(n ? n : 1) * sizeof(int64_t), "detr_hungarian_match target");
    for (int64_t j = 0; j < n && status == 0; j++) {
      if (t->labels[j] < 0 || t->labels[j] >= n_classes) {
        snprintf(err, err_cap, "image %lld: target %lld has label %lld outside [0, %lld)", (long long)b, (long long)j,
                 (long long)t->labels[j], (long long)n_classes);
        status = -1;
      }
    }
    for (int64_t q = 0; q < Q && status == 0; q++) {
      const float *pq = prob + (b * Q + q) * C, *bq = box + (b * Q + q) * 4;
      float bq_xyxy[4], t_xyxy[4];
      box_cxcywh_to_xyxy(bq, bq_xyxy);
      for (int64_t j = 0; j < n; j++) {
        const float *tj = t->boxes + 4 * j;
        float l1 = fabsf(bq[0] - tj[0]) + fabsf(bq[1] - tj[1]) + fabsf(bq[2] - tj[2]) + fabsf(bq[3] - tj[3]);
        box_cxcywh_to_xyxy(tj, t_xyxy);
        float c = w.cost_bbox * l1 + w.cost_class * head->match_cost(pq, t->labels[j]) +
                  w.cost_giou * -box_giou(bq_xyxy, t_xyxy);
        cost[q * n + j] = (double)c;
      }
    }
    if (status == 0) {
      int64_t bad_q = -1, bad_t = -1;
      LsaStatus st = linear_sum_assignment(Q, n, cost, matches[b].query, matches[b].target, &bad_q, &bad_t);
      if (st == LSA_INVALID) {
        snprintf(err, err_cap,
                 "image %lld: matching cost is %g at query %lld, target %lld (NaN or -inf in "
                 "the predictions or targets)",
                 (long long)b, cost[bad_q * n + bad_t], (long long)bad_q, (long long)bad_t);
        status = -1;
      } else if (st != LSA_OK) {
        snprintf(err, err_cap, "image %lld: %s", (long long)b, lsa_status_str(st));
        status = -1;
      } else {
        matches[b].n = Q < n ? Q : n;
      }
    }
    free(cost);
  }
  free(prob);
  if (status != 0) detr_matches_free(matches, (int)B);
  return status;
}

void detr_matches_free(DetrMatch *matches, int n_images) {
  for (int b = 0; b < n_images; b++) {
    free(matches[b].query);
    free(matches[b].target);
    matches[b] = (DetrMatch){0};
  }
}
