// The reference's PostProcess: the class head picks the detections (DETR, models/detr.py: per
// query the best class other than no-object and its softmax probability, every query returned;
// Conditional DETR, models/conditional_detr.py: the 100 best (query, class) sigmoid scores), and
// each gets its query's box as absolute xyxy in the original image.
#pragma once
#include <stdint.h>

#include "nn/class_head.h"

typedef struct {
  int64_t query;
  int label;  // model label (a COCO category id unless the dataset maps them)
  float score;
  float box[4];  // x0, y0, x1, y1 in pixels of the original image
} Detection;

// logits [B, Q, cols], boxes [B, Q, 4] (normalized cxcywh); orig_w/orig_h [B]; head NULL: DETR's
// softmax. out [B * head->detections_per_image(Q, cols)], image by image.
void detr_postprocess(const ClassHead *head, const Tensor *logits, const Tensor *boxes, const int *orig_w,
                      const int *orig_h, Detection *out);
