// ENACT's clustering on CUDA with Algorithm 1's geometry: a 2-D grid, x over regions, y over
// feature dimensions; each thread loops over its region's rows. The arithmetic is
// kernels/enact_math.h, shared with the CPU kernel (kernels/cpu/enact.c). Gradients accumulate;
// dH is summed over features by one thread per region in a fixed order (no atomics), so the
// backward is deterministic. Also the Gaussian smoothing of the entropy map (op_enact_smooth).
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/enact_math.h"
#include "kernels/exp_math.h"  // the softmaxes' exponential, as the CPU twin

// Threads per block: 32 regions x 8 features (d = 256 -> 32 blocks along y).
#define ENACT_BLOCK_X 32
#define ENACT_BLOCK_Y 8

// K, V [M, d]; H [M]; signs [M] or NULL; regions starts/lengths [cap], *count of them real; Kc, Vc
// [cap, d], zero from row *count on. The grid covers cap: the count stays on the device.
__global__ void enact_cluster_forward_kernel(const float *K, const float *V, const float *H, const float *signs,
                                             const int64_t *starts, const int64_t *lengths, const int64_t *count,
                                             int64_t cap, int64_t d, float *Kc, float *Vc) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t c = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
  if (j >= cap || c >= d) return;
  if (j >= *count) {
    Kc[j * d + c] = Vc[j * d + c] = 0.0f;
    return;
  }
  float max, sum;
  enact_region_softmax(H, starts[j], lengths[j], &max, &sum);
  Kc[j * d + c] = enact_cluster_elem(K, H, signs, starts[j], lengths[j], d, c, max, sum);
  Vc[j * d + c] = enact_cluster_elem(V, H, signs, starts[j], lengths[j], d, c, max, sum);
}

// dK, dV: thread (j, c) owns column c of region j's rows: no two threads write one element.
__global__ void enact_cluster_backward_kv_kernel(const float *H, const float *signs, const int64_t *starts,
                                                 const int64_t *lengths, const int64_t *count, int64_t cap, int64_t d,
                                                 const float *dKc, const float *dVc, float *dK, float *dV) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t c = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
  if (j >= cap || j >= *count || c >= d) return;
  float max, sum;
  enact_region_softmax(H, starts[j], lengths[j], &max, &sum);
  for (int64_t i = starts[j]; i < starts[j] + lengths[j]; i++) {
    float ws = enact_weight(H[i], max, sum) * enact_sign(signs, i);
    if (dK) dK[i * d + c] += ws * dKc[j * d + c];
    if (dV) dV[i * d + c] += ws * dVc[j * d + c];
  }
}

// dH: one thread per region sums over features in order.
__global__ void enact_cluster_backward_h_kernel(const float *K, const float *V, const float *H, const float *signs,
                                                const int64_t *starts, const int64_t *lengths, const int64_t *count,
                                                int64_t cap, int64_t d, const float *Kc, const float *Vc,
                                                const float *dKc, const float *dVc, float *dH) {
  int64_t L = *count < cap ? *count : cap;
  GRID_STRIDE_LOOP(j, L) {
    float max, sum;
    enact_region_softmax(H, starts[j], lengths[j], &max, &sum);
    for (int64_t i = starts[j]; i < starts[j] + lengths[j]; i++) {
      float w = enact_weight(H[i], max, sum), s = enact_sign(signs, i), dh = 0.0f;
      for (int64_t c = 0; c < d; c++) {
        dh += enact_dh_term(w, s, K[i * d + c], Kc[j * d + c], dKc[j * d + c]);
        dh += enact_dh_term(w, s, V[i * d + c], Vc[j * d + c], dVc[j * d + c]);
      }
      dH[i] += dh;
    }
  }
}

static dim3 region_grid(int64_t L, int64_t d) {
  DETR_CHECK(L <= (int64_t)65535 * 65535 && (d + ENACT_BLOCK_Y - 1) / ENACT_BLOCK_Y <= 65535,
             "cuda_enact_cluster: %lld regions x %lld features exceed the grid", (long long)L, (long long)d);
  return dim3((unsigned)((L + ENACT_BLOCK_X - 1) / ENACT_BLOCK_X), (unsigned)((d + ENACT_BLOCK_Y - 1) / ENACT_BLOCK_Y));
}

