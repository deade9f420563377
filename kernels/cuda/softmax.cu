// Softmax / log-softmax over the last axis (with an additive mask) and layer norm, mirroring
// kernels/cpu/softmax.c: one block per row, row statistics summed in double by a fixed tree
// (block_reduce, cuda_util.cuh), element math from kernels/norm_math.h. No atomics anywhere, so
// every result is the same on every run; the column sums of layer norm's dw, db are tiled like
// the bias gradient of linear layers (kernels/cuda/matmul.cu).
#include <math.h>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/norm_math.h"

// Threads per row. Rows are 8 (tiny) to a few thousand (attention keys) long: thread t handles
// elements t, t + ROW_BLOCK, ...
#define ROW_BLOCK 128

// x, y [rows, n]; mask [rows / rows_per_mask, n] or NULL. y holds v = x + mask until the last pass;
// each thread reads back only the elements it wrote.
__global__ void softmax_forward_kernel(const float *x, const float *mask, float *y, int64_t rows, int64_t n,
                                       int64_t rows_per_mask, bool log) {
  BLOCK_STRIDE_LOOP(r, rows) {
    const float *xr = x + r * n;
    const float *mr = mask ? mask + (r / rows_per_mask) * n : NULL;
    float *yr = y + r * n;
    float max = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += ROW_BLOCK) {
      float v = softmax_input(xr[j], mr, j);
      yr[j] = v;
      if (v > max) max = v;
    }
    max = block_max<ROW_BLOCK>(max);
    if (max == -INFINITY) {  // every entry masked (uniform across the block): no distribution
      for (int64_t j = threadIdx.x; j < n; j += ROW_BLOCK) yr[j] = log ? -INFINITY : 0.0f;
      continue;
    }
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += ROW_BLOCK) sum += softmax_exp(yr[j], max);
    sum = block_sum<ROW_BLOCK>(sum);
    if (log) {
      float lse = log_sum_exp(max, sum);
      for (int64_t j = threadIdx.x; j < n; j += ROW_BLOCK) yr[j] -= lse;
    } else {
      float inv = softmax_inv_sum(sum);
      for (int64_t j = threadIdx.x; j < n; j += ROW_BLOCK) yr[j] = softmax_elem(yr[j], max, inv);
    }
  }
}

extern "C" void cuda_softmax_forward(const float *x, const float *mask, float *y, int64_t rows, int64_t n,
                                     int64_t rows_per_mask, bool log) {
  if (rows <= 0 || n <= 0) return;
  DETR_CHECK(rows_per_mask > 0, "cuda_softmax_forward: rows_per_mask %lld", (long long)rows_per_mask);
  softmax_forward_kernel<<<detr_block_grid(rows), ROW_BLOCK, 0, detr_cuda_stream()>>>(x, mask, y, rows, n,
                                                                                      rows_per_mask, log);
  CUDA_CHECK_LAUNCH("softmax_forward_kernel");
}

// y, dy, dx [rows, n]: dx += softmax'(y) dy per row (reads only the output y).
__global__ void softmax_backward_kernel(const float *y, const float *dy, float *dx, int64_t rows, int64_t n, bool log) {
  BLOCK_STRIDE_LOOP(r, rows) {
    const float *yr = y + r * n, *dyr = dy + r * n;
    float *dxr = dx + r * n;
    double acc = 0.0;
    if (log) {
      int live = 0;  // a fully masked row (all -inf) passes no gradient
      for (int64_t j = threadIdx.x; j < n; j += ROW_BLOCK) {
        acc += dyr[j];
        live |= yr[j] != -INFINITY;
      }
      acc = block_sum<ROW_BLOCK>(acc);
      live = block_reduce<ROW_BLOCK>(live, OrOp());
      if (!live) continue;  // uniform across the block
      for (int64_t j = threadIdx.x; j < n; j += ROW_BLOCK)
        dxr[j] += log_softmax_backward_elem(yr[j], dyr[j], (float)acc);
    } else {
      for (int64_t j = threadIdx.x; j < n; j += ROW_BLOCK) acc += (double)dyr[j] * yr[j];
      acc = block_sum<ROW_BLOCK>(acc);
      for (int64_t j = threadIdx.x; j < n; j += ROW_BLOCK) dxr[j] += softmax_backward_elem(yr[j], dyr[j], (float)acc);
    }
  }
}

