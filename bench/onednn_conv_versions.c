// bf16 and fp32 convolution kernels of two oneDNN releases on the same shapes: does oneDNN 3.x's
// bf16 pay over Debian's 2.6 (docs/precision.md, "Not done")? Compiles against either API (2.x
// operation descriptors, 3.x primitive descriptors directly); every tensor in the layout the
// primitive prefers (format_tag any), so this times the kernels alone, without reorders.
//
//   build-cpu/bench/bench_onednn_versions [reps] [any|nhwc]      (the system's oneDNN, built with the project)
//   cc -O2 -std=c11 bench/onednn_conv_versions.c -I INCLUDE -L LIB -l:libdnnl.so.3 -Wl,-rpath,LIB -o conv_v3
//   OMP_NUM_THREADS=2 ./conv_v3 [reps] [any|nhwc]                  (another release, e.g. PyPI's onednn-cpu-gomp)
// nhwc: activations channels last (detr-c's backbone layout), weights still as the primitive prefers.
// Prints one line per shape, pass and data type: milliseconds (median of reps) and GFLOP/s counted
// as a direct convolution. It measures the library, not detr-c (bench_ops times detr-c's passes).
#define _POSIX_C_SOURCE 199309L
#include <string.h>
#include <time.h>

#include "dnnl_check.h"

typedef struct {
  const char *name;
  int n, c, h, w, k, r, stride, pad;
} Shape;

// detr-r50 at 512x512, batch 2: one convolution of each kind the backbone repeats.
static const Shape SHAPES[] = {
    {"layer1 3x3 64", 2, 64, 128, 128, 64, 3, 1, 1},        {"layer2.0 3x3 128 s2", 2, 128, 128, 128, 128, 3, 2, 1},
    {"layer3 3x3 256", 2, 256, 32, 32, 256, 3, 1, 1},       {"layer4 3x3 512", 2, 512, 16, 16, 512, 3, 1, 1},
    {"layer3 1x1 1024>256", 2, 1024, 32, 32, 256, 1, 1, 0}, {"layer3 1x1 256>1024", 2, 256, 32, 32, 1024, 1, 1, 0},
    {"layer1 1x1 64>256", 2, 64, 128, 128, 256, 1, 1, 0},
};

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

// The two APIs differ in what a memory descriptor is: a handle in 3.x (created, destroyed), a
// struct in 2.x (initialised in place, passed by address).
typedef dnnl_memory_desc_t Md;
#if DNNL_VERSION_MAJOR >= 3
typedef const_dnnl_memory_desc_t QueriedMd;
#define MD(x) (x)
#else
typedef const dnnl_memory_desc_t *QueriedMd;
#define MD(x) (&(x))
#endif

static dnnl_format_tag_t activation_tag = dnnl_format_tag_any;

static Md md_tag(int nd, const dnnl_dims_t dims, dnnl_data_type_t dt, dnnl_format_tag_t tag) {
  Md md;
#if DNNL_VERSION_MAJOR >= 3
  CHECK(dnnl_memory_desc_create_with_tag(&md, nd, dims, dt, tag));
#else
  CHECK(dnnl_memory_desc_init_by_tag(&md, nd, dims, dt, tag));
#endif
  return md;
}

// A memory object for what the primitive descriptor asks for at `what`, filled with small values.
static dnnl_memory_t memory_for(dnnl_engine_t eng, const_dnnl_primitive_desc_t pd, dnnl_query_t what) {
  QueriedMd md = dnnl_primitive_desc_query_md(pd, what, 0);
  dnnl_memory_t m;
  CHECK(dnnl_memory_create(&m, md, eng, DNNL_MEMORY_ALLOCATE));
  void *p;
  CHECK(dnnl_memory_get_data_handle(m, &p));
  memset(p, 0x3c, dnnl_memory_desc_get_size(md));  // 0x3c3c: a normal number in bf16 and in fp32
  return m;
}