extern "C" void cuda_enact_cluster_forward(const float *K, const float *V, const float *H, const float *signs,
                                           const int64_t *starts, const int64_t *lengths, const int64_t *count,
                                           int64_t cap, int64_t d, float *Kc, float *Vc) {
  if (cap == 0 || d == 0) return;
  enact_cluster_forward_kernel<<<region_grid(cap, d), dim3(ENACT_BLOCK_X, ENACT_BLOCK_Y), 0, detr_cuda_stream()>>>(
      K, V, H, signs, starts, lengths, count, cap, d, Kc, Vc);
  CUDA_CHECK_LAUNCH("enact_cluster_forward_kernel");
}

extern "C" void cuda_enact_cluster_backward(const float *K, const float *V, const float *H, const float *signs,
                                            const int64_t *starts, const int64_t *lengths, const int64_t *count,
                                            int64_t cap, int64_t d, const float *Kc, const float *Vc, const float *dKc,
                                            const float *dVc, float *dK, float *dV, float *dH) {
  if (cap == 0 || d == 0) return;
  if (dK || dV) {
    enact_cluster_backward_kv_kernel<<<region_grid(cap, d), dim3(ENACT_BLOCK_X, ENACT_BLOCK_Y), 0,
                                       detr_cuda_stream()>>>(H, signs, starts, lengths, count, cap, d, dKc, dVc, dK,
                                                             dV);
    CUDA_CHECK_LAUNCH("enact_cluster_backward_kv_kernel");
  }
  if (dH) {
    LAUNCH_GRID_STRIDE(enact_cluster_backward_h_kernel, cap, K, V, H, signs, starts, lengths, count, cap, d, Kc, Vc,
                       dKc, dVc, dH);
  }
}

// --- Gaussian smoothing of the entropy map (op_enact_smooth), kernels/cpu/enact.c's twin ---
//
// x, y, tmp [B, N = Hp*Wp]; image b's valid region is its top-left valid_h[b] x valid_w[b] pixels
// (device arrays, checked by the op); taps [2r+1] on the device. Each pass is one thread per pixel
// of the padded batch (pixels outside the valid region do nothing), one writer per element.

// 2-D, one pass per launch over the valid pixels (yy, xx). First (COLS false): tmp[b, yy*w + xx] =
// the row filter of x (tmp is packed w wide, as the CPU); second (COLS true): y[b, yy*Wp + xx] +=
// the column filter of tmp.
template <bool COLS>
__global__ void enact_smooth_2d_kernel(const float *in, float *out, int64_t B, int64_t Hp, int64_t Wp,
                                       const int64_t *valid_h, const int64_t *valid_w, const float *taps, int64_t r) {
  int64_t N = Hp * Wp, total = B * N;
  GRID_STRIDE_LOOP(e, total) {
    int64_t b = e / N, yy = (e % N) / Wp, xx = e % Wp, h = valid_h[b], w = valid_w[b];
    if (yy >= h || xx >= w) continue;
    if (COLS) out[e] += enact_smooth_at(in + b * N + xx, w, h, yy, taps, r);
    else out[b * N + yy * w + xx] = enact_smooth_at(in + b * N + yy * Wp, 1, w, xx, taps, r);
  }
}

// 1-D, first pass: tmp[b, i] = x at valid pixel i (row-major over the valid region), i < h*w.
__global__ void enact_smooth_gather_kernel(const float *x, float *tmp, int64_t B, int64_t N, int64_t Wp,
                                           const int64_t *valid_h, const int64_t *valid_w) {
  int64_t total = B * N;
  GRID_STRIDE_LOOP(e, total) {
    int64_t b = e / N, i = e % N, w = valid_w[b];
    if (i >= valid_h[b] * w) continue;
    tmp[e] = x[b * N + enact_valid_offset(i, w, Wp)];
  }
}

