// Element math of ENACT's clustering (the supplement's Eq. 2 and the exact form of Eq. 3),
// shared by the CPU kernel (kernels/cpu/enact.c) and the CUDA kernel (kernels/cuda/enact.cu).
//
// Region j covers rows [start, start + len) of K, V (M x d), H (M). With the region softmax
// w_i = exp(H_i - m) / sum_k exp(H_k - m) (m = the region's max of H, for stability) and the
// optional sign s_i = -Hs_i (Algorithm 1; s_i = 1 without it):
//   K'_j = sum_i w_i s_i K_i                                   (forward, Eq. 2)
//   dL/dK_i = w_i s_i dL/dK'_j                                  (Eq. 2)
//   dL/dH_i = <dL/dK'_j, w_i (s_i K_i - K'_j)> + the same for V   (exact; see docs/enact.md for the
//                                                                  erratum in the printed Eq. 3)
#pragma once
#include "kernels/common.h"
#include "kernels/elementwise_math.h"  // dropout's keep test
#include "kernels/rng_math.h"

#include <math.h>

// The region's max of H and the normaliser sum_k exp(H_k - max).
DETR_HD void enact_region_softmax(const float *H, int64_t start, int64_t len, float *max_out, float *sum_out) {
  float m = -INFINITY;
  for (int64_t i = start; i < start + len; i++) m = H[i] > m ? H[i] : m;
  float s = 0.0f;
  for (int64_t i = start; i < start + len; i++) s += expf(H[i] - m);
  *max_out = m;
  *sum_out = s;
}

DETR_HD float enact_weight(float h, float max, float sum) { return expf(h - max) / sum; }

// s_i: -Hs_i with Algorithm 1's sign factor, else 1.
DETR_HD float enact_sign(const float *signs, int64_t i) { return signs ? -signs[i] : 1.0f; }

// Feature c of the clustered row j: sum_i w_i s_i X[i, c].
DETR_HD float enact_cluster_elem(const float *X, const float *H, const float *signs, int64_t start, int64_t len,
                                 int64_t d, int64_t c, float max, float sum) {
  float acc = 0.0f;
  for (int64_t i = start; i < start + len; i++)
    acc += enact_weight(H[i], max, sum) * enact_sign(signs, i) * X[i * d + c];
  return acc;
}

// dL/dH_i's contribution of one feature c of one clustered tensor: dXc * w_i (s_i X_ic - Xc_jc).
DETR_HD float enact_dh_term(float w, float s, float x, float xc, float dxc) { return dxc * w * (s * x - xc); }

// Gaussian smoothing of the entropy map (op_enact_smooth): the centred taps[2r+1] at position pos
// of a line of len values x[0], x[stride], ..., zero outside the line, summed in tap order.
DETR_HD float enact_smooth_at(const float *x, int64_t stride, int64_t len, int64_t pos, const float *taps, int64_t r) {
  float acc = 0.0f;
  for (int64_t t = -r; t <= r; t++)
    if (pos + t >= 0 && pos + t < len) acc += taps[t + r] * x[(pos + t) * stride];
  return acc;
}

// The 1-D variant runs along an image's valid pixels in row-major order: valid pixel i of a
// width-w valid region sits at this offset of the padded Wp-wide map.
DETR_HD int64_t enact_valid_offset(int64_t i, int64_t w, int64_t Wp) { return (i / w) * Wp + i % w; }

// --- the regions, found where the map lives (no copy to the host): per pixel its curvature sign,
// then a region start flag, an inclusive scan of the flags, and the scatter below. ---

// Curvature sign of the smoothed map m (one image, padded width Wp, valid top-left h x w) at valid
// pixel (y, x): +1 where C > 0 (concave), else -1. 2-D: C = -(Sxx + Syy) * m with the second-order
// Sobel kernels (-[[2, 0, 2], [0, -8, 0], [2, 0, 2]]), zero outside the valid region, summed over the
// 3x3 window in row-major order; 1-D: C = -m[i-1] + 2 m[i] - m[i+1] along the valid row-major sequence.
DETR_HD float enact_curvature_sign_at(const float *m, int64_t Wp, int64_t h, int64_t w, int64_t y, int64_t x,
                                      bool one_d) {
  float c;
  if (one_d) {
    int64_t i = y * w + x, n = h * w;
    float prev = i > 0 ? m[enact_valid_offset(i - 1, w, Wp)] : 0.0f;
    float next = i + 1 < n ? m[enact_valid_offset(i + 1, w, Wp)] : 0.0f;
    c = -prev + 2.0f * m[y * Wp + x] - next;
  } else {
    float acc = 0.0f;
    for (int dy = -1; dy <= 1; dy++)
      for (int dx = -1; dx <= 1; dx++) {
        int64_t yy = y + dy, xx = x + dx;
        if (yy < 0 || yy >= h || xx < 0 || xx >= w) continue;
        float weight = dy != 0 && dx != 0 ? 2.0f : (dy == 0 && dx == 0 ? -8.0f : 0.0f);  // Sxx + Syy
        acc += weight * m[yy * Wp + xx];
      }
    c = -acc;
  }
  return c > 0.0f ? 1.0f : -1.0f;
}

