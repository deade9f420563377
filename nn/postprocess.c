#include "nn/postprocess.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/box_math.h"

void detr_postprocess(const ClassHead *head, const Tensor *logits, const Tensor *boxes, const int *orig_w,
                      const int *orig_h, Detection *out) {
  head = class_head_or_softmax(head);
  int64_t B = logits->shape.d[0], Q = logits->shape.d[1], cols = logits->shape.d[2];
  int64_t K = head->detections_per_image(Q, cols);
  // [B, Q, cols], then [B, Q, 4]
  float *prob = detr_malloc((size_t)(logits->numel + boxes->numel) * sizeof(float), "detr_postprocess prob");
  ClassPick *picks = detr_malloc((size_t)K * sizeof(ClassPick), "detr_postprocess picks");  // [K]
  float *bx = prob + logits->numel;
  tensor_to_host(logits, prob);
  tensor_to_host(boxes, bx);
  head->probabilities(prob, B * Q, cols);
  for (int64_t b = 0; b < B; b++) {
    head->pick(prob + b * Q * cols, Q, cols, picks);
    for (int64_t k = 0; k < K; k++) {
      Detection *d = &out[b * K + k];
      d->query = picks[k].query;
      d->label = picks[k].label;
      d->score = picks[k].score;
      float xyxy[4];
      box_cxcywh_to_xyxy(bx + (b * Q + d->query) * 4, xyxy);
      float sx = (float)orig_w[b], sy = (float)orig_h[b];
      d->box[0] = xyxy[0] * sx;
      d->box[1] = xyxy[1] * sy;
      d->box[2] = xyxy[2] * sx;
      d->box[3] = xyxy[3] * sy;
    }
  }
  free(picks);
  free(prob);
}
