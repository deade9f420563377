#include "datasets/transforms.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const int detr_scales[] = {480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800};
static const int detr_crop_resize_scales[] = {400, 500, 600};

static AugConfig make_config(bool train, double factor, int max_size) {
  AugConfig c = {.train = train,
                 .flip_prob = 0.5f,
                 .resize_only_prob = 0.5f,
                 .max_size = max_size,
                 .mean = {0.485f, 0.456f, 0.406f},
                 .std = {0.229f, 0.224f, 0.225f}};
  c.n_scales = (int)(sizeof detr_scales / sizeof detr_scales[0]);
  for (int i = 0; i < c.n_scales; i++) c.scales[i] = (int)lround(detr_scales[i] * factor);
  c.n_crop_resize_scales = (int)(sizeof detr_crop_resize_scales / sizeof detr_crop_resize_scales[0]);
  for (int i = 0; i < c.n_crop_resize_scales; i++)
    c.crop_resize_scales[i] = (int)lround(detr_crop_resize_scales[i] * factor);
  c.crop_min = (int)lround(384 * factor);
  c.crop_max = (int)lround(600 * factor);
  c.val_size = (int)lround(800 * factor);
  return c;
}

AugConfig aug_config_detr(bool train) { return make_config(train, 1.0, 1333); }

AugConfig aug_config_scaled(bool train, int val_size, int max_size) {
  DETR_CHECK(val_size > 0, "aug_config_scaled: val_size %d", val_size);
  return make_config(train, val_size / 800.0, max_size);
}

int aug_config_validate(const AugConfig *c, DataError *err) {
  if (c->n_scales < 1 || c->n_scales > AUG_MAX_SCALES)
    return data_error(err, "augmentation: %d scales (1..%d)", c->n_scales, AUG_MAX_SCALES);
  if (c->n_crop_resize_scales < 1 || c->n_crop_resize_scales > AUG_MAX_SCALES)
    return data_error(err, "augmentation: %d crop resize scales (1..%d)", c->n_crop_resize_scales, AUG_MAX_SCALES);
  for (int i = 0; i < c->n_scales; i++)
    if (c->scales[i] < 1) return data_error(err, "augmentation: scale %d is %d", i, c->scales[i]);
  for (int i = 0; i < c->n_crop_resize_scales; i++)
    if (c->crop_resize_scales[i] < 1)
      return data_error(err, "augmentation: crop resize scale %d is %d", i, c->crop_resize_scales[i]);
  if (c->crop_min < 1 || c->crop_max < c->crop_min)
    return data_error(err, "augmentation: crop size range [%d, %d]", c->crop_min, c->crop_max);
  if (c->val_size < 1) return data_error(err, "augmentation: val size %d", c->val_size);
  if (!(c->flip_prob >= 0 && c->flip_prob <= 1) || !(c->resize_only_prob >= 0 && c->resize_only_prob <= 1))
    return data_error(err, "augmentation: probabilities %g, %g outside [0, 1]", c->flip_prob, c->resize_only_prob);
  for (int ch = 0; ch < 3; ch++)
    if (!(c->std[ch] > 0)) return data_error(err, "augmentation: std[%d] = %g", ch, c->std[ch]);
  return DATA_OK;
}

// --- targets -----------------------------------------------------------------------------------

void target_clear(Target *t) { t->n = 0; }

void target_push(Target *t, const float box[4], int64_t label) {
  if (t->n + 1 > t->cap) {
    int64_t cap = t->cap;
    data_reserve((void **)&t->boxes, &cap, t->n + 1, 4 * sizeof(float), "target boxes");
    t->labels = detr_realloc(t->labels, (size_t)cap * sizeof(int64_t), "target labels");
    t->cap = cap;
  }
  memcpy(t->boxes + (size_t)t->n * 4, box, 4 * sizeof(float));
  t->labels[t->n++] = label;
}

void target_free(Target *t) {
  free(t->boxes);
  free(t->labels);
  *t = (Target){0};
}

