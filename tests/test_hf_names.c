// Hugging Face transformers' tensor names (nn/hf_names.c): tiny DETR and Conditional DETR models
// written under transformers' names by the C side (q, k, v split out of in_proj; both backbone
// namings) load back bit for bit; an unmapped or a missing tensor is an error naming it; the
// format is found from the names; such weights resize as transformers does (resize=transformers);
// `detr export --format transformers` writes a folder that loads back. The names themselves are
// checked against transformers by tools/parity_transformers.py.
#define _POSIX_C_SOURCE 200809L  // mkdtemp
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api/model_file.h"
#include "cli/commands.h"
#include "core/runtime.h"
#include "datasets/transforms.h"
#include "nn/detr.h"
#include "nn/model_io.h"
#include "tests/shell.h"

static char err[8192];

static const char *at(const char *name) {  // a path in the test's folder
  static char buf[4][256];
  static int k = 0;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", test_root, name);
  return buf[k];
}

static char *read_text(const char *path) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "%s", path);
  char *text = calloc(1, 1 << 20);
  size_t n = fread(text, 1, (1 << 20) - 1, f);
  ck_assert(n > 0);
  fclose(f);
  return text;
}

// The tiny preset, with DETR's decoder or Conditional DETR's, every tensor random (batch norms too).
static DetrModel *tiny_model(bool conditional, uint64_t seed) {
  DetrConfig cfg;
  ck_assert_int_eq(detr_config_preset("tiny", &cfg), 0);
  if (conditional) ck_assert_int_eq(detr_config_set(&cfg, "decoder", "conditional", err, sizeof err), 0);
  DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
  Rng rng = rng_make(seed);
  for (int i = 0; i < m->params.count; i++) tensor_uniform_(m->params.items[i].tensor, &rng, 0.5f, 1.5f);
  return m;
}

static void save_hf(const DetrModel *m, HfFormat fmt, const char *path) {
  StWriter *w = st_writer_new();
  ck_assert_msg(params_save_hf(&m->params, w, fmt, err, sizeof err) == 0, "%s", err);
  ck_assert_msg(st_writer_save(w, path, err, sizeof err) == 0, "%s", err);
  st_writer_free(w);
}

// src's tensors into dst, but `skip`, plus an F32 [2] tensor `extra` (NULL: none).
static void copy_file(const char *src, const char *dst, const char *skip, const char *extra) {
  StFile *f = st_open(src, err, sizeof err);
  ck_assert_msg(f != NULL, "%s", err);
  StWriter *w = st_writer_new();
  for (int i = 0; i < st_count(f); i++) {
    const StEntry *e = st_entry(f, i);
    if (!skip || strcmp(e->name, skip)) st_writer_add(w, e->name, e->dtype, e->ndim, e->shape, st_data(f, e));
  }
  if (extra) st_writer_add(w, extra, ST_F32, 1, (int64_t[]){2}, (float[]){1, 2});
  ck_assert_msg(st_writer_save(w, dst, err, sizeof err) == 0, "%s", err);
  st_writer_free(w);
  st_close(f);
}

static int load(DetrModel *m, const char *path) {
  StFile *f = st_open(path, err, sizeof err);
  ck_assert_msg(f != NULL, "%s", err);
  int rc = params_load(&m->params, f, NULL, err, sizeof err);
  st_close(f);
  return rc;
}

static void assert_same_tensors(const DetrModel *a, const DetrModel *b) {
  ck_assert_int_eq(a->params.count, b->params.count);
  for (int i = 0; i < a->params.count; i++) {
    const Tensor *x = a->params.items[i].tensor, *y = b->params.items[i].tensor;
    ck_assert_msg(!memcmp(x->data, y->data, (size_t)x->numel * sizeof(float)), "%s differs", a->params.items[i].name);
  }
}

static void assert_contains(const char *text, const char *part) {
  ck_assert_msg(strstr(text, part) != NULL, "'%s' not in:\n%s", part, text);
}

static void expect_name(HfFormat fmt, const char *name, int parts, const char *first) {
  char out[HF_MAX_PARTS][HF_NAME_MAX];
  ck_assert_int_eq(hf_names(fmt, name, out), parts);
  if (parts) ck_assert_str_eq(out[0], first);
}

