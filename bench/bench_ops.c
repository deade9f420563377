// Matmul and conv2d throughput against OpenBLAS's raw sgemm on the same machine.
//   build/bench/bench_ops [reps]
// For each problem: the median time of our op (forward, and forward+backward for conv) and of
// the bare cblas_sgemm call(s) doing the same multiply-adds, in GFLOP/s, and their ratio.
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "autograd/ops.h"

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static Tensor *rand_tensor(Shape s, uint64_t seed, bool grad) {
  Tensor *t = tensor_new(DEVICE_CPU, s);
  Rng r = rng_make(seed);
  tensor_uniform_(t, &r, -1, 1);
  tensor_set_requires_grad(t, grad);
  return t;
}

// Median seconds of `batch` sgemm calls of [m,k] x [k,n].
static double time_sgemm(int64_t m, int64_t n, int64_t k, int batch, int reps) {
  float *a = calloc((size_t)(m * k), 4), *b = calloc((size_t)(k * n), 4), *c = calloc((size_t)(m * n), 4);
  double *t = malloc(sizeof(double) * reps);
  for (int r = -1; r < reps; r++) {
    double t0 = now();
    for (int i = 0; i < batch; i++)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)k, b,
                  (int)n, 0.0f, c, (int)n);
    if (r >= 0) t[r] = now() - t0;
  }
  double med = median(t, reps);
  free(a), free(b), free(c), free(t);
  return med;
}

static void bench_matmul(int64_t m, int64_t n, int64_t k, int reps) {
  Tensor *x = rand_tensor(SHAPE(m, k), 1, false), *w = rand_tensor(SHAPE(n, k), 2, false);
  double *t = malloc(sizeof(double) * reps);
  for (int r = -1; r < reps; r++) {
    ScopeMark mark = tensor_scope_mark();
    double t0 = now();
    op_linear(x, w, NULL);
    if (r >= 0) t[r] = now() - t0;
    tensor_scope_release(mark);
  }
  double ours = median(t, reps), blas = time_sgemm(m, n, k, 1, reps);
  double gflop = 2.0 * m * n * k * 1e-9;
  printf("linear  %5lldx%5lldx%5lld          ours %7.1f GFLOP/s  sgemm %7.1f GFLOP/s  ratio %.2f\n",
         (long long)m, (long long)n, (long long)k, gflop / ours, gflop / blas, blas / ours);
  tensor_release(x), tensor_release(w), free(t);
}

static void bench_conv(int64_t batch, int64_t c, int64_t h, int64_t w, int64_t o, int k, int stride, int reps) {
  int pad = k / 2;
  Tensor *x = rand_tensor(SHAPE(batch, c, h, w), 3, true), *wt = rand_tensor(SHAPE(o, c, k, k), 4, true);
  Conv2dParams p = {stride, stride, pad, pad, 1, 1};
  int64_t ho = (h + 2 * pad - k) / stride + 1, wo = (w + 2 * pad - k) / stride + 1;
  double *tf = malloc(sizeof(double) * reps), *tb = malloc(sizeof(double) * reps);
  for (int r = -1; r < reps; r++) {
    ScopeMark mark = tensor_scope_mark();
    double t0 = now();
    Tensor *y = op_conv2d(x, wt, NULL, p);
    double t1 = now();
    Tensor *g = tensor_new_scoped(DEVICE_CPU, y->shape);
    tensor_fill_(g, 1.0f);
    autograd_backward_with(y, g);
    double t2 = now();
    if (r >= 0) tf[r] = t1 - t0, tb[r] = t2 - t1;
    tensor_scope_release(mark);
  }
  double fwd = median(tf, reps), bwd = median(tb, reps);
  // The same multiply-adds as one sgemm per image: [o, c*k*k] x [c*k*k, ho*wo].
  double blas = time_sgemm(o, ho * wo, c * k * k, (int)batch, reps);
  double gflop = 2.0 * batch * o * ho * wo * c * k * k * 1e-9;
  printf("conv%dx%d s%d %dx%4lldx%3lldx%3lld->%4lld  fwd %7.1f GFLOP/s  bwd %7.1f GFLOP/s  sgemm %7.1f GFLOP/s  "
         "ratio fwd %.2f bwd %.2f\n",
         k, k, stride, (int)batch, (long long)c, (long long)h, (long long)w, (long long)o, gflop / fwd,
         2 * gflop / bwd, gflop / blas, blas / fwd, 2 * blas / bwd);
  tensor_release(x), tensor_release(wt), free(tf), free(tb);
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 7;
  printf("threads: OpenBLAS %d\n", openblas_get_num_threads());
  // Transformer shapes: hidden 256, FFN 2048, a 25x38 feature map of 2 images (1900 tokens).
  bench_matmul(256, 256, 2048, reps);
  bench_matmul(256, 2048, 256, reps);
  bench_matmul(1900, 256, 256, reps);
  bench_matmul(1900, 2048, 256, reps);
  bench_matmul(1900, 256, 2048, reps);
  // ResNet 3x3 convolutions at 64-512 channels on an 800x1066-class input (stride 4 .. 32),
  // one image; and the 7x7 stem.
  bench_conv(1, 64, 200, 267, 64, 3, 1, reps);
  bench_conv(1, 128, 100, 134, 128, 3, 1, reps);
  bench_conv(1, 256, 50, 67, 256, 3, 1, reps);
  bench_conv(1, 512, 25, 34, 512, 3, 1, reps);
  bench_conv(1, 128, 100, 134, 128, 3, 2, reps);
  bench_conv(1, 3, 400, 534, 64, 7, 2, reps);
  bench_conv(2, 256, 50, 67, 1024, 1, 1, reps);
  return 0;
}
