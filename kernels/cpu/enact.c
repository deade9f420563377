// ENACT's clustering on the CPU: regions in parallel (OpenMP), the same arithmetic as the CUDA
// kernel (kernels/enact_math.h). Gradients accumulate.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/enact_math.h"

void cpu_enact_cluster_forward(const float *K, const float *V, const float *H, const float *signs,
                               const int64_t *starts, const int64_t *lengths, int64_t L, int64_t d, float *Kc,
                               float *Vc) {
  // Rows outer, features inner: one weight per row, contiguous rows of K and V. Each feature still
  // sums its rows in order, as enact_cluster_elem (the CUDA kernel's form) does: the same floats.
#pragma omp parallel for schedule(static) if (L * d > PARALLEL_MIN_HEAVY)
  for (int64_t j = 0; j < L; j++) {
    float max, sum;
    enact_region_softmax(H, starts[j], lengths[j], &max, &sum);
    float *kc = Kc + j * d, *vc = Vc + j * d;
    for (int64_t c = 0; c < d; c++) kc[c] = vc[c] = 0.0f;
    for (int64_t i = starts[j]; i < starts[j] + lengths[j]; i++) {
      float ws = enact_weight(H[i], max, sum) * enact_sign(signs, i);
      const float *k = K + i * d, *v = V + i * d;
      for (int64_t c = 0; c < d; c++) {
        kc[c] += ws * k[c];
        vc[c] += ws * v[c];
      }
    }
  }
}

void cpu_enact_cluster_backward(const float *K, const float *V, const float *H, const float *signs,
                                const int64_t *starts, const int64_t *lengths, int64_t L, int64_t d, const float *Kc,
                                const float *Vc, const float *dKc, const float *dVc, float *dK, float *dV, float *dH) {
  // Regions are disjoint row ranges: parallel over regions writes disjoint rows.
#pragma omp parallel for schedule(static) if (L * d > PARALLEL_MIN_HEAVY)
  for (int64_t j = 0; j < L; j++) {
    float max, sum;
    enact_region_softmax(H, starts[j], lengths[j], &max, &sum);
    for (int64_t i = starts[j]; i < starts[j] + lengths[j]; i++) {
      float w = enact_weight(H[i], max, sum), s = enact_sign(signs, i), ws = w * s;
      float dh = 0.0f;
      if (dK)
        for (int64_t c = 0; c < d; c++) dK[i * d + c] += ws * dKc[j * d + c];
      if (dV)
        for (int64_t c = 0; c < d; c++) dV[i * d + c] += ws * dVc[j * d + c];
      for (int64_t c = 0; c < d; c++) {
        dh += enact_dh_term(w, s, K[i * d + c], Kc[j * d + c], dKc[j * d + c]);
        dh += enact_dh_term(w, s, V[i * d + c], Vc[j * d + c], dVc[j * d + c]);
      }
      if (dH) dH[i] += dh;
    }
  }
}

// One image: valid region [h, w] inside the padded [Hp, Wp] grid. tmp holds h*w floats.
static void smooth_image(const float *x, float *y, int64_t Wp, int64_t h, int64_t w, const float *taps, int64_t ntaps,
                         bool two_d, float *tmp) {
  int64_t r = ntaps / 2;
  if (two_d) {
    for (int64_t yy = 0; yy < h; yy++)  // along rows
      for (int64_t xx = 0; xx < w; xx++) tmp[yy * w + xx] = enact_smooth_at(x + yy * Wp, 1, w, xx, taps, r);
    for (int64_t yy = 0; yy < h; yy++)  // then along columns
      for (int64_t xx = 0; xx < w; xx++) y[yy * Wp + xx] += enact_smooth_at(tmp + xx, w, h, yy, taps, r);
    return;
  }
  // 1-D: the valid pixels in row-major order form one sequence of length h*w.
  int64_t n = h * w;
  for (int64_t i = 0; i < n; i++) tmp[i] = x[enact_valid_offset(i, w, Wp)];
  for (int64_t i = 0; i < n; i++) y[enact_valid_offset(i, w, Wp)] += enact_smooth_at(tmp, 1, n, i, taps, r);
}

void cpu_enact_smooth(const float *x, float *y, int64_t B, int64_t Hp, int64_t Wp, const int64_t *valid_h,
                      const int64_t *valid_w, const float *taps, int64_t ntaps, bool two_d, float *tmp) {
  int64_t N = Hp * Wp;
#pragma omp parallel for schedule(static) if (B > 1 && B * N > PARALLEL_MIN_HEAVY)
  for (int64_t b = 0; b < B; b++)
    smooth_image(x + b * N, y + b * N, Wp, valid_h[b], valid_w[b], taps, ntaps, two_d, tmp + b * N);
}