// A few names as transformers' modeling files spell them (an independent statement of the table).
START_TEST(names_as_transformers_spells_them) {
  expect_name(HF_TIMM, "backbone.0.body.layer2.1.bn3.running_var", 1,
              "model.backbone.conv_encoder.model.layer2.1.bn3.running_var");
  expect_name(HF_RESNET, "backbone.0.body.layer2.1.bn3.running_var", 1,
              "model.backbone.conv_encoder.model.encoder.stages.1.layers.1.layer.2.normalization.running_var");
  expect_name(HF_RESNET, "backbone.0.body.layer4.0.downsample.0.weight", 1,
              "model.backbone.conv_encoder.model.encoder.stages.3.layers.0.shortcut.convolution.weight");
  expect_name(HF_RESNET, "backbone.0.body.conv1.weight", 1,
              "model.backbone.conv_encoder.model.embedder.embedder.convolution.weight");
  expect_name(HF_TIMM, "transformer.encoder.layers.5.self_attn.in_proj_weight", 3,
              "model.encoder.layers.5.self_attn.q_proj.weight");
  expect_name(HF_TIMM, "transformer.decoder.layers.0.multihead_attn.in_proj_bias", 3,
              "model.decoder.layers.0.encoder_attn.q_proj.bias");
  expect_name(HF_TIMM, "transformer.decoder.layers.3.norm2.weight", 1,
              "model.decoder.layers.3.encoder_attn_layer_norm.weight");
  expect_name(HF_TIMM, "transformer.decoder.layers.0.ca_qpos_sine_proj.bias", 1,
              "model.decoder.layers.0.ca_qpos_sine_proj.bias");
  expect_name(HF_TIMM, "transformer.decoder.layers.1.cross_attn.out_proj.weight", 1,
              "model.decoder.layers.1.encoder_attn.out_proj.weight");
  expect_name(HF_TIMM, "transformer.decoder.norm.bias", 1, "model.decoder.layernorm.bias");
  expect_name(HF_TIMM, "class_embed.weight", 1, "class_labels_classifier.weight");
  expect_name(HF_TIMM, "bbox_embed.layers.2.bias", 1, "bbox_predictor.layers.2.bias");
  expect_name(HF_TIMM, "query_embed.weight", 1, "model.query_position_embeddings.weight");
  expect_name(HF_TIMM, "transformer.encoder.norm.weight", 0, NULL);  // pre-norm: transformers has none
  expect_name(HF_NONE, "anything.at.all", 1, "anything.at.all");
}
END_TEST

// Written under transformers' names (both backbones, both decoders), read back bit for bit; the
// q, k and v tensors are in_proj's rows.
START_TEST(roundtrip_bit_for_bit) {
  for (int conditional = 0; conditional < 2; conditional++)
    for (HfFormat fmt = HF_TIMM; fmt <= HF_RESNET; fmt++) {
      DetrModel *a = tiny_model(conditional, 1), *b = tiny_model(conditional, 2);
      save_hf(a, fmt, at("hf.safetensors"));
      StFile *f = st_open(at("hf.safetensors"), err, sizeof err);
      ck_assert_int_eq(hf_format(f), fmt);
      const StEntry *k = st_find(f, "model.encoder.layers.1.self_attn.k_proj.weight");
      const Tensor *in = params_find(&a->params, "transformer.encoder.layers.1.self_attn.in_proj_weight")->tensor;
      int64_t d = in->shape.d[1];
      ck_assert_ptr_nonnull(k);
      ck_assert_int_eq(k->shape[0], d);
      ck_assert(!memcmp(st_data(f, k), in->data + d * d, (size_t)(d * d) * sizeof(float)));
      ParamsFit fit = params_fit(&b->params, f);
      ck_assert_int_eq(fit.fit, b->params.count);
      ck_assert_int_eq(fit.missing + fit.other + fit.unused, 0);
      st_close(f);
      ck_assert_msg(load(b, at("hf.safetensors")) == 0, "%s", err);
      assert_same_tensors(a, b);
      detr_model_free(a);
      detr_model_free(b);
    }
}
END_TEST

