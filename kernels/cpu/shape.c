#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/shape_math.h"

void cpu_permute(const float *x, float *y, int ndim, const int64_t *in_shape, const int *perm,
                 bool accumulate) {
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

void cpu_copy_axis_range(const float *src, float *dst, int64_t outer, int64_t src_axis,
                         int64_t dst_axis, int64_t inner, int64_t src_start, int64_t dst_start,
                         int64_t len, bool accumulate) {
  int64_t chunk = len * inner;
#pragma omp parallel for schedule(static) if (outer * chunk > PARALLEL_MIN_LIGHT)
  for (int64_t o = 0; o < outer; o++) {
    const float *s = src + (o * src_axis + src_start) * inner;
    float *d = dst + (o * dst_axis + dst_start) * inner;
    if (accumulate)
      for (int64_t i = 0; i < chunk; i++) d[i] += s[i];
    else
      memcpy(d, s, (size_t)chunk * sizeof(float));
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
