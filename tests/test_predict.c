// Drawing primitives (exact pixels, clipping never writes outside the image), the embedded font,
// chart PNGs (decodable, expected size, empty and single-point series), and the `detr predict`
// and `detr info` verbs run as subprocesses of the built binary on a tiny model. predict's
// detections are compared with the evaluation path's (COCO reader + val loader + forward +
// post-processing) on the same image, so its preprocessing is evaluation's.
// Then the usage of the verbs: flag suggestions, the config keys, the run defaults of eval and
// predict (threads, batch, preset, threshold), categories against a checkpoint's, the progress line.
#define _GNU_SOURCE  // mkdtemp, nftw, popen
#include <check.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yajl/yajl_tree.h>
#include <zlib.h>

#include "core/runtime.h"
#include "datasets/loader.h"
#include "nn/model_io.h"
#include "include/detr.h"
#include "train/checkpoint.h"
#include "tests/run_settings_fixture.h"
#include "viz/draw.h"
#include "train/progress.h"
#include "cli/setup.h"
#include "train/data_layout.h"
#include "nn/postprocess.h"
#include "nn/position.h"

#ifndef DETR_BIN
#error "DETR_BIN (the path of the detr executable) comes from tests/CMakeLists.txt"
#endif

static const Rgb RED = {255, 0, 0}, BLUE = {0, 0, 255}, WHITE = {255, 255, 255};

static Image blank(int w, int h, uint8_t v) {
  Image img = image_alloc(w, h);
  memset(img.data, v, (size_t)w * h * 3);
  return img;
}

static bool is_rgb(const Image *img, int x, int y, Rgb c) {
  const uint8_t *p = img->data + ((size_t)y * img->w + x) * 3;
  return p[0] == c.r && p[1] == c.g && p[2] == c.b;
}

static bool is_background(const Image *img, int x, int y, uint8_t v) {
  const uint8_t *p = img->data + ((size_t)y * img->w + x) * 3;
  return p[0] == v && p[1] == v && p[2] == v;
}

// --- drawing ---------------------------------------------------------------------------------------

START_TEST(rect_pixels) {
  Image img = blank(20, 16, 0);
  draw_rect(&img, 9, 8, 2, 3, RED, 2);  // corners in any order; the border grows inwards
  for (int y = 0; y < img.h; y++)
    for (int x = 0; x < img.w; x++) {
      bool inside = x >= 2 && x <= 9 && y >= 3 && y <= 8;
      bool border = inside && (x < 4 || x > 7 || y < 5 || y > 6);
      ck_assert_msg(border ? is_rgb(&img, x, y, RED) : is_background(&img, x, y, 0), "pixel (%d, %d)", x, y);
    }
  image_free(&img);
}
END_TEST

START_TEST(fill_and_alpha) {
  Image img = blank(8, 8, 255);
  draw_fill_rect(&img, 1, 1, 3, 2, (Rgb){0, 0, 0}, 0.25f);  // 0.75 * 255 = 191.25
  draw_fill_rect(&img, 5, 5, 6, 6, BLUE, 1.0f);
  draw_fill_rect(&img, 0, 7, 7, 7, BLUE, 0.0f);  // alpha 0: nothing
  draw_fill_rect(&img, 0, 7, 7, 7, BLUE, NAN);   // NaN: nothing
  for (int y = 0; y < 8; y++)
    for (int x = 0; x < 8; x++) {
      if (x >= 1 && x <= 3 && y >= 1 && y <= 2) ck_assert(is_background(&img, x, y, 191));
      else if (x >= 5 && x <= 6 && y >= 5 && y <= 6) ck_assert(is_rgb(&img, x, y, BLUE));
      else ck_assert_msg(is_background(&img, x, y, 255), "pixel (%d, %d)", x, y);
    }
  image_free(&img);
}
END_TEST

START_TEST(line_pixels) {
  Image img = blank(10, 10, 0);
  draw_line(&img, 1, 1, 6, 6, RED, 1);   // the diagonal exactly
  draw_line(&img, 9, 0, 9, 3, BLUE, 1);  // a vertical run, ends included
  int red = 0, blue = 0;
  for (int y = 0; y < 10; y++)
    for (int x = 0; x < 10; x++) {
      if (is_rgb(&img, x, y, RED)) ck_assert(x == y && x >= 1 && x <= 6), red++;
      if (is_rgb(&img, x, y, BLUE)) ck_assert(x == 9 && y <= 3), blue++;
    }
  ck_assert_int_eq(red, 6);
  ck_assert_int_eq(blue, 4);
  // Thickness 3: a horizontal line covers rows y-1..y+1.
  Image t = blank(10, 10, 0);
  draw_line(&t, 2, 5, 7, 5, RED, 3);
  for (int y = 0; y < 10; y++)
    for (int x = 0; x < 10; x++) ck_assert_int_eq(is_rgb(&t, x, y, RED), x >= 1 && x <= 8 && y >= 4 && y <= 6);
  image_free(&t);
  image_free(&img);
}
END_TEST

// Every printable glyph but space draws something, no two are the same, and the text stays in
// the box draw_text_width/height give.
START_TEST(font_glyphs) {
  static uint8_t seen[95][DRAW_GLYPH_W * DRAW_GLYPH_H];
  for (int c = 32; c <= 126; c++) {
    Image img = blank(DRAW_CELL_W, DRAW_CELL_H, 0);
    char s[2] = {(char)c, 0};
    draw_text(&img, 0, 0, s, WHITE, 1);
    int on = 0;
    for (int y = 0; y < DRAW_CELL_H; y++)
      for (int x = 0; x < DRAW_CELL_W; x++) {
        bool lit = !is_background(&img, x, y, 0);
        if (lit) ck_assert_msg(x < DRAW_GLYPH_W && y < DRAW_GLYPH_H, "'%c' outside its glyph box", c);
        if (x < DRAW_GLYPH_W && y < DRAW_GLYPH_H) seen[c - 32][y * DRAW_GLYPH_W + x] = lit;
        on += lit;
      }
    ck_assert_msg(c == ' ' ? on == 0 : on > 0, "glyph '%c' has %d pixels", c, on);
    for (int d = 32; d < c; d++)
      ck_assert_msg(memcmp(seen[c - 32], seen[d - 32], sizeof seen[0]), "'%c' == '%c'", c, d);
    image_free(&img);
  }
  // Scaled text: lit pixels exactly inside the measured box, and the box's last column and row
  // reached (the measure is tight).
  const char *text = "Ag_|0.87";
  int sc = 3, x0 = 5, y0 = 4, w = draw_text_width(text, sc), h = draw_text_height(text, sc);
  ck_assert_int_eq(w, (8 * DRAW_CELL_W - 1) * sc);
  ck_assert_int_eq(h, DRAW_GLYPH_H * sc);
  Image img = blank(w + 12, h + 10, 0);
  draw_text(&img, x0, y0, text, WHITE, sc);
  int max_x = -1, max_y = -1, lit = 0;
  for (int y = 0; y < img.h; y++)
    for (int x = 0; x < img.w; x++)
      if (!is_background(&img, x, y, 0)) {
        ck_assert_msg(x >= x0 && x < x0 + w && y >= y0 && y < y0 + h, "pixel (%d, %d) outside the text box", x, y);
        max_x = x > max_x ? x : max_x, max_y = y > max_y ? y : max_y, lit++;
      }
  ck_assert_int_gt(lit, 0);
  ck_assert_int_eq(max_y, y0 + h - 1);  // '_' and 'g' reach the bottom row
  ck_assert_int_eq(max_x, x0 + w - 1);  // '7' reaches the last column
  image_free(&img);
  // Rotated: the same pixel count, within the rotated box (bottom-left at the origin).
  Image up = blank(h + 10, w + 10, 0);
  draw_text_up(&up, 3, w + 5, text, WHITE, sc);
  int lit_up = 0;
  for (int y = 0; y < up.h; y++)
    for (int x = 0; x < up.w; x++)
      if (!is_background(&up, x, y, 0)) {
        ck_assert(x >= 3 && x < 3 + h && y > 5 && y <= w + 5);
        lit_up++;
      }
  ck_assert_int_eq(lit_up, lit);
  image_free(&up);
  // A label: text on its box, the box as measured plus padding.
  Image lab = blank(80, 30, 0);
  int lh = draw_label(&lab, 2, 3, "cat 0.9", (Rgb){250, 250, 0}, 1, 2);
  ck_assert_int_eq(lh, DRAW_GLYPH_H + 4);
  ck_assert(is_rgb(&lab, 2, 3, (Rgb){250, 250, 0}));
  ck_assert(is_rgb(&lab, 2 + draw_text_width("cat 0.9", 1) + 3, 3 + lh - 1, (Rgb){250, 250, 0}));
  ck_assert(is_background(&lab, 2 + draw_text_width("cat 0.9", 1) + 4, 3, 0));
  image_free(&lab);
}
END_TEST

