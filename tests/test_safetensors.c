// safetensors reader and writer: round trips of every dtype, files written byte by byte from a
// literal header (an independent writer), every kind of malformed or truncated file, strict
// loading into tensors, and the atomic save's failure paths.
#define _POSIX_C_SOURCE 200809L  // mkdtemp, lstat, setrlimit under -std=c11
#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/runtime.h"
#include "tensor/safetensors.h"

// --- helpers ---

static char tmpdir[64];
static char err[1024];

static void make_tmpdir(void) {
  strcpy(tmpdir, "/tmp/detr_st_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tree(const char *path) {
  struct stat sb;
  if (lstat(path, &sb) != 0) return;
  if (S_ISDIR(sb.st_mode)) {
    chmod(path, 0700);
    DIR *d = opendir(path);
    struct dirent *de;
    while (d && (de = readdir(d))) {
      if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
      char sub[1024];
      snprintf(sub, sizeof sub, "%s/%s", path, de->d_name);
      remove_tree(sub);
    }
    if (d) closedir(d);
    rmdir(path);
  } else {
    unlink(path);
  }
}

static int dir_entries(const char *path) {
  DIR *d = opendir(path);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
  closedir(d);
  return n;
}

static const char *in_tmp(const char *name) {
  static char buf[4][256];
  static int k = 0;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
  return buf[k];
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  fclose(f);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *p = malloc(*n + 1);
  ck_assert_uint_eq(fread(p, 1, *n, f), *n);
  fclose(f);
  return p;
}

// An independent writer: the 8-byte little-endian length, the header text as given, the data.
static void write_st(const char *path, const char *header, size_t header_len, const void *data, size_t data_len) {
  size_t n = 8 + header_len + data_len;
  unsigned char *p = calloc(n, 1);
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)((uint64_t)header_len >> (8 * i));
  memcpy(p + 8, header, header_len);
  if (data_len && data) memcpy(p + 8 + header_len, data, data_len);
  write_bytes(path, p, n);
  free(p);
}

static void assert_contains(const char *s, const char *sub) {
  ck_assert_msg(strstr(s, sub) != NULL, "expected \"%s\" in: %s", sub, s);
}

static void expect_open_fails(const char *path, const char *sub) {
  err[0] = '\0';
  StFile *f = st_open(path, err, sizeof err);
  ck_assert_msg(f == NULL, "%s opened but should not: expected an error with \"%s\"", path, sub);
  assert_contains(err, path);
  assert_contains(err, sub);
}

// --- tests ---

START_TEST(dtype_table) {
  ck_assert_uint_eq(st_dtype_size(ST_F32), 4);
  ck_assert_uint_eq(st_dtype_size(ST_F64), 8);
  ck_assert_uint_eq(st_dtype_size(ST_I64), 8);
  ck_assert_uint_eq(st_dtype_size(ST_I32), 4);
  ck_assert_uint_eq(st_dtype_size(ST_U8), 1);
  ck_assert_uint_eq(st_dtype_size(ST_BOOL), 1);
  ck_assert_uint_eq(st_dtype_size(ST_BF16), 2);
  ck_assert_str_eq(st_dtype_name(ST_BOOL), "BOOL");
  ck_assert_str_eq(st_dtype_name(ST_BF16), "BF16");
  ck_assert(st_dtype_supported(ST_BOOL));
  ck_assert(!st_dtype_supported(ST_F16));
}
END_TEST

