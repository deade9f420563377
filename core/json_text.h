// JSON string literals, written once for every writer of JSON (safetensors headers, predict's
// predictions): quotes, backslashes and control characters escaped, valid UTF-8 passed through,
// and each byte of an invalid UTF-8 sequence (a file name from a Latin-1 file system, say) written
// as the code point of that byte (\u00XX), so the output is always valid JSON.
#pragma once
#include <stddef.h>

// Calls put(ctx, bytes, n) for the pieces of s as a JSON string literal, quotes included.
void json_quote(const char *s, void (*put)(void *ctx, const char *bytes, size_t n), void *ctx);
