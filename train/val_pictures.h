// The pictures an evaluation adds to the run's TensorBoard file: the model's detections on the
// first few images of the val split, drawn on the images as they are on disk.
#pragma once
#include <stddef.h>

#include "datasets/coco.h"
#include "datasets/image.h"
#include "datasets/transforms.h"
#include "nn/detr.h"

#define VAL_PICTURES_MAX 4

typedef struct {
  Image img[VAL_PICTURES_MAX];
  char name[VAL_PICTURES_MAX][128];  // the image's file name, as the annotation file gives it
  int n;
} ValPictures;

// Runs the model without gradients on the first n (<= VAL_PICTURES_MAX) images of ds, resized as
// the evaluation resizes them (aug, pad_multiple), and draws on each image, scaled up to at least
// DRAW_MIN_LONG_SIDE pixels: its ground-truth boxes in thin white, and as many detections as it
// has boxes (at least one), the best scoring, in their class's colour labelled "name score" -
// whatever the score, so that the pictures show what an early model predicts too. Returns 0, or
// -1 with err set (out then holds nothing).
int val_pictures_draw(const DetrModel *m, const CocoDataset *ds, AugConfig aug, int pad_multiple, int n,
                      ValPictures *out, char *err, size_t err_cap);
void val_pictures_free(ValPictures *p);
