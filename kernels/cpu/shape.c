#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/shape_math.h"

// A permutation that keeps dims [0, k) and swaps the groups [k, m) and [m, ndim) is a batch of
// 2-D transposes x [A, P, Q] -> y [A, Q, P] (nchw -> nhwc: A = B, P = C, Q = H*W). Returns false
// for any other permutation. Found by the images' permute into the channels-last backbone, where
// the general loop below (an index split per row of y, and rows of 3 floats) took 3% of the main
// job's training time (perf).
static bool permute_as_transpose(int ndim, const int64_t *in_shape, const int *perm, int64_t *a, int64_t *p,
                                 int64_t *q) {
  int k = 0;
  while (k < ndim && perm[k] == k) k++;
  if (k >= ndim - 1) return false;  // the identity
  int m = perm[k];                  // y's dim k is x's dim m: [m, ndim) comes first, then [k, m)
  for (int d = 0; d < ndim - k; d++)
    if (perm[k + d] != (d < ndim - m ? m + d : k + d - (ndim - m))) return false;
  *a = *p = *q = 1;
  for (int d = 0; d < ndim; d++) *(d < k ? a : d < m ? p : q) *= in_shape[d];
  return true;
}

void cpu_permute(const float *x, float *y, int ndim, const int64_t *in_shape, const int *perm, bool accumulate) {
  int64_t A, P, Q;
  if (permute_as_transpose(ndim, in_shape, perm, &A, &P, &Q) && P < 64) {
    // Few rows to transpose (the images' 3 channels): y's rows of P floats written in order, each
    // of x's P rows read in order. Blocks of Q split between threads.
    enum { QB = 256 };
    int64_t blocks = (Q + QB - 1) / QB;
#pragma omp parallel for schedule(static) if (A * P * Q > PARALLEL_MIN_LIGHT)
    for (int64_t ab = 0; ab < A * blocks; ab++) {
      int64_t a = ab / blocks, q0 = ab % blocks * QB, q1 = q0 + QB < Q ? q0 + QB : Q;
      const float *xa = x + a * P * Q;
      float *ya = y + a * P * Q;
      for (int64_t q = q0; q < q1; q++)
        for (int64_t j = 0; j < P; j++) ya[q * P + j] = accumulate ? ya[q * P + j] + xa[j * Q + q] : xa[j * Q + q];
    }
    return;
  }
  PermuteGeom g = permute_geometry(ndim, in_shape, perm);
  // Output rows of the last dim are contiguous: split the index once per row.
  int64_t last = ndim ? g.out_shape[ndim - 1] : 1, last_stride = ndim ? g.src_stride[ndim - 1] : 1;
  int64_t rows = last ? g.numel / last : 0;
#pragma omp parallel for schedule(static) if (g.numel > PARALLEL_MIN_LIGHT)
  for (int64_t r = 0; r < rows; r++) {
    int64_t off = permute_src_offset(&g, ndim - 1, r);
    float *yr = y + r * last;
    if (accumulate)
      for (int64_t j = 0; j < last; j++) yr[j] += x[off + j * last_stride];
    else
      for (int64_t j = 0; j < last; j++) yr[j] = x[off + j * last_stride];
  }
}

void cpu_copy_axis_range(const float *src, float *dst, int64_t outer, int64_t src_axis, int64_t dst_axis, int64_t inner,
                         int64_t src_start, int64_t dst_start, int64_t len, bool accumulate) {
  int64_t chunk = len * inner;
#pragma omp parallel for schedule(static) if (outer * chunk > PARALLEL_MIN_LIGHT)
  for (int64_t o = 0; o < outer; o++) {
    const float *s = src + (o * src_axis + src_start) * inner;
    float *d = dst + (o * dst_axis + dst_start) * inner;
    if (accumulate)
      for (int64_t i = 0; i < chunk; i++) d[i] += s[i];
    else memcpy(d, s, (size_t)chunk * sizeof(float));
  }
}

void cpu_index_select(const float *x, const int64_t *idx, float *y, int64_t n, int64_t row) {
#pragma omp parallel for schedule(static) if (n * row > PARALLEL_MIN_LIGHT)
  for (int64_t i = 0; i < n; i++) memcpy(y + i * row, x + idx[i] * row, (size_t)row * sizeof(float));
}

void cpu_index_add(const float *dy, const int64_t *idx, float *dx, int64_t n, int64_t row) {
  // Serial: an index may repeat, and a fixed order keeps the sum deterministic.
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < row; j++) dx[idx[i] * row + j] += dy[i * row + j];
}
