// Elementwise CUDA kernels: fill, random draws, accumulate, unary and broadcasting binary ops.
// The element math is kernels/elementwise_math.h and kernels/rng_math.h, shared with the CPU.
// Backward kernels accumulate (dx += ...), as their CPU twins in kernels/cpu/elementwise.c.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/rng_math.h"

// --- fill, random draws, accumulate ---

__global__ void fill_kernel(float *x, int64_t n, float value) { GRID_STRIDE_LOOP(i, n) x[i] = value; }

// __fmul_rn / __fadd_rn: never contracted into an FMA, so the result rounds as the CPU's
// `low + (high - low) * u` does and the uniform stream is bitwise the CPU's.
__global__ void uniform_kernel(float *x, int64_t n, uint64_t seed, uint64_t offset, float low, float high) {
  GRID_STRIDE_LOOP(i, n) {
    float u = rng_uniform_at(seed, offset, (uint64_t)i);
    x[i] = __fadd_rn(low, __fmul_rn(high - low, u));
  }
}

// Equal to the CPU's draw up to the ulps of the device's logf/sinf/cosf.
__global__ void normal_kernel(float *x, int64_t n, uint64_t seed, uint64_t offset, float mean, float std) {
  GRID_STRIDE_LOOP(i, n)
  x[i] = __fadd_rn(mean, __fmul_rn(std, rng_normal_at(seed, offset, (uint64_t)i)));
}

__global__ void accumulate_kernel(float *dst, const float *src, int64_t n) { GRID_STRIDE_LOOP(i, n) dst[i] += src[i]; }

extern "C" void cuda_fill(float *x, int64_t n, float value) {
  if (n <= 0) return;
  if (fill_is_zero_bits(value)) {  // +0.0 (not -0.0): all-zero bits, a memset is the fastest fill
    CUDA_CHECK(cudaMemsetAsync(x, 0, (size_t)n * sizeof(float), detr_cuda_stream()));
    return;
  }
  LAUNCH_GRID_STRIDE(fill_kernel, n, x, n, value);
}

extern "C" void cuda_uniform(float *x, int64_t n, uint64_t seed, uint64_t offset, float low, float high) {
  if (n <= 0) return;
  LAUNCH_GRID_STRIDE(uniform_kernel, n, x, n, seed, offset, low, high);
}

extern "C" void cuda_normal(float *x, int64_t n, uint64_t seed, uint64_t offset, float mean, float std) {
  if (n <= 0) return;
  LAUNCH_GRID_STRIDE(normal_kernel, n, x, n, seed, offset, mean, std);
}

extern "C" void cuda_accumulate(float *dst, const float *src, int64_t n) {
  if (n <= 0) return;
  LAUNCH_GRID_STRIDE(accumulate_kernel, n, dst, src, n);
}

// --- unary ops: y = f(x); dx += f'(x) dy ---

__global__ void unary_forward_kernel(int op, const float *x, float *y, int64_t n, float param) {
  GRID_STRIDE_LOOP(i, n) y[i] = unary_forward(op, x[i], param);
}

__global__ void unary_backward_kernel(int op, const float *x, const float *y, const float *dy, float *dx, int64_t n,
                                      float param) {
  GRID_STRIDE_LOOP(i, n) dx[i] += unary_backward(op, x[i], y[i], dy[i], param);
}

extern "C" void cuda_unary_forward(int op, const float *x, float *y, int64_t n, float param) {
  DETR_CHECK(op >= 0 && op < UNARY_COUNT, "cuda_unary_forward: unknown op %d", op);
  if (n <= 0) return;
  LAUNCH_GRID_STRIDE(unary_forward_kernel, n, op, x, y, n, param);
}

extern "C" void cuda_unary_backward(int op, const float *x, const float *y, const float *dy, float *dx, int64_t n,
                                    float param) {
  DETR_CHECK(op >= 0 && op < UNARY_COUNT, "cuda_unary_backward: unknown op %d", op);
  if (n <= 0) return;
  LAUNCH_GRID_STRIDE(unary_backward_kernel, n, op, x, y, dy, dx, n, param);
}