START_TEST(roundtrip_every_dtype) {
  make_tmpdir();
  const char *path = in_tmp("all.safetensors");
  float f32[6] = {1.5f, -2.25f, 3e-38f, 1e30f, 0.0f, -0.0f};
  double f64[3] = {1.0 / 3.0, -1e300, 4.9e-324};
  int64_t i64[4] = {INT64_MIN, -1, 0, INT64_MAX};
  int32_t i32[5] = {INT32_MIN, -7, 0, 7, INT32_MAX};
  uint8_t u8[3] = {0, 127, 255};  // odd size: later tensors must still come out aligned
  uint8_t b[4] = {1, 0, 0, 1};
  float scalar = 42.0f;
  uint8_t u8_scalar = 9;

  StWriter *w = st_writer_new();
  st_writer_add(w, "u8", ST_U8, 1, (int64_t[]){3}, u8);  // first in the header, last in the data
  st_writer_add(w, "f32", ST_F32, 2, (int64_t[]){2, 3}, f32);
  st_writer_add(w, "f64", ST_F64, 1, (int64_t[]){3}, f64);
  st_writer_add(w, "i64", ST_I64, 2, (int64_t[]){2, 2}, i64);
  st_writer_add(w, "i32", ST_I32, 1, (int64_t[]){5}, i32);
  st_writer_add(w, "bool", ST_BOOL, 2, (int64_t[]){2, 2}, b);
  st_writer_add(w, "scalar", ST_F32, 0, NULL, &scalar);
  st_writer_add(w, "u8_scalar", ST_U8, 0, NULL, &u8_scalar);
  st_writer_add(w, "empty", ST_F32, 2, (int64_t[]){0, 4}, NULL);
  st_writer_add(w, "empty_i64", ST_I64, 1, (int64_t[]){0}, NULL);
  st_writer_add(w, "na\"me\\ with\ttab \xc3\xa9", ST_I32, 1, (int64_t[]){1}, i32);
  const char *tricky =
      "quote\" backslash\\ nl\n cr\r tab\t bs\b ff\f ctl\x01\x1f del\x7f "
      "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 /slash";
  st_writer_set_metadata(w, "format", "pt");
  st_writer_set_metadata(w, "tricky\"key\n", tricky);
  st_writer_set_metadata(w, "format", "detr");  // replaces
  st_writer_set_metadata(w, "empty", "");
  f32[0] = 99.0f;  // the writer copied the data
  ck_assert_int_eq(st_writer_save(w, path, err, sizeof err), 0);
  st_writer_free(w);
  f32[0] = 1.5f;
  ck_assert_int_eq(dir_entries(tmpdir), 1);  // no temp file left behind

  size_t fsize;
  unsigned char *raw = read_bytes(path, &fsize);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | raw[i];
  ck_assert_uint_eq(hlen % 8, 0);  // padded, so the data starts 8-aligned
  ck_assert_int_eq(raw[8], '{');
  free(raw);

  StFile *f = st_open(path, err, sizeof err);
  ck_assert_msg(f != NULL, "%s", err);
  ck_assert_str_eq(st_path(f), path);
  ck_assert_int_eq(st_count(f), 11);
  const char *order[] = {"u8",
                         "f32",
                         "f64",
                         "i64",
                         "i32",
                         "bool",
                         "scalar",
                         "u8_scalar",
                         "empty",
                         "empty_i64",
                         "na\"me\\ with\ttab \xc3\xa9"};
  for (int i = 0; i < 11; i++) {
    const StEntry *e = st_entry(f, i);
    ck_assert_str_eq(e->name, order[i]);  // header order is insertion order
    ck_assert_ptr_eq(st_find(f, order[i]), e);
    ck_assert_uint_eq((uintptr_t)st_data(f, e) % st_dtype_size(e->dtype), 0);
  }
  const StEntry *e = st_find(f, "f32");
  ck_assert_int_eq(e->dtype, ST_F32);
  ck_assert_int_eq(e->ndim, 2);
  ck_assert_int_eq(e->shape[0], 2);
  ck_assert_int_eq(e->shape[1], 3);
  ck_assert_int_eq(e->numel, 6);
  ck_assert_uint_eq(e->nbytes, 24);
  ck_assert_mem_eq(st_data(f, e), f32, sizeof f32);
  e = st_find(f, "f64");
  ck_assert_int_eq(e->dtype, ST_F64);
  ck_assert_mem_eq(st_data(f, e), f64, sizeof f64);
  e = st_find(f, "i64");
  ck_assert_int_eq(e->dtype, ST_I64);
  ck_assert_mem_eq(st_data(f, e), i64, sizeof i64);
  e = st_find(f, "i32");
  ck_assert_int_eq(e->dtype, ST_I32);
  ck_assert_mem_eq(st_data(f, e), i32, sizeof i32);
  e = st_find(f, "u8");
  ck_assert_int_eq(e->dtype, ST_U8);
  ck_assert_mem_eq(st_data(f, e), u8, sizeof u8);
  e = st_find(f, "bool");
  ck_assert_int_eq(e->dtype, ST_BOOL);
  ck_assert_mem_eq(st_data(f, e), b, sizeof b);
  e = st_find(f, "scalar");
  ck_assert_int_eq(e->ndim, 0);
  ck_assert_int_eq(e->numel, 1);
  ck_assert_mem_eq(st_data(f, e), &scalar, 4);
  e = st_find(f, "u8_scalar");
  ck_assert_int_eq(e->ndim, 0);
  ck_assert_int_eq(*(const uint8_t *)st_data(f, e), 9);
  e = st_find(f, "empty");
  ck_assert_int_eq(e->ndim, 2);
  ck_assert_int_eq(e->shape[0], 0);
  ck_assert_int_eq(e->shape[1], 4);
  ck_assert_int_eq(e->numel, 0);
  ck_assert_uint_eq(e->nbytes, 0);
  ck_assert_int_eq(st_find(f, "empty_i64")->numel, 0);
  ck_assert_ptr_null(st_find(f, "missing"));
  ck_assert_ptr_null(st_find(f, ""));

  ck_assert_int_eq(st_metadata_count(f), 3);
  ck_assert_str_eq(st_metadata_key(f, 0), "format");
  ck_assert_str_eq(st_metadata_value(f, 0), "detr");
  ck_assert_str_eq(st_metadata(f, "format"), "detr");
  ck_assert_str_eq(st_metadata(f, "tricky\"key\n"), tricky);
  ck_assert_str_eq(st_metadata(f, "empty"), "");
  ck_assert_ptr_null(st_metadata(f, "absent"));
  size_t nbuf;
  st_data_buffer(f, &nbuf);
  ck_assert_uint_eq(nbuf, 24 + 24 + 32 + 20 + 4 + 4 + 1 + 3 + 4);
  st_close(f);
  remove_tree(tmpdir);
}
END_TEST

