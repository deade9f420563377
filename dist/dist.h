// Synchronous data parallelism across processes: MPI for the process group and for gradients on
// the CPU, NCCL for gradients on CUDA (its unique id is broadcast over MPI). docs/distributed.md.
//
// Launched without an MPI launcher (no OMPI_/PMI_/PMIX_ rank variables), or built without MPI,
// the world is one process: MPI is never initialised and every call below is a no-op that
// returns its input, so a single-process run has no MPI in it at all.
//
// The trainer and the evaluation see the job as one object, a Dist (the process group), made once
// by dist_init in main and passed down to every verb: they read as single-process code, and a group of one
// (DIST_SINGLE, or dist_init's without mpirun) turns every collective into a no-op that returns
// its input. Every collective is called by every rank of the group in the same order. A rank that
// fails does not leave: it reports the failure through the next dist_all_ok so all ranks stop
// together.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nn/params.h"
#include "tensor/tensor.h"

// A group is the whole job (dist_init's) or this process alone (DIST_SINGLE; a zeroed Dist too):
// the collectives run over MPI_COMM_WORLD, there are no other communicators. A copy is the same
// group: the job's state (whether MPI was started, the GPU bound, the NCCL communicator) is behind
// `job`, which main owns.
typedef struct DistJob DistJob;
typedef struct {
  int rank;      // 0 .. world - 1
  int world;     // processes
  DistJob *job;  // NULL: this process alone
} Dist;
#define DIST_SINGLE ((Dist){.rank = 0, .world = 1})
// Joins the process group when launched by mpirun/srun, else a group of one. Call first thing in main.
Dist dist_init(int *argc, char ***argv);
// Leaves it (a barrier first) and frees its state. Call before exiting main.
void dist_finalize(Dist *g);
// Rank 0: the one that writes files and logs.
static inline bool dist_is_main(const Dist *g) { return g->rank == 0; }
// The MPI library this build has, or "none".
const char *dist_backend_name(void);
// How long OpenMPI's mpirun lets its processes stop: on a Ctrl-C or SIGTERM it sends them SIGCONT,
// SIGTERM this many seconds later and SIGKILL as many seconds after that (its
// odls_base_sigkill_timeout: 1 unless set, seen by the processes in
// OMPI_MCA_odls_base_sigkill_timeout when set on mpirun's command line or in the environment). -1
// when this process was not started by OpenMPI. SIGUSR1 and SIGUSR2 it passes on at once and kills
// nobody.
int dist_mpirun_kill_grace_s(void);
// The pid of the OpenMPI launcher (mpirun, mpiexec, orterun, prterun) when it is this process's parent, else 0.
int dist_mpirun_pid(void);

// CUDA under mpirun: binds this rank to GPU local_rank % count (once; before any other CUDA work).
// Every verb that takes --device does it (setup_device), so training, evaluation and prediction
// ranks spread over the host's GPUs. No-op on the CPU or in a single process. Returns 0, or -1
// with err set (no usable GPU).
int dist_bind_device(const Dist *g, Device dev, char *err, size_t err_cap);
// Training on CUDA: the binding above, then the NCCL communicator for the gradients.
// Returns 0, or -1 with err set (no NCCL in this build).
int dist_setup_device(const Dist *g, Device dev, char *err, size_t err_cap);

// In-place sums over every process of the job. data is on `dev` (CUDA: NCCL on the compute
// stream). The gradients' all-reduce below; bench/bench_allreduce.c.
void dist_allreduce_sum_f32(const Dist *g, float *data, int64_t n, Device dev);
// Between begin and end, CUDA all-reduces are fused into one NCCL launch (ncclGroupStart/End).
void dist_group_begin(const Dist *g);
void dist_group_end(const Dist *g);

// --- the group's collectives ---

void dist_allreduce_sum_f64(const Dist *g, double *data, int n);    // host, in place
void dist_allreduce_max_u64(const Dist *g, uint64_t *data, int n);  // host, in place
// Sums every trainable parameter's gradient over the processes, in place (a grad no op wrote
// counts as 0). Each process's loss is its share of the global batch's loss (global num_boxes and
// cross-entropy weight), so the sum is the global batch's gradient. One tensor at a time: no
// packing copies; on CUDA the calls are fused into one NCCL group.
void dist_allreduce_gradients(const Dist *g, ParamStore *params);
// True on every rank when `ok` is true on every rank.
bool dist_all_ok(const Dist *g, bool ok);
// Rank 0 receives every rank's bytes, concatenated in rank order (*out malloc'd, *out_bytes);
// other ranks get *out = NULL, *out_bytes = 0.
void dist_gather_bytes(const Dist *g, const void *data, int64_t bytes, void **out, int64_t *out_bytes);
// Rank 0's n doubles to every rank.
void dist_broadcast_f64(const Dist *g, double *data, int n);
