// NCCL collectives on the backend's one stream, for data-parallel training (dist/dist.c).
// Compiled when the CUDA toolkit has NCCL (DETR_HAVE_NCCL).
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_NCCL_ID_BYTES 128  // NCCL_UNIQUE_ID_BYTES

// The process's GPU is selected before (cuda_set_device, dist/dist.c's dist_bind_device).
void cuda_nccl_unique_id(unsigned char id[CUDA_NCCL_ID_BYTES]);  // on rank 0, then broadcast
// The communicator (an ncclComm_t) of this rank; its owner (dist/dist.c's DistJob) destroys it.
void *cuda_nccl_init(const unsigned char id[CUDA_NCCL_ID_BYTES], int rank, int size);
// In-place sum over the ranks of n floats on this GPU, queued on the compute stream.
void cuda_nccl_allreduce_sum(void *comm, float *data, int64_t n);
void cuda_nccl_group_begin(void);  // ncclGroupStart: the all-reduces until _end run as one
void cuda_nccl_group_end(void);
void cuda_nccl_destroy(void *comm);

#ifdef __cplusplus
}
#endif
