// CUDA kernels and runtime wrappers, callable from C. Signatures mirror kernels/cpu/cpu_kernels.h
// (pointers are device pointers); element math comes from the same kernels/*_math.h headers.
// Every CUDA, cuBLAS and cuDNN status is checked; a failure stops with file:line and the call.
// All work is queued on one stream per process; only the copies to the host synchronise.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "kernels/common.h"
#include "kernels/conv_math.h"
#include "kernels/elementwise_math.h"

#ifdef __cplusplus
extern "C" {
#endif

// runtime.cu
int cuda_device_count(void);  // 0 when no usable GPU (no driver, no device): never fails
void *cuda_device_malloc(size_t bytes);  // NULL on out-of-memory
void cuda_device_free(void *ptr);
void cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
void cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);  // synchronises
void cuda_memcpy_d2d(void *dst, const void *src, size_t bytes);
void cuda_synchronize(void);

// elementwise.cu
void cuda_fill(float *x, int64_t n, float value);
void cuda_uniform(float *x, int64_t n, uint64_t seed, uint64_t offset, float low, float high);
void cuda_normal(float *x, int64_t n, uint64_t seed, uint64_t offset, float mean, float std);
void cuda_accumulate(float *dst, const float *src, int64_t n);
void cuda_unary_forward(int op, const float *x, float *y, int64_t n, float param);
void cuda_unary_backward(int op, const float *x, const float *y, const float *dy, float *dx,
                         int64_t n, float param);
void cuda_binary_forward(int op, const float *a, const float *b, float *y, Broadcast bc);
void cuda_binary_backward(int op, const float *a, const float *b, const float *dy, float *da,
                          float *db, Broadcast bc);

// matmul.cu (cuBLAS)
void cuda_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
               int64_t ldc);
void cuda_gemm_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                       int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c,
                       int64_t batch);
void cuda_add_row_bias(float *y, const float *bias, int64_t rows, int64_t cols);
void cuda_row_bias_backward(const float *dy, float *dbias, int64_t rows, int64_t cols);

// conv.cu (cuDNN). dx, dw, dbias may be NULL; gradients accumulate.
void cuda_conv2d_forward(const float *x, const float *w, const float *bias, float *y,
                         const ConvGeom *g);
void cuda_conv2d_backward(const float *x, const float *w, const float *dy, float *dx, float *dw,
                          float *dbias, const ConvGeom *g);

// enact.cu: ENACT's clustering (Algorithm 1's regions x features grid); arrays on the device.
void cuda_enact_cluster_forward(const float *K, const float *V, const float *H, const float *signs,
                                const int64_t *starts, const int64_t *lengths, int64_t L, int64_t d, float *Kc,
                                float *Vc);
void cuda_enact_cluster_backward(const float *K, const float *V, const float *H, const float *signs,
                                 const int64_t *starts, const int64_t *lengths, int64_t L, int64_t d,
                                 const float *Kc, const float *Vc, const float *dKc, const float *dVc, float *dK,
                                 float *dV, float *dH);

#ifdef __cplusplus
}
#endif
