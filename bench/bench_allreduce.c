// The gradient all-reduce of data-parallel training, alone: a DETR preset's trainable gradients
// summed over the processes as `detr train` does it (dist_allreduce_gradients: one MPI_Allreduce
// per tensor), and the same bytes as one flat buffer, for comparison.
//   mpirun -np 2 build/bench/bench_allreduce [--preset detr-r18-small] [--reps 10]
// Prints one JSON line from rank 0: tensors, MB, median seconds per step of each way.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/runtime.h"
#include "nn/detr.h"
#include "dist/dist.h"
#include "bench/bench_util.h"

int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Dist g = dist_init(&argc, &argv);
  const char *preset = "detr-r18-small";
  int reps = 10;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: mpirun -np N bench_allreduce [--preset NAME] [--reps N]\n");
      return 2;
    }
  }
  DetrConfig cfg;
  if (detr_config_preset(preset, &cfg)) {
    fprintf(stderr, "bench_allreduce: unknown preset %s\n", preset);
    return 2;
  }
  DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(m, 1);
  int tensors = 0;
  int64_t numel = 0;
  for (int i = 0; i < m->params.count; i++) {
    Param *p = &m->params.items[i];
    if (p->kind != PARAM_TRAINABLE) continue;
    tensor_fill_(autograd_grad(p->tensor), 1.0f);
    tensors++;
    numel += p->tensor->numel;
  }
  float *flat = detr_calloc((size_t)numel, sizeof(float), "one buffer");  // [numel] the same bytes in one buffer
  double *per_tensor = detr_malloc(sizeof(double) * (size_t)reps, "timings");
  double *one_buffer = detr_malloc(sizeof(double) * (size_t)reps, "timings");
  for (int r = -1; r < reps; r++) {  // r = -1: warm-up
    dist_all_ok(&g, true);           // start together
    double t0 = now();
    dist_allreduce_gradients(&g, &m->params);
    double t1 = now();
    dist_allreduce_sum_f32(&g, flat, numel, DEVICE_CPU);
    double t2 = now();
    if (r >= 0) per_tensor[r] = t1 - t0, one_buffer[r] = t2 - t1;
  }
  qsort(per_tensor, (size_t)reps, sizeof(double), cmp_double);
  qsort(one_buffer, (size_t)reps, sizeof(double), cmp_double);
  if (dist_is_main(&g))
    printf(
        "{\"preset\": \"%s\", \"processes\": %d, \"tensors\": %d, \"mb\": %.1f, \"per_tensor_s\": %.5f, "
        "\"one_buffer_s\": %.5f, \"gb_per_s\": %.2f}\n",
        preset, g.world, tensors, numel * 4.0 / 1e6, per_tensor[reps / 2], one_buffer[reps / 2],
        numel * 4.0 / 1e9 / per_tensor[reps / 2]);
  free(flat), free(per_tensor), free(one_buffer);
  detr_model_free(m);
  dist_finalize(&g);
  return 0;
}
