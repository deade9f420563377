// One reader for every JSON input: COCO instances files (datasets/coco.c), detection results
// (eval/cocoeval_io.c) and a model's class names from a COCO file (api/model_file.c). The file,
// plain or gzip (zlib passes plain files through; a UTF-8 byte-order mark is skipped), is read in
// chunks into YAJL with the caller's callbacks, so no file is ever held whole, and every failure of
// the file itself is worded here, once: not a regular file (a named pipe would block the open),
// unreadable, a truncated or corrupt gzip stream, a .gz that expands past its limit (a gzip bomb),
// malformed JSON (the byte and the text near it), a file that ends inside a value, an empty file.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <yajl/yajl_parse.h>

// A .gz file may expand to JSON_MAX_GZIP_RATIO times its size on disk (at least JSON_MIN_GZIP_BUDGET
// bytes); a file may hold JSON_MAX_ITEMS_PER_BYTE array items per byte on disk (at least
// JSON_MIN_ITEM_BUDGET): real COCO files expand 5-10x and hold far fewer items than bytes, a gzip
// bomb 1000x.
#define JSON_MAX_GZIP_RATIO 200
#define JSON_MIN_GZIP_BUDGET ((int64_t)256 << 20)
#define JSON_MAX_ITEMS_PER_BYTE 1
#define JSON_MIN_ITEM_BUDGET (1 << 20)

typedef struct {
  const char *path;
  const yajl_callbacks *callbacks;
  void *ctx;           // the callbacks' state
  const char *expect;  // what the file should be, for an empty one: "a COCO instances file"
  unsigned chunk;      // bytes handed to YAJL at a time (0: 64 KiB)
  bool check_utf8;     // YAJL checks that strings are UTF-8 (off: names are copied as bytes)
} JsonReader;

// What json_read_file found: the whole file parsed, or why not.
typedef enum {
  JSON_OK = 0,
  JSON_ERR_IO = -1,        // cannot be opened or read, or no regular file (err set)
  JSON_ERR_FORMAT = -2,    // a corrupt or truncated gzip stream, a gzip bomb, malformed, truncated or
                           // empty JSON (err set)
  JSON_ERR_CALLBACK = -3,  // a callback returned 0: it cancels the parse and says why in its own
                           // state (err untouched)
} JsonStatus;

// Parses the whole file (*json_bytes: the JSON's size, decompressed, as far as it was read).
JsonStatus json_read_file(const JsonReader *r, int64_t *json_bytes, char *err, size_t err_cap);

// How many array items the file at path may hold (JSON_MAX_ITEMS_PER_BYTE per byte on disk).
int64_t json_item_budget(const char *path);
