// Drawing on 8-bit RGB images (datasets/image.h: [h, w, 3], stride 3 * w) for `detr predict`'s
// pictures and the training charts: lines, rectangles, alpha-filled rectangles, text in an
// embedded 5x8 bitmap font (printable ASCII 32..126, integer scale), labels on a filled box, a
// colour per class id; and line charts (up to 2 panels of up to 4 series) written as PNG.
//
// Every primitive clips to the image: coordinates may lie anywhere (negative, far outside), and
// nothing is ever written outside the pixel buffer.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "datasets/image.h"

typedef struct {
  uint8_t r, g, b;
} Rgb;

// The font's cell: glyphs are 5x8 (row 7 holds descenders) in a 6x10 cell at scale 1.
#define DRAW_GLYPH_W 5
#define DRAW_GLYPH_H 8
#define DRAW_CELL_W 6
#define DRAW_CELL_H 10

// A straight line from (x0, y0) to (x1, y1), both ends included, `thickness` pixels wide (a
// square brush centred on the line).
void draw_line(Image *img, int x0, int y0, int x1, int y1, Rgb c, int thickness);
// The outline of the rectangle with corners (x0, y0) and (x1, y1) (inclusive, in any order); the
// border grows inwards from the corners, so a thick box stays within the given corners.
void draw_rect(Image *img, int x0, int y0, int x1, int y1, Rgb c, int thickness);
// Fills the rectangle (inclusive corners) with c blended over the image: alpha 1 replaces the
// pixels, 0 leaves them, in between mixes (out = alpha * c + (1 - alpha) * old, rounded).
void draw_fill_rect(Image *img, int x0, int y0, int x1, int y1, Rgb c, float alpha);

// Text in the embedded font, top-left of the first cell at (x, y), each font pixel a
// scale x scale block (scale >= 1). Characters outside 32..126 draw as '?'. '\n' starts a line.
void draw_text(Image *img, int x, int y, const char *s, Rgb c, int scale);
// The same rotated 90 degrees counter-clockwise (reading bottom to top, as a y-axis title):
// (x, y) is the bottom-left corner of the first character.
void draw_text_up(Image *img, int x, int y, const char *s, Rgb c, int scale);
// Size in pixels of the text's box (the widest line, all lines).
int draw_text_width(const char *s, int scale);
int draw_text_height(const char *s, int scale);
// Text on a filled box with a `pad`-pixel margin, the box's top-left at (x, y); the text is
// black or white, whichever reads better on bg. Returns the box height.
int draw_label(Image *img, int x, int y, const char *s, Rgb bg, int scale, int pad);

// A distinct, saturated colour per class id (a fixed palette, cycling).
Rgb draw_class_colour(int class_id);

// --- pictures of detections (detr predict) -----------------------------------------------------

// A w x h image's picture size: scaled up so that its long side is at least DRAW_MIN_LONG_SIDE
// (labels on a small image stay legible), else as it is.
#define DRAW_MIN_LONG_SIDE 512
void draw_display_size(int w, int h, int *dw, int *dh);
// The text scale for labels on a w x h picture: 2 (10x16-pixel glyphs) up to 1000 pixels, then more.
int draw_text_scale(int w, int h);
// Copies src into dst with src's top-left at (x, y), clipped to dst.
void draw_blit(Image *dst, const Image *src, int x, int y);
// t in [0, 1] on a viridis-like colour map: dark blue (0), teal, green, yellow (1).
Rgb draw_heat_colour(float t);
// A colour per cluster index, neighbouring indices far apart in hue.
Rgb draw_cluster_colour(int i);
// map [mh, mw] scaled by its maximum, upsampled bilinearly to the whole image and blended over it
// in draw_heat_colour with `alpha`.
void draw_heat_map(Image *img, const float *map, int mh, int mw, float alpha);
// labels [mh, mw], each cell a block of the image (nearest), blended in draw_cluster_colour(label)
// with `alpha`; negative labels leave their pixels.
void draw_label_map(Image *img, const int *labels, int mh, int mw, float alpha);

typedef struct {
  int x0, y0, x1, y1;  // inclusive
} DrawRect;
// Where a w x h label of `box` goes on an img_w x img_h picture so that it overlaps none of the
// n_taken rectangles placed before (greedy): above the box, else below it, else inside its top,
// else inside its bottom (each moved inside the picture), else the nearest free place above or
// below the first; over another label only when no place is free.
DrawRect draw_place_label(int img_w, int img_h, DrawRect box, int w, int h, const DrawRect *taken, int n_taken);

// Writes the image as PNG atomically: PATH.tmp.<pid>, fsync, rename.
// Returns 0, or -1 with err naming the file and the failing step.
int image_save_png(const char *path, const Image *img, char *err, size_t err_cap);

// --- line charts -----------------------------------------------------------------------------

#define CHART_MAX_PANELS 2
#define CHART_MAX_SERIES 4

typedef struct {
  const char *name;     // legend entry (NULL or "": not in the legend)
  const double *x, *y;  // [n]; points with a non-finite coordinate are left out (gaps)
  int n;
  Rgb colour;
} ChartSeries;

typedef struct {
  const char *title;              // above the panel (may be NULL)
  const char *x_label, *y_label;  // axis titles (may be NULL)
  ChartSeries series[CHART_MAX_SERIES];
  int n_series;
} ChartPanel;

typedef struct {
  const char *title;  // above all panels (may be NULL)
  ChartPanel panels[CHART_MAX_PANELS];
  int n_panels;          // 1..CHART_MAX_PANELS
  int panel_w, panel_h;  // pixels per panel; 0 picks 560 x 420
} ChartSpec;

// Renders the chart: each panel's axes span its data with "nice" ticks (1, 2, 2.5 or 5 x 10^k),
// tick labels, axis titles, a legend; a series with one point is a marker, a panel with no
// points says "no data". The image is n_panels * panel_w wide.
void chart_render(const ChartSpec *spec, Image *out);
// chart_render, then image_save_png. Returns 0, or -1 with err set (a bad spec, a failed write).
int chart_write_png(const char *path, const ChartSpec *spec, char *err, size_t err_cap);
// Ticks for [lo, hi]: the nice step and the first and last multiples of it covering the range
// (*first <= lo, *last >= hi, about `target` intervals). Exposed for the tests.
double chart_nice_ticks(double lo, double hi, int target, double *first, double *last);
