// The encoder-attention seam (nn/encoder_attn.h): every variant ignores the values at padded pixels,
// the registry and settings round-trip through the config text, DETR weights load into every
// variant, and a DETR model runs with each. The gradient checks are in test_grad.c
// (grad.encoder_attn.<name>).
#define _DEFAULT_SOURCE  // mkstemp
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/runtime.h"
#include "nn/detr.h"
#include "nn/model_io.h"
#include "tests/gradcheck.h"

static const NnCtx EVAL_CTX = {.training = false};

// Changing src and pos at padded pixels changes no output at a valid pixel; for a variant whose
// reference lets padded pixels in (attends_padding: enact_official), it does change them.
static void check_padding_ignored(const char *name) {
  TransformerShape s = {.dim = 16, .heads = 4, .ffn_dim = 24, .dropout = 0.1f};
  AttnSettings settings;
  attn_settings_default(&settings);
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  EncoderLayer layer = encoder_layer_create(&ps, "enc", s, encoder_attn_find(name), &settings);
  Rng init = rng_make(5);
  encoder_layer_init(&layer, &init);
  const int64_t B = 2, Hp = 5, Wp = 6, N = Hp * Wp, d = 16;
  uint8_t pad[2 * 30] = {0};
  for (int p = 0; p < N; p++) pad[N + p] = p / Wp >= 3 || p % Wp >= 4;  // image 1: 3x4 of 5x6
  FeatureGeometry g;
  feature_geometry_make(pad, B, Hp, Wp, DEVICE_CPU, &g);
  Tensor *src = test_uniform(SHAPE(B, N, d), -1, 1, 10, false), *pos = test_uniform(SHAPE(B, N, d), -1, 1, 11, false);
  char err[256];
  ScopeMark mark = tensor_scope_mark();
  Tensor *y0 = encoder_layer_forward(&layer, &EVAL_CTX, src, pos, &g, NULL, err, sizeof err);
  ck_assert_msg(y0 != NULL, "%s: %s", name, err);
  float *a = malloc((size_t)(B * N * d) * sizeof(float)), *b = malloc((size_t)(B * N * d) * sizeof(float));
  tensor_to_host(y0, a);
  Rng noise = rng_make(12);
  for (int64_t i = 0; i < B * N; i++)
    if (pad[i])
      for (int64_t c = 0; c < d; c++) {
        src->data[i * d + c] += 10.0f * (rng_next_uniform(&noise) - 0.5f);
        pos->data[i * d + c] -= 7.0f * (rng_next_uniform(&noise) - 0.5f);
      }
  Tensor *y1 = encoder_layer_forward(&layer, &EVAL_CTX, src, pos, &g, NULL, err, sizeof err);
  ck_assert_msg(y1 != NULL, "%s: %s", name, err);
  tensor_to_host(y1, b);
  double worst = 0.0;
  for (int64_t i = 0; i < B * N; i++)
    if (!pad[i])
      for (int64_t c = 0; c < d; c++) worst = fmax(worst, fabs((double)a[i * d + c] - b[i * d + c]));
  if (layer.attn->attends_padding)
    ck_assert_msg(worst > 1e-3, "%s attention: valid outputs did not move (%g) when padded pixels changed", name,
                  worst);
  else
    ck_assert_msg(worst < 1e-5, "%s attention: a valid pixel's output moved by %g when padded pixels changed", name,
                  worst);
  // ... and the padded values did reach the layer (the check can fail): some padded output moved.
  double moved = 0.0;
  for (int64_t i = 0; i < B * N; i++)
    if (pad[i])
      for (int64_t c = 0; c < d; c++) moved = fmax(moved, fabs((double)a[i * d + c] - b[i * d + c]));
  ck_assert_msg(moved > 1e-3, "%s: the padded pixels' own outputs did not change", name);
  tensor_scope_release(mark);
  free(a), free(b);
  tensor_release(src), tensor_release(pos);
  feature_geometry_free(&g);
  encoder_layer_free(&layer);
  params_free(&ps);
}