START_TEST(empty_file_and_overwrite) {
  make_tmpdir();
  const char *path = in_tmp("x.safetensors");
  StWriter *w = st_writer_new();
  ck_assert_int_eq(st_writer_save(w, path, err, sizeof err), 0);  // no tensors: "{}" + padding
  st_writer_free(w);
  StFile *f = st_open(path, err, sizeof err);
  ck_assert_msg(f != NULL, "%s", err);
  ck_assert_int_eq(st_count(f), 0);
  ck_assert_int_eq(st_metadata_count(f), 0);
  ck_assert_ptr_null(st_find(f, "a"));
  ck_assert_ptr_null(st_metadata(f, "a"));
  st_close(f);
  // Saving over an existing file replaces it.
  w = st_writer_new();
  float v = 3.0f;
  st_writer_add(w, "v", ST_F32, 1, (int64_t[]){1}, &v);
  ck_assert_int_eq(st_writer_save(w, path, err, sizeof err), 0);
  st_writer_free(w);
  f = st_open(path, err, sizeof err);
  ck_assert_msg(f != NULL, "%s", err);
  ck_assert_int_eq(st_count(f), 1);
  st_close(f);
  ck_assert_int_eq(dir_entries(tmpdir), 1);
  remove_tree(tmpdir);
}
END_TEST

START_TEST(find_among_many) {
  make_tmpdir();
  const char *path = in_tmp("many.safetensors");
  StWriter *w = st_writer_new();
  char name[64];
  for (int i = 0; i < 600; i++) {
    float v = (float)i;
    snprintf(name, sizeof name, "transformer.encoder.layers.%d.linear%d.weight", i % 97, i);
    st_writer_add(w, name, ST_F32, 1, (int64_t[]){1}, &v);
  }
  ck_assert_int_eq(st_writer_save(w, path, err, sizeof err), 0);
  st_writer_free(w);
  StFile *f = st_open(path, err, sizeof err);
  ck_assert_msg(f != NULL, "%s", err);
  for (int i = 599; i >= 0; i--) {
    snprintf(name, sizeof name, "transformer.encoder.layers.%d.linear%d.weight", i % 97, i);
    const StEntry *e = st_find(f, name);
    ck_assert_ptr_nonnull(e);
    ck_assert_ptr_eq(e, st_entry(f, i));
    float v;
    memcpy(&v, st_data(f, e), 4);
    ck_assert_float_eq(v, (float)i);
  }
  ck_assert_ptr_null(st_find(f, "transformer.encoder.layers.0.linear1.weigh"));
  st_close(f);
  remove_tree(tmpdir);
}
END_TEST

