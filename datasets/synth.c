#include "datasets/synth.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "datasets/image.h"
#include "kernels/rng_math.h"
#include "tensor/tensor.h"

const SynthCategory synth_categories[SYNTH_NUM_CATEGORIES] = {
    {1, "rectangle"}, {3, "ellipse"}, {4, "triangle"}, {7, "diamond"}, {9, "cross"}, {13, "ring"},
};

SynthConfig synth_config_default(void) {
  return (SynthConfig){.n_train = 1000, .n_val = 200, .seed = 0, .min_side = 256, .max_side = 448, .jpeg_quality = 90};
}

// COCO's area classes, by the side of a square of the same area.
#define SMALL_MAX_SIDE 31   // area < 32^2
#define MEDIUM_MAX_SIDE 95  // area < 96^2
#define MAX_OBJECTS 8
#define POLY_MAX_POINTS 24

typedef enum { SHAPE_RECT, SHAPE_ELLIPSE, SHAPE_TRIANGLE, SHAPE_DIAMOND, SHAPE_CROSS, SHAPE_RING } ShapeKind;

typedef struct {
  int category;    // index into synth_categories (== ShapeKind)
  int orient;      // triangle: apex up, down, left, right
  int x, y, w, h;  // the shape's frame in pixels
} SynthShape;

typedef struct {
  int category_id;
  bool iscrowd;
  int bbox[4];   // x, y, w, h of the drawn pixels
  int64_t area;  // drawn pixels
  int n_poly;    // polygon points (non-crowd)
  float poly[POLY_MAX_POINTS * 2];
  int img_h, img_w;  // for the crowd RLE
} SynthAnn;

typedef struct {
  int64_t id;
  int w, h;
  int n_anns;
  SynthAnn anns[MAX_OBJECTS + 1];
} SynthImage;

static int randint(Rng *r, int lo, int hi) { return lo + (int)rng_next_below(r, (uint64_t)(hi - lo + 1)); }
static float randf(Rng *r, float lo, float hi) { return lo + (hi - lo) * rng_next_uniform(r); }

// Whether pixel centre (px, py) lies in the shape.
static bool shape_contains(const SynthShape *s, float px, float py) {
  float u = 2.0f * (px - s->x) / s->w - 1.0f, v = 2.0f * (py - s->y) / s->h - 1.0f;  // [-1, 1] in the frame
  if (u < -1 || u > 1 || v < -1 || v > 1) return false;
  switch ((ShapeKind)s->category) {
    case SHAPE_RECT: return true;
    case SHAPE_ELLIPSE: return u * u + v * v <= 1.0f;
    case SHAPE_TRIANGLE: {
      float along = s->orient == 0 ? v : s->orient == 1 ? -v : s->orient == 2 ? u : -u;  // 1 at the base
      float across = s->orient < 2 ? u : v;
      return (along + 1.0f) * 0.5f >= fabsf(across);
    }
    case SHAPE_DIAMOND: return fabsf(u) + fabsf(v) <= 1.0f;
    case SHAPE_CROSS: return fabsf(u) <= 1.0f / 3 || fabsf(v) <= 1.0f / 3;
    case SHAPE_RING: {
      float r2 = u * u + v * v;
      return r2 <= 1.0f && r2 >= 0.36f;
    }
  }
  return false;
}