extern "C" void cuda_softmax_backward(const float *y, const float *dy, float *dx, int64_t rows, int64_t n, bool log) {
  if (rows <= 0 || n <= 0) return;
  softmax_backward_kernel<<<detr_block_grid(rows), ROW_BLOCK, 0, detr_cuda_stream()>>>(y, dy, dx, rows, n, log);
  CUDA_CHECK_LAUNCH("softmax_backward_kernel");
}

// --- layer norm over the last axis ---

// x, y [rows, n]; w, b [n] or NULL; mean, rstd [rows]. Two passes over the row, as the CPU: the
// mean, then the sum of squared deviations from it (both in double).
__global__ void layernorm_forward_kernel(const float *x, const float *w, const float *b, float *y, float *mean,
                                         float *rstd, int64_t rows, int64_t n, float eps) {
  BLOCK_STRIDE_LOOP(r, rows) {
    const float *xr = x + r * n;
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += ROW_BLOCK) s += xr[j];
    double mu = block_sum<ROW_BLOCK>(s) / (double)n;
    double ss = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += ROW_BLOCK) ss += (xr[j] - mu) * (xr[j] - mu);
    ss = block_sum<ROW_BLOCK>(ss);
    float m = (float)mu, rs = layernorm_rstd(ss, n, eps);
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
    for (int64_t j = threadIdx.x; j < n; j += ROW_BLOCK)
      y[r * n + j] = layernorm_elem(xr[j], m, rs, w ? w[j] : 1.0f, b ? b[j] : 0.0f);
  }
}

extern "C" void cuda_layernorm_forward(const float *x, const float *w, const float *b, float *y, float *mean,
                                       float *rstd, int64_t rows, int64_t n, float eps) {
  if (rows <= 0 || n <= 0) return;
  layernorm_forward_kernel<<<detr_block_grid(rows), ROW_BLOCK, 0, detr_cuda_stream()>>>(x, w, b, y, mean, rstd, rows, n,
                                                                                        eps);
  CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
}

// dx [rows, n] += rstd (g - mean(g) - xhat mean(g xhat)), g = dy * w, per row.
__global__ void layernorm_backward_dx_kernel(const float *x, const float *w, const float *mean, const float *rstd,
                                             const float *dy, float *dx, int64_t rows, int64_t n) {
  BLOCK_STRIDE_LOOP(r, rows) {
    const float *xr = x + r * n, *dyr = dy + r * n;
    double sg = 0.0, sgx = 0.0;
    for (int64_t j = threadIdx.x; j < n; j += ROW_BLOCK) {
      float g = dyr[j] * (w ? w[j] : 1.0f);
      float xhat = layernorm_xhat(xr[j], mean[r], rstd[r]);
      sg += g;
      sgx += (double)g * xhat;
    }
    sg = block_sum<ROW_BLOCK>(sg);
    sgx = block_sum<ROW_BLOCK>(sgx);
    float mg = (float)(sg / n), mgx = (float)(sgx / n);
    for (int64_t j = threadIdx.x; j < n; j += ROW_BLOCK) {
      float g = dyr[j] * (w ? w[j] : 1.0f);
      float xhat = layernorm_xhat(xr[j], mean[r], rstd[r]);
      dx[r * n + j] += layernorm_backward_elem(g, xhat, rstd[r], mg, mgx);
    }
  }
}

// dw, db [n] += column sums over rows of dy * xhat and dy: a block owns LN_TILE_X adjacent columns;
// thread (tx, ty) sums rows ty, ty + LN_TILE_Y, ... of column tx (coalesced along a row), then
// thread ty == 0 adds the LN_TILE_Y partials in order. dw or db may be NULL.
#define LN_TILE_X 32
#define LN_TILE_Y 8