// Whether pixel i = b*N + p of the batch's signs [B*N] (0 on padding) starts a region: a valid pixel
// at its image's first position, after padding, or after a different sign.
DETR_HD int64_t enact_region_flag(const float *signs, int64_t i, int64_t N) {
  return signs[i] != 0.0f && (i % N == 0 || signs[i - 1] != signs[i]) ? 1 : 0;
}

// The scatter: with scan[i] = the number of region starts in pixels [0, i], valid pixel i belongs to
// region scan[i] - 1. Its start writes starts[]; its last pixel writes its end (exclusive) into
// lengths[], which enact_region_length turns into the length once every start is written.
DETR_HD void enact_region_scatter(const float *signs, const int64_t *scan, int64_t i, int64_t N, int64_t M,
                                  int64_t *starts, int64_t *ends) {
  if (signs[i] == 0.0f) return;
  int64_t r = scan[i] - 1;
  if (enact_region_flag(signs, i, N)) starts[r] = i;
  if (i + 1 == M || (i + 1) % N == 0 || signs[i + 1] != signs[i]) ends[r] = i + 1;
}

// Image b's first region: the starts before its first pixel (image_offset[B] = the region count).
DETR_HD int64_t enact_image_offset(const int64_t *scan, int64_t b, int64_t N) { return b == 0 ? 0 : scan[b * N - 1]; }

// --- the authors' form (enact_official): one cluster size for the batch ---

// Image m [N]'s runs of equal (C > 0), C = -m[i-1] + 2 m[i] - m[i+1] along the whole sequence with
// zero ends (conv1d with padding 'same').
DETR_HD int64_t enact_official_runs(const float *m, int64_t N) {
  int64_t runs = 1;
  bool prev = false;
  for (int64_t i = 0; i < N; i++) {
    float c = -(i > 0 ? m[i - 1] : 0.0f) + 2.0f * m[i] - (i + 1 < N ? m[i + 1] : 0.0f);
    bool sign = c > 0.0f;
    if (i > 0 && sign != prev) runs++;
    prev = sign;
  }
  return runs;
}

// The cluster size from the images' run counts [B]: each image's mean run length N / runs in
// float32, their mean in double, rounded half to even (Python's round), at least 1.
DETR_HD int64_t enact_official_size(const int64_t *runs, int64_t B, int64_t N, double *mean_length) {
  double sum = 0.0;
  for (int64_t b = 0; b < B; b++) sum += (double)((float)N / (float)runs[b]);
  double mean = sum / (double)B;
  if (mean_length) *mean_length = mean;
  int64_t c = (int64_t)rint(mean);  // the default rounding mode: half to even
  return c < 1 ? 1 : c;
}

// Chunk j of image b for cluster size c: the sequence trimmed by (N mod c) / 2 at the start,
// L = N / c chunks of c, numbered b * L + j.
DETR_HD int64_t enact_official_chunk_start(int64_t b, int64_t j, int64_t N, int64_t c) {
  return b * N + (N % c) / 2 + j * c;
}

// --- the clustered attention (op_cluster_attention) ---

// Attention dropout's factor for query row `row` (= (b * heads + h) * N + n) and cluster k of its
// image: element row * N + k of a [B * heads * N, N] uniform draw from (seed, offset) - the dense
// attention's numbering, which an image's clusters (at most N) fit - kept as 1 / (1 - p) or dropped
// as 0, by op_dropout's test. p = 0: 1.
DETR_HD float cluster_attention_keep(float p, uint64_t seed, uint64_t offset, int64_t row, int64_t N, int64_t k) {
  if (p == 0.0f) return 1.0f;
  uint64_t i = (uint64_t)(row * N + k);
  Philox4 r = philox4x32(offset + i / 4, seed);
  return dropout_keeps(r.v[i % 4], dropout_threshold(p)) ? dropout_keep_scale(p) : 0.0f;
}