// The shape's outline as a COCO polygon (x, y pairs in pixels).
static int shape_polygon(const SynthShape *s, float *xy) {
  float cx = s->x + s->w * 0.5f, cy = s->y + s->h * 0.5f, rx = s->w * 0.5f, ry = s->h * 0.5f;
  int n = 0;
#define PT(u, v) (xy[2 * n] = cx + (u)*rx, xy[2 * n + 1] = cy + (v)*ry, n++)
  switch ((ShapeKind)s->category) {
    case SHAPE_RECT:
      PT(-1, -1);
      PT(1, -1);
      PT(1, 1);
      PT(-1, 1);
      break;
    case SHAPE_DIAMOND:
      PT(0, -1);
      PT(1, 0);
      PT(0, 1);
      PT(-1, 0);
      break;
    case SHAPE_TRIANGLE:
      if (s->orient == 0) {
        PT(0, -1);
        PT(1, 1);
        PT(-1, 1);
      } else if (s->orient == 1) {
        PT(-1, -1);
        PT(1, -1);
        PT(0, 1);
      } else if (s->orient == 2) {
        PT(-1, 0);
        PT(1, -1);
        PT(1, 1);
      } else {
        PT(-1, -1);
        PT(1, 0);
        PT(-1, 1);
      }
      break;
    case SHAPE_CROSS: {
      const float a = 1.0f / 3;
      PT(-a, -1);
      PT(a, -1);
      PT(a, -a);
      PT(1, -a);
      PT(1, a);
      PT(a, a);
      PT(a, 1);
      PT(-a, 1);
      PT(-a, a);
      PT(-1, a);
      PT(-1, -a);
      PT(-a, -a);
      break;
    }
    case SHAPE_ELLIPSE:
    case SHAPE_RING:  // outer outline
      for (int k = 0; k < 16; k++) PT(cosf(k * 0.39269908f), sinf(k * 0.39269908f));
      break;
  }
#undef PT
  return n;
}

typedef struct {
  uint8_t c[3];
} Rgb;

static Rgb random_colour(Rng *r) {
  Rgb c;
  for (int k = 0; k < 3; k++) c.c[k] = (uint8_t)randint(r, 0, 255);
  return c;
}

static int luma(Rgb c) { return (299 * c.c[0] + 587 * c.c[1] + 114 * c.c[2]) / 1000; }

