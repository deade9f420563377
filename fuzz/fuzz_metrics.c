// metrics.jsonl as a resumed `detr train` reads it back for chart.png (train/history.c
// history_load): JSON lines of train steps and evaluations, truncated, interleaved with anything,
// holding numbers out of range, NaN or inf. The chart is then rendered from the history (not
// PNG-encoded: that is stb_image_write's, on a fixed-size image).
#include <string.h>

#include "core/runtime.h"
#include "fuzz_util.h"
#include "train/history.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write_file("metrics.jsonl", data, size);
  TrainHistory h = {0};
  history_load(&h, path);
  FUZZ_ASSERT(h.n >= 0 && h.n <= HISTORY_MAX_LOADED_STEPS && h.n_evals >= 0 && h.n_evals <= HISTORY_MAX_EVALS,
              "%d steps, %d evaluations", h.n, h.n_evals);
  Image img;
  history_chart_render(&h, "fuzz", &img);
  FUZZ_ASSERT(img.data && img.w > 0 && img.h > 0, "rendered %dx%d", img.w, img.h);
  image_free(&img);
  history_free(&h);
  return 0;
}
