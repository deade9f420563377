#include "cli/setup.h"

#include <stdio.h>
#include <string.h>

#include "dist/dist.h"

#if DETR_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

int setup_model_config(const char *config, const CliList *sets, DetrConfig *cfg, char *err, size_t err_cap) {
  return model_config_load(config, sets ? sets->items : NULL, sets ? sets->count : 0, cfg, err, err_cap);
}

int setup_apply_sets(DetrConfig *cfg, const CliList *sets, char *err, size_t err_cap) {
  return model_config_apply_sets(cfg, sets ? sets->items : NULL, sets ? sets->count : 0, err, err_cap);
}

int setup_device(const Dist *job, const char *name, Device *dev, char *err, size_t err_cap) {
  if (!strcmp(name, "cpu")) {
    *dev = DEVICE_CPU;
    return 0;
  }
  if (strcmp(name, "cuda")) {
    snprintf(err, err_cap, "--device %s: expected cpu or cuda", name);
    return -1;
  }
#if DETR_HAVE_CUDA
  char why[512];
  int n = cuda_device_probe(why, sizeof why);
  if (n == 0) {
    snprintf(err, err_cap, "--device cuda: no CUDA device: %s", why);
    return -1;
  }
  if (n < 0) {
    snprintf(err, err_cap, "--device cuda: %s", why);
    return -1;
  }
  *dev = DEVICE_CUDA;
  // Under mpirun each rank takes its own GPU before its first CUDA work (every verb, not only train).
  return dist_bind_device(job, *dev, err, err_cap);
#else
  snprintf(err, err_cap, "--device cuda: this build has no CUDA backend (configure with -DDETR_CUDA=ON)");
  return -1;
#endif
}

int setup_enact(bool enact, CliList *sets, char *err, size_t err_cap) {
  if (!enact) return 0;
  if (sets->count >= CLI_MAX_LIST) {
    snprintf(err, err_cap, "--enact: too many --set flags (at most %d with it)", CLI_MAX_LIST - 1);
    return -1;
  }
  sets->items[sets->count++] = "encoder_attn=enact";
  return 0;
}

int setup_precision(const char *precision, bool inference, Device dev, CliList *sets, char *err, size_t err_cap) {
  DetrMath math;
  const char *keys[2];
  char why[512];
  int n = detr_math_parse(precision, &math, why, sizeof why)
              ? -1
              : detr_math_keys(math, inference, dev, sets->items, sets->count, keys, why, sizeof why);
  if (n < 0) {
    snprintf(err, err_cap, "--precision %s%s", why, math == DETR_MATH_BF16 ? "; use --precision fp32" : "");
    return -1;
  }
  if (sets->count + n > CLI_MAX_LIST) {
    snprintf(err, err_cap, "--precision: too many --set flags (at most %d in all)", CLI_MAX_LIST - n);
    return -1;
  }
  for (int i = 0; i < n; i++) sets->items[sets->count++] = keys[i];
  return 0;
}

int setup_load_model(const char *checkpoint, const char *weights, const char *config, const CliList *sets, Device dev,
                     DetrModel **out, CheckpointInfo *info, char *err, size_t err_cap) {
  detr_status st = model_file_load(checkpoint, weights, config, sets ? sets->items : NULL, sets ? sets->count : 0, dev,
                                   out, info, err, err_cap);
  return st == DETR_OK ? 0 : -1;
}