START_TEST(padding_ignored_by_every_variant) {
  for (int i = 0; i < encoder_attn_count(); i++) check_padding_ignored(encoder_attn_at(i)->name);
}
END_TEST

START_TEST(sra_ratio_one_is_dense) {
  DetrConfig cfg;
  ck_assert_int_eq(detr_config_preset("tiny", &cfg), 0);
  char err[256];
  ck_assert_int_eq(detr_config_set(&cfg, "sra_ratio", "1", err, sizeof err), 0);
  DetrModel *dense = detr_model_create(&cfg, DEVICE_CPU);
  ck_assert_int_eq(detr_config_set(&cfg, "encoder_attn", "sra", err, sizeof err), 0);
  DetrModel *sra = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(dense, 3);
  detr_model_init(sra, 3);
  ck_assert_int_eq(dense->params.count, sra->params.count);  // R = 1: no parameters of its own
  Tensor *images = test_uniform(SHAPE(2, 64, 96, 3), -2, 2, 20, false);
  uint8_t *mask = calloc(2 * 64 * 96, 1);
  for (int y = 0; y < 64; y++)
    for (int x = 64; x < 96; x++) mask[64 * 96 + y * 96 + x] = 1;
  ScopeMark mark = tensor_scope_mark();
  DetrOutput a, b;
  ck_assert_int_eq(detr_model_forward(dense, &EVAL_CTX, images, mask, &a, err, sizeof err), 0);
  ck_assert_int_eq(detr_model_forward(sra, &EVAL_CTX, images, mask, &b, err, sizeof err), 0);
  const Tensor *la = a.layers[a.n_layers - 1].logits, *lb = b.layers[b.n_layers - 1].logits;
  ck_assert_mem_eq(la->data, lb->data, (size_t)la->numel * sizeof(float));
  detr_output_free(&a), detr_output_free(&b);
  tensor_scope_release(mark);
  free(mask);
  tensor_release(images);
  detr_model_free(dense), detr_model_free(sra);
}
END_TEST

START_TEST(config_round_trip_and_errors) {
  DetrConfig cfg;
  ck_assert_int_eq(detr_config_preset("tiny", &cfg), 0);
  char err[256], text[2048];
  ck_assert_str_eq(detr_encoder_attn(&cfg)->name, "dense");
  ck_assert_int_eq(detr_config_set(&cfg, "encoder_attn", "focused", err, sizeof err), 0);
  ck_assert_int_eq(detr_config_set(&cfg, "focused_kernel", "3", err, sizeof err), 0);
  detr_config_format(&cfg, text, sizeof text);
  ck_assert_ptr_nonnull(strstr(text, "encoder_attn=focused\n"));
  ck_assert_ptr_nonnull(strstr(text, "focused_kernel=3\n"));
  ck_assert_ptr_null(strstr(text, "enact_sigma"));  // only the chosen variant's settings
  DetrConfig back;
  ck_assert_int_eq(detr_config_preset("tiny", &back), 0);
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    char *eq = strchr(line, '=');
    *eq = 0;
    ck_assert_msg(detr_config_set(&back, line, eq + 1, err, sizeof err) == 0, "%s", err);
  }
  ck_assert_ptr_eq(back.encoder_attn, encoder_attn_find("focused"));
  ck_assert_double_eq(attn_setting(&back.attn_settings, "focused_kernel"), 3.0);
  // The NAME=true shortcut, as older checkpoints' "enact=true" lines; false returns to dense.
  ck_assert_int_eq(detr_config_set(&back, "enact", "true", err, sizeof err), 0);
  ck_assert_str_eq(detr_encoder_attn(&back)->name, "enact");
  ck_assert_int_eq(detr_config_set(&back, "enact", "false", err, sizeof err), 0);
  ck_assert_str_eq(detr_encoder_attn(&back)->name, "dense");
  // Errors name the key and what is allowed.
  ck_assert_int_eq(detr_config_set(&back, "encoder_attn", "flash", err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "dense|enact|efficient|hydra|focused|sra"));
  ck_assert_int_eq(detr_config_set(&back, "sra_ratio", "0", err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "sra_ratio"));
  ck_assert_int_eq(detr_config_set(&back, "enact_sigma", "abc", err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "not a number"));
}
END_TEST

