// Writes the seed files of fuzz/corpus/<harness>/ with the project's own writers (synthetic
// dataset, safetensors writer, checkpoint_save, stb_image_write) plus hand-written edge cases:
//   build-fuzz/fuzz/fuzz_seeds OUT_DIR      (tools/fuzz.sh --seeds regenerates fuzz/corpus/)
// Every seed is named seed-*; inputs the fuzzer found and kept as regression tests are named
// crash-*, leak-*, timeout-* or cov-* beside them.
#define _DEFAULT_SOURCE  // mkdtemp
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <stb/stb_image_write.h>

#include "core/runtime.h"
#include "datasets/image.h"
#include "datasets/synth.h"
#include "fuzz_util.h"
#include "nn/model_io.h"
#include "tests/test_datasets_fixtures.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

static const char *out_dir;

static void fail(const char *what) {
  fprintf(stderr, "fuzz_seeds: %s: %s\n", what, strerror(errno));
  exit(1);
}

static const char *at(const char *harness, const char *name) {
  static char p[4][1024];
  static int next;
  char *b = p[next++ % 4];
  snprintf(b, 1024, "%s/%s", out_dir, harness);
  if (mkdir(b, 0755) && errno != EEXIST) fail(b);
  snprintf(b, 1024, "%s/%s/seed-%s", out_dir, harness, name);
  return b;
}

static void put(const char *harness, const char *name, const void *data, size_t n) {
  const char *path = at(harness, name);
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f)) fail(path);
}
static void put_text(const char *harness, const char *name, const char *text) {
  put(harness, name, text, strlen(text));
}

static void copy_file(const char *from, const char *harness, const char *name) {
  FILE *f = fopen(from, "rb");
  if (!f) fail(from);
  char *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap && !(buf = realloc(buf, cap = cap ? 2 * cap : 65536))) fail("realloc");
    size_t r = fread(buf + n, 1, cap - n, f);
    if (!r) break;
    n += r;
  }
  fclose(f);
  put(harness, name, buf, n);
  free(buf);
}

// --- COCO instances and results ---------------------------------------------------------------

// MINIMAL_COCO: tests/test_datasets_fixtures.h (nesting, crowd RLE, gaps, 2e0).

static const char *BAD_ITEMS_COCO =  // one of each bad item (skipped or fatal by policy)
    "{\"images\": [{\"id\": 1, \"file_name\": \"a.jpg\", \"width\": 10, \"height\": 10},"
    " {\"id\": 1, \"file_name\": \"dup.jpg\", \"width\": 10, \"height\": 10},"
    " {\"id\": 2, \"file_name\": \"\", \"width\": 10, \"height\": 10}, {\"id\": 3, \"width\": 0, \"height\": 1e20},"
    " [], 5, {\"id\": 4.0, \"file_name\": \"b.jpg\", \"width\": 32768, \"height\": 1}],"
    " \"annotations\": [{\"id\": 1, \"image_id\": 1, \"category_id\": 1, \"bbox\": [0, 0, 0, 5]},"
    " {\"id\": 2, \"image_id\": 1, \"category_id\": 99, \"bbox\": [1, 1, 2, 2]},"
    " {\"id\": 3, \"image_id\": 42, \"category_id\": 1, \"bbox\": [1, 1, 2, 2]},"
    " {\"id\": 4, \"image_id\": 1, \"category_id\": 1, \"bbox\": [20, 20, 2, 2]},"
    " {\"id\": 5, \"image_id\": 1, \"category_id\": 1, \"bbox\": [1, 1, 2]},"
    " {\"id\": 6, \"image_id\": 1, \"category_id\": 1, \"bbox\": [1e308, 1, 1e308, 2], \"area\": -1},"
    " {\"id\": 7, \"image_id\": 1, \"category_id\": 1, \"bbox\": [-5, -5, 8, 8], \"iscrowd\": 2},"
    " {\"id\": 1180591620717411303424, \"image_id\": 4, \"category_id\": 1, \"bbox\": [\"1\", 1, 2, 2]},"
    " {\"id\": 9, \"image_id\": 4, \"category_id\": 1, \"bbox\": [[1], 1, 2, 2], \"segmentation\": [[1, 2]]}],"
    " \"categories\": [{\"id\": 1, \"name\": \"a\"}, {\"id\": 1, \"name\": \"b\"}, {\"id\": -1, \"name\": \"c\"},"
    " {\"id\": 1048577, \"name\": \"big\"}, {\"name\": \"noid\"}]}";

