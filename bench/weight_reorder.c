// A 3x3 weight from the framework's oihw fp32 into the layouts oneDNN's convolutions take it in, in
// one reorder or through ohwi in the destination's type (two): which is faster, per layout and size?
// kernels/cpu/conv_onednn.c (weight_goes_via_ohwi) takes two steps where this measured them faster.
// Caches are flushed before every run (a weight is read once per pass in training: cold).
//
//   build-cpu/bench/bench_weight_reorder [reps]        (default 7; the best run is printed)
//
// Prints per layout and shape: milliseconds one step / two steps, and their ratio.
#define _POSIX_C_SOURCE 199309L
#include <string.h>
#include <time.h>

#include "dnnl_check.h"

#define FLUSH_BYTES ((size_t)128 << 20)  // more than any last-level cache here

static dnnl_engine_t engine;
static dnnl_stream_t stream;

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *xmalloc(size_t bytes) {
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) {
    fprintf(stderr, "bench_weight_reorder: out of memory (%zu bytes)\n", bytes);
    exit(1);
  }
  return p;
}

static dnnl_primitive_t reorder_new(const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to) {
  dnnl_primitive_desc_t pd;
  CHECK(dnnl_reorder_primitive_desc_create(&pd, from, engine, to, engine, NULL));
  dnnl_primitive_t p;
  CHECK(dnnl_primitive_create(&p, pd));
  CHECK(dnnl_primitive_desc_destroy(pd));
  return p;
}

static void reorder_exec(dnnl_primitive_t r, const dnnl_memory_desc_t *from, void *src, const dnnl_memory_desc_t *to,
                         void *dst) {
  dnnl_memory_t mf, mt;
  CHECK(dnnl_memory_create(&mf, from, engine, src));
  CHECK(dnnl_memory_create(&mt, to, engine, dst));
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, mf}, {DNNL_ARG_TO, mt}};
  CHECK(dnnl_primitive_execute(r, stream, 2, args));
  CHECK(dnnl_stream_wait(stream));
  CHECK(dnnl_memory_destroy(mf));
  CHECK(dnnl_memory_destroy(mt));
}

static void flush(char *junk) {
  for (size_t j = 0; j < FLUSH_BYTES; j += 64) junk[j]++;
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 7;
  if (reps < 1) reps = 1;
  CHECK(dnnl_engine_create(&engine, dnnl_cpu, 0));
  CHECK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
  char *junk = xmalloc(FLUSH_BYTES);
  memset(junk, 0, FLUSH_BYTES);
  static const int shapes[][2] = {{512, 512}, {512, 256}, {256, 256}, {128, 128}, {64, 64}};  // [O, I]
  static const struct {
    dnnl_format_tag_t tag;
    dnnl_data_type_t type;
    const char *name;
  } layouts[] = {
      {dnnl_AcdB32a2b, dnnl_bf16, "AcdB32a2b bf16"},     {dnnl_AcdB64a2b, dnnl_bf16, "AcdB64a2b bf16"},
      {dnnl_ABcd8a16b2a, dnnl_bf16, "ABcd8a16b2a bf16"}, {dnnl_ABcd16a16b2a, dnnl_bf16, "ABcd16a16b2a bf16"},
      {dnnl_Acdb32a, dnnl_f32, "Acdb32a fp32"},          {dnnl_ABcd16a16b, dnnl_f32, "ABcd16a16b fp32"},
  };
  printf("3x3 weight oihw fp32 -> layout: one reorder / two (via ohwi), ms, best of %d, cold caches\n", reps);
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
      dnnl_dims_t dims = {shapes[s][0], shapes[s][1], 3, 3};
      size_t n = (size_t)shapes[s][0] * shapes[s][1] * 9;
      dnnl_memory_desc_t plain, dst, via;
      CHECK(dnnl_memory_desc_init_by_tag(&plain, 4, dims, dnnl_f32, dnnl_oihw));
      CHECK(dnnl_memory_desc_init_by_tag(&dst, 4, dims, layouts[l].type, layouts[l].tag));
      CHECK(dnnl_memory_desc_init_by_tag(&via, 4, dims, layouts[l].type, dnnl_ohwi));
      float *w = xmalloc(n * sizeof(float));  // [O, I, 3, 3]
      for (size_t i = 0; i < n; i++) w[i] = (float)rand() / (float)RAND_MAX - 0.5f;
      void *out = xmalloc(dnnl_memory_desc_get_size(&dst)), *mid = xmalloc(dnnl_memory_desc_get_size(&via));
      dnnl_primitive_t one = reorder_new(&plain, &dst), first = reorder_new(&plain, &via),
                       second = reorder_new(&via, &dst);
      double t_one = 1e30, t_two = 1e30;
      for (int r = 0; r < reps; r++) {
        flush(junk);
        double t = now_s();
        reorder_exec(one, &plain, w, &dst, out);
        t = now_s() - t;
        if (t < t_one) t_one = t;
        flush(junk);
        t = now_s();
        reorder_exec(first, &plain, w, &via, mid);
        reorder_exec(second, &via, mid, &dst, out);
        t = now_s() - t;
        if (t < t_two) t_two = t;
      }
      printf("%4dx%4dx3x3  %-18s %7.3f / %7.3f ms  (two steps %.2fx as fast)\n", shapes[s][0], shapes[s][1],
             layouts[l].name, 1e3 * t_one, 1e3 * t_two, t_one / t_two);
      CHECK(dnnl_primitive_destroy(one));
      CHECK(dnnl_primitive_destroy(first));
      CHECK(dnnl_primitive_destroy(second));
      free(w), free(out), free(mid);
    }
  free(junk);
  return 0;
}
