#include "train/checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "api/model_file.h"  // the format string and crc32 that readers check
#include "nn/model_io.h"

static void add_tensor(StWriter *w, uLong *crc, const char *name, const Tensor *t) {
  float *host = detr_malloc((size_t)(t->numel ? t->numel : 1) * sizeof(float), "checkpoint host");
  tensor_to_host(t, host);
  int64_t shape[DETR_MAX_DIMS];
  for (int d = 0; d < t->shape.ndim; d++) shape[d] = t->shape.d[d];
  st_writer_add(w, name, ST_F32, t->shape.ndim, shape, host);
  *crc = checkpoint_crc_update(*crc, name, host, (size_t)t->numel * sizeof(float));
  free(host);
}

int checkpoint_save(const char *path, const DetrModel *model, const AdamW *opt, const TrainState *state,
                    const char *extra_config, const char *categories, char *err, size_t err_cap) {
  StWriter *w = st_writer_new();
  uLong crc = crc32(0L, Z_NULL, 0);
  char name[200], value[64];
  const ParamStore *ps = &model->params;
  for (int i = 0; i < ps->count; i++) add_tensor(w, &crc, ps->items[i].name, ps->items[i].tensor);
  for (int i = 0; opt && i < ps->count; i++) {
    if (!opt->exp_avg[i]) continue;
    snprintf(name, sizeof name, "optim.exp_avg.%s", ps->items[i].name);
    add_tensor(w, &crc, name, opt->exp_avg[i]);
    snprintf(name, sizeof name, "optim.exp_avg_sq.%s", ps->items[i].name);
    add_tensor(w, &crc, name, opt->exp_avg_sq[i]);
  }
  char config[4096];
  detr_config_format(&model->cfg, config, sizeof config);
  st_writer_set_metadata(w, "format", CHECKPOINT_FORMAT);
  st_writer_set_metadata(w, "model_config", config);
  st_writer_set_metadata(w, "train_config", extra_config ? extra_config : "");
  if (categories) st_writer_set_metadata(w, "categories", categories);
  if (state->run.known) {
    char run[1024];
    run_settings_format(&state->run, run, sizeof run);
    st_writer_set_metadata(w, "run_settings", run);
  }
#define META(key, fmt, v)                  \
  do {                                     \
    snprintf(value, sizeof value, fmt, v); \
    st_writer_set_metadata(w, key, value); \
  } while (0)
  META("step", "%" PRId64, state->step);
  META("epoch", "%" PRId64, state->epoch);
  META("next_batch", "%" PRId64, state->next_batch);
  META("seed", "%" PRIu64, state->seed);
  META("dropout_rng_seed", "%" PRIu64, state->dropout_rng.seed);
  META("dropout_rng_offset", "%" PRIu64, state->dropout_rng.offset);
  META("best_map", "%.17g", state->best_map);
  META("best_epoch", "%" PRId64, state->best_epoch);
  META("world_size", "%d", state->world_size > 0 ? state->world_size : 1);
  META("global_batch", "%" PRId64, state->global_batch);
  META("optimizer_step", "%" PRId64, opt ? opt->step : (int64_t)0);
  META("crc32", "%08lx", crc);
#undef META
  int rc = st_writer_save(w, path, err, err_cap);
  st_writer_free(w);
  return rc;
}

// Decimal digits only: strtoull alone would take " 7", "+7" and "-7" (as 2^64 - 7).
static int meta_u64(const StFile *f, const char *key, uint64_t *out, char *err, size_t err_cap) {
  const char *v = st_metadata(f, key);
  char *end = NULL;
  errno = 0;
  if (!v || *v < '0' || *v > '9' || (*out = strtoull(v, &end, 10), *end) || errno) {
    snprintf(err, err_cap, "%s: checkpoint metadata '%s' is missing or not a number", st_path(f), key);
    return -1;
  }
  return 0;
}

int checkpoint_load(const char *path, DetrModel *model, AdamW *opt, TrainState *state, char *err, size_t err_cap) {
  StFile *f = st_open(path, err, err_cap);
  if (!f) return -1;
  int rc = checkpoint_verify(f, "model weights load with --init", err, err_cap);
  const char *ignore[] = {"optim.", NULL};
  if (!rc) rc = params_load(&model->params, f, ignore, err, err_cap);
  for (int i = 0; !rc && opt && i < model->params.count; i++) {
    if (!opt->exp_avg[i]) continue;
    char name[200];
    snprintf(name, sizeof name, "optim.exp_avg.%s", model->params.items[i].name);
    rc = st_read_f32_into(f, name, opt->exp_avg[i], err, err_cap);
    snprintf(name, sizeof name, "optim.exp_avg_sq.%s", model->params.items[i].name);
    if (!rc) rc = st_read_f32_into(f, name, opt->exp_avg_sq[i], err, err_cap);
  }
  uint64_t v[8];
  const char *keys[8] = {"step",           "epoch", "next_batch", "seed", "dropout_rng_seed", "dropout_rng_offset",
                         "optimizer_step", NULL};
  for (int k = 0; !rc && keys[k]; k++) rc = meta_u64(f, keys[k], &v[k], err, err_cap);
  if (!rc && (v[0] > INT64_MAX || v[1] > INT32_MAX || v[2] > INT64_MAX || v[6] > INT64_MAX)) {
    snprintf(err, err_cap, "%s: checkpoint metadata step, epoch, next_batch or optimizer_step is out of range", path);
    rc = -1;
  }
  if (!rc) {
    state->step = (int64_t)v[0];
    state->epoch = (int64_t)v[1];
    state->next_batch = (int64_t)v[2];
    state->seed = v[3];
    state->dropout_rng = (Rng){.seed = v[4], .offset = v[5]};
    const char *best = st_metadata(f, "best_map");
    state->best_map = best ? strtod(best, NULL) : -1.0;
    const char *best_epoch = st_metadata(f, "best_epoch");  // older checkpoints: unknown
    long long be = best_epoch ? strtoll(best_epoch, NULL, 10) : -1;
    state->best_epoch = be >= 0 && be <= INT32_MAX ? (int64_t)be : -1;
    // Older checkpoints have neither: one process, batch not recorded.
    uint64_t world = 1, global = 0;
    if (st_metadata(f, "world_size")) rc = meta_u64(f, "world_size", &world, err, err_cap);
    if (!rc && st_metadata(f, "global_batch")) rc = meta_u64(f, "global_batch", &global, err, err_cap);
    if (!rc && (world < 1 || world > (1 << 20) || global > (1 << 30))) {
      snprintf(err, err_cap, "%s: checkpoint metadata world_size %llu or global_batch %llu is out of range", path,
               (unsigned long long)world, (unsigned long long)global);
      rc = -1;
    }
    state->world_size = (int)world;
    state->global_batch = (int64_t)global;
    if (opt) {
      opt->step = (int64_t)v[6];
      opt->epoch = (int)state->epoch;
    }
  }
  st_close(f);
  return rc;
}

int checkpoint_read_configs(const char *path, char **model_config, char **train_config, char *err, size_t err_cap) {
  StFile *f = st_open(path, err, err_cap);
  if (!f) return -1;
  int rc = checkpoint_verify(f, "model weights load with --init", err, err_cap);
  if (!rc) {
    const char *m = st_metadata(f, "model_config"), *t = st_metadata(f, "train_config");
    *model_config = detr_strdup(m ? m : "", "a string");
    *train_config = detr_strdup(t ? t : "", "a string");
  }
  st_close(f);
  return rc;
}
