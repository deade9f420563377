// Reference fixtures: detr-c against files the official PyTorch code wrote once
// (tools/write_reference_fixtures.py; tests/fixtures/reference/README.md lists them, the reference
// commits and how they were checked), as llm.c checks train_gpt2.c against PyTorch's debug state. Each
// file holds a tiny model's weights under the official names, a padded batch of two non-square images,
// and the float32 reference's outputs of every decoder layer, matches, loss terms, the gradient of every
// trainable parameter and the post-processed detections for non-square original sizes. The test builds
// the model from the file's config, loads the weights with the loader `detr step --weights` uses
// (params_load_file, strict: every parameter must be in the file), runs `detr step --no-dropout`'s
// forward, loss and backward (cli/cmd_step.c) and post-processing, and compares. No Python, no checkout.
//
// Tolerances, measured (tests/fixtures/reference/README.md has each file's numbers). The error is the
// parity tools' max-relative one, max |a - b| / max |b| per tensor. Outputs, losses and detections are
// within 7e-7 of the float32 reference, gradients within 8.2e-6, about what the float32 reference itself
// is from float64 (up to 7.5e-6 on those tensors): two float32 programs summing in different orders.
// TOL_OUT and TOL_GRAD, 5e-5, leave 4x for other CPUs' kernels (oneDNN held to AVX-512, AVX or SSE4.1:
// the same margins; on AVX2 `detr` fails on a oneDNN bug, README.md) and sit far below what a wrong
// formula moves: a softmax over the wrong axis, a dropped ENACT term or swapped x/y scales move outputs
// or boxes by 4e-3 to 1. A tensor whose float32 reference is d > 1e-6 from
// float64 is allowed 8 d: Conditional DETR's second decoder layer's self-attention projection gradients
// are ill-conditioned (d = 1e-5 to 7e-4; detr-c 2e-5 to 5e-4). A gradient 0 in exact arithmetic (the
// first decoder layer's self-attention projections, key biases) is rounding noise on both sides and must
// stay below TOL_NOISE of its layer's gradient scale (parity_step.py's drop_zero_gradients rule).
#define _DEFAULT_SOURCE  // mkstemp
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/runtime.h"
#include "nn/detr.h"
#include "nn/model_io.h"
#include "nn/postprocess.h"
#include "tensor/safetensors.h"
#include "train/step_batch.h"

#ifndef DETR_REFERENCE_DIR
#error "DETR_REFERENCE_DIR (tests/CMakeLists.txt): the folder of the reference fixtures"
#endif

#define TOL_OUT 5e-5    // outputs, losses, detections' scores and boxes: max |a - b| / max |b|
#define TOL_GRAD 5e-5   // each gradient, the same measure
#define TOL_NOISE 1e-5  // a gradient 0 in exact arithmetic: max |a| / its layer's gradient scale (parity_step.py)

typedef struct {
  StFile *f;
  DetrConfig cfg;
  DetrModel *model;
  int64_t B, H, W;
  Tensor *images;  // [B, H, W, 3]
  uint8_t *mask;   // [B, H, W]
  DetrTarget targets[2];
  float *boxes[2];
  int64_t *labels[2];
  DetrOutput out;
  CriterionResult loss;
  int compared;        // tensors of the file compared: every non-weight one must be
  double worst_share;  // the largest error as a share of what it is allowed
} Fixture;

static const StEntry *entry(const Fixture *x, const char *name, StDtype dtype) {
  const StEntry *e = st_find(x->f, name);
  ck_assert_msg(e != NULL, "%s: no tensor %s", st_path(x->f), name);
  ck_assert_msg(e->dtype == dtype, "%s: %s is %s, expected %s", st_path(x->f), name, st_dtype_name(e->dtype),
                st_dtype_name(dtype));
  return e;
}