START_TEST(read_f32_into_is_strict) {
  make_tmpdir();
  const char *path = in_tmp("m.safetensors");
  float w6[6] = {1, 2, 3, 4, 5, 6};
  double d2[2] = {1, 2};
  Tensor *src = tensor_from_host(DEVICE_CPU, SHAPE(2, 3), w6);
  StWriter *w = st_writer_new();
  st_writer_add_tensor(w, "linear.weight", src);
  st_writer_add(w, "double", ST_F64, 1, (int64_t[]){2}, d2);
  float s = 7.0f;
  st_writer_add(w, "scalar", ST_F32, 0, NULL, &s);
  st_writer_add(w, "empty", ST_F32, 2, (int64_t[]){0, 3}, NULL);
  ck_assert_int_eq(st_writer_save(w, path, err, sizeof err), 0);
  st_writer_free(w);
  tensor_release(src);

  StFile *f = st_open(path, err, sizeof err);
  ck_assert_msg(f != NULL, "%s", err);
  Tensor *dst = tensor_zeros(DEVICE_CPU, SHAPE(2, 3));
  ck_assert_int_eq(st_read_f32_into(f, "linear.weight", dst, err, sizeof err), 0);
  for (int i = 0; i < 6; i++) ck_assert_float_eq(dst->data[i], w6[i]);
  Tensor *sc = tensor_zeros(DEVICE_CPU, shape_make(NULL, 0));
  ck_assert_int_eq(st_read_f32_into(f, "scalar", sc, err, sizeof err), 0);
  ck_assert_float_eq(tensor_item(sc), 7.0f);
  Tensor *em = tensor_zeros(DEVICE_CPU, SHAPE(0, 3));
  ck_assert_int_eq(st_read_f32_into(f, "empty", em, err, sizeof err), 0);

  ck_assert_int_eq(st_read_f32_into(f, "nope", dst, err, sizeof err), -1);
  assert_contains(err, path);
  assert_contains(err, "'nope' not found");
  ck_assert_int_eq(st_read_f32_into(f, "double", dst, err, sizeof err), -1);
  assert_contains(err, path);
  assert_contains(err, "'double' has dtype F64, expected F32");
  Tensor *wrong = tensor_zeros(DEVICE_CPU, SHAPE(3, 2));
  ck_assert_int_eq(st_read_f32_into(f, "linear.weight", wrong, err, sizeof err), -1);
  assert_contains(err, path);
  assert_contains(err, "'linear.weight' has shape [2, 3], expected [3, 2]");
  Tensor *flat = tensor_zeros(DEVICE_CPU, SHAPE(6));  // same numel, other rank: still an error
  ck_assert_int_eq(st_read_f32_into(f, "linear.weight", flat, err, sizeof err), -1);
  assert_contains(err, "expected [6]");
  ck_assert_int_eq(st_read_f32_into(f, "scalar", flat, err, sizeof err), -1);
  assert_contains(err, "'scalar' has shape [], expected [6]");
  for (int i = 0; i < 6; i++) ck_assert_float_eq(flat->data[i], 0.0f);  // untouched on error
  st_close(f);
  tensor_release(dst);
  tensor_release(sc);
  tensor_release(em);
  tensor_release(wrong);
  tensor_release(flat);
  remove_tree(tmpdir);
}
END_TEST

START_TEST(independent_writer_file) {
  make_tmpdir();
  // Unpadded header (any length is legal), keys in another order, whitespace, metadata last.
  const char *path = in_tmp("foreign.safetensors");
  const char *hdr =
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"__metadata__\":{\"format\":\"pt\"}}";
  unsigned char data[8] = {0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x00, 0xc0};  // 1.5f, -2.0f
  write_st(path, hdr, strlen(hdr), data, sizeof data);
  StFile *f = st_open(path, err, sizeof err);
  ck_assert_msg(f != NULL, "%s", err);
  ck_assert_int_eq(st_count(f), 1);
  ck_assert_str_eq(st_metadata(f, "format"), "pt");
  Tensor *t = tensor_zeros(DEVICE_CPU, SHAPE(2));
  ck_assert_int_eq(st_read_f32_into(f, "a", t, err, sizeof err), 0);
  ck_assert_float_eq(t->data[0], 1.5f);
  ck_assert_float_eq(t->data[1], -2.0f);
  st_close(f);

  // Misaligned F32 data (after one U8), an unknown field that is tolerated, an F16 tensor: the
  // file opens; the F16 tensor is reported as unsupported when loaded.
  path = in_tmp("foreign2.safetensors");
  hdr =
      "{ \"b\" : { \"data_offsets\" : [1, 5], \"shape\" : [ 1 ], \"dtype\" : \"F32\" },\n"
      "  \"flag\": {\"dtype\": \"U8\", \"shape\": [], \"data_offsets\": [0, 1],"
      " \"extra\": {\"nested\": [1, {\"x\": null}], \"t\": true}},\n"
      "  \"half\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [5, 9]} }";
  unsigned char data2[9] = {1, 0x00, 0x00, 0x80, 0x40, 0x00, 0x3c, 0x00, 0x40};  // 4.0f
  write_st(path, hdr, strlen(hdr), data2, sizeof data2);
  f = st_open(path, err, sizeof err);
  ck_assert_msg(f != NULL, "%s", err);
  ck_assert_int_eq(st_count(f), 3);
  ck_assert_str_eq(st_entry(f, 0)->name, "b");
  ck_assert_int_eq(st_find(f, "flag")->ndim, 0);
  ck_assert_int_eq(st_find(f, "half")->dtype, ST_F16);
  Tensor *one = tensor_zeros(DEVICE_CPU, SHAPE(1));
  ck_assert_int_eq(st_read_f32_into(f, "b", one, err, sizeof err), 0);
  ck_assert_float_eq(one->data[0], 4.0f);
  Tensor *two = tensor_zeros(DEVICE_CPU, SHAPE(2));
  ck_assert_int_eq(st_read_f32_into(f, "half", two, err, sizeof err), -1);
  assert_contains(err, "has dtype F16, expected F32 (unsupported dtype)");
  ck_assert_int_eq(st_metadata_count(f), 0);
  st_close(f);
  tensor_release(t);
  tensor_release(one);
  tensor_release(two);
  remove_tree(tmpdir);
}
END_TEST

