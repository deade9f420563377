// Copies of the shape ops, mirroring kernels/cpu/shape.c: permute (explicit transposed copies),
// axis-range copies (concat, slice) and row gathers (index_select) with their accumulating
// backwards. Index math from kernels/shape_math.h. Every output element has one writer; the
// scatter-add of index_select's backward runs as a gather over the inverse index (no atomics).
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/shape_math.h"

// y [numel] (+)= x permuted: thread per output element, writes coalesced.
__global__ void permute_kernel(const float *x, float *y, PermuteGeom g, bool accumulate) {
  GRID_STRIDE_LOOP(i, g.numel) {
    float v = x[permute_src_offset(&g, g.ndim, i)];
    if (accumulate) y[i] += v;
    else y[i] = v;
  }
}

extern "C" void cuda_permute(const float *x, float *y, int ndim, const int64_t *in_shape, const int *perm,
                             bool accumulate) {
  DETR_CHECK(ndim >= 0 && ndim <= DETR_MAX_DIMS, "cuda_permute: rank %d", ndim);
  for (int d = 0; d < ndim; d++)
    DETR_CHECK(perm[d] >= 0 && perm[d] < ndim, "cuda_permute: perm[%d] = %d for rank %d", d, perm[d], ndim);
  PermuteGeom g = permute_geometry(ndim, in_shape, perm);  // host arrays -> by value
  if (g.numel <= 0) return;
  permute_kernel<<<detr_grid_size(g.numel, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(x, y, g, accumulate);
  CUDA_CHECK_LAUNCH("permute_kernel");
}

// dst viewed as [outer, dst_axis, inner] gets the block [outer, len, inner] of src viewed as
// [outer, src_axis, inner]: element k of the block, total = outer * len * inner.
__global__ void copy_axis_range_kernel(const float *src, float *dst, int64_t total, int64_t src_axis, int64_t dst_axis,
                                       int64_t inner, int64_t src_start, int64_t dst_start, int64_t len,
                                       bool accumulate) {
  GRID_STRIDE_LOOP(k, total) {
    float v = src[axis_range_offset(k, len, inner, src_axis, src_start)];
    float *d = dst + axis_range_offset(k, len, inner, dst_axis, dst_start);
    if (accumulate) *d += v;
    else *d = v;
  }
}

extern "C" void cuda_copy_axis_range(const float *src, float *dst, int64_t outer, int64_t src_axis, int64_t dst_axis,
                                     int64_t inner, int64_t src_start, int64_t dst_start, int64_t len,
                                     bool accumulate) {
  DETR_CHECK(src_start >= 0 && src_start + len <= src_axis && dst_start >= 0 && dst_start + len <= dst_axis,
             "cuda_copy_axis_range: range [%lld, +%lld) -> [%lld, +%lld) outside axes %lld, %lld", (long long)src_start,
             (long long)len, (long long)dst_start, (long long)len, (long long)src_axis, (long long)dst_axis);
  int64_t total = outer * len * inner;
  if (total <= 0) return;
  copy_axis_range_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(
      src, dst, total, src_axis, dst_axis, inner, src_start, dst_start, len, accumulate);
  CUDA_CHECK_LAUNCH("copy_axis_range_kernel");
}

// y [n, row] = x [rows, row] at rows idx[0..n) (device indices, checked on the host by the op).
__global__ void index_select_kernel(const float *x, const int64_t *idx, float *y, int64_t total, int64_t row) {
  GRID_STRIDE_LOOP(e, total) y[e] = x[idx[e / row] * row + e % row];
}

extern "C" void cuda_index_select(const float *x, const int64_t *idx, float *y, int64_t n, int64_t row) {
  int64_t total = n * row;
  if (total <= 0) return;
  index_select_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(x, idx, y, total, row);
  CUDA_CHECK_LAUNCH("index_select_kernel");
}

// dx [rows, row]: element (r, j) += dy[i, j] for every i with idx[i] == r, i.e. the positions
// offsets[r] .. offsets[r+1]-1 of `positions` (increasing i): the order of the CPU's serial
// scatter, so the result is the CPU's bit for bit. A row no index picks is left untouched.
__global__ void index_add_kernel(const float *dy, const int64_t *offsets, const int64_t *positions, float *dx,
                                 int64_t total, int64_t row) {
  GRID_STRIDE_LOOP(e, total) {
    int64_t r = e / row, j = e % row, begin = offsets[r], end = offsets[r + 1];
    if (begin == end) continue;
    float acc = dx[e];
    for (int64_t p = begin; p < end; p++) acc += dy[positions[p] * row + j];
    dx[e] = acc;
  }
}

extern "C" void cuda_index_add(const float *dy, const int64_t *offsets, const int64_t *positions, float *dx,
                               int64_t rows, int64_t row) {
  int64_t total = rows * row;
  if (total <= 0) return;
  index_add_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(dy, offsets, positions, dx,
                                                                                             total, row);
  CUDA_CHECK_LAUNCH("index_add_kernel");
}
