// Training checkpoints (train/checkpoint.c, api/model_file.c): what `detr eval/predict --checkpoint`
// and `detr train --resume` read from a checkpoint - the format, stored model config and run info
// (checkpoint_info_read, checkpoint_verify), the class names (label_names_from_text), `detr info`,
// the configs (checkpoint_read_configs), the model for inference (model_file_load), and the load
// into a model and optimizer (checkpoint_load: format, crc32, model tensors, AdamW moments, the
// training state in __metadata__).
//
// A mutated file almost never keeps a matching crc32, which would stop every load at the checksum:
// when the crc is the only thing wrong, the input is written again with its crc recomputed (a
// fix-up, as PNG fuzzers do with chunk CRCs) and loaded again, so the code after the check is
// fuzzed too.
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "core/runtime.h"
#include "api/model_file.h"
#include "fuzz_util.h"
#include "tensor/safetensors.h"
#include "train/checkpoint.h"
#include "cli/commands.h"

static DetrModel *model;
static AdamW opt;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  DetrConfig cfg;
  fuzz_model_config(&cfg);
  model = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(model, 0);
  adamw_init(&opt, &model->params, optim_config_default());
  return 0;
}

static void read_all(const char *path) {
  char *argv[] = {"detr", "info", (char *)path, "--all", NULL};  // describe_checkpoint
  Dist alone = DIST_SINGLE;
  int rc = cmd_info(4, argv, &alone);
  FUZZ_ASSERT(rc == 0 || rc == 1, "detr info returned %d", rc);
  char err[4096] = "";
  CheckpointInfo ci;
  StFile *f = st_open(path, err, sizeof err);
  if (!f) {
    fuzz_expect_error(err, path);
  } else if (checkpoint_info_read(f, &ci, err, sizeof err) == 0) {
    if (ci.categories) {  // `detr predict`'s class names
      LabelNames names = {0};
      if (label_names_from_text(path, ci.categories, &names, err, sizeof err)) fuzz_expect_error(err, path);
      label_names_free(&names);
    }
    checkpoint_info_free(&ci);
    err[0] = 0;
    if (checkpoint_verify(f, NULL, err, sizeof err)) fuzz_expect_error(err, path);
  } else {
    fuzz_expect_error(err, path);
  }
  st_close(f);
  DetrModel *m = NULL;  // `detr eval/predict --checkpoint`, detr_open_checkpoint
  err[0] = 0;
  if (model_file_load(path, NULL, NULL, NULL, 0, DEVICE_CPU, &m, NULL, err, sizeof err) == DETR_OK) {
    char verr[256];
    FUZZ_ASSERT(detr_config_validate(&m->cfg, verr, sizeof verr) == 0, "built a model of an invalid config: %s", verr);
    detr_model_free(m);
  } else {
    fuzz_expect_error(err, path);
  }
  char *mc = NULL, *tc = NULL;
  err[0] = 0;
  if (checkpoint_read_configs(path, &mc, &tc, err, sizeof err) == 0) free(mc), free(tc);
  else fuzz_expect_error(err, path);
  TrainState st;
  err[0] = 0;
  if (checkpoint_load(path, model, &opt, &st, err, sizeof err)) fuzz_expect_error(err, path);
  err[0] = 0;
  if (checkpoint_load(path, model, NULL, &st, err, sizeof err)) fuzz_expect_error(err, path);
}

// The input with its crc32 metadata set to what checkpoint.c computes (crc32 of every tensor's
// name, NUL and bytes, in header order); NULL when it cannot be rewritten or needs no fix.
static const char *fix_crc(const char *path) {
  char err[2048];
  StFile *f = st_open(path, err, sizeof err);
  if (!f) return NULL;
  uLong crc = crc32(0L, Z_NULL, 0);
  bool writable = true;
  for (int i = 0; i < st_count(f); i++) {
    const StEntry *e = st_entry(f, i);
    crc = crc32(crc, (const Bytef *)e->name, (uInt)strlen(e->name) + 1);
    if (e->nbytes) crc = crc32(crc, st_data(f, e), (uInt)e->nbytes);
    writable = writable && st_dtype_supported(e->dtype);
  }
  char hex[32];
  snprintf(hex, sizeof hex, "%08lx", crc);
  const char *stored = st_metadata(f, "crc32");
  const char *out = NULL;
  if (writable && (!stored || strcmp(stored, hex))) {
    StWriter *w = st_writer_new();
    for (int i = 0; i < st_count(f); i++) {
      const StEntry *e = st_entry(f, i);
      st_writer_add(w, e->name, e->dtype, e->ndim, e->shape, st_data(f, e));
    }
    for (int i = 0; i < st_metadata_count(f); i++)
      st_writer_set_metadata(w, st_metadata_key(f, i), st_metadata_value(f, i));
    st_writer_set_metadata(w, "crc32", hex);
    out = fuzz_path("fixed.safetensors");
    FUZZ_ASSERT(st_writer_save(w, out, err, sizeof err) == 0, "st_writer_save: %s", err);
    st_writer_free(w);
  }
  st_close(f);
  return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write_file("ckpt.safetensors", data, size);
  read_all(path);
  const char *fixed = fix_crc(path);
  if (fixed) read_all(fixed);
  return 0;
}
