// DETR's losses on CUDA, mirroring kernels/cpu/loss.c: weighted cross-entropy, L1 sum, box format
// conversions and generalized IoU. Element math from kernels/loss_math.h and kernels/box_math.h.
// Scalar losses are written to device memory and their incoming gradients are read from device
// memory, so neither direction waits for the host. Sums are in double with a fixed tree order.
#include <math.h>

#include "kernels/box_math.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/loss_math.h"

#define ROW_BLOCK 128  // threads per row of logits (classes: 8 .. 92)
#define SUM_BLOCK 256  // threads of the one-block sums

// --- weighted cross-entropy ---

// logits [rows, classes] -> lse [rows]: one block per row.
__global__ void cross_entropy_lse_kernel(const float *logits, float *lse, int64_t rows, int64_t classes) {
  BLOCK_STRIDE_LOOP(r, rows) {
    const float *x = logits + r * classes;
    float max = -INFINITY;
    for (int64_t c = threadIdx.x; c < classes; c += ROW_BLOCK) max = x[c] > max ? x[c] : max;
    max = block_max<ROW_BLOCK>(max);
    double s = 0.0;
    for (int64_t c = threadIdx.x; c < classes; c += ROW_BLOCK) s += expf(x[c] - max);
    s = block_sum<ROW_BLOCK>(s);
    if (threadIdx.x == 0) lse[r] = log_sum_exp(max, s);
  }
}

// loss[0] = sum_r w_r (lse_r - x_r,t_r) / sum_r w_r: one block; targets [rows] (device, in range).
__global__ void cross_entropy_loss_kernel(const float *logits, const int64_t *targets, const float *weight,
                                          const float *lse, float *loss, int64_t rows, int64_t classes) {
  double l = 0.0, wsum = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += SUM_BLOCK) {
    float w = cross_entropy_weight(weight, targets[r]);
    l += cross_entropy_term(w, lse[r], logits[r * classes + targets[r]]);
    wsum += w;
  }
  l = block_sum<SUM_BLOCK>(l);
  wsum = block_sum<SUM_BLOCK>(wsum);
  if (threadIdx.x == 0) loss[0] = (float)(l / wsum);
}

extern "C" void cuda_cross_entropy_forward(const float *logits, const int64_t *targets, const float *weight, float *lse,
                                           float *loss, int64_t rows, int64_t classes) {
  DETR_CHECK(rows > 0 && classes > 0, "cuda_cross_entropy_forward: %lld rows of %lld classes", (long long)rows,
             (long long)classes);
  cudaStream_t stream = detr_cuda_stream();
  cross_entropy_lse_kernel<<<detr_block_grid(rows), ROW_BLOCK, 0, stream>>>(logits, lse, rows, classes);
  CUDA_CHECK_LAUNCH("cross_entropy_lse_kernel");
  cross_entropy_loss_kernel<<<1, SUM_BLOCK, 0, stream>>>(logits, targets, weight, lse, loss, rows, classes);
  CUDA_CHECK_LAUNCH("cross_entropy_loss_kernel");
}

// dlogits [rows, classes] += w_r dloss / sum(w) (softmax - onehot). Each block first sums the
// weights of all rows itself (rows is the batch's query count: a few hundred reads per block),
// which saves a launch and a scratch buffer; then one row per block.
__global__ void cross_entropy_backward_kernel(const float *logits, const int64_t *targets, const float *weight,
                                              const float *lse, const float *dloss, float *dlogits, int64_t rows,
                                              int64_t classes) {
  double wsum = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += ROW_BLOCK) wsum += cross_entropy_weight(weight, targets[r]);
  wsum = block_sum<ROW_BLOCK>(wsum);
  float scale = (float)(dloss[0] / wsum);
  BLOCK_STRIDE_LOOP(r, rows) {
    float w = cross_entropy_weight(weight, targets[r]) * scale;
    for (int64_t c = threadIdx.x; c < classes; c += ROW_BLOCK)
      dlogits[r * classes + c] += cross_entropy_backward_elem(logits[r * classes + c], lse[r], w, c == targets[r]);
  }
}

extern "C" void cuda_cross_entropy_backward(const float *logits, const int64_t *targets, const float *weight,
                                            const float *lse, const float *dloss, float *dlogits, int64_t rows,
                                            int64_t classes) {
  if (rows <= 0 || classes <= 0) return;
  cross_entropy_backward_kernel<<<detr_block_grid(rows), ROW_BLOCK, 0, detr_cuda_stream()>>>(
      logits, targets, weight, lse, dloss, dlogits, rows, classes);
  CUDA_CHECK_LAUNCH("cross_entropy_backward_kernel");
}

// --- sigmoid focal loss, summed over every logit ---

// loss[0] = sum over logits [rows, classes]: one block; targets [rows] (device, in [0, classes]).
__global__ void focal_loss_forward_kernel(const float *logits, const int64_t *targets, float *loss, int64_t rows,
                                          int64_t classes, float alpha, float gamma) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < rows * classes; i += SUM_BLOCK)
    s += focal_elem(logits[i], i % classes == targets[i / classes], alpha, gamma);
  s = block_sum<SUM_BLOCK>(s);
  if (threadIdx.x == 0) loss[0] = (float)s;
}

