#include <math.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/norm_math.h"

// A row's sum of exponentials is a chain of double adds, each waiting on the last: SM_ROWS rows'
// chains run side by side (each row still summed in order: the same doubles), which hides that
// latency. R50's attention softmax forward (rows of 256): 30% faster (bench/README.md#bench_step).
enum { SM_ROWS = 4 };

// y[j] = softmax_exp(y[j], max) for j < n.
CPU_AVX2_CLONES static void softmax_exp_row(float *y, float max, int64_t n) {
  for (int64_t j = 0; j < n; j++) y[j] = softmax_exp(y[j], max);
}

void cpu_softmax_forward(const float *x, const float *mask, float *y, int64_t rows, int64_t n, int64_t rows_per_mask,
                         bool log) {
  int64_t groups = (rows + SM_ROWS - 1) / SM_ROWS;
#pragma omp parallel for schedule(static) if (rows * n > PARALLEL_MIN_HEAVY)
  for (int64_t gi = 0; gi < groups; gi++) {
    int64_t r0 = gi * SM_ROWS, cnt = rows - r0 < SM_ROWS ? rows - r0 : SM_ROWS;
    float *live_y[SM_ROWS], live_max[SM_ROWS];  // the rows with at least one unmasked entry
    int live = 0;
    for (int64_t r = r0; r < r0 + cnt; r++) {
      const float *xr = x + r * n;
      const float *mr = mask ? mask + (r / rows_per_mask) * n : NULL;
      float *yr = y + r * n;
      float max = -INFINITY;
      for (int64_t j = 0; j < n; j++) {
        float v = softmax_input(xr[j], mr, j);
        yr[j] = v;
        if (v > max) max = v;
      }
      if (max == -INFINITY) {  // every entry masked: no distribution; zeros, zero gradient
        for (int64_t j = 0; j < n; j++) yr[j] = log ? -INFINITY : 0.0f;
        continue;
      }
      live_y[live] = yr, live_max[live] = max, live++;
    }
    double sum[SM_ROWS] = {0};
    if (log) {
      for (int64_t j = 0; j < n; j++)
        for (int q = 0; q < live; q++) sum[q] += softmax_exp(live_y[q][j], live_max[q]);
      for (int q = 0; q < live; q++) {
        float lse = log_sum_exp(live_max[q], sum[q]);
        for (int64_t j = 0; j < n; j++) live_y[q][j] -= lse;
      }
    } else {
      // softmax_elem(v, max, inv) is softmax_exp(v, max) * inv: each exponential is kept from its
      // own pass (a loop without a dependence, which vectorizes), then summed.
      for (int q = 0; q < live; q++) softmax_exp_row(live_y[q], live_max[q], n);
      for (int64_t j = 0; j < n; j++)
        for (int q = 0; q < live; q++) sum[q] += live_y[q][j];
      for (int q = 0; q < live; q++) {
        float inv = softmax_inv_sum(sum[q]);
        for (int64_t j = 0; j < n; j++) live_y[q][j] *= inv;
      }
    }
  }
}

void cpu_softmax_backward(const float *y, const float *dy, float *dx, int64_t rows, int64_t n, bool log) {
#pragma omp parallel for schedule(static) if (rows * n > PARALLEL_MIN_HEAVY)
  for (int64_t r = 0; r < rows; r++) {
    const float *yr = y + r * n, *dyr = dy + r * n;
    float *dxr = dx + r * n;
    double acc = 0.0;
    if (log) {
      for (int64_t j = 0; j < n; j++) acc += dyr[j];
      bool live = false;  // a fully masked row (all -inf) passes no gradient
      for (int64_t j = 0; j < n && !live; j++) live = yr[j] != -INFINITY;
      if (!live) continue;
      for (int64_t j = 0; j < n; j++) dxr[j] += log_softmax_backward_elem(yr[j], dyr[j], (float)acc);
    } else {
      for (int64_t j = 0; j < n; j++) acc += (double)dyr[j] * yr[j];
      for (int64_t j = 0; j < n; j++) dxr[j] += softmax_backward_elem(yr[j], dyr[j], (float)acc);
    }
  }
}

// The sums of LN_ROWS rows side by side, each row's still in order (the same doubles as one row at
// a time): a row of 128-256 is two chains of dependent double adds, latency-bound alone. The main
// job's model: 260 -> 140 us of layer norm a forward (inference, 1 thread), 10.1 -> 6.1 ms over 20
// training steps (bench_step --profile).
enum { LN_ROWS = 4 };

// mean and sum of squared deviations of rows r0 .. r0 + cnt - 1 (cnt <= LN_ROWS) of x [., n].
static inline __attribute__((always_inline)) void layernorm_row_sums(const float *x, int64_t r0, int cnt, int64_t n,
                                                                     double *mu, double *ss) {
  double s[LN_ROWS] = {0};
  for (int64_t j = 0; j < n; j++)
    for (int q = 0; q < cnt; q++) s[q] += x[(r0 + q) * n + j];
  for (int q = 0; q < cnt; q++) mu[q] = s[q] / (double)n, ss[q] = 0.0;
  for (int64_t j = 0; j < n; j++)
    for (int q = 0; q < cnt; q++) {
      double d = x[(r0 + q) * n + j] - mu[q];
      ss[q] += d * d;
    }
}

