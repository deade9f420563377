// ENACT's clustering on CUDA with Algorithm 1's geometry: a 2-D grid, x over regions, y over
// feature dimensions; each thread loops over its region's rows. The arithmetic is
// kernels/enact_math.h, shared with the CPU kernel (kernels/cpu/enact.c). Gradients accumulate;
// dH is summed over features by one thread per region in a fixed order (no atomics), so the
// backward is deterministic. Also the Gaussian smoothing of the entropy map (op_enact_smooth).
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/enact_math.h"

// Threads per block: 32 regions x 8 features (d = 256 -> 32 blocks along y).
#define ENACT_BLOCK_X 32
#define ENACT_BLOCK_Y 8

// K, V [M, d]; H [M]; signs [M] or NULL; regions starts/lengths [L]; Kc, Vc [L, d].
__global__ void enact_cluster_forward_kernel(const float *K, const float *V, const float *H, const float *signs,
                                             const int64_t *starts, const int64_t *lengths, int64_t L, int64_t d,
                                             float *Kc, float *Vc) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t c = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
  if (j >= L || c >= d) return;
  float max, sum;
  enact_region_softmax(H, starts[j], lengths[j], &max, &sum);
  Kc[j * d + c] = enact_cluster_elem(K, H, signs, starts[j], lengths[j], d, c, max, sum);
  Vc[j * d + c] = enact_cluster_elem(V, H, signs, starts[j], lengths[j], d, c, max, sum);
}

// dK, dV: thread (j, c) owns column c of region j's rows: no two threads write one element.
__global__ void enact_cluster_backward_kv_kernel(const float *H, const float *signs, const int64_t *starts,
                                                 const int64_t *lengths, int64_t L, int64_t d, const float *dKc,
                                                 const float *dVc, float *dK, float *dV) {
  int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t c = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
  if (j >= L || c >= d) return;
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
                                                const int64_t *starts, const int64_t *lengths, int64_t L, int64_t d,
                                                const float *Kc, const float *Vc, const float *dKc, const float *dVc,
                                                float *dH) {
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
                                           const int64_t *starts, const int64_t *lengths, int64_t L, int64_t d,
                                           float *Kc, float *Vc) {
  if (L == 0 || d == 0) return;
  enact_cluster_forward_kernel<<<region_grid(L, d), dim3(ENACT_BLOCK_X, ENACT_BLOCK_Y), 0, detr_cuda_stream()>>>(
      K, V, H, signs, starts, lengths, L, d, Kc, Vc);
  CUDA_CHECK_LAUNCH("enact_cluster_forward_kernel");
}

extern "C" void cuda_enact_cluster_backward(const float *K, const float *V, const float *H, const float *signs,
                                            const int64_t *starts, const int64_t *lengths, int64_t L, int64_t d,
                                            const float *Kc, const float *Vc, const float *dKc, const float *dVc,
                                            float *dK, float *dV, float *dH) {
  if (L == 0 || d == 0) return;
  if (dK || dV) {
    enact_cluster_backward_kv_kernel<<<region_grid(L, d), dim3(ENACT_BLOCK_X, ENACT_BLOCK_Y), 0, detr_cuda_stream()>>>(
        H, signs, starts, lengths, L, d, dKc, dVc, dK, dV);
    CUDA_CHECK_LAUNCH("enact_cluster_backward_kv_kernel");
  }
  if (dH) {
    LAUNCH_GRID_STRIDE(enact_cluster_backward_h_kernel, L, K, V, H, signs, starts, lengths, L, d, Kc, Vc, dKc, dVc, dH);
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
