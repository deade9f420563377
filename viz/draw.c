// Drawing primitives, the embedded font and the line-chart renderer (viz/draw.h).
#define _POSIX_C_SOURCE 200809L  // fsync, getpid
#include "viz/draw.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

// --- pixels and shapes ---------------------------------------------------------------------------

// Coordinates are widened to 64 bits before any arithmetic: callers may pass INT_MIN/INT_MAX.
static inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

// Blends c over the inclusive rectangle [x0, x1] x [y0, y1] (ordered), clipped to the image.
// alpha >= 1 copies c; otherwise out = alpha * c + (1 - alpha) * old, rounded to nearest.
static void fill(Image *img, int64_t x0, int64_t y0, int64_t x1, int64_t y1, Rgb c, float alpha) {
  if (!img->data || x1 < 0 || y1 < 0 || x0 >= img->w || y0 >= img->h || x0 > x1 || y0 > y1) return;
  x0 = clamp64(x0, 0, img->w - 1), x1 = clamp64(x1, 0, img->w - 1);
  y0 = clamp64(y0, 0, img->h - 1), y1 = clamp64(y1, 0, img->h - 1);
  const uint8_t col[3] = {c.r, c.g, c.b};
  for (int64_t y = y0; y <= y1; y++) {
    uint8_t *p = img->data + ((size_t)y * (size_t)img->w + (size_t)x0) * 3;
    for (int64_t x = x0; x <= x1; x++, p += 3)
      for (int k = 0; k < 3; k++)
        p[k] = alpha >= 1.0f ? col[k] : (uint8_t)lrintf(alpha * (float)col[k] + (1.0f - alpha) * (float)p[k]);
  }
}

// Cohen-Sutherland: clips the segment to [xmin, xmax] x [ymin, ymax]; false when nothing is left.
// Done in doubles so that far-away endpoints neither overflow nor make the stepping loop long.
static bool clip_segment(double *x0, double *y0, double *x1, double *y1, double xmin, double ymin, double xmax,
                         double ymax) {
  enum { LEFT = 1, RIGHT = 2, BELOW = 4, ABOVE = 8 };
#define OUTCODE(x, y) (((x) < xmin ? LEFT : (x) > xmax ? RIGHT : 0) | ((y) < ymin ? BELOW : (y) > ymax ? ABOVE : 0))
  int c0 = OUTCODE(*x0, *y0), c1 = OUTCODE(*x1, *y1);
  for (int iter = 0; iter < 8; iter++) {  // each pass removes one side; 4 suffice
    if (!(c0 | c1)) return true;
    if (c0 & c1) return false;
    int c = c0 ? c0 : c1;
    double x, y;
    if (c & ABOVE) x = *x0 + (*x1 - *x0) * (ymax - *y0) / (*y1 - *y0), y = ymax;
    else if (c & BELOW) x = *x0 + (*x1 - *x0) * (ymin - *y0) / (*y1 - *y0), y = ymin;
    else if (c & RIGHT) y = *y0 + (*y1 - *y0) * (xmax - *x0) / (*x1 - *x0), x = xmax;
    else y = *y0 + (*y1 - *y0) * (xmin - *x0) / (*x1 - *x0), x = xmin;
    if (c == c0) *x0 = x, *y0 = y, c0 = OUTCODE(x, y);
    else *x1 = x, *y1 = y, c1 = OUTCODE(x, y);
  }
#undef OUTCODE
  return !(c0 | c1);
}

void draw_line(Image *img, int x0, int y0, int x1, int y1, Rgb c, int thickness) {
  if (!img->data) return;
  // A brush wider than twice the image covers it from anywhere it touches: capping it keeps the
  // clip box, and so the stepping loop, bounded.
  int64_t cap = 2 * ((int64_t)img->w + img->h), t = thickness < 1 ? 1 : thickness > cap ? cap : thickness;
  // The brush covers [x - (t-1)/2, x + t/2]: clip to the image grown by the brush.
  double fx0 = x0, fy0 = y0, fx1 = x1, fy1 = y1, m = t;
  if (!clip_segment(&fx0, &fy0, &fx1, &fy1, -m, -m, img->w - 1 + m, img->h - 1 + m)) return;
  int64_t ax = llround(fx0), ay = llround(fy0), bx = llround(fx1), by = llround(fy1);
  int64_t dx = llabs(bx - ax), dy = -llabs(by - ay), sx = ax < bx ? 1 : -1, sy = ay < by ? 1 : -1, e = dx + dy;
  for (;;) {  // Bresenham
    fill(img, ax - (t - 1) / 2, ay - (t - 1) / 2, ax + t / 2, ay + t / 2, c, 1.0f);
    if (ax == bx && ay == by) break;
    int64_t e2 = 2 * e;
    if (e2 >= dy) e += dy, ax += sx;
    if (e2 <= dx) e += dx, ay += sy;
  }
}

void draw_rect(Image *img, int x0, int y0, int x1, int y1, Rgb c, int thickness) {
  int64_t l = x0 < x1 ? x0 : x1, r = x0 < x1 ? x1 : x0, top = y0 < y1 ? y0 : y1, bot = y0 < y1 ? y1 : y0;
  int64_t t = thickness < 1 ? 1 : thickness;
  fill(img, l, top, r, top + t - 1, c, 1.0f);
  fill(img, l, bot - t + 1, r, bot, c, 1.0f);
  fill(img, l, top, l + t - 1, bot, c, 1.0f);
  fill(img, r - t + 1, top, r, bot, c, 1.0f);
}

void draw_fill_rect(Image *img, int x0, int y0, int x1, int y1, Rgb c, float alpha) {
  if (!(alpha > 0.0f)) return;  // also NaN
  int64_t l = x0 < x1 ? x0 : x1, r = x0 < x1 ? x1 : x0, top = y0 < y1 ? y0 : y1, bot = y0 < y1 ? y1 : y0;
  fill(img, l, top, r, bot, c, alpha > 1.0f ? 1.0f : alpha);
}