// --- the reference's box arithmetic ------------------------------------------------------------

void aug_resize_size(int w, int h, int size, int max_size, bool transformers, int *out_w, int *out_h) {
  double raw = size;  // the shorter side before rounding (transformers' raw_size)
  if (max_size > 0) {
    double min_original = w < h ? w : h, max_original = w < h ? h : w;
    // Python's round() rounds halves to even, as nearbyint does in the default rounding mode.
    if (max_original / min_original * size > max_size) {
      raw = max_size * min_original / max_original;
      size = (int)nearbyint(raw);
    }
  }
  if (size < 1) size = 1;
  if (!transformers) raw = size;
  if ((w <= h && w == size) || (h <= w && h == size)) {
    *out_w = w;
    *out_h = h;
  } else if (w < h) {
    *out_w = size;
    *out_h = (int)(raw * h / w);  // int(size * h / w): truncation, in Python's order of operations
  } else {
    *out_h = size;
    *out_w = (int)(raw * w / h);
  }
  if (*out_w < 1) *out_w = 1;
  if (*out_h < 1) *out_h = 1;
  // Without max_size (the resize before the random crop) a thin image, say 1 x 2000, would grow
  // past the largest image side (400 x 800000); its longer side stops at the limit instead.
  if (*out_h > IMAGE_MAX_SIDE) {
    *out_w = (int)((int64_t)*out_w * IMAGE_MAX_SIDE / *out_h);
    *out_h = IMAGE_MAX_SIDE;
  } else if (*out_w > IMAGE_MAX_SIDE) {
    *out_h = (int)((int64_t)*out_h * IMAGE_MAX_SIDE / *out_w);
    *out_w = IMAGE_MAX_SIDE;
  }
  if (*out_w < 1) *out_w = 1;
  if (*out_h < 1) *out_h = 1;
}

void target_hflip(Target *t, int image_w) {
  // boxes[:, [2, 1, 0, 3]] * [-1, 1, -1, 1] + [w, 0, w, 0]
  float w = (float)image_w;
  for (int i = 0; i < t->n; i++) {
    float *b = t->boxes + (size_t)i * 4;
    float x0 = b[0], x1 = b[2];
    b[0] = -x1 + w;
    b[2] = -x0 + w;
  }
}

void target_resize(Target *t, int w, int h, int new_w, int new_h) {
  // Ratios are Python floats (double) turned into a float32 tensor before multiplying.
  float rw = (float)((double)new_w / (double)w), rh = (float)((double)new_h / (double)h);
  for (int i = 0; i < t->n; i++) {
    float *b = t->boxes + (size_t)i * 4;
    b[0] *= rw;
    b[1] *= rh;
    b[2] *= rw;
    b[3] *= rh;
  }
}

void target_crop(Target *t, int top, int left, int ch, int cw) {
  int kept = 0;
  float fw = (float)cw, fh = (float)ch, fx = (float)left, fy = (float)top;
  for (int i = 0; i < t->n; i++) {
    const float *b = t->boxes + (size_t)i * 4;
    float x0 = b[0] - fx, y0 = b[1] - fy, x1 = b[2] - fx, y1 = b[3] - fy;
    // min(., [w, h]) then clamp(min=0)
    x0 = fmaxf(fminf(x0, fw), 0.0f);
    x1 = fmaxf(fminf(x1, fw), 0.0f);
    y0 = fmaxf(fminf(y0, fh), 0.0f);
    y1 = fmaxf(fminf(y1, fh), 0.0f);
    if (!(x1 > x0 && y1 > y0)) continue;  // empty after the crop
    float *o = t->boxes + (size_t)kept * 4;
    o[0] = x0;
    o[1] = y0;
    o[2] = x1;
    o[3] = y1;
    t->labels[kept++] = t->labels[i];
  }
  t->n = kept;
}

// --- the transforms ----------------------------------------------------------------------------