// A copy of the file's tensor (the file's offsets need not be aligned for its type); numel checked.
static void *copy_of(const Fixture *x, const char *name, StDtype dtype, int64_t numel) {
  const StEntry *e = entry(x, name, dtype);
  ck_assert_msg((int64_t)(e->nbytes / st_dtype_size(dtype)) == numel, "%s: %s has %lld values, expected %lld",
                st_path(x->f), name, (long long)(e->nbytes / st_dtype_size(dtype)), (long long)numel);
  void *p = detr_malloc(e->nbytes ? e->nbytes : 1, "test_reference copy");
  memcpy(p, st_data(x->f, e), e->nbytes);
  return p;
}

// The config: the preset, then each key=value of the file's "sets".
static void load_config(Fixture *x) {
  const char *preset = st_metadata(x->f, "preset"), *sets = st_metadata(x->f, "sets");
  ck_assert_msg(preset && sets, "%s: no preset or sets in the metadata", st_path(x->f));
  ck_assert_msg(detr_config_preset(preset, &x->cfg) == 0, "%s: unknown preset %s", st_path(x->f), preset);
  char *copy = detr_strdup(sets, "test_reference sets"), *save = NULL, err[256];
  for (char *kv = strtok_r(copy, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
    char *eq = strchr(kv, '=');
    ck_assert_msg(eq != NULL, "%s: sets: '%s' is not key=value", st_path(x->f), kv);
    *eq = 0;
    ck_assert_msg(detr_config_set(&x->cfg, kv, eq + 1, err, sizeof err) == 0, "%s: detr_config_set: %s", st_path(x->f),
                  err);
  }
  free(copy);
  ck_assert_msg(detr_config_validate(&x->cfg, err, sizeof err) == 0, "%s: %s", st_path(x->f), err);
}

// The weights: the file's BF16 tensors (the generator rounded every weight to bfloat16 before the
// reference ran, so they are exact), widened to F32 into a temporary weights file that params_load_file,
// the loader of `detr step --weights`, reads: strict, so every parameter must be in the file.
static void load_weights(Fixture *x) {
  StWriter *w = st_writer_new();
  int n = 0;
  for (int i = 0; i < st_count(x->f); i++) {
    const StEntry *e = st_entry(x->f, i);
    if (e->dtype != ST_BF16) continue;
    const uint8_t *src = st_data(x->f, e);
    float *f32 = detr_malloc((size_t)(e->numel ? e->numel : 1) * sizeof(float), "test_reference weights");
    for (int64_t k = 0; k < e->numel; k++) {
      uint32_t bits = (uint32_t)src[2 * k] << 16 | (uint32_t)src[2 * k + 1] << 24;  // little-endian bf16
      memcpy(&f32[k], &bits, sizeof bits);
    }
    st_writer_add(w, e->name, ST_F32, e->ndim, e->shape, f32);
    free(f32);
    n++;
  }
  char path[] = "/tmp/detr-test-reference-XXXXXX", err[4096];
  int fd = mkstemp(path);
  ck_assert_msg(fd >= 0, "mkstemp %s: %s", path, strerror(errno));
  close(fd);
  int saved = st_writer_save(w, path, err, sizeof err);
  st_writer_free(w);
  ck_assert_msg(saved == 0, "%s: st_writer_save of its %d weights: %s", st_path(x->f), n, err);
  int loaded = params_load_file(&x->model->params, path, err, sizeof err);
  unlink(path);
  ck_assert_msg(loaded == 0, "%s: params_load_file of its %d weights: %s", st_path(x->f), n, err);
}

// The batch: pixels (u8 - 128) / 32 (exact), channels last; padding from each image's valid size
// (bottom and right); targets.
static void load_batch(Fixture *x) {
  const StEntry *e = entry(x, "images_u8", ST_U8);
  ck_assert_msg(e->ndim == 4 && e->shape[1] == 3 && e->shape[0] == 2, "%s: images_u8 must be [2, 3, H, W]",
                st_path(x->f));
  x->B = e->shape[0], x->H = e->shape[2], x->W = e->shape[3];
  int64_t B = x->B, H = x->H, W = x->W, HW = H * W;
  const uint8_t *u8 = st_data(x->f, e);
  float *pixels = detr_malloc((size_t)(B * HW * 3) * sizeof(float), "test_reference pixels");  // [B, H, W, 3]
  for (int64_t b = 0; b < B; b++)
    for (int64_t c = 0; c < 3; c++)
      for (int64_t i = 0; i < HW; i++)
        pixels[(b * HW + i) * 3 + c] = ((float)u8[(b * 3 + c) * HW + i] - 128.0f) / 32.0f;
  x->images = tensor_from_host(DEVICE_CPU, SHAPE(B, H, W, 3), pixels);
  free(pixels);
  int64_t *valid = copy_of(x, "image_sizes", ST_I64, 2 * B);  // [B, 2]: (h, w)
  x->mask = detr_malloc((size_t)(B * HW), "test_reference mask");
  for (int64_t b = 0; b < B; b++)
    for (int64_t i = 0; i < HW; i++) x->mask[b * HW + i] = i / W >= valid[2 * b] || i % W >= valid[2 * b + 1];
  free(valid);
  char name[64];
  for (int64_t b = 0; b < B; b++) {
    snprintf(name, sizeof name, "targets.%lld.labels", (long long)b);
    int64_t n = (int64_t)entry(x, name, ST_I64)->shape[0];
    x->labels[b] = copy_of(x, name, ST_I64, n);
    snprintf(name, sizeof name, "targets.%lld.boxes", (long long)b);
    x->boxes[b] = copy_of(x, name, ST_F32, 4 * n);
    x->targets[b] = (DetrTarget){.n = n, .boxes = x->boxes[b], .labels = x->labels[b]};
  }
}

// The fixture's model and batch, then `detr step --no-dropout`'s forward, loss and backward.
static void run_fixture(Fixture *x, const char *name) {
  char path[512], err[4096];
  snprintf(path, sizeof path, "%s/%s.safetensors", DETR_REFERENCE_DIR, name);
  memset(x, 0, sizeof *x);
  x->f = st_open(path, err, sizeof err);
  ck_assert_msg(x->f != NULL, "st_open: %s", err);
  load_config(x);
  x->model = detr_model_create(&x->cfg, DEVICE_CPU);
  detr_model_init(x->model, 0);
  load_weights(x);
  load_batch(x);
  Rng dropout_rng = rng_make(0xd40bu);
  NnCtx ctx = {.training = false, .dropout_rng = &dropout_rng};
  ck_assert_msg(step_forward_backward(x->model, &ctx, x->images, x->mask, x->targets, x->B, &x->out, &x->loss, err,
                                      sizeof err) == 0,
                "%s: step_forward_backward: %s", path, err);
}

static void free_fixture(Fixture *x) {
  criterion_result_free(&x->loss);
  detr_output_free(&x->out);
  for (int b = 0; b < 2; b++) free(x->boxes[b]), free(x->labels[b]);
  free(x->mask);
  tensor_release(x->images);
  detr_model_free(x->model);
  st_close(x->f);
}

// max |a - b| / max |b|, the parity tools' max-relative error.
static double max_rel(const float *a, const float *b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; i++) {
    diff = fmax(diff, fabs((double)a[i] - b[i]));
    scale = fmax(scale, fabs((double)b[i]));
  }
  return diff / fmax(scale, 1e-30);
}

