// step_compare: the pieces of a `detr step` comparison between two devices (tools/gpu_check.sh),
// with no Python: a random batch file, a weights file both runs load (so both start from the same
// bits: an initialisation drawn on the GPU differs from the CPU's by the device's logf ulps), and
// the comparison of two `detr step` outputs.
//
//   step_compare batch   --out B.safetensors [--batch 2] [--hw 128x160] [--classes 7] [--boxes 3] [--seed 1]
//                        [--target-seed S]   (targets from their own seed; default: --seed)
//                        [--noise EPS] [--noise-seed K]  (the same batch, images plus N(0, EPS^2) noise)
//   step_compare weights --config PRESET [--set key=value ...] [--seed 1] --out W.safetensors
//   step_compare diff    REF.safetensors TEST.safetensors [--tol 1e-3] [--spread NOISY.safetensors ...]
//
// diff compares every tensor of REF with TEST's (the same names, dtypes and shapes): integer ones
// (the matches, ENACT's regions) must be equal; float ones to max|test - ref| / max(1, max|ref|)
// <= tol, or within 4 x the reference's own spread (NOISY: the same step on REF's device with the
// images moved by 1e-5; several draws), reported per group (outputs, losses, gradients, ENACT entropy) with
// the worst tensor.
// The verdict follows the order of the computation - ENACT entropy, ENACT regions, outputs,
// matching, losses and gradients: the first group that disagrees decides. Exit status: 0 agree; 1 a
// float group is off by more than tol (or the files differ in names, dtypes or shapes); 3 diverged:
// a discrete choice differs (ENACT's regions or a matching) while everything before it agrees - a
// near-tie that rounding can tip either way, after which the values are not comparable; 2 usage or
// unreadable files. The batch has padding (image b > 0: its right third), boxes inside
// the valid part, labels in [0, classes).
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/setup.h"
#include "core/runtime.h"
#include "nn/detr.h"
#include "nn/model_io.h"
#include "tensor/safetensors.h"

static int usage(void) {
  fprintf(stderr,
          "usage: step_compare batch --out B.safetensors [--batch 2] [--hw HxW] [--classes 7] [--boxes 3] [--seed 1]\n"
          "                          [--target-seed S] [--noise EPS] [--noise-seed K]\n"
          "       step_compare weights --config PRESET [--set key=value ...] [--seed 1] --out W.safetensors\n"
          "       step_compare diff REF.safetensors TEST.safetensors [--tol 1e-3] [--spread NOISY.safetensors ...]\n");
  return 2;
}

static const char *arg_value(int argc, char **argv, const char *flag, const char *fallback) {
  for (int i = 2; i + 1 < argc; i++)
    if (!strcmp(argv[i], flag)) return argv[i + 1];
  return fallback;
}

