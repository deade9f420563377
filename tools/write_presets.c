// write_presets DIR: the model presets as key=value files (DIR/<preset>.conf), written at build
// time from nn/presets.c's table and installed to share/detr/presets: a starting point for
// `--config FILE` (detr train/eval/predict) and detr_open_weights(), and exactly what the built-in
// preset names mean.
#include <stdio.h>
#include <string.h>

#include "core/runtime.h"
#include "nn/detr.h"

int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  if (argc != 2) {
    fprintf(stderr, "usage: write_presets DIR\n");
    return 2;
  }
  const char *const *PRESETS = DETR_PRESETS;
  for (size_t i = 0; PRESETS[i]; i++) {
    DetrConfig cfg;
    if (detr_config_preset(PRESETS[i], &cfg)) {
      fprintf(stderr, "write_presets: unknown preset %s\n", PRESETS[i]);
      return 1;
    }
    char text[8192], path[4096];
    detr_config_format(&cfg, text, sizeof text);
    snprintf(path, sizeof path, "%s/%s.conf", argv[1], PRESETS[i]);
    FILE *f = fopen(path, "w");
    if (!f) {
      perror(path);
      return 1;
    }
    fprintf(f,
            "# detr-c model preset '%s': the same model as --config %s. Copy and edit it, then pass\n"
            "# the file as --config FILE (detr train/eval/predict) or to detr_open_weights(). key=value lines,\n"
            "# # comments; fields not given keep detr-r50's values.\n%s",
            PRESETS[i], PRESETS[i], text);
    if (fclose(f)) {
      perror(path);
      return 1;
    }
  }
  return 0;
}
