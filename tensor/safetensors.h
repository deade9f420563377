// safetensors files (https://github.com/huggingface/safetensors): checkpoints, converted official
// DETR weights and the `step` parity files.
//
// Layout: a little-endian u64 N, N bytes of UTF-8 JSON header
//   {"NAME": {"dtype": "F32", "shape": [2, 3], "data_offsets": [BEGIN, END]}, ...,
//    "__metadata__": {"key": "value", ...}}
// then the data buffer; offsets are relative to its start and the tensors must cover it exactly
// (no holes, no overlaps). Zero-dim (shape []) and zero-size tensors are legal.
//
// Bad files are reported, never fatal: st_open returns NULL with a message naming the file and
// what is wrong. Misuse (a duplicate name in a writer, a negative dimension) stops with DETR_FAIL.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensor/tensor.h"

#define ST_MAX_DIMS 8
// Limits a file cannot exceed (each a clear error naming the file and the limit). The tensors'
// bytes are bounded by the file itself: they must tile its data buffer exactly, and the file is
// read once into memory of its size.
#define ST_MAX_HEADER_BYTES 100000000  // the reference implementation's limit
#define ST_MAX_TENSORS (1 << 20)       // tensors, and __metadata__ entries, per file
#define ST_MAX_NAME_BYTES 1024         // a tensor name or __metadata__ key, in bytes

typedef enum {
  // Read and written by detr-c.
  ST_F32,
  ST_F64,
  ST_I64,
  ST_I32,
  ST_U8,
  ST_BOOL,  // one byte per element, 0 or 1
  // Recognised in foreign files (their sizes are known, so such files validate and open) but not
  // written, and not loadable into a Tensor.
  ST_F16,
  ST_BF16,
  ST_I8,
  ST_I16,
  ST_U16,
  ST_U32,
  ST_U64,
  ST_F8_E4M3,
  ST_F8_E5M2,
  ST_DTYPE_COUNT
} StDtype;

size_t st_dtype_size(StDtype dt);       // bytes per element
const char *st_dtype_name(StDtype dt);  // "F32", ...
bool st_dtype_supported(StDtype dt);    // one of the first six

// --- reader ---

typedef struct {
  const char *name;
  StDtype dtype;
  int ndim;
  int64_t shape[ST_MAX_DIMS];
  int64_t numel;    // product of shape (1 for shape [])
  size_t nbytes;    // numel * st_dtype_size(dtype)
  uint64_t offset;  // start within the data buffer
} StEntry;

typedef struct StFile StFile;

// Reads and validates the whole file (one read into memory). The data buffer sits at a 64-byte
// aligned address, so an entry is aligned for its dtype whenever its offset is (always so in
// files from st_writer_save and from the reference writer).
StFile *st_open(const char *path, char *err, size_t err_cap);
void st_close(StFile *f);
const char *st_path(const StFile *f);

int st_count(const StFile *f);
const StEntry *st_entry(const StFile *f, int i);              // header order, 0 <= i < st_count
const StEntry *st_find(const StFile *f, const char *name);    // NULL if absent; binary search
const void *st_data(const StFile *f, const StEntry *e);       // e->nbytes bytes
const void *st_data_buffer(const StFile *f, size_t *nbytes);  // the whole buffer (e.g. for a crc)

int st_metadata_count(const StFile *f);
const char *st_metadata_key(const StFile *f, int i);  // header order
const char *st_metadata_value(const StFile *f, int i);
const char *st_metadata(const StFile *f, const char *key);  // NULL if absent

// Copies F32 tensor `name` into dst (on dst's device). Strict: a missing name, another dtype or
// a shape other than dst->shape returns -1 with a message naming the file, the tensor, and what
// was expected and found. Returns 0 on success.
int st_read_f32_into(const StFile *f, const char *name, Tensor *dst, char *err, size_t err_cap);

// --- writer ---

typedef struct StWriter StWriter;

StWriter *st_writer_new(void);
void st_writer_free(StWriter *w);
// Copies shape and data (st_dtype_size(dtype) * prod(shape) bytes), so the caller may free them.
// The header lists tensors in insertion order; names must be unique, valid UTF-8 and not
// "__metadata__".
void st_writer_add(StWriter *w, const char *name, StDtype dtype, int ndim, const int64_t *shape, const void *data);
void st_writer_add_tensor(StWriter *w, const char *name, const Tensor *t);     // F32, any device
void st_writer_set_metadata(StWriter *w, const char *key, const char *value);  // replaces
// Writes atomically: PATH.tmp.<pid> in the same directory, fsync, rename over PATH, fsync the
// directory. A failure leaves PATH as it was, removes the temp file and returns -1 with a message
// naming the path and the failing call. Returns 0 on success.
int st_writer_save(const StWriter *w, const char *path, char *err, size_t err_cap);