static int cmd_batch(int argc, char **argv) {
  const char *out = arg_value(argc, argv, "--out", NULL);
  int B = atoi(arg_value(argc, argv, "--batch", "2")), classes = atoi(arg_value(argc, argv, "--classes", "7"));
  int boxes = atoi(arg_value(argc, argv, "--boxes", "3")), H = 0, W = 0;
  unsigned long long seed = strtoull(arg_value(argc, argv, "--seed", "1"), NULL, 10);
  if (sscanf(arg_value(argc, argv, "--hw", "128x160"), "%dx%d", &H, &W) != 2 || !out || B < 1 || B > 64 ||
      classes < 1 || boxes < 0 || boxes > 100 || H < 32 || W < 32)
    return usage();
  Rng rng = rng_make(seed);
  Tensor *images = tensor_new(DEVICE_CPU, SHAPE(B, 3, H, W));
  tensor_normal_(images, &rng, 0.0f, 1.0f);
  double noise = atof(arg_value(argc, argv, "--noise", "0"));
  if (noise > 0) {  // the same batch, images moved by N(0, noise^2) from a stream of their own
    Tensor *delta = tensor_new(DEVICE_CPU, SHAPE(B, 3, H, W));
    Rng noise_rng = rng_make(strtoull(arg_value(argc, argv, "--noise-seed", "0"), NULL, 10) ^ 0x6e6f697365ull);
    tensor_normal_(delta, &noise_rng, 0.0f, (float)noise);
    float *img = images->data;  // CPU tensors
    const float *d = delta->data;
    for (int64_t i = 0; i < images->numel; i++) img[i] += d[i];
    tensor_release(delta);
  }
  rng = rng_make(strtoull(arg_value(argc, argv, "--target-seed", arg_value(argc, argv, "--seed", "1")), NULL, 10) +
                 0x9e3779b97f4a7c15ull);
  uint8_t *mask = calloc((size_t)B * (size_t)H * (size_t)W, 1);
  float *bx = malloc(sizeof(float) * 4 * (size_t)(boxes ? boxes : 1));
  int64_t *lb = malloc(sizeof(int64_t) * (size_t)(boxes ? boxes : 1));
  if (!mask || !bx || !lb) return 2;
  StWriter *w = st_writer_new();
  for (int b = 0; b < B; b++) {
    int valid_w = b ? W - W / 3 : W;  // image b > 0: the right third is padding
    for (int y = 0; y < H; y++)
      for (int x = valid_w; x < W; x++) mask[((size_t)b * H + y) * W + x] = 1;
    float frac = (float)valid_w / (float)W;  // boxes are normalised by the padded size
    for (int k = 0; k < boxes; k++) {
      float cw = (0.1f + 0.3f * rng_next_uniform(&rng)) * frac, ch = 0.1f + 0.3f * rng_next_uniform(&rng);
      float cx = cw / 2 + (frac - cw) * rng_next_uniform(&rng), cy = ch / 2 + (1.0f - ch) * rng_next_uniform(&rng);
      bx[4 * k] = cx, bx[4 * k + 1] = cy, bx[4 * k + 2] = cw, bx[4 * k + 3] = ch;
      lb[k] = (int64_t)rng_next_below(&rng, (uint64_t)classes);
    }
    char name[64];
    snprintf(name, sizeof name, "targets.%d.boxes", b);
    st_writer_add(w, name, ST_F32, 2, (int64_t[]){boxes, 4}, bx);
    snprintf(name, sizeof name, "targets.%d.labels", b);
    st_writer_add(w, name, ST_I64, 1, (int64_t[]){boxes}, lb);
  }
  st_writer_add_tensor(w, "images", images);
  st_writer_add(w, "mask", ST_U8, 3, (int64_t[]){B, H, W}, mask);
  char err[512];
  int rc = st_writer_save(w, out, err, sizeof err);
  if (rc) fprintf(stderr, "step_compare batch: %s\n", err);
  st_writer_free(w);
  tensor_release(images);
  free(mask), free(bx), free(lb);
  return rc ? 2 : 0;
}

