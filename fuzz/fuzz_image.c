// Images as training and prediction read them: a JPEG or PNG file's header (image_read_header,
// `check_images`), its decode (image_decode_file: stb_image behind the truncated-JPEG check and
// the size limits), then DETR's transforms on the decoded pixels with boxes in and around the
// image: the train augmentation (flip, multi-scale resize, resize + random crop) and the val
// resize, at a small scale (shortest side 48..64, longest 96) to keep executions fast, and the
// boxes' normalised cxcywh form the loader hands to the model.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "datasets/image.h"
#include "datasets/transforms.h"
#include "fuzz_util.h"

// The pixel limit lowered to 4 Mpixels: a full-size decode (178 Mpixels) takes seconds under the
// sanitizers and would read as a hang. The limit's check is the same code at any value.
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  image_set_max_pixels(1 << 22);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write_file("image", data, size);
  DataError err = {{0}};
  int hw = 0, hh = 0;
  bool header = image_read_header(path, &hw, &hh, &err) == DATA_OK;
  if (!header) fuzz_expect_error(err.msg, path);
  Image img;
  err.msg[0] = 0;
  if (image_decode_file(path, &img, &err) != DATA_OK) {
    fuzz_expect_error(err.msg, path);
    FUZZ_ASSERT(!img.data, "a failed decode returned pixels");
    return 0;
  }
  FUZZ_ASSERT(img.w >= 1 && img.h >= 1 && img.w <= IMAGE_MAX_SIDE && img.h <= IMAGE_MAX_SIDE, "decoded %dx%d", img.w,
              img.h);
  FUZZ_ASSERT((int64_t)img.w * img.h <= image_max_pixels(), "decoded %dx%d, over the pixel limit", img.w, img.h);
  FUZZ_ASSERT(header && hw == img.w && hh == img.h, "header says %dx%d, decoded %dx%d", hw, hh, img.w, img.h);

  uint64_t h = fuzz_hash(data, size);
  Rng rng = rng_make(h);
  for (int train = 0; train < 2; train++) {
    Image work = image_crop(&img, 0, 0, img.h, img.w);
    Target t = {0};
    for (int i = 0; i < (int)(h % 5); i++) {  // boxes partly outside, degenerate, huge
      float b[4] = {(float)((int64_t)rng_next_below(&rng, (uint64_t)img.w * 2) - img.w / 2),
                    (float)((int64_t)rng_next_below(&rng, (uint64_t)img.h * 2) - img.h / 2), 0, 0};
      b[2] = b[0] + (float)rng_next_below(&rng, (uint64_t)img.w + 1);
      b[3] = b[1] + (i == 4 ? 1e20f : (float)rng_next_below(&rng, (uint64_t)img.h + 1));
      target_push(&t, b, i);
    }
    AugConfig cfg = aug_config_scaled(train, 48 + (int)(h >> 8) % 17, 96);
    aug_apply(&work, &t, &cfg, &rng);
    FUZZ_ASSERT(work.w >= 1 && work.h >= 1 && work.data, "augmented to %dx%d", work.w, work.h);
    float out[4 * 5];
    target_to_cxcywh_normalized(&t, work.w, work.h, out);
    for (int i = 0; i < 4 * t.n; i++) FUZZ_ASSERT(!isnan(out[i]), "box value %d is NaN", i);
    target_free(&t);
    image_free(&work);
  }
  image_free(&img);
  return 0;
}