// An image inside a larger buffer with guard bytes around it: drawing far outside, across and
// at the borders changes pixels inside and never a guard byte.
START_TEST(clipping_stays_inside) {
  enum { W = 37, H = 23, GUARD = 4096 };
  size_t n = (size_t)W * H * 3;
  uint8_t *buf = malloc(n + 2 * GUARD);
  memset(buf, 0xA5, n + 2 * GUARD);
  Image img = {.w = W, .h = H, .data = buf + GUARD};
  memset(img.data, 0, n);
  draw_line(&img, INT_MIN, INT_MIN, INT_MAX, INT_MAX, RED, 5);
  draw_line(&img, -1000000000, 5, 1000000000, 7, RED, 9);
  draw_line(&img, W - 1, -50, W - 1, H + 50, RED, 4);
  draw_line(&img, -100, -100, -5, -5, RED, 3);  // entirely outside
  draw_rect(&img, -3, -3, W + 2, H + 2, BLUE, 6);
  draw_rect(&img, INT_MIN, INT_MIN, INT_MAX, INT_MAX, BLUE, INT_MAX);
  draw_fill_rect(&img, -10, H - 3, W + 10, INT_MAX, WHITE, 0.5f);
  draw_text(&img, -7, -5, "clip me\nWWWW", WHITE, 3);
  draw_text(&img, W - 4, H - 4, "MMMM", WHITE, 4);
  draw_text(&img, INT_MAX - 10, INT_MAX - 10, "x", WHITE, 2);
  draw_text_up(&img, -3, 2, "edge", WHITE, 2);
  draw_text_up(&img, W - 3, H + 20, "edge", WHITE, 2);
  draw_label(&img, W - 5, H - 5, "label", RED, 2, 3);
  draw_label(&img, INT_MAX - 5, INT_MIN + 5, "far", RED, INT_MAX, INT_MAX);  // no overflow (UBSan)
  draw_line(&img, INT_MIN, 3, INT_MAX, 4, BLUE, INT_MAX);                    // a brush wider than the image: bounded
  for (size_t i = 0; i < GUARD; i++) {
    ck_assert_msg(buf[i] == 0xA5, "guard byte %zu before the image written", i);
    ck_assert_msg(buf[GUARD + n + i] == 0xA5, "guard byte %zu after the image written", i);
  }
  size_t changed = 0;
  for (size_t i = 0; i < n; i++) changed += img.data[i] != 0;
  ck_assert_uint_gt(changed, n / 4);
  free(buf);
}
END_TEST

START_TEST(class_colours) {
  Rgb a = draw_class_colour(1), b = draw_class_colour(2), c = draw_class_colour(17), d = draw_class_colour(-3);
  ck_assert(a.r != b.r || a.g != b.g || a.b != b.b);
  ck_assert(a.r == c.r && a.g == c.g && a.b == c.b);  // the palette cycles every 16
  (void)d;                                            // a negative id must not index outside the palette (ASan checks)
}
END_TEST

// Labels of boxes that share a corner never overlap while there is room, stay inside the picture,
// and the first goes above its box.
START_TEST(label_placement) {
  DrawRect taken[8], box = {40, 60, 120, 150};
  for (int k = 0; k < 8; k++) {
    taken[k] = draw_place_label(200, 240, box, 70, 20, taken, k);
    DrawRect r = taken[k];
    ck_assert(r.x0 >= 0 && r.y0 >= 0 && r.x1 < 200 && r.y1 < 240 && r.x1 - r.x0 == 69 && r.y1 - r.y0 == 19);
    for (int j = 0; j < k; j++)
      ck_assert_msg(r.x1 < taken[j].x0 || taken[j].x1 < r.x0 || r.y1 < taken[j].y0 || taken[j].y1 < r.y0,
                    "label %d overlaps label %d", k, j);
  }
  ck_assert(taken[0].x0 == 40 && taken[0].y1 == 59);  // above the box
  ck_assert(taken[1].y0 == 151);                      // then below it
  int dw, dh;
  draw_display_size(64, 48, &dw, &dh);  // small pictures scaled up, large ones kept
  ck_assert(dw == 512 && dh == 384);
  draw_display_size(900, 20, &dw, &dh);
  ck_assert(dw == 900 && dh == 20);
}
END_TEST

// --- charts ----------------------------------------------------------------------------------------

START_TEST(nice_ticks) {
  double first, last, step = chart_nice_ticks(0.0, 1.0, 6, &first, &last);
  ck_assert_double_eq_tol(step, 0.2, 1e-12);
  ck_assert_double_eq_tol(first, 0.0, 1e-12);
  ck_assert_double_eq_tol(last, 1.0, 1e-12);
  const double cases[][2] = {{0.013, 0.97}, {-7, 123}, {1e-5, 3e-5}, {-2e6, 5}, {3, 3}, {999.5, 1000.5}, {0, 1e12}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    double lo = cases[i][0], hi = cases[i][1];
    step = chart_nice_ticks(lo, hi, 6, &first, &last);
    ck_assert(step > 0);
    ck_assert(first <= lo && last >= hi);
    double intervals = (last - first) / step, mant = step / pow(10, floor(log10(step)));
    ck_assert_msg(intervals >= 1 - 1e-9 && intervals <= 12 + 1e-9, "[%g, %g]: %g intervals", lo, hi, intervals);
    ck_assert_msg(fabs(mant - 1) < 1e-9 || fabs(mant - 2) < 1e-9 || fabs(mant - 2.5) < 1e-9 || fabs(mant - 5) < 1e-9,
                  "[%g, %g]: step %g", lo, hi, step);
    ck_assert(fabs(first / step - round(first / step)) < 1e-6);  // ticks on multiples of the step
  }
}
END_TEST

