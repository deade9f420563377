// NCCL communicator and all-reduce on the backend's stream (kernels/cuda/runtime.cu), so the
// reduction is ordered after the backward kernels that wrote the gradients and before the
// optimizer kernels that read them, with no host synchronisation in between.
#if DETR_HAVE_NCCL
#include <nccl.h>

#include <cstring>

#include "kernels/cuda/collectives.h"
#include "kernels/cuda/cuda_util.cuh"

#define NCCL_CHECK(call)                                                                                  \
  do {                                                                                                    \
    ncclResult_t r_ = (call);                                                                             \
    if (r_ != ncclSuccess) detr_fail(__FILE__, __LINE__, "%s failed: %s", #call, ncclGetErrorString(r_)); \
  } while (0)

static_assert(sizeof(ncclUniqueId) == CUDA_NCCL_ID_BYTES, "NCCL unique id size");

extern "C" {

void cuda_nccl_unique_id(unsigned char id[CUDA_NCCL_ID_BYTES]) {
  ncclUniqueId uid;
  NCCL_CHECK(ncclGetUniqueId(&uid));
  memcpy(id, &uid, sizeof uid);
}

void *cuda_nccl_init(const unsigned char id[CUDA_NCCL_ID_BYTES], int rank, int size) {
  ncclUniqueId uid;
  memcpy(&uid, id, sizeof uid);
  ncclComm_t comm = nullptr;
  NCCL_CHECK(ncclCommInitRank(&comm, size, uid, rank));
  return comm;
}

void cuda_nccl_allreduce_sum(void *comm, float *data, int64_t n) {
  if (!comm) detr_fail(__FILE__, __LINE__, "cuda_nccl_allreduce_sum: no communicator (cuda_nccl_init)");
  NCCL_CHECK(ncclAllReduce(data, data, (size_t)n, ncclFloat, ncclSum, (ncclComm_t)comm, detr_cuda_stream()));
}

void cuda_nccl_group_begin(void) { NCCL_CHECK(ncclGroupStart()); }
void cuda_nccl_group_end(void) { NCCL_CHECK(ncclGroupEnd()); }

void cuda_nccl_destroy(void *comm) {
  if (!comm) return;
  CUDA_CHECK(cudaStreamSynchronize(detr_cuda_stream()));
  NCCL_CHECK(ncclCommDestroy((ncclComm_t)comm));
}

}  // extern "C"
#endif  // DETR_HAVE_NCCL