// Background: two colours mixed by a pattern, plus per-pixel noise from a hash (cheap, determined
// by the image's key and the pixel).
static void draw_background(uint8_t *px, int w, int h, Rng *r, uint64_t key, Rgb *mean) {
  Rgb a = random_colour(r), b = random_colour(r);
  int pattern = randint(r, 0, 3);
  float angle = randf(r, 0, 3.14159265f), period = randf(r, 8, 48);
  float ca = cosf(angle), sa = sinf(angle);
  int cell = randint(r, 12, 40);
  for (int y = 0; y < h; y++) {
    for (int x = 0; x < w; x++) {
      float t;
      float along = x * ca + y * sa;
      switch (pattern) {
        case 0: t = 0.5f + 0.5f * along / (float)(w + h); break;                            // gradient
        case 1: t = 0.5f + 0.5f * sinf(6.2831853f * along / period); break;                 // stripes
        case 2: t = (float)(((x / cell) + (y / cell)) & 1); break;                          // checker
        default: t = 0.5f + 0.25f * (sinf(x / period) + sinf(y / (period * 0.7f))); break;  // waves
      }
      uint64_t noise = rng_mix64(key ^ ((uint64_t)y << 32 | (uint64_t)x));
      uint8_t *p = px + ((size_t)y * w + x) * 3;
      for (int k = 0; k < 3; k++) {
        int v = (int)(a.c[k] + t * (b.c[k] - a.c[k])) + (int)((noise >> (8 * k)) & 31) - 16;
        p[k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
      }
    }
  }
  for (int k = 0; k < 3; k++) mean->c[k] = (uint8_t)((a.c[k] + b.c[k]) / 2);
}

// Draws the shape (solid or striped) and returns its annotation box and pixel count.
static int64_t draw_shape(uint8_t *px, int w, int h, const SynthShape *s, Rgb fg, Rgb stripe, int stripe_period,
                          int bbox[4]) {
  int x0 = s->x > 0 ? s->x : 0, y0 = s->y > 0 ? s->y : 0;
  int x1 = s->x + s->w < w ? s->x + s->w : w, y1 = s->y + s->h < h ? s->y + s->h : h;
  int bx0 = w, by0 = h, bx1 = -1, by1 = -1;
  int64_t count = 0;
  for (int y = y0; y < y1; y++) {
    for (int x = x0; x < x1; x++) {
      if (!shape_contains(s, x + 0.5f, y + 0.5f)) continue;
      const Rgb *c = (stripe_period > 0 && ((x + y) / stripe_period) % 2) ? &stripe : &fg;
      memcpy(px + ((size_t)y * w + x) * 3, c->c, 3);
      count++;
      if (x < bx0) bx0 = x;
      if (x > bx1) bx1 = x;
      if (y < by0) by0 = y;
      if (y > by1) by1 = y;
    }
  }
  if (count) {
    bbox[0] = bx0;
    bbox[1] = by0;
    bbox[2] = bx1 - bx0 + 1;
    bbox[3] = by1 - by0 + 1;
  }
  return count;
}

static int64_t overlap(const int a[4], const int b[4]) {
  int64_t w = (int64_t)(a[0] + a[2] < b[0] + b[2] ? a[0] + a[2] : b[0] + b[2]) - (a[0] > b[0] ? a[0] : b[0]);
  int64_t h = (int64_t)(a[1] + a[3] < b[1] + b[3] ? a[1] + a[3] : b[1] + b[3]) - (a[1] > b[1] ? a[1] : b[1]);
  return w > 0 && h > 0 ? w * h : 0;
}

// A crowd region: a rectangle packed with tiny shapes of one category (iscrowd=1).
static void draw_crowd(uint8_t *px, int w, int h, Rng *r, SynthAnn *ann) {
  int rw = randint(r, w / 4, w * 2 / 5), rh = randint(r, h / 4, h * 2 / 5);
  int rx = randint(r, 0, w - rw), ry = randint(r, 0, h - rh);
  int category = randint(r, 0, SYNTH_NUM_CATEGORIES - 1);
  Rgb fg = random_colour(r);
  int step = randint(r, 9, 14);
  int64_t area = 0;
  for (int y = ry; y + step <= ry + rh; y += step) {
    for (int x = rx; x + step <= rx + rw; x += step) {
      int size = randint(r, step * 3 / 5, step - 1);
      SynthShape s = {.category = category,
                      .orient = randint(r, 0, 3),
                      .x = x + randint(r, 0, step - size),
                      .y = y + randint(r, 0, step - size),
                      .w = size,
                      .h = size};
      int box[4];
      area += draw_shape(px, w, h, &s, fg, fg, 0, box);
    }
  }
  *ann = (SynthAnn){.category_id = synth_categories[category].id,
                    .iscrowd = true,
                    .bbox = {rx, ry, rw, rh},
                    .area = area,
                    .img_w = w,
                    .img_h = h};
}

// Generates image `index` of a split: pixels into *px (malloc'd [h, w, 3]) and its annotations.
static void generate_image(const SynthConfig *cfg, int split, int64_t index, SynthImage *im, uint8_t **px) {
  uint64_t key =
      rng_mix64(rng_mix64(cfg->seed ^ 0x53594E5448ull) + (uint64_t)split * 0x9E3779B97F4A7C15ull + (uint64_t)index);
  Rng r = rng_make(key);
  im->id = index + 1;
  im->w = randint(&r, cfg->min_side, cfg->max_side);
  im->h = randint(&r, cfg->min_side, cfg->max_side);
  im->n_anns = 0;
  *px = detr_malloc((size_t)im->w * im->h * 3, "synthetic image");
  Rgb mean;
  draw_background(*px, im->w, im->h, &r, key, &mean);
  bool crowd = split == 1 && rng_next_uniform(&r) < 0.2f;
  if (crowd) draw_crowd(*px, im->w, im->h, &r, &im->anns[im->n_anns++]);
  int max_objects = cfg->max_objects > 0 && cfg->max_objects < MAX_OBJECTS ? cfg->max_objects : MAX_OBJECTS;
  int min_object = cfg->min_object_side > 10 ? cfg->min_object_side : 10;
  int n_objects = rng_next_uniform(&r) < 0.1f ? 0 : randint(&r, 1, max_objects);
  int min_side = im->w < im->h ? im->w : im->h;
  for (int k = 0; k < n_objects; k++) {
    int size_class = randint(&r, 0, 2);
    int lo = size_class == 0 ? 10 : size_class == 1 ? SMALL_MAX_SIDE + 3 : MEDIUM_MAX_SIDE + 4;
    int hi = size_class == 0 ? SMALL_MAX_SIDE - 3 : size_class == 1 ? MEDIUM_MAX_SIDE - 4 : min_side * 4 / 5;
    if (hi < lo) lo = hi = SMALL_MAX_SIDE + 3;  // too small an image for a large object
    if (lo < min_object) lo = min_object;
    if (hi < lo) hi = lo;
    SynthShape s = {.category = randint(&r, 0, SYNTH_NUM_CATEGORIES - 1), .orient = randint(&r, 0, 3)};
    int side = randint(&r, lo, hi);
    float aspect = randf(&r, 0.7f, 1.4f);  // w / h, same area as side^2 (a square of this side)
    s.w = (int)lroundf(side * sqrtf(aspect));
    s.h = (int)lroundf(side / sqrtf(aspect));
    if (s.w > im->w) s.w = im->w;
    if (s.h > im->h) s.h = im->h;
    // Up to 20 placements: at most 30% of either box may be shared with an earlier object
    // (partial occlusion, never hidden), and at most 10% of either with a crowd region.
    bool placed = false;
    for (int attempt = 0; attempt < 20 && !placed; attempt++) {
      s.x = randint(&r, 0, im->w - s.w);
      s.y = randint(&r, 0, im->h - s.h);
      int frame[4] = {s.x, s.y, s.w, s.h};
      placed = true;
      for (int j = 0; j < im->n_anns && placed; j++) {
        const SynthAnn *o = &im->anns[j];
        int64_t inter = overlap(frame, o->bbox), mine = (int64_t)s.w * s.h, theirs = (int64_t)o->bbox[2] * o->bbox[3];
        if (o->iscrowd) placed = inter * 10 <= mine && inter * 10 <= theirs;
        else placed = inter * 10 <= mine * 3 && inter * 10 <= theirs * 3;
      }
    }
    if (!placed) continue;
    Rgb fg = random_colour(&r), stripe = random_colour(&r);
    if (abs(luma(fg) - luma(mean)) < 60)  // keep objects visible against the background
      for (int c = 0; c < 3; c++) fg.c[c] = (uint8_t)(255 - fg.c[c]);
    int stripe_period = rng_next_uniform(&r) < 0.4f ? randint(&r, 3, 8) : 0;
    SynthAnn *a = &im->anns[im->n_anns];
    a->area = draw_shape(*px, im->w, im->h, &s, fg, stripe, stripe_period, a->bbox);
    if (a->area == 0) continue;
    a->category_id = synth_categories[s.category].id;
    a->iscrowd = false;
    a->n_poly = shape_polygon(&s, a->poly);
    im->n_anns++;
  }
}

// --- files ---------------------------------------------------------------------------------------

static void write_rle(FILE *f, const SynthAnn *a) {
  // Uncompressed COCO RLE of the crowd rectangle: column-major runs, starting with zeros.
  int H = a->img_h, W = a->img_w, x0 = a->bbox[0], y0 = a->bbox[1], x1 = x0 + a->bbox[2], y1 = y0 + a->bbox[3];
  fprintf(f, "{\"counts\": [%lld", (long long)x0 * H + y0);
  for (int x = x0; x < x1; x++) {
    fprintf(f, ", %d", y1 - y0);
    int64_t zeros = x + 1 < x1 ? (int64_t)H - (y1 - y0) : (int64_t)(H - y1) + (int64_t)(W - x1) * H;
    if (zeros > 0 || x + 1 < x1) fprintf(f, ", %lld", (long long)zeros);
  }
  fprintf(f, "], \"size\": [%d, %d]}", H, W);
}

static int write_json(const char *path, const SynthImage *images, int64_t n, const char *split_dir, DataError *err) {
  FILE *f = fopen(path, "wb");
  if (!f) return data_error(err, "%s: cannot create: %s", path, strerror(errno));
  fprintf(f, "{\"info\": {\"description\": \"detr-c synthetic shapes (%s)\", \"version\": \"1.0\", \"year\": 2024},\n",
          split_dir);
  fprintf(f, "\"licenses\": [{\"id\": 1, \"name\": \"CC0\", \"url\": \"\"}],\n\"images\": [\n");
  for (int64_t i = 0; i < n; i++)
    fprintf(f, "{\"id\": %lld, \"file_name\": \"%012lld.jpg\", \"width\": %d, \"height\": %d, \"license\": 1}%s\n",
            (long long)images[i].id, (long long)images[i].id, images[i].w, images[i].h, i + 1 < n ? "," : "");
  fprintf(f, "],\n\"annotations\": [\n");
  int64_t ann_id = 1;
  bool first = true;
  for (int64_t i = 0; i < n; i++) {
    for (int k = 0; k < images[i].n_anns; k++) {
      const SynthAnn *a = &images[i].anns[k];
      fprintf(f,
              "%s{\"id\": %lld, \"image_id\": %lld, \"category_id\": %d, \"iscrowd\": %d, \"area\": %lld, "
              "\"bbox\": [%d, %d, %d, %d], \"segmentation\": ",
              first ? "" : ",\n", (long long)ann_id++, (long long)images[i].id, a->category_id, a->iscrowd ? 1 : 0,
              (long long)a->area, a->bbox[0], a->bbox[1], a->bbox[2], a->bbox[3]);
      if (a->iscrowd) {
        write_rle(f, a);
      } else {
        fprintf(f, "[[");
        for (int p = 0; p < a->n_poly; p++)
          fprintf(f, "%s%.1f, %.1f", p ? ", " : "", a->poly[2 * p], a->poly[2 * p + 1]);
        fprintf(f, "]]");
      }
      fputc('}', f);
      first = false;
    }
  }
  fprintf(f, "\n],\n\"categories\": [\n");
  for (int c = 0; c < SYNTH_NUM_CATEGORIES; c++)
    fprintf(f, "{\"id\": %d, \"name\": \"%s\", \"supercategory\": \"shape\"}%s\n", synth_categories[c].id,
            synth_categories[c].name, c + 1 < SYNTH_NUM_CATEGORIES ? "," : "");
  fprintf(f, "]}\n");
  bool write_failed = ferror(f) != 0;
  if (fclose(f) != 0 || write_failed) return data_error(err, "%s: write error: %s", path, strerror(errno));
  return DATA_OK;
}

static int generate_split(const SynthConfig *cfg, int split, int64_t n, DataError *err) {
  const char *split_dir = split == 0 ? "train" : "val";
  char *img_dir = data_path_join(cfg->out_dir, split_dir);
  char *ann_dir = data_path_join(cfg->out_dir, "annotations");
  char json_name[64];
  snprintf(json_name, sizeof json_name, "instances_%s.json", split_dir);
  char *json_path = data_path_join(ann_dir, json_name);
  SynthImage *images = detr_calloc((size_t)(n > 0 ? n : 1), sizeof(SynthImage), "synthetic image records");
  int rc = data_mkdirs(img_dir, err);
  if (rc == DATA_OK) rc = data_mkdirs(ann_dir, err);
  for (int64_t i = 0; i < n && rc == DATA_OK; i++) {
    uint8_t *px = NULL;
    generate_image(cfg, split, i, &images[i], &px);
    char name[32];
    snprintf(name, sizeof name, "%012lld.jpg", (long long)images[i].id);
    char *path = data_path_join(img_dir, name);
    rc = image_write_jpeg(path, px, images[i].w, images[i].h, 3, cfg->jpeg_quality, err);
    free(path);
    free(px);
  }
  if (rc == DATA_OK) rc = write_json(json_path, images, n, split_dir, err);
  free(images);
  free(json_path);
  free(ann_dir);
  free(img_dir);
  return rc;
}

int synth_generate(const SynthConfig *cfg, DataError *err) {
  if (!cfg->out_dir || !cfg->out_dir[0]) return data_error(err, "synth: no output folder");
  if (cfg->n_train < 0 || cfg->n_val < 0) return data_error(err, "synth: negative image count");
  if (cfg->min_side < 64 || cfg->max_side < cfg->min_side || cfg->max_side > 4096)
    return data_error(err, "synth: image sides [%d, %d] (need 64 <= min <= max <= 4096)", cfg->min_side, cfg->max_side);
  if (cfg->jpeg_quality < 1 || cfg->jpeg_quality > 100)
    return data_error(err, "synth: JPEG quality %d (1..100)", cfg->jpeg_quality);
  if (generate_split(cfg, 0, cfg->n_train, err) != DATA_OK) return DATA_ERROR;
  return generate_split(cfg, 1, cfg->n_val, err);
}
