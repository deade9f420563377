// Shared set-up of the verbs: model configuration from a preset or file plus overrides, devices.
#pragma once
#include "nn/detr.h"
#include "train/cli.h"
#include "datasets/transforms.h"

// config: a preset name (detr-r50, detr-r18-small, tiny) or a file of key=value lines (# comments);
// sets: "key=value" overrides applied in order. Returns 0, or -1 with err set.
int setup_model_config(const char *config, const CliList *sets, DetrConfig *cfg, char *err, size_t err_cap);
// "cpu" or "cuda". Returns 0, or -1 with err set (unknown name, or CUDA not built / no device).
int setup_device(const char *name, Device *dev, char *err, size_t err_cap);

// A model to run: from a detr-c checkpoint (its stored config; the crc is verified), or from
// weights (strict) with a config from `config` (+ sets). enact forces ENACT on (with weights).
// Returns 0 or -1 with err set.
int setup_load_model(const char *checkpoint, const char *weights, const char *config, const CliList *sets, bool enact,
                     Device dev, DetrModel **out, char *err, size_t err_cap);
// Default evaluation image sizes for a model: 800/1333 (ResNet-50/101), 320/512 (18/34),
// 128/192 (hidden_dim <= 32, the tiny preset), as `detr train` uses.
void setup_default_sizes(const DetrConfig *cfg, int *image_size, int *max_size);