// 1-D, second pass: y at valid pixel i += the filter along the sequence tmp[b, 0 .. h*w).
__global__ void enact_smooth_seq_kernel(const float *tmp, float *y, int64_t B, int64_t N, int64_t Wp,
                                        const int64_t *valid_h, const int64_t *valid_w, const float *taps, int64_t r) {
  int64_t total = B * N;
  GRID_STRIDE_LOOP(e, total) {
    int64_t b = e / N, i = e % N, w = valid_w[b], n = valid_h[b] * w;
    if (i >= n) continue;
    y[b * N + enact_valid_offset(i, w, Wp)] += enact_smooth_at(tmp + b * N, 1, n, i, taps, r);
  }
}

extern "C" void cuda_enact_smooth(const float *x, float *y, int64_t B, int64_t Hp, int64_t Wp, const int64_t *valid_h,
                                  const int64_t *valid_w, const float *taps, int64_t ntaps, bool two_d, float *tmp) {
  DETR_CHECK(ntaps % 2 == 1, "cuda_enact_smooth: %lld taps, expected an odd count", (long long)ntaps);
  int64_t N = Hp * Wp, total = B * N, r = ntaps / 2;
  if (total <= 0) return;
  if (two_d) {
    LAUNCH_GRID_STRIDE(enact_smooth_2d_kernel<false>, total, x, tmp, B, Hp, Wp, valid_h, valid_w, taps, r);
    LAUNCH_GRID_STRIDE(enact_smooth_2d_kernel<true>, total, tmp, y, B, Hp, Wp, valid_h, valid_w, taps, r);
  } else {
    LAUNCH_GRID_STRIDE(enact_smooth_gather_kernel, total, x, tmp, B, N, Wp, valid_h, valid_w);
    LAUNCH_GRID_STRIDE(enact_smooth_seq_kernel, total, tmp, y, B, N, Wp, valid_h, valid_w, taps, r);
  }
}

// --- the regions on the device (kernels/cpu/enact.c's twins, the same enact_math.h steps): the
// signs, one region-start flag per pixel, cub's inclusive scan of the flags (scan.cu), the scatter. Nothing
// comes back to the host: the kernels after read the count from image_offset[B]. ---

__global__ void enact_signs_kernel(const float *hsm, float *signs, int64_t B, int64_t Hp, int64_t Wp,
                                   const int64_t *valid_h, const int64_t *valid_w, bool one_d) {
  int64_t N = Hp * Wp;
  GRID_STRIDE_LOOP(e, B * N) {
    int64_t b = e / N, y = (e % N) / Wp, x = e % Wp, h = valid_h[b], w = valid_w[b];
    signs[e] = y < h && x < w ? enact_curvature_sign_at(hsm + b * N, Wp, h, w, y, x, one_d) : 0.0f;
  }
}

extern "C" void cuda_enact_signs(const float *hsm, float *signs, int64_t B, int64_t Hp, int64_t Wp,
                                 const int64_t *valid_h, const int64_t *valid_w, bool one_d) {
  if (B * Hp * Wp == 0) return;
  LAUNCH_GRID_STRIDE(enact_signs_kernel, B * Hp * Wp, hsm, signs, B, Hp, Wp, valid_h, valid_w, one_d);
}

__global__ void enact_region_flags_kernel(const float *signs, int64_t M, int64_t N, int64_t *flags) {
  GRID_STRIDE_LOOP(i, M) flags[i] = enact_region_flag(signs, i, N);
}

__global__ void enact_region_scatter_kernel(const float *signs, const int64_t *scan, int64_t M, int64_t N,
                                            int64_t *starts, int64_t *ends) {
  GRID_STRIDE_LOOP(i, M) enact_region_scatter(signs, scan, i, N, M, starts, ends);
}

__global__ void enact_image_offset_kernel(const int64_t *scan, int64_t B, int64_t N, int64_t *image_offset) {
  GRID_STRIDE_LOOP(b, B + 1) image_offset[b] = enact_image_offset(scan, b, N);
}

// ends -> lengths for the regions below the count.
__global__ void enact_region_lengths_kernel(const int64_t *starts, const int64_t *count, int64_t cap,
                                            int64_t *lengths) {
  GRID_STRIDE_LOOP(r, cap) if (r < *count) lengths[r] -= starts[r];
}

