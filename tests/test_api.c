// The public C API (include/detr.h) on a tiny model: detections against the evaluation path (COCO
// reader + val loader + forward + post-processing) on the same image, file and pixel entry points
// agreeing, checkpoints (stored sizes and class names), thresholds, results outliving their model,
// non-finite outputs, extreme image shapes with every encoder variant, two threads on one model -
// and every kind of bad input: an error code, a message naming the problem, no model or result,
// and the process still alive (the tests run without fork, so an exit would end the whole run).
#define _GNU_SOURCE  // mkdtemp, nftw
#include <check.h>
#include <ftw.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/runtime.h"
#include "datasets/loader.h"
#include "api/model_file.h"
#include "include/detr.h"
#include "nn/model_io.h"
#include "nn/postprocess.h"
#include "train/checkpoint.h"
#include "tests/run_settings_fixture.h"

static char tmp[64];  // this test's scratch folder

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static void teardown_tmp(void) { nftw(tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

// tmp/name in one of 16 rotating buffers.
static const char *at(const char *name) {
  static char bufs[16][300];
  static int next;
  char *b = bufs[next++ % 16];
  snprintf(b, 300, "%s/%s", tmp, name);
  return b;
}

enum { IMG_W = 100, IMG_H = 80, QUERIES = 10, LABELS = 7 };
static uint8_t pixels[IMG_H][IMG_W][3];  // the image's RGB, as img.png holds it (lossless)

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

static void save_weights(const DetrModel *m, const char *path) {
  StWriter *w = st_writer_new();
  params_save(&m->params, w, "");
  char err[1024];
  ck_assert_msg(st_writer_save(w, path, err, sizeof err) == 0, "%s", err);
  st_writer_free(w);
}

// Tiny-model weights (w), a checkpoint of them with class names and training sizes (ckpt), weights
// with NaN class logits (nan), an image as JPEG and PNG, a COCO file naming categories 1 and 3.
static void setup_files(void) {
  snprintf(tmp, sizeof tmp, "/tmp/detr_test_api_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmp));
  DetrConfig cfg;
  detr_config_preset("tiny", &cfg);
  DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(m, 11);
  save_weights(m, at("w.safetensors"));
  DetrModel *m2 = detr_model_create(&cfg, DEVICE_CPU);  // a second model (two_threads_two_models)
  detr_model_init(m2, 12);
  save_weights(m2, at("w2.safetensors"));
  detr_model_free(m2);
  char err[1024];
  TrainState state = {
      .step = 7, .epoch = 2, .next_batch = 3, .seed = 42, .best_map = 0.125, .run = test_run_settings(96, 160, 16, 2)};
  ck_assert_msg(checkpoint_save(at("ckpt.safetensors"), m, NULL, &state,
                                "train --data d --config tiny --image-size 96 --max-size=160 --pad-multiple 16",
                                "1:one;3:three", err, sizeof err) == 0,
                "%s", err);
  tensor_fill_(params_find(&m->params, "class_embed.weight")->tensor, NAN);
  save_weights(m, at("nan.safetensors"));
  detr_model_free(m);
  for (int y = 0; y < IMG_H; y++)  // a gradient with a bright square
    for (int x = 0; x < IMG_W; x++) {
      bool sq = x > 30 && x < 70 && y > 20 && y < 50;
      pixels[y][x][0] = sq ? 240 : (uint8_t)(2 * x), pixels[y][x][1] = sq ? 200 : (uint8_t)(3 * y);
      pixels[y][x][2] = 90;
    }
  DataError derr;
  ck_assert_int_eq(image_write_jpeg(at("img.jpg"), &pixels[0][0][0], IMG_W, IMG_H, 3, 92, &derr), 0);
  ck_assert_int_eq(image_write_png(at("img.png"), &pixels[0][0][0], IMG_W, IMG_H, 3, &derr), 0);
  char coco[1024];
  snprintf(coco, sizeof coco,
           "{\"images\": [{\"id\": 1, \"file_name\": \"img.jpg\", \"width\": %d, \"height\": %d}],\n"
           " \"annotations\": [{\"id\": 1, \"image_id\": 1, \"category_id\": 1, \"bbox\": [10, 10, 30, 20],"
           " \"area\": 600, \"iscrowd\": 0}],\n"
           " \"categories\": [{\"id\": 1, \"name\": \"alpha\"}, {\"id\": 3, \"name\": \"beta\"}]}\n",
           IMG_W, IMG_H);
  write_text(at("names.json"), coco);
}

static detr_model *open_tiny(const detr_options *o) {
  detr_model *m = NULL;
  detr_status st = detr_open_weights(at("w.safetensors"), "tiny", o, &m);
  ck_assert_msg(st == DETR_OK, "%s: %s", detr_status_name(st), detr_last_error());
  ck_assert_ptr_nonnull(m);
  ck_assert_str_eq(detr_last_error(), "");
  return m;
}

static detr_result *detect(detr_model *m, const char *file, double threshold) {
  detr_result *r = NULL;
  detr_status st = detr_detect_file(m, file, threshold, &r);
  ck_assert_msg(st == DETR_OK, "%s: %s", detr_status_name(st), detr_last_error());
  ck_assert_ptr_nonnull(r);
  return r;
}

static int by_score_desc(const void *a, const void *b) {
  const Detection *x = a, *y = b;
  return x->score != y->score ? (x->score > y->score ? -1 : 1) : (x->query > y->query) - (x->query < y->query);
}

// The evaluation path on img.jpg (`detr eval`'s): COCO reader, val loader (128/192, the tiny
// defaults), the model folded for inference, forward, post-processing; dets [QUERIES] by falling
// score.
static void reference_detections(Detection *dets) {
  DetrConfig cfg;
  detr_config_preset("tiny", &cfg);
  DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
  char err[1024];
  ck_assert_msg(params_load_file(&m->params, at("w.safetensors"), err, sizeof err) == 0, "%s", err);
  detr_model_prepare_inference(m);  // as `detr eval` and the API: the norms folded (tests/test_infer.c)
  CocoOpenConfig cc = {.ann_path = at("names.json"), .image_dir = tmp, .quiet = true};
  CocoDataset *ds;
  DataError derr;
  ck_assert_msg(coco_open(&cc, &ds, &derr) == 0, "%s", derr.msg);
  LoaderConfig lc = loader_config_default(false);
  lc.batch_size = 1, lc.num_workers = 0, lc.quiet = true;
  lc.aug = aug_config_scaled(false, 128, 192);
  DataLoader *L;
  ck_assert_int_eq(loader_create(ds, &lc, (LoaderPosition){0, 0}, &L, &derr), 0);
  const Batch *b;
  ck_assert_int_eq(loader_next(L, &b, &derr), DATA_OK);
  bool was = autograd_set_grad_enabled(false);
  ScopeMark mark = tensor_scope_mark();
  Tensor *images = tensor_scoped(batch_images_tensor(b, DEVICE_CPU));
  NnCtx ctx = {.training = false};
  DetrOutput out;
  ck_assert_int_eq(detr_model_forward(m, &ctx, images, b->mask, &out, err, sizeof err), 0);
  int ow = b->targets[0].orig_w, oh = b->targets[0].orig_h;
  detr_postprocess(NULL, out.layers[out.n_layers - 1].logits, out.layers[out.n_layers - 1].boxes, &ow, &oh, dets);
  detr_output_free(&out);
  tensor_scope_release(mark);
  autograd_set_grad_enabled(was);
  loader_free(L);
  coco_free(ds);
  detr_model_free(m);
  qsort(dets, QUERIES, sizeof(Detection), by_score_desc);
}

static void assert_same_result(const detr_result *a, const detr_result *b) {
  ck_assert_int_eq(detr_result_count(a), detr_result_count(b));
  for (int i = 0; i < detr_result_count(a); i++) {
    const detr_detection *x = detr_result_get(a, i), *y = detr_result_get(b, i);
    ck_assert_int_eq(x->label, y->label);
    ck_assert_int_eq(x->query, y->query);
    ck_assert_str_eq(x->name, y->name);
    ck_assert_mem_eq(&x->score, &y->score, sizeof x->score);  // bit for bit
    ck_assert_mem_eq(x->box, y->box, sizeof x->box);
  }
}

// --- results ---------------------------------------------------------------------------------------

START_TEST(matches_evaluation) {
  ck_assert_str_eq(detr_version(), DETR_VERSION_STRING);
  detr_model *m = open_tiny(NULL);
  ck_assert_int_eq(detr_num_labels(m), LABELS);
  ck_assert_str_eq(detr_label_name(m, 3), "class 3");  // weights carry no names
  ck_assert_ptr_null(detr_label_name(m, LABELS));
  ck_assert_ptr_null(detr_label_name(m, -1));
  int size, max;
  detr_input_size(m, &size, &max);
  ck_assert_int_eq(size, 128);  // the tiny preset's defaults, as `detr train` uses
  ck_assert_int_eq(max, 192);
  detr_result *r = detect(m, at("img.jpg"), 0.0);
  Detection ref[QUERIES];
  reference_detections(ref);
  ck_assert_int_eq(detr_result_count(r), QUERIES);  // threshold 0: every query
  ck_assert_int_eq(detr_result_dropped(r), 0);
  int w, h;
  detr_result_image_size(r, &w, &h);
  ck_assert_int_eq(w, IMG_W);
  ck_assert_int_eq(h, IMG_H);
  for (int i = 0; i < QUERIES; i++) {
    const detr_detection *d = detr_result_get(r, i);
    ck_assert_int_eq(d->label, ref[i].label);
    ck_assert_int_eq(d->query, (int)ref[i].query);
    ck_assert_float_eq(d->score, ref[i].score);  // the same arithmetic: equal
    for (int c = 0; c < 4; c++) ck_assert_float_eq(d->box[c], ref[i].box[c]);
    char name[32];
    snprintf(name, sizeof name, "class %d", d->label);
    ck_assert_str_eq(d->name, name);
    if (i) ck_assert(d->score <= detr_result_get(r, i - 1)->score);
  }
  ck_assert_ptr_null(detr_result_get(r, QUERIES));
  ck_assert_ptr_null(detr_result_get(r, -1));

  // The PNG (lossless) through the file reader and the same pixels as a buffer: identical.
  detr_result *a = detect(m, at("img.png"), 0.0), *b = NULL;
  ck_assert_int_eq(detr_detect_rgb(m, &pixels[0][0][0], sizeof pixels, IMG_W, IMG_H, 0.0, &b), DETR_OK);
  assert_same_result(a, b);

  // A threshold keeps exactly the detections scoring at least it.
  double th = detr_result_get(r, 4)->score;
  detr_result *t = detect(m, at("img.jpg"), th);
  int expect = 0;
  for (int i = 0; i < QUERIES; i++) expect += ref[i].score >= th;
  ck_assert_int_eq(detr_result_count(t), expect);
  for (int i = 0; i < expect; i++) ck_assert_int_eq(detr_result_get(t, i)->query, (int)ref[i].query);
  detr_result *none = detect(m, at("img.jpg"), 1.0);
  ck_assert_int_le(detr_result_count(none), 0 + (ref[0].score >= 1.0f));
  detr_result_free(none);
  detr_result_free(t);
  detr_result_free(a);
  detr_result_free(b);
  detr_close(m);
  // A result outlives its model (it owns its names).
  char name[32];
  snprintf(name, sizeof name, "class %d", detr_result_get(r, 0)->label);
  ck_assert_str_eq(detr_result_get(r, 0)->name, name);
  detr_result_free(r);
  detr_result_free(NULL);
  detr_close(NULL);
}
END_TEST

START_TEST(checkpoint_sizes_and_names) {
  detr_model *c = NULL;
  ck_assert_int_eq(detr_open_checkpoint(at("ckpt.safetensors"), NULL, &c), DETR_OK);
  int size, max;
  detr_input_size(c, &size, &max);
  ck_assert_int_eq(size, 96);  // the training command's --image-size / --max-size
  ck_assert_int_eq(max, 160);
  char err[1024];
  StFile *f = st_open(at("ckpt.safetensors"), err, sizeof err);  // what detr eval reads: --pad-multiple too
  ck_assert_msg(f != NULL, "%s", err);
  CheckpointInfo ci;
  ck_assert_int_eq(checkpoint_info_read(f, &ci, err, sizeof err), 0);
  ck_assert(ci.run.known && ci.run.image_size == 96 && ci.run.max_size == 160 && ci.run.pad_multiple == 16);
  checkpoint_info_free(&ci);
  st_close(f);
  ck_assert_str_eq(detr_label_name(c, 1), "one");
  ck_assert_str_eq(detr_label_name(c, 3), "three");
  ck_assert_str_eq(detr_label_name(c, 2), "class 2");
  detr_options o = detr_options_default();
  o.image_size = 96, o.max_size = 160;
  detr_model *w = open_tiny(&o);
  detr_result *a = detect(c, at("img.jpg"), 0.0), *b = detect(w, at("img.jpg"), 0.0);
  ck_assert_int_eq(detr_result_count(a), detr_result_count(b));
  for (int i = 0; i < detr_result_count(a); i++) {
    const detr_detection *x = detr_result_get(a, i), *y = detr_result_get(b, i);
    ck_assert(x->label == y->label && x->query == y->query && x->score == y->score);
    ck_assert_str_eq(x->name, detr_label_name(c, x->label));
  }
  detr_close(c);  // names stay with the result
  for (int i = 0; i < detr_result_count(a); i++) {
    const detr_detection *x = detr_result_get(a, i);
    char buf[32];
    snprintf(buf, sizeof buf, "class %d", x->label);
    ck_assert_str_eq(x->name, x->label == 1 ? "one" : x->label == 3 ? "three" : buf);
  }
  // Names from a COCO file replace the checkpoint's; overrides apply to the stored config.
  detr_close(w);
  o = detr_options_default();
  o.names = at("names.json");
  const char *sets[] = {"enact_sigma=2", NULL};
  o.sets = sets;
  ck_assert_int_eq(detr_open_checkpoint(at("ckpt.safetensors"), &o, &c), DETR_OK);
  ck_assert_str_eq(detr_label_name(c, 1), "alpha");
  ck_assert_str_eq(detr_label_name(c, 3), "beta");
  detr_close(c);
  detr_result_free(a);
  detr_result_free(b);
}
END_TEST

START_TEST(nonfinite_outputs_dropped) {
  detr_model *m = NULL;
  ck_assert_int_eq(detr_open_weights(at("nan.safetensors"), "tiny", NULL, &m), DETR_OK);
  detr_result *r = detect(m, at("img.jpg"), 0.0);
  ck_assert_int_eq(detr_result_count(r), 0);
  ck_assert_int_eq(detr_result_dropped(r), QUERIES);
  detr_result_free(r);
  detr_close(m);
}
END_TEST

// 1x1, 1x4000 and 4000x1 images (the resize keeps at least one pixel a side; the backbone's
// padding keeps at least one feature) with every encoder variant: detections or an error code.
START_TEST(extreme_shapes_every_variant) {
  static const char *const VARIANTS[] = {"encoder_attn=dense", "encoder_attn=enact",   "encoder_attn=efficient",
                                         "encoder_attn=hydra", "encoder_attn=focused", "encoder_attn=sra"};
  const int sizes[][2] = {{1, 1}, {4000, 1}, {1, 4000}, {33, 2}};
  for (size_t v = 0; v < sizeof VARIANTS / sizeof VARIANTS[0]; v++) {
    const char *sets[] = {VARIANTS[v], NULL};
    detr_options o = detr_options_default();
    o.sets = sets;
    detr_model *m = open_tiny(&o);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
      int w = sizes[s][0], h = sizes[s][1];
      size_t n = (size_t)w * h * 3;
      unsigned char *px = malloc(n);
      for (size_t i = 0; i < n; i++) px[i] = (unsigned char)(i * 37);
      detr_result *r = NULL;
      detr_status st = detr_detect_rgb(m, px, n, w, h, 0.0, &r);
      ck_assert_msg(st == DETR_OK || (st == DETR_ERR_RUNTIME && *detr_last_error()), "%s %dx%d: %s: %s", VARIANTS[v], w,
                    h, detr_status_name(st), detr_last_error());
      if (st == DETR_OK) ck_assert_int_eq(detr_result_count(r) + detr_result_dropped(r), QUERIES);
      else ck_assert_ptr_null(r);
      detr_result_free(r);
      free(px);
    }
    detr_close(m);
  }
}
END_TEST

// --- batches ---------------------------------------------------------------------------------------

// The largest |score| and |box| (pixels) differences between two results of one image, matched by
// query (threshold 0: every query once in each).
static void result_distance(const detr_result *a, const detr_result *b, double *score, double *box) {
  ck_assert_int_eq(detr_result_count(a), detr_result_count(b));
  *score = *box = 0;
  for (int i = 0; i < detr_result_count(a); i++) {
    const detr_detection *x = detr_result_get(a, i), *y = NULL;
    for (int j = 0; j < detr_result_count(b) && !y; j++)
      if (detr_result_get(b, j)->query == x->query) y = detr_result_get(b, j);
    ck_assert_ptr_nonnull(y);
    ck_assert_int_eq(x->label, y->label);
    *score = fmax(*score, fabs(x->score - y->score));
    for (int c = 0; c < 4; c++) *box = fmax(*box, fabs(x->box[c] - y->box[c]));
  }
}

// Results of n images within float rounding of each other: scores within 1e-6, boxes 1e-4 px.
static void assert_close_results(detr_result *const *a, detr_result *const *b, int n) {
  for (int i = 0; i < n; i++) {
    double score, box;
    result_distance(a[i], b[i], &score, &box);
    ck_assert_msg(score <= 1e-6 && box <= 1e-4, "image %d: %g (score), %g px (box)", i, score, box);
  }
}

// Three images: img (100x80), it mirrored (the same size), and its top-left 60x50 crop, which the
// resize makes 154x128 beside the others' 160x128: padded by 6 columns in a batch with them.
START_TEST(batch_matches_single_images) {
  detr_model *m = open_tiny(NULL);
  static uint8_t mirror[IMG_H][IMG_W][3], crop[50][60][3];
  for (int y = 0; y < IMG_H; y++)
    for (int x = 0; x < IMG_W; x++) memcpy(mirror[y][x], pixels[y][IMG_W - 1 - x], 3);
  for (int y = 0; y < 50; y++) memcpy(crop[y], pixels[y], sizeof crop[y]);
  detr_image img[3] = {{&pixels[0][0][0], sizeof pixels, IMG_W, IMG_H},
                       {&mirror[0][0][0], sizeof mirror, IMG_W, IMG_H},
                       {&crop[0][0][0], sizeof crop, 60, 50}};
  detr_result *alone[3], *batch[3];
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(detr_detect_rgb(m, img[i].rgb, img[i].size, img[i].width, img[i].height, 0.0, &alone[i]), DETR_OK);
  // The same size, no padding: each image's detections alone up to float rounding (measured: 1 ulp
  // of the scores, 7.6e-6 px; the transformer's matrix products over the batch's rows block their
  // sums differently from one image's, while the convolutions, whole batch or per image, agree).
  ck_assert_int_eq(detr_detect_batch(m, img, 2, 0.0, batch), DETR_OK);
  assert_close_results(alone, batch, 2);
  for (int i = 0; i < 2; i++) detr_result_free(batch[i]);
  // With the crop, padded: the unpadded images are unchanged; the crop's detections move (its
  // right edge's features read the padding), but only a little, and its boxes are in its pixels.
  ck_assert_int_eq(detr_detect_batch(m, img, 3, 0.0, batch), DETR_OK);
  assert_close_results(alone, batch, 2);
  double score, box;
  result_distance(alone[2], batch[2], &score, &box);
  printf("padded image in a batch: largest differences %.3g (score), %.3g px (box)\n", score, box);
  ck_assert(score > 0 || box > 0);  // the padding does reach it
  int w, h;
  detr_result_image_size(batch[2], &w, &h);
  ck_assert(w == 60 && h == 50);
  for (int i = 0; i < 3; i++) detr_result_free(alone[i]), detr_result_free(batch[i]);

  // Bad calls: an error, every result NULL.
  detr_result *r[3] = {alone[0], alone[0], alone[0]};  // stale pointers the call must clear
  ck_assert_int_eq(detr_detect_batch(m, img, 0, 0.0, r), DETR_ERR_ARGUMENT);
  ck_assert_int_eq(detr_detect_batch(m, img, 65, 0.0, r), DETR_ERR_ARGUMENT);
  ck_assert_int_eq(detr_detect_batch(m, NULL, 2, 0.0, r), DETR_ERR_ARGUMENT);
  ck_assert_ptr_null(r[0]);
  detr_image bad[2] = {img[0], {img[1].rgb, img[1].size - 1, IMG_W, IMG_H}};
  r[1] = alone[0];
  ck_assert_int_eq(detr_detect_batch(m, bad, 2, 0.0, r), DETR_ERR_ARGUMENT);
  ck_assert_msg(strstr(detr_last_error(), "images[1]"), "%s", detr_last_error());
  ck_assert(r[0] == NULL && r[1] == NULL);
  ck_assert_int_eq(detr_detect_batch(m, img, 2, 1.5, r), DETR_ERR_ARGUMENT);
  ck_assert_int_eq(detr_detect_batch(NULL, img, 2, 0.0, r), DETR_ERR_ARGUMENT);
  ck_assert_int_eq(detr_detect_batch(m, img, 2, 0.0, NULL), DETR_ERR_ARGUMENT);
  detr_close(m);
}
END_TEST

// options.threads: a model on 1 thread gives the default's detections (up to the summation order
// of a parallel reduction) and leaves the caller's OpenMP setting as it was; out of range refused.
START_TEST(thread_option) {
  detr_options o = detr_options_default();
  ck_assert_int_eq(o.threads, 0);
  detr_model *m = open_tiny(NULL);
  o.threads = 1;
  detr_model *one = open_tiny(&o);
  int before = omp_get_max_threads();
  detr_result *a = detect(m, at("img.png"), 0.0), *b = detect(one, at("img.png"), 0.0);
  ck_assert_int_eq(omp_get_max_threads(), before);
  double score, box;
  result_distance(a, b, &score, &box);
  ck_assert_msg(score <= 1e-5 && box <= 1e-3, "1 thread against %d: %g (score), %g px (box)", before, score, box);
  detr_result_free(a), detr_result_free(b);
  detr_close(one);
  detr_close(m);
  detr_model *none = NULL;
  int bad[] = {-1, 1025};
  for (int i = 0; i < 2; i++) {
    o.threads = bad[i];
    ck_assert_int_eq(detr_open_weights(at("w.safetensors"), "tiny", &o, &none), DETR_ERR_ARGUMENT);
    ck_assert_ptr_null(none);
    ck_assert_msg(strstr(detr_last_error(), "threads"), "%s", detr_last_error());
  }
}
END_TEST

// options.precision: bf16 where the CPU has it (close to fp32, not the same), fp32 by default even
// for a model whose config says bf16, and bf16 refused with the reason where the CPU lacks it.
START_TEST(precision_option) {
  detr_options o = detr_options_default();
  ck_assert_int_eq(o.precision, DETR_PRECISION_DEFAULT);
  detr_model *fp32 = open_tiny(NULL);
  const char *bf16_key[] = {"bf16=true", NULL};
  char why[256];
  bool have = device_bf16_supported(DEVICE_CPU, why, sizeof why);
  o.precision = DETR_PRECISION_BF16;
  detr_model *bf16 = NULL;
  detr_status st = detr_open_weights(at("w.safetensors"), "tiny", &o, &bf16);
  if (!have) {
    ck_assert_int_eq(st, DETR_ERR_DEVICE);
    ck_assert_msg(strstr(detr_last_error(), "AVX512-BF16"), "%s", detr_last_error());
  } else {
    ck_assert_int_eq(st, DETR_OK);
    detr_result *a = detect(fp32, at("img.png"), 0.0), *b = detect(bf16, at("img.png"), 0.0);
    double score, box;
    result_distance(a, b, &score, &box);
    ck_assert_msg(score > 0 && score < 0.05, "bf16 against fp32: %g (score)", score);
    detr_result_free(b);
    // The config key alone, precision DEFAULT: the key holds (a user asking for it in sets)
    o.precision = DETR_PRECISION_DEFAULT;
    o.sets = bf16_key;
    detr_model *keyed = open_tiny(&o);
    b = detect(keyed, at("img.png"), 0.0);
    result_distance(a, b, &score, &box);
    ck_assert_msg(score > 0, "sets bf16=true ran fp32");
    detr_result_free(a), detr_result_free(b);
    detr_close(keyed);
    detr_close(bf16);
  }
  o = detr_options_default();
  o.precision = (detr_precision)7;
  detr_model *none = NULL;
  ck_assert_int_eq(detr_open_weights(at("w.safetensors"), "tiny", &o, &none), DETR_ERR_ARGUMENT);
  ck_assert_msg(strstr(detr_last_error(), "precision"), "%s", detr_last_error());
  detr_close(fp32);
}
END_TEST

// --- threads ---------------------------------------------------------------------------------------

typedef struct {
  detr_model *m;
  const char *file;
  detr_result *r[4];
  detr_status st[4];
} Worker;

static void *work(void *arg) {
  Worker *w = arg;
  for (int i = 0; i < 4; i++) w->st[i] = detr_detect_file(w->m, w->file, 0.0, &w->r[i]);
  return NULL;
}

// a and b detect on two threads at once; each of their results must equal its reference (freed here).
static void detect_on_two_threads(Worker *a, Worker *b, detr_result *ref_a, detr_result *ref_b) {
  pthread_t ta, tb;
  ck_assert_int_eq(pthread_create(&ta, NULL, work, a), 0);
  ck_assert_int_eq(pthread_create(&tb, NULL, work, b), 0);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(a->st[i], DETR_OK);
    ck_assert_int_eq(b->st[i], DETR_OK);
    assert_same_result(a->r[i], ref_a);
    assert_same_result(b->r[i], ref_b);
    detr_result_free(a->r[i]);
    detr_result_free(b->r[i]);
  }
  detr_result_free(ref_a);
  detr_result_free(ref_b);
}

START_TEST(two_threads_one_model) {
  detr_model *m = open_tiny(NULL);
  char jpg[300], png[300];
  snprintf(jpg, sizeof jpg, "%s", at("img.jpg"));
  snprintf(png, sizeof png, "%s", at("img.png"));
  detr_result *ref_jpg = detect(m, jpg, 0.0), *ref_png = detect(m, png, 0.0);
  Worker a = {.m = m, .file = jpg}, b = {.m = m, .file = png};
  detect_on_two_threads(&a, &b, ref_jpg, ref_png);
  detr_close(m);
}
END_TEST

// Two models (two files, different weights) on two threads at once: each result equal to the one
// the model gives alone. Each model runs in its own runtime (core/runtime.h): nothing is shared but
// the allocator's and oneDNN's locked caches (tools/test.sh runs this test under ThreadSanitizer).
START_TEST(two_threads_two_models) {
  detr_model *m1 = open_tiny(NULL), *m2 = NULL;
  ck_assert_int_eq(detr_open_weights(at("w2.safetensors"), "tiny", NULL, &m2), DETR_OK);
  char jpg[300], png[300];
  snprintf(jpg, sizeof jpg, "%s", at("img.jpg"));
  snprintf(png, sizeof png, "%s", at("img.png"));
  detr_result *ref1 = detect(m1, jpg, 0.0), *ref2 = detect(m2, png, 0.0);
  detr_result *other = detect(m2, jpg, 0.0);  // the second model differs: its own weights, not the first's
  ck_assert(detr_result_get(other, 0)->score != detr_result_get(ref1, 0)->score);
  detr_result_free(other);
  Worker a = {.m = m1, .file = jpg}, b = {.m = m2, .file = png};
  detect_on_two_threads(&a, &b, ref1, ref2);
  detr_close(m1);
  detr_close(m2);
}
END_TEST

// --- bad input ---------------------------------------------------------------------------------------

// The error code `want` with a message containing `needle`, and no model (`call` opens into m).
#define EXPECT_OPEN(call, want, needle)                                                                           \
  do {                                                                                                            \
    m = (detr_model *)&m;                                                                                         \
    detr_status st_ = (call);                                                                                     \
    ck_assert_ptr_null(m);                                                                                        \
    ck_assert_msg(st_ == (want), "%s: got %s (%s), expected %s", #call, detr_status_name(st_), detr_last_error(), \
                  detr_status_name(want));                                                                        \
    ck_assert_msg(strstr(detr_last_error(), (needle)) != NULL, "%s: message '%s' lacks '%s'", #call,              \
                  detr_last_error(), (needle));                                                                   \
  } while (0)

static void copy_prefix(const char *from, const char *to, long bytes) {
  FILE *f = fopen(from, "rb"), *g = fopen(to, "wb");
  ck_assert(f && g);
  static char buf[1 << 16];
  size_t n;
  while (bytes > 0 && (n = fread(buf, 1, bytes < (long)sizeof buf ? (size_t)bytes : sizeof buf, f)) > 0) {
    ck_assert_uint_eq(fwrite(buf, 1, n, g), n);
    bytes -= (long)n;
  }
  fclose(f);
  fclose(g);
}

// A copy of the safetensors file `from` with tensor `name` stored as F16 (zeros) of its shape.
static void write_f16_variant(const char *from, const char *name, const char *to) {
  char err[1024], header[1 << 16];
  StFile *f = st_open(from, err, sizeof err);
  ck_assert_msg(f != NULL, "%s", err);
  size_t n = 0, offset = 0;
  n += (size_t)snprintf(header + n, sizeof header - n, "{");
  for (int i = 0; i < st_count(f); i++) {
    const StEntry *e = st_entry(f, i);
    size_t bytes = !strcmp(e->name, name) ? e->nbytes / 2 : e->nbytes;
    n += (size_t)snprintf(header + n, sizeof header - n, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "",
                          e->name, !strcmp(e->name, name) ? "F16" : "F32");
    for (int d = 0; d < e->ndim; d++)
      n += (size_t)snprintf(header + n, sizeof header - n, "%s%lld", d ? "," : "", (long long)e->shape[d]);
    n += (size_t)snprintf(header + n, sizeof header - n, "],\"data_offsets\":[%zu,%zu]}", offset, offset + bytes);
    offset += bytes;
  }
  n += (size_t)snprintf(header + n, sizeof header - n, "}");
  ck_assert_uint_lt(n, sizeof header);
  FILE *g = fopen(to, "wb");
  uint64_t len = n;  // little-endian hosts only (x86, arm64)
  fwrite(&len, 8, 1, g);
  fwrite(header, 1, n, g);
  static const uint8_t zeros[4096];
  for (int i = 0; i < st_count(f); i++) {
    const StEntry *e = st_entry(f, i);
    if (strcmp(e->name, name)) fwrite(st_data(f, e), 1, e->nbytes, g);
    else
      for (size_t k = 0; k < e->nbytes / 2; k += sizeof zeros)
        fwrite(zeros, 1, e->nbytes / 2 - k < sizeof zeros ? e->nbytes / 2 - k : sizeof zeros, g);
  }
  fclose(g);
  st_close(f);
}

static long file_size(const char *path) {
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  return (long)st.st_size;
}

START_TEST(bad_models) {
  char W[300], C[300];
  snprintf(W, sizeof W, "%s", at("w.safetensors"));
  snprintf(C, sizeof C, "%s", at("ckpt.safetensors"));
  detr_model *m = NULL;
  // Arguments.
  EXPECT_OPEN(detr_open_checkpoint(NULL, NULL, &m), DETR_ERR_ARGUMENT, "NULL or empty");
  EXPECT_OPEN(detr_open_checkpoint("", NULL, &m), DETR_ERR_ARGUMENT, "empty");
  ck_assert_int_eq(detr_open_checkpoint(C, NULL, NULL), DETR_ERR_ARGUMENT);
  ck_assert_ptr_nonnull(strstr(detr_last_error(), "NULL"));
  EXPECT_OPEN(detr_open_weights(NULL, "tiny", NULL, &m), DETR_ERR_ARGUMENT, "weights");
  EXPECT_OPEN(detr_open_weights(W, "", NULL, &m), DETR_ERR_ARGUMENT, "config");
  detr_options o = detr_options_default();
  o.device = (detr_device)7;
  EXPECT_OPEN(detr_open_weights(W, "tiny", &o, &m), DETR_ERR_ARGUMENT, "device");
  o = detr_options_default();
  o.image_size = 5;
  EXPECT_OPEN(detr_open_weights(W, "tiny", &o, &m), DETR_ERR_ARGUMENT, "image_size");
  o = detr_options_default();
  o.max_size = 100000;
  EXPECT_OPEN(detr_open_weights(W, "tiny", &o, &m), DETR_ERR_ARGUMENT, "max_size");
  o = detr_options_default();
  o.device = DETR_DEVICE_CUDA;
  detr_status st = detr_open_weights(W, "tiny", &o, &m);
  ck_assert_msg(st == DETR_ERR_DEVICE || (DETR_HAVE_CUDA && st == DETR_OK), "cuda: %s", detr_last_error());
  if (st == DETR_ERR_DEVICE) ck_assert_ptr_nonnull(strstr(detr_last_error(), "CUDA"));
  detr_close(m);
  m = NULL;

  // Files that cannot be read.
  EXPECT_OPEN(detr_open_checkpoint(at("missing.safetensors"), NULL, &m), DETR_ERR_IO,
              "missing.safetensors: cannot open");
  EXPECT_OPEN(detr_open_weights(at("missing.safetensors"), "tiny", NULL, &m), DETR_ERR_IO, "cannot open");
  EXPECT_OPEN(detr_open_weights(tmp, "tiny", NULL, &m), DETR_ERR_IO, "not a regular file");
  ck_assert_ptr_null(m);

  // Not safetensors, truncated (header or data), empty.
  EXPECT_OPEN(detr_open_weights(at("img.jpg"), "tiny", NULL, &m), DETR_ERR_FORMAT, "img.jpg");
  copy_prefix(W, at("cut.safetensors"), file_size(W) - 100);
  EXPECT_OPEN(detr_open_weights(at("cut.safetensors"), "tiny", NULL, &m), DETR_ERR_FORMAT, "cut.safetensors");
  copy_prefix(W, at("cut2.safetensors"), 40);
  EXPECT_OPEN(detr_open_weights(at("cut2.safetensors"), "tiny", NULL, &m), DETR_ERR_FORMAT, "cut2.safetensors");
  copy_prefix(C, at("cut3.safetensors"), file_size(C) / 2);
  EXPECT_OPEN(detr_open_checkpoint(at("cut3.safetensors"), NULL, &m), DETR_ERR_FORMAT, "cut3.safetensors");
  write_text(at("empty.safetensors"), "");
  EXPECT_OPEN(detr_open_weights(at("empty.safetensors"), "tiny", NULL, &m), DETR_ERR_FORMAT, "empty.safetensors");

  // Plain weights as a checkpoint; a corrupted checkpoint (one flipped bit in the tensor data).
  EXPECT_OPEN(detr_open_checkpoint(W, NULL, &m), DETR_ERR_FORMAT, "not a detr-c checkpoint");
  ck_assert_ptr_nonnull(strstr(detr_last_error(), "detr_open_weights"));
  copy_prefix(C, at("flip.safetensors"), file_size(C));
  FILE *g = fopen(at("flip.safetensors"), "r+b");
  fseek(g, -64, SEEK_END);
  int ch = fgetc(g);
  fseek(g, -64, SEEK_END);
  fputc(ch ^ 0x10, g);
  fclose(g);
  EXPECT_OPEN(detr_open_checkpoint(at("flip.safetensors"), NULL, &m), DETR_ERR_FORMAT, "checksum mismatch");
  // A checkpoint whose stored config is damaged (the crc covers the tensors only).
  char err[1024];
  StFile *f = st_open(C, err, sizeof err);
  ck_assert_ptr_nonnull(f);
  StWriter *w = st_writer_new();
  for (int i = 0; i < st_count(f); i++) {
    const StEntry *e = st_entry(f, i);
    st_writer_add(w, e->name, e->dtype, e->ndim, e->shape, st_data(f, e));
  }
  for (int i = 0; i < st_metadata_count(f); i++)
    st_writer_set_metadata(w, st_metadata_key(f, i), st_metadata_value(f, i));
  st_writer_set_metadata(w, "model_config", "hidden_dim=banana\n");
  ck_assert_int_eq(st_writer_save(w, at("badcfg.safetensors"), err, sizeof err), 0);
  st_writer_set_metadata(w, "model_config", "hidden_dim=100000000000\n");  // absurd: refused, not allocated
  ck_assert_int_eq(st_writer_save(w, at("hugecfg.safetensors"), err, sizeof err), 0);
  st_writer_set_metadata(w, "categories", "1:one;x;3:three");
  st_writer_set_metadata(w, "model_config", st_metadata(f, "model_config"));
  ck_assert_int_eq(st_writer_save(w, at("badcats.safetensors"), err, sizeof err), 0);
  st_writer_free(w);
  st_close(f);
  EXPECT_OPEN(detr_open_checkpoint(at("badcfg.safetensors"), NULL, &m), DETR_ERR_FORMAT, "hidden_dim");
  EXPECT_OPEN(detr_open_checkpoint(at("hugecfg.safetensors"), NULL, &m), DETR_ERR_CONFIG, "hidden_dim");
  ck_assert_ptr_nonnull(strstr(detr_last_error(), "hugecfg.safetensors: model_config"));  // names the file
  EXPECT_OPEN(detr_open_checkpoint(at("badcats.safetensors"), NULL, &m), DETR_ERR_FORMAT, "'x' is not id:name");

  // Foreign weights: another configuration's, other sizes, F16 tensors. (A checkpoint with
  // optimizer moments given as weights: tests/install_test.sh.)
  EXPECT_OPEN(detr_open_weights(W, "detr-r18-small", NULL, &m), DETR_ERR_MISMATCH, "do not fit the model");
  const char *more[] = {"num_queries=11", NULL};
  o = detr_options_default();
  o.sets = more;
  EXPECT_OPEN(detr_open_weights(W, "tiny", &o, &m), DETR_ERR_MISMATCH, "query_embed.weight");
  // The weights with class_embed.bias as F16 of its shape (written by hand: detr-c writes no F16).
  write_f16_variant(W, "class_embed.bias", at("f16.safetensors"));
  EXPECT_OPEN(detr_open_weights(at("f16.safetensors"), "tiny", NULL, &m), DETR_ERR_MISMATCH, "F16");

  // Configs: unknown preset or unreadable file, bad lines, bad overrides.
  EXPECT_OPEN(detr_open_weights(W, "no-such-preset", NULL, &m), DETR_ERR_CONFIG, "not a preset");
  EXPECT_OPEN(detr_open_weights(W, tmp, NULL, &m), DETR_ERR_CONFIG, "not a preset");
  write_text(at("bad.conf"), "backbone=18\nhidden_dim 32\n");
  EXPECT_OPEN(detr_open_weights(W, at("bad.conf"), NULL, &m), DETR_ERR_CONFIG, "bad.conf:2");
  write_text(at("bad2.conf"), "nheads=5\nhidden_dim=32\n");
  EXPECT_OPEN(detr_open_weights(W, at("bad2.conf"), NULL, &m), DETR_ERR_CONFIG, "nheads");
  const char *const BAD_SETS[][2] = {{"hidden_dim=abc", "hidden_dim"}, {"no_such_key=1", "no_such_key"},
                                     {"novalue", "not key=value"},     {"encoder_attn=magic", "magic"},
                                     {"num_classes=0", "num_classes"}, {"ffn_dim=99999999999", "ffn_dim"}};
  for (int i = 0; i < 6; i++) {
    const char *sets[] = {BAD_SETS[i][0], NULL};
    o = detr_options_default();
    o.sets = sets;
    EXPECT_OPEN(detr_open_weights(W, "tiny", &o, &m), DETR_ERR_CONFIG, BAD_SETS[i][1]);
    EXPECT_OPEN(detr_open_checkpoint(C, &o, &m), DETR_ERR_CONFIG, BAD_SETS[i][1]);
  }

  // Names files: missing, not JSON, JSON without categories.
  o = detr_options_default();
  o.names = at("missing.json");
  EXPECT_OPEN(detr_open_checkpoint(C, &o, &m), DETR_ERR_IO, "missing.json");
  write_text(at("junk.json"), "{\"categories\": [{\"id\": 1, \"name\": ");
  o.names = at("junk.json");
  EXPECT_OPEN(detr_open_checkpoint(C, &o, &m), DETR_ERR_FORMAT, "junk.json");
  write_text(at("nocats.json"), "{\"images\": []}");
  o.names = at("nocats.json");
  EXPECT_OPEN(detr_open_weights(W, "tiny", &o, &m), DETR_ERR_FORMAT, "no 'categories' array");
  write_text(at("nocats.json"), "{\"categories\": []}");
  EXPECT_OPEN(detr_open_weights(W, "tiny", &o, &m), DETR_ERR_FORMAT, "no categories");
  o.names = at("img.jpg");
  EXPECT_OPEN(detr_open_weights(W, "tiny", &o, &m), DETR_ERR_FORMAT, "malformed JSON");
  ck_assert_ptr_null(m);

  // Still alive and well: a good open after all of that, and the error text is cleared.
  m = open_tiny(NULL);
  detr_close(m);
}
END_TEST

#define EXPECT_DETECT(call, want, needle)                                                                         \
  do {                                                                                                            \
    detr_result *r_ = (detr_result *)1;                                                                           \
    detr_result **out_ = &r_;                                                                                     \
    detr_status st_ = (call);                                                                                     \
    ck_assert_msg(st_ == (want), "%s: got %s (%s), expected %s", #call, detr_status_name(st_), detr_last_error(), \
                  detr_status_name(want));                                                                        \
    ck_assert_msg(strstr(detr_last_error(), (needle)) != NULL, "%s: message '%s' lacks '%s'", #call,              \
                  detr_last_error(), (needle));                                                                   \
    ck_assert_ptr_null(*out_);                                                                                    \
  } while (0)

START_TEST(bad_images) {
  detr_model *m = open_tiny(NULL);
  const unsigned char *px = &pixels[0][0][0];
  size_t n = sizeof pixels;
  // Arguments: NULLs, sizes, thresholds.
  EXPECT_DETECT(detr_detect_rgb(NULL, px, n, IMG_W, IMG_H, 0.5, out_), DETR_ERR_ARGUMENT, "model");
  ck_assert_int_eq(detr_detect_rgb(m, px, n, IMG_W, IMG_H, 0.5, NULL), DETR_ERR_ARGUMENT);
  EXPECT_DETECT(detr_detect_rgb(m, NULL, n, IMG_W, IMG_H, 0.5, out_), DETR_ERR_ARGUMENT, "rgb");
  EXPECT_DETECT(detr_detect_rgb(m, px, n, 0, IMG_H, 0.5, out_), DETR_ERR_ARGUMENT, "0x80");
  EXPECT_DETECT(detr_detect_rgb(m, px, n, IMG_W, -3, 0.5, out_), DETR_ERR_ARGUMENT, "100x-3");
  EXPECT_DETECT(detr_detect_rgb(m, px, n, 40000, 1, 0.5, out_), DETR_ERR_ARGUMENT, "1..32768");
  EXPECT_DETECT(detr_detect_rgb(m, px, n - 1, IMG_W, IMG_H, 0.5, out_), DETR_ERR_ARGUMENT, "expected 24000");
  EXPECT_DETECT(detr_detect_rgb(m, px, n, IMG_H, IMG_W + 1, 0.5, out_), DETR_ERR_ARGUMENT, "expected 24240");
  EXPECT_DETECT(detr_detect_rgb(m, px, 0, IMG_W, IMG_H, 0.5, out_), DETR_ERR_ARGUMENT, "0 bytes");
  EXPECT_DETECT(detr_detect_rgb(m, px, n, IMG_W, IMG_H, -0.1, out_), DETR_ERR_ARGUMENT, "threshold");
  EXPECT_DETECT(detr_detect_rgb(m, px, n, IMG_W, IMG_H, 1.5, out_), DETR_ERR_ARGUMENT, "threshold");
  EXPECT_DETECT(detr_detect_rgb(m, px, n, IMG_W, IMG_H, NAN, out_), DETR_ERR_ARGUMENT, "threshold");
  EXPECT_DETECT(detr_detect_file(m, NULL, 0.5, out_), DETR_ERR_ARGUMENT, "path");
  EXPECT_DETECT(detr_detect_file(NULL, at("img.jpg"), 0.5, out_), DETR_ERR_ARGUMENT, "model");
  EXPECT_DETECT(detr_detect_file(m, at("img.jpg"), INFINITY, out_), DETR_ERR_ARGUMENT, "threshold");
  // Files: missing, a directory, not an image, empty, truncated JPEG and PNG.
  EXPECT_DETECT(detr_detect_file(m, at("missing.jpg"), 0.5, out_), DETR_ERR_IO, "missing.jpg: cannot open");
  EXPECT_DETECT(detr_detect_file(m, tmp, 0.5, out_), DETR_ERR_IO, "not a regular file");
  write_text(at("junk.jpg"), "this is not a JPEG");
  EXPECT_DETECT(detr_detect_file(m, at("junk.jpg"), 0.5, out_), DETR_ERR_IMAGE, "junk.jpg");
  write_text(at("empty.png"), "");
  EXPECT_DETECT(detr_detect_file(m, at("empty.png"), 0.5, out_), DETR_ERR_IMAGE, "empty.png");
  copy_prefix(at("img.jpg"), at("cut.jpg"), file_size(at("img.jpg")) / 2);
  EXPECT_DETECT(detr_detect_file(m, at("cut.jpg"), 0.5, out_), DETR_ERR_IMAGE, "cut.jpg");
  copy_prefix(at("img.png"), at("cut.png"), file_size(at("img.png")) - 30);
  EXPECT_DETECT(detr_detect_file(m, at("cut.png"), 0.5, out_), DETR_ERR_IMAGE, "cut.png");
  EXPECT_DETECT(detr_detect_file(m, at("w.safetensors"), 0.5, out_), DETR_ERR_IMAGE, "w.safetensors");
  // Still alive and well: the model detects, and a success clears the message.
  detr_result *r = detect(m, at("img.jpg"), 0.0);
  ck_assert_str_eq(detr_last_error(), "");
  ck_assert_int_eq(detr_result_count(r), QUERIES);
  detr_result_free(r);
  detr_close(m);
  // Status names.
  ck_assert_str_eq(detr_status_name(DETR_ERR_IMAGE), "DETR_ERR_IMAGE");
  ck_assert_str_eq(detr_status_name((detr_status)99), "unknown status");
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("api");
  TCase *tc = tcase_create("api");
  tcase_add_unchecked_fixture(tc, setup_files, teardown_tmp);  // once: tests add files of other names
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, matches_evaluation);
  tcase_add_test(tc, checkpoint_sizes_and_names);
  tcase_add_test(tc, nonfinite_outputs_dropped);
  tcase_add_test(tc, extreme_shapes_every_variant);
  tcase_add_test(tc, two_threads_one_model);
  tcase_add_test(tc, two_threads_two_models);
  tcase_add_test(tc, batch_matches_single_images);
  tcase_add_test(tc, thread_option);
  tcase_add_test(tc, precision_option);
  tcase_add_test(tc, bad_models);
  tcase_add_test(tc, bad_images);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  // No fork: a library that exits on bad input would end this process, and the run would fail.
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