// The value of name in the metadata list `key` ("name=value name=value ..."), or -1 when absent.
static double listed_value(const Fixture *x, const char *key, const char *name) {
  const char *list = st_metadata(x->f, key);
  size_t n = strlen(name);
  for (const char *p = list ? strstr(list, name) : NULL; p; p = strstr(p + 1, name))
    if ((p == list || p[-1] == ' ') && p[n] == '=') return atof(p + n + 1);
  return -1;
}

// Compares n floats with the fixture's tensor `name`; returns the error, asserted within tol or, for
// a tensor whose float32 reference is d from float64 (the file's "float64_distance"), within 8 d.
static double expect_close(Fixture *x, const char *name, const float *ours, int64_t n, double tol) {
  float *ref = copy_of(x, name, ST_F32, n);
  double e = max_rel(ours, ref, n), allowed = fmax(tol, 8 * listed_value(x, "float64_distance", name));
  free(ref);
  x->compared++;
  x->worst_share = fmax(x->worst_share, e / allowed);
  ck_assert_msg(e <= allowed, "%s: %s: max-relative error %.3e > %.1e", st_path(x->f), name, e, allowed);
  return e;
}

static double expect_tensor(Fixture *x, const char *name, const Tensor *t, double tol) {
  return expect_close(x, name, t->data, t->numel, tol);
}