typedef struct {
  const char *header;
  size_t data_len;
  const char *expect;
} BadCase;

START_TEST(malformed_files) {
  make_tmpdir();
  const BadCase cases[] = {
      {"hello", 0, "malformed JSON"},
      {"{\"a\":", 0, "malformed JSON"},
      {"{} x", 0, "malformed JSON"},
      {"{}{}", 0, "malformed JSON"},
      {"{/* c */}", 0, "malformed JSON"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},}", 4, "malformed JSON"},
      {"{\"\xff\":1}", 0, "malformed JSON"},  // invalid UTF-8
      {"", 0, "malformed JSON"},
      {"[1, 2]", 0, "not a JSON object"},
      {"\"str\"", 0, "not a JSON object"},
      {"{\"a\":5}", 0, "tensor 'a' is not an object"},
      {"{\"a\":[]}", 0, "tensor 'a' is not an object"},
      {"{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor 'a' has no \"dtype\""},
      {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor 'a' has no \"shape\""},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor 'a' has no \"data_offsets\""},
      {"{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "unknown dtype \"F33\""},
      {"{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype is not a string"},
      {"{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
       "\"dtype\" appears twice"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4, "shape is not an array"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
       "shape holds -1, not a non-negative integer"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4,
       "shape holds 1.0, not a non-negative integer"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1e0],\"data_offsets\":[0,4]}}", 4, "not a non-negative integer"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4,
       "shape holds a value that is not an integer"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[[1]],\"data_offsets\":[0,4]}}", 4,
       "shape holds a value that is not an integer"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[null],\"data_offsets\":[0,4]}}", 4, "not an integer"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999999],\"data_offsets\":[0,4]}}", 4,
       "which is too large"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[9223372036854775808],\"data_offsets\":[0,4]}}", 4, "which is too large"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,4]}}", 4,
       "shape [4294967296, 4294967296, 4] is too large"},
      {"{\"a\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,4]}}", 4,
       "is too large"},  // numel fits, bytes overflow
      {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "more than 8 dimensions"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "data_offsets has more than 2 values"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", 4, "data_offsets has 1 value, expected 2"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}}}", 4, "data_offsets is not an array"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, "data_offsets [4, 0] are not in order"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 2,
       "run past the end of the 2-byte data buffer"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
       "data_offsets [0, 8] hold 8 bytes but F32 [3] needs 12"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
       12, "tensor 'b' (bytes 4..12) overlaps tensor 'a' (ends at 8)"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
       12, "bytes 4..8 of the data buffer belong to no tensor (before 'b')"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
       "bytes 0..4 of the data buffer belong to no tensor"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8,
       "the data buffer has 8 bytes but the tensors cover 4"},
      {"{}", 3, "the data buffer has 3 bytes but the tensors cover 0"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
       8, "tensor name 'a' appears twice"},
      {"{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor name contains a NUL"},
      {"{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ value of 'k' is not a string"},
      {"{\"__metadata__\":{\"k\":null}}", 0, "__metadata__ value of 'k' is not a string"},
      {"{\"__metadata__\":{\"k\":[\"v\"]}}", 0, "__metadata__ value of 'k' is not a string"},
      {"{\"__metadata__\":{\"k\":{}}}", 0, "__metadata__ value of 'k' is not a string"},
      {"{\"__metadata__\":\"x\"}", 0, "__metadata__ is not an object"},
      {"{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__ appears twice"},
      {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0, "__metadata__ key 'k' appears twice"},
      {"{\"__metadata__\":{\"k\":\"a\\u0000b\"}}", 0, "contains a NUL character"},
  };
  int ncases = (int)(sizeof cases / sizeof cases[0]);
  unsigned char zeros[64] = {0};
  for (int i = 0; i < ncases; i++) {
    char name[32];
    snprintf(name, sizeof name, "bad%02d.safetensors", i);
    const char *path = in_tmp(name);
    write_st(path, cases[i].header, strlen(cases[i].header), zeros, cases[i].data_len);
    expect_open_fails(path, cases[i].expect);
  }

  // Failures before the header.
  expect_open_fails(in_tmp("does_not_exist.safetensors"), "cannot open: No such file");
  write_bytes(in_tmp("empty.safetensors"), "", 0);
  expect_open_fails(in_tmp("empty.safetensors"), "0 bytes is too short");
  write_bytes(in_tmp("short.safetensors"), "\x05\0\0\0\0", 5);
  expect_open_fails(in_tmp("short.safetensors"), "5 bytes is too short");
  unsigned char big[24] = {0xe8, 0x03};  // N = 1000, 16 bytes follow
  write_bytes(in_tmp("long_header.safetensors"), big, sizeof big);
  expect_open_fails(in_tmp("long_header.safetensors"), "header length 1000 is larger than the 16 bytes after it");
  unsigned char huge[24] = {0x00, 0xc2, 0xeb, 0x0b};  // N = 200,000,000
  write_bytes(in_tmp("huge_header.safetensors"), huge, sizeof huge);
  expect_open_fails(in_tmp("huge_header.safetensors"), "header length 200000000 exceeds the 100000000-byte limit");
  unsigned char ones[16];
  memset(ones, 0xff, sizeof ones);  // N = 2^64 - 1: no overflow in the size checks
  write_bytes(in_tmp("max_header.safetensors"), ones, sizeof ones);
  expect_open_fails(in_tmp("max_header.safetensors"), "exceeds the 100000000-byte limit");
  mkdir(in_tmp("a_dir.safetensors"), 0700);
  expect_open_fails(in_tmp("a_dir.safetensors"), "not a regular file");
  // A header with an embedded NUL byte (not an escape): raw control characters are not JSON.
  write_st(in_tmp("nul.safetensors"), "{}\0  ", 5, NULL, 0);
  expect_open_fails(in_tmp("nul.safetensors"), "malformed JSON");
  // NULL / zero-capacity error buffers are allowed.
  ck_assert_ptr_null(st_open(in_tmp("empty.safetensors"), NULL, 0));
  remove_tree(tmpdir);
}
END_TEST