// --- binary ops with broadcasting ---
//
// Broadcast (elementwise_math.h) holds the output shape and each operand's strides along the
// output dims (0 where the operand is broadcast). The operands are contiguous in their own,
// unexpanded shapes, so an operand's element index equals its offset.

// Dims where an operand is broadcast: the output has size > 1 there, the operand size 1.
__host__ __device__ static inline bool is_reduced_dim(const Broadcast *bc, const int64_t *stride, int d) {
  return stride[d] == 0 && bc->shape[d] > 1;
}

// Both operands dense (same shape): no index arithmetic.
__global__ void binary_forward_dense_kernel(int op, const float *a, const float *b, float *y, int64_t n) {
  GRID_STRIDE_LOOP(i, n) y[i] = binary_forward(op, a[i], b[i]);
}

__global__ void binary_forward_kernel(int op, const float *a, const float *b, float *y, Broadcast bc, int64_t n) {
  GRID_STRIDE_LOOP(i, n) {
    int64_t oa, ob;
    broadcast_offsets(&bc, i, &oa, &ob);
    y[i] = binary_forward(op, a[oa], b[ob]);
  }
}

extern "C" void cuda_binary_forward(int op, const float *a, const float *b, float *y, Broadcast bc) {
  DETR_CHECK(op >= 0 && op < BINARY_COUNT, "cuda_binary_forward: unknown op %d", op);
  DETR_CHECK(bc.ndim >= 0 && bc.ndim <= DETR_MAX_DIMS, "cuda_binary_forward: rank %d", bc.ndim);
  int64_t n = broadcast_numel(&bc);
  if (n <= 0) return;
  unsigned int grid = detr_grid_size(n, DETR_BLOCK);
  if (broadcast_is_dense(&bc, bc.stride_a) && broadcast_is_dense(&bc, bc.stride_b)) {
    binary_forward_dense_kernel<<<grid, DETR_BLOCK, 0, detr_cuda_stream()>>>(op, a, b, y, n);
    CUDA_CHECK_LAUNCH("binary_forward_dense_kernel");
  } else {
    binary_forward_kernel<<<grid, DETR_BLOCK, 0, detr_cuda_stream()>>>(op, a, b, y, bc, n);
    CUDA_CHECK_LAUNCH("binary_forward_kernel");
  }
}

// The gradient term of output element i for operand WHICH (0: a, 1: b).
template <int WHICH>
__device__ static inline float binary_grad_term(int op, const float *a, const float *b, const float *dy,
                                                const Broadcast *bc, int64_t i) {
  int64_t oa, ob;
  broadcast_offsets(bc, i, &oa, &ob);
  return WHICH == 0 ? binary_backward_a(op, a[oa], b[ob], dy[i]) : binary_backward_b(op, a[oa], b[ob], dy[i]);
}

// Dense operand: one output element per gradient element, one writer each.
// dx [numel of the output] += term(i).
template <int WHICH>
__global__ void binary_backward_dense_kernel(int op, const float *a, const float *b, const float *dy, float *dx,
                                             Broadcast bc, int64_t n) {
  GRID_STRIDE_LOOP(i, n) dx[i] += binary_grad_term<WHICH>(op, a, b, dy, &bc, i);
}

// The output positions that reduce into operand element j: output index base(j) + roff(r) for
// r in [0, reduce_n). Kept dims (the operand's own, size > 1) fix base(j); reduced dims are walked
// row-major by r, so increasing r visits increasing output indices.
__device__ static inline int64_t reduce_base(const Broadcast *bc, const int64_t *stride, int64_t j) {
  int64_t base = 0, out_stride = 1;
  for (int d = bc->ndim - 1; d >= 0; d--) {
    if (stride[d] != 0) {
      base += (j % bc->shape[d]) * out_stride;
      j /= bc->shape[d];
    }
    out_stride *= bc->shape[d];
  }
  return base;
}

__device__ static inline int64_t reduce_offset(const Broadcast *bc, const int64_t *stride, int64_t r) {
  int64_t off = 0, out_stride = 1;
  for (int d = bc->ndim - 1; d >= 0; d--) {
    if (is_reduced_dim(bc, stride, d)) {
      off += (r % bc->shape[d]) * out_stride;
      r /= bc->shape[d];
    }
    out_stride *= bc->shape[d];
  }
  return off;
}

