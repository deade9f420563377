// A training run's settings as its checkpoints store them (train/checkpoint.h TrainState.run), for
// tests that write a checkpoint themselves: the sizes, padding and batch given, the rest detr
// train's defaults for a short run.
#pragma once
#include <math.h>

#include "api/model_file.h"

static inline RunSettings test_run_settings(int image_size, int max_size, int pad_multiple, int batch) {
  return (RunSettings){.known = true,
                       .epochs = 1,
                       .lr_drop = 1,
                       .batch = batch,
                       .pad_multiple = pad_multiple,
                       .image_size = image_size,
                       .max_size = max_size,
                       .augment = 1,
                       .lr = 1e-4f,
                       .lr_backbone = 1e-5f,
                       .weight_decay = 1e-4f,
                       .clip = 0.1f,
                       .ce = NAN,
                       .bbox = NAN,
                       .giou = NAN,
                       .eos = NAN,
                       .cost_class = NAN,
                       .cost_bbox = NAN,
                       .cost_giou = NAN};
}