START_TEST(truncated_files) {
  make_tmpdir();
  const char *path = in_tmp("full.safetensors");
  float a[100];
  for (int i = 0; i < 100; i++) a[i] = (float)i;
  StWriter *w = st_writer_new();
  st_writer_add(w, "a", ST_F32, 2, (int64_t[]){10, 10}, a);
  st_writer_add(w, "b", ST_F32, 1, (int64_t[]){7}, a);
  st_writer_set_metadata(w, "step", "12");
  ck_assert_int_eq(st_writer_save(w, path, err, sizeof err), 0);
  st_writer_free(w);
  size_t n;
  unsigned char *full = read_bytes(path, &n);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | full[i];
  size_t cuts[] = {0, 1, 7, 8, 9, 8 + hlen / 2, 8 + hlen - 1, 8 + hlen, 8 + hlen + 1, 8 + hlen + 28, n - 4, n - 1};
  const char *cut_path = in_tmp("cut.safetensors");
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    write_bytes(cut_path, full, cuts[i]);
    err[0] = '\0';
    ck_assert_msg(st_open(cut_path, err, sizeof err) == NULL, "cut at %zu of %zu opened", cuts[i], n);
    assert_contains(err, cut_path);
  }
  // Spot-check the messages at the interesting places.
  write_bytes(cut_path, full, 8 + hlen / 2);
  expect_open_fails(cut_path, "is larger than");
  write_bytes(cut_path, full, n - 1);
  expect_open_fails(cut_path, "run past the end");
  // A trailing byte is caught too.
  unsigned char *longer = malloc(n + 1);
  memcpy(longer, full, n);
  longer[n] = 0;
  write_bytes(cut_path, longer, n + 1);
  expect_open_fails(cut_path, "trailing bytes");
  free(longer);
  free(full);
  remove_tree(tmpdir);
}
END_TEST