// --- text ------------------------------------------------------------------------------------------

// 5x8 glyphs of ASCII 32..126, drawn for this project: one byte per row, top row first, bit 7 =
// leftmost column (5 columns used). Capitals and digits use rows 0-6; row 7 is for descenders.
static const uint8_t FONT[95][8] = {
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},  // ' '
    {0x20, 0x20, 0x20, 0x20, 0x20, 0x00, 0x20, 0x00},  // '!'
    {0x50, 0x50, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},  // '"'
    {0x50, 0x50, 0xf8, 0x50, 0xf8, 0x50, 0x50, 0x00},  // '#'
    {0x20, 0x78, 0xa0, 0x70, 0x28, 0xf0, 0x20, 0x00},  // '$'
    {0xc0, 0xc8, 0x10, 0x20, 0x40, 0x98, 0x18, 0x00},  // '%'
    {0x60, 0x90, 0xa0, 0x40, 0xa8, 0x90, 0x68, 0x00},  // '&'
    {0x20, 0x20, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00},  // quote
    {0x10, 0x20, 0x40, 0x40, 0x40, 0x20, 0x10, 0x00},  // '('
    {0x40, 0x20, 0x10, 0x10, 0x10, 0x20, 0x40, 0x00},  // ')'
    {0x00, 0x20, 0xa8, 0x70, 0xa8, 0x20, 0x00, 0x00},  // '*'
    {0x00, 0x20, 0x20, 0xf8, 0x20, 0x20, 0x00, 0x00},  // '+'
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x60, 0x20, 0x40},  // ','
    {0x00, 0x00, 0x00, 0xf8, 0x00, 0x00, 0x00, 0x00},  // '-'
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x60, 0x60, 0x00},  // '.'
    {0x00, 0x08, 0x10, 0x20, 0x40, 0x80, 0x00, 0x00},  // '/'
    {0x70, 0x88, 0x98, 0xa8, 0xc8, 0x88, 0x70, 0x00},  // '0'
    {0x20, 0x60, 0x20, 0x20, 0x20, 0x20, 0x70, 0x00},  // '1'
    {0x70, 0x88, 0x08, 0x10, 0x20, 0x40, 0xf8, 0x00},  // '2'
    {0xf8, 0x10, 0x20, 0x10, 0x08, 0x88, 0x70, 0x00},  // '3'
    {0x10, 0x30, 0x50, 0x90, 0xf8, 0x10, 0x10, 0x00},  // '4'
    {0xf8, 0x80, 0xf0, 0x08, 0x08, 0x88, 0x70, 0x00},  // '5'
    {0x30, 0x40, 0x80, 0xf0, 0x88, 0x88, 0x70, 0x00},  // '6'
    {0xf8, 0x08, 0x10, 0x20, 0x40, 0x40, 0x40, 0x00},  // '7'
    {0x70, 0x88, 0x88, 0x70, 0x88, 0x88, 0x70, 0x00},  // '8'
    {0x70, 0x88, 0x88, 0x78, 0x08, 0x10, 0x60, 0x00},  // '9'
    {0x00, 0x60, 0x60, 0x00, 0x60, 0x60, 0x00, 0x00},  // ':'
    {0x00, 0x60, 0x60, 0x00, 0x60, 0x20, 0x40, 0x00},  // ';'
    {0x10, 0x20, 0x40, 0x80, 0x40, 0x20, 0x10, 0x00},  // '<'
    {0x00, 0x00, 0xf8, 0x00, 0xf8, 0x00, 0x00, 0x00},  // '='
    {0x40, 0x20, 0x10, 0x08, 0x10, 0x20, 0x40, 0x00},  // '>'
    {0x70, 0x88, 0x08, 0x10, 0x20, 0x00, 0x20, 0x00},  // '?'
    {0x70, 0x88, 0x08, 0x68, 0xa8, 0xa8, 0x70, 0x00},  // '@'
    {0x70, 0x88, 0x88, 0xf8, 0x88, 0x88, 0x88, 0x00},  // 'A'
    {0xf0, 0x88, 0x88, 0xf0, 0x88, 0x88, 0xf0, 0x00},  // 'B'
    {0x70, 0x88, 0x80, 0x80, 0x80, 0x88, 0x70, 0x00},  // 'C'
    {0xe0, 0x90, 0x88, 0x88, 0x88, 0x90, 0xe0, 0x00},  // 'D'
    {0xf8, 0x80, 0x80, 0xf0, 0x80, 0x80, 0xf8, 0x00},  // 'E'
    {0xf8, 0x80, 0x80, 0xf0, 0x80, 0x80, 0x80, 0x00},  // 'F'
    {0x70, 0x88, 0x80, 0xb8, 0x88, 0x88, 0x78, 0x00},  // 'G'
    {0x88, 0x88, 0x88, 0xf8, 0x88, 0x88, 0x88, 0x00},  // 'H'
    {0x70, 0x20, 0x20, 0x20, 0x20, 0x20, 0x70, 0x00},  // 'I'
    {0x38, 0x10, 0x10, 0x10, 0x10, 0x90, 0x60, 0x00},  // 'J'
    {0x88, 0x90, 0xa0, 0xc0, 0xa0, 0x90, 0x88, 0x00},  // 'K'
    {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0xf8, 0x00},  // 'L'
    {0x88, 0xd8, 0xa8, 0xa8, 0x88, 0x88, 0x88, 0x00},  // 'M'
    {0x88, 0x88, 0xc8, 0xa8, 0x98, 0x88, 0x88, 0x00},  // 'N'
    {0x70, 0x88, 0x88, 0x88, 0x88, 0x88, 0x70, 0x00},  // 'O'
    {0xf0, 0x88, 0x88, 0xf0, 0x80, 0x80, 0x80, 0x00},  // 'P'
    {0x70, 0x88, 0x88, 0x88, 0xa8, 0x90, 0x68, 0x00},  // 'Q'
    {0xf0, 0x88, 0x88, 0xf0, 0xa0, 0x90, 0x88, 0x00},  // 'R'
    {0x78, 0x80, 0x80, 0x70, 0x08, 0x08, 0xf0, 0x00},  // 'S'
    {0xf8, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x00},  // 'T'
    {0x88, 0x88, 0x88, 0x88, 0x88, 0x88, 0x70, 0x00},  // 'U'
    {0x88, 0x88, 0x88, 0x88, 0x88, 0x50, 0x20, 0x00},  // 'V'
    {0x88, 0x88, 0x88, 0xa8, 0xa8, 0xa8, 0x50, 0x00},  // 'W'
    {0x88, 0x88, 0x50, 0x20, 0x50, 0x88, 0x88, 0x00},  // 'X'
    {0x88, 0x88, 0x88, 0x50, 0x20, 0x20, 0x20, 0x00},  // 'Y'
    {0xf8, 0x08, 0x10, 0x20, 0x40, 0x80, 0xf8, 0x00},  // 'Z'
    {0x70, 0x40, 0x40, 0x40, 0x40, 0x40, 0x70, 0x00},  // '['
    {0x00, 0x80, 0x40, 0x20, 0x10, 0x08, 0x00, 0x00},  // backslash
    {0x70, 0x10, 0x10, 0x10, 0x10, 0x10, 0x70, 0x00},  // ']'
    {0x20, 0x50, 0x88, 0x00, 0x00, 0x00, 0x00, 0x00},  // '^'
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf8},  // '_'
    {0x40, 0x20, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00},  // '`'
    {0x00, 0x00, 0x70, 0x08, 0x78, 0x88, 0x78, 0x00},  // 'a'
    {0x80, 0x80, 0xb0, 0xc8, 0x88, 0x88, 0xf0, 0x00},  // 'b'
    {0x00, 0x00, 0x70, 0x80, 0x80, 0x88, 0x70, 0x00},  // 'c'
    {0x08, 0x08, 0x68, 0x98, 0x88, 0x88, 0x78, 0x00},  // 'd'
    {0x00, 0x00, 0x70, 0x88, 0xf8, 0x80, 0x70, 0x00},  // 'e'
    {0x30, 0x48, 0x40, 0xe0, 0x40, 0x40, 0x40, 0x00},  // 'f'
    {0x00, 0x00, 0x78, 0x88, 0x88, 0x78, 0x08, 0x70},  // 'g'
    {0x80, 0x80, 0xb0, 0xc8, 0x88, 0x88, 0x88, 0x00},  // 'h'
    {0x20, 0x00, 0x60, 0x20, 0x20, 0x20, 0x70, 0x00},  // 'i'
    {0x10, 0x00, 0x30, 0x10, 0x10, 0x10, 0x90, 0x60},  // 'j'
    {0x80, 0x80, 0x90, 0xa0, 0xc0, 0xa0, 0x90, 0x00},  // 'k'
    {0x60, 0x20, 0x20, 0x20, 0x20, 0x20, 0x70, 0x00},  // 'l'
    {0x00, 0x00, 0xd0, 0xa8, 0xa8, 0x88, 0x88, 0x00},  // 'm'
    {0x00, 0x00, 0xb0, 0xc8, 0x88, 0x88, 0x88, 0x00},  // 'n'
    {0x00, 0x00, 0x70, 0x88, 0x88, 0x88, 0x70, 0x00},  // 'o'
    {0x00, 0x00, 0xf0, 0x88, 0x88, 0xf0, 0x80, 0x80},  // 'p'
    {0x00, 0x00, 0x78, 0x88, 0x88, 0x78, 0x08, 0x08},  // 'q'
    {0x00, 0x00, 0xb0, 0xc8, 0x80, 0x80, 0x80, 0x00},  // 'r'
    {0x00, 0x00, 0x78, 0x80, 0x70, 0x08, 0xf0, 0x00},  // 's'
    {0x40, 0x40, 0xe0, 0x40, 0x40, 0x48, 0x30, 0x00},  // 't'
    {0x00, 0x00, 0x88, 0x88, 0x88, 0x98, 0x68, 0x00},  // 'u'
    {0x00, 0x00, 0x88, 0x88, 0x88, 0x50, 0x20, 0x00},  // 'v'
    {0x00, 0x00, 0x88, 0x88, 0xa8, 0xa8, 0x50, 0x00},  // 'w'
    {0x00, 0x00, 0x88, 0x50, 0x20, 0x50, 0x88, 0x00},  // 'x'
    {0x00, 0x00, 0x88, 0x88, 0x88, 0x78, 0x08, 0x70},  // 'y'
    {0x00, 0x00, 0xf8, 0x10, 0x20, 0x40, 0xf8, 0x00},  // 'z'
    {0x10, 0x20, 0x20, 0x40, 0x20, 0x20, 0x10, 0x00},  // '{'
    {0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x20, 0x00},  // '|'
    {0x40, 0x20, 0x20, 0x10, 0x20, 0x20, 0x40, 0x00},  // '}'
    {0x00, 0x00, 0x40, 0xa8, 0x10, 0x00, 0x00, 0x00},  // '~'
};