// The last and earlier decoder layers' logits and boxes, the matches.
static double compare_outputs(Fixture *x) {
  double worst = 0;
  char name[96];
  const DetrOutput *o = &x->out;
  worst = fmax(worst, expect_tensor(x, "pred_logits", o->layers[o->n_layers - 1].logits, TOL_OUT));
  worst = fmax(worst, expect_tensor(x, "pred_boxes", o->layers[o->n_layers - 1].boxes, TOL_OUT));
  for (int l = 0; l < o->n_layers - 1; l++) {
    snprintf(name, sizeof name, "aux.%d.pred_logits", l);
    worst = fmax(worst, expect_tensor(x, name, o->layers[l].logits, TOL_OUT));
    snprintf(name, sizeof name, "aux.%d.pred_boxes", l);
    worst = fmax(worst, expect_tensor(x, name, o->layers[l].boxes, TOL_OUT));
  }
  for (int b = 0; b < x->loss.n_images; b++) {
    const DetrMatch *m = &x->loss.matches[b];
    snprintf(name, sizeof name, "match.%d", b);
    int64_t *ref = copy_of(x, name, ST_I64, 2 * m->n);  // [n, 2]: query, target
    for (int64_t k = 0; k < m->n; k++)
      ck_assert_msg(ref[2 * k] == m->query[k] && ref[2 * k + 1] == m->target[k],
                    "%s: %s[%lld]: detr-c matches query %lld to target %lld, the reference %lld to %lld", st_path(x->f),
                    name, (long long)k, (long long)m->query[k], (long long)m->target[k], (long long)ref[2 * k],
                    (long long)ref[2 * k + 1]);
    free(ref);
    x->compared++;
  }
  return worst;
}

// Every loss term, the total, the class and cardinality errors.
static double compare_losses(Fixture *x) {
  double worst = 0;
  char name[96];
  for (int i = 0; i < x->loss.n_terms; i++) {
    snprintf(name, sizeof name, "loss.%s", x->loss.terms[i].name);
    worst = fmax(worst, expect_tensor(x, name, x->loss.terms[i].value, TOL_OUT));
  }
  worst = fmax(worst, expect_tensor(x, "loss.total", x->loss.total, TOL_OUT));
  // Logged, not trained on: compared where the reference computes them (Anchor DETR's criterion has no
  // cardinality). Percentages of counts: exact in both (a wrong one differs by a whole count).
  if (st_find(x->f, "loss.class_error")) expect_close(x, "loss.class_error", &x->loss.class_error, 1, 1e-6);
  if (!st_find(x->f, "loss.cardinality_error")) return worst;
  expect_close(x, "loss.cardinality_error", &x->loss.cardinality_error, 1, 1e-6);
  for (int l = 0; l < x->out.n_layers - 1; l++) {
    snprintf(name, sizeof name, "loss.cardinality_error_%d", l);
    expect_close(x, name, &x->loss.aux_cardinality_error[l], 1, 1e-6);
  }
  return worst;
}