// A tensor the table does not map, or one the model needs and the file lacks: an error naming it,
// and the model unchanged.
START_TEST(unmapped_and_missing_are_named) {
  DetrModel *a = tiny_model(false, 1), *b = tiny_model(false, 2), *b0 = tiny_model(false, 2);
  save_hf(a, HF_TIMM, at("hf.safetensors"));
  copy_file(at("hf.safetensors"), at("extra.safetensors"), NULL, "model.backbone.conv_encoder.model.fc.weight");
  ck_assert_int_eq(load(b, at("extra.safetensors")), -1);
  assert_contains(err, "unexpected: model.backbone.conv_encoder.model.fc.weight");
  copy_file(at("hf.safetensors"), at("missing.safetensors"), "model.decoder.layers.1.encoder_attn.v_proj.bias", NULL);
  ck_assert_int_eq(load(b, at("missing.safetensors")), -1);
  assert_contains(err, "missing: model.decoder.layers.1.encoder_attn.v_proj.bias");
  assert_contains(err, "transformer.decoder.layers.1.multihead_attn.in_proj_bias");  // what it is to detr-c
  assert_contains(err, "transformers (timm backbone)");
  assert_same_tensors(b, b0);
  // A model transformers cannot hold is refused by name, nothing written.
  DetrConfig pre = a->cfg;
  pre.pre_norm = true;
  DetrModel *p = detr_model_create(&pre, DEVICE_CPU);
  StWriter *w = st_writer_new();
  ck_assert_int_eq(params_save_hf(&p->params, w, HF_TIMM, err, sizeof err), -1);
  assert_contains(err, "transformer.encoder.norm.weight");
  st_writer_free(w);
  detr_model_free(p);
  detr_model_free(a);
  detr_model_free(b);
  detr_model_free(b0);
}
END_TEST

// transformers' DetrImageProcessor keeps the unrounded short side for the long one.
START_TEST(resize_rules) {
  int w, h;
  aug_resize_size(900, 512, 800, 1333, false, &w, &h);
  ck_assert_int_eq(w, 1332);
  ck_assert_int_eq(h, 758);
  aug_resize_size(900, 512, 800, 1333, true, &w, &h);
  ck_assert_int_eq(w, 1333);
  ck_assert_int_eq(h, 758);
  aug_resize_size(512, 900, 800, 1333, true, &w, &h);  // portrait: the same
  ck_assert_int_eq(w, 758);
  ck_assert_int_eq(h, 1333);
  aug_resize_size(640, 480, 800, 1333, true, &w, &h);  // max_size not reached: both rules agree
  ck_assert_int_eq(w, 1066);
  ck_assert_int_eq(h, 800);
  aug_resize_size(900, 512, 800, 1333, false, &w, &h);
  ck_assert_int_eq(w, 1332);
}
END_TEST

// Weights from a transformers file resize as transformers does unless --set says otherwise; the
// setting is part of the config a checkpoint stores.
START_TEST(transformers_weights_resize_as_transformers) {
  DetrModel *a = tiny_model(false, 1), *m = NULL;
  save_hf(a, HF_TIMM, at("hf.safetensors"));
  ck_assert_msg(
      model_file_load(NULL, at("hf.safetensors"), "tiny", NULL, 0, DEVICE_CPU, &m, NULL, err, sizeof err) == 0, "%s",
      err);
  ck_assert(m->cfg.resize_transformers);
  assert_same_tensors(a, m);
  char text[2048];
  detr_config_format(&m->cfg, text, sizeof text);
  assert_contains(text, "resize=transformers\n");
  detr_model_free(m);
  const char *sets[] = {"resize=reference"};
  ck_assert_int_eq(model_file_load(NULL, at("hf.safetensors"), "tiny", sets, 1, DEVICE_CPU, &m, NULL, err, sizeof err),
                   0);
  ck_assert(!m->cfg.resize_transformers);
  detr_model_free(m);
  StWriter *w = st_writer_new();  // the reference's names: the reference's rule
  params_save(&a->params, w, "");
  ck_assert_int_eq(st_writer_save(w, at("ref.safetensors"), err, sizeof err), 0);
  st_writer_free(w);
  ck_assert_int_eq(model_file_load(NULL, at("ref.safetensors"), "tiny", NULL, 0, DEVICE_CPU, &m, NULL, err, sizeof err),
                   0);
  ck_assert(!m->cfg.resize_transformers);
  detr_model_free(m);
  detr_model_free(a);
}
END_TEST

