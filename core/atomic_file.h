// A file written whole or not at all: the bytes go to a temporary file beside it
// (PATH.tmp.<pid>), reach the disk (fsync), and only then is it renamed over PATH, so a reader - or
// a crash midway - sees the old file or the whole new one, never a part.
#pragma once
#include <stddef.h>
#include <stdio.h>

// write(f, ctx) fills the temporary file (its stream errors are caught at the end). Returns 0, or
// -1 with err naming the file and the call that failed (the temporary file removed).
int atomic_file_write(const char *path, void (*write)(FILE *f, const void *ctx), const void *ctx, char *err,
                      size_t err_cap);