// A DETR state (no variant parameters) loads into every variant (but one with its own projections,
// which refuses it naming what is missing and unused); the variant's own parameters keep their
// initialisation; the forward runs.
START_TEST(detr_weights_load_into_every_variant) {
  DetrConfig cfg;
  ck_assert_int_eq(detr_config_preset("tiny", &cfg), 0);
  DetrModel *plain = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(plain, 1);
  char path[] = "/tmp/detr-attn-XXXXXX", err[2048];
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  StWriter *w = st_writer_new();
  params_save(&plain->params, w, "");
  ck_assert_int_eq(st_writer_save(w, path, err, sizeof err), 0);
  st_writer_free(w);
  Tensor *images = test_uniform(SHAPE(2, 64, 96, 3), -2, 2, 21, false);
  uint8_t *mask = calloc(2 * 64 * 96, 1);
  for (int y = 32; y < 64; y++)
    for (int x = 0; x < 96; x++) mask[64 * 96 + y * 96 + x] = 1;
  for (int i = 0; i < encoder_attn_count(); i++) {
    cfg.encoder_attn = encoder_attn_at(i);
    DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
    detr_model_init(m, 2);
    Param *a = params_find(&plain->params, "transformer.encoder.layers.1.self_attn.in_proj_weight");
    Param *b = params_find(&m->params, "transformer.encoder.layers.1.self_attn.in_proj_weight");
    if (cfg.encoder_attn->own_projections) {  // enact_official: its reference's names, so DETR's are refused
      ck_assert_ptr_null(b);
      ck_assert_ptr_nonnull(params_find(&m->params, "transformer.encoder.layers.1.self_attn.W_q.weight"));
      ck_assert_int_eq(params_load_file(&m->params, path, err, sizeof err), -1);
      ck_assert_msg(strstr(err, "missing: transformer.encoder.layers.0.self_attn.W_q.weight"), "%s", err);
    } else {
      ck_assert_msg(params_load_file(&m->params, path, err, sizeof err) == 0, "%s: %s", cfg.encoder_attn->name, err);
      ck_assert_mem_eq(a->tensor->data, b->tensor->data, (size_t)a->tensor->numel * sizeof(float));
    }
    ScopeMark mark = tensor_scope_mark();
    DetrOutput out;
    ck_assert_msg(detr_model_forward(m, &EVAL_CTX, images, mask, &out, err, sizeof err) == 0, "%s", err);
    const Tensor *logits = out.layers[out.n_layers - 1].logits;
    for (int64_t k = 0; k < logits->numel; k++) ck_assert(isfinite(logits->data[k]));
    detr_output_free(&out);
    tensor_scope_release(mark);
    detr_model_free(m);
  }
  unlink(path);
  free(mask);
  tensor_release(images);
  detr_model_free(plain);
}
END_TEST

// Swin (nn/attn_swin.c) with 3x3 windows: an image's valid outputs are the same alone (a 4x5 map,
// padded to 6x6 for the windows) as in a batch whose 7x8 map pads it (9x9 for the windows), in the
// plain layer and in the shifted one; windows of padding only give finite outputs and gradients.
static Tensor *swin_layer(EncoderLayer *l, Tensor *src, Tensor *pos, const uint8_t *pad, int64_t B, int64_t Hp,
                          int64_t Wp) {
  FeatureGeometry g;
  feature_geometry_make(pad, B, Hp, Wp, DEVICE_CPU, &g);
  char err[256];
  Tensor *y = encoder_layer_forward(l, &EVAL_CTX, src, pos, &g, NULL, err, sizeof err);
  ck_assert_msg(y != NULL, "%s", err);
  feature_geometry_free(&g);
  return y;
}

