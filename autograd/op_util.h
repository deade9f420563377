// Helpers shared by the op implementations (private to autograd/).
#pragma once
#include <string.h>

#include "autograd/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#if DETR_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

// Runs `cpu_call` for CPU tensors and `cuda_call` for CUDA ones.
#if DETR_HAVE_CUDA
#define DISPATCH(dev, cpu_call, cuda_call) \
  do {                                     \
    if ((dev) == DEVICE_CUDA) {            \
      cuda_call;                           \
    } else {                               \
      cpu_call;                            \
    }                                      \
  } while (0)
#else
#define DISPATCH(dev, cpu_call, cuda_call) \
  do {                                     \
    (void)(dev);                           \
    cpu_call;                              \
  } while (0)
#endif

// Every op runs its CPU kernel or its CUDA kernel through DISPATCH: an op without a CUDA kernel
// cannot be written this way, so a missing kernel is a build error, not a run-time surprise.

// An owned copy of `bytes` of host data on dev (from detr_alloc; release with detr_free(dev, p,
// bytes), or hand it to a node with node_take_block): host index arrays that kernels read on the
// tensors' device. The copy to a GPU is queued on the stream; host is free to reuse on return.
static inline void *upload_block(Device dev, const void *host, size_t bytes) {
  void *block = detr_alloc(dev, bytes);
  if (bytes == 0) return block;
  if (dev == DEVICE_CPU) {
    memcpy(block, host, bytes);
  } else {
#if DETR_HAVE_CUDA
    cuda_memcpy_h2d(block, host, bytes);
#endif
  }
  return block;
}

// The node keeps the block for its backward (and frees it with the tape); with no node (nothing
// to differentiate) it is freed now. Freeing right after queuing the kernels that read it is safe
// on the GPU: the caching allocator hands it out again only to work queued later on the stream.
static inline void node_take_block(TapeNode *n, Device dev, void *block, size_t bytes) {
  if (!n) {
    detr_free(dev, block, bytes);
    return;
  }
  DETR_CHECK(n->buf == NULL, "autograd(%s): node buffer set twice", n->name);
  n->buf = block;
  n->buf_bytes = bytes;
  n->buf_device = dev;
}

// The gradient buffer of t when t takes a gradient, else NULL.
static inline float *grad_data_or_null(Tensor *t) { return (t && t->requires_grad) ? autograd_grad(t)->data : NULL; }

static inline void check_same_device(const char *op, const Tensor *a, const Tensor *b) {
  DETR_CHECK(a->device == b->device, "%s: inputs on %s and %s", op, device_name(a->device), device_name(b->device));
}

// Normalises a possibly negative axis of a rank-ndim tensor.
static inline int normalize_axis(const char *op, int axis, int ndim) {
  int a = axis < 0 ? axis + ndim : axis;
  DETR_CHECK(a >= 0 && a < ndim, "%s: axis %d out of range for rank %d", op, axis, ndim);
  return a;
}

// Product of dims [from, to).
static inline int64_t dims_product(Shape s, int from, int to) {
  int64_t n = 1;
  for (int i = from; i < to; i++) n *= s.d[i];
  return n;
}