static const uint8_t *glyph(unsigned char ch) { return FONT[(ch >= 32 && ch <= 126 ? ch : '?') - 32]; }

// One glyph with its top-left at (x, y) (up = false), or rotated counter-clockwise with the
// glyph's top-left at (x, y) becoming the bottom-left of the rotated glyph (up = true).
static void draw_glyph(Image *img, int64_t x, int64_t y, unsigned char ch, Rgb c, int64_t s, bool up) {
  if (!up && (x >= img->w || y >= img->h || x + DRAW_GLYPH_W * s < 0 || y + DRAW_GLYPH_H * s < 0)) return;
  if (up && (x >= img->w || y < 0 || x + DRAW_GLYPH_H * s < 0 || y - DRAW_GLYPH_W * s >= img->h)) return;
  const uint8_t *rows = glyph(ch);
  for (int v = 0; v < DRAW_GLYPH_H; v++)
    for (int u = 0; u < DRAW_GLYPH_W; u++) {
      if (!(rows[v] & (0x80 >> u))) continue;
      if (up) fill(img, x + v * s, y - (u + 1) * s + 1, x + (v + 1) * s - 1, y - u * s, c, 1.0f);
      else fill(img, x + u * s, y + v * s, x + (u + 1) * s - 1, y + (v + 1) * s - 1, c, 1.0f);
    }
}

