// Object crops of a COCO-format dataset, for pretraining a detector's backbone as a classifier
// (`detr pretrain`): DETR starts from a backbone that already tells the categories apart (the
// reference uses ImageNet weights); with none to download, the crops of the training set's own
// objects serve. Every non-crowd training box becomes one square crop around it, with context.
#pragma once
#include <stdint.h>

#include "datasets/coco.h"
#include "tensor/tensor.h"

typedef struct {
  int side;           // stored crop side in pixels
  int64_t n;          // crops
  uint8_t *pixels;    // [n, side, side, 3] RGB
  int64_t *labels;    // [n] the dataset's labels (contiguous or category ids, as the dataset maps them)
  int num_classes;    // the dataset's label count (ds->num_classes)
  float lut[3][256];  // pixel value -> normalized float (ImageNet mean and std, as the detector's loader)
} CropSet;

// Decodes every image of ds and cuts each target box out as a square of side max(w, h) x
// (1 + context) centred on the box, resampled bilinearly to side x side (outside the image: the
// ImageNet mean colour). Returns 0, or -1 with err set (a missing or corrupt image, no boxes).
int crops_extract(const CocoDataset *ds, int side, float context, CropSet *out, DataError *err);
void crops_free(CropSet *c);

// A batch of n crops as normalized float images [n, out_side, out_side, 3] (the caller's buffer,
// ImageNet mean and std as the detector's loader): with `augment`, a random out_side window of
// each stored crop and a random left-right flip (draws from rng); without, the centre window.
void crops_batch(const CropSet *c, const int64_t *index, int n, int out_side, bool augment, Rng *rng, float *out);
