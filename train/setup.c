#include "train/setup.h"

#include <stdio.h>
#include <string.h>

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
