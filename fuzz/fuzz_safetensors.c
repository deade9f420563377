// safetensors reader (tensor/safetensors.c): st_open on any bytes, then everything a consumer
// reads of an accepted file - every entry's bytes, name lookups, metadata, F32 tensors copied
// into Tensors, `detr step`'s batch (train/step_batch.c), `detr info` - and a round trip: what st_open accepts, st_writer_save writes back and st_open
// reads again with the same names, dtypes, shapes, bytes and metadata.
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "core/runtime.h"
#include "fuzz_util.h"
#include "tensor/safetensors.h"
#include "train/step_batch.h"

static uint64_t touch(const void *p, size_t n) {  // reads every byte, so ASan sees each access
  const uint8_t *b = p;
  uint64_t s = 0;
  for (size_t i = 0; i < n; i++) s = s * 31 + b[i];
  return s;
}

static void check_same(const StFile *a, const StFile *b) {
  FUZZ_ASSERT(st_count(a) == st_count(b), "%d tensors became %d", st_count(a), st_count(b));
  for (int i = 0; i < st_count(a); i++) {
    const StEntry *x = st_entry(a, i), *y = st_find(b, x->name);
    FUZZ_ASSERT(y, "tensor '%s' lost in the round trip", x->name);
    FUZZ_ASSERT(x->dtype == y->dtype && x->ndim == y->ndim && x->nbytes == y->nbytes, "tensor '%s' changed", x->name);
    FUZZ_ASSERT(!memcmp(x->shape, y->shape, (size_t)x->ndim * sizeof x->shape[0]), "shape of '%s' changed", x->name);
    FUZZ_ASSERT(!x->nbytes || !memcmp(st_data(a, x), st_data(b, y), x->nbytes), "bytes of '%s' changed", x->name);
  }
  FUZZ_ASSERT(st_metadata_count(a) == st_metadata_count(b), "metadata count changed");
  for (int i = 0; i < st_metadata_count(a); i++) {
    const char *v = st_metadata(b, st_metadata_key(a, i));
    FUZZ_ASSERT(v && !strcmp(v, st_metadata_value(a, i)), "metadata '%s' changed", st_metadata_key(a, i));
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_write_file("input.safetensors", data, size);
  // `detr info FILE --all` (its output goes to stdout, which tools/fuzz.sh closes).
  char *argv[] = {"detr", "info", (char *)path, "--all", NULL};
  Dist alone = DIST_SINGLE;
  int rc = cmd_info(4, argv, &alone);
  FUZZ_ASSERT(rc == 0 || rc == 1, "detr info returned %d", rc);
  char err[2048] = "";
  StFile *f = st_open(path, err, sizeof err);
  if (!f) {
    fuzz_expect_error(err, path);
    return 0;
  }
  size_t buf_len;
  const void *buf = st_data_buffer(f, &buf_len);
  uint64_t sum = touch(buf, buf_len), total = 0;
  for (int i = 0; i < st_count(f); i++) {
    const StEntry *e = st_entry(f, i);
    FUZZ_ASSERT(st_find(f, e->name) == e, "st_find('%s') is not entry %d", e->name, i);
    FUZZ_ASSERT(e->ndim >= 0 && e->ndim <= ST_MAX_DIMS, "rank %d", e->ndim);
    FUZZ_ASSERT(e->nbytes == (size_t)e->numel * st_dtype_size(e->dtype), "'%s': nbytes", e->name);
    FUZZ_ASSERT(e->offset + e->nbytes <= buf_len, "'%s' runs past the buffer", e->name);
    total += e->nbytes;
    sum += touch(st_data(f, e), e->nbytes) + strlen(st_dtype_name(e->dtype));
    // The loaders' path: an F32 tensor of the entry's shape, filled from the file.
    if (e->dtype == ST_F32 && e->ndim <= DETR_MAX_DIMS && e->numel > 0 && e->nbytes <= (1 << 20)) {
      Shape s = {.ndim = e->ndim};
      for (int d = 0; d < e->ndim; d++) s.d[d] = e->shape[d];
      Tensor *t = tensor_new(DEVICE_CPU, s);
      FUZZ_ASSERT(st_read_f32_into(f, e->name, t, err, sizeof err) == 0, "st_read_f32_into: %s", err);
      FUZZ_ASSERT(!memcmp(t->data, st_data(f, e), e->nbytes), "'%s' read back differently", e->name);
      tensor_release(t);
    }
  }
  FUZZ_ASSERT(total == buf_len, "tensors cover %llu of %zu bytes", (unsigned long long)total, buf_len);
  for (int i = 0; i < st_metadata_count(f); i++) {
    const char *k = st_metadata_key(f, i), *v = st_metadata_value(f, i);
    FUZZ_ASSERT(st_metadata(f, k) == v, "st_metadata('%s')", k);
    sum += strlen(k) + strlen(v);
  }
  FUZZ_ASSERT(!st_find(f, "__metadata__"), "a tensor named __metadata__");
  (void)sum;

  // `detr step`'s batch file.
  StepBatch batch;
  err[0] = 0;
  if (step_batch_read(f, DEVICE_CPU, 3, &batch, err, sizeof err)) fuzz_expect_error(err, path);
  else
    FUZZ_ASSERT(batch.B >= 1 && batch.H >= 1 && batch.W >= 1, "batch %lldx%lldx%lld", (long long)batch.B,
                (long long)batch.H, (long long)batch.W);
  step_batch_free(&batch);

  // Round trip through the writer, for files of the dtypes it writes.
  bool writable = true;
  for (int i = 0; i < st_count(f); i++) writable = writable && st_dtype_supported(st_entry(f, i)->dtype);
  if (writable) {
    StWriter *w = st_writer_new();
    for (int i = 0; i < st_count(f); i++) {
      const StEntry *e = st_entry(f, i);
      st_writer_add(w, e->name, e->dtype, e->ndim, e->shape, st_data(f, e));
    }
    for (int i = 0; i < st_metadata_count(f); i++)
      st_writer_set_metadata(w, st_metadata_key(f, i), st_metadata_value(f, i));
    const char *out = fuzz_path("roundtrip.safetensors");
    FUZZ_ASSERT(st_writer_save(w, out, err, sizeof err) == 0, "st_writer_save: %s", err);
    st_writer_free(w);
    StFile *g = st_open(out, err, sizeof err);
    FUZZ_ASSERT(g, "the written file does not open: %s", err);
    check_same(f, g);
    st_close(g);
  }
  st_close(f);
  return 0;
}