// `detr export --format transformers --weights ref.safetensors --config tiny --set decoder=conditional
// FLAGS... OUT` (paths copied: at()'s buffers are reused).
static int export(const char *out, const char *const *flags, int n) {
  char weights[256], dir[256];
  snprintf(weights, sizeof weights, "%s", at("ref.safetensors"));
  snprintf(dir, sizeof dir, "%s", at(out));
  const char *argv[16] = {"detr",  "export",   "--format", "transformers", "--weights",
                          weights, "--config", "tiny",     "--set",        "decoder=conditional"};
  int argc = 10;
  for (int i = 0; i < n; i++) argv[argc++] = flags[i];
  argv[argc++] = dir;
  Dist alone = DIST_SINGLE;
  return cmd_export(argc, (char **)argv, &alone);
}

// `detr export --format transformers`: config.json with the model's sizes, model.safetensors that
// loads back bit for bit; an earlier export is replaced, another file is not; a model transformers
// has no place for is refused.
START_TEST(export_writes_a_folder_that_loads_back) {
  DetrModel *a = tiny_model(true, 1), *b = tiny_model(true, 2);
  StWriter *w = st_writer_new();
  params_save(&a->params, w, "");
  ck_assert_int_eq(st_writer_save(w, at("ref.safetensors"), err, sizeof err), 0);
  st_writer_free(w);
  const char *resnet[] = {"--backbone", "resnet"};
  ck_assert_int_eq(export("out", resnet, 2), 0);
  ck_assert_msg(load(b, at("out/model.safetensors")) == 0, "%s", err);
  assert_same_tensors(a, b);
  StFile *f = st_open(at("out/model.safetensors"), err, sizeof err);
  ck_assert_str_eq(st_metadata(f, "format"), "pt");  // transformers' loader requires it
  ck_assert_int_eq(hf_format(f), HF_RESNET);
  st_close(f);
  char *json = read_text(at("out/config.json"));
  assert_contains(json, "\"model_type\": \"conditional_detr\"");
  assert_contains(json, "\"num_queries\": 10,");
  assert_contains(json, "\"layer_type\": \"basic\"");
  assert_contains(json, "\"6\": \"LABEL_6\"");
  free(json);
  ck_assert_int_eq(export("out", resnet, 2), 0);  // an earlier export is replaced
  ck_assert_int_eq(sh("mkdir -p %s && cp %s %s", at("other"), at("ref.safetensors"), at("other/model.safetensors")), 0);
  ck_assert_int_eq(export("other", NULL, 0), 1);  // a file of other names is not
  f = st_open(at("other/model.safetensors"), err, sizeof err);
  ck_assert_int_eq(hf_format(f), HF_NONE);
  st_close(f);
  const char *enact[] = {"--set", "enact=true"};
  ck_assert_int_eq(export("out2", enact, 2), 1);
  ck_assert_int_eq(access(at("out2"), F_OK), -1);
  detr_model_free(a);
  detr_model_free(b);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());
  strcpy(test_root, "/tmp/detr_hf_XXXXXX");
  if (!mkdtemp(test_root)) return 1;
  Suite *s = suite_create("hf_names");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, names_as_transformers_spells_them);
  tcase_add_test(tc, roundtrip_bit_for_bit);
  tcase_add_test(tc, unmapped_and_missing_are_named);
  tcase_add_test(tc, resize_rules);
  tcase_add_test(tc, transformers_weights_resize_as_transformers);
  tcase_add_test(tc, export_writes_a_folder_that_loads_back);
  suite_add_tcase(s, tc);
  return sh_run_suite(s);  // the folder removed when every test passed
}
