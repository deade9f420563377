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