START_TEST(swin_image_alone_equals_batched) {
  TransformerShape s = {.dim = 16, .heads = 4, .ffn_dim = 24, .dropout = 0.1f};
  AttnSettings settings;
  attn_settings_default(&settings);
  char err[256];
  ck_assert_int_eq(attn_settings_set(&settings, "swin_window", "3", err, sizeof err), 1);
  const int64_t B = 2, Hp = 7, Wp = 8, N = Hp * Wp, h = 4, w = 5, d = 16;
  uint8_t pad[2 * 56] = {0}, none[20] = {0};
  for (int p = 0; p < N; p++) pad[N + p] = p / Wp >= h || p % Wp >= w;  // image 1: 4x5 of 7x8
  for (int index = 0; index < 2; index++) {
    ParamStore ps;
    params_init(&ps, DEVICE_CPU);
    EncoderLayer layer = encoder_layer_create(&ps, "enc", s, encoder_attn_find("swin"), &settings);
    layer.index = index;
    Rng init = rng_make(7);
    encoder_layer_init(&layer, &init);
    tensor_normal_(params_find(&ps, "enc.self_attn.relative_position_bias_table")->tensor, &init, 0.0f, 1.0f);
    Tensor *src = test_uniform(SHAPE(B, N, d), -1, 1, 30, true), *pos = test_uniform(SHAPE(B, N, d), -1, 1, 31, false);
    Tensor *src1 = tensor_zeros(DEVICE_CPU, SHAPE(1, h * w, d)), *pos1 = tensor_zeros(DEVICE_CPU, SHAPE(1, h * w, d));
    for (int64_t p = 0; p < h * w; p++)
      for (int64_t c = 0; c < d; c++) {
        int64_t q = N + p / w * Wp + p % w;  // the pixel's place in the batch
        src1->data[p * d + c] = src->data[q * d + c];
        pos1->data[p * d + c] = pos->data[q * d + c];
      }
    ScopeMark mark = tensor_scope_mark();
    Tensor *batched = swin_layer(&layer, src, pos, pad, B, Hp, Wp),
           *alone = swin_layer(&layer, src1, pos1, none, 1, h, w);
    double worst = 0.0;
    for (int64_t p = 0; p < h * w; p++)
      for (int64_t c = 0; c < d; c++)
        worst = fmax(worst, fabs((double)alone->data[p * d + c] - batched->data[(N + p / w * Wp + p % w) * d + c]));
    ck_assert_msg(worst < 1e-5, "swin layer %d: image 1 alone and batched differ by %g", index, worst);
    // Rows 6-8 of image 1's 9x9 windowed map are padding only: finite outputs and gradients everywhere.
    autograd_backward(op_sum_all(batched));
    for (int64_t k = 0; k < batched->numel; k++) ck_assert(isfinite(batched->data[k]) && isfinite(src->grad->data[k]));
    tensor_scope_release(mark);
    tensor_release(src), tensor_release(pos), tensor_release(src1), tensor_release(pos1);
    encoder_layer_free(&layer);
    params_free(&ps);
  }
}
END_TEST