static char tmp[64];  // this test's scratch folder (each test runs in its own process)

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static void setup_tmp(void) {
  snprintf(tmp, sizeof tmp, "/tmp/detr_test_predict_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmp));
}

static void teardown_tmp(void) { nftw(tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

// tmp/name in one of 16 rotating buffers: valid for the next 15 calls (keep longer-lived paths
// in a local copy).
static const char *at(const char *name) {
  static char bufs[16][300];
  static int next;
  char *b = bufs[next++ % 16];
  snprintf(b, 300, "%s/%s", tmp, name);
  return b;
}

static bool has_colour(const Image *img, Rgb c) {
  for (int y = 0; y < img->h; y++)
    for (int x = 0; x < img->w; x++)
      if (is_rgb(img, x, y, c)) return true;
  return false;
}

static bool no_temp_files(void) {
  char cmd[400];
  snprintf(cmd, sizeof cmd, "ls %s | grep -q '\\.tmp\\.'", tmp);
  return system(cmd) != 0;
}

START_TEST(chart_png) {
  double steps[200], loss[200], ep[5] = {1, 2, 3, 4, 5}, ap[5] = {0.01, 0.05, NAN, 0.12, 0.2},
                                ap50[5] = {0.03, 0.1, 0.2, 0.25, 0.33}, one_x = 7, one_y = 0.4;
  for (int i = 0; i < 200; i++) steps[i] = 10 * i, loss[i] = 5.0 * exp(-i / 60.0) + 0.1 * sin(i);
  loss[50] = INFINITY;  // a gap
  const Rgb C1 = {1, 2, 250}, C2 = {250, 3, 4}, C3 = {5, 251, 6}, C4 = {7, 8, 9};
  ChartSpec spec = {.title = "detr-r18-small on synth", .n_panels = 2};
  spec.panels[0] = (ChartPanel){.title = "loss",
                                .x_label = "step",
                                .y_label = "loss",
                                .n_series = 2,
                                .series = {{"train loss", steps, loss, 200, C1}, {"empty", NULL, NULL, 0, C4}}};
  spec.panels[1] =
      (ChartPanel){.title = "COCO AP",
                   .x_label = "epoch",
                   .y_label = "AP",
                   .n_series = 3,
                   .series = {{"AP", ep, ap, 5, C2}, {"AP50", ep, ap50, 5, C3}, {"one", &one_x, &one_y, 1, C4}}};
  char err[512];
  ck_assert_msg(chart_write_png(at("chart.png"), &spec, err, sizeof err) == 0, "%s", err);
  ck_assert(no_temp_files());
  Image img = {0};
  DataError derr;
  ck_assert_msg(image_decode_file(at("chart.png"), &img, &derr) == 0, "%s", derr.msg);
  ck_assert_int_eq(img.w, 2 * 560);
  ck_assert_int_gt(img.h, 420);  // the panels plus the title band
  ck_assert(has_colour(&img, C1) && has_colour(&img, C2) && has_colour(&img, C3) && has_colour(&img, C4));
  image_free(&img);

  // Panels without data (no series; only empty and non-finite series), a single point, custom size.
  double nan_x[2] = {NAN, 1}, nan_y[2] = {1, NAN};
  ChartSpec sparse = {.n_panels = 2, .panel_w = 300, .panel_h = 200};
  sparse.panels[0] = (ChartPanel){.n_series = 2, .series = {{NULL, NULL, NULL, 0, C1}, {"", nan_x, nan_y, 2, C2}}};
  sparse.panels[1] = (ChartPanel){.title = "single", .n_series = 1, .series = {{"p", &one_x, &one_y, 1, C3}}};
  ck_assert_msg(chart_write_png(at("sparse.png"), &sparse, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(image_decode_file(at("sparse.png"), &img, &derr), 0);
  ck_assert_int_eq(img.w, 600);
  ck_assert_int_eq(img.h, 200);
  ck_assert(!has_colour(&img, C1) && !has_colour(&img, C2));  // nothing drawable, no legend in panel 0
  ck_assert(has_colour(&img, C3));                            // the single point's marker
  image_free(&img);
  ChartSpec empty = {.n_panels = 1};
  ck_assert_int_eq(chart_write_png(at("empty.png"), &empty, err, sizeof err), 0);
  ck_assert_int_eq(image_decode_file(at("empty.png"), &img, &derr), 0);
  ck_assert_int_eq(img.w, 560);
  image_free(&img);

  // Bad specs and unwritable paths are errors naming the file, not crashes.
  ChartSpec bad = {.n_panels = 3};
  ck_assert_int_eq(chart_write_png(at("bad.png"), &bad, err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "bad.png"));
  bad = (ChartSpec){.n_panels = 1, .panels = {{.n_series = 1, .series = {{"x", NULL, NULL, 3, C1}}}}};
  ck_assert_int_eq(chart_write_png(at("bad.png"), &bad, err, sizeof err), -1);
  ck_assert_int_eq(chart_write_png(at("no/such/dir/c.png"), &empty, err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "no/such/dir/c.png"));
  ck_assert(no_temp_files());
}
END_TEST

// --- the verbs -------------------------------------------------------------------------------------

// Runs a shell command, capturing stdout and stderr together into out; returns the exit status.
static int run(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run(char *out, size_t cap, const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  strncat(cmd, " 2>&1", sizeof cmd - strlen(cmd) - 1);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

enum { IMG_W = 100, IMG_H = 80 };

// A tiny model's weights, an image, a COCO file naming categories 1 and 3 (one with a quote).
static DetrModel *make_fixture(void) {
  DetrConfig cfg;
  detr_config_preset("tiny", &cfg);
  DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(m, 11);
  StWriter *w = st_writer_new();
  params_save(&m->params, w, "");
  char err[1024];
  ck_assert_msg(st_writer_save(w, at("w.safetensors"), err, sizeof err) == 0, "%s", err);
  st_writer_free(w);
  uint8_t px[IMG_H][IMG_W][3];  // a gradient with a bright square
  for (int y = 0; y < IMG_H; y++)
    for (int x = 0; x < IMG_W; x++) {
      bool sq = x > 30 && x < 70 && y > 20 && y < 50;
      px[y][x][0] = sq ? 240 : (uint8_t)(2 * x), px[y][x][1] = sq ? 200 : (uint8_t)(3 * y), px[y][x][2] = 90;
    }
  DataError derr;
  ck_assert_int_eq(image_write_jpeg(at("img.jpg"), &px[0][0][0], IMG_W, IMG_H, 3, 92, &derr), 0);
  FILE *f = fopen(at("names.json"), "w");
  fprintf(f,
          "{\"images\": [{\"id\": 1, \"file_name\": \"img.jpg\", \"width\": %d, \"height\": %d}],\n"
          " \"annotations\": [{\"id\": 1, \"image_id\": 1, \"category_id\": 1, \"bbox\": [10, 10, 30, 20],"
          " \"area\": 600, \"iscrowd\": 0}],\n"
          " \"categories\": [{\"id\": 1, \"name\": \"alpha\"}, {\"id\": 3, \"name\": \"be\\\"ta\"}]}\n",
          IMG_W, IMG_H);
  fclose(f);
  return m;
}

typedef struct {
  int label, category_id, query;
  char name[64];
  double score, box[4];
} Pred;

static char *read_bytes(const char *path, long *len);
static char *read_text(const char *path) { return read_bytes(path, NULL); }

// The whole file, NUL-terminated; *len (when given) is its size.
static char *read_bytes(const char *path, long *len) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "%s missing", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  ck_assert_int_eq(fread(s, 1, (size_t)n, f), (size_t)n);
  s[n] = 0;
  fclose(f);
  if (len) *len = n;
  return s;
}

static yajl_val get(yajl_val obj, const char *key, yajl_type type) {
  const char *p[] = {key, NULL};
  yajl_val v = yajl_tree_get(obj, p, type);
  ck_assert_msg(v != NULL, "key '%s' missing or of another type", key);
  return v;
}

// Image `index` of a predictions.json: its fields are checked, its detections returned.
static int read_preds(const char *path, int index, const char *file, int n_images, Pred *out, int cap) {
  char *text = read_text(path), errbuf[256];
  yajl_val root = yajl_tree_parse(text, errbuf, sizeof errbuf);
  ck_assert_msg(root != NULL, "%s: %s", path, errbuf);
  ck_assert(YAJL_IS_ARRAY(root));
  ck_assert_int_eq((int)root->u.array.len, n_images);
  yajl_val im = root->u.array.values[index];
  ck_assert_str_eq(YAJL_GET_STRING(get(im, "file", yajl_t_string)), file);
  ck_assert_int_eq(YAJL_GET_INTEGER(get(im, "width", yajl_t_number)), IMG_W);
  ck_assert_int_eq(YAJL_GET_INTEGER(get(im, "height", yajl_t_number)), IMG_H);
  get(im, "output", yajl_t_string);
  yajl_val dets = get(im, "detections", yajl_t_array);
  int n = (int)dets->u.array.len;
  ck_assert_int_le(n, cap);
  for (int k = 0; k < n; k++) {
    yajl_val d = dets->u.array.values[k];
    Pred *p = &out[k];
    p->label = (int)YAJL_GET_INTEGER(get(d, "label", yajl_t_number));
    p->category_id = (int)YAJL_GET_INTEGER(get(d, "category_id", yajl_t_number));
    snprintf(p->name, sizeof p->name, "%s", YAJL_GET_STRING(get(d, "name", yajl_t_string)));
    p->score = YAJL_GET_DOUBLE(get(d, "score", yajl_t_number));
    p->query = (int)YAJL_GET_INTEGER(get(d, "query", yajl_t_number));
    yajl_val box = get(d, "box", yajl_t_array);
    ck_assert_int_eq((int)box->u.array.len, 4);
    for (int c = 0; c < 4; c++) p->box[c] = YAJL_GET_DOUBLE(box->u.array.values[c]);
    if (k) ck_assert_msg(p->score <= out[k - 1].score, "detections not sorted by score");
  }
  yajl_tree_free(root);
  free(text);
  return n;
}

static int by_score_desc(const void *a, const void *b) {
  const Detection *x = a, *y = b;
  return x->score != y->score ? (x->score > y->score ? -1 : 1) : (x->query > y->query) - (x->query < y->query);
}

// The evaluation path on the same image: COCO reader, val loader, forward, post-processing.
static int reference_detections(const DetrModel *m, Detection *dets) {
  CocoOpenConfig cc = {.ann_path = at("names.json"), .image_dir = tmp, .quiet = true};
  CocoDataset *ds;
  DataError derr;
  ck_assert_msg(coco_open(&cc, &ds, &derr) == 0, "%s", derr.msg);
  LoaderConfig lc = loader_config_default(false);
  lc.batch_size = 1, lc.num_workers = 0, lc.quiet = true;
  lc.aug = aug_config_scaled(false, 128, 192);  // the tiny preset's defaults
  DataLoader *L;
  ck_assert_int_eq(loader_create(ds, &lc, (LoaderPosition){0, 0}, &L, &derr), 0);
  const Batch *b;
  ck_assert_int_eq(loader_next(L, &b, &derr), DATA_OK);
  bool was = autograd_set_grad_enabled(false);
  ScopeMark mark = tensor_scope_mark();
  Tensor *images = tensor_scoped(batch_images_tensor(b, DEVICE_CPU));
  NnCtx ctx = {.training = false};
  DetrOutput out;
  char err[512];
  ck_assert_int_eq(detr_model_forward(m, &ctx, images, b->mask, &out, err, sizeof err), 0);
  int ow = b->targets[0].orig_w, oh = b->targets[0].orig_h;
  detr_postprocess(NULL, out.layers[out.n_layers - 1].logits, out.layers[out.n_layers - 1].boxes, &ow, &oh, dets);
  detr_output_free(&out);
  tensor_scope_release(mark);
  autograd_set_grad_enabled(was);
  loader_free(L);
  coco_free(ds);
  int n = (int)m->cfg.num_queries;
  qsort(dets, (size_t)n, sizeof(Detection), by_score_desc);
  return n;
}

static const char *expected_name(int label, char *buf) {
  if (label == 1) return "alpha";
  if (label == 3) return "be\"ta";
  sprintf(buf, "class %d", label);
  return buf;
}

START_TEST(predict_matches_evaluation) {
  DetrModel *m = make_fixture();
  static char out[1 << 16];
  int rc = run(out, sizeof out, "%s predict --weights %s --config tiny %s --out %s --threshold 0 --names %s", DETR_BIN,
               at("w.safetensors"), at("img.jpg"), at("out"), at("names.json"));
  ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
  Pred preds[64];
  int n = read_preds(at("out/predictions.json"), 0, at("img.jpg"), 1, preds, 64);
  Detection ref[64];
  int n_ref = reference_detections(m, ref);
  ck_assert_int_eq(n, n_ref);  // threshold 0: every query
  for (int k = 0; k < n; k++) {
    char buf[32];
    ck_assert_int_eq(preds[k].label, ref[k].label);
    ck_assert_int_eq(preds[k].query, (int)ref[k].query);  // pairs a detection with its query's outputs
    ck_assert_int_eq(preds[k].category_id, ref[k].label);
    ck_assert_str_eq(preds[k].name, expected_name(ref[k].label, buf));
    ck_assert_msg(fabs(preds[k].score - ref[k].score) <= 1e-5 * fabs(ref[k].score) + 1e-7, "score %d: %g vs %g", k,
                  preds[k].score, ref[k].score);
    for (int c = 0; c < 4; c++) ck_assert_double_eq_tol(preds[k].box[c], ref[k].box[c], 0.006);
  }
  Image img = {0};
  DataError derr;
  ck_assert_msg(image_decode_file(at("out/img.png"), &img, &derr) == 0, "%s", derr.msg);
  ck_assert_int_eq(img.w, 512);  // scaled up to a long side of 512 (100x80 -> 512x410)
  ck_assert_int_eq(img.h, 410);
  ck_assert(has_colour(&img, draw_class_colour(ref[0].label)));  // the best box is drawn
  image_free(&img);

  // A threshold keeps exactly the detections scoring at least it (ref[4]'s score printed with
  // 6 significant digits rounds either way, so compare against the parsed value).
  double th = preds[4].score;
  rc = run(out, sizeof out, "%s predict --weights=%s --config tiny --threshold %.9g --out %s %s %s", DETR_BIN,
           at("w.safetensors"), th, at("out2"), at("img.jpg"), at("img.jpg"));
  ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
  int expect = 0;
  for (int k = 0; k < n_ref; k++) expect += ref[k].score >= th;
  Pred p2[64];
  ck_assert_int_eq(read_preds(at("out2/predictions.json"), 1, at("img.jpg"), 2, p2, 64), expect);
  struct stat st;
  ck_assert_int_eq(stat(at("out2/img.png"), &st), 0);
  ck_assert_int_eq(stat(at("out2/img-2.png"), &st), 0);  // the same name twice: distinct pictures
  // An input named as another's --show picture gets another name: img-attention.png stays img's.
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cp %s %s", at("img.jpg"), at("img-attention.jpg"));
  ck_assert_int_eq(system(cmd), 0);
  rc = run(out, sizeof out, "%s predict --weights=%s --config tiny --out %s %s %s", DETR_BIN, at("w.safetensors"),
           at("out3"), at("img.jpg"), at("img-attention.jpg"));
  ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
  ck_assert_int_eq(stat(at("out3/img-attention-2.png"), &st), 0);
  detr_model_free(m);
}
END_TEST

START_TEST(predict_checkpoint) {
  DetrModel *m = make_fixture();
  char err[1024];
  TrainState state = {
      .step = 7, .epoch = 2, .next_batch = 3, .seed = 42, .best_map = 0.125, .run = test_run_settings(96, 160, 1, 2)};
  ck_assert_int_eq(
      checkpoint_save(at("plain.safetensors"), m, NULL, &state,
                      "train --data d --config tiny --image-size 96 --max-size=160", NULL, err, sizeof err),
      0);
  // The same checkpoint with class names in its metadata (the crc covers the tensors only).
  StFile *f = st_open(at("plain.safetensors"), err, sizeof err);
  ck_assert_ptr_nonnull(f);
  StWriter *w = st_writer_new();
  for (int i = 0; i < st_count(f); i++) {
    const StEntry *e = st_entry(f, i);
    st_writer_add(w, e->name, e->dtype, e->ndim, e->shape, st_data(f, e));
  }
  for (int i = 0; i < st_metadata_count(f); i++)
    st_writer_set_metadata(w, st_metadata_key(f, i), st_metadata_value(f, i));
  st_writer_set_metadata(w, "categories", "1:one;3:three");
  ck_assert_int_eq(st_writer_save(w, at("ckpt.safetensors"), err, sizeof err), 0);
  st_writer_free(w);
  st_close(f);

  static char out[1 << 16];
  int rc = run(out, sizeof out, "%s predict --checkpoint %s %s --out %s --threshold 0", DETR_BIN,
               at("ckpt.safetensors"), at("img.jpg"), at("a"));
  ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
  // The training run's val size (96/160, from the stored command) is used: same as giving it.
  rc = run(out, sizeof out,
           "%s predict --weights %s --config tiny --image-size 96 --max-size 160 %s --out %s "
           "--threshold 0",
           DETR_BIN, at("w.safetensors"), at("img.jpg"), at("b"));
  ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
  rc = run(out, sizeof out, "%s predict --weights %s --config tiny %s --out %s --threshold 0", DETR_BIN,
           at("w.safetensors"), at("img.jpg"), at("c"));
  ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
  Pred a[64], b[64], c[64];
  int na = read_preds(at("a/predictions.json"), 0, at("img.jpg"), 1, a, 64);
  ck_assert_int_eq(read_preds(at("b/predictions.json"), 0, at("img.jpg"), 1, b, 64), na);
  ck_assert_int_eq(read_preds(at("c/predictions.json"), 0, at("img.jpg"), 1, c, 64), na);
  bool differs_from_default = false;
  for (int k = 0; k < na; k++) {
    ck_assert_int_eq(a[k].label, b[k].label);
    ck_assert_double_eq(a[k].score, b[k].score);
    differs_from_default |= a[k].score != c[k].score;
    char buf[32];
    const char *name = a[k].label == 1   ? "one"
                       : a[k].label == 3 ? "three"
                                         : (sprintf(buf, "class %d", a[k].label), buf);
    ck_assert_str_eq(a[k].name, name);
  }
  ck_assert(differs_from_default);  // 128/192 gives other numbers: the sizes did matter
  // --names replaces the checkpoint's names; a file with only "categories" (gzip-compressed) does.
  gzFile gz = gzopen(at("cats.json.gz"), "wb");
  gzputs(gz,
         "{\"info\": {\"x\": [1, {\"id\": 3}]}, \"categories\": [{\"id\": 1, \"name\": \"uno\", "
         "\"keypoints\": [\"a\"]}]}");
  gzclose(gz);
  rc = run(out, sizeof out, "%s predict --checkpoint %s %s --out %s --threshold 0 --names %s", DETR_BIN,
           at("ckpt.safetensors"), at("img.jpg"), at("e"), at("cats.json.gz"));
  ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
  ck_assert_int_eq(read_preds(at("e/predictions.json"), 0, at("img.jpg"), 1, c, 64), na);
  for (int k = 0; k < na; k++) {
    char buf[32];
    const char *name = c[k].label == 1 ? "uno" : (sprintf(buf, "class %d", c[k].label), buf);
    ck_assert_str_eq(c[k].name, name);
  }

  // `detr info` on the checkpoint: its state, a valid crc, the parameter count.
  rc = run(out, sizeof out, "%s info %s", DETR_BIN, at("ckpt.safetensors"));
  ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
  char expect[128];
  snprintf(expect, sizeof expect, "%d tensors, %lld parameters", m->params.count,
           (long long)(params_numel(&m->params, PARAM_TRAINABLE) + params_numel(&m->params, PARAM_FROZEN) +
                       params_numel(&m->params, PARAM_BUFFER)));
  ck_assert_msg(strstr(out, expect), "no '%s' in:\n%s", expect, out);
  ck_assert_msg(strstr(out, "step 7, epoch 2, next batch 3") && strstr(out, "best AP:       0.1250") &&
                    strstr(out, "crc32:         ok") && strstr(out, "hidden_dim=32") &&
                    strstr(out, "detr train --data d") && strstr(out, "categories: 1:one;3:three") &&
                    strstr(out, "0 tensors (AdamW moments)"),
                "%s", out);

  // A flipped byte in the tensor data: info reports the failed checksum, predict refuses.
  char cmd[700];
  snprintf(cmd, sizeof cmd, "cp %s %s", at("ckpt.safetensors"), at("bad.safetensors"));
  ck_assert_int_eq(system(cmd), 0);
  FILE *g = fopen(at("bad.safetensors"), "r+b");
  fseek(g, -64, SEEK_END);
  int ch = fgetc(g);
  fseek(g, -64, SEEK_END);
  fputc(ch ^ 0x10, g);
  fclose(g);
  rc = run(out, sizeof out, "%s info %s", DETR_BIN, at("bad.safetensors"));
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "checksum mismatch") && strstr(out, at("bad.safetensors")), "%s", out);
  rc = run(out, sizeof out, "%s predict --checkpoint %s %s --out %s", DETR_BIN, at("bad.safetensors"), at("img.jpg"),
           at("d"));
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "checksum mismatch"), "%s", out);
  // Plain weights given as a checkpoint: told to use --weights.
  rc = run(out, sizeof out, "%s predict --checkpoint %s %s --out %s", DETR_BIN, at("w.safetensors"), at("img.jpg"),
           at("d"));
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "not a detr-c checkpoint") && strstr(out, "--weights"), "%s", out);
  detr_model_free(m);
}
END_TEST

