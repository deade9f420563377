#define _POSIX_C_SOURCE 200809L  // O_CLOEXEC under -std=c11
#include "datasets/json_stream.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/error.h"
#include "datasets/data_util.h"

// The fuzz harnesses' inputs are a few kilobytes: small chunks make them cross chunk boundaries,
// as real files do.
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define DEFAULT_CHUNK 509u
#else
#define DEFAULT_CHUNK (1u << 16)
#endif

int64_t json_item_budget(const char *path) {
  struct stat st;
  int64_t bytes = stat(path, &st) == 0 && st.st_size > 0 ? (int64_t)st.st_size : 0;
  return bytes * JSON_MAX_ITEMS_PER_BYTE > JSON_MIN_ITEM_BUDGET ? bytes * JSON_MAX_ITEMS_PER_BYTE
                                                                : JSON_MIN_ITEM_BUDGET;
}

// Printable bytes around chunk[at] (24 each side), for the malformed-JSON message.
static void excerpt(const unsigned char *chunk, size_t n, size_t at, char *out, size_t cap) {
  size_t lo = at > 24 ? at - 24 : 0, hi = at + 24 < n ? at + 24 : n, k = 0;
  for (size_t i = lo; i < hi && k + 1 < cap; i++) out[k++] = (chunk[i] >= 32 && chunk[i] < 127) ? (char)chunk[i] : ' ';
  out[k] = '\0';
}

// YAJL's syntax error in chunk (n bytes, offset bytes of JSON before it), with where and what is near.
static void malformed(const char *path, yajl_handle h, const unsigned char *chunk, size_t n, int64_t offset, char *err,
                      size_t err_cap) {
  size_t at = yajl_get_bytes_consumed(h);
  unsigned char *reason = yajl_get_error(h, 0, chunk, n);
  const char *r = (const char *)reason;
  if (!strncmp(r, "parse error: ", 13)) r += 13;  // yajl_get_error(verbose 0): "parse error: <reason>\n"
  char line[128], near[64];
  snprintf(line, sizeof line, "%s", r);
  line[strcspn(line, "\r\n")] = '\0';
  excerpt(chunk, n, at, near, sizeof near);
  snprintf(err, err_cap, "%s: malformed JSON at byte %lld: %s, near \"%s\"", path, (long long)(offset + (int64_t)at),
           line, near);
  yajl_free_error(h, reason);
}

// The end of the stream (gzread returned 0 after offset bytes): a gzip error, or the parse completed.
static JsonStatus finish(const JsonReader *r, gzFile gz, yajl_handle h, int64_t offset, char *err, size_t err_cap) {
  int zerr;
  const char *msg = gzerror(gz, &zerr);
  if (zerr == Z_BUF_ERROR) {
    snprintf(err, err_cap, "%s: truncated gzip stream after %lld bytes of JSON", r->path, (long long)offset);
    return JSON_ERR_FORMAT;
  }
  if (zerr != Z_OK) {
    snprintf(err, err_cap, "%s: gzip error: %s", r->path, msg);
    return JSON_ERR_FORMAT;
  }
  if (offset == 0) {
    snprintf(err, err_cap, "%s: empty file (expected %s)", r->path, r->expect);
    return JSON_ERR_FORMAT;
  }
  yajl_status st = yajl_complete_parse(h);
  if (st == yajl_status_client_canceled) return JSON_ERR_CALLBACK;
  if (st != yajl_status_ok) {
    snprintf(err, err_cap, "%s: truncated JSON: the file ends inside a value after %lld bytes", r->path,
             (long long)offset);
    return JSON_ERR_FORMAT;
  }
  return JSON_OK;
}

// Feeds the stream to h chunk by chunk, to its end.
static JsonStatus feed(const JsonReader *r, gzFile gz, yajl_handle h, int64_t max_json, int64_t file_bytes,
                       int64_t *offset, char *err, size_t err_cap) {
  unsigned cap = r->chunk ? r->chunk : DEFAULT_CHUNK;
  unsigned char *chunk = detr_malloc(cap, "a JSON read buffer");  // [cap]
  JsonStatus rc = JSON_ERR_FORMAT;
  for (;;) {
    int n = gzread(gz, chunk, cap);
    if (n == 0) {
      rc = finish(r, gz, h, *offset, err, err_cap);
      break;
    }
    if (n < 0) {
      int zerr;
      const char *msg = gzerror(gz, &zerr);
      if (zerr == Z_BUF_ERROR)
        snprintf(err, err_cap, "%s: truncated gzip stream after %lld bytes of JSON", r->path, (long long)*offset);
      else
        snprintf(err, err_cap, "%s: read error after %lld bytes: %s", r->path, (long long)*offset,
                 zerr == Z_ERRNO ? strerror(errno) : msg);
      rc = zerr == Z_BUF_ERROR || zerr == Z_DATA_ERROR ? JSON_ERR_FORMAT : JSON_ERR_IO;
      break;
    }
    if (!gzdirect(gz) && *offset + n > max_json) {
      snprintf(err, err_cap,
               "%s: decompresses to more than %lld bytes, the limit for a %lld-byte .gz file (%dx, at least %lld; a "
               "gzip bomb?)",
               r->path, (long long)max_json, (long long)file_bytes, JSON_MAX_GZIP_RATIO,
               (long long)JSON_MIN_GZIP_BUDGET);
      break;
    }
    yajl_status st = yajl_parse(h, chunk, (size_t)n);
    if (st == yajl_status_client_canceled) {
      rc = JSON_ERR_CALLBACK;
      break;
    }
    if (st != yajl_status_ok) {
      malformed(r->path, h, chunk, (size_t)n, *offset, err, err_cap);
      break;
    }
    *offset += n;
  }
  free(chunk);
  return rc;
}

JsonStatus json_read_file(const JsonReader *r, int64_t *json_bytes, char *err, size_t err_cap) {
  if (json_bytes) *json_bytes = 0;
  int64_t file_bytes = data_regular_file_size(r->path, err, err_cap);
  if (file_bytes < 0) return JSON_ERR_IO;
  errno = 0;
  gzFile gz = gzopen(r->path, "rb");
  if (!gz) {
    snprintf(err, err_cap, "%s: cannot open: %s", r->path, errno ? strerror(errno) : "out of memory");
    return JSON_ERR_IO;
  }
  gzbuffer(gz, r->chunk ? r->chunk : DEFAULT_CHUNK);
  // A UTF-8 byte-order mark (editors on Windows write one): JSON forbids it, YAJL would stop at byte 1.
  unsigned char bom[3];
  if (gzread(gz, bom, 3) != 3 || bom[0] != 0xEF || bom[1] != 0xBB || bom[2] != 0xBF) gzrewind(gz);
  int64_t max_json =
      file_bytes * JSON_MAX_GZIP_RATIO > JSON_MIN_GZIP_BUDGET ? file_bytes * JSON_MAX_GZIP_RATIO : JSON_MIN_GZIP_BUDGET;
  yajl_handle h = yajl_alloc(r->callbacks, NULL, r->ctx);
  DETR_CHECK(h, "json_read_file: yajl_alloc failed (out of memory)");
  yajl_config(h, yajl_dont_validate_strings, r->check_utf8 ? 0 : 1);
  int64_t offset = 0;  // bytes of JSON handed to the parser
  JsonStatus rc = feed(r, gz, h, max_json, file_bytes, &offset, err, err_cap);
  yajl_free(h);
  gzclose(gz);
  if (json_bytes) *json_bytes = offset;
  return rc;
}