void cpu_layernorm_forward(const float *x, const float *w, const float *b, float *y, float *mean, float *rstd,
                           int64_t rows, int64_t n, float eps) {
  int64_t groups = (rows + LN_ROWS - 1) / LN_ROWS;
#pragma omp parallel for schedule(static) if (rows * n > PARALLEL_MIN_HEAVY)
  for (int64_t gi = 0; gi < groups; gi++) {
    int64_t r0 = gi * LN_ROWS;
    int cnt = rows - r0 < LN_ROWS ? (int)(rows - r0) : LN_ROWS;
    double mu[LN_ROWS], ss[LN_ROWS];
    if (cnt == LN_ROWS)  // a literal count: the chains unrolled side by side
      layernorm_row_sums(x, r0, LN_ROWS, n, mu, ss);
    else layernorm_row_sums(x, r0, cnt, n, mu, ss);
    for (int q = 0; q < cnt; q++) {
      int64_t r = r0 + q;
      const float *xr = x + r * n;
      float m = (float)mu[q], rs = layernorm_rstd(ss[q], n, eps);
      mean[r] = m;
      rstd[r] = rs;
      for (int64_t j = 0; j < n; j++) y[r * n + j] = layernorm_elem(xr[j], m, rs, w ? w[j] : 1.0f, b ? b[j] : 0.0f);
    }
  }
}

void cpu_layernorm_backward(const float *x, const float *w, const float *mean, const float *rstd, const float *dy,
                            float *dx, float *dw, float *db, int64_t rows, int64_t n) {
  // Each row's two sums are chains of double adds, each add waiting on the last: LN_ROWS rows'
  // chains run side by side (each row still summed in order: the same doubles), hiding that
  // latency. The weight and bias gradients are column sums over the rows, each in row order, by
  // blocks of LN_COLS columns that a thread walks row by row (contiguous reads; a column at a time
  // strode over the rows). The two: the backward 15-20% faster in the main job's profile
  // (bench/README.md#bench_step). The forward's sums are grouped the same way (layernorm_row_sums).
  enum { LN_COLS = 64 };
  if (dx) {
    int64_t groups = (rows + LN_ROWS - 1) / LN_ROWS;
#pragma omp parallel for schedule(static) if (rows * n > PARALLEL_MIN_HEAVY)
    for (int64_t gi = 0; gi < groups; gi++) {
      int64_t r0 = gi * LN_ROWS, cnt = rows - r0 < LN_ROWS ? rows - r0 : LN_ROWS;
      double sg[LN_ROWS] = {0}, sgx[LN_ROWS] = {0};
      for (int64_t j = 0; j < n; j++)
        for (int64_t q = 0; q < cnt; q++) {
          int64_t r = r0 + q;
          float g = dy[r * n + j] * (w ? w[j] : 1.0f);
          float xhat = layernorm_xhat(x[r * n + j], mean[r], rstd[r]);
          sg[q] += g;
          sgx[q] += (double)g * xhat;
        }
      for (int64_t q = 0; q < cnt; q++) {
        int64_t r = r0 + q;
        const float *xr = x + r * n, *dyr = dy + r * n;
        float mg = (float)(sg[q] / n), mgx = (float)(sgx[q] / n);
        for (int64_t j = 0; j < n; j++) {
          float g = dyr[j] * (w ? w[j] : 1.0f);
          float xhat = layernorm_xhat(xr[j], mean[r], rstd[r]);
          dx[r * n + j] += layernorm_backward_elem(g, xhat, rstd[r], mg, mgx);
        }
      }
    }
  }
  if (dw || db) {  // column sums over rows in fixed order
    int64_t blocks = (n + LN_COLS - 1) / LN_COLS;
#pragma omp parallel for schedule(static) if (blocks > 1 && rows * n > PARALLEL_MIN_HEAVY)
    for (int64_t bi = 0; bi < blocks; bi++) {
      int64_t j0 = bi * LN_COLS, width = n - j0 < LN_COLS ? n - j0 : LN_COLS;
      double aw[LN_COLS] = {0}, ab[LN_COLS] = {0};
      for (int64_t r = 0; r < rows; r++) {
        const float *dyr = dy + r * n + j0, *xr = x + r * n + j0;
        for (int64_t j = 0; j < width; j++) {
          aw[j] += (double)dyr[j] * layernorm_xhat(xr[j], mean[r], rstd[r]);
          ab[j] += dyr[j];
        }
      }
      for (int64_t j = 0; j < width; j++) {
        if (dw) dw[j0 + j] += (float)aw[j];
        if (db) db[j0 + j] += (float)ab[j];
      }
    }
  }
}

void cpu_cluster_argmax(const float *x, const float *mask, float *y, float *winners, float *counts, int64_t n,
                        int64_t q, int64_t l, int64_t rows_per_mask, bool mean) {
#pragma omp parallel for schedule(static) if (n * q * l > PARALLEL_MIN_LIGHT)
  for (int64_t r = 0; r < n; r++) {
    const float *xr = x + r * q * l, *mr = mask ? mask + (r / rows_per_mask) * l : NULL;
    float *wr = winners + r * l, *cr = counts + r * q, *yr = y + r * q * l;
    for (int64_t i = 0; i < q; i++) cr[i] = 0.0f;
    for (int64_t j = 0; j < l; j++) {
      int w = cluster_winner(xr, q, l, j, mr);
      wr[j] = (float)w;
      if (w >= 0) cr[w] += 1.0f;  // exact: counts stay far below 2^24
    }
    for (int64_t i = 0; i < q; i++)
      for (int64_t j = 0; j < l; j++) yr[i * l + j] = cluster_weight(wr[j], i, cr[i], mean);
  }
}
