#include "nn/position.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

void mask_downsample_nearest(const uint8_t *mask, int64_t B, int64_t H, int64_t W, int64_t h, int64_t w, uint8_t *out) {
  float sy = (float)H / (float)h, sx = (float)W / (float)w;
  for (int64_t b = 0; b < B; b++)
    for (int64_t y = 0; y < h; y++) {
      int64_t iy = (int64_t)floorf((float)y * sy);
      if (iy > H - 1) iy = H - 1;
      for (int64_t x = 0; x < w; x++) {
        int64_t ix = (int64_t)floorf((float)x * sx);
        if (ix > W - 1) ix = W - 1;
        out[(b * h + y) * w + x] = mask[(b * H + iy) * W + ix];
      }
    }
}

void position_sine(const uint8_t *mask, int64_t B, int64_t h, int64_t w, int64_t npf, float temperature, float *pos) {
  const float scale = 6.283185307179586f, eps = 1e-6f;  // 2 pi, as float32(2 * math.pi)
  float *dim_t = detr_malloc((size_t)npf * sizeof(float), "position_sine dim_t");
  float *y_embed = detr_malloc((size_t)(h * w * 2) * sizeof(float), "position_sine embed"), *x_embed = y_embed + h * w;
  float *xe_row = detr_malloc((size_t)(2 * w) * sizeof(float), "position_sine row"),
        *xe_prev = xe_row + w;  // xe of this, the previous row
  for (int64_t i = 0; i < npf; i++) dim_t[i] = powf(temperature, (float)(2 * (i / 2)) / (float)npf);
  for (int64_t b = 0; b < B; b++) {
    const uint8_t *m = mask + b * h * w;
    // Cumulative sums of not-mask down the columns (y) and along the rows (x), in float32.
    for (int64_t x = 0; x < w; x++) {
      float acc = 0.0f;
      for (int64_t y = 0; y < h; y++) y_embed[y * w + x] = (acc += m[y * w + x] ? 0.0f : 1.0f);
    }
    for (int64_t y = 0; y < h; y++) {
      float acc = 0.0f;
      for (int64_t x = 0; x < w; x++) x_embed[y * w + x] = (acc += m[y * w + x] ? 0.0f : 1.0f);
    }
    // A half's features depend on its one value (ye or xe) alone: where it equals the value at the
    // previous column (ye) or the previous row (xe) - everywhere in an unpadded image - the
    // features are copied from there instead of computed (h + w positions' sines, not h w).
    for (int64_t y = 0; y < h; y++) {
      float ye_prev = 0.0f;
      for (int64_t x = 0; x < w; x++) {
        float ye = y_embed[y * w + x] / (y_embed[(h - 1) * w + x] + eps) * scale;
        float xe = x_embed[y * w + x] / (x_embed[y * w + w - 1] + eps) * scale;
        float *p = pos + ((b * h + y) * w + x) * 2 * npf;
        xe_row[x] = xe;
        const float *prev_y = x > 0 && memcmp(&ye, &ye_prev, sizeof ye) == 0 ? p - 2 * npf : NULL;
        const float *prev_x = y > 0 && memcmp(&xe, &xe_prev[x], sizeof xe) == 0 ? p - w * 2 * npf : NULL;
        ye_prev = ye;
        if (prev_y) memcpy(p, prev_y, (size_t)npf * sizeof(float));
        else
          for (int64_t i = 0; i < npf; i++) p[i] = i % 2 == 0 ? sinf(ye / dim_t[i]) : cosf(ye / dim_t[i]);
        if (prev_x) memcpy(p + npf, prev_x + npf, (size_t)npf * sizeof(float));
        else
          for (int64_t i = 0; i < npf; i++) p[npf + i] = i % 2 == 0 ? sinf(xe / dim_t[i]) : cosf(xe / dim_t[i]);
      }
      memcpy(xe_prev, xe_row, (size_t)w * sizeof(float));
    }
  }
  free(dim_t);
  free(y_embed);
  free(xe_row);
}