// The workspace: flags [M], scan [M] int64, then the scan's storage (256-byte aligned).
static size_t flags_bytes(int64_t M) { return ((size_t)(2 * M) * sizeof(int64_t) + 255) / 256 * 256; }

extern "C" size_t cuda_enact_regions_workspace(int64_t M) { return flags_bytes(M) + cuda_inclusive_scan_i64_bytes(M); }

extern "C" void cuda_enact_regions(const float *signs, int64_t B, int64_t N, int64_t *starts, int64_t *lengths,
                                   int64_t *image_offset, void *workspace) {
  int64_t M = B * N;
  if (M == 0) return;
  int64_t *flags = (int64_t *)workspace, *scan = flags + M;
  LAUNCH_GRID_STRIDE(enact_region_flags_kernel, M, signs, M, N, flags);
  cuda_inclusive_scan_i64(flags, scan, M, (char *)workspace + flags_bytes(M), cuda_inclusive_scan_i64_bytes(M));
  LAUNCH_GRID_STRIDE(enact_region_scatter_kernel, M, signs, scan, M, N, starts, lengths);
  LAUNCH_GRID_STRIDE(enact_image_offset_kernel, B + 1, scan, B, N, image_offset);
  LAUNCH_GRID_STRIDE(enact_region_lengths_kernel, M, starts, image_offset + B, M, lengths);
}

// The authors' chunks: each image's run count (one thread an image: N is a few thousand), the
// cluster size from them (one thread, the host's order of the sum), then the chunks.
__global__ void enact_official_runs_kernel(const float *hsm, int64_t B, int64_t N, int64_t *runs) {
  GRID_STRIDE_LOOP(b, B) runs[b] = enact_official_runs(hsm + b * N, N);
}

__global__ void enact_official_size_kernel(const int64_t *runs, int64_t B, int64_t N, int64_t *cluster_size,
                                           double *mean_length) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *cluster_size = enact_official_size(runs, B, N, mean_length);
}

__global__ void enact_official_chunks_kernel(const int64_t *cluster_size, int64_t B, int64_t N, int64_t *starts,
                                             int64_t *lengths, int64_t *image_offset) {
  int64_t c = *cluster_size, L = N / c;
  GRID_STRIDE_LOOP(e, B * N + 1) {  // + 1: the B + 1 offsets even where N is 1
    int64_t b = e / N, j = e % N;
    if (e < B * N && j < L) {
      starts[b * L + j] = enact_official_chunk_start(b, j, N, c);
      lengths[b * L + j] = c;
    }
    if (e <= B) image_offset[e] = e * L;
  }
}

extern "C" void cuda_enact_official_regions(const float *hsm, int64_t B, int64_t N, int64_t *starts, int64_t *lengths,
                                            int64_t *image_offset, int64_t *cluster_size, double *mean_length,
                                            int64_t *workspace) {
  if (B * N == 0) return;
  LAUNCH_GRID_STRIDE(enact_official_runs_kernel, B, hsm, B, N, workspace);
  enact_official_size_kernel<<<1, 1, 0, detr_cuda_stream()>>>(workspace, B, N, cluster_size, mean_length);
  CUDA_CHECK_LAUNCH("enact_official_size_kernel");
  LAUNCH_GRID_STRIDE(enact_official_chunks_kernel, B * N + 1, cluster_size, B, N, starts, lengths, image_offset);
}

// --- the clustered attention: each query row of image b over image b's clusters, whose range is
// read from image_offset on the device (no padding to the longest image, no host copy). One thread
// per (query, head) keeps its query row and output in registers; a block's queries share one image
// and head, so the clusters pass through shared memory a tile at a time. Softmax online (running
// max and normaliser); the backward recomputes P = exp(s - lse). No atomics: dq by the query's
// thread, dk and dv by one thread per (cluster, head) over its image's queries. ---

#define CLUSTER_ATTN_QUERIES 64  // threads (queries) per block
#define CLUSTER_ATTN_TILE 32     // clusters per shared-memory tile

// Rows are held W wide (W >= hd, a compile-time width so that the rows stay in registers: loops
// over a run-time hd would put them in local memory); features hd..W-1 are zero.

