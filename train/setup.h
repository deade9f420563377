// Shared set-up of the verbs: model configuration from a preset or file plus overrides, devices.
#pragma once
#include "nn/detr.h"
#include "train/cli.h"

// config: a preset name (detr-r50, detr-r18-small, tiny) or a file of key=value lines (# comments);
// sets: "key=value" overrides applied in order. Returns 0, or -1 with err set.
int setup_model_config(const char *config, const CliList *sets, DetrConfig *cfg, char *err, size_t err_cap);
// "cpu" or "cuda". Returns 0, or -1 with err set (unknown name, or CUDA not built / no device).
int setup_device(const char *name, Device *dev, char *err, size_t err_cap);