// Broadcast operand, few positions per element: one thread per gradient element sums its
// reduce_n terms in increasing output order - the CPU's order. __fadd_rn keeps the adds from
// fusing with the term's multiply, so the result rounds as the CPU's does.
// dx [numel_x] += sum over r of term(base(j) + roff(r)).
template <int WHICH>
__global__ void binary_backward_reduce_thread_kernel(int op, const float *a, const float *b, const float *dy, float *dx,
                                                     Broadcast bc, int64_t numel_x, int64_t reduce_n) {
  const int64_t *stride = WHICH == 0 ? bc.stride_a : bc.stride_b;
  GRID_STRIDE_LOOP(j, numel_x) {
    int64_t base = reduce_base(&bc, stride, j);
    float acc = dx[j];
    for (int64_t r = 0; r < reduce_n; r++)
      acc = __fadd_rn(acc, binary_grad_term<WHICH>(op, a, b, dy, &bc, base + reduce_offset(&bc, stride, r)));
    dx[j] = acc;
  }
}

// Broadcast operand, many positions per element: one block per gradient element. Thread t sums
// positions t, t + DETR_BLOCK, ... then a fixed shared-memory tree adds the partials. No atomics:
// the summation order depends only on the shapes, so the result is the same on every run.
template <int WHICH>
__global__ void binary_backward_reduce_block_kernel(int op, const float *a, const float *b, const float *dy, float *dx,
                                                    Broadcast bc, int64_t numel_x, int64_t reduce_n) {
  __shared__ float partial[DETR_BLOCK];  // blockDim.x == DETR_BLOCK, a power of two
  const int64_t *stride = WHICH == 0 ? bc.stride_a : bc.stride_b;
  for (int64_t j = blockIdx.x; j < numel_x; j += gridDim.x) {
    int64_t base = reduce_base(&bc, stride, j);
    float acc = 0.0f;
    for (int64_t r = threadIdx.x; r < reduce_n; r += DETR_BLOCK)
      acc += binary_grad_term<WHICH>(op, a, b, dy, &bc, base + reduce_offset(&bc, stride, r));
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int s = DETR_BLOCK / 2; s > 0; s >>= 1) {
      if ((int)threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
      __syncthreads();
    }
    if (threadIdx.x == 0) dx[j] += partial[0];
    __syncthreads();  // partial[0] is read before the next element overwrites it
  }
}

// Below this many terms per gradient element a thread sums them alone; above, a block does.
#define REDUCE_BLOCK_MIN 64

template <int WHICH>
static void binary_backward_operand(int op, const float *a, const float *b, const float *dy, float *dx,
                                    const Broadcast &bc, int64_t n) {
  const int64_t *stride = WHICH == 0 ? bc.stride_a : bc.stride_b;
  cudaStream_t stream = detr_cuda_stream();
  if (broadcast_is_dense(&bc, stride)) {
    binary_backward_dense_kernel<WHICH>
        <<<detr_grid_size(n, DETR_BLOCK), DETR_BLOCK, 0, stream>>>(op, a, b, dy, dx, bc, n);
    CUDA_CHECK_LAUNCH("binary_backward_dense_kernel");
    return;
  }
  int64_t numel_x = 1;  // elements of the unexpanded operand
  for (int d = 0; d < bc.ndim; d++)
    if (stride[d] != 0) numel_x *= bc.shape[d];
  int64_t reduce_n = n / numel_x;  // output positions per operand element
  if (reduce_n < REDUCE_BLOCK_MIN) {
    binary_backward_reduce_thread_kernel<WHICH>
        <<<detr_grid_size(numel_x, DETR_BLOCK), DETR_BLOCK, 0, stream>>>(op, a, b, dy, dx, bc, numel_x, reduce_n);
    CUDA_CHECK_LAUNCH("binary_backward_reduce_thread_kernel");
  } else {
    unsigned int grid = (unsigned int)(numel_x < 65535 ? numel_x : 65535);
    binary_backward_reduce_block_kernel<WHICH>
        <<<grid, DETR_BLOCK, 0, stream>>>(op, a, b, dy, dx, bc, numel_x, reduce_n);
    CUDA_CHECK_LAUNCH("binary_backward_reduce_block_kernel");
  }
}