static void resize_both(Image *img, Target *t, int size, int max_size, bool transformers) {
  int nw, nh;
  aug_resize_size(img->w, img->h, size, max_size, transformers, &nw, &nh);
  if (nw == img->w && nh == img->h) return;
  Image out = image_resize_bilinear(img, nw, nh);
  target_resize(t, img->w, img->h, nw, nh);
  image_free(img);
  *img = out;
}

// random.randint(lo, hi): inclusive bounds.
static int randint(Rng *rng, int lo, int hi) { return lo + (int)rng_next_below(rng, (uint64_t)(hi - lo + 1)); }

static void random_size_crop(Image *img, Target *t, int min_size, int max_size, Rng *rng) {
  // The reference assumes the image is at least min_size on each side (its preceding resize makes
  // the shorter side >= 400 > 384); with other settings the lower bound shrinks to the image.
  int wmax = img->w < max_size ? img->w : max_size, hmax = img->h < max_size ? img->h : max_size;
  int cw = randint(rng, min_size < wmax ? min_size : wmax, wmax);
  int ch = randint(rng, min_size < hmax ? min_size : hmax, hmax);
  // T.RandomCrop.get_params
  int top = 0, left = 0;
  if (!(ch == img->h && cw == img->w)) {
    top = randint(rng, 0, img->h - ch);
    left = randint(rng, 0, img->w - cw);
  }
  Image out = image_crop(img, top, left, ch, cw);
  target_crop(t, top, left, ch, cw);
  image_free(img);
  *img = out;
}

void aug_apply(Image *img, Target *t, const AugConfig *cfg, Rng *rng) {
  if (!cfg->train) {
    resize_both(img, t, cfg->val_size, cfg->max_size, cfg->resize_transformers);
    return;
  }
  if (rng_next_uniform(rng) < cfg->flip_prob) {
    image_hflip(img);
    target_hflip(t, img->w);
  }
  if (rng_next_uniform(rng) < cfg->resize_only_prob) {
    resize_both(img, t, cfg->scales[rng_next_below(rng, (uint64_t)cfg->n_scales)], cfg->max_size,
                cfg->resize_transformers);
  } else {
    resize_both(img, t, cfg->crop_resize_scales[rng_next_below(rng, (uint64_t)cfg->n_crop_resize_scales)], 0,
                cfg->resize_transformers);
    random_size_crop(img, t, cfg->crop_min, cfg->crop_max, rng);
    resize_both(img, t, cfg->scales[rng_next_below(rng, (uint64_t)cfg->n_scales)], cfg->max_size,
                cfg->resize_transformers);
  }
}

void target_to_cxcywh_normalized(const Target *t, int image_w, int image_h, float *out) {
  float w = (float)image_w, h = (float)image_h;
  for (int i = 0; i < t->n; i++) {
    const float *b = t->boxes + (size_t)i * 4;
    float *o = out + (size_t)i * 4;
    o[0] = (b[0] + b[2]) / 2 / w;
    o[1] = (b[1] + b[3]) / 2 / h;
    o[2] = (b[2] - b[0]) / w;
    o[3] = (b[3] - b[1]) / h;
  }
}

void aug_normalize_lut(const AugConfig *cfg, float lut[3][256]) {
  for (int c = 0; c < 3; c++)
    for (int v = 0; v < 256; v++) lut[c][v] = ((float)v / 255.0f - cfg->mean[c]) / cfg->std[c];
}

void pad_normalize_row(const uint8_t *rgb, int64_t w, int64_t W, const float lut[3][256], float *out, uint8_t *mask) {
  for (int64_t x = 0; x < w; x++, rgb += 3, out += 3)
    out[0] = lut[0][rgb[0]], out[1] = lut[1][rgb[1]], out[2] = lut[2][rgb[2]];
  memset(out, 0, (size_t)((W - w) * 3) * sizeof(float));
  memset(mask, 0, (size_t)w);
  memset(mask + w, 1, (size_t)(W - w));
}
