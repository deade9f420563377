// ENACT's clustering on CUDA with Algorithm 1's geometry: a 2-D grid, x over regions, y over
// feature dimensions; each thread loops over its region's rows. The arithmetic is
// kernels/enact_math.h, shared with the CPU kernel (kernels/cpu/enact.c). Gradients accumulate;
// dH is summed over features by one thread per region in a fixed order (no atomics), so the
// backward is deterministic.
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
    enact_cluster_backward_kv_kernel<<<region_grid(L, d), dim3(ENACT_BLOCK_X, ENACT_BLOCK_Y), 0,
                                       detr_cuda_stream()>>>(H, signs, starts, lengths, L, d, dKc, dVc, dK, dV);
    CUDA_CHECK_LAUNCH("enact_cluster_backward_kv_kernel");
  }
  if (dH) {
    enact_cluster_backward_h_kernel<<<detr_grid_size(L, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(
        K, V, H, signs, starts, lengths, L, d, Kc, Vc, dKc, dVc, dH);
    CUDA_CHECK_LAUNCH("enact_cluster_backward_h_kernel");
  }
}
