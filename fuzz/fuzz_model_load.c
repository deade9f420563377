// Model weights (nn/model_io.c): a safetensors file loaded into a DETR model strictly
// (params_load_file: every tensor present, F32, the model's shape, nothing else), by prefix
// (params_load_file_prefix: `--init-backbone`) and with ignored prefixes (params_load, as a
// checkpoint's "optim." tensors). A refused load names the file and leaves the model unchanged.
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "fuzz_util.h"
#include "nn/model_io.h"

static DetrModel *model;
static float *snapshot;  // the model's parameters before each load
static int64_t total;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  DetrConfig cfg;
  fuzz_model_config(&cfg);
  model = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(model, 0);
  for (int i = 0; i < model->params.count; i++) total += model->params.items[i].tensor->numel;
  snapshot = malloc((size_t)total * sizeof(float));
  return 0;
}

static void save_params(float *dst) {
  for (int i = 0; i < model->params.count; i++) {
    const Tensor *t = model->params.items[i].tensor;
    memcpy(dst, t->data, (size_t)t->numel * sizeof(float));
    dst += t->numel;
  }
}

static bool unchanged(void) {
  const float *s = snapshot;
  for (int i = 0; i < model->params.count; i++) {
    const Tensor *t = model->params.items[i].tensor;
    if (memcmp(s, t->data, (size_t)t->numel * sizeof(float))) return false;
    s += t->numel;
  }
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write_file("weights.safetensors", data, size);
  char err[4096] = "";
  ParamStore *ps = &model->params;
  save_params(snapshot);
  if (params_load_file(ps, path, err, sizeof err)) {
    fuzz_expect_error(err, path);
    FUZZ_ASSERT(unchanged(), "a refused load changed the model");
  }
  save_params(snapshot);
  err[0] = 0;
  if (params_load_file_prefix(ps, path, "backbone.", err, sizeof err)) {
    fuzz_expect_error(err, path);
    FUZZ_ASSERT(unchanged(), "a refused backbone load changed the model");
  }
  StFile *f = st_open(path, err, sizeof err);
  if (f) {
    const char *ignore[] = {"optim.", "aux.", NULL};
    save_params(snapshot);
    err[0] = 0;
    if (params_load(ps, f, ignore, err, sizeof err)) {
      fuzz_expect_error(err, path);
      FUZZ_ASSERT(unchanged(), "a refused load (ignored prefixes) changed the model");
    }
    st_close(f);
  }
  return 0;
}
