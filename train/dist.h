// Synchronous data parallelism across processes: MPI for the process group and for gradients on
// the CPU, NCCL for gradients on CUDA (its unique id is broadcast over MPI). docs/distributed.md.
//
// Launched without an MPI launcher (no OMPI_/PMI_/PMIX_ rank variables), or built without MPI,
// the world is one process: MPI is never initialised and every call below is a no-op that
// returns its input, so a single-process run has no MPI in it at all.
//
// Every collective is called by every rank in the same order. A rank that fails does not leave:
// it reports the failure through the next dist_all_ok so all ranks stop together.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nn/params.h"
#include "tensor/tensor.h"

// Joins the process group when launched by mpirun/srun. Call first thing in main.
void dist_init(int *argc, char ***argv);
// Leaves it (a barrier first). Call before exiting main.
void dist_finalize(void);
int dist_rank(void);        // 0 when not distributed
int dist_world_size(void);  // 1 when not distributed
bool dist_is_main(void);    // rank 0: the one that writes files and logs
// The MPI library this build has, or "none".
const char *dist_backend_name(void);

// CUDA under mpirun: binds this rank to GPU local_rank % count (once; before any other CUDA work).
// Every verb that takes --device does it (setup_device), so training, evaluation and prediction
// ranks spread over the host's GPUs. No-op on the CPU or in a single process. Returns 0, or -1
// with err set (no usable GPU).
int dist_bind_device(Device dev, char *err, size_t err_cap);
// Training on CUDA: the binding above, then the NCCL communicator for the gradients.
// Returns 0, or -1 with err set (no NCCL in this build).
int dist_setup_device(Device dev, char *err, size_t err_cap);

// In-place sums over the ranks. data is on `dev` (CUDA: NCCL on the compute stream).
void dist_allreduce_sum_f32(float *data, int64_t n, Device dev);
// Between begin and end, CUDA all-reduces are fused into one NCCL launch (ncclGroupStart/End).
void dist_group_begin(void);
void dist_group_end(void);
void dist_allreduce_sum_f64(double *data, int n);  // host
void dist_allreduce_max_u64(uint64_t *data, int n);  // host
// Sums every trainable parameter's gradient over the processes, in place (a grad no op wrote
// counts as 0). Each process's loss is its share of the global batch's loss (global num_boxes and
// cross-entropy weight), so the sum is the global batch's gradient. One tensor at a time: no
// packing copies; on CUDA the calls are fused into one NCCL group.
void dist_allreduce_gradients(ParamStore *params);
// True on every rank when `ok` is true on every rank.
bool dist_all_ok(bool ok);
// Rank 0 receives every rank's bytes, concatenated in rank order (*out malloc'd, *out_bytes);
// other ranks get *out = NULL, *out_bytes = 0.
void dist_gather_bytes(const void *data, int64_t bytes, void **out, int64_t *out_bytes);
// Rank 0's n doubles to every rank.
void dist_broadcast_f64(double *data, int n);