static void text_at(Image *img, int64_t x, int64_t y, const char *s, Rgb c, int scale, bool up) {
  if (!img->data || !s) return;
  int64_t sc = scale < 1 ? 1 : scale, along = 0, across = 0;  // along the line, and line offset
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '\n') {
      along = 0, across += DRAW_CELL_H * sc;
      continue;
    }
    if (up) draw_glyph(img, x + across, y - along, *p, c, sc, true);
    else draw_glyph(img, x + along, y + across, *p, c, sc, false);
    along += DRAW_CELL_W * sc;
  }
}

void draw_text(Image *img, int x, int y, const char *s, Rgb c, int scale) { text_at(img, x, y, s, c, scale, false); }
void draw_text_up(Image *img, int x, int y, const char *s, Rgb c, int scale) { text_at(img, x, y, s, c, scale, true); }

static int saturate(int64_t v) { return v > INT_MAX ? INT_MAX : (int)v; }

int draw_text_width(const char *s, int scale) {
  int64_t sc = scale < 1 ? 1 : scale, widest = 0, n = 0;
  for (const char *p = s; p && *p; p++) {
    n = *p == '\n' ? 0 : n + 1;
    if (n > widest) widest = n;
  }
  return widest ? saturate((widest * DRAW_CELL_W - (DRAW_CELL_W - DRAW_GLYPH_W)) * sc) : 0;  // no gap after the last
}

int draw_text_height(const char *s, int scale) {
  int64_t sc = scale < 1 ? 1 : scale, lines = s && *s ? 1 : 0;
  for (const char *p = s; p && *p; p++) lines += *p == '\n';
  return lines ? saturate((lines * DRAW_CELL_H - (DRAW_CELL_H - DRAW_GLYPH_H)) * sc) : 0;
}

int draw_label(Image *img, int x, int y, const char *s, Rgb bg, int scale, int pad) {
  int64_t w = draw_text_width(s, scale), h = draw_text_height(s, scale), p = pad < 0 ? 0 : pad;
  fill(img, x, y, x + w + 2 * p - 1, y + h + 2 * p - 1, bg, 1.0f);
  // Rec. 601 luma: dark text on light boxes.
  bool light = 299 * bg.r + 587 * bg.g + 114 * bg.b > 150 * 1000;
  text_at(img, (int64_t)x + p, (int64_t)y + p, s, light ? (Rgb){0, 0, 0} : (Rgb){255, 255, 255}, scale, false);
  return saturate(h + 2 * p);
}

Rgb draw_class_colour(int class_id) {
  static const Rgb PALETTE[16] = {{230, 25, 75},  {60, 180, 75},  {0, 130, 200},   {245, 130, 48},
                                  {145, 30, 180}, {70, 240, 240}, {240, 50, 230},  {210, 245, 60},
                                  {0, 128, 128},  {170, 110, 40}, {255, 225, 25},  {128, 0, 0},
                                  {0, 0, 128},    {128, 128, 0},  {250, 150, 190}, {100, 100, 255}};
  unsigned u = (unsigned)class_id;  // negative ids wrap to valid entries too
  return PALETTE[u % 16u];
}

// --- pictures of detections --------------------------------------------------------------------

void draw_display_size(int w, int h, int *dw, int *dh) {
  int64_t lng = w > h ? w : h;
  if (lng <= 0 || lng >= DRAW_MIN_LONG_SIDE) {
    *dw = w, *dh = h;
    return;
  }
  *dw = saturate(((int64_t)w * DRAW_MIN_LONG_SIDE + lng / 2) / lng);  // rounded; the long side exactly
  *dh = saturate(((int64_t)h * DRAW_MIN_LONG_SIDE + lng / 2) / lng);
  if (*dw < 1) *dw = 1;
  if (*dh < 1) *dh = 1;
}

int draw_text_scale(int w, int h) { return 2 + (w > h ? w : h) / 1000; }

void draw_blit(Image *dst, const Image *src, int x, int y) {
  for (int64_t v = 0; v < src->h; v++) {
    int64_t ty = (int64_t)y + v, x0 = clamp64(x, 0, dst->w), x1 = clamp64((int64_t)x + src->w, 0, dst->w);
    if (ty < 0 || ty >= dst->h || x0 >= x1) continue;
    memcpy(dst->data + ((size_t)ty * (size_t)dst->w + (size_t)x0) * 3,
           src->data + ((size_t)v * (size_t)src->w + (size_t)(x0 - x)) * 3, (size_t)(x1 - x0) * 3);
  }
}

static void blend(uint8_t *p, Rgb c, float alpha) {
  const float col[3] = {c.r, c.g, c.b};
  for (int k = 0; k < 3; k++) p[k] = (uint8_t)lrintf(alpha * col[k] + (1.0f - alpha) * (float)p[k]);
}

