#define _DEFAULT_SOURCE  // setenv
#include "dist/dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autograd/autograd.h"
#include "core/error.h"
#if DETR_HAVE_MPI
#include <mpi.h>
#endif
#if DETR_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif
#if DETR_HAVE_NCCL
#include "kernels/cuda/collectives.h"
#endif

// The process's place in the job, behind every copy of its Dist (main owns it: dist_init, dist_finalize).
struct DistJob {
  int local_rank;     // rank among the processes on this host: the GPU it binds
  bool mpi;           // MPI_Init was called
  bool device_bound;  // dist_bind_device chose this rank's GPU
  void *nccl;         // the gradients' NCCL communicator (dist_setup_device), or NULL
};

// A launcher's rank variable: OpenMPI, MPICH/Hydra (PMI), PMIx, Slurm's srun.
static bool launched_by_mpi(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_STEP_NUM_TASKS", NULL};
  for (int i = 0; vars[i]; i++)
    if (getenv(vars[i])) return true;
  return false;
}

#if DETR_HAVE_MPI
#define MPI_CALL(call)                                                                      \
  do {                                                                                      \
    int mpi_rc_ = (call);                                                                   \
    if (mpi_rc_ != MPI_SUCCESS) {                                                           \
      char mpi_msg_[MPI_MAX_ERROR_STRING];                                                  \
      int mpi_len_ = 0;                                                                     \
      MPI_Error_string(mpi_rc_, mpi_msg_, &mpi_len_);                                       \
      fprintf(stderr, "detr: %s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, mpi_msg_); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                         \
    }                                                                                       \
  } while (0)
#endif

Dist dist_init(int *argc, char ***argv) {
  Dist g = DIST_SINGLE;
  g.job = detr_calloc(1, sizeof(DistJob), "the job's state");
#if DETR_HAVE_MPI
  if (!launched_by_mpi()) return g;
  // Only the main thread calls MPI (the loader's threads never do).
  int provided = 0;
  MPI_CALL(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);  // MPI_CALL reports, then aborts all
  g.job->mpi = true;
  MPI_CALL(MPI_Comm_rank(MPI_COMM_WORLD, &g.rank));
  MPI_CALL(MPI_Comm_size(MPI_COMM_WORLD, &g.world));
  MPI_Comm local;
  MPI_CALL(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g.rank, MPI_INFO_NULL, &local));
  MPI_CALL(MPI_Comm_rank(local, &g.job->local_rank));
  MPI_CALL(MPI_Comm_free(&local));
#else
  (void)argc, (void)argv;
  if (launched_by_mpi())
    fprintf(stderr,
            "detr: launched by an MPI launcher, but this build has no MPI: every process trains alone "
            "(rebuild with libopenmpi-dev installed)\n");
#endif
  return g;
}

void dist_finalize(Dist *g) {
  DistJob *job = g->job;
  if (!job) return;
#if DETR_HAVE_NCCL
  if (job->nccl) cuda_nccl_destroy(job->nccl);
#endif
#if DETR_HAVE_MPI
  if (job->mpi) {
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Finalize();
  }
#endif
  free(job);
  *g = DIST_SINGLE;
}

const char *dist_backend_name(void) {
#if DETR_HAVE_MPI && DETR_HAVE_NCCL
  return "mpi+nccl";
#elif DETR_HAVE_MPI
  return "mpi";
#else
  return "none";
#endif
}

int dist_mpirun_kill_grace_s(void) {
  if (!getenv("OMPI_COMM_WORLD_SIZE")) return -1;
  const char *v = getenv("OMPI_MCA_odls_base_sigkill_timeout");
  char *end = NULL;
  long s = v ? strtol(v, &end, 10) : 1;
  return v && (end == v || s < 0) ? 1 : s > 1000000 ? 1000000 : (int)s;
}

int dist_mpirun_pid(void) {
  if (!getenv("OMPI_COMM_WORLD_SIZE")) return 0;
  pid_t parent = getppid();
  char path[64], name[64] = "";
  snprintf(path, sizeof path, "/proc/%d/comm", (int)parent);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  bool read = fgets(name, sizeof name, f) != NULL;
  fclose(f);
  name[strcspn(name, "\n")] = 0;
  return read && (!strcmp(name, "mpirun") || !strcmp(name, "mpiexec") || !strcmp(name, "orterun") ||
                  !strcmp(name, "prterun"))
             ? (int)parent
             : 0;
}

int dist_bind_device(const Dist *g, Device dev, char *err, size_t err_cap) {
  if (dev != DEVICE_CUDA || g->world == 1) return 0;
#if DETR_HAVE_CUDA
  DistJob *job = g->job;
  if (job->device_bound) return 0;
  char why[512];
  int count = cuda_device_probe(why, sizeof why);
  if (count <= 0) {
    snprintf(err, err_cap, "--device cuda: rank %d: %s", g->rank, why);
    return -1;
  }
  // Before any other CUDA work of this process: the stream, the handles and every allocation
  // belong to this GPU.
  cuda_set_device(job->local_rank % count);
  job->device_bound = true;
  if (job->local_rank >= count)
    fprintf(stderr, "detr: rank %d shares GPU %d (%d GPUs on this host for more ranks)\n", g->rank,
            job->local_rank % count, count);
  return 0;
#else
  snprintf(err, err_cap, "--device cuda: this build has no CUDA backend (configure with -DDETR_CUDA=ON)");
  return -1;
#endif
}

int dist_setup_device(const Dist *g, Device dev, char *err, size_t err_cap) {
  if (dev != DEVICE_CUDA || g->world == 1) return 0;
#if DETR_HAVE_NCCL && DETR_HAVE_MPI
  if (dist_bind_device(g, dev, err, err_cap)) return -1;  // done already by setup_device; idempotent
  if (g->job->nccl) return 0;
  unsigned char id[CUDA_NCCL_ID_BYTES];
  if (g->rank == 0) cuda_nccl_unique_id(id);
  MPI_CALL(MPI_Bcast(id, CUDA_NCCL_ID_BYTES, MPI_BYTE, 0, MPI_COMM_WORLD));
  g->job->nccl = cuda_nccl_init(id, g->rank, g->world);
  return 0;
#else
  snprintf(err, err_cap, "--device cuda with %d processes needs NCCL and MPI, and this build has %s", g->world,
           dist_backend_name());
  return -1;
#endif
}

void dist_allreduce_sum_f32(const Dist *g, float *data, int64_t n, Device dev) {
  if (g->world == 1 || n == 0) return;
#if DETR_HAVE_NCCL
  if (dev == DEVICE_CUDA) {
    DETR_CHECK(g->job->nccl, "dist_allreduce_sum_f32: CUDA data but no NCCL communicator (dist_setup_device)");
    cuda_nccl_allreduce_sum(g->job->nccl, data, n);
    return;
  }
#endif
  DETR_CHECK(dev == DEVICE_CPU, "dist_allreduce_sum_f32: CUDA data needs NCCL, which this build lacks");
#if DETR_HAVE_MPI
  for (int64_t at = 0; at < n;) {  // MPI counts are int
    int chunk = n - at > (1 << 30) ? (1 << 30) : (int)(n - at);
    MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, data + at, chunk, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    at += chunk;
  }
#else
  (void)data;
#endif
}

void dist_group_begin(const Dist *g) {
#if DETR_HAVE_NCCL
  if (g->job && g->job->nccl) cuda_nccl_group_begin();
#endif
  (void)g;
}

void dist_group_end(const Dist *g) {
#if DETR_HAVE_NCCL
  if (g->job && g->job->nccl) cuda_nccl_group_end();
#endif
  (void)g;
}

// In place over every process (nothing to do alone): the sum of doubles, or the max of uint64s.
static void allreduce_in_place(const Dist *g, void *data, int n, bool max_u64) {
  if (g->world <= 1 || n == 0) return;
#if DETR_HAVE_MPI
  MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, data, n, max_u64 ? MPI_UINT64_T : MPI_DOUBLE, max_u64 ? MPI_MAX : MPI_SUM,
                         MPI_COMM_WORLD));
#else
  (void)data, (void)max_u64;
#endif
}

