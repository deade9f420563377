// Inclusive prefix sums of int64 on the device: cub's DeviceScan (the toolkit's), kept in its own
// file because cub's headers bring process-wide variables of their own (NVTX's injection pointer,
// <iostream>'s initialiser: tools/globals_allowed.txt).
#include <cub/device/device_scan.cuh>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.cuh"

extern "C" size_t cuda_inclusive_scan_i64_bytes(int64_t n) {
  DETR_CHECK(n >= 0 && n < INT32_MAX, "cuda_inclusive_scan_i64: %lld values exceed cub's int count", (long long)n);
  size_t bytes = 0;
  CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, bytes, (const int64_t *)nullptr, (int64_t *)nullptr, (int)n,
                                           detr_cuda_stream()));
  return bytes;
}

extern "C" void cuda_inclusive_scan_i64(const int64_t *in, int64_t *out, int64_t n, void *temp, size_t temp_bytes) {
  if (n == 0) return;
  CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, temp_bytes, in, out, (int)n, detr_cuda_stream()));
}
