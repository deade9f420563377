// Fine-tuning onto one's own classes, as a user runs it: a checkpoint of a run on six shape
// classes, and plain weights in the reference layout with COCO's 91 classes (the stand-in for an
// official DETR file), each started on a relabelled three-class copy of the data with no file
// edited; the class head re-initialised as the model initialises it and said so, every other
// tensor loaded as it is; a partial load refused without its flag; the class names in the new
// checkpoint and in predict's output.
#define _DEFAULT_SOURCE  // mkdtemp
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/runtime.h"
#include "tensor/safetensors.h"
#include "tests/shell.h"

#ifndef DETR_BIN
#error "DETR_BIN (the detr binary) and STEP_COMPARE_BIN must be defined by the build"
#endif

static char log_path[256];

// The synthetic set's six shapes (ids 1 3 4 7 9 13) relabelled into round (1), boxy (2) and
// pointy (3), the images shared: what a user's own annotation file for the same pictures is.
static const char *RELABEL =
    "sed -E -e 's/\"category_id\": (3|13),/\"category_id\": X1,/; s/\"category_id\": (1|7),/\"category_id\": X2,/; "
    "s/\"category_id\": (4|9),/\"category_id\": X3,/; s/\"category_id\": X([123]),/\"category_id\": \\1,/' "
    "-e '/\"supercategory\": \"shape\"/d' -e 's/^\"categories\": \\[$/\"categories\": [\\n{\"id\": 1, \"name\": "
    "\"round\"},\\n{\"id\": 2, \"name\": \"boxy\"},\\n{\"id\": 3, \"name\": \"pointy\"}/'";

// The main job's model family at test size: Conditional DETR (focal class head, prior-probability
// bias) with ENACT.
static const char *MODEL = "--config tiny --set decoder=conditional --set num_classes=14 --enact";
static const char *RUN = "--threads 2 --seed 5 --no-progress --eval-every 0";

static void setup(void) {
  if (test_root[0]) return;
  snprintf(test_root, sizeof test_root, "/tmp/detr-finetune-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(test_root));
  snprintf(log_path, sizeof log_path, "%s/log.txt", test_root);
  ck_assert_int_eq(sh("%s synth --out %s/data --train 12 --val 4 --seed 3", DETR_BIN, test_root), 0);
  ck_assert_int_eq(sh("mkdir -p %s/data3/annotations && ln -s %s/data/train %s/data3/train && "
                      "ln -s %s/data/val %s/data3/val",
                      test_root, test_root, test_root, test_root, test_root),
                   0);
  for (int i = 0; i < 2; i++)
    ck_assert_int_eq(sh("(%s %s/data/annotations/instances_%s.json > %s/data3/annotations/instances_%s.json)", RELABEL,
                        test_root, i ? "val" : "train", test_root, i ? "val" : "train"),
                     0);
  ck_assert_int_eq(sh("%s train --data %s/data --out %s/six %s %s --epochs 50 --max-steps 4", DETR_BIN, test_root,
                      test_root, MODEL, RUN),
                   0);
}

static void clear_log(void) { ck_assert_int_eq(sh(": > %s", log_path), 0); }
#define ASSERT_LOG(pattern) \
  ck_assert_msg(sh("grep -Eq -- '%s' %s", pattern, log_path) == 0, "the log lacks /%s/", pattern)

// Every tensor of `a` but those under skip_prefix equals b's (to 1e-20: a learning rate of 1e-30
// moves a zero bias by about that much).
static void same_tensors_but(const char *a, const char *b, const char *skip_prefix) {
  char err[1024];
  StFile *fa = st_open(a, err, sizeof err), *fb = st_open(b, err, sizeof err);
  ck_assert_msg(fa && fb, "%s", err);
  int compared = 0;
  for (int i = 0; i < st_count(fa); i++) {
    const StEntry *ea = st_entry(fa, i);
    if (!strncmp(ea->name, "optim.", 6) || !strncmp(ea->name, skip_prefix, strlen(skip_prefix))) continue;
    const StEntry *eb = st_find(fb, ea->name);
    ck_assert_msg(eb && eb->nbytes == ea->nbytes, "%s is missing or has another size", ea->name);
    const float *x = st_data(fa, ea), *y = st_data(fb, eb);
    for (size_t k = 0; k < ea->nbytes / sizeof(float); k++)
      ck_assert_msg(fabsf(x[k] - y[k]) <= 1e-20f, "%s[%zu]: %g vs %g", ea->name, k, x[k], y[k]);
    compared++;
  }
  ck_assert_int_gt(compared, 100);
  st_close(fa);
  st_close(fb);
}

START_TEST(checkpoint_onto_other_classes) {
  setup();
  clear_log();
  // No --config: the checkpoint's model, num_classes from the data (3 categories, ids up to 3).
  ck_assert_int_eq(sh("%s train --data %s/data3 --out %s/three --init %s/six/ckpt-4.safetensors %s --lr 1e-30 "
                      "--lr-backbone 1e-30 --max-steps 1",
                      DETR_BIN, test_root, test_root, test_root, RUN),
                   0);
  ASSERT_LOG("num_classes 4 for the data.s categories");
  ASSERT_LOG(
      "re-initialised class_embed.weight and class_embed.bias: the class head.s outputs \\(classes\\): 14 in the "
      "weights, 4 here");
  ASSERT_LOG("its optimizer state, step and schedule are not used");
  char six[256], three[256], err[1024];
  snprintf(six, sizeof six, "%s/six/ckpt-4.safetensors", test_root);
  snprintf(three, sizeof three, "%s/three/ckpt-1.safetensors", test_root);
  same_tensors_but(six, three, "class_embed.");
  // The head as Conditional DETR initialises it: the focal prior's bias, -log((1 - 0.01) / 0.01).
  StFile *f = st_open(three, err, sizeof err);
  ck_assert_msg(f, "%s", err);
  const StEntry *bias = st_find(f, "class_embed.bias");
  ck_assert(bias && bias->ndim == 1 && bias->shape[0] == 4);
  for (int k = 0; k < 4; k++) ck_assert_float_eq_tol(((const float *)st_data(f, bias))[k], -logf(99.0f), 1e-5f);
  ck_assert_str_eq(st_metadata(f, "categories"), "1:round;2:boxy;3:pointy");
  st_close(f);
  // The names reach predict's output.
  ck_assert_int_eq(sh("%s predict --checkpoint %s --out %s/pred --threshold 0 %s/data3/val/000000000001.jpg", DETR_BIN,
                      three, test_root, test_root),
                   0);
  ck_assert_int_eq(sh("grep -Eq '\"name\": \"(round|boxy|pointy)\"' %s/pred/predictions.json", test_root), 0);
  // --set without --config changes the checkpoint's model, not the default preset's.
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/data3 --out %s/three-q --init %s --set num_queries=12 %s --max-steps 1",
                      DETR_BIN, test_root, test_root, six, RUN),
                   0);
  ASSERT_LOG("re-initialised query_embed.weight: num_queries is 10 in the weights, 12 here");
  ck_assert_int_ne(sh("grep -q 'wrong shape' %s", log_path), 0);
  // The same classes: nothing re-initialised.
  clear_log();
  ck_assert_int_eq(
      sh("%s train --data %s/data --out %s/same --init %s %s --max-steps 1", DETR_BIN, test_root, test_root, six, RUN),
      0);
  ck_assert_int_ne(sh("grep -q 're-initialised' %s", log_path), 0);
}
END_TEST

