#include "core/json_text.h"

#include <stdio.h>

// The length of the valid UTF-8 sequence at p (1-4), or 0 when it is not one (RFC 3629: no
// overlong forms, no surrogates, nothing past U+10FFFF).
static int utf8_length(const unsigned char *p) {
  unsigned char c = p[0];
  if (c < 0x80) return 1;
  int n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (!n) return 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c == 0xE0) lo = 0xA0;
  if (c == 0xED) hi = 0x9F;
  if (c == 0xF0) lo = 0x90;
  if (c == 0xF4) hi = 0x8F;
  if (p[1] < lo || p[1] > hi) return 0;
  for (int i = 2; i < n; i++)
    if (p[i] < 0x80 || p[i] > 0xBF) return 0;
  return n;
}

void json_quote(const char *s, void (*put)(void *ctx, const char *bytes, size_t n), void *ctx) {
  put(ctx, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    char esc[8];
    int n = utf8_length(p);
    if (*p == '"' || *p == '\\') {
      esc[0] = '\\', esc[1] = (char)*p;
      put(ctx, esc, 2);
    } else if (*p < 0x20 || n == 0) {  // a control character, or a byte of no valid sequence
      snprintf(esc, sizeof esc, "\\u%04x", *p);
      put(ctx, esc, 6);
      n = 1;
    } else {
      put(ctx, (const char *)p, (size_t)n);
    }
    p += n ? n : 1;
  }
  put(ctx, "\"", 1);
}