// Random single-byte corruptions of a valid file: each either opens with entries that lie inside
// the data buffer, or fails with a message naming the file. Never a crash (ASan run in CI).
START_TEST(corrupted_files_never_crash) {
  make_tmpdir();
  const char *path = in_tmp("ok.safetensors");
  int64_t i64[3] = {1, 2, 3};
  float f[4] = {1, 2, 3, 4};
  StWriter *w = st_writer_new();
  st_writer_add(w, "ids", ST_I64, 1, (int64_t[]){3}, i64);
  st_writer_add(w, "w", ST_F32, 2, (int64_t[]){2, 2}, f);
  st_writer_add(w, "e", ST_U8, 1, (int64_t[]){0}, NULL);
  st_writer_set_metadata(w, "k", "v");
  ck_assert_int_eq(st_writer_save(w, path, err, sizeof err), 0);
  st_writer_free(w);
  size_t n;
  unsigned char *full = read_bytes(path, &n);
  unsigned char *bad = malloc(n);
  const char *bad_path = in_tmp("bad.safetensors");
  static const char junk[] = "0123456789[]{},:\"-. a";  // JSON-ish bytes reach deeper
  uint64_t state = 12345;
  int opened = 0;
  for (int it = 0; it < 1500; it++) {
    memcpy(bad, full, n);
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    size_t pos = (size_t)(state >> 33) % n;
    unsigned char val = (unsigned char)(state >> 20);
    bad[pos] = it % 3 == 0 ? (unsigned char)junk[val % (sizeof junk - 1)] : val;
    size_t len = it % 7 == 0 ? (size_t)(state >> 40) % n : n;
    write_bytes(bad_path, bad, len);
    err[0] = '\0';
    StFile *sf = st_open(bad_path, err, sizeof err);
    if (!sf) {
      assert_contains(err, bad_path);
      continue;
    }
    opened++;
    size_t nbuf;
    st_data_buffer(sf, &nbuf);
    for (int i = 0; i < st_count(sf); i++) {
      const StEntry *e = st_entry(sf, i);
      ck_assert_uint_le(e->offset + e->nbytes, nbuf);
      ck_assert_uint_eq(e->nbytes, (size_t)e->numel * st_dtype_size(e->dtype));
    }
    st_close(sf);
  }
  ck_assert_int_gt(opened, 0);  // data-byte flips still open
  free(bad);
  free(full);
  remove_tree(tmpdir);
}
END_TEST

static StWriter *writer_with(float value, int n) {
  StWriter *w = st_writer_new();
  float *v = malloc((size_t)n * sizeof *v);
  for (int i = 0; i < n; i++) v[i] = value;
  st_writer_add(w, "v", ST_F32, 1, (int64_t[]){n}, v);
  free(v);
  return w;
}

static float first_value(const char *path) {
  StFile *f = st_open(path, err, sizeof err);
  ck_assert_msg(f != NULL, "%s", err);
  float v;
  memcpy(&v, st_data(f, st_find(f, "v")), 4);
  st_close(f);
  return v;
}