static const char *RESULTS[] = {
    ("[{\"image_id\": 1, \"category_id\": 1, \"bbox\": [10, 20, 30, 40], \"score\": 0.9},"
     " {\"image_id\": 1, \"category_id\": 3, \"bbox\": [100, 100, 200, 150], \"score\": 0.8},"
     " {\"image_id\": 2, \"category_id\": 2, \"bbox\": [5, 5, 4, 4], \"score\": 0.5, \"id\": 3, \"area\": 1},"
     " {\"image_id\": 7, \"category_id\": 3, \"bbox\": [1, 1, 2, 2], \"score\": 1e-3},"
     " {\"image_id\": 2, \"category_id\": 9, \"bbox\": [0, 0, 1, 1], \"score\": 0.7}]"),
    "[]",
    ("[{\"image_id\": 2.0, \"category_id\": 2, \"bbox\": [5.5e0, 5, 4, 4], \"score\": 1, \"segmentation\": [[1, 2, "
     "3]]},"
     " {\"image_id\": 1, \"category_id\": 1, \"bbox\": [0, 0, 1e308, 1e308], \"score\": 0.25}]"),
    "[{\"image_id\": 99, \"category_id\": 1, \"bbox\": [1, 2, 3, 4], \"score\": 0.5}]",
    "[{\"image_id\": 1, \"category_id\": 1, \"bbox\": [1, 2, 3], \"score\": 0.5}]",
    "{\"image_id\": 1}",
};

static void coco_seeds(void) {
  char tmp[] = "/tmp/detr-fuzz-seeds.XXXXXX";
  if (!mkdtemp(tmp)) fail("mkdtemp");
  SynthConfig sc = synth_config_default();
  sc.out_dir = tmp;
  sc.n_train = 3, sc.n_val = 5, sc.min_side = 64, sc.max_side = 72, sc.max_objects = 3;
  DataError err;
  if (synth_generate(&sc, &err)) {
    fprintf(stderr, "fuzz_seeds: %s\n", err.msg);
    exit(1);
  }
  char path[1024];
  const char *harnesses[] = {"coco", "coco_gz"};
  for (int h = 0; h < 2; h++) {
    snprintf(path, sizeof path, "%s/annotations/instances_train.json", tmp);
    copy_file(path, harnesses[h], "synth-train.json");
    snprintf(path, sizeof path, "%s/annotations/instances_val.json", tmp);  // crowd RLE, polygons
    copy_file(path, harnesses[h], "synth-val.json");
    put_text(harnesses[h], "minimal.json", MINIMAL_COCO);
    put_text(harnesses[h], "bad-items.json", BAD_ITEMS_COCO);
    put_text(harnesses[h], "empty-sections.json", "{\"images\": [], \"annotations\": [], \"categories\": []}");
  }
  // A .json.gz as the coco harness sees it: compressed bytes (mutations hit the deflate stream).
  const char *gz_path = at("coco", "minimal.json.gz");
  gzFile gz = gzopen(gz_path, "wb9");
  if (!gz || gzwrite(gz, MINIMAL_COCO, (unsigned)strlen(MINIMAL_COCO)) <= 0 || gzclose(gz) != Z_OK) fail(gz_path);
  // Images: two synthetic JPEGs.
  for (int i = 1; i <= 2; i++) {
    char name[64];
    snprintf(path, sizeof path, "%s/val/%012d.jpg", tmp, i);
    snprintf(name, sizeof name, "synth-%d.jpg", i);
    copy_file(path, "image", name);
  }
  // Remove the synthetic dataset.
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  if (system(cmd) != 0) fail("rm -rf");
  for (size_t i = 0; i < sizeof RESULTS / sizeof RESULTS[0]; i++) {
    char name[32];
    snprintf(name, sizeof name, "results-%zu.json", i);
    put_text("cocoeval_results", name, RESULTS[i]);
  }
}

// --- images -------------------------------------------------------------------------------------

typedef struct {
  uint8_t *p;
  size_t n, cap;
} Mem;

static void mem_write(void *ctx, void *data, int size) {
  Mem *m = ctx;
  if (m->n + (size_t)size > m->cap && !(m->p = realloc(m->p, m->cap = 2 * (m->n + (size_t)size)))) fail("realloc");
  memcpy(m->p + m->n, data, (size_t)size);
  m->n += (size_t)size;
}