START_TEST(info_files) {
  DetrModel *m = make_fixture();
  static char out[1 << 16];
  int rc = run(out, sizeof out, "%s info %s", DETR_BIN, at("w.safetensors"));
  ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
  char expect[128];
  snprintf(expect, sizeof expect, "... and %d more (--all lists them)", m->params.count - 40);
  // The first tensor's row: name, dtype, shape.
  const Param *first = &m->params.items[0];
  char row[300], shape[64];
  snprintf(row, sizeof row, "%s ", first->name);
  char *line = strstr(out, row);
  snprintf(row, sizeof row, "  F32    %s\n", shape_str(first->tensor->shape, shape, sizeof shape));
  ck_assert_msg(strstr(out, "not a detr-c checkpoint") && strstr(out, expect) && line && strstr(line, row) &&
                    strchr(line, '\n') == strstr(line, row) + strlen(row) - 1,
                "%s", out);
  rc = run(out, sizeof out, "%s info --all %s", DETR_BIN, at("w.safetensors"));
  ck_assert_int_eq(rc, 0);
  ck_assert(!strstr(out, "more (--all"));
  ck_assert_ptr_nonnull(strstr(out, m->params.items[m->params.count - 1].name));
  // Truncated, not safetensors at all, missing: exit 1 naming the file.
  char cmd[700];
  snprintf(cmd, sizeof cmd, "head -c 3000 %s > %s", at("w.safetensors"), at("cut.safetensors"));
  ck_assert_int_eq(system(cmd), 0);
  const char *bad[] = {at("cut.safetensors"), at("img.jpg"), at("missing.safetensors")};
  for (int i = 0; i < 3; i++) {
    rc = run(out, sizeof out, "%s info %s", DETR_BIN, bad[i]);
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strstr(out, bad[i]), "no file name in: %s", out);
  }
  detr_model_free(m);
}
END_TEST