// Every trainable parameter's gradient, and no other.
static double compare_gradients(Fixture *x) {
  double worst = 0;
  char name[192];
  int n_trainable = 0, n_file = 0;
  for (int i = 0; i < x->model->params.count; i++) {
    const Param *p = &x->model->params.items[i];
    if (p->kind != PARAM_TRAINABLE) continue;
    n_trainable++;
    snprintf(name, sizeof name, "grad.%s", p->name);
    ck_assert_msg(p->tensor->grad != NULL, "%s: %s has no gradient", st_path(x->f), p->name);
    double scale = listed_value(x, "noise_gradients", name);
    if (scale < 0) {
      worst = fmax(worst, expect_tensor(x, name, p->tensor->grad, TOL_GRAD));
      continue;
    }
    // 0 in exact arithmetic: both sides are rounding noise of the layer's gradient scale.
    const Tensor *g = p->tensor->grad;
    double m = 0;
    for (int64_t k = 0; k < g->numel; k++) m = fmax(m, fabs(g->data[k]));
    entry(x, name, ST_F32);
    x->compared++;
    x->worst_share = fmax(x->worst_share, m / (TOL_NOISE * scale));
    ck_assert_msg(m <= TOL_NOISE * scale, "%s: %s is 0 in exact arithmetic, detr-c's is %.3e (layer scale %.3e)",
                  st_path(x->f), name, m, scale);
  }
  for (int i = 0; i < st_count(x->f); i++) n_file += !strncmp(st_entry(x->f, i)->name, "grad.", 5);
  ck_assert_msg(n_file == n_trainable, "%s: %d gradients in the file, %d trainable parameters in detr-c", st_path(x->f),
                n_file, n_trainable);
  return worst;
}

// detr_postprocess_output for the file's original sizes against the reference's PostProcess.
static double compare_detections(Fixture *x) {
  const StEntry *e = entry(x, "post.scores", ST_F32);
  int64_t B = x->B, K = detr_detections_per_image(&x->cfg);
  ck_assert_msg(e->ndim == 2 && e->shape[0] == B && e->shape[1] == K, "%s: post.scores is not [%lld, %lld]",
                st_path(x->f), (long long)B, (long long)K);
  int64_t *hw = copy_of(x, "post.orig_size", ST_I64, 2 * B);  // [B, 2]: (h, w)
  int orig_w[2], orig_h[2];
  for (int64_t b = 0; b < B; b++) orig_h[b] = (int)hw[2 * b], orig_w[b] = (int)hw[2 * b + 1];
  free(hw);
  x->compared++;
  Detection *d = detr_malloc((size_t)(B * K) * sizeof(Detection), "test_reference detections");
  detr_postprocess_output(x->model, &x->out, orig_w, orig_h, d);
  float *scores = detr_malloc((size_t)(B * K) * 5 * sizeof(float), "test_reference scores");  // [B*K], [B*K, 4]
  float *boxes = scores + B * K;
  int64_t *labels = copy_of(x, "post.labels", ST_I64, B * K);
  for (int64_t i = 0; i < B * K; i++) {
    scores[i] = d[i].score;
    memcpy(boxes + 4 * i, d[i].box, sizeof d[i].box);
    ck_assert_msg(labels[i] == d[i].label, "%s: detection %lld (image %lld): label %d, the reference's %lld",
                  st_path(x->f), (long long)(i % K), (long long)(i / K), d[i].label, (long long)labels[i]);
  }
  x->compared++;
  double worst = fmax(expect_close(x, "post.scores", scores, B * K, TOL_OUT),
                      expect_close(x, "post.boxes", boxes, 4 * B * K, TOL_OUT));
  free(labels);
  free(scores);
  free(d);
  return worst;
}