static void image_seeds(void) {
  uint8_t px[13 * 7 * 4];
  for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)(i * 37 + (i >> 3) * 11);
  for (int comp = 1; comp <= 4; comp++) {  // grey, grey+alpha, RGB, RGBA PNGs
    Mem m = {0};
    if (!stbi_write_png_to_func(mem_write, &m, 13, 7, comp, px, 13 * comp)) fail("stbi_write_png");
    char name[32];
    snprintf(name, sizeof name, "png-%dch.png", comp);
    put("image", name, m.p, m.n);
    free(m.p);
    if (comp == 1 || comp == 3) {  // baseline JPEGs (greyscale and 4:2:0 colour)
      m = (Mem){0};
      if (!stbi_write_jpg_to_func(mem_write, &m, 13, 7, comp, px, 75)) fail("stbi_write_jpg");
      snprintf(name, sizeof name, "jpeg-%dch.jpg", comp);
      put("image", name, m.p, m.n);
      free(m.p);
    }
  }
  put("image", "progressive-16x16.jpg", progressive_jpeg_16x16, sizeof progressive_jpeg_16x16);
  (void)pillow_7x5_to_4x3, (void)pillow_7x5_to_11x8, (void)pillow_5x7_to_3x9;  // the fixture's other arrays
  // One pixel wide and tall: extreme aspect ratios through the transforms.
  Mem m = {0};
  if (!stbi_write_png_to_func(mem_write, &m, 1, 300, 1, px, 1)) fail("stbi_write_png");
  put("image", "png-1x300.png", m.p, m.n);
  free(m.p);
}

// --- safetensors, model weights, checkpoints ------------------------------------------------------

static void save(StWriter *w, const char *harness, const char *name) {
  char err[1024];
  if (st_writer_save(w, at(harness, name), err, sizeof err)) {
    fprintf(stderr, "fuzz_seeds: %s\n", err);
    exit(1);
  }
  st_writer_free(w);
}

static void safetensors_seeds(void) {
  StWriter *w = st_writer_new();
  float f[6] = {1, -2, 3.5f, 0, 1e30f, -0.0f};
  double d[2] = {1e300, -1};
  int64_t i64[3] = {INT64_MIN, 0, INT64_MAX};
  int32_t i32[2] = {-7, 7};
  uint8_t u8[5] = {0, 1, 2, 254, 255}, b[2] = {0, 1};
  st_writer_add(w, "weight", ST_F32, 2, (int64_t[]){2, 3}, f);
  st_writer_add(w, "scalar", ST_F32, 0, NULL, f);
  st_writer_add(w, "empty", ST_F32, 3, (int64_t[]){0, 4, 1}, NULL);
  st_writer_add(w, "f64", ST_F64, 1, (int64_t[]){2}, d);
  st_writer_add(w, "i64", ST_I64, 1, (int64_t[]){3}, i64);
  st_writer_add(w, "i32", ST_I32, 2, (int64_t[]){1, 2}, i32);
  st_writer_add(w, "u8", ST_U8, 1, (int64_t[]){5}, u8);
  st_writer_add(w, "bool", ST_BOOL, 1, (int64_t[]){2}, b);
  st_writer_set_metadata(w, "format", "pt");
  st_writer_set_metadata(w, "note", "\"quoted\" \\ \xc3\xa9 \t");
  save(w, "safetensors", "dtypes.safetensors");
  w = st_writer_new();
  save(w, "safetensors", "empty.safetensors");
  w = st_writer_new();
  st_writer_add(w, "a.b.c", ST_F32, 4, (int64_t[]){1, 1, 2, 1}, f);
  st_writer_set_metadata(w, "k", "");
  save(w, "safetensors", "rank4.safetensors");
  // Foreign dtypes and an unknown field, written by hand (the writer keeps to its six dtypes).
  const char *hdr =
      "{\"h\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]},"
      "\"q\":{\"dtype\":\"F8_E4M3\",\"shape\":[2,2],\"data_offsets\":[4,8],\"extra\":{\"x\":[1]}}}";
  size_t hn = strlen(hdr);
  uint8_t file[512] = {0};
  for (int k = 0; k < 8; k++) file[k] = (uint8_t)(hn >> (8 * k));
  memcpy(file + 8, hdr, hn);
  put("safetensors", "foreign.safetensors", file, 8 + hn + 8);
}

// A `detr step` batch: 2 images of 2x3, one with 2 boxes, one with none.
static void step_batch_seed(void) {
  StWriter *w = st_writer_new();
  float px[2 * 3 * 2 * 3];
  for (int i = 0; i < 36; i++) px[i] = (float)i / 36 - 0.5f;
  uint8_t mask[12] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1};
  float boxes[8] = {0.5f, 0.5f, 0.2f, 0.3f, 0.25f, 0.75f, 0.5f, 0.5f};
  int64_t labels[2] = {1, 3};
  st_writer_add(w, "images", ST_F32, 4, (int64_t[]){2, 3, 2, 3}, px);
  st_writer_add(w, "mask", ST_U8, 3, (int64_t[]){2, 2, 3}, mask);
  st_writer_add(w, "targets.0.boxes", ST_F32, 2, (int64_t[]){2, 4}, boxes);
  st_writer_add(w, "targets.0.labels", ST_I64, 1, (int64_t[]){2}, labels);
  st_writer_add(w, "targets.1.boxes", ST_F32, 2, (int64_t[]){0, 4}, NULL);
  st_writer_add(w, "targets.1.labels", ST_I64, 1, (int64_t[]){0}, NULL);
  save(w, "safetensors", "step-batch.safetensors");
}