typedef enum { FWD, BWD_DATA, BWD_WEIGHTS } Pass;
static const char *PASS_NAME[] = {"forward", "backward-data", "backward-weights"};

static double time_pass(dnnl_engine_t eng, dnnl_stream_t st, const Shape *s, dnnl_data_type_t dt, Pass pass, int reps) {
  int oh = (s->h + 2 * s->pad - s->r) / s->stride + 1, ow = (s->w + 2 * s->pad - s->r) / s->stride + 1;
  dnnl_dims_t src = {s->n, s->c, s->h, s->w}, wei = {s->k, s->c, s->r, s->r}, dst = {s->n, s->k, oh, ow};
  dnnl_dims_t strides = {s->stride, s->stride}, dil = {0, 0}, pad = {s->pad, s->pad};
  // bf16: bf16 inputs, fp32 outputs where oneDNN allows (dst of the forward, the weights' gradient),
  // as detr-c asks for; fp32: fp32 everywhere.
  dnnl_data_type_t out = dnnl_f32;
  dnnl_format_tag_t a = activation_tag, any = dnnl_format_tag_any;
  Md src_md = md_tag(4, src, dt, a), wei_md = md_tag(4, wei, dt, any),
     dst_md = md_tag(4, dst, pass == FWD ? out : dt, a);
  Md dsrc_md = md_tag(4, src, dt, a), dwei_md = md_tag(4, wei, out, any);
  dnnl_primitive_desc_t fwd_pd, pd;
#if DNNL_VERSION_MAJOR >= 3
  CHECK(dnnl_convolution_forward_primitive_desc_create(&fwd_pd, eng, dnnl_forward_training, dnnl_convolution_direct,
                                                       src_md, wei_md, NULL, dst_md, strides, dil, pad, pad, NULL));
  if (pass == FWD) pd = fwd_pd;
  else if (pass == BWD_DATA)
    CHECK(dnnl_convolution_backward_data_primitive_desc_create(&pd, eng, dnnl_convolution_direct, dsrc_md, wei_md,
                                                               dst_md, strides, dil, pad, pad, fwd_pd, NULL));
  else
    CHECK(dnnl_convolution_backward_weights_primitive_desc_create(&pd, eng, dnnl_convolution_direct, src_md, dwei_md,
                                                                  NULL, dst_md, strides, dil, pad, pad, fwd_pd, NULL));
#else
  dnnl_convolution_desc_t fd, bd;
  CHECK(dnnl_dilated_convolution_forward_desc_init(&fd, dnnl_forward_training, dnnl_convolution_direct, MD(src_md),
                                                   MD(wei_md), NULL, MD(dst_md), strides, dil, pad, pad));
  CHECK(dnnl_primitive_desc_create(&fwd_pd, &fd, NULL, eng, NULL));
  if (pass == FWD) pd = fwd_pd;
  else if (pass == BWD_DATA) {
    CHECK(dnnl_dilated_convolution_backward_data_desc_init(&bd, dnnl_convolution_direct, MD(dsrc_md), MD(wei_md),
                                                           MD(dst_md), strides, dil, pad, pad));
    CHECK(dnnl_primitive_desc_create(&pd, &bd, NULL, eng, fwd_pd));
  } else {
    CHECK(dnnl_dilated_convolution_backward_weights_desc_init(&bd, dnnl_convolution_direct, MD(src_md), MD(dwei_md),
                                                              NULL, MD(dst_md), strides, dil, pad, pad));
    CHECK(dnnl_primitive_desc_create(&pd, &bd, NULL, eng, fwd_pd));
  }
#endif
  const char *impl = NULL;
  CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
  dnnl_primitive_t prim;
  CHECK(dnnl_primitive_create(&prim, pd));
  dnnl_exec_arg_t args[4];
  int nargs = 3;
  if (pass == FWD) {
    args[0] = (dnnl_exec_arg_t){DNNL_ARG_SRC, memory_for(eng, pd, dnnl_query_src_md)};
    args[1] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, memory_for(eng, pd, dnnl_query_weights_md)};
    args[2] = (dnnl_exec_arg_t){DNNL_ARG_DST, memory_for(eng, pd, dnnl_query_dst_md)};
  } else if (pass == BWD_DATA) {
    args[0] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_SRC, memory_for(eng, pd, dnnl_query_diff_src_md)};
    args[1] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, memory_for(eng, pd, dnnl_query_weights_md)};
    args[2] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_DST, memory_for(eng, pd, dnnl_query_diff_dst_md)};
  } else {
    args[0] = (dnnl_exec_arg_t){DNNL_ARG_SRC, memory_for(eng, pd, dnnl_query_src_md)};
    args[1] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_WEIGHTS, memory_for(eng, pd, dnnl_query_diff_weights_md)};
    args[2] = (dnnl_exec_arg_t){DNNL_ARG_DIFF_DST, memory_for(eng, pd, dnnl_query_diff_dst_md)};
  }
  double t[64];                      // reps <= 64 (main)
  for (int i = -1; i < reps; i++) {  // one warm-up
    double t0 = now_ms();
    CHECK(dnnl_primitive_execute(prim, st, nargs, args));
    CHECK(dnnl_stream_wait(st));
    if (i >= 0) t[i] = now_ms() - t0;
  }
  qsort(t, (size_t)reps, sizeof t[0], cmp_double);
  double ms = t[reps / 2];
  double flop = 2.0 * s->n * s->k * oh * ow * (double)s->c * s->r * s->r;
  printf("%-22s %-16s %-4s %8.2f ms %7.1f GFLOP/s  %s\n", s->name, PASS_NAME[pass], dt == dnnl_bf16 ? "bf16" : "fp32",
         ms, flop / ms / 1e6, impl);
  for (int i = 0; i < nargs; i++) dnnl_memory_destroy(args[i].memory);
  dnnl_primitive_destroy(prim);
  if (pd != fwd_pd) dnnl_primitive_desc_destroy(pd);
  dnnl_primitive_desc_destroy(fwd_pd);
