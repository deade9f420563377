#define _DEFAULT_SOURCE  // access
#include "train/setup.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "train/dist.h"

#if DETR_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

int setup_model_config(const char *config, const CliList *sets, DetrConfig *cfg, char *err, size_t err_cap) {
  return model_config_load(config, sets ? sets->items : NULL, sets ? sets->count : 0, cfg, err, err_cap);
}

int setup_apply_sets(DetrConfig *cfg, const CliList *sets, char *err, size_t err_cap) {
  return model_config_apply_sets(cfg, sets ? sets->items : NULL, sets ? sets->count : 0, err, err_cap);
}

void setup_split_paths(const char *data_dir, const char *split, char *ann, size_t ann_cap, char *img, size_t img_cap) {
  snprintf(ann, ann_cap, "%s/annotations/instances_%s.json", data_dir, split);
  size_t len = strlen(ann);
  if (access(ann, F_OK) != 0 && len + 3 < ann_cap) {
    memcpy(ann + len, ".gz", 4);
    if (access(ann, F_OK) != 0) ann[len] = 0;  // neither exists: report the plain name
  }
  snprintf(img, img_cap, "%s/%s", data_dir, split);
}

int setup_device(const char *name, Device *dev, char *err, size_t err_cap) {
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
  return dist_bind_device(*dev, err, err_cap);
#else
  snprintf(err, err_cap, "--device cuda: this build has no CUDA backend (configure with -DDETR_CUDA=ON)");
  return -1;
#endif
}

void setup_enact_shortcut(DetrConfig *cfg, bool enact) {
  if (enact) cfg->encoder_attn = encoder_attn_find("enact");
}

int setup_load_model(const char *checkpoint, const char *weights, const char *config, const CliList *sets, bool enact,
                     Device dev, DetrModel **out, CheckpointInfo *info, char *err, size_t err_cap) {
  // --enact: a last override (setup_enact_shortcut's effect, in model_file_load's terms).
  const char *all[CLI_MAX_LIST + 1];
  int n = 0;
  for (int i = 0; sets && i < sets->count; i++) all[n++] = sets->items[i];
  if (enact) all[n++] = "encoder_attn=enact";
  detr_status st = model_file_load(checkpoint, weights, config, all, n, dev, out, info, err, err_cap);
  return st == DETR_OK ? 0 : -1;
}