void dist_allreduce_sum_f64(const Dist *g, double *data, int n) { allreduce_in_place(g, data, n, false); }
void dist_allreduce_max_u64(const Dist *g, uint64_t *data, int n) { allreduce_in_place(g, data, n, true); }

bool dist_all_ok(const Dist *g, bool ok) {
  if (g->world <= 1) return ok;
#if DETR_HAVE_MPI
  int v = ok ? 1 : 0;
  MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  return v == 1;
#else
  return ok;
#endif
}

void dist_gather_bytes(const Dist *g, const void *data, int64_t bytes, void **out, int64_t *out_bytes) {
  *out = NULL;
  *out_bytes = 0;
  if (g->world <= 1) {
    *out = detr_malloc(bytes ? (size_t)bytes : 1, "gathered bytes");
    if (bytes) memcpy(*out, data, (size_t)bytes);
    *out_bytes = bytes;
    return;
  }
#if DETR_HAVE_MPI
  DETR_CHECK(bytes <= INT32_MAX, "dist_gather_bytes: %lld bytes from one rank (at most 2 GiB)", (long long)bytes);
  int mine = (int)bytes, *counts = NULL, *displs = NULL;
  char *all = NULL;
  if (g->rank == 0) {
    counts = detr_malloc(sizeof(int) * (size_t)g->world, "dist_gather_bytes counts");
    displs = detr_malloc(sizeof(int) * (size_t)g->world, "dist_gather_bytes displs");
  }
  MPI_CALL(MPI_Gather(&mine, 1, MPI_INT, counts, 1, MPI_INT, 0, MPI_COMM_WORLD));
  int64_t total = 0;
  if (g->rank == 0) {
    for (int r = 0; r < g->world; r++) {
      DETR_CHECK(total + counts[r] <= INT32_MAX, "dist_gather_bytes: more than 2 GiB in all");
      displs[r] = (int)total;
      total += counts[r];
    }
    all = detr_malloc(total ? (size_t)total : 1, "gathered bytes");
  }
  MPI_CALL(MPI_Gatherv(data, mine, MPI_BYTE, all, counts, displs, MPI_BYTE, 0, MPI_COMM_WORLD));
  free(counts);
  free(displs);
  *out = all;
  *out_bytes = total;
#endif
}

void dist_broadcast_f64(const Dist *g, double *data, int n) {
  if (g->world <= 1 || n == 0) return;
#if DETR_HAVE_MPI
  MPI_CALL(MPI_Bcast(data, n, MPI_DOUBLE, 0, MPI_COMM_WORLD));
#else
  (void)data;
#endif
}

// Gradients summed over the processes: each process's loss is its share of the global batch's
// loss (global num_boxes and cross-entropy weight), so the sum is the global batch's gradient.
// Every trainable tensor takes part, in the same order on every rank (a grad no op wrote is 0).
void dist_allreduce_gradients(const Dist *g, ParamStore *params) {
  if (g->world <= 1) return;
  dist_group_begin(g);
  for (int i = 0; i < params->count; i++) {
    Param *p = &params->items[i];
    if (p->kind != PARAM_TRAINABLE) continue;
    Tensor *grad = autograd_grad(p->tensor);
    dist_allreduce_sum_f32(g, grad->data, grad->numel, grad->device);
  }
  dist_group_end(g);
}
