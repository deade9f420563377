// metrics.jsonl as `detr train` reads it back to draw chart.png (train/trainer.c
// metrics_chart_render): JSON lines of train steps and evaluations, truncated, interleaved with
// anything, holding numbers out of range, NaN or inf. The chart is rendered (not PNG-encoded:
// that is stb_image_write's, on a fixed-size image).
#include <string.h>

#include "fuzz_util.h"
#include "train/trainer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write_file("metrics.jsonl", data, size);
  Image img;
  char err[1024] = "";
  if (metrics_chart_render(path, "fuzz", &img, err, sizeof err)) {
    fuzz_expect_error(err, path);
    return 0;
  }
  FUZZ_ASSERT(img.data && img.w > 0 && img.h > 0, "rendered %dx%d", img.w, img.h);
  image_free(&img);
  return 0;
}
