// A deterministic synthetic dataset in COCO format, so that every code path of a COCO run (JPEG
// decoding, the instances JSON with polygon and RLE segmentations, crowd regions, empty images,
// non-contiguous category ids, small/medium/large areas) runs on a fresh machine with no download.
//
// Layout under out_dir (as COCO's train2017/, val2017/, annotations/):
//   train/000000000001.jpg ...                 val/000000000001.jpg ...
//   annotations/instances_train.json           annotations/instances_val.json
// Images: random size in [min_side, max_side], a textured background (gradient, stripes, checker
// or waves in two random colours, plus pixel noise), 0..8 shapes of six categories with
// non-contiguous ids, some striped, placed with bounded overlap (partial occlusion); about 1 in 10
// images has no object; about 1 in 5 val images has a crowd region (many tiny shapes, iscrowd=1,
// an uncompressed RLE). The same seed gives byte-identical files.
#pragma once
#include <stdint.h>

#include "datasets/data_util.h"

typedef struct {
  const char *out_dir;
  int n_train, n_val;
  uint64_t seed;
  int min_side, max_side;  // image width and height are drawn in [min_side, max_side]
  int jpeg_quality;        // 1..100
  // Difficulty (0: the defaults, which exercise every COCO case): at most max_objects shapes per
  // image (1..8, default 8), none with a side below min_object_side pixels (default 10; raising it
  // moves small objects up into the medium range).
  int max_objects, min_object_side;
} SynthConfig;

SynthConfig synth_config_default(void);  // 1000 train, 200 val, seed 0, sides 256..448, quality 90

typedef struct {
  int id;
  const char *name;
} SynthCategory;

#define SYNTH_NUM_CATEGORIES 6
extern const SynthCategory synth_categories[SYNTH_NUM_CATEGORIES];

// Writes the dataset; returns DATA_OK or DATA_ERROR with the file that could not be written.
int synth_generate(const SynthConfig *cfg, DataError *err);
