// DETR's PostProcess (models/detr.py): per query, the softmax over classes, the best class other
// than no-object and its probability as the score, and the box as absolute xyxy in the original
// image. Every query yields a detection, as the reference returns them all.
#pragma once
#include <stdint.h>

#include "autograd/ops.h"

typedef struct {
  int64_t query;
  int label;        // model label (a COCO category id unless the dataset maps them)
  float score;
  float box[4];     // x0, y0, x1, y1 in pixels of the original image
} Detection;

// logits [B, Q, C+1], boxes [B, Q, 4] (normalized cxcywh); orig_w/orig_h [B]; out [B * Q].
void detr_postprocess(const Tensor *logits, const Tensor *boxes, const int *orig_w, const int *orig_h,
                      Detection *out);