// Rows [row0, row0 + count) of a and b [*, D], head h's hd features, into shared memory (zero-padded
// to W): a tile of clusters (k, v) or of queries (q, dO).
template <int W>
__device__ void load_rows_tile(const float *a, const float *b, int64_t row0, int64_t count, int64_t D, int64_t h,
                               int64_t hd, float (*as)[W], float (*bs)[W]) {
  for (int64_t e = threadIdx.x; e < count * W; e += blockDim.x) {
    int64_t r = e / W, c = e % W, at = (row0 + r) * D + h * hd + c;
    as[r][c] = c < hd ? a[at] : 0.0f;
    bs[r][c] = c < hd ? b[at] : 0.0f;
  }
}

template <int W>
__global__ void cluster_attention_forward_kernel(const float *q, const float *k, const float *v,
                                                 const int64_t *image_offset, int64_t N, int64_t heads, int64_t hd,
                                                 float scale, float out_scale, float drop, uint64_t seed,
                                                 uint64_t offset, float *o, float *lse) {
  __shared__ float ks[CLUSTER_ATTN_TILE][W], vs[CLUSTER_ATTN_TILE][W];
  int64_t b = blockIdx.z, h = blockIdx.y, n = (int64_t)blockIdx.x * CLUSTER_ATTN_QUERIES + threadIdx.x;
  int64_t D = heads * hd, first = image_offset[b], L = image_offset[b + 1] - first, row = (b * N + n) * D + h * hd;
  bool active = n < N;
  float qr[W], acc[W], m = -INFINITY, l = 0.0f;
#pragma unroll
  for (int c = 0; c < W; c++) {
    qr[c] = active && c < hd ? q[row + c] : 0.0f;
    acc[c] = 0.0f;
  }
  for (int64_t t0 = 0; t0 < L; t0 += CLUSTER_ATTN_TILE) {
    int64_t count = L - t0 < CLUSTER_ATTN_TILE ? L - t0 : CLUSTER_ATTN_TILE;
    load_rows_tile<W>(k, v, first + t0, count, D, h, hd, ks, vs);
    __syncthreads();
    if (active)
      for (int64_t j = 0; j < count; j++) {
        float s = 0.0f;
#pragma unroll
        for (int c = 0; c < W; c++) s += qr[c] * ks[j][c];
        s *= scale;
        if (s > m) {  // a new maximum: rescale what was summed under the old one
          float corr = exp_poly(m - s);
          l *= corr;
#pragma unroll
          for (int c = 0; c < W; c++) acc[c] *= corr;
          m = s;
        }
        float p = exp_poly(s - m),
              pk = p * cluster_attention_keep(drop, seed, offset, (b * heads + h) * N + n, N, t0 + j);
        l += p;  // the normaliser of the weights before dropout
#pragma unroll
        for (int c = 0; c < W; c++) acc[c] += pk * vs[j][c];
      }
    __syncthreads();
  }
  if (!active) return;
  lse[(b * heads + h) * N + n] = L > 0 ? m + logf(l) : -INFINITY;
  float f = L > 0 ? out_scale / l : 0.0f;
#pragma unroll
  for (int c = 0; c < W; c++)
    if (c < hd) o[row + c] = acc[c] * f;
}

