// The whole DETR model at the `tiny` preset: parameter names and kinds, forward shapes, the
// loss and a backward that reaches exactly the trainable parameters.
#define _DEFAULT_SOURCE  // mkstemp
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/runtime.h"
#include "nn/detr.h"
#include "nn/model_io.h"
#include "nn/position.h"
#include "tests/gradcheck.h"

START_TEST(reference_parameter_names) {
  DetrConfig cfg;
  ck_assert_int_eq(detr_config_preset("detr-r50", &cfg), 0);
  DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
  const char *names[] = {"backbone.0.body.conv1.weight",
                         "backbone.0.body.bn1.running_var",
                         "backbone.0.body.layer2.0.downsample.0.weight",
                         "backbone.0.body.layer4.2.bn3.bias",
                         "transformer.encoder.layers.5.self_attn.in_proj_weight",
                         "transformer.decoder.layers.0.multihead_attn.out_proj.bias",
                         "transformer.decoder.layers.5.norm3.weight",
                         "transformer.decoder.norm.bias",
                         "class_embed.weight",
                         "bbox_embed.layers.2.bias",
                         "query_embed.weight",
                         "input_proj.bias"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    ck_assert_msg(params_find(&m->params, names[i]) != NULL, "missing %s", names[i]);
  ck_assert_ptr_null(params_find(&m->params, "transformer.encoder.norm.weight"));  // post-norm: none
  ck_assert_int_eq(params_find(&m->params, "backbone.0.body.layer1.0.conv1.weight")->kind, PARAM_FROZEN);
  ck_assert_int_eq(params_find(&m->params, "backbone.0.body.layer2.0.conv1.weight")->kind, PARAM_TRAINABLE);
  ck_assert_int_eq(params_find(&m->params, "backbone.0.body.layer2.0.conv1.weight")->group, LR_GROUP_BACKBONE);
  ck_assert_int_eq(params_find(&m->params, "backbone.0.body.layer2.0.bn1.weight")->kind, PARAM_BUFFER);
  ck_assert_int_eq((int)params_find(&m->params, "class_embed.weight")->tensor->shape.d[0], 92);
  // The reference DETR-R50 (torch) has 41,302,368 trainable parameters: 23,454,912 in
  // layer2-4 (minus batch norm), 17,847,456 elsewhere... checked against the parity tool.
  ck_assert_int_gt(params_numel(&m->params, PARAM_TRAINABLE), 40000000);
  detr_model_free(m);
}
END_TEST

// One training step of the tiny model on a padded batch; cross_attn: the decoder's cross-attention.
// sets: key=value overrides of tiny ("k1", "v1", ..., NULL).
static void tiny_step(const char *const *sets) {
  DetrConfig cfg;
  char cerr[256];
  const char *cross_attn = "softmax";
  ck_assert_int_eq(detr_config_preset("tiny", &cfg), 0);
  for (int i = 0; sets[i]; i += 2) {
    ck_assert_msg(detr_config_set(&cfg, sets[i], sets[i + 1], cerr, sizeof cerr) == 0, "%s", cerr);
    if (!strcmp(sets[i], "decoder_cross_attn")) cross_attn = sets[i + 1];
  }
  ck_assert_msg(detr_config_validate(&cfg, cerr, sizeof cerr) == 0, "%s", cerr);
  int stride = cfg.backbone_layers == 3 ? 16 : 32;
  DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(m, 1);
  Tensor *images = test_uniform(SHAPE(2, 64, 96, 3), -2, 2, 5, false);
  uint8_t mask[2 * 64 * 96] = {0};
  for (int y = 0; y < 64; y++)
    for (int x = 64; x < 96; x++) mask[64 * 96 + y * 96 + x] = 1;  // image 1 is 64 x 64, padded right
  Rng drop = rng_make(9);
  NnCtx ctx = {.training = true, .dropout_rng = &drop};
  ScopeMark mark = tensor_scope_mark();
  DetrOutput out;
  char ferr[256];
  ck_assert_int_eq(detr_model_forward(m, &ctx, images, mask, &out, ferr, sizeof ferr), 0);
  ck_assert_int_eq(out.n_layers, 2);
  ck_assert_int_eq(out.feat_h, 64 / stride);
  ck_assert_int_eq(out.feat_w, 96 / stride);
  Tensor *logits = out.layers[1].logits, *boxes = out.layers[1].boxes;
  ck_assert_int_eq(logits->shape.d[1], cfg.num_queries);
  ck_assert_int_eq(logits->shape.d[2], cfg.num_classes + detr_classes(&cfg)->extra_columns);  // 8 / 7 (focal)
  for (int64_t i = 0; i < boxes->numel; i++) ck_assert(boxes->data[i] > 0 && boxes->data[i] < 1);
  float tb[8] = {0.5f, 0.5f, 0.2f, 0.3f, 0.3f, 0.6f, 0.1f, 0.2f};
  int64_t tl[2] = {3, 6};
  DetrTarget targets[2] = {{2, tb, tl}, {1, tb + 4, tl + 1}};
  CriterionConfig ccfg = detr_criterion_config(&cfg);
  CriterionResult r;
  char err[256];
  ck_assert_int_eq(criterion_forward(&ccfg, out.layers[1], out.layers, 1, targets, 3.0f, NULL, &r, err, sizeof err), 0);
  ck_assert_int_eq(r.n_terms, 6);
  ck_assert(isfinite(tensor_item(r.total)));
  autograd_backward(r.total);
  criterion_result_free(&r);
  ck_assert_int_eq(autograd_tape_size(), 0);
  for (int i = 0; i < m->params.count; i++) {
    Param *p = &m->params.items[i];
    if (p->kind == PARAM_TRAINABLE) {
      ck_assert_msg(p->tensor->grad != NULL, "%s has no gradient", p->name);
      double norm = 0;
      for (int64_t k = 0; k < p->tensor->numel; k++) norm += fabs(p->tensor->grad->data[k]);
      ck_assert_msg(isfinite(norm), "%s gradient is not finite", p->name);
    } else {
      ck_assert_msg(p->tensor->grad == NULL, "%s is not trainable but has a gradient", p->name);
    }
    // k-means: the cross-attention's query and key rows of in_proj get no gradient (the argmax
    // passes none; docs/kmeans_cross_attention.md), its value rows do.
    if (!strcmp(cross_attn, "kmeans") && strstr(p->name, "multihead_attn.in_proj_")) {
      int64_t d = cfg.hidden_dim, per_row = p->tensor->numel / (3 * d);
      double qk = 0, v = 0;
      for (int64_t k = 0; k < p->tensor->numel; k++)
        *(k < 2 * d * per_row ? &qk : &v) += fabs(p->tensor->grad->data[k]);
      ck_assert_msg(qk == 0 && v > 0, "%s: |grad| of q, k rows %g (expected 0), of v rows %g", p->name, qk, v);
    }
  }
  detr_output_free(&out);
  tensor_scope_release(mark);
  tensor_release(images);
  detr_model_free(m);
}

START_TEST(tiny_forward_loss_backward) { tiny_step((const char *const[]){NULL}); }
END_TEST

START_TEST(tiny_kmeans_cross_attn_step) { tiny_step((const char *const[]){"decoder_cross_attn", "kmeans", NULL}); }
END_TEST

// Conditional DETR on a stride-16 backbone with ENACT: the seams together.
START_TEST(tiny_conditional_stride16_enact_step) {
  tiny_step((const char *const[]){"decoder", "conditional", "backbone_layers", "3", "encoder_attn", "enact", NULL});
}
END_TEST

// Anchor DETR (its own RCDA encoder, anchor x pattern queries, GroupNorm input projection).
START_TEST(tiny_anchor_step) { tiny_step((const char *const[]){"decoder", "anchor", "num_queries", "9", NULL}); }
END_TEST

// anchor-detr-r50: the official names and shapes (megvii-research/AnchorDETR's state_dict, its
// shared heads once), DC5, and what the anchor decoder refuses.
START_TEST(anchor_r50_names) {
  DetrConfig cfg;
  char err[256];
  ck_assert_int_eq(detr_config_preset("anchor-detr-r50", &cfg), 0);
  ck_assert(cfg.dilation && cfg.num_queries == 900 && cfg.ffn_dim == 1024 && cfg.dropout == 0.0f);
  DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
  const struct {
    const char *name;
    int64_t d0, d1;
  } want[] = {{"transformer.encoder_layers.5.self_attn.in_proj_weight", 1280, 256},
              {"transformer.encoder_layers.0.ffn.norm2.weight", 256, 0},
              {"transformer.decoder_layers.5.cross_attn.in_proj_bias", 1280, 0},
              {"transformer.decoder_layers.0.self_attn.in_proj_weight", 768, 256},
              {"transformer.decoder_layers.0.ffn.linear1.weight", 1024, 256},
              {"transformer.pattern.weight", 3, 256},
              {"transformer.position.weight", 300, 2},
              {"transformer.adapt_pos1d.2.weight", 256, 256},
              {"transformer.adapt_pos2d.0.bias", 256, 0},
              {"transformer.class_embed.0.weight", 91, 256},
              {"transformer.bbox_embed.0.layers.2.bias", 4, 0},
              {"input_proj.0.0.weight", 256, 2048},
              {"input_proj.0.1.bias", 256, 0},
              {"backbone.body.layer4.2.conv3.weight", 2048, 512}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    Param *p = params_find(&m->params, want[i].name);
    ck_assert_msg(p != NULL, "missing %s", want[i].name);
    ck_assert_int_eq(p->tensor->shape.d[0], want[i].d0);
    if (want[i].d1) ck_assert_int_eq(p->tensor->shape.d[1], want[i].d1);
  }
  const char *absent[] = {"query_embed.weight", "class_embed.weight", "transformer.encoder.layers.0.linear1.weight",
                          "transformer.class_embed.1.weight", "backbone.0.body.conv1.weight"};
  for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
    ck_assert_msg(params_find(&m->params, absent[i]) == NULL, "unexpected %s", absent[i]);
  detr_model_free(m);
  cfg.num_queries = 100;
  ck_assert_int_eq(detr_config_validate(&cfg, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "multiple of its 3 patterns"), "%s", err);
  cfg.num_queries = 900;
  cfg.encoder_attn = encoder_attn_find("enact");
  ck_assert_int_eq(detr_config_validate(&cfg, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "own encoder"), "%s", err);
  // Anchor-DETR-ENACT: the encoder takes enact_official, with ClustAttn's W_prob under its name.
  cfg.encoder_attn = encoder_attn_find("enact_official");
  ck_assert_int_eq(detr_config_validate(&cfg, err, sizeof err), 0);
  m = detr_model_create(&cfg, DEVICE_CPU);
  const Param *w = params_find(&m->params, "transformer.encoder_layers.5.ENACT.W_prob.weight");
  ck_assert_ptr_nonnull(w);
  ck_assert_int_eq(w->tensor->shape.d[0], 1);
  ck_assert_int_eq(w->tensor->shape.d[1], 256);
  detr_model_free(m);
}
END_TEST

// A DETR backbone (backbone.0.body.*: `detr pretrain`, a DETR checkpoint) into Anchor DETR's
// backbone.body.* (--init-backbone): every backbone tensor read, under the other prefix.
START_TEST(anchor_backbone_from_detr_names) {
  DetrConfig cfg;
  char path[] = "/tmp/detr-anchor-bb-XXXXXX", err[1024];
  ck_assert_int_eq(detr_config_preset("tiny", &cfg), 0);
  DetrModel *detr = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(detr, 1);
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
  StWriter *w = st_writer_new();
  params_save(&detr->params, w, "");
  ck_assert_int_eq(st_writer_save(w, path, err, sizeof err), 0);
  st_writer_free(w);
  cfg.decoder = decoder_find("anchor");
  cfg.num_queries = 9;
  DetrModel *anchor = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(anchor, 2);
  ck_assert_int_eq(params_load_file_prefix_as(&anchor->params, path, "backbone.body.", NULL, err, sizeof err), -1);
  ck_assert_msg(
      params_load_file_prefix_as(&anchor->params, path, "backbone.body.", "backbone.0.body.", err, sizeof err) == 0,
      "%s", err);
  int n = 0;
  for (int i = 0; i < anchor->params.count; i++) {
    const Param *p = &anchor->params.items[i];
    if (strncmp(p->name, "backbone.body.", 14)) continue;
    char name[128];
    snprintf(name, sizeof name, "backbone.0.body.%s", p->name + 14);
    const Tensor *ref = params_find(&detr->params, name)->tensor;
    for (int64_t k = 0; k < ref->numel; k++) ck_assert_float_eq(p->tensor->data[k], ref->data[k]);
    n++;
  }
  ck_assert_int_gt(n, 50);
  unlink(path);
  detr_model_free(detr);
  detr_model_free(anchor);
}
END_TEST

// position_sine copies a half's features from the previous column or row where its value is the
// same: the same floats as each position's sines and cosines computed (DETR's formula, below), for
// unpadded, right/bottom-padded, scattered and fully padded masks.
START_TEST(position_sine_copies_equal_features) {
  const float scale = 6.283185307179586f, eps = 1e-6f;
  Rng rng = rng_make(3);
  for (int t = 0; t < 200; t++) {
    int64_t B = 1 + t % 3, h = 1 + (int64_t)(rng_next_uniform(&rng) * 19),
            w = 1 + (int64_t)(rng_next_uniform(&rng) * 19);
    int64_t npf = 2 * (1 + t % 32), n = B * h * w * 2 * npf;
    uint8_t *mask = calloc((size_t)(B * h * w), 1);
    for (int64_t b = 0; b < B; b++) {
      int kind = (int)((t + b) % 4);  // 0 unpadded, 1 padded right and below, 2 scattered, 3 all padding
      int64_t vh = 1 + (int64_t)(rng_next_uniform(&rng) * (float)h) % h,
              vw = 1 + (int64_t)(rng_next_uniform(&rng) * (float)w) % w;
      for (int64_t y = 0; y < h; y++)
        for (int64_t x = 0; x < w; x++)
          mask[(b * h + y) * w + x] = kind == 1   ? (y >= vh || x >= vw)
                                      : kind == 2 ? rng_next_uniform(&rng) < 0.3f
                                                  : kind == 3;
    }
    float *pos = malloc((size_t)n * sizeof(float)), *want = malloc((size_t)n * sizeof(float));
    position_sine(mask, B, h, w, npf, 10000.0f, pos);
    for (int64_t b = 0; b < B; b++)
      for (int64_t y = 0; y < h; y++)
        for (int64_t x = 0; x < w; x++) {
          float cy = 0, cx = 0, ty = 0, tx = 0;  // not-mask counts: up to and through (y, x), and whole column / row
          for (int64_t k = 0; k < h; k++) {
            float v = mask[(b * h + k) * w + x] ? 0.0f : 1.0f;
            ty += v;
            if (k <= y) cy += v;
          }
          for (int64_t k = 0; k < w; k++) {
            float v = mask[(b * h + y) * w + k] ? 0.0f : 1.0f;
            tx += v;
            if (k <= x) cx += v;
          }
          float ye = cy / (ty + eps) * scale, xe = cx / (tx + eps) * scale;
          float *p = want + ((b * h + y) * w + x) * 2 * npf;
          for (int64_t i = 0; i < npf; i++) {
            float dim_t = powf(10000.0f, (float)(2 * (i / 2)) / (float)npf);
            p[i] = i % 2 == 0 ? sinf(ye / dim_t) : cosf(ye / dim_t);
            p[npf + i] = i % 2 == 0 ? sinf(xe / dim_t) : cosf(xe / dim_t);
          }
        }
    ck_assert_msg(!memcmp(pos, want, (size_t)n * sizeof(float)), "case %d (%lldx%lldx%lld, %lld features): differs", t,
                  (long long)B, (long long)h, (long long)w, (long long)npf);
    free(mask), free(pos), free(want);
  }
}
END_TEST

// A preset's run defaults are its own; another backbone takes those of the preset whose model is
// nearest (a ResNet-34 on detr-r50's transformer: the paper's schedule, not detr-r18-small's).
static const char *run_preset(const char *preset, int depth) {
  DetrConfig cfg;
  ck_assert_int_eq(detr_config_preset(preset, &cfg), 0);
  if (depth) cfg.backbone_depth = depth;
  return detr_run_defaults(&cfg)->preset;
}

START_TEST(run_defaults_follow_the_model) {
  for (int i = 0; DETR_PRESETS[i]; i++) ck_assert_str_eq(run_preset(DETR_PRESETS[i], 0), DETR_PRESETS[i]);
  ck_assert_str_eq(run_preset("detr-r50", 34), "detr-r50");
  ck_assert_str_eq(run_preset("detr-r50", 101), "detr-r50");
  ck_assert_str_eq(run_preset("conditional-detr-r50", 34), "conditional-detr-r50");
  ck_assert_str_eq(run_preset("anchor-detr-r50", 34), "anchor-detr-r50");
  ck_assert_str_eq(run_preset("detr-r18-small", 34), "detr-r18-small");
  ck_assert_str_eq(run_preset("conditional-detr-r18-small", 50), "conditional-detr-r18-small");
}
END_TEST

START_TEST(config_overrides) {
  DetrConfig cfg;
  char err[128], text[1024];
  ck_assert_int_eq(detr_config_preset("detr-r18-small", &cfg), 0);
  ck_assert_int_eq(detr_config_set(&cfg, "hidden_dim", "64", err, sizeof err), 0);
  ck_assert_int_eq(cfg.hidden_dim, 64);
  ck_assert_int_eq(detr_config_set(&cfg, "pre_norm", "true", err, sizeof err), 0);
  ck_assert_int_eq(detr_config_set(&cfg, "hidden_dim", "6x", err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "hidden_dim"));
  ck_assert_int_eq(detr_config_set(&cfg, "nonsense", "1", err, sizeof err), -1);
  ck_assert_int_eq(detr_config_set(&cfg, "nheads", "5", err, sizeof err), 0);
  ck_assert_int_eq(detr_config_validate(&cfg, err, sizeof err), -1);
  ck_assert_int_eq(detr_config_preset("detr-r18-small", &cfg), 0);  // the ResNet's base width
  ck_assert_int_eq(detr_config_set(&cfg, "backbone_width", "2", err, sizeof err), 0);
  ck_assert_int_eq(detr_config_validate(&cfg, err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "backbone_width"));
  ck_assert_int_eq(detr_config_set(&cfg, "backbone_width", "16", err, sizeof err), 0);
  ck_assert_int_eq(detr_config_validate(&cfg, err, sizeof err), 0);
  DetrModel *narrow = detr_model_create(&cfg, DEVICE_CPU);
  ck_assert_int_eq(narrow->backbone.out_channels, 16 * 8);  // 16, 32, 64, 128 over the stages
  detr_model_free(narrow);
  ck_assert_int_eq(detr_config_preset("nope", &cfg), -1);
  // The decoder seam's key: detr by default, written out, an unknown name refused with the choices.
  ck_assert_int_eq(detr_config_preset("tiny", &cfg), 0);
  ck_assert_str_eq(detr_decoder(&cfg)->name, "detr");
  ck_assert_int_eq(detr_config_set(&cfg, "decoder", "detr", err, sizeof err), 0);
  ck_assert_ptr_eq(cfg.decoder, decoder_find("detr"));
  ck_assert_int_eq(detr_config_set(&cfg, "decoder", "nonsense", err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "unknown decoder 'nonsense' (one of detr"));
  detr_config_format(&cfg, text, sizeof text);
  ck_assert_ptr_nonnull(strstr(text, "\ndecoder=detr\n"));
  // decoder_cross_attn: softmax by default and then not written (old checkpoints read as softmax);
  // kmeans written; an unknown name refused with the choices.
  ck_assert_ptr_null(strstr(text, "decoder_cross_attn"));
  ck_assert_int_eq(detr_config_set(&cfg, "decoder_cross_attn", "argmax", err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "(one of softmax, kmeans)"));
  ck_assert_int_eq(detr_config_set(&cfg, "decoder_cross_attn", "kmeans", err, sizeof err), 0);
  ck_assert_int_eq(detr_config_validate(&cfg, err, sizeof err), 0);
  detr_config_format(&cfg, text, sizeof text);
  ck_assert_ptr_nonnull(strstr(text, "\ndecoder_cross_attn=kmeans\n"));
  ck_assert_int_eq(detr_config_preset("tiny", &cfg), 0);
  cfg.dropout = 0.25f;
  detr_config_format(&cfg, text, sizeof text);
  DetrConfig back;
  ck_assert_int_eq(detr_config_preset("detr-r50", &back), 0);
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    char *eq = strchr(line, '=');
    *eq = 0;
    ck_assert_int_eq(detr_config_set(&back, line, eq + 1, err, sizeof err), 0);
  }
  char again[1024], original[1024];
  detr_config_format(&back, again, sizeof again);
  detr_config_format(&cfg, original, sizeof original);
  ck_assert_str_eq(again, original);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("detr");
  TCase *tc = tcase_create("model");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, reference_parameter_names);
  tcase_add_test(tc, tiny_forward_loss_backward);
  tcase_add_test(tc, tiny_kmeans_cross_attn_step);
  tcase_add_test(tc, tiny_conditional_stride16_enact_step);
  tcase_add_test(tc, tiny_anchor_step);
  tcase_add_test(tc, anchor_r50_names);
  tcase_add_test(tc, anchor_backbone_from_detr_names);
  tcase_add_test(tc, config_overrides);
  tcase_add_test(tc, run_defaults_follow_the_model);
  tcase_add_test(tc, position_sine_copies_equal_features);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