extern "C" void cuda_focal_loss_forward(const float *logits, const int64_t *targets, float *loss, int64_t rows,
                                        int64_t classes, float alpha, float gamma) {
  focal_loss_forward_kernel<<<1, SUM_BLOCK, 0, detr_cuda_stream()>>>(logits, targets, loss, rows, classes, alpha,
                                                                     gamma);
  CUDA_CHECK_LAUNCH("focal_loss_forward_kernel");
}

// dlogits [rows, classes] += d focal / d logit * dloss; dloss [1] on the device.
__global__ void focal_loss_backward_kernel(const float *logits, const int64_t *targets, const float *dloss,
                                           float *dlogits, int64_t rows, int64_t classes, float alpha, float gamma) {
  float g = dloss[0];
  GRID_STRIDE_LOOP(i, rows * classes) {
    dlogits[i] += focal_backward_elem(logits[i], i % classes == targets[i / classes], alpha, gamma, g);
  }
}

extern "C" void cuda_focal_loss_backward(const float *logits, const int64_t *targets, const float *dloss,
                                         float *dlogits, int64_t rows, int64_t classes, float alpha, float gamma) {
  int64_t n = rows * classes;
  if (n <= 0) return;
  LAUNCH_GRID_STRIDE(focal_loss_backward_kernel, n, logits, targets, dloss, dlogits, rows, classes, alpha, gamma);
}

// --- L1: sum |a - b| ---

// loss[0] = sum over a, b [n]: one block.
__global__ void l1_sum_forward_kernel(const float *a, const float *b, float *loss, int64_t n) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += SUM_BLOCK) s += l1_elem(a[i], b[i]);
  s = block_sum<SUM_BLOCK>(s);
  if (threadIdx.x == 0) loss[0] = (float)s;
}

extern "C" void cuda_l1_sum_forward(const float *a, const float *b, float *loss, int64_t n) {
  l1_sum_forward_kernel<<<1, SUM_BLOCK, 0, detr_cuda_stream()>>>(a, b, loss, n);  // n = 0: loss 0
  CUDA_CHECK_LAUNCH("l1_sum_forward_kernel");
}

// da [n] += sign(a - b) dloss, db [n] -= it; either may be NULL; dloss [1] on the device.
__global__ void l1_sum_backward_kernel(const float *a, const float *b, const float *dloss, float *da, float *db,
                                       int64_t n) {
  float g = dloss[0];
  GRID_STRIDE_LOOP(i, n) {
    float d = l1_backward_elem(a[i], b[i], g);
    if (da) da[i] += d;
    if (db) db[i] -= d;
  }
}

extern "C" void cuda_l1_sum_backward(const float *a, const float *b, const float *dloss, float *da, float *db,
                                     int64_t n) {
  if (n <= 0 || (!da && !db)) return;
  LAUNCH_GRID_STRIDE(l1_sum_backward_kernel, n, a, b, dloss, da, db, n);
}

// --- boxes: one thread per box of [boxes, 4] ---

__global__ void box_convert_kernel(const float *in, float *out, int64_t boxes, bool to_xyxy, bool backward) {
  GRID_STRIDE_LOOP(i, boxes) box_convert_one(in + 4 * i, out + 4 * i, to_xyxy, backward);
}

static void box_convert(const float *in, float *out, int64_t boxes, bool to_xyxy, bool backward) {
  if (boxes <= 0) return;
  LAUNCH_GRID_STRIDE(box_convert_kernel, boxes, in, out, boxes, to_xyxy, backward);
}

extern "C" void cuda_box_convert_forward(const float *in, float *out, int64_t boxes, bool to_xyxy) {
  box_convert(in, out, boxes, to_xyxy, false);
}

extern "C" void cuda_box_convert_backward(const float *dout, float *din, int64_t boxes, bool to_xyxy) {
  box_convert(dout, din, boxes, to_xyxy, true);
}

// a, b [n, 4] xyxy -> out [n].
__global__ void box_giou_forward_kernel(const float *a, const float *b, float *out, int64_t n) {
  GRID_STRIDE_LOOP(i, n) out[i] = box_giou(a + 4 * i, b + 4 * i);
}

// da, db [n, 4] += dout[i] d giou_i; a NULL gradient goes to a per-thread scratch box.
__global__ void box_giou_backward_kernel(const float *a, const float *b, const float *dout, float *da, float *db,
                                         int64_t n) {
  GRID_STRIDE_LOOP(i, n) {
    float scratch_a[4] = {0, 0, 0, 0}, scratch_b[4] = {0, 0, 0, 0};
    float *ga = da ? da + 4 * i : scratch_a, *gb = db ? db + 4 * i : scratch_b;
    box_giou_backward(a + 4 * i, b + 4 * i, dout[i], ga, gb);
  }
}

extern "C" void cuda_box_giou_forward(const float *a, const float *b, float *out, int64_t n) {
  if (n <= 0) return;
  LAUNCH_GRID_STRIDE(box_giou_forward_kernel, n, a, b, out, n);
}

extern "C" void cuda_box_giou_backward(const float *a, const float *b, const float *dout, float *da, float *db,
                                       int64_t n) {
  if (n <= 0 || (!da && !db)) return;
  LAUNCH_GRID_STRIDE(box_giou_backward_kernel, n, a, b, dout, da, db, n);
}