Rgb draw_heat_colour(float t) {
  static const float STOPS[5][3] = {{68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
  t = isfinite(t) ? (t < 0 ? 0 : t > 1 ? 1 : t) : 0;
  int i = t >= 1 ? 3 : (int)(t * 4);
  float f = t * 4 - (float)i, c[3];
  for (int k = 0; k < 3; k++) c[k] = STOPS[i][k] + f * (STOPS[i + 1][k] - STOPS[i][k]);
  return (Rgb){(uint8_t)lrintf(c[0]), (uint8_t)lrintf(c[1]), (uint8_t)lrintf(c[2])};
}

Rgb draw_cluster_colour(int i) {
  // Hues a golden-ratio turn apart (neighbouring clusters far apart on the wheel), brightness
  // alternating, saturation high.
  double hue = fmod((unsigned)i * 0.6180339887498949, 1.0) * 6.0, v = (i & 1) ? 0.7 : 1.0, s = 0.85;
  int sector = (int)hue;
  double f = hue - sector, p = v * (1 - s), q = v * (1 - s * f), t = v * (1 - s * (1 - f)), rgb[3];
  switch (sector) {
    case 0: rgb[0] = v, rgb[1] = t, rgb[2] = p; break;
    case 1: rgb[0] = q, rgb[1] = v, rgb[2] = p; break;
    case 2: rgb[0] = p, rgb[1] = v, rgb[2] = t; break;
    case 3: rgb[0] = p, rgb[1] = q, rgb[2] = v; break;
    case 4: rgb[0] = t, rgb[1] = p, rgb[2] = v; break;
    default: rgb[0] = v, rgb[1] = p, rgb[2] = q; break;
  }
  return (Rgb){(uint8_t)lrint(255 * rgb[0]), (uint8_t)lrint(255 * rgb[1]), (uint8_t)lrint(255 * rgb[2])};
}

void draw_heat_map(Image *img, const float *map, int mh, int mw, float alpha) {
  float top = 0;
  for (int64_t i = 0; i < (int64_t)mh * mw; i++) top = isfinite(map[i]) && map[i] > top ? map[i] : top;
  if (!img->data || mh < 1 || mw < 1 || !(top > 0)) return;
  for (int64_t y = 0; y < img->h; y++) {
    // Cell centres at (i + 0.5) * img / map: sample the map there, bilinearly, clamped at the edges.
    float fy = ((float)y + 0.5f) * (float)mh / (float)img->h - 0.5f;
    fy = fy < 0 ? 0 : fy > (float)(mh - 1) ? (float)(mh - 1) : fy;
    int y0 = (int)fy, y1 = y0 + 1 < mh ? y0 + 1 : y0;
    float wy = fy - (float)y0;
    for (int64_t x = 0; x < img->w; x++) {
      float fx = ((float)x + 0.5f) * (float)mw / (float)img->w - 0.5f;
      fx = fx < 0 ? 0 : fx > (float)(mw - 1) ? (float)(mw - 1) : fx;
      int x0 = (int)fx, x1 = x0 + 1 < mw ? x0 + 1 : x0;
      float wx = fx - (float)x0;
      float v = (1 - wy) * ((1 - wx) * map[y0 * mw + x0] + wx * map[y0 * mw + x1]) +
                wy * ((1 - wx) * map[y1 * mw + x0] + wx * map[y1 * mw + x1]);
      blend(img->data + ((size_t)y * (size_t)img->w + (size_t)x) * 3, draw_heat_colour(v / top), alpha);
    }
  }
}

void draw_label_map(Image *img, const int *labels, int mh, int mw, float alpha) {
  if (!img->data || mh < 1 || mw < 1) return;
  for (int64_t y = 0; y < img->h; y++)
    for (int64_t x = 0; x < img->w; x++) {
      int k = labels[(y * mh / img->h) * mw + x * mw / img->w];  // nearest: each cell a block
      if (k >= 0) blend(img->data + ((size_t)y * (size_t)img->w + (size_t)x) * 3, draw_cluster_colour(k), alpha);
    }
}

static bool overlaps(DrawRect a, DrawRect b) { return a.x0 <= b.x1 && b.x0 <= a.x1 && a.y0 <= b.y1 && b.y0 <= a.y1; }

// The w x h rectangle at (x, y), moved inside the image (as far as it fits).
static DrawRect rect_inside(int64_t x, int64_t y, int w, int h, int img_w, int img_h) {
  x = clamp64(x, 0, (int64_t)img_w - w > 0 ? (int64_t)img_w - w : 0);
  y = clamp64(y, 0, (int64_t)img_h - h > 0 ? (int64_t)img_h - h : 0);
  return (DrawRect){(int)x, (int)y, saturate(x + w - 1), saturate(y + h - 1)};
}

static bool is_free(DrawRect r, const DrawRect *taken, int n) {
  for (int i = 0; i < n; i++)
    if (overlaps(r, taken[i])) return false;
  return true;
}

DrawRect draw_place_label(int img_w, int img_h, DrawRect box, int w, int h, const DrawRect *taken, int n_taken) {
  // Above the box, below it, inside its top, inside its bottom: the first free place.
  const int64_t ys[4] = {(int64_t)box.y0 - h, (int64_t)box.y1 + 1, box.y0, (int64_t)box.y1 - h + 1};
  for (int i = 0; i < 4; i++) {
    DrawRect r = rect_inside(box.x0, ys[i], w, h, img_w, img_h);
    if (is_free(r, taken, n_taken)) return r;
  }
  // Else the nearest free row to the first place, at the box's left.
  for (int64_t d = 1; d <= img_h; d++)
    for (int s = -1; s <= 1; s += 2) {
      DrawRect r = rect_inside(box.x0, ys[0] + s * d, w, h, img_w, img_h);
      if (is_free(r, taken, n_taken)) return r;
    }
  return rect_inside(box.x0, ys[0], w, h, img_w, img_h);  // no room left: over another label
}

// --- files -----------------------------------------------------------------------------------------

static int save_atomic(const char *path, const Image *img, char *err, size_t err_cap) {
  if (!img->data || img->w <= 0 || img->h <= 0) {
    snprintf(err, err_cap, "%s: nothing to write (empty image)", path);
    return -1;
  }
  char tmp[4096];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= sizeof tmp) {
    snprintf(err, err_cap, "%s: path too long", path);
    return -1;
  }
  DataError derr;
  if (image_write_png(tmp, img->data, img->w, img->h, 3, &derr)) {
    snprintf(err, err_cap, "%s", derr.msg);
    remove(tmp);
    return -1;
  }
  int fd = open(tmp, O_RDONLY);  // the bytes reach the disk before the name points at them
  if (fd < 0 || fsync(fd) != 0) {
    snprintf(err, err_cap, "%s: fsync failed: %s", tmp, strerror(errno));
    if (fd >= 0) close(fd);
    remove(tmp);
    return -1;
  }
  close(fd);
  if (rename(tmp, path) != 0) {
    snprintf(err, err_cap, "%s: rename to %s failed: %s", tmp, path, strerror(errno));
    remove(tmp);
    return -1;
  }
  return 0;
}

int image_save_png(const char *path, const Image *img, char *err, size_t err_cap) {
  return save_atomic(path, img, err, err_cap);
}

// --- charts ----------------------------------------------------------------------------------------

static const Rgb BLACK = {0, 0, 0}, WHITE = {255, 255, 255}, GRID = {228, 228, 228}, FRAME = {90, 90, 90},
                 TEXT = {40, 40, 40};

// Heckbert's "nice numbers": 1, 2, 2.5, 5 or 10 times a power of ten, near x (rounded or above).
static double nice_number(double x, bool round_it) {
  double e = floor(log10(x)), p = pow(10.0, e), f = x / p, nf;
  if (round_it) nf = f < 1.5 ? 1 : f < 2.25 ? 2 : f < 3.5 ? 2.5 : f < 7.5 ? 5 : 10;
  else nf = f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10;
  return nf * p;
}

double chart_nice_ticks(double lo, double hi, int target, double *first, double *last) {
  if (target < 2) target = 2;
  double range = hi - lo;
  if (!(range > 0) || !isfinite(range)) range = fabs(lo) > 0 ? fabs(lo) : 1.0;
  double step = nice_number(nice_number(range, false) / (target - 1), true);
  if (!(step > 0) || !isfinite(step)) step = 1.0;
  *first = floor(lo / step) * step;
  *last = ceil(hi / step) * step;
  if (*last <= *first) *last = *first + step;
  return step;
}

// Decimals that show every multiple of step exactly (2.5 x 10^k needs one more); NULL-safe format
// of a tick value into buf, exponent form for very large or small magnitudes.
static void tick_label(double v, double step, char *buf, size_t cap) {
  if (fabs(v) < step * 1e-9) v = 0.0;  // no "-0.0" from accumulated rounding
  double e = floor(log10(step)), f = step / pow(10.0, e);
  int decimals = (int)(-e) + (fabs(f - 2.5) < 1e-9 ? 1 : 0);
  if (decimals < 0) decimals = 0;
  if (fabs(v) >= 1e7 || decimals > 6) snprintf(buf, cap, "%.3g", v);
  else snprintf(buf, cap, "%.*f", decimals, v);
}

typedef struct {
  double lo, hi;       // the axis span
  double first, step;  // ticks at first + i * step, i < n_ticks, all inside the span
  int n_ticks;
} Axis;

// Axis over the data [lo, hi] (finite, lo <= hi), widened by `pad` of the span each side (keeps a
// curve off the frame) but not below 0 when the data are all >= 0 (losses, AP). The span is the
// data's, not rounded out to ticks; the ticks are the nice multiples inside it.
static Axis make_axis(double lo, double hi, double pad, int target) {
  // Values beyond +-1e300 could overflow hi - lo; plots of such numbers mean nothing anyway.
  lo = lo < -1e300 ? -1e300 : lo, hi = hi > 1e300 ? 1e300 : hi;
  bool nonnegative = lo >= 0;
  if (hi - lo <= 1e-12 * fmax(fabs(lo), fabs(hi))) {  // one value: a span around it
    double d = fabs(lo) > 0 ? 0.1 * fabs(lo) : 1.0;
    lo -= d, hi += d;
  } else {
    double d = pad * (hi - lo);
    lo -= d, hi += d;
  }
  if (nonnegative && lo < 0) lo = 0;
  Axis a = {.lo = lo, .hi = hi};
  double first, last;
  a.step = chart_nice_ticks(lo, hi, target, &first, &last);
  a.first = ceil(lo / a.step - 1e-9) * a.step;
  double n = floor((hi - a.first) / a.step + 1e-9) + 1;
  a.n_ticks = n < 0 ? 0 : n > 50 ? 50 : (int)n;
  return a;
}

static int64_t to_px(double v, const Axis *a, int64_t p0, int64_t len, bool flip) {
  double t = (v - a->lo) / (a->hi - a->lo);
  if (!isfinite(t)) t = 0;
  t = t < -4 ? -4 : t > 5 ? 5 : t;  // data lies within the axis; this only keeps llround defined
  double px = flip ? (double)(p0 + len - 1) - t * (double)(len - 1) : (double)p0 + t * (double)(len - 1);
  return llround(px);
}

static bool point_ok(const ChartSeries *s, int i) { return isfinite(s->x[i]) && isfinite(s->y[i]); }

// A panel's plot rectangle and its axes.
typedef struct {
  int x0, y0, w, h;  // the plot's top-left pixel and size
  Axis ax, ay;
  int64_t points;  // finite points over every series
} Plot;

static int64_t plot_x(const Plot *pl, double x) { return to_px(x, &pl->ax, pl->x0, pl->w, false); }
static int64_t plot_y(const Plot *pl, double y) { return to_px(y, &pl->ay, pl->y0, pl->h, true); }

// Axes over every finite point of every series, and the plot rectangle inside the panel at
// (ox, oy, pw, ph): [y title][y tick labels] plot [margin], the title above, x labels below.
// False when the panel is too small to draw anything useful.
static bool layout_plot(const ChartPanel *p, int ox, int oy, int pw, int ph, Plot *pl) {
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  pl->points = 0;
  for (int k = 0; k < p->n_series; k++) {
    const ChartSeries *s = &p->series[k];
    for (int i = 0; i < s->n; i++) {
      if (!point_ok(s, i)) continue;
      xmin = fmin(xmin, s->x[i]), xmax = fmax(xmax, s->x[i]);
      ymin = fmin(ymin, s->y[i]), ymax = fmax(ymax, s->y[i]);
      pl->points++;
    }
  }
  if (!pl->points) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  pl->ax = make_axis(xmin, xmax, 0.02, 6), pl->ay = make_axis(ymin, ymax, 0.04, 6);
  char label[64];
  int tick_w = 0;
  for (int i = 0; i < pl->ay.n_ticks; i++) {
    tick_label(pl->ay.first + i * pl->ay.step, pl->ay.step, label, sizeof label);
    int w = draw_text_width(label, 1);
    tick_w = w > tick_w ? w : tick_w;
  }
  int title_h = p->title && *p->title ? 2 * DRAW_CELL_H + 6 : 10;
  int left = 10 + (p->y_label && *p->y_label ? DRAW_CELL_H + 8 : 0) + tick_w + 8;
  int bottom = DRAW_GLYPH_H + 10 + (p->x_label && *p->x_label ? DRAW_CELL_H + 8 : 0) + 6;
  pl->x0 = ox + left, pl->y0 = oy + title_h, pl->w = pw - left - 18, pl->h = ph - title_h - bottom;
  return pl->w >= 16 && pl->h >= 16;
}

// Title, grid, ticks and their labels, the frame, the axis titles ("no data" without points).
static void draw_axes(Image *img, const ChartPanel *p, const Plot *pl, int ox, int oy) {
  char label[64];
  if (p->title && *p->title)
    draw_text(img, pl->x0 + (pl->w - draw_text_width(p->title, 2)) / 2, oy + 4, p->title, TEXT, 2);
  for (int i = 0; i < pl->ay.n_ticks; i++) {
    double v = pl->ay.first + i * pl->ay.step;
    int y = (int)plot_y(pl, v);
    draw_line(img, pl->x0, y, pl->x0 + pl->w - 1, y, GRID, 1);
    draw_line(img, pl->x0 - 4, y, pl->x0 - 1, y, FRAME, 1);
    tick_label(v, pl->ay.step, label, sizeof label);
    draw_text(img, pl->x0 - 7 - draw_text_width(label, 1), y - DRAW_GLYPH_H / 2 + 1, label, TEXT, 1);
  }
  for (int i = 0; i < pl->ax.n_ticks; i++) {
    double v = pl->ax.first + i * pl->ax.step;
    int x = (int)plot_x(pl, v);
    draw_line(img, x, pl->y0, x, pl->y0 + pl->h - 1, GRID, 1);
    draw_line(img, x, pl->y0 + pl->h, x, pl->y0 + pl->h + 3, FRAME, 1);
    tick_label(v, pl->ax.step, label, sizeof label);
    draw_text(img, x - draw_text_width(label, 1) / 2, pl->y0 + pl->h + 7, label, TEXT, 1);
  }
  draw_rect(img, pl->x0 - 1, pl->y0 - 1, pl->x0 + pl->w, pl->y0 + pl->h, FRAME, 1);
  if (p->x_label && *p->x_label)
    draw_text(img, pl->x0 + (pl->w - draw_text_width(p->x_label, 1)) / 2, pl->y0 + pl->h + DRAW_GLYPH_H + 16,
              p->x_label, TEXT, 1);
  if (p->y_label && *p->y_label)
    draw_text_up(img, ox + 10, pl->y0 + (pl->h + draw_text_width(p->y_label, 1)) / 2, p->y_label, TEXT, 1);
  if (!pl->points) {
    const char *msg = "no data";
    draw_text(img, pl->x0 + (pl->w - draw_text_width(msg, 2)) / 2, pl->y0 + (pl->h - draw_text_height(msg, 2)) / 2, msg,
              FRAME, 2);
  }
}

// Segments between consecutive finite points (a non-finite one leaves a gap); markers on isolated
// points, and on every point of a short series (one value per epoch).
static void draw_series(Image *img, const ChartPanel *p, const Plot *pl) {
  for (int k = 0; k < p->n_series; k++) {
    const ChartSeries *s = &p->series[k];
    int finite = 0;
    for (int i = 0; i < s->n; i++) finite += point_ok(s, i);
    for (int i = 0; i < s->n; i++) {
      if (!point_ok(s, i)) continue;
      int x = (int)plot_x(pl, s->x[i]), y = (int)plot_y(pl, s->y[i]);
      bool prev = i > 0 && point_ok(s, i - 1), next = i + 1 < s->n && point_ok(s, i + 1);
      if (next) draw_line(img, x, y, (int)plot_x(pl, s->x[i + 1]), (int)plot_y(pl, s->y[i + 1]), s->colour, 2);
      if ((!prev && !next) || finite <= 40) draw_fill_rect(img, x - 2, y - 2, x + 2, y + 2, s->colour, 1.0f);
    }
  }
}

// Of the plot's four corners (top-right, bottom-right, top-left, bottom-left), the one whose
// lw x lh box hides the fewest curve pixels (the first on ties); its top-left into (*lx, *ly).
static void legend_corner(const ChartPanel *p, const Plot *pl, int lw, int lh, int *lx, int *ly) {
  const int cx[4] = {pl->x0 + pl->w - lw - 8, pl->x0 + pl->w - lw - 8, pl->x0 + 8, pl->x0 + 8};
  const int cy[4] = {pl->y0 + 8, pl->y0 + pl->h - lh - 8, pl->y0 + 8, pl->y0 + pl->h - lh - 8};
  int64_t hidden[4] = {0, 0, 0, 0};
  for (int k = 0; k < p->n_series; k++) {
    const ChartSeries *s = &p->series[k];
    for (int i = 0; i < s->n; i++) {
      if (!point_ok(s, i)) continue;
      bool next = i + 1 < s->n && point_ok(s, i + 1);
      for (int t = 0; t < (next ? 8 : 1); t++) {  // samples along the segment to the next point
        double f = t / 8.0, x = s->x[i], y = s->y[i];
        if (next) x += f * (s->x[i + 1] - x), y += f * (s->y[i + 1] - y);
        int64_t X = plot_x(pl, x), Y = plot_y(pl, y);
        for (int c = 0; c < 4; c++) hidden[c] += X >= cx[c] && X < cx[c] + lw && Y >= cy[c] && Y < cy[c] + lh;
      }
    }
  }
  int best = 0;
  for (int c = 1; c < 4; c++) best = hidden[c] < hidden[best] ? c : best;
  *lx = cx[best], *ly = cy[best];
}

static void draw_legend(Image *img, const ChartPanel *p, const Plot *pl) {
  int entries = 0, name_w = 0;
  for (int k = 0; k < p->n_series; k++) {
    const char *name = p->series[k].name;
    if (!name || !*name) continue;
    entries++;
    int w = draw_text_width(name, 1);
    name_w = w > name_w ? w : name_w;
  }
  if (!entries) return;
  int lw = name_w + 34, lh = entries * (DRAW_CELL_H + 4) + 8, lx, ly;
  legend_corner(p, pl, lw, lh, &lx, &ly);
  draw_fill_rect(img, lx, ly, lx + lw - 1, ly + lh - 1, WHITE, 0.85f);
  draw_rect(img, lx, ly, lx + lw - 1, ly + lh - 1, GRID, 1);
  int row = 0;
  for (int k = 0; k < p->n_series; k++) {
    const ChartSeries *s = &p->series[k];
    if (!s->name || !*s->name) continue;
    int y = ly + 6 + row++ * (DRAW_CELL_H + 4);
    draw_line(img, lx + 6, y + DRAW_GLYPH_H / 2, lx + 22, y + DRAW_GLYPH_H / 2, s->colour, 2);
    draw_text(img, lx + 28, y, s->name, TEXT, 1);
  }
}

static void render_panel(Image *img, const ChartPanel *p, int ox, int oy, int pw, int ph) {
  Plot pl;
  if (!layout_plot(p, ox, oy, pw, ph, &pl)) return;
  draw_axes(img, p, &pl, ox, oy);
  draw_series(img, p, &pl);
  draw_legend(img, p, &pl);
}

static int chart_check(const ChartSpec *spec, char *err, size_t err_cap) {
  if (spec->n_panels < 1 || spec->n_panels > CHART_MAX_PANELS) {
    snprintf(err, err_cap, "chart: %d panels (1..%d)", spec->n_panels, CHART_MAX_PANELS);
    return -1;
  }
  if ((spec->panel_w && (spec->panel_w < 160 || spec->panel_w > 4096)) ||
      (spec->panel_h && (spec->panel_h < 120 || spec->panel_h > 4096))) {
    snprintf(err, err_cap, "chart: panel size %dx%d outside 160x120..4096x4096", spec->panel_w, spec->panel_h);
    return -1;
  }
  for (int p = 0; p < spec->n_panels; p++) {
    const ChartPanel *pa = &spec->panels[p];
    if (pa->n_series < 0 || pa->n_series > CHART_MAX_SERIES) {
      snprintf(err, err_cap, "chart: panel %d has %d series (0..%d)", p, pa->n_series, CHART_MAX_SERIES);
      return -1;
    }
    for (int k = 0; k < pa->n_series; k++) {
      const ChartSeries *s = &pa->series[k];
      if (s->n < 0 || (s->n > 0 && (!s->x || !s->y))) {
        snprintf(err, err_cap, "chart: panel %d series %d: %d points without data", p, k, s->n);
        return -1;
      }
    }
  }
  return 0;
}

void chart_render(const ChartSpec *spec, Image *out) {
  char err[256];
  DETR_CHECK(chart_check(spec, err, sizeof err) == 0, "%s", err);
  int pw = spec->panel_w ? spec->panel_w : 560, ph = spec->panel_h ? spec->panel_h : 420;
  int top = spec->title && *spec->title ? 2 * DRAW_CELL_H + 10 : 0;
  *out = image_alloc(pw * spec->n_panels, ph + top);
  memset(out->data, 255, (size_t)out->w * (size_t)out->h * 3);
  if (top) draw_text(out, (out->w - draw_text_width(spec->title, 2)) / 2, 8, spec->title, BLACK, 2);
  for (int p = 0; p < spec->n_panels; p++) render_panel(out, &spec->panels[p], p * pw, top, pw, ph);
}

int chart_write_png(const char *path, const ChartSpec *spec, char *err, size_t err_cap) {
  char why[256];
  if (chart_check(spec, why, sizeof why)) {
    snprintf(err, err_cap, "%s: %s", path, why);
    return -1;
  }
  Image img;
  chart_render(spec, &img);
  int rc = image_save_png(path, &img, err, err_cap);
  image_free(&img);
  return rc;
}
