// Helpers shared by the op implementations (private to autograd/).
#pragma once
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

// For ops whose CUDA kernel is not written yet: a clear run-time error, never a silent fallback.
#define CPU_ONLY(dev, op_name, cpu_call)                                                      \
  do {                                                                                        \
    DETR_CHECK((dev) == DEVICE_CPU, "%s: no CUDA kernel for this op yet; run it on the CPU", \
               op_name);                                                                      \
    cpu_call;                                                                                 \
  } while (0)

// The gradient buffer of t when t takes a gradient, else NULL.
static inline float *grad_data_or_null(Tensor *t) {
  return (t && t->requires_grad) ? autograd_grad(t)->data : NULL;
}

static inline void check_same_device(const char *op, const Tensor *a, const Tensor *b) {
  DETR_CHECK(a->device == b->device, "%s: inputs on %s and %s", op, device_name(a->device),
             device_name(b->device));
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
