// Serving latency through the public C API only (include/detr.h), as an application sees it:
// detr_open_weights with the thread option, then detr_detect_rgb on one image (latency) and
// detr_detect_batch on --batch copies of it (images/s). The image is seeded noise of --width x
// --height pixels, or --image, a picture as binary PPM (P6, 8 bits; its own size: --width and
// --height are ignored; bench/serve_export_main.py writes one): with ENACT the work depends on the
// picture (its cluster count), and noise is not a picture. The model's input size is set to the
// image's (options.image_size, max_size), so that the val resize leaves it as it is: the time is
// the forward, the normalisation and the post-processing.
// Prints one JSON line (bench/serve_compare.sh collects them).
//   bench_serve --weights W.safetensors --config detr-r50 --width 1066 --height 800 --threads 2 [--reps 5]
//               [--batch 4] [--set key=value ...]
//   bench_serve --checkpoint C.safetensors ...   (a detr-c checkpoint: its own config)
//   bench_serve --checkpoint C.safetensors --image picture.ppm ...
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "bench/bench_util.h"
#include "include/detr.h"

#define MAX_SETS 32

typedef struct {
  const char *weights, *config, *checkpoint, *image;
  int width, height, threads, reps, batch;
  const char *sets[MAX_SETS + 1];
} Args;

static int parse(int argc, char **argv, Args *a) {
  *a = (Args){.config = "detr-r50", .width = 1066, .height = 800, .threads = 0, .reps = 5, .batch = 4};
  int n_sets = 0;
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) return fprintf(stderr, "bench_serve: %s needs a value\n", k), -1;
    i++;
    if (!strcmp(k, "--weights")) a->weights = v;
    else if (!strcmp(k, "--checkpoint")) a->checkpoint = v;
    else if (!strcmp(k, "--image")) a->image = v;
    else if (!strcmp(k, "--config")) a->config = v;
    else if (!strcmp(k, "--width")) a->width = atoi(v);
    else if (!strcmp(k, "--height")) a->height = atoi(v);
    else if (!strcmp(k, "--threads")) a->threads = atoi(v);
    else if (!strcmp(k, "--reps")) a->reps = atoi(v);
    else if (!strcmp(k, "--batch")) a->batch = atoi(v);
    else if (!strcmp(k, "--set") && n_sets < MAX_SETS) a->sets[n_sets++] = v;
    else return fprintf(stderr, "bench_serve: unknown argument %s\n", k), -1;
  }
  a->sets[n_sets] = NULL;
  if (!a->weights == !a->checkpoint || a->width < 1 || a->height < 1 || a->reps < 1 || a->batch < 0 || a->batch > 64)
    return fprintf(stderr, "bench_serve: --weights or --checkpoint; sizes, --reps >= 1, --batch 0..64\n"), -1;
  return 0;
}

// Skips whitespace and # comments (each to the end of its line) before a PPM header field.
static void skip_space(FILE *f) {
  int c;
  while ((c = fgetc(f)) != EOF) {
    if (c == '#') {
      while ((c = fgetc(f)) != '\n' && c != EOF) {}
    } else if (!isspace(c)) {
      ungetc(c, f);
      return;
    }
  }
}

// A binary PPM (P6, maxval 255) as RGB bytes [h, w, 3]; NULL (with a message) when it is not one.
static unsigned char *read_ppm(const char *path, int *w, int *h) {
  FILE *f = fopen(path, "rb");
  if (!f) return fprintf(stderr, "bench_serve: cannot open %s\n", path), NULL;
  int v[3] = {0};  // width, height, maxval
  bool ok = fgetc(f) == 'P' && fgetc(f) == '6';
  for (int i = 0; ok && i < 3; i++) {
    skip_space(f);
    ok = fscanf(f, "%d", &v[i]) == 1;
  }
  // One whitespace byte ends the header; the pixels follow.
  ok = ok && v[0] > 0 && v[1] > 0 && v[0] <= 32768 && v[1] <= 32768 && v[2] == 255 && isspace(fgetc(f));
  size_t size = ok ? (size_t)v[0] * (size_t)v[1] * 3 : 0;
  unsigned char *rgb = ok ? malloc(size) : NULL;
  if (rgb && fread(rgb, 1, size, f) != size) {
    free(rgb);
    rgb = NULL;
  }
  fclose(f);
  if (!rgb) return fprintf(stderr, "bench_serve: %s is not a binary PPM (P6, maxval 255)\n", path), NULL;
  *w = v[0], *h = v[1];
  return rgb;
}

// The median of reps timings of one call (after one warm-up: oneDNN's primitives are made then).
static double time_detect(detr_model *m, const detr_image *img, int n, int reps) {
  double *t = malloc((size_t)reps * sizeof(double));
  detr_result *r[64];
  for (int i = -1; i < reps; i++) {
    double t0 = now();
    detr_status st = n == 1 ? detr_detect_rgb(m, img->rgb, img->size, img->width, img->height, 0.5, r)
                            : detr_detect_batch(m, img, n, 0.5, r);
    if (st != DETR_OK) {
      fprintf(stderr, "bench_serve: %s: %s\n", detr_status_name(st), detr_last_error());
      exit(1);
    }
    if (i >= 0) t[i] = now() - t0;
    for (int k = 0; k < n; k++) detr_result_free(r[k]);
  }
  qsort(t, (size_t)reps, sizeof(double), cmp_double);
  double med = t[reps / 2];
  free(t);
  return med;
}

int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Args a;
  if (parse(argc, argv, &a)) return 2;
  unsigned char *rgb = NULL;
  if (a.image && !(rgb = read_ppm(a.image, &a.width, &a.height))) return 2;
  detr_options o = detr_options_default();
  o.threads = a.threads;
  o.sets = a.sets;
  // The val resize leaves the image as it is: shortest side image_size, longest max_size.
  o.image_size = a.width < a.height ? a.width : a.height;
  o.max_size = a.width < a.height ? a.height : a.width;
  detr_model *m;
  detr_status st =
      a.checkpoint ? detr_open_checkpoint(a.checkpoint, &o, &m) : detr_open_weights(a.weights, a.config, &o, &m);
  if (st != DETR_OK) {
    fprintf(stderr, "bench_serve: %s: %s\n", detr_status_name(st), detr_last_error());
    return 1;
  }
  size_t size = (size_t)a.width * (size_t)a.height * 3;
  if (!rgb) {
    rgb = malloc(size);
    uint64_t s = 12345;
    for (size_t i = 0; i < size; i++) {  // xorshift noise: every value of a byte
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      rgb[i] = (unsigned char)(s >> 56);
    }
  }
  detr_image imgs[64];
  for (int i = 0; i < 64; i++) imgs[i] = (detr_image){rgb, size, a.width, a.height};
  double one = time_detect(m, imgs, 1, a.reps);
  double batch = a.batch > 0 ? time_detect(m, imgs, a.batch, a.reps) : 0;
  printf(
      "{\"impl\": \"detr-c\", \"config\": \"%s\", \"width\": %d, \"height\": %d, \"threads\": %d, "
      "\"latency_s\": %.6f, \"batch\": %d, \"batch_s\": %.6f, \"images_per_s\": %.3f}\n",
      a.checkpoint ? a.checkpoint : a.config, a.width, a.height, a.threads, one, a.batch, batch,
      batch > 0 ? a.batch / batch : 0.0);
  free(rgb);
  detr_close(m);
  return 0;
}