static int cmd_weights(int argc, char **argv) {
  const char *config = arg_value(argc, argv, "--config", NULL), *out = arg_value(argc, argv, "--out", NULL);
  unsigned long long seed = strtoull(arg_value(argc, argv, "--seed", "1"), NULL, 10);
  CliList sets = {0};
  for (int i = 2; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--set") && sets.count < CLI_MAX_LIST) sets.items[sets.count++] = argv[++i];
  if (!config || !out) return usage();
  char err[1024];
  DetrConfig cfg;
  if (setup_model_config(config, &sets, &cfg, err, sizeof err)) {
    fprintf(stderr, "step_compare weights: %s\n", err);
    return 2;
  }
  DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(m, seed);
  StWriter *w = st_writer_new();
  params_save(&m->params, w, "");
  int rc = st_writer_save(w, out, err, sizeof err);
  if (rc) fprintf(stderr, "step_compare weights: %s\n", err);
  st_writer_free(w);
  detr_model_free(m);
  return rc ? 2 : 0;
}

// --- diff ---

// Float groups and integer kinds in the order the step computes them.
enum { G_ENTROPY, G_OUTPUT, G_LOSS, G_GRAD, G_OTHER, G_COUNT };
static const char *GROUP_NAMES[G_COUNT] = {"enact entropy", "outputs", "losses", "gradients", "other"};

static int group_of(const char *name) {
  if (!strncmp(name, "pred_", 5) || !strncmp(name, "aux.", 4)) return G_OUTPUT;
  if (!strncmp(name, "loss.", 5)) return G_LOSS;
  if (!strncmp(name, "grad.", 5)) return G_GRAD;
  if (!strncmp(name, "enact.", 6)) return G_ENTROPY;
  return G_OTHER;
}

static double rel_error(const float *a, const float *ref, int64_t n) {
  double diff = 0.0, scale = 1.0;
  for (int64_t i = 0; i < n; i++) {
    if (isfinite(ref[i]) && fabs((double)ref[i]) > scale) scale = fabs((double)ref[i]);
    if (a[i] == ref[i] || (isnan(a[i]) && isnan(ref[i]))) continue;
    double d = fabs((double)a[i] - (double)ref[i]);
    if (!isfinite(d)) d = INFINITY;
    if (d > diff) diff = d;
  }
  return diff / scale;
}

// A float tensor passes when its error is within tol, or within SPREAD_FACTOR times the reference's
// own spread: how far the reference's tensor moves when its input moves by 1e-5 (each --spread: the
// same step on the same device from `batch --noise 1e-5 --noise-seed K`; the spread is the largest
// move over the draws). Some gradients are ill-conditioned in float32: a frozen-BN ResNet-50's conv
// weight gradients at random initialisation move by up to 1e-2 under such noise (ReLUs near 0
// flip), and another device's rounding is one more such perturbation. One draw estimates a tensor's
// spread roughly (GPU error / one draw's spread reached 6.2 on detr-r50 with ENACT, docs/cuda.md):
// hence several draws and the factor 4. A spread run whose matching or ENACT regions differ from
// the reference's is not used (its values are not comparable).
#define SPREAD_FACTOR 4.0
#define MAX_SPREADS 8

static int cmd_diff(int argc, char **argv) {
  if (argc < 4) return usage();
  double tol = atof(arg_value(argc, argv, "--tol", "1e-3"));
  char err[1024];
  StFile *ref = st_open(argv[2], err, sizeof err), *test = ref ? st_open(argv[3], err, sizeof err) : NULL;
  if (!ref || !test) {
    fprintf(stderr, "step_compare diff: %s\n", err);
    if (ref) st_close(ref);
    return 2;
  }
  StFile *spreads[MAX_SPREADS];
  int n_spreads = 0, n_given = 0;
  for (int i = 4; i + 1 < argc; i++) {
    if (strcmp(argv[i], "--spread")) continue;
    n_given++;
    StFile *f = n_spreads < MAX_SPREADS ? st_open(argv[i + 1], err, sizeof err) : NULL;
    if (!f) {
      fprintf(stderr, "step_compare diff: %s\n", n_spreads < MAX_SPREADS ? err : "more than 8 --spread files");
      for (int k = 0; k < n_spreads; k++) st_close(spreads[k]);
      st_close(ref), st_close(test);
      return 2;
    }
    // A draw whose discrete choices differ from the reference's is not comparable: left out.
    bool same_choices = true;
    for (int k = 0; k < st_count(ref) && same_choices; k++) {
      const StEntry *r = st_entry(ref, k), *d = st_find(f, r->name);
      if (r->dtype != ST_F32 && (!d || d->nbytes != r->nbytes || memcmp(st_data(ref, r), st_data(f, d), r->nbytes))) {
        printf("  spread run %s: %s differs from the reference's: not used\n", argv[i + 1], r->name);
        same_choices = false;
      }
    }
    if (same_choices) spreads[n_spreads++] = f;
    else st_close(f);
  }
  // Per group: the largest error (tensor, spread) and the tensor furthest over its allowance.
  double worst[G_COUNT] = {0}, worst_spread[G_COUNT] = {0}, over_ratio[G_COUNT] = {0};
  double over_err[G_COUNT] = {0}, over_spread[G_COUNT] = {0};
  const char *worst_name[G_COUNT] = {0}, *over_name[G_COUNT] = {0};
  int counts[G_COUNT] = {0}, by_spread[G_COUNT] = {0}, mismatched = 0, regions_differ = 0, matches_differ = 0;
  for (int i = 0; i < st_count(ref); i++) {
    const StEntry *r = st_entry(ref, i), *t = st_find(test, r->name);
    if (!t || t->dtype != r->dtype || t->ndim != r->ndim || t->numel != r->numel) {
      printf("  %s: %s\n", r->name, !t ? "missing" : "dtype or shape differs");
      mismatched++;
      continue;
    }
    if (r->dtype == ST_F32) {
      int g = group_of(r->name);
      const float *rd = st_data(ref, r), *td = st_data(test, t);
      double e = rel_error(td, rd, r->numel), sp = 0.0;
      for (int k = 0; k < n_spreads; k++) {
        const StEntry *d = st_find(spreads[k], r->name);
        if (d && d->dtype == ST_F32 && d->numel == r->numel)
          sp = fmax(sp, rel_error(st_data(spreads[k], d), rd, r->numel));
      }
      double allowed = fmax(tol, SPREAD_FACTOR * sp);
      if (e > tol && e <= allowed) by_spread[g]++;
      counts[g]++;
      if (e > worst[g] || !worst_name[g]) worst[g] = e, worst_spread[g] = sp, worst_name[g] = r->name;
      if (!(e <= allowed) && (!over_name[g] || e / allowed > over_ratio[g]))
        over_ratio[g] = e / allowed, over_err[g] = e, over_spread[g] = sp, over_name[g] = r->name;
    } else if (memcmp(st_data(ref, r), st_data(test, t), r->nbytes) != 0) {
      bool region = !strncmp(r->name, "enact.", 6);
      printf("  %s: differs (%s)\n", r->name, region ? "ENACT's regions" : "the matching");
      if (region) regions_differ++;
      else matches_differ++;
    }
  }
  for (int i = 0; i < st_count(test); i++)
    if (!st_find(ref, st_entry(test, i)->name)) {
      printf("  %s: not in the reference\n", st_entry(test, i)->name);
      mismatched++;
    }
  bool over[G_COUNT] = {false};
  for (int g = 0; g < G_COUNT; g++) {
    if (!counts[g]) continue;
    over[g] = over_name[g] != NULL;
    printf("  %-14s %4d tensors, max relative error %.3g (%s", GROUP_NAMES[g], counts[g], worst[g], worst_name[g]);
    if (n_spreads) printf("; its spread %.3g", worst_spread[g]);
    printf(")\n");
    if (by_spread[g])
      printf("  %-14s %4d over the tolerance but within %g x their spread\n", "", by_spread[g], SPREAD_FACTOR);
    if (over[g])
      printf("  %-14s over the limit: %s, error %.3g, spread %.3g (%.2g x its allowance)\n", "", over_name[g],
             over_err[g], over_spread[g], over_ratio[g]);
  }
  // The first disagreement in the order of the computation decides.
  const char *verdict = "PASS";
  int rc = 0;
  if (mismatched) verdict = "FAIL (the files hold different tensors)", rc = 1;
  else if (over[G_ENTROPY]) verdict = "FAIL (ENACT entropy)", rc = 1;
  else if (regions_differ) verdict = "DIVERGED (ENACT's regions differ, the entropy agrees)", rc = 3;
  else if (over[G_OUTPUT]) verdict = "FAIL (outputs)", rc = 1;
  else if (matches_differ) verdict = "DIVERGED (the matching differs, the outputs agree)", rc = 3;
  else if (over[G_LOSS] || over[G_GRAD] || over[G_OTHER]) verdict = "FAIL (losses or gradients)", rc = 1;
  printf("step_compare: %s (tolerance %.3g", verdict, tol);
  if (n_given) printf(", or %g x the spread of %d of %d noise draws", SPREAD_FACTOR, n_spreads, n_given);
  printf(")\n");
  for (int k = 0; k < n_spreads; k++) st_close(spreads[k]);
  st_close(ref);
  st_close(test);
  return rc;
}

int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  if (argc < 2) return usage();
  if (!strcmp(argv[1], "batch")) return cmd_batch(argc, argv);
  if (!strcmp(argv[1], "weights")) return cmd_weights(argc, argv);
  if (!strcmp(argv[1], "diff")) return cmd_diff(argc, argv);
  return usage();
}