__global__ void layernorm_backward_dwdb_kernel(const float *x, const float *mean, const float *rstd, const float *dy,
                                               float *dw, float *db, int64_t rows, int64_t n) {
  __shared__ double pw[LN_TILE_Y][LN_TILE_X], pb[LN_TILE_Y][LN_TILE_X];
  for (int64_t col0 = (int64_t)blockIdx.x * LN_TILE_X; col0 < n; col0 += (int64_t)gridDim.x * LN_TILE_X) {
    int64_t j = col0 + threadIdx.x;
    double aw = 0.0, ab = 0.0;
    if (j < n)
      for (int64_t r = threadIdx.y; r < rows; r += LN_TILE_Y) {
        float d = dy[r * n + j];
        aw += (double)d * layernorm_xhat(x[r * n + j], mean[r], rstd[r]);
        ab += d;
      }
    pw[threadIdx.y][threadIdx.x] = aw;
    pb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
      double sw = 0.0, sb = 0.0;
      for (int t = 0; t < LN_TILE_Y; t++) {
        sw += pw[t][threadIdx.x];
        sb += pb[t][threadIdx.x];
      }
      if (dw) dw[j] += (float)sw;
      if (db) db[j] += (float)sb;
    }
    __syncthreads();  // the partials are reused by the next column tile
  }
}

extern "C" void cuda_layernorm_backward(const float *x, const float *w, const float *mean, const float *rstd,
                                        const float *dy, float *dx, float *dw, float *db, int64_t rows, int64_t n) {
  if (rows <= 0 || n <= 0) return;
  cudaStream_t stream = detr_cuda_stream();
  if (dx) {
    layernorm_backward_dx_kernel<<<detr_block_grid(rows), ROW_BLOCK, 0, stream>>>(x, w, mean, rstd, dy, dx, rows, n);
    CUDA_CHECK_LAUNCH("layernorm_backward_dx_kernel");
  }
  if (dw || db) {
    int64_t tiles = (n + LN_TILE_X - 1) / LN_TILE_X;
    layernorm_backward_dwdb_kernel<<<detr_block_grid(tiles), dim3(LN_TILE_X, LN_TILE_Y), 0, stream>>>(x, mean, rstd, dy,
                                                                                                      dw, db, rows, n);
    CUDA_CHECK_LAUNCH("layernorm_backward_dwdb_kernel");
  }
}

// op_cluster_argmax in three gather passes (no atomics): each pixel's winner, each query's count
// (a loop over the pixels in order), each weight.
__global__ void cluster_winner_kernel(const float *x, const float *mask, float *winners, int64_t n, int64_t q,
                                      int64_t l, int64_t rows_per_mask) {
  GRID_STRIDE_LOOP(i, n * l) {
    int64_t r = i / l, j = i % l;
    winners[i] = (float)cluster_winner(x + r * q * l, q, l, j, mask ? mask + (r / rows_per_mask) * l : NULL);
  }
}

__global__ void cluster_count_kernel(const float *winners, float *counts, int64_t n, int64_t q, int64_t l) {
  GRID_STRIDE_LOOP(i, n * q) {
    int64_t r = i / q, k = i % q;
    float c = 0.0f;
    for (int64_t j = 0; j < l; j++) c += winners[r * l + j] == (float)k ? 1.0f : 0.0f;
    counts[i] = c;
  }
}

__global__ void cluster_weight_kernel(const float *winners, const float *counts, float *y, int64_t n, int64_t q,
                                      int64_t l, bool mean) {
  GRID_STRIDE_LOOP(i, n * q * l) {
    int64_t j = i % l, rk = i / l, r = rk / q, k = rk % q;
    y[i] = cluster_weight(winners[r * l + j], k, counts[rk], mean);
  }
}

extern "C" void cuda_cluster_argmax(const float *x, const float *mask, float *y, float *winners, float *counts,
                                    int64_t n, int64_t q, int64_t l, int64_t rows_per_mask, bool mean) {
  if (n <= 0 || q <= 0 || l <= 0) return;
  DETR_CHECK(rows_per_mask > 0, "cuda_cluster_argmax: rows_per_mask %lld", (long long)rows_per_mask);
  cudaStream_t s = detr_cuda_stream();
  cluster_winner_kernel<<<detr_grid_size(n * l, DETR_BLOCK), DETR_BLOCK, 0, s>>>(x, mask, winners, n, q, l,
                                                                                 rows_per_mask);
  CUDA_CHECK_LAUNCH("cluster_winner_kernel");
  cluster_count_kernel<<<detr_grid_size(n * q, DETR_BLOCK), DETR_BLOCK, 0, s>>>(winners, counts, n, q, l);
  CUDA_CHECK_LAUNCH("cluster_count_kernel");
  cluster_weight_kernel<<<detr_grid_size(n * q * l, DETR_BLOCK), DETR_BLOCK, 0, s>>>(winners, counts, y, n, q, l, mean);
  CUDA_CHECK_LAUNCH("cluster_weight_kernel");
}