// ENACT's cluster size per encoder layer (the official module's round(mean(run lengths))). Anchor DETR's
// encoder is its decoder kind's own, which reports no traces: there the outputs alone check them.
static void compare_cluster_sizes(Fixture *x) {
  if (!st_find(x->f, "cluster_sizes")) return;
  x->compared++;
  if (x->out.n_attn == 0) return;
  int64_t *ref = copy_of(x, "cluster_sizes", ST_I64, x->out.n_attn);
  for (int l = 0; l < x->out.n_attn; l++) {
    const AttnTrace *t = &x->out.attn[l];
    const AttnExport *size = NULL;
    for (int k = 0; k < t->n_exports; k++)
      if (!strcmp(t->exports[k].name, "cluster_size")) size = &t->exports[k];
    ck_assert_msg(size && size->i64, "%s: encoder layer %d exports no cluster_size", st_path(x->f), l);
    ck_assert_msg(size->i64[0] == ref[l], "%s: encoder layer %d: cluster size %lld, the reference's %lld",
                  st_path(x->f), l, (long long)size->i64[0], (long long)ref[l]);
  }
  free(ref);
}

static void check_family(const char *name) {
  ScopeMark mark = tensor_scope_mark();
  Fixture x;
  run_fixture(&x, name);
  double out = compare_outputs(&x), loss = compare_losses(&x), grad = compare_gradients(&x);
  double det = compare_detections(&x);
  compare_cluster_sizes(&x);
  int n_data = 0;  // every tensor of the file but the weights and the batch was compared
  for (int i = 0; i < st_count(x.f); i++) {
    const char *n = st_entry(x.f, i)->name;
    n_data += st_entry(x.f, i)->dtype != ST_BF16 && strcmp(n, "images_u8") && strcmp(n, "image_sizes") &&
              strncmp(n, "targets.", 8);
  }
  ck_assert_msg(x.compared == n_data, "%s: %d tensors compared, %d in the file", st_path(x.f), x.compared, n_data);
  printf(
      "reference %-16s max-relative: outputs %.1e losses %.1e gradients %.1e detections %.1e; largest share of "
      "the tolerance %.2f\n",
      name, out, loss, grad, det, x.worst_share);
  free_fixture(&x);
  tensor_scope_release(mark);
}

// One file per family (tools/write_reference_fixtures.py's FAMILIES): the model kinds and both ENACT
// forms, k-means cross-attention, the encoder-attention variants.
static const char *const FAMILIES[] = {"detr",
                                       "conditional_detr",
                                       "enact_official",
                                       "anchor_detr",
                                       "anchor_detr_enact",
                                       "enact",
                                       "kmeans",
                                       "efficient",
                                       "hydra",
                                       "focused",
                                       "sra",
                                       "swin"};
#define N_FAMILIES (int)(sizeof FAMILIES / sizeof FAMILIES[0])

START_TEST(family) { check_family(FAMILIES[_i]); }
END_TEST

// Every file in the folder is one of FAMILIES: a fixture the generator adds is not left unread.
START_TEST(every_file_listed) {
  DIR *dir = opendir(DETR_REFERENCE_DIR);
  ck_assert_msg(dir != NULL, "opendir %s: %s", DETR_REFERENCE_DIR, strerror(errno));
  int files = 0;
  for (struct dirent *d; (d = readdir(dir));) {
    size_t n = strlen(d->d_name);
    if (n < 12 || strcmp(d->d_name + n - 12, ".safetensors")) continue;
    bool listed = false;
    for (int i = 0; i < N_FAMILIES; i++)
      listed |= strlen(FAMILIES[i]) == n - 12 && !strncmp(d->d_name, FAMILIES[i], n - 12);
    ck_assert_msg(listed, "%s/%s is not in test_reference.c's FAMILIES", DETR_REFERENCE_DIR, d->d_name);
    files++;
  }
  closedir(dir);
  ck_assert_int_eq(files, N_FAMILIES);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("reference");
  TCase *tc = tcase_create("reference");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, family, 0, N_FAMILIES);
  tcase_add_test(tc, every_file_listed);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