#if DNNL_VERSION_MAJOR >= 3
  dnnl_memory_desc_destroy(src_md), dnnl_memory_desc_destroy(wei_md), dnnl_memory_desc_destroy(dst_md);
  dnnl_memory_desc_destroy(dsrc_md), dnnl_memory_desc_destroy(dwei_md);
#endif
  return ms;
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 5;
  if (reps < 1 || reps > 64) {
    fprintf(stderr, "usage: %s [reps 1..64] [any|nhwc]\n", argv[0]);
    return 2;
  }
  if (argc > 2 && strcmp(argv[2], "nhwc") == 0) activation_tag = dnnl_nhwc;
  const dnnl_version_t *v = dnnl_version();
  printf("oneDNN %d.%d.%d (%s), activations %s\n", v->major, v->minor, v->patch, v->hash,
         activation_tag == dnnl_nhwc ? "nhwc" : "as preferred");
  dnnl_engine_t eng;
  dnnl_stream_t st;
  CHECK(dnnl_engine_create(&eng, dnnl_cpu, 0));
  CHECK(dnnl_stream_create(&st, eng, dnnl_stream_default_flags));
  double total[2] = {0, 0};
  for (size_t i = 0; i < sizeof SHAPES / sizeof SHAPES[0]; i++)
    for (int p = FWD; p <= BWD_WEIGHTS; p++)
      for (int d = 0; d < 2; d++) total[d] += time_pass(eng, st, &SHAPES[i], d ? dnnl_bf16 : dnnl_f32, (Pass)p, reps);
  printf("sum over the shapes and passes: fp32 %.1f ms, bf16 %.1f ms (bf16 / fp32 %.2f)\n", total[0], total[1],
         total[1] / total[0]);
  dnnl_stream_destroy(st);
  dnnl_engine_destroy(eng);
  return 0;
}