START_TEST(reference_weights_and_partial_loads) {
  setup();
  // Weights in the reference layout for COCO's 91 classes (what an official file converts to).
  ck_assert_int_eq(sh("%s weights --config tiny --set decoder=conditional --set num_classes=91 --seed 7 --out "
                      "%s/coco.safetensors",
                      STEP_COMPARE_BIN, test_root),
                   0);
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/data3 --out %s/ref --init %s/coco.safetensors --config tiny --set "
                      "decoder=conditional --set num_classes=4 --set num_queries=12 %s --max-steps 1",
                      DETR_BIN, test_root, test_root, test_root, RUN),
                   0);
  ASSERT_LOG(
      "re-initialised class_embed.weight and class_embed.bias: the class head.s outputs \\(classes\\): 91 in the "
      "weights, 4 here");
  ASSERT_LOG("re-initialised query_embed.weight: num_queries is 10 in the weights, 12 here");
  // Another hidden size: refused, naming the tensors and the flag; with the flag, what fits.
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/data3 --out %s/part --init %s/coco.safetensors --config tiny --set "
                      "decoder=conditional --set num_classes=4 --set ffn_dim=48 %s --max-steps 1",
                      DETR_BIN, test_root, test_root, test_root, RUN),
                   1);
  ASSERT_LOG(
      "wrong shape: transformer.encoder.layers.0.linear1.weight is \\[64, 32\\] in the file, the model has \\[48, "
      "32\\]");
  ASSERT_LOG("--init-partial");
  ck_assert_int_eq(sh("test -e %s/part/metrics.jsonl", test_root), 1);
  clear_log();
  ck_assert_int_eq(sh("%s train --data %s/data3 --out %s/part --init %s/coco.safetensors --config tiny --set "
                      "decoder=conditional --set num_classes=4 --set ffn_dim=48 --init-partial %s --max-steps 1",
                      DETR_BIN, test_root, test_root, test_root, RUN),
                   0);
  ASSERT_LOG(
      "--init-partial: loaded [0-9]+ of the model.s [0-9]+ tensors from .*coco.safetensors; these keep their "
      "initialisation \\([0-9]+ of another shape, [0-9]+ missing; [0-9]+ of the file.s unused\\):");
  ASSERT_LOG("wrong shape: transformer.decoder.layers.1.linear2.weight");
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("finetune");
  TCase *tc = tcase_create("finetune");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, checkpoint_onto_other_classes);
  tcase_add_test(tc, reference_weights_and_partial_loads);
  suite_add_tcase(s, tc);
  return sh_run_suite(s);
}