// The fuzz model: weights (model_load), a pretrain-style backbone file, checkpoints.
static void model_seeds(void) {
  DetrConfig cfg;
  fuzz_model_config(&cfg);
  DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(m, 1);
  StWriter *w = st_writer_new();
  params_save(&m->params, w, "");
  save(w, "model_load", "weights.safetensors");
  w = st_writer_new();
  for (int i = 0; i < m->params.count; i++)
    if (!strncmp(m->params.items[i].name, "backbone.", 9))
      st_writer_add_tensor(w, m->params.items[i].name, m->params.items[i].tensor);
  save(w, "model_load", "backbone.safetensors");
  AdamW opt;
  adamw_init(&opt, &m->params, optim_config_default());
  opt.step = 3;
  TrainState st = {.step = 3,
                   .epoch = 1,
                   .next_batch = 2,
                   .seed = 42,
                   .dropout_rng = rng_make(7),
                   .best_map = 0.25,
                   .world_size = 1,
                   .global_batch = 2,
                   .run = {.known = true,
                           .epochs = 50,
                           .lr_drop = 33,
                           .batch = 2,
                           .pad_multiple = 1,
                           .image_size = 64,
                           .max_size = 96,
                           .augment = 1,
                           .lr = 1e-4f,
                           .lr_backbone = 1e-5f,
                           .weight_decay = 1e-4f,
                           .clip = 0.1f,
                           .ce = NAN,
                           .bbox = 5,
                           .giou = 2,
                           .eos = 0.1f,
                           .cost_class = NAN,
                           .cost_bbox = 5,
                           .cost_giou = 2}};
  char err[1024];
  if (checkpoint_save(at("checkpoint", "with-optimizer.safetensors"), m, &opt, &st, "train --data d --image-size 64",
                      "1:circle;3:square", err, sizeof err) ||
      checkpoint_save(at("checkpoint", "model-only.safetensors"), m, NULL, &st, NULL, NULL, err, sizeof err)) {
    fprintf(stderr, "fuzz_seeds: %s\n", err);
    exit(1);
  }
  adamw_free(&opt);
  detr_model_free(m);
}

// --- config files and metrics ---------------------------------------------------------------------

static void text_seeds(void) {
  const char *presets[] = {"detr-r50", "detr-r18-small", "tiny"};
  char text[8192];
  for (int i = 0; i < 3; i++) {
    DetrConfig cfg;
    detr_config_preset(presets[i], &cfg);
    if (i == 1) detr_config_set(&cfg, "encoder_attn", "enact", text, sizeof text);
    if (i == 2) detr_config_set(&cfg, "encoder_attn", "sra", text, sizeof text);
    detr_config_format(&cfg, text, sizeof text);
    char name[64];
    snprintf(name, sizeof name, "%s.conf", presets[i]);
    put_text("config", name, text);
  }
  put_text("config", "comments.conf",
           "# a model\n\n  hidden_dim = 64 # width\nnheads=4\r\nenact=true\nenact_sigma=2.5\ndropout=0\n"
           "pre_norm=1\naux_loss=false\nbackbone=18\nbackbone_width=16\nnum_queries=1e3\n");
  put_text("metrics", "run.jsonl",
           "{\"type\": \"train\", \"epoch\": 0, \"step\": 1, \"loss\": 12.5, \"loss_ce\": 2.1, \"lr\": 0.0001}\n"
           "{\"type\": \"train\", \"epoch\": 0, \"step\": 2, \"loss\": 11.25}\n"
           "{\"type\": \"eval\", \"epoch\": 0, \"step\": 2, \"AP\": 0.125000, \"AP50\": 0.250000, \"images\": 5}\n"
           "{\"type\": \"train\", \"epoch\": 1, \"step\": 3, \"loss\": nan}\n"
           "{\"type\": \"train\", \"epoch\": 1, \"step\": 1e308, \"loss\": -1e308}\n"
           "{\"type\": \"eval\", \"epoch\": 1, \"step\": 3, \"AP\": 0.5, \"AP50\": inf}\n"
           "{\"type\": \"train\", \"step\": 4, \"lo");
}

int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  if (argc != 2) {
    fprintf(stderr, "usage: fuzz_seeds OUT_DIR\n");
    return 2;
  }
  out_dir = argv[1];
  if (mkdir(out_dir, 0755) && errno != EEXIST) fail(out_dir);
  coco_seeds();
  image_seeds();
  safetensors_seeds();
  step_batch_seed();
  model_seeds();
  text_seeds();
  return 0;
}