START_TEST(predict_bad_input) {
  DetrModel *m = make_fixture();
  static char out[1 << 16];
  char W[300], bad[2][300];
  snprintf(W, sizeof W, "%s", at("w.safetensors"));
  // Usage: unknown flag, missing --out, no model or two, no image, bad threshold -> exit 2.
  int rc = run(out, sizeof out, "%s predict --weights %s --config tiny --bogus 1 %s --out %s", DETR_BIN, W,
               at("img.jpg"), at("o"));
  ck_assert_int_eq(rc, 2);
  ck_assert_ptr_nonnull(strstr(out, "unknown flag '--bogus'"));
  ck_assert_int_eq(run(out, sizeof out, "%s predict --weights %s --config tiny %s", DETR_BIN, W, at("img.jpg")), 2);
  ck_assert_int_eq(run(out, sizeof out, "%s predict %s --out %s", DETR_BIN, at("img.jpg"), at("o")), 2);
  ck_assert_int_eq(run(out, sizeof out, "%s predict --weights %s --checkpoint %s --config tiny %s --out %s", DETR_BIN,
                       W, W, at("img.jpg"), at("o")),
                   2);
  ck_assert_int_eq(run(out, sizeof out, "%s predict --weights %s --config tiny --out %s", DETR_BIN, W, at("o")), 2);
  ck_assert_int_eq(run(out, sizeof out, "%s predict --weights %s --config tiny --threshold 1.5 %s --out %s", DETR_BIN,
                       W, at("img.jpg"), at("o")),
                   2);
  ck_assert_int_eq(run(out, sizeof out, "%s info --bogus %s", DETR_BIN, W), 2);
  ck_assert_int_eq(run(out, sizeof out, "%s info", DETR_BIN), 2);
  // --pad-multiple outside 1..256 (detr eval, detr train) -> exit 2, the flag named.
  for (int v = 0; v < 2; v++) {
    int pad = v ? 257 : 0;
    rc = run(out, sizeof out, "%s eval --weights %s --config tiny --data %s --pad-multiple %d", DETR_BIN, W, at("o"),
             pad);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(out, "--pad-multiple"), "%s", out);
    rc = run(out, sizeof out, "%s train --data %s --config tiny --pad-multiple %d", DETR_BIN, at("o"), pad);
    ck_assert_int_eq(rc, 2);
    ck_assert_msg(strstr(out, "pad-multiple"), "%s", out);
  }
  // Data: weights of another configuration, a missing image, a corrupt image -> exit 1, named.
  rc = run(out, sizeof out, "%s predict --weights %s --config detr-r18-small %s --out %s", DETR_BIN, W, at("img.jpg"),
           at("o"));
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, W), "%s", out);
  FILE *f = fopen(at("junk.jpg"), "w");
  fputs("this is not a JPEG", f);
  fclose(f);
  snprintf(bad[0], sizeof bad[0], "%s", at("missing.jpg"));
  snprintf(bad[1], sizeof bad[1], "%s", at("junk.jpg"));
  for (int i = 0; i < 2; i++) {
    rc = run(out, sizeof out, "%s predict --weights %s --config tiny %s %s --out %s", DETR_BIN, W, at("img.jpg"),
             bad[i], at("o"));
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strstr(out, bad[i]), "%s", out);
  }
  // Every image it can: the one after a missing image is predicted too, predictions.json holds
  // both readable ones, and the verb exits 1 naming the missing one (it used to stop there,
  // writing no predictions.json, and a rerun named its picture img-2.png beside the orphan).
  char cp[512];
  snprintf(cp, sizeof cp, "cp %s %s", at("img.jpg"), at("img2.jpg"));
  ck_assert_int_eq(system(cp), 0);
  for (int pass = 0; pass < 2; pass++) {
    rc = run(out, sizeof out, "%s predict --weights %s --config tiny %s %s %s --out %s --threshold 0", DETR_BIN, W,
             at("img.jpg"), at("missing.jpg"), at("img2.jpg"), at("every"));
    ck_assert_int_eq(rc, 1);
    ck_assert_msg(strstr(out, "1 of 3 images failed") && strstr(out, at("missing.jpg")), "%s", out);
    Pred both[64];
    ck_assert_int_eq(read_preds(at("every/predictions.json"), 1, at("img2.jpg"), 2, both, 64), (int)m->cfg.num_queries);
    ck_assert_int_eq(access(at("every/img-2.png"), F_OK), -1);  // the rerun replaces its own pictures
  }
  // A file name that is not UTF-8 (Latin-1 'e' acute): predictions.json stays valid JSON, the name
  // written as the code points of its bytes (it was written raw: no JSON reader took the file).
  snprintf(cp, sizeof cp, "cp %s %s", at("img.jpg"), at("caf\xe9.jpg"));
  ck_assert_int_eq(system(cp), 0);
  rc = run(out, sizeof out, "%s predict --weights %s --config tiny %s --out %s --threshold 0", DETR_BIN, W,
           at("caf\xe9.jpg"), at("latin1"));
  ck_assert_msg(rc == 0, "%s", out);
  Pred one[64];
  ck_assert_int_eq(read_preds(at("latin1/predictions.json"), 0, at("caf\xc3\xa9.jpg"), 1, one, 64),
                   (int)m->cfg.num_queries);
  // A names file that is not COCO JSON: exit 1, named.
  rc = run(out, sizeof out, "%s predict --weights %s --config tiny %s --out %s --names %s", DETR_BIN, W, at("img.jpg"),
           at("o"), bad[1]);
  ck_assert_int_eq(rc, 1);
  ck_assert_msg(strstr(out, "malformed JSON") && strstr(out, bad[1]), "%s", out);
  // Under --bad-input skip the readable image is still predicted.
  rc = run(out, sizeof out,
           "%s predict --weights %s --config tiny %s %s --out %s --bad-input skip --threshold 0 "
           "--json %s",
           DETR_BIN, W, at("junk.jpg"), at("img.jpg"), at("s"), at("s.json"));
  ck_assert_msg(rc == 0, "%s", out);
  ck_assert_ptr_nonnull(strstr(out, "warning"));
  Pred p[64];
  ck_assert_int_eq(read_preds(at("s.json"), 0, at("img.jpg"), 1, p, 64), (int)m->cfg.num_queries);
  // An input PNG inside DIR keeps its bytes: the picture takes another name.
  ck_assert_int_eq(mkdir(at("same"), 0755), 0);
  Image src = blank(40, 30, 77);
  DataError derr;
  ck_assert_int_eq(image_write_png(at("same/pic.png"), src.data, 40, 30, 3, &derr), 0);
  long n_before, n_after;
  char *before = read_bytes(at("same/pic.png"), &n_before);
  rc = run(out, sizeof out, "%s predict --weights %s --config tiny %s --out %s --threshold 0", DETR_BIN, W,
           at("same/pic.png"), at("same"));
  ck_assert_msg(rc == 0, "%s", out);
  char *after = read_bytes(at("same/pic.png"), &n_after);
  ck_assert_int_eq(n_before, n_after);
  ck_assert_mem_eq(before, after, (size_t)n_before);
  struct stat st;
  ck_assert_int_eq(stat(at("same/pic-2.png"), &st), 0);
  free(before);
  free(after);
  image_free(&src);
  detr_model_free(m);
}
END_TEST

// --- usage: flag suggestions, config keys, run defaults -------------------------------------------

