#include "nn/postprocess.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/box_math.h"

void detr_postprocess(const Tensor *logits, const Tensor *boxes, const int *orig_w, const int *orig_h,
                      Detection *out) {
  int64_t B = logits->shape.d[0], Q = logits->shape.d[1], C1 = logits->shape.d[2];
  float *lg = malloc((size_t)(logits->numel + boxes->numel) * sizeof(float));
  DETR_CHECK(lg, "detr_postprocess: out of host memory");
  float *bx = lg + logits->numel;
  tensor_to_host(logits, lg);
  tensor_to_host(boxes, bx);
  for (int64_t b = 0; b < B; b++)
    for (int64_t q = 0; q < Q; q++) {
      const float *row = lg + (b * Q + q) * C1;
      float max = -INFINITY, sum = 0.0f;
      for (int64_t c = 0; c < C1; c++) max = row[c] > max ? row[c] : max;
      for (int64_t c = 0; c < C1; c++) sum += expf(row[c] - max);
      int64_t best = 0;  // the reference: prob[..., :-1].max(-1)
      for (int64_t c = 1; c < C1 - 1; c++)
        if (row[c] > row[best]) best = c;
      Detection *d = &out[b * Q + q];
      d->query = q;
      d->label = (int)best;
      d->score = expf(row[best] - max) / sum;
      float xyxy[4];
      box_cxcywh_to_xyxy(bx + (b * Q + q) * 4, xyxy);
      float sx = (float)orig_w[b], sy = (float)orig_h[b];
      d->box[0] = xyxy[0] * sx;
      d->box[1] = xyxy[1] * sy;
      d->box[2] = xyxy[2] * sx;
      d->box[3] = xyxy[3] * sy;
    }
  free(lg);
}
