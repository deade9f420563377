#include "datasets/crops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// The ImageNet mean colour in 8-bit: what the normalized image calls 0, used outside the image.
static const uint8_t OUTSIDE_RGB[3] = {124, 116, 104};

// Bilinear sample of img at (x, y) in pixel-centre coordinates, channel c.
static float sample(const Image *img, float x, float y, int c) {
  float fx = floorf(x), fy = floorf(y);
  int x0 = (int)fx, y0 = (int)fy;
  float ax = x - fx, ay = y - fy, acc = 0.0f;
  for (int dy = 0; dy < 2; dy++)
    for (int dx = 0; dx < 2; dx++) {
      int xx = x0 + dx, yy = y0 + dy;
      float w = (dx ? ax : 1.0f - ax) * (dy ? ay : 1.0f - ay);
      float v = (xx < 0 || yy < 0 || xx >= img->w || yy >= img->h)
                    ? (float)OUTSIDE_RGB[c]
                    : (float)img->data[((size_t)yy * (size_t)img->w + (size_t)xx) * 3 + (size_t)c];
      acc += w * v;
    }
  return acc;
}

// The square around box (x0, y0, x1, y1), resampled to side x side into dst [side, side, 3].
static void cut(const Image *img, const float *box, int side, float context, uint8_t *dst) {
  float cx = 0.5f * (box[0] + box[2]), cy = 0.5f * (box[1] + box[3]);
  float w = box[2] - box[0], h = box[3] - box[1];
  float extent = (w > h ? w : h) * (1.0f + context);
  float scale = extent / (float)side;  // source pixels per crop pixel
  for (int y = 0; y < side; y++)
    for (int x = 0; x < side; x++) {
      float sx = cx + ((float)x + 0.5f - 0.5f * (float)side) * scale - 0.5f;
      float sy = cy + ((float)y + 0.5f - 0.5f * (float)side) * scale - 0.5f;
      for (int c = 0; c < 3; c++) {
        float v = sample(img, sx, sy, c) + 0.5f;
        dst[((size_t)y * (size_t)side + (size_t)x) * 3 + (size_t)c] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
      }
    }
}

int crops_extract(const CocoDataset *ds, int side, float context, CropSet *out, DataError *err) {
  memset(out, 0, sizeof *out);
  if (side < 8 || side > 1024 || !(context >= 0.0f && context <= 4.0f))
    return data_error(err, "crops_extract: side %d must be in [8, 1024] and context %g in [0, 4]", side,
                      (double)context);
  int64_t cap = 0;
  out->side = side;
  out->num_classes = ds->num_classes;
  AugConfig norm = aug_config_scaled(false, 32, 32);  // only its mean and std are used
  aug_normalize_lut(&norm, out->lut);
  Image img = {0};
  Target t = {0};
  const size_t crop_bytes = (size_t)side * (size_t)side * 3;
  for (int64_t i = 0; i < ds->n_images; i++) {
    if (coco_load_sample(ds, i, &img, &t, err)) {
      image_free(&img);
      target_free(&t);
      crops_free(out);
      return -1;
    }
    if (out->n + t.n > cap) {
      int64_t grown = cap ? cap * 2 : 1024;
      while (grown < out->n + t.n) grown *= 2;
      out->pixels = detr_realloc(out->pixels, (size_t)grown * crop_bytes, "object crops");
      out->labels = detr_realloc(out->labels, (size_t)grown * sizeof(int64_t), "crop labels");
      cap = grown;
    }
    for (int k = 0; k < t.n; k++) {
      cut(&img, t.boxes + 4 * k, side, context, out->pixels + (size_t)out->n * crop_bytes);
      out->labels[out->n++] = t.labels[k];
    }
  }
  image_free(&img);
  target_free(&t);
  if (out->n == 0) {
    crops_free(out);
    return data_error(err, "crops_extract: %s has no non-crowd boxes to cut out", ds->ann_path);
  }
  return 0;
}

void crops_free(CropSet *c) {
  free(c->pixels);
  free(c->labels);
  memset(c, 0, sizeof *c);
}

void crops_batch(const CropSet *c, const int64_t *index, int n, int out_side, bool augment, Rng *rng, float *out) {
  const int S = c->side, room = S - out_side;  // out_side <= side (the caller checks)
  const size_t plane = (size_t)out_side * (size_t)out_side;
  for (int b = 0; b < n; b++) {
    const uint8_t *src = c->pixels + (size_t)index[b] * (size_t)S * (size_t)S * 3;
    int top = room / 2, left = room / 2;
    bool flip = false;
    if (augment) {
      top = (int)rng_next_below(rng, (uint64_t)room + 1);
      left = (int)rng_next_below(rng, (uint64_t)room + 1);
      flip = rng_next_uniform(rng) < 0.5f;
    }
    float *dst = out + (size_t)b * plane * 3;  // [out_side, out_side, 3]
    for (int y = 0; y < out_side; y++)
      for (int x = 0; x < out_side; x++, dst += 3) {
        int sx = left + (flip ? out_side - 1 - x : x);
        const uint8_t *px = src + ((size_t)(top + y) * (size_t)S + (size_t)sx) * 3;
        for (int ch = 0; ch < 3; ch++) dst[ch] = c->lut[ch][px[ch]];
      }
  }
}