// An unknown flag gets the flag the user probably meant: the reference's main.py names, dashes
// for underscores, a close spelling; only flags the verb has.
START_TEST(flag_suggestions) {
  static char out[1 << 16];
  const struct {
    const char *args, *expect;
  } cases[] = {
      {"train --epoch 3", "unknown flag '--epoch' (did you mean --epochs? see detr train --help)"},
      {"train --output_dir r", "did you mean --out?"},
      {"train --coco_path d", "did you mean --data?"},
      {"train --num_workers 2", "did you mean --workers?"},
      {"train --lr_backbone 1e-5", "did you mean --lr-backbone?"},
      {"train --clip_max_norm 0.1", "did you mean --clip?"},
      {"eval --batch_size 2", "did you mean --batch?"},
      {"train --dim_feedforward 64", "did you mean --set ffn_dim=N?"},
      {"train --no_aux_loss", "did you mean --set aux_loss=false?"},
      {"predict --num_queries 5", "did you mean --set num_queries=N?"},
      {"train --start_epoch 3", "--resume"},
      {"train --eval", "detr eval"},
      {"predict --thresh 0.3", "did you mean --threshold?"},
      {"eval --checkpiont c", "did you mean --checkpoint?"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ck_assert_int_eq(run(out, sizeof out, "%s %s", DETR_BIN, cases[i].args), 2);
    ck_assert_msg(strstr(out, cases[i].expect), "detr %s: no '%s' in: %s", cases[i].args, cases[i].expect, out);
  }
  // Nothing close, or a flag the verb lacks: no suggestion.
  const char *none[] = {"train --zzz 1", "eval --eos_coef 0.1", "eval --output_dir r", "info --set_cost_class 1"};
  for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
    ck_assert_int_eq(run(out, sizeof out, "%s %s", DETR_BIN, none[i]), 2);
    ck_assert_msg(strstr(out, "unknown flag") && !strstr(out, "did you mean"), "detr %s: %s", none[i], out);
  }
  // The loss-weight flags are suggested where the verb has them.
  ck_assert_int_eq(run(out, sizeof out, "%s train --help", DETR_BIN), 0);
  bool has = strstr(out, "--eos-coef") != NULL;
  ck_assert_int_eq(run(out, sizeof out, "%s train --eos_coef 0.1", DETR_BIN), 2);
  ck_assert_msg(has == (strstr(out, "did you mean --eos-coef?") != NULL), "%s", out);
}
END_TEST

// The --set keys: one list (nn/config.c) that the error for an unknown key and --help print, and
// every key in it is one that detr_config_set takes.
START_TEST(config_keys) {
  DetrConfig cfg;
  detr_config_preset("tiny", &cfg);
  char err[2048], help[512];
  const char *key;
  int n = 0;
  for (; (key = detr_config_key(n, help, sizeof help)); n++) {
    ck_assert_msg(*help, "key %s has no help", key);
    int rc = detr_config_set(&cfg, key, "not-a-value", err, sizeof err);
    ck_assert_msg(rc == 0 || !strstr(err, "unknown key"), "%s: %s", key, err);
  }
  ck_assert_int_ge(n, 20);
  ck_assert_int_eq(detr_config_set(&cfg, "ffn_dimm", "64", err, sizeof err), -1);
  ck_assert_msg(strstr(err, "unknown key 'ffn_dimm'") && strstr(err, "ffn_dim,") && strstr(err, "enact_sigma") &&
                    strstr(err, "decoder_cross_attn"),
                "%s", err);
  static char out[1 << 16];
  ck_assert_int_eq(run(out, sizeof out, "%s predict --weights w --set hiden_dim=8 x.jpg --out %s", DETR_BIN, at("o")),
                   2);
  ck_assert_msg(strstr(out, "--set: config: unknown key 'hiden_dim'") && strstr(out, "hidden_dim"), "%s", out);
  const char *verbs[] = {"train", "eval", "predict"};
  for (int v = 0; v < 3; v++) {
    ck_assert_int_eq(run(out, sizeof out, "%s %s --help", DETR_BIN, verbs[v]), 0);
    ck_assert_msg(strstr(out, "model config keys") && strstr(out, "  ffn_dim ") && strstr(out, "  enact_sigma "),
                  "detr %s --help: %s", verbs[v], out);
  }
  ck_assert_int_eq(run(out, sizeof out, "%s info --help", DETR_BIN), 0);  // no --set: no keys
  ck_assert_ptr_null(strstr(out, "model config keys"));
}
END_TEST

// The progress line counts epochs from 0, as the logs, metrics.jsonl and results-epoch<E>.json do.
START_TEST(progress_epochs) {
  fflush(stderr);
  int saved = dup(2);
  FILE *f = fopen(at("progress.txt"), "w");
  ck_assert_int_ge(dup2(fileno(f), 2), 0);
  Progress p;
  progress_init(&p, true, 0, 100);
  double terms[4] = {1, 2, 3, 4};
  progress_update(&p, 1, 0, 50, 2, 0.5, terms, NULL);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  fclose(f);
  char *text = read_text(at("progress.txt"));
  ck_assert_msg(strstr(text, "step 1/100 epoch 0 (of 0-49)"), "%s", text);
  free(text);
}
END_TEST

// A dataset root in tmp/data: the fixture's image and names.json (categories 1 alpha, 3 be"ta) as
// the val split.
static void make_data(void) {
  char cmd[1400];
  snprintf(cmd, sizeof cmd,
           "mkdir -p %s/data/annotations %s/data/val && cp %s %s/data/annotations/instances_val.json "
           "&& cp %s %s/data/val/img.jpg",
           tmp, tmp, at("names.json"), tmp, at("img.jpg"), tmp);
  ck_assert_int_eq(system(cmd), 0);
}

// A checkpoint of m trained in batches of `batch` (0: a checkpoint without run settings, as one
// written by no training run), with categories metadata (NULL: none).
static void save_checkpoint(const DetrModel *m, const char *path, int batch, const char *categories) {
  char err[1024];
  TrainState state = {.step = 1, .seed = 42};
  if (batch) state.run = test_run_settings(96, 160, 1, batch);
  ck_assert_msg(
      checkpoint_save(path, m, NULL, &state, "train --data d --config tiny", categories, err, sizeof err) == 0, "%s",
      err);
}