// dq, and D = dO . O per (query, head) into dsum [B, heads, N] for the dk/dv kernel.
template <int W>
__global__ void cluster_attention_dq_kernel(const float *q, const float *k, const float *v, const int64_t *image_offset,
                                            int64_t N, int64_t heads, int64_t hd, float scale, float out_scale,
                                            float drop, uint64_t seed, uint64_t offset, const float *o,
                                            const float *lse, const float *dout, float *dq, float *dsum) {
  __shared__ float ks[CLUSTER_ATTN_TILE][W], vs[CLUSTER_ATTN_TILE][W];
  int64_t b = blockIdx.z, h = blockIdx.y, n = (int64_t)blockIdx.x * CLUSTER_ATTN_QUERIES + threadIdx.x;
  int64_t D = heads * hd, first = image_offset[b], L = image_offset[b + 1] - first, row = (b * N + n) * D + h * hd;
  bool active = n < N;
  float qr[W], dor[W], dqr[W], dd = 0.0f;
#pragma unroll
  for (int c = 0; c < W; c++) {
    qr[c] = active && c < hd ? q[row + c] : 0.0f;
    dor[c] = active && c < hd ? dout[row + c] : 0.0f;
    dd += active && c < hd ? dor[c] * o[row + c] : 0.0f;
    dqr[c] = 0.0f;
  }
  float ln = active ? lse[(b * heads + h) * N + n] : 0.0f;
  if (active) dsum[(b * heads + h) * N + n] = dd;
  for (int64_t t0 = 0; t0 < L; t0 += CLUSTER_ATTN_TILE) {
    int64_t count = L - t0 < CLUSTER_ATTN_TILE ? L - t0 : CLUSTER_ATTN_TILE;
    load_rows_tile<W>(k, v, first + t0, count, D, h, hd, ks, vs);
    __syncthreads();
    if (active)
      for (int64_t j = 0; j < count; j++) {
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int c = 0; c < W; c++) {
          s += qr[c] * ks[j][c];
          dp += dor[c] * vs[j][c];
        }
        float keep = cluster_attention_keep(drop, seed, offset, (b * heads + h) * N + n, N, t0 + j);
        float p = exp_poly(s * scale - ln), ds = p * (dp * out_scale * keep - dd);
#pragma unroll
        for (int c = 0; c < W; c++) dqr[c] += ds * ks[j][c];
      }
    __syncthreads();
  }
  if (!active || !dq) return;
#pragma unroll
  for (int c = 0; c < W; c++)
    if (c < hd) dq[row + c] += scale * dqr[c];
}

// dk, dv: one thread per (cluster, head) over its image's N queries, in order. A block's clusters
// are one image's (grid as the forward's, x over an image's clusters, at most N), so the queries'
// rows, dO, lse and D pass through shared memory a tile at a time, as the clusters do above.
// (W = 64 spills: four rows of 64 do not fit the registers; DETR's heads are 32 wide.)
template <int W>
__global__ void cluster_attention_dkv_kernel(const float *q, const float *k, const float *v,
                                             const int64_t *image_offset, int64_t N, int64_t heads, int64_t hd,
                                             float scale, float out_scale, float drop, uint64_t seed, uint64_t offset,
                                             const float *lse, const float *dsum, const float *dout, float *dk,
                                             float *dv) {
  __shared__ float qs[CLUSTER_ATTN_TILE][W], dos[CLUSTER_ATTN_TILE][W], ls[CLUSTER_ATTN_TILE], dds[CLUSTER_ATTN_TILE];
  int64_t b = blockIdx.z, h = blockIdx.y, D = heads * hd, first = image_offset[b], L = image_offset[b + 1] - first;
  int64_t local = (int64_t)blockIdx.x * CLUSTER_ATTN_QUERIES + threadIdx.x, j = first + local;  // the cluster
  if ((int64_t)blockIdx.x * CLUSTER_ATTN_QUERIES >= L) return;  // the whole block is past the image's clusters
  bool active = local < L;
  float kr[W], vr[W], dkr[W], dvr[W];
#pragma unroll
  for (int c = 0; c < W; c++) {
    kr[c] = active && c < hd ? k[j * D + h * hd + c] : 0.0f;
    vr[c] = active && c < hd ? v[j * D + h * hd + c] : 0.0f;
    dkr[c] = dvr[c] = 0.0f;
  }
  int64_t rows = (b * heads + h) * N;  // this image's and head's rows of lse and dsum
  for (int64_t n0 = 0; n0 < N; n0 += CLUSTER_ATTN_TILE) {
    int64_t count = N - n0 < CLUSTER_ATTN_TILE ? N - n0 : CLUSTER_ATTN_TILE;
    load_rows_tile<W>(q, dout, b * N + n0, count, D, h, hd, qs, dos);
    for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
      ls[e] = lse[rows + n0 + e];
      dds[e] = dsum[rows + n0 + e];
    }
    __syncthreads();
    if (active)
      for (int64_t r = 0; r < count; r++) {
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int c = 0; c < W; c++) {
          s += qs[r][c] * kr[c];
          dp += dos[r][c] * vr[c];
        }
        float keep = cluster_attention_keep(drop, seed, offset, rows + n0 + r, N, local);
        float p = exp_poly(s * scale - ls[r]), ds = p * (dp * out_scale * keep - dds[r]), pk = p * keep;
#pragma unroll
        for (int c = 0; c < W; c++) {
          dkr[c] += ds * qs[r][c];
          dvr[c] += pk * dos[r][c];
        }
      }
    __syncthreads();
  }
  if (!active) return;
