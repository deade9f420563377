#include "train/setup.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/model_io.h"
#include "train/checkpoint.h"

#if DETR_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

static int apply_line(DetrConfig *cfg, char *line, const char *where, char *err, size_t err_cap) {
  char *hash = strchr(line, '#');
  if (hash) *hash = 0;
  char *start = line + strspn(line, " \t\r\n");
  size_t len = strlen(start);
  while (len && strchr(" \t\r\n", start[len - 1])) start[--len] = 0;
  if (!len) return 0;
  char *eq = strchr(start, '=');
  if (!eq) {
    snprintf(err, err_cap, "%s: '%s' is not key=value", where, start);
    return -1;
  }
  *eq = 0;
  char local[256];
  if (detr_config_set(cfg, start, eq + 1, local, sizeof local)) {
    snprintf(err, err_cap, "%s: %s", where, local);
    return -1;
  }
  return 0;
}

int setup_model_config(const char *config, const CliList *sets, DetrConfig *cfg, char *err, size_t err_cap) {
  if (detr_config_preset(config, cfg) != 0) {
    FILE *f = fopen(config, "r");
    if (!f) {
      snprintf(err, err_cap, "--config %s: not a preset (detr-r50, detr-r18-small, tiny) nor a readable file", config);
      return -1;
    }
    detr_config_preset("detr-r50", cfg);  // a file overrides the paper's configuration
    char line[512], where[600];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
      snprintf(where, sizeof where, "%s:%d", config, ++lineno);
      rc = apply_line(cfg, line, where, err, err_cap);
    }
    fclose(f);
    if (rc) return -1;
  }
  for (int i = 0; sets && i < sets->count; i++) {
    char line[512];
    snprintf(line, sizeof line, "%s", sets->items[i]);
    if (apply_line(cfg, line, "--set", err, err_cap)) return -1;
  }
  return detr_config_validate(cfg, err, err_cap);
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
  if (cuda_device_count() == 0) {
    snprintf(err, err_cap, "--device cuda: no CUDA device is available");
    return -1;
  }
  *dev = DEVICE_CUDA;
  return 0;
#else
  snprintf(err, err_cap, "--device cuda: this build has no CUDA backend (configure with -DDETR_CUDA=ON)");
  return -1;
#endif
}

void setup_default_sizes(const DetrConfig *cfg, int *image_size, int *max_size) {
  bool small = cfg->backbone_depth < 50, tiny = cfg->hidden_dim <= 32;
  *image_size = tiny ? 128 : small ? 320 : 800;
  *max_size = tiny ? 192 : small ? 512 : 1333;
}

int setup_load_model(const char *checkpoint, const char *weights, const char *config, const CliList *sets, bool enact,
                     Device dev, DetrModel **out, char *err, size_t err_cap) {
  *out = NULL;
  if ((checkpoint != NULL) == (weights != NULL)) {
    snprintf(err, err_cap, "give exactly one of --checkpoint and --weights");
    return -1;
  }
  DetrConfig cfg;
  if (checkpoint) {
    char *model_text = NULL, *train_text = NULL;
    if (checkpoint_read_configs(checkpoint, &model_text, &train_text, err, err_cap)) return -1;
    detr_config_preset("detr-r50", &cfg);  // every field is then set from the stored text
    int rc = 0;
    for (char *line = strtok(model_text, "\n"); line && !rc; line = strtok(NULL, "\n")) {
      char *eq = strchr(line, '=');
      if (!eq) continue;
      *eq = 0;
      char local[256];
      if (detr_config_set(&cfg, line, eq + 1, local, sizeof local)) {
        snprintf(err, err_cap, "%s: stored config: %s", checkpoint, local);
        rc = -1;
      }
    }
    free(model_text);
    free(train_text);
    if (rc || detr_config_validate(&cfg, err, err_cap)) return -1;
  } else {
    if (setup_model_config(config, sets, &cfg, err, err_cap)) return -1;
    if (enact) cfg.enact = true;
  }
  DetrModel *m = detr_model_create(&cfg, dev);
  detr_model_init(m, 0);  // ENACT's W_prob keeps this when the weights have none
  TrainState state;
  int rc = checkpoint ? checkpoint_load(checkpoint, m, NULL, &state, err, err_cap)
                      : params_load_file(&m->params, weights, err, err_cap);
  if (rc) {
    detr_model_free(m);
    return -1;
  }
  *out = m;
  return 0;
}
