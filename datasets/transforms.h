// DETR's data augmentation (facebookresearch/detr datasets/transforms.py and coco.py), on 8-bit
// RGB images with absolute xyxy boxes, with every random draw taken from the caller's counter-based
// Rng so that a sample's augmentation depends only on (seed, epoch, index).
//
// train: RandomHorizontalFlip(flip_prob), then RandomSelect(p = resize_only_prob):
//          RandomResize(scales, max_size)
//        or RandomResize(crop_resize_scales) -> RandomSizeCrop(crop_min, crop_max)
//           -> RandomResize(scales, max_size)
// val:   RandomResize([val_size], max_size)
// then Normalize(mean, std) and boxes -> cxcywh / [w, h, w, h] of the augmented image.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "datasets/data_util.h"
#include "datasets/image.h"
#include "tensor/tensor.h"

#define AUG_MAX_SCALES 32

typedef struct {
  bool train;
  float flip_prob;             // 0.5
  float resize_only_prob;      // 0.5: RandomSelect's p, the plain multi-scale resize branch
  int scales[AUG_MAX_SCALES];  // shortest-side choices: 480, 512, ..., 800
  int n_scales;
  int max_size;                            // longest side limit, 1333 (<= 0: none)
  int crop_resize_scales[AUG_MAX_SCALES];  // resize before the crop, no max size: 400, 500, 600
  int n_crop_resize_scales;
  int crop_min, crop_max;  // RandomSizeCrop(384, 600): crop width and height drawn in [min, max]
  int val_size;            // 800: the val shortest side
  float mean[3], std[3];   // ImageNet statistics, on [0, 1] pixel values
  // Resizes round as transformers' DetrImageProcessor (aug_resize_size; model config resize).
  bool resize_transformers;
} AugConfig;

// The reference's settings (train or val).
AugConfig aug_config_detr(bool train);
// The reference's settings with every size scaled by val_size / 800 (rounded), and max_size as
// given: the small presets, e.g. aug_config_scaled(true, 320, 512).
AugConfig aug_config_scaled(bool train, int val_size, int max_size);
// Checks ranges and counts; returns DATA_OK or DATA_ERROR with a message naming the field.
int aug_config_validate(const AugConfig *cfg, DataError *err);

// Boxes of one image. Labels are the model's class indices.
typedef struct {
  int n;
  int64_t cap;
  float *boxes;     // [n, 4] x0, y0, x1, y1 in pixels of the current image
  int64_t *labels;  // [n]
} Target;

void target_clear(Target *t);
void target_push(Target *t, const float box[4], int64_t label);
void target_free(Target *t);

// get_size_with_aspect_ratio: the output size for resizing a w x h image so that its shorter
// side is `size`, shrunk (with the reference's rounding) when the longer side would exceed
// max_size (<= 0: no limit). Unlike the reference, a side never exceeds IMAGE_MAX_SIDE (a very
// thin image resized without max_size keeps its aspect ratio up to that side). With
// transformers=true, as transformers' DetrImageProcessor computes it instead: where max_size
// shrinks the size, the longer side is int(raw * long / short) of the unrounded
// raw = max_size * short / long, where the reference takes int(round(raw) * long / short)
// (512x900 at 800/1333: 758x1333 against 758x1332).
void aug_resize_size(int w, int h, int size, int max_size, bool transformers, int *out_w, int *out_h);

// The box arithmetic of the reference transforms, in float32 as torch does it.
void target_hflip(Target *t, int image_w);
void target_resize(Target *t, int w, int h, int new_w, int new_h);
// Region rows [top, top+ch), columns [left, left+cw): boxes shifted, clipped to the region and
// dropped when empty (x1 <= x0 or y1 <= y0).
void target_crop(Target *t, int top, int left, int ch, int cw);

// The reference's image+target transforms, in place: img is replaced by the augmented image.
void aug_apply(Image *img, Target *t, const AugConfig *cfg, Rng *rng);

// out[i] = (cx, cy, w, h) / (image_w, image_h, image_w, image_h) for each box: [n, 4].
void target_to_cxcywh_normalized(const Target *t, int image_w, int image_h, float *out);
// lut[c][v] = (v / 255 - mean[c]) / std[c] in float32, as ToTensor + Normalize compute it.
void aug_normalize_lut(const AugConfig *cfg, float lut[3][256]);
// One row of a batch, channels last as the backbone computes: rgb [w, 3] normalized by lut into
// out [W, 3], zeros past w (the reference pads the normalized tensor with 0); mask [W] 0 on the
// image, 1 on the padding. The loader's collate and the C API's batch both write rows with it.
void pad_normalize_row(const uint8_t *rgb, int64_t w, int64_t W, const float lut[3][256], float *out, uint8_t *mask);