#pragma unroll
  for (int c = 0; c < W; c++) {
    if (c >= hd) continue;
    if (dk) dk[j * D + h * hd + c] += scale * dkr[c];
    if (dv) dv[j * D + h * hd + c] += out_scale * dvr[c];
  }
}

// The register width for hd: the smallest of 16, 32, 64 that holds it.
#define CLUSTER_ATTN_DISPATCH(hd, launch)                                                                \
  do {                                                                                                   \
    DETR_CHECK((hd) >= 1 && (hd) <= 64, "cuda_cluster_attention: head width %lld, at most 64 supported", \
               (long long)(hd));                                                                         \
    if ((hd) <= 16) launch(16);                                                                          \
    else if ((hd) <= 32) launch(32);                                                                     \
    else launch(64);                                                                                     \
  } while (0)

static dim3 query_grid(int64_t B, int64_t N, int64_t heads) {
  DETR_CHECK(B <= 65535 && heads <= 65535, "cuda_cluster_attention: %lld images x %lld heads exceed the grid",
             (long long)B, (long long)heads);
  return dim3((unsigned)((N + CLUSTER_ATTN_QUERIES - 1) / CLUSTER_ATTN_QUERIES), (unsigned)heads, (unsigned)B);
}

extern "C" void cuda_cluster_attention_forward(const float *q, const float *k, const float *v,
                                               const int64_t *image_offset, int64_t B, int64_t N, int64_t heads,
                                               int64_t hd, float scale, float out_scale, float p, uint64_t seed,
                                               uint64_t offset, float *o, float *lse) {
  if (B * N * heads == 0) return;
  dim3 grid = query_grid(B, N, heads);
#define LAUNCH_FORWARD(W)                                                                     \
  cluster_attention_forward_kernel<W><<<grid, CLUSTER_ATTN_QUERIES, 0, detr_cuda_stream()>>>( \
      q, k, v, image_offset, N, heads, hd, scale, out_scale, p, seed, offset, o, lse)
  CLUSTER_ATTN_DISPATCH(hd, LAUNCH_FORWARD);
#undef LAUNCH_FORWARD
  CUDA_CHECK_LAUNCH("cluster_attention_forward_kernel");
}

extern "C" void cuda_cluster_attention_backward(const float *q, const float *k, const float *v,
                                                const int64_t *image_offset, int64_t B, int64_t N, int64_t heads,
                                                int64_t hd, float scale, float out_scale, float p, uint64_t seed,
                                                uint64_t offset, const float *o, const float *lse, const float *dout,
                                                float *dq, float *dk, float *dv, float *workspace) {
  if (B * N * heads == 0) return;
  dim3 grid = query_grid(B, N, heads);
#define LAUNCH_DQ(W)                                                                     \
  cluster_attention_dq_kernel<W><<<grid, CLUSTER_ATTN_QUERIES, 0, detr_cuda_stream()>>>( \
      q, k, v, image_offset, N, heads, hd, scale, out_scale, p, seed, offset, o, lse, dout, dq, workspace)
  CLUSTER_ATTN_DISPATCH(hd, LAUNCH_DQ);
#undef LAUNCH_DQ
  CUDA_CHECK_LAUNCH("cluster_attention_dq_kernel");
  if (!dk && !dv) return;
#define LAUNCH_DKV(W)                                                                     \
  cluster_attention_dkv_kernel<W><<<grid, CLUSTER_ATTN_QUERIES, 0, detr_cuda_stream()>>>( \
      q, k, v, image_offset, N, heads, hd, scale, out_scale, p, seed, offset, lse, workspace, dout, dk, dv)
  CLUSTER_ATTN_DISPATCH(hd, LAUNCH_DKV);
#undef LAUNCH_DKV
  CUDA_CHECK_LAUNCH("cluster_attention_dkv_kernel");
}
