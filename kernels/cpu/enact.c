// ENACT on the CPU: the regions by the same flag, scan and scatter as the CUDA kernels, the
// clustering in parallel over regions (OpenMP) with the CUDA kernel's arithmetic
// (kernels/enact_math.h), the clustered attention on GEMMs. Gradients accumulate.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/enact_math.h"
#include "kernels/norm_math.h"  // log_sum_exp, exp_poly

void cpu_enact_cluster_forward(const float *K, const float *V, const float *H, const float *signs,
                               const int64_t *starts, const int64_t *lengths, const int64_t *count, int64_t cap,
                               int64_t d, float *Kc, float *Vc) {
  int64_t L = *count;
  memset(Kc + L * d, 0, (size_t)((cap - L) * d) * sizeof(float));  // the rows past the count
  memset(Vc + L * d, 0, (size_t)((cap - L) * d) * sizeof(float));
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
                                const int64_t *starts, const int64_t *lengths, const int64_t *count, int64_t cap,
                                int64_t d, const float *Kc, const float *Vc, const float *dKc, const float *dVc,
                                float *dK, float *dV, float *dH) {
  (void)cap;
  int64_t L = *count;
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

void cpu_enact_signs(const float *hsm, float *signs, int64_t B, int64_t Hp, int64_t Wp, const int64_t *valid_h,
                     const int64_t *valid_w, bool one_d) {
  int64_t N = Hp * Wp;
  for (int64_t e = 0; e < B * N; e++) {
    int64_t b = e / N, y = (e % N) / Wp, x = e % Wp, h = valid_h[b], w = valid_w[b];
    signs[e] = y < h && x < w ? enact_curvature_sign_at(hsm + b * N, Wp, h, w, y, x, one_d) : 0.0f;
  }
}

size_t cpu_enact_regions_workspace(int64_t M) { return (size_t)M * sizeof(int64_t); }

void cpu_enact_regions(const float *signs, int64_t B, int64_t N, int64_t *starts, int64_t *lengths,
                       int64_t *image_offset, void *workspace) {
  int64_t M = B * N, *scan = workspace;  // [M]
  int64_t total = 0;
  for (int64_t i = 0; i < M; i++) scan[i] = total += enact_region_flag(signs, i, N);
  for (int64_t i = 0; i < M; i++) enact_region_scatter(signs, scan, i, N, M, starts, lengths);
  for (int64_t b = 0; b <= B; b++) image_offset[b] = enact_image_offset(scan, b, N);
  for (int64_t r = 0; r < image_offset[B]; r++) lengths[r] -= starts[r];  // ends -> lengths
}

void cpu_enact_official_regions(const float *hsm, int64_t B, int64_t N, int64_t *starts, int64_t *lengths,
                                int64_t *image_offset, int64_t *cluster_size, double *mean_length, int64_t *workspace) {
  int64_t *runs = workspace;  // [B]
  for (int64_t b = 0; b < B; b++) runs[b] = enact_official_runs(hsm + b * N, N);
  int64_t c = enact_official_size(runs, B, N, mean_length), L = N / c;
  *cluster_size = c;
  for (int64_t b = 0; b < B; b++)
    for (int64_t j = 0; j < L; j++) starts[b * L + j] = enact_official_chunk_start(b, j, N, c), lengths[b * L + j] = c;
  for (int64_t b = 0; b <= B; b++) image_offset[b] = b * L;
}

// --- the clustered attention: per image and head, S = scale q k^T [N, L_b] on a GEMM, P = exp(S - lse)
// row by row (dropped out where cluster_attention_keep says), o = out_scale P v on another; the
// backward recomputes P from lse. ---

// Image b's scores of head h into s [N, Lb]: scale q_bh k_bh^T.
static void head_scores(const float *q, const float *k, int64_t first, int64_t Lb, int64_t b, int64_t h, int64_t N,
                        int64_t D, int64_t hd, float scale, float *s) {
  cpu_gemm(false, true, N, Lb, hd, scale, q + b * N * D + h * hd, D, k + first * D + h * hd, D, 0.0f, s, Lb);
}

static int64_t most_clusters(const int64_t *image_offset, int64_t B) {
  int64_t lmax = 0;
  for (int64_t b = 0; b < B; b++) {
    int64_t Lb = image_offset[b + 1] - image_offset[b];
    lmax = Lb > lmax ? Lb : lmax;
  }
  return lmax;
}

// y[j] = exp(x[j] - shift) for j < n (exp_poly: a loop that vectorizes).
CPU_AVX2_CLONES static void exp_shifted(const float *x, float *y, float shift, int64_t n) {
  for (int64_t j = 0; j < n; j++) y[j] = exp_poly(x[j] - shift);
}

// Row n's weights in place: scores s [Lb] -> P = exp(s - lse) (times the dropout's factor);
// returns lse = max + log(sum exp(s - max)), the sum in double as the dense softmax's.
static float row_weights(float *s, int64_t Lb, float *tmp, float p, uint64_t seed, uint64_t offset, int64_t row,
                         int64_t N) {
  float max = -INFINITY;
  for (int64_t j = 0; j < Lb; j++) max = s[j] > max ? s[j] : max;
  exp_shifted(s, tmp, max, Lb);
  double sum = 0.0;
  for (int64_t j = 0; j < Lb; j++) sum += tmp[j];
  float lse = log_sum_exp(max, sum);
  exp_shifted(s, s, lse, Lb);  // P as the backward recomputes it
  if (p > 0.0f)
    for (int64_t j = 0; j < Lb; j++) s[j] *= cluster_attention_keep(p, seed, offset, row, N, j);
  return lse;
}

void cpu_cluster_attention_forward(const float *q, const float *k, const float *v, const int64_t *image_offset,
                                   int64_t B, int64_t N, int64_t heads, int64_t hd, float scale, float out_scale,
                                   float p, uint64_t seed, uint64_t offset, float *o, float *lse) {
  int64_t D = heads * hd, lmax = most_clusters(image_offset, B);
  lmax = lmax > 0 ? lmax : 1;
  float *s = detr_malloc((size_t)((N + omp_get_max_threads()) * lmax) * sizeof(float), "cpu_cluster_attention scores");
  float *tmp = s + N * lmax;  // [threads, lmax]
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < heads; h++) {
      int64_t first = image_offset[b], Lb = image_offset[b + 1] - first, row0 = (b * heads + h) * N;
      float *l = lse + row0;
      if (Lb == 0) {  // no cluster: a zero output
        for (int64_t n = 0; n < N; n++) {
          l[n] = -INFINITY;
          memset(o + (b * N + n) * D + h * hd, 0, (size_t)hd * sizeof(float));
        }
        continue;
      }
      head_scores(q, k, first, Lb, b, h, N, D, hd, scale, s);
#pragma omp parallel for schedule(static) if (N * Lb > PARALLEL_MIN_HEAVY)
      for (int64_t n = 0; n < N; n++)
        l[n] = row_weights(s + n * Lb, Lb, tmp + omp_get_thread_num() * lmax, p, seed, offset, row0 + n, N);
      cpu_gemm(false, false, N, hd, Lb, out_scale, s, Lb, v + first * D + h * hd, D, 0.0f, o + b * N * D + h * hd, D);
    }
  free(s);
}