START_TEST(checkpoint_batch) {
  DetrModel *m = make_fixture();
  const int batches[] = {4, 3, 0};  // 0: no run settings
  for (int i = 0; i < 3; i++) {
    save_checkpoint(m, at("c.safetensors"), batches[i], NULL);
    char err[1024];
    StFile *f = st_open(at("c.safetensors"), err, sizeof err);
    ck_assert_ptr_nonnull(f);
    CheckpointInfo ci;
    ck_assert_msg(checkpoint_info_read(f, &ci, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(ci.run.known, batches[i] != 0);
    if (ci.run.known) ck_assert_int_eq(ci.run.batch, batches[i]);
    checkpoint_info_free(&ci);
    st_close(f);
  }
  detr_model_free(m);
}
END_TEST

START_TEST(categories_differ) {
  DetrModel *m = make_fixture();
  make_data();
  CocoOpenConfig cc = {.ann_path = at("names.json"), .image_dir = tmp, .quiet = true};
  CocoDataset *ds;
  DataError derr;
  ck_assert_msg(coco_open(&cc, &ds, &derr) == 0, "%s", derr.msg);
  char msg[512];
  ck_assert_int_eq(categories_compare(NULL, ds, msg, sizeof msg), 0);
  ck_assert_int_eq(categories_compare("1:alpha;3:be\"ta", ds, msg, sizeof msg), 0);
  ck_assert_int_eq(categories_compare("3:be\"ta;1:alpha", ds, msg, sizeof msg), 0);
  ck_assert_int_eq(categories_compare("1:alpha;3:gamma", ds, msg, sizeof msg), 1);
  ck_assert_msg(strstr(msg, "id 3 is 'gamma' in the checkpoint, 'be\"ta' in the data"), "%s", msg);
  ck_assert_int_eq(categories_compare("1:alpha;2:beta", ds, msg, sizeof msg), 2);
  ck_assert_msg(strstr(msg, "id 2 (beta) only in the checkpoint") && strstr(msg, "id 3 (be\"ta) only in the data"),
                "%s", msg);
  ck_assert_int_eq(categories_compare("1:alpha", ds, msg, sizeof msg), 2);
  coco_free(ds);

  // detr eval: other ids are an error unless allowed, other names a warning.
  static char out[1 << 16];
  save_checkpoint(m, at("ids.safetensors"), 0, "1:alpha;2:beta");
  save_checkpoint(m, at("names.safetensors"), 0, "1:alpha;3:gamma");
  save_checkpoint(m, at("same.safetensors"), 0, "1:alpha;3:be\"ta");
  int rc = run(out, sizeof out, "%s eval --checkpoint %s --data %s", DETR_BIN, at("ids.safetensors"), at("data"));
  ck_assert_msg(rc == 1 && strstr(out, "meaningless") && strstr(out, "--allow-other-categories") &&
                    strstr(out, "id 2 (beta) only in the checkpoint"),
                "exit %d: %s", rc, out);
  rc = run(out, sizeof out, "%s eval --checkpoint %s --data %s --allow-other-categories", DETR_BIN,
           at("ids.safetensors"), at("data"));
  ck_assert_msg(rc == 0 && strstr(out, "warning") && strstr(out, "Average Precision"), "exit %d: %s", rc, out);
  rc = run(out, sizeof out, "%s eval --checkpoint %s --data %s", DETR_BIN, at("names.safetensors"), at("data"));
  ck_assert_msg(rc == 0 && strstr(out, "warning") && strstr(out, "'gamma'"), "exit %d: %s", rc, out);
  rc = run(out, sizeof out, "%s eval --checkpoint %s --data %s", DETR_BIN, at("same.safetensors"), at("data"));
  ck_assert_msg(rc == 0 && !strstr(out, "warning"), "exit %d: %s", rc, out);
  detr_model_free(m);
}
END_TEST

// detr eval: --threads; --batch from the checkpoint's training run unless given.
START_TEST(eval_run_defaults) {
  DetrModel *m = make_fixture();
  make_data();
  static char out[1 << 16];
  save_checkpoint(m, at("b4.safetensors"), 4, NULL);
  save_checkpoint(m, at("b.safetensors"), 0, NULL);
  int rc =
      run(out, sizeof out, "%s eval --checkpoint %s --data %s --threads 1", DETR_BIN, at("b4.safetensors"), at("data"));
  ck_assert_msg(rc == 0 && strstr(out, "in batches of 4 "), "exit %d: %s", rc, out);
  rc = run(out, sizeof out, "%s eval --checkpoint %s --data %s --batch 1", DETR_BIN, at("b4.safetensors"), at("data"));
  ck_assert_msg(rc == 0 && strstr(out, "in batches of 1 "), "exit %d: %s", rc, out);
  rc = run(out, sizeof out, "%s eval --checkpoint %s --data %s", DETR_BIN, at("b.safetensors"), at("data"));
  ck_assert_msg(rc == 0 && strstr(out, "in batches of 2 "), "exit %d: %s", rc, out);
  ck_assert_int_eq(
      run(out, sizeof out, "%s eval --checkpoint %s --data %s --threads -1", DETR_BIN, at("b.safetensors"), at("data")),
      2);
  ck_assert_int_eq(run(out, sizeof out, "%s eval --help", DETR_BIN), 0);
  ck_assert_msg(strstr(out, "default " SETUP_DEFAULT_PRESET) && strstr(out, "training run, else 2"), "%s", out);
  detr_model_free(m);
}
END_TEST

// detr predict: --threads; with --weights the config defaults to SETUP_DEFAULT_PRESET; the
// threshold to the class head's (0.3 sigmoid, 0.5 softmax).
START_TEST(predict_defaults) {
  DetrModel *m = make_fixture();
  static char out[1 << 16];
  int rc = run(out, sizeof out, "%s predict --weights %s --config tiny --threads 1 %s --out %s", DETR_BIN,
               at("w.safetensors"), at("img.jpg"), at("o"));
  ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
  // Without --config, the tiny weights do not fit detr-r18-small's width 128 (detr-r50's: 256).
  rc = run(out, sizeof out, "%s predict --weights %s %s --out %s", DETR_BIN, at("w.safetensors"), at("img.jpg"),
           at("o"));
  ck_assert_msg(rc == 1 && strstr(out, "the model has [384, 128]"), "exit %d: %s", rc, out);
  detr_model_free(m);
  // A Conditional DETR (sigmoid classes): threshold 0.3; DETR: 0.5; the API says the same.
  DetrConfig cfg;
  detr_config_preset("tiny", &cfg);
  cfg.decoder = decoder_find("conditional");
  DetrModel *c = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(c, 5);
  save_checkpoint(c, at("cond.safetensors"), 0, NULL);
  detr_model_free(c);
  rc = run(out, sizeof out, "%s predict --checkpoint %s %s --out %s", DETR_BIN, at("cond.safetensors"), at("img.jpg"),
           at("o"));
  ck_assert_msg(rc == 0 && strstr(out, "no detections >= 0.30"), "exit %d: %s", rc, out);
  detr_model *api;
  ck_assert_int_eq(detr_open_checkpoint(at("cond.safetensors"), NULL, &api), DETR_OK);
  ck_assert_double_eq_tol(detr_default_threshold(api), 0.3, 1e-6);
  detr_close(api);
  ck_assert_int_eq(detr_open_weights(at("w.safetensors"), "tiny", NULL, &api), DETR_OK);
  ck_assert_double_eq_tol(detr_default_threshold(api), 0.5, 1e-6);
  detr_close(api);
  ck_assert_int_eq(run(out, sizeof out, "%s predict --help", DETR_BIN), 0);
  ck_assert_msg(strstr(out, "default " SETUP_DEFAULT_PRESET) && strstr(out, "0.3 for a sigmoid"), "%s", out);
}
END_TEST

// --- pictures of what the model attends to (--show) ----------------------------------------------

// The last decoder layer's cross-attention is captured by the forward pass when asked, never
// otherwise, for both decoder kinds and the k-means cross-attention: [B, Q, h*w], zero at padded
// positions; softmax rows (mean over heads) sum to 1, k-means rows to the share of heads in which
// the query won pixels (each head's row is 1/n on its n pixels).
START_TEST(cross_attention_capture) {
  const char *kinds[][2] = {{"detr", "softmax"}, {"conditional", "softmax"}, {"detr", "kmeans"}, {"anchor", "softmax"}};
  enum { B = 2, H = 96, W = 128 };
  float *px = malloc(sizeof(float) * B * H * W * 3);  // [B, H, W, 3]
  uint8_t mask[B * H * W] = {0};                      // [B, H, W]: image 1's right half is padding
  for (int i = 0; i < B * 3 * H * W; i++) px[i] = sinf(0.37f * (float)i) + 0.5f * cosf(0.011f * (float)i);
  for (int y = 0; y < H; y++)
    for (int x = W / 2; x < W; x++) mask[(H + y) * W + x] = 1;
  bool was = autograd_set_grad_enabled(false);
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    DetrConfig cfg;
    detr_config_preset("tiny", &cfg);
    cfg.decoder = decoder_find(kinds[k][0]);
    cfg.decoder_cross_attn = decoder_cross_attn_find(cfg.decoder, kinds[k][1]);
    ck_assert_ptr_nonnull(cfg.decoder_cross_attn);
    if (decoder_layout(cfg.decoder)->own_queries) cfg.num_queries = 9;  // Anchor DETR: 3 anchors x 3 patterns
    DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
    detr_model_init(m, 3);
    ScopeMark mark = tensor_scope_mark();
    Tensor *images = tensor_scoped(tensor_from_host(DEVICE_CPU, SHAPE(B, H, W, 3), px));
    for (int want = 0; want <= 1; want++) {
      NnCtx ctx = {.want_cross_attn = want};
      DetrOutput out;
      char err[256];
      ck_assert_msg(detr_model_forward(m, &ctx, images, mask, &out, err, sizeof err) == 0, "%s", err);
      if (!want) {
        ck_assert_ptr_null(out.cross_attn);
        detr_output_free(&out);
        continue;
      }
      int64_t Q = cfg.num_queries, N = out.feat_h * out.feat_w;
      ck_assert_ptr_nonnull(out.cross_attn);
      ck_assert(out.cross_attn->shape.ndim == 3 && out.cross_attn->shape.d[0] == B && out.cross_attn->shape.d[1] == Q &&
                out.cross_attn->shape.d[2] == N);
      float *a = malloc(sizeof(float) * B * Q * N);  // [B, Q, N]
      uint8_t *pad = malloc((size_t)(B * N));        // [B, N] 1 = padding
      tensor_to_host(out.cross_attn, a);
      mask_downsample_nearest(mask, B, H, W, out.feat_h, out.feat_w, pad);
      for (int64_t b = 0; b < B; b++)
        for (int64_t q = 0; q < Q; q++) {
          double sum = 0;
          for (int64_t i = 0; i < N; i++) {
            float v = a[(b * Q + q) * N + i];
            ck_assert_msg(v >= 0 && (!pad[b * N + i] || v == 0), "%s/%s: weight %g at position %lld", kinds[k][0],
                          kinds[k][1], v, (long long)i);
            sum += v;
          }
          if (strcmp(kinds[k][1], "kmeans")) ck_assert_msg(fabs(sum - 1) < 1e-5, "%s: row sum %g", kinds[k][0], sum);
          else ck_assert_msg(sum <= 1 + 1e-5, "kmeans: row sum %g", sum);
        }
      free(a);
      free(pad);
      detr_output_free(&out);
    }
    tensor_scope_release(mark);
    detr_model_free(m);
  }
  autograd_set_grad_enabled(was);
  free(px);
}
END_TEST

// The distinct colours in the rectangle [x0, x0 + w) x [y0, y0 + h) of img.
static int distinct_colours(const Image *img, int x0, int y0, int w, int h) {
  uint8_t *seen = calloc(1 << 21, 1);  // a bit per 24-bit colour
  int n = 0;
  for (int y = y0; y < y0 + h; y++)
    for (int x = x0; x < x0 + w; x++) {
      const uint8_t *p = img->data + ((size_t)y * img->w + x) * 3;
      uint32_t c = (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2];
      if (!(seen[c >> 3] & (1 << (c & 7)))) seen[c >> 3] |= (uint8_t)(1 << (c & 7)), n++;
    }
  free(seen);
  return n;
}

static void decode_png(const char *path, Image *img) {
  DataError derr;
  ck_assert_msg(image_decode_file(path, img, &derr) == 0, "%s", derr.msg);
}

// --show attention and --show clusters on a tiny DETR + ENACT from a 2-step `detr train` on `detr
// synth` data: the pictures' sizes (a 64x48 image drawn at 512x384), the attention maps through
// the API (one per detection, each summing to 1), the clusters picture's colours against the
// clusters the API and the log report.
START_TEST(show_pictures) {
  static char out[1 << 16];
  char ckpt[300], small[300], grey[300], dir[300];
  snprintf(ckpt, sizeof ckpt, "%s", at("run/ckpt-2.safetensors"));
  snprintf(small, sizeof small, "%s", at("small.png"));
  snprintf(grey, sizeof grey, "%s", at("grey.png"));
  snprintf(dir, sizeof dir, "%s", at("o"));
  int rc = run(out, sizeof out,
               "%s synth --out %s --train 4 --val 1 --seed 0 --min-side 64 --max-side 96 && "
               "%s train --data %s --config tiny --enact --set num_classes=14 --max-steps 2 --batch 2 --threads 1 "
               "--val-split none --out %s",
               DETR_BIN, at("synth"), DETR_BIN, at("synth"), at("run"));
  ck_assert_msg(rc == 0, "exit %d: %s", rc, out);
  uint8_t px[48][64][3], flat[48][64][3];
  for (int y = 0; y < 48; y++)
    for (int x = 0; x < 64; x++) {
      bool sq = x > 20 && x < 44 && y > 12 && y < 36;
      px[y][x][0] = sq ? 240 : (uint8_t)(4 * x), px[y][x][1] = sq ? 30 : (uint8_t)(5 * y), px[y][x][2] = 90;
      flat[y][x][0] = flat[y][x][1] = flat[y][x][2] = 128;
    }
  DataError derr;
  ck_assert_int_eq(image_write_png(small, &px[0][0][0], 64, 48, 3, &derr), 0);
  ck_assert_int_eq(image_write_png(grey, &flat[0][0][0], 64, 48, 3, &derr), 0);
  // A sigma of 1 (3 trained with): more clusters on these small maps, so that their colours count.
  rc = run(out, sizeof out,
           "%s predict --checkpoint %s --image-size 320 --max-size 480 --set enact_sigma=1 "
           "--threshold 0 --show attention --show clusters %s %s --out %s",
           DETR_BIN, ckpt, small, grey, dir);
  ck_assert_msg(rc == 0, "exit %d: %s", rc, out);

  // The same model through the API.
  detr_model *m;
  detr_options o = detr_options_default();
  o.image_size = 320, o.max_size = 480, o.sets = (const char *const[]){"enact_sigma=1", NULL};
  ck_assert_int_eq(detr_open_checkpoint(ckpt, &o, &m), DETR_OK);
  detr_result *r;
  ck_assert_int_eq(detr_detect_file(m, small, 0.0, &r), DETR_OK);
  ck_assert_ptr_null(detr_result_attention(r, 0, NULL, NULL));  // not asked for
  ck_assert_ptr_null(detr_result_clusters(r, 0, NULL, NULL, NULL));
  detr_result_free(r);
  ck_assert_int_eq(detr_set_outputs(m, DETR_OUTPUT_ATTENTION | DETR_OUTPUT_CLUSTERS), DETR_OK);
  ck_assert_int_eq(detr_detect_file(m, small, 0.0, &r), DETR_OK);
  int n = detr_result_count(r), h, w;
  ck_assert_int_eq(n, 10);  // threshold 0: one per query
  for (int i = 0; i < n; i++) {
    const float *map = detr_result_attention(r, i, &h, &w);  // [h, w]
    ck_assert(map && h == 10 && w == 14);                    // 320x427 at stride 32 (tiny: ResNet-18)
    double sum = 0;
    for (int k = 0; k < h * w; k++) sum += map[k];
    ck_assert_msg(fabs(sum - 1) < 1e-5, "detection %d: attention sums to %g", i, sum);
  }
  ck_assert_ptr_null(detr_result_attention(r, n, &h, &w));
  ck_assert_ptr_eq(detr_result_clusters(r, -1, NULL, NULL, NULL), detr_result_clusters(r, 1, NULL, NULL, NULL));
  ck_assert_ptr_null(detr_result_clusters(r, 2, NULL, NULL, NULL));  // tiny: 2 encoder layers
  detr_result_free(r);

  // 64x48 pictures are drawn at 512x384; the attention grid has a row per detection (box, map),
  // the clusters one a panel per pictured layer, 8 pixels apart and around.
  Image img = {0};
  decode_png(at("o/small.png"), &img);
  ck_assert(img.w == 512 && img.h == 384);
  image_free(&img);
  decode_png(at("o/small-attention.png"), &img);
  ck_assert_msg(img.w == 2 * 512 + 3 * 8 && img.h == n * (384 + 8) + 8, "%dx%d", img.w, img.h);
  image_free(&img);
  // On a uniform image every pixel of a layer's panel is its cluster's colour over the same grey:
  // as many colours as clusters, the count the API and the log give.
  ck_assert_int_eq(detr_detect_file(m, grey, 0.0, &r), DETR_OK);
  decode_png(at("o/grey-clusters.png"), &img);
  ck_assert_int_eq(img.w, 2 * 512 + 3 * 8);
  ck_assert_int_gt(img.h, 384 + 2 * 8);
  int counts[2];
  for (int k = 0; k < 2; k++) {
    const int *labels = detr_result_clusters(r, k ? -1 : 0, &h, &w, &counts[k]);
    int top = 0;
    for (int i = 0; i < h * w; i++) top = labels[i] > top ? labels[i] : top;
    ck_assert_int_eq(top + 1, counts[k]);
    ck_assert_int_gt(counts[k], 1);
    ck_assert_int_eq(distinct_colours(&img, 8 + k * (512 + 8), img.h - 8 - 384, 512, 384), counts[k]);
  }
  char line[400];
  snprintf(line, sizeof line, "%s: clusters per encoder layer: %d %d\n", grey, counts[0], counts[1]);
  ck_assert_msg(strstr(out, line), "'%s' not in: %s", line, out);
  image_free(&img);
  detr_result_free(r);
  detr_close(m);
}
END_TEST

// --show clusters on a model without ENACT names its encoder attention and --enact; an unknown
// --show lists the pictures; the API refuses the same.
START_TEST(show_errors) {
  DetrModel *fixture = make_fixture();  // DETR (dense encoder attention)
  detr_model_free(fixture);
  static char out[1 << 16];
  int rc = run(out, sizeof out, "%s predict --weights %s --config tiny %s --out %s --show clusters", DETR_BIN,
               at("w.safetensors"), at("img.jpg"), at("o"));
  ck_assert_msg(rc == 2 && strstr(out, "encoder attention is 'dense'") && strstr(out, "--enact"), "exit %d: %s", rc,
                out);
  rc = run(out, sizeof out, "%s predict --weights %s --config tiny %s --out %s --show heat", DETR_BIN,
           at("w.safetensors"), at("img.jpg"), at("o"));
  ck_assert_msg(rc == 2 && strstr(out, "--show heat") && strstr(out, "attention") && strstr(out, "clusters"),
                "exit %d: %s", rc, out);
  detr_model *m;
  ck_assert_int_eq(detr_open_weights(at("w.safetensors"), "tiny", NULL, &m), DETR_OK);
  ck_assert_int_eq(detr_set_outputs(m, DETR_OUTPUT_CLUSTERS), DETR_ERR_CONFIG);
  ck_assert_int_eq(detr_set_outputs(m, 4), DETR_ERR_ARGUMENT);
  ck_assert_int_eq(detr_set_outputs(m, DETR_OUTPUT_ATTENTION), DETR_OK);
  detr_close(m);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("predict");
  TCase *draw = tcase_create("draw");
  tcase_set_timeout(draw, 60);
  tcase_add_test(draw, rect_pixels);
  tcase_add_test(draw, fill_and_alpha);
  tcase_add_test(draw, line_pixels);
  tcase_add_test(draw, font_glyphs);
  tcase_add_test(draw, clipping_stays_inside);
  tcase_add_test(draw, class_colours);
  tcase_add_test(draw, nice_ticks);
  tcase_add_test(draw, label_placement);
  suite_add_tcase(s, draw);
  TCase *files = tcase_create("files");
  tcase_add_checked_fixture(files, setup_tmp, teardown_tmp);
  tcase_set_timeout(files, 120);
  tcase_add_test(files, chart_png);
  tcase_add_test(files, predict_matches_evaluation);
  tcase_add_test(files, predict_checkpoint);
  tcase_add_test(files, info_files);
  tcase_add_test(files, predict_bad_input);
  suite_add_tcase(s, files);
  TCase *usage = tcase_create("usage");
  tcase_add_checked_fixture(usage, setup_tmp, teardown_tmp);
  tcase_set_timeout(usage, 120);
  tcase_add_test(usage, flag_suggestions);
  tcase_add_test(usage, config_keys);
  tcase_add_test(usage, progress_epochs);
  tcase_add_test(usage, checkpoint_batch);
  tcase_add_test(usage, categories_differ);
  tcase_add_test(usage, eval_run_defaults);
  tcase_add_test(usage, predict_defaults);
  suite_add_tcase(s, usage);
  TCase *show = tcase_create("show");
  tcase_add_checked_fixture(show, setup_tmp, teardown_tmp);
  tcase_set_timeout(show, 120);
  tcase_add_test(show, cross_attention_capture);
  tcase_add_test(show, show_pictures);
  tcase_add_test(show, show_errors);
  suite_add_tcase(s, show);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