extern "C" void cuda_binary_backward(int op, const float *a, const float *b, const float *dy, float *da, float *db,
                                     Broadcast bc) {
  DETR_CHECK(op >= 0 && op < BINARY_COUNT, "cuda_binary_backward: unknown op %d", op);
  DETR_CHECK(bc.ndim >= 0 && bc.ndim <= DETR_MAX_DIMS, "cuda_binary_backward: rank %d", bc.ndim);
  int64_t n = broadcast_numel(&bc);
  if (n <= 0) return;
  // Separate launches, queued in order: correct even when da == db (op(x, x)).
  if (da) binary_backward_operand<0>(op, a, b, dy, da, bc, n);
  if (db) binary_backward_operand<1>(op, a, b, dy, db, bc, n);
}

// --- dropout: the mask is regenerated from (seed, offset), never stored ---
//
// Thread q owns the group of 4 elements 4q .. 4q+3 that share Philox counter offset + q (as the
// CPU loop): one Philox evaluation per group, and the same keep decisions as the CPU bit for bit.

// fn(i, kept) for the elements i of group q (those below n), kept: dropout's decision for i.
template <typename Fn>
__device__ static inline void dropout_group(int64_t q, int64_t n, uint32_t threshold, uint64_t seed, uint64_t offset,
                                            Fn fn) {
  Philox4 r = philox4x32(offset + (uint64_t)q, seed);
  for (int k = 0; k < 4 && 4 * q + k < n; k++) fn(4 * q + k, dropout_keeps(r.v[k], threshold));
}

// x, y [n]; groups = ceil(n / 4).
__global__ void dropout_forward_kernel(const float *x, float *y, int64_t n, int64_t groups, uint32_t threshold,
                                       float keep_scale, uint64_t seed, uint64_t offset) {
  GRID_STRIDE_LOOP(q, groups)
  dropout_group(q, n, threshold, seed, offset, [&](int64_t i, bool kept) { y[i] = kept ? x[i] * keep_scale : 0.0f; });
}

// dy, dx [n]: dx += kept dy * keep_scale (one writer per element). __fmul_rn / __fadd_rn: nvcc
// would contract `dx + dy * s` into one FMA (one rounding), the CPU rounds the product and the sum
// separately; with these the gradient is the CPU's bit for bit (tests/check_no_fma.cmake checks
// the PTX).
__global__ void dropout_backward_kernel(const float *dy, float *dx, int64_t n, int64_t groups, uint32_t threshold,
                                        float keep_scale, uint64_t seed, uint64_t offset) {
  GRID_STRIDE_LOOP(q, groups)
  dropout_group(q, n, threshold, seed, offset, [&](int64_t i, bool kept) {
    if (kept) dx[i] = __fadd_rn(dx[i], __fmul_rn(dy[i], keep_scale));
  });
}

// One thread per group of 4 elements; in, out: x, y forward, dy, dx backward.
static void dropout(const float *in, float *out, int64_t n, float p, uint64_t seed, uint64_t offset, bool backward) {
  if (n <= 0) return;
  int64_t groups = (n + 3) / 4;
  uint32_t threshold = dropout_threshold(p);
  float scale = dropout_keep_scale(p);
  if (backward) LAUNCH_GRID_STRIDE(dropout_backward_kernel, groups, in, out, n, groups, threshold, scale, seed, offset);
  else LAUNCH_GRID_STRIDE(dropout_forward_kernel, groups, in, out, n, groups, threshold, scale, seed, offset);
}

extern "C" void cuda_dropout_forward(const float *x, float *y, int64_t n, float p, uint64_t seed, uint64_t offset) {
  dropout(x, y, n, p, seed, offset, false);
}

extern "C" void cuda_dropout_backward(const float *dy, float *dx, int64_t n, float p, uint64_t seed, uint64_t offset) {
  dropout(dy, dx, n, p, seed, offset, true);
}