// The limits a file cannot exceed (tensor/safetensors.h) and what the fuzzer found: each a clear
// error naming the file. Inputs of the fuzz harness (fuzz/corpus/safetensors/crash-*) are rerun
// by tools/fuzz.sh --smoke.
START_TEST(hostile_headers) {
  make_tmpdir();
  const char *path = in_tmp("h.safetensors");
  // Overlong UTF-8 ("\xc1\xa9" for U+0069): YAJL lets it through; the writer would refuse it.
  const char *overlong = "{\"__metadata__\":{\"k\":\"\xc1\xa9\"}}";
  write_st(path, overlong, strlen(overlong), NULL, 0);
  expect_open_fails(path, "value of 'k' is not valid UTF-8");
  const char *bad_name = "{\"\xe0\x80\xaf\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}";
  write_st(path, bad_name, strlen(bad_name), "x", 1);
  expect_open_fails(path, "tensor 0's name is not valid UTF-8");
  // A name of ST_MAX_NAME_BYTES + 1 bytes.
  char *h = malloc(4096);
  char *name = malloc(ST_MAX_NAME_BYTES + 2);
  memset(name, 'n', ST_MAX_NAME_BYTES + 1);
  name[ST_MAX_NAME_BYTES + 1] = 0;
  snprintf(h, 4096, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", name);
  write_st(path, h, strlen(h), "x", 1);
  expect_open_fails(path, "more than the limit of 1024");
  name[ST_MAX_NAME_BYTES] = 0;  // exactly the limit: fine
  snprintf(h, 4096, "{\"%s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}", name);
  write_st(path, h, strlen(h), "x", 1);
  StFile *f = st_open(path, err, sizeof err);
  ck_assert_msg(f, "%s", err);
  st_close(f);
  // Nesting inside an unknown field: DETR_MAX_JSON_DEPTH levels at most.
  size_t n = 0;
  n += (size_t)snprintf(h + n, 4096 - n, "{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1],\"x\":");
  for (int i = 0; i < 100; i++) h[n++] = '[';
  for (int i = 0; i < 100; i++) h[n++] = ']';
  n += (size_t)snprintf(h + n, 4096 - n, "}}");
  write_st(path, h, n, "x", 1);
  expect_open_fails(path, "nested deeper than the limit of 64 levels");
  free(name);
  free(h);
  remove_tree(tmpdir);
}
END_TEST

START_TEST(atomic_save_failures) {
  make_tmpdir();
  const char *path = in_tmp("ckpt.safetensors");
  StWriter *old = writer_with(1.0f, 4);
  ck_assert_int_eq(st_writer_save(old, path, err, sizeof err), 0);
  st_writer_free(old);

  // A directory that does not exist: nothing is created.
  StWriter *w = writer_with(2.0f, 4);
  const char *nodir = in_tmp("no/such/dir/x.safetensors");
  ck_assert_int_eq(st_writer_save(w, nodir, err, sizeof err), -1);
  assert_contains(err, nodir);
  assert_contains(err, "fopen(");
  assert_contains(err, "No such file or directory");
  ck_assert_int_eq(dir_entries(tmpdir), 1);

  // A directory we may not write to (root ignores permissions, so only as another user).
  if (geteuid() != 0) {
    const char *ro = in_tmp("ro");
    ck_assert_int_eq(mkdir(ro, 0700), 0);
    const char *ro_path = in_tmp("ro/ckpt.safetensors");
    ck_assert_int_eq(st_writer_save(w, ro_path, err, sizeof err), 0);
    chmod(ro, 0500);
    StWriter *w3 = writer_with(3.0f, 4);
    ck_assert_int_eq(st_writer_save(w3, ro_path, err, sizeof err), -1);
    assert_contains(err, ro_path);
    assert_contains(err, "Permission denied");
    chmod(ro, 0700);
    ck_assert_int_eq(dir_entries(ro), 1);
    ck_assert_float_eq(first_value(ro_path), 2.0f);
    st_writer_free(w3);
    remove_tree(ro);
  }

  // rename fails (the target is a non-empty directory): the written temp file is removed.
  const char *taken = in_tmp("taken");
  ck_assert_int_eq(mkdir(taken, 0700), 0);
  write_bytes(in_tmp("taken/keep"), "x", 1);
  ck_assert_int_eq(st_writer_save(w, taken, err, sizeof err), -1);
  assert_contains(err, taken);
  assert_contains(err, "rename(");
  ck_assert_int_eq(dir_entries(tmpdir), 2);  // ckpt.safetensors and taken/
  remove_tree(taken);

  // The write itself fails part-way (file size limit; works as root too): the old checkpoint is
  // intact and the temp file is gone.
  StWriter *big = writer_with(5.0f, 100000);
  struct rlimit saved, lim;
  getrlimit(RLIMIT_FSIZE, &saved);
  lim = saved;
  lim.rlim_cur = 4096;
  signal(SIGXFSZ, SIG_IGN);  // get EFBIG instead of being killed
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
  int rc = st_writer_save(big, path, err, sizeof err);
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, SIG_DFL);
  ck_assert_int_eq(rc, -1);
  assert_contains(err, path);
  assert_contains(err, ".tmp.");
  assert_contains(err, "File too large");
  ck_assert_int_eq(dir_entries(tmpdir), 1);
  ck_assert_float_eq(first_value(path), 1.0f);

  // And a save that succeeds replaces it.
  ck_assert_int_eq(st_writer_save(big, path, err, sizeof err), 0);
  ck_assert_float_eq(first_value(path), 5.0f);
  ck_assert_int_eq(dir_entries(tmpdir), 1);
  st_writer_free(big);
  st_writer_free(w);
  remove_tree(tmpdir);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("safetensors");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);  // Check's 4 s default is too tight on a loaded 2-core machine
  tcase_add_test(tc, dtype_table);
  tcase_add_test(tc, roundtrip_every_dtype);
  tcase_add_test(tc, empty_file_and_overwrite);
  tcase_add_test(tc, find_among_many);
  tcase_add_test(tc, read_f32_into_is_strict);
  tcase_add_test(tc, independent_writer_file);
  tcase_add_test(tc, malformed_files);
  tcase_add_test(tc, truncated_files);
  tcase_add_test(tc, corrupted_files_never_crash);
  tcase_add_test(tc, atomic_save_failures);
  tcase_add_test(tc, hostile_headers);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