void cpu_cluster_attention_backward(const float *q, const float *k, const float *v, const int64_t *image_offset,
                                    int64_t B, int64_t N, int64_t heads, int64_t hd, float scale, float out_scale,
                                    float p, uint64_t seed, uint64_t offset, const float *o, const float *lse,
                                    const float *dout, float *dq, float *dk, float *dv, float *workspace) {
  int64_t D = heads * hd, lmax = most_clusters(image_offset, B);
  if (lmax == 0) return;
  float *pw = detr_malloc((size_t)(2 * N * lmax) * sizeof(float), "cpu_cluster_attention_backward scores");
  float *ds = pw + N * lmax;  // [N, Lb] each
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < heads; h++) {
      int64_t first = image_offset[b], Lb = image_offset[b + 1] - first, row0 = (b * heads + h) * N;
      if (Lb == 0) continue;
      const float *l = lse + row0, *qb = q + b * N * D + h * hd, *ob = o + b * N * D + h * hd;
      const float *dob = dout + b * N * D + h * hd, *kb = k + first * D + h * hd, *vb = v + first * D + h * hd;
      float *dsum = workspace + row0;  // D_n = dO_n . O_n = sum_j P_nj dP_nj
      head_scores(q, k, first, Lb, b, h, N, D, hd, scale, pw);
      cpu_gemm(false, true, N, Lb, hd, out_scale, dob, D, vb, D, 0.0f, ds, Lb);  // out_scale dO v^T
#pragma omp parallel for schedule(static) if (N * Lb > PARALLEL_MIN_HEAVY)
      for (int64_t n = 0; n < N; n++) {
        float acc = 0.0f;
        for (int64_t c = 0; c < hd; c++) acc += dob[n * D + c] * ob[n * D + c];
        dsum[n] = acc;
        float *pr = pw + n * Lb, *dr = ds + n * Lb;
        exp_shifted(pr, pr, l[n], Lb);  // P, as the forward computed it
        if (p == 0.0f) {
          for (int64_t j = 0; j < Lb; j++) dr[j] = pr[j] * (dr[j] - acc);  // dS = P (dP - D)
          continue;
        }
        for (int64_t j = 0; j < Lb; j++) {
          float keep = cluster_attention_keep(p, seed, offset, row0 + n, N, j);
          dr[j] = pr[j] * (dr[j] * keep - acc);  // dP through the dropout
          pr[j] *= keep;                         // the weights v was summed with
        }
      }
      if (dq) cpu_gemm(false, false, N, hd, Lb, scale, ds, Lb, kb, D, 1.0f, dq + b * N * D + h * hd, D);
      if (dk) cpu_gemm(true, false, Lb, hd, N, scale, ds, Lb, qb, D, 1.0f, dk + first * D + h * hd, D);
      if (dv) cpu_gemm(true, false, Lb, hd, N, out_scale, pw, Lb, dob, D, 1.0f, dv + first * D + h * hd, D);
    }
  free(pw);
}
