// Index math of the copying shape ops (permute, axis-range copies of concat/slice), shared by the
// CPU kernels (kernels/cpu/shape.c) and the CUDA kernels (kernels/cuda/shape.cu).
#pragma once
#include "kernels/common.h"

// y = x permuted: y's dim d is x's dim perm[d]. Passed by value to kernels.
typedef struct {
  int ndim;
  int64_t numel;
  int64_t out_shape[DETR_MAX_DIMS];   // y's shape
  int64_t src_stride[DETR_MAX_DIMS];  // x's element stride walked by y's dim d
} PermuteGeom;

DETR_HD PermuteGeom permute_geometry(int ndim, const int64_t *in_shape, const int *perm) {
  PermuteGeom g;
  int64_t in_stride[DETR_MAX_DIMS], n = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    in_stride[d] = n;
    n *= in_shape[d];
  }
  g.ndim = ndim;
  g.numel = n;
  for (int d = 0; d < ndim; d++) {
    g.out_shape[d] = in_shape[perm[d]];
    g.src_stride[d] = in_stride[perm[d]];
  }
  return g;
}

// Offset in x of element `index` of y, summed over y's dims [0, ndim_used) (innermost excluded
// when ndim_used = ndim - 1 and index is a row of y's last dim).
DETR_HD int64_t permute_src_offset(const PermuteGeom *g, int ndim_used, int64_t index) {
  int64_t off = 0;
  for (int d = ndim_used - 1; d >= 0; d--) {
    off += (index % g->out_shape[d]) * g->src_stride[d];
    index /= g->out_shape[d];
  }
  return off;
}

// concat / slice: element k of the copied block [outer, len, inner] sits at this offset of a
// tensor viewed as [outer, axis, inner] whose copied range starts at `start` along axis.
DETR_HD int64_t axis_range_offset(int64_t k, int64_t len, int64_t inner, int64_t axis, int64_t start) {
  int64_t chunk = len * inner, o = k / chunk, rem = k % chunk;
  return (o * axis + start) * inner + rem;
}