// Swin with 1x1 windows: each pixel attends to itself alone, so the attention is out_proj(v).
START_TEST(swin_window_one_is_value_projection) {
  TransformerShape s = {.dim = 16, .heads = 4, .ffn_dim = 24, .dropout = 0.1f};
  AttnSettings settings;
  attn_settings_default(&settings);
  char err[256];
  ck_assert_int_eq(attn_settings_set(&settings, "swin_window", "1", err, sizeof err), 1);
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  EncoderLayer layer = encoder_layer_create(&ps, "enc", s, encoder_attn_find("swin"), &settings);
  layer.index = 1;
  Rng init = rng_make(8);
  encoder_layer_init(&layer, &init);
  uint8_t pad[2 * 12] = {0};
  for (int p = 0; p < 12; p++) pad[12 + p] = p / 4 >= 2;
  FeatureGeometry g;
  feature_geometry_make(pad, 2, 3, 4, DEVICE_CPU, &g);
  Tensor *x = test_uniform(SHAPE(2, 12, 16), -1, 1, 40, false), *pos = test_uniform(SHAPE(2, 12, 16), -1, 1, 41, false);
  ScopeMark mark = tensor_scope_mark();
  EncoderAttnInput in = {.proj = &layer.self_attn, .x = x, .pos = pos, .geom = &g, .layer = 1};
  Tensor *y = layer.attn->forward(layer.attn_extras, &EVAL_CTX, &in, NULL, err, sizeof err);
  ck_assert_msg(y != NULL, "%s", err);
  Tensor *want = linear_forward(&layer.self_attn.out_proj, mha_project(&layer.self_attn, x, 2));
  for (int64_t k = 0; k < 12 * 16; k++)  // image 0 (image 1's padded pixels have no key: zero attention)
    ck_assert_msg(fabsf(y->data[k] - want->data[k]) < 1e-5f, "element %lld: %g != %g", (long long)k, y->data[k],
                  want->data[k]);
  tensor_scope_release(mark);
  tensor_release(x), tensor_release(pos);
  feature_geometry_free(&g);
  encoder_layer_free(&layer);
  params_free(&ps);
}
END_TEST

// init_trunc_normal (swin's table, timm's trunc_normal_): values outside [a, b] are redrawn, so all lie
// inside and their spread is the truncated normal's (std 1 on [-0.5, 0.5]: 0.2839); the table as
// encoder_layer_init leaves it has std .02.
START_TEST(swin_table_trunc_normal_init) {
  Tensor *t = tensor_zeros(DEVICE_CPU, SHAPE(20000));
  Rng rng = rng_make(9);
  init_trunc_normal(t, &rng, 1.0f, -0.5f, 0.5f);
  double sum = 0.0, sq = 0.0;
  for (int64_t i = 0; i < t->numel; i++) {
    ck_assert(t->data[i] >= -0.5f && t->data[i] <= 0.5f);
    sum += t->data[i], sq += (double)t->data[i] * t->data[i];
  }
  double mean = sum / t->numel, std = sqrt(sq / t->numel - mean * mean);
  ck_assert_msg(fabs(mean) < 0.01 && fabs(std - 0.2839) < 0.01, "mean %g std %g", mean, std);
  tensor_release(t);
  AttnSettings settings;
  attn_settings_default(&settings);
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  TransformerShape s = {.dim = 16, .heads = 4, .ffn_dim = 24, .dropout = 0.1f};
  EncoderLayer layer = encoder_layer_create(&ps, "enc", s, encoder_attn_find("swin"), &settings);
  encoder_layer_init(&layer, &rng);
  const Tensor *table = params_find(&ps, "enc.self_attn.relative_position_bias_table")->tensor;
  ck_assert_int_eq(table->numel, 13 * 13 * 4);  // (2 * 7 - 1)^2 x heads
  sq = 0.0;
  for (int64_t i = 0; i < table->numel; i++) sq += (double)table->data[i] * table->data[i];
  ck_assert_msg(fabs(sqrt(sq / table->numel) - 0.02) < 0.003, "table rms %g", sqrt(sq / table->numel));
  encoder_layer_free(&layer);
  params_free(&ps);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("encoder_attn");
  TCase *tc = tcase_create("encoder_attn");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, padding_ignored_by_every_variant);
  tcase_add_test(tc, sra_ratio_one_is_dense);
  tcase_add_test(tc, config_round_trip_and_errors);
  tcase_add_test(tc, detr_weights_load_into_every_variant);
  tcase_add_test(tc, swin_image_alone_equals_batched);
  tcase_add_test(tc, swin_window_one_is_value_projection);
  tcase_add_test(tc, swin_table_trunc_normal_init);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
