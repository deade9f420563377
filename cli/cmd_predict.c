// detr predict: images in, detections out: a JSON of boxes, labels and scores per image and a
// picture of each image with its boxes and class names drawn; on request (--show) pictures of what
// the model attends to: each detection's cross-attention, the encoder's clusters. The model, the preprocessing
// (evaluation's: the val resize, ImageNet normalization, an all-valid mask), the forward pass and
// the post-processing are the C API's (include/detr.h, api/detr_api.c): this verb is its user.
#define _POSIX_C_SOURCE 200809L  // access, open_memstream
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/out_file.h"
#include "cli/setup.h"
#include "core/atomic_file.h"
#include "core/clock.h"
#include "core/json_text.h"
#include "datasets/image.h"
#include "include/detr.h"
#include "train/cpu_share.h"
#include "viz/draw.h"

static const char *USAGE =
    "(--checkpoint C.safetensors | --weights W.safetensors [--config PRESET|FILE] [--set key=value ...])\n"
    "       [--enact] IMAGE... --out DIR [--threshold S] [--image-size N] [--max-size M] [--names ANN.json]\n"
    "       [--device cpu|cuda] [--threads T] [--json FILE] [--bad-input fail|skip] [--show attention|clusters]\n"
    "Detects objects in JPEG/PNG images. Writes DIR/predictions.json (per image: file, width, height, output,\n"
    "detections [{label, category_id, name, score, box [x0, y0, x1, y1] in pixels, query: the decoder query that\n"
    "made it}] by falling score) and DIR/<image name>.png with the boxes, class names and scores drawn. Class\n"
    "names come from --names (a COCO instances JSON; only its categories are used), else from the checkpoint,\n"
    "else 'class <id>'.\n"
    "--show attention: DIR/<image name>-attention.png, a row per detection (the best 24): its box, and its query's "
    "last\n"
    "decoder layer cross-attention (mean over heads) as a heat map over the image. --show clusters:\n"
    "DIR/<image name>-clusters.png, ENACT's clusters of the first and the last encoder layer (docs/pictures.md).";

// --- one image -----------------------------------------------------------------------------------

typedef struct {
  char *file, *output;  // input path as given; the picture's name in DIR
  int w, h;
  detr_result *res;  // detections with score >= threshold, by falling score
} ImageResult;

static int clamp_px(float v, int hi) { return v < -1.0f ? -1 : v > (float)hi ? hi : (int)lrintf(v); }

// The picture of an image: scaled up so that its long side is at least DRAW_MIN_LONG_SIDE, and
// down so that it is at most max_side; *s is the scale (boxes are drawn at s times their pixels).
static Image picture_of(const Image *img, int max_side, double *s) {
  int dw, dh;
  draw_display_size(img->w, img->h, &dw, &dh);
  int longest = dw > dh ? dw : dh;
  if (longest > max_side) {
    dw = (int)((int64_t)dw * max_side / longest);
    dh = (int)((int64_t)dh * max_side / longest);
    dw = dw > 0 ? dw : 1;
    dh = dh > 0 ? dh : 1;
  }
  *s = (double)dw / img->w;
  return dw == img->w && dh == img->h ? image_crop(img, 0, 0, img->h, img->w) : image_resize_bilinear(img, dw, dh);
}

// Detection i's box on a picture at scale s (corners ordered).
static DrawRect box_px(const detr_result *res, int i, const Image *pic, double s) {
  const detr_detection *d = detr_result_get(res, i);
  int x0 = clamp_px((float)(d->box[0] * s), pic->w), y0 = clamp_px((float)(d->box[1] * s), pic->h);
  int x1 = clamp_px((float)(d->box[2] * s), pic->w), y1 = clamp_px((float)(d->box[3] * s), pic->h);
  return (DrawRect){x0 < x1 ? x0 : x1, y0 < y1 ? y0 : y1, x0 < x1 ? x1 : x0, y0 < y1 ? y1 : y0};
}

// Box lines grow with the picture: 2 pixels at 512, 4 at 1333.
static int line_width(const Image *pic) { return 1 + (pic->w > pic->h ? pic->w : pic->h) / 400; }

// Detections first..first+n-1 on a picture at scale s: boxes lowest score first so the best is on
// top, then the labels ("name score"), each placed where it covers no label placed before it, the
// best first (draw_place_label).
static void draw_detections(Image *pic, const detr_result *res, int first, int n, double s) {
  int thick = line_width(pic), scale = draw_text_scale(pic->w, pic->h), pad = scale;
  for (int i = first + n - 1; i >= first; i--) {
    DrawRect b = box_px(res, i, pic, s);
    draw_rect(pic, b.x0, b.y0, b.x1, b.y1, draw_class_colour(detr_result_get(res, i)->label), thick);
  }
  DrawRect *taken = detr_malloc((size_t)(n > 0 ? n : 1) * sizeof(DrawRect), "label places");  // [n] the labels placed
  for (int k = 0; k < n; k++) {
    const detr_detection *d = detr_result_get(res, first + k);
    char text[160];
    snprintf(text, sizeof text, "%s %.2f", d->name, d->score);
    int lw = draw_text_width(text, scale) + 2 * pad, lh = draw_text_height(text, scale) + 2 * pad;
    taken[k] = draw_place_label(pic->w, pic->h, box_px(res, first + k, pic, s), lw, lh, taken, k);
    draw_label(pic, taken[k].x0, taken[k].y0, text, draw_class_colour(d->label), scale, pad);
  }
  free(taken);
}

// --- pictures of what the model attends to (--show) ----------------------------------------------

#define GAP 8                // pixels between and around the panels of a grid
#define ATTENTION_ROWS 24    // detections pictured at most (the best)
#define PANEL_MAX_SIDE 1024  // a panel's long side at most: 24 rows of them stay within a picture's 32768 px

// A white canvas of cols x rows panels of pw x ph pixels, GAP apart and around.
static Image grid_canvas(int cols, int rows, int pw, int ph) {
  Image g = image_alloc(cols * (pw + GAP) + GAP, rows * (ph + GAP) + GAP);
  memset(g.data, 255, (size_t)g.w * g.h * 3);
  return g;
}

// One row per detection (the best ATTENTION_ROWS): the picture with its box and label, and beside
// it its query's cross-attention map over the picture (DETR's detr_attention.ipynb figure).
static Image attention_picture(const Image *img, const detr_result *res, double threshold) {
  double s;
  Image pic = picture_of(img, PANEL_MAX_SIDE, &s);
  int count = detr_result_count(res), n = count < ATTENTION_ROWS ? count : ATTENTION_ROWS;
  Image grid = grid_canvas(2, n ? n : 1, pic.w, pic.h);
  for (int i = 0; i < (n ? n : 1); i++) {
    int y = GAP + i * (pic.h + GAP), mh, mw;
    Image left = image_crop(&pic, 0, 0, pic.h, pic.w), right = image_crop(&pic, 0, 0, pic.h, pic.w);
    const float *map = detr_result_attention(res, i, &mh, &mw);  // [mh, mw]
    if (map) {
      draw_detections(&left, res, i, 1, s);
      draw_heat_map(&right, map, mh, mw, 0.7f);
      DrawRect b = box_px(res, i, &right, s);
      draw_rect(&right, b.x0, b.y0, b.x1, b.y1, (Rgb){255, 255, 255}, line_width(&right));
    } else {
      char text[64];
      snprintf(text, sizeof text, "no detections >= %.2f", threshold);
      draw_label(&right, 0, 0, text, (Rgb){0, 0, 0}, draw_text_scale(pic.w, pic.h), 4);
    }
    draw_blit(&grid, &left, GAP, y);
    draw_blit(&grid, &right, 2 * GAP + pic.w, y);
    image_free(&left);
    image_free(&right);
  }
  image_free(&pic);
  return grid;
}

// The encoder's clusters of its first and last layer over the picture, each cluster its colour,
// under a line naming the layer and its number of clusters.
static Image clusters_picture(const Image *img, const detr_result *res) {
  double s;
  Image pic = picture_of(img, PANEL_MAX_SIDE, &s);
  int scale = draw_text_scale(pic.w, pic.h), band = draw_text_height("0", scale) + GAP;
  int n_layers = 0;
  while (detr_result_clusters(res, n_layers, NULL, NULL, NULL)) n_layers++;
  int layers[2] = {0, n_layers - 1}, panels = n_layers > 1 ? 2 : 1;
  Image grid = grid_canvas(panels, 1, pic.w, band + pic.h);
  for (int k = 0; k < panels; k++) {
    int mh, mw, count, x = GAP + k * (pic.w + GAP);
    const int *labels = detr_result_clusters(res, layers[k], &mh, &mw, &count);  // [mh, mw]
    Image panel = image_crop(&pic, 0, 0, pic.h, pic.w);
    draw_label_map(&panel, labels, mh, mw, 0.55f);
    char text[96];
    snprintf(text, sizeof text, "layer %d of %d: %d cluster%s", layers[k] + 1, n_layers, count, count == 1 ? "" : "s");
    draw_text(&grid, x, GAP, text, (Rgb){0, 0, 0}, scale);
    draw_blit(&grid, &panel, x, GAP + band);
    image_free(&panel);
  }
  image_free(&pic);
  return grid;
}

// OUT/<output's stem>-<what>.png of picture g (freed). Returns 0, or -1 with err.
static int save_picture(const char *dir, const char *output, const char *what, Image *g, char *err, size_t err_cap) {
  char name[700];
  snprintf(name, sizeof name, "%.*s-%s.png", (int)(strlen(output) - 4), output, what);  // output: "<stem>.png"
  char *path = data_path_join(dir, name);  // one of picture_file's names (PICTURE_SUFFIXES)
  int rc = image_save_png(path, g, err, err_cap);
  free(path);
  image_free(g);
  return rc;
}

// The files an output "<stem>.png" may write: itself and its --show pictures.
static const char *const PICTURE_SUFFIXES[] = {"", "-attention", "-clusters"};
#define N_PICTURES 3

static void picture_file(const char *output, int i, char *file, size_t cap) {
  snprintf(file, cap, "%.*s%s.png", (int)(strlen(output) - 4), output, PICTURE_SUFFIXES[i]);
}

// Whether two outputs would write a file of the same name (one's --show picture named as the other).
static bool outputs_collide(const char *a, const char *b) {
  char x[700], y[700];
  for (int i = 0; i < N_PICTURES; i++)
    for (int j = 0; j < N_PICTURES; j++) {
      picture_file(a, i, x, sizeof x);
      picture_file(b, j, y, sizeof y);
      if (!strcmp(x, y)) return true;
    }
  return false;
}

// Whether writing `name` or its --show pictures in dir would overwrite the input file itself.
static bool overwrites_input(const char *dir, const char *name, const struct stat *in_st) {
  for (int i = 0; i < N_PICTURES; i++) {
    char file[700];
    picture_file(name, i, file, sizeof file);
    char *path = data_path_join(dir, file);
    struct stat out_st;
    bool same = stat(path, &out_st) == 0 && out_st.st_dev == in_st->st_dev && out_st.st_ino == in_st->st_ino;
    free(path);
    if (same) return true;
  }
  return false;
}

static void json_string(FILE *f, const char *s);

// Whether the predictions JSON an earlier run left (its text, NULL if none) lists `name` as an
// output: that run wrote it and its pictures, so this one may replace them.
static bool written_before(const char *earlier, const char *name) {
  if (!earlier) return false;
  char *token = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&token, &len);
  DETR_CHECK(f, "written_before: open_memstream failed");
  fputs("\"output\": ", f);
  json_string(f, name);
  fclose(f);
  bool found = strstr(earlier, token) != NULL;
  free(token);
  return found;
}

// Whether one of the files of output `name` exists in dir and is not an earlier prediction's (a
// user's own <stem>.png beside <stem>.jpg, say).
static bool holds_other_file(const char *dir, const char *name, const char *earlier) {
  for (int i = 0; i < N_PICTURES; i++) {
    char file[700];
    picture_file(name, i, file, sizeof file);
    char *path = data_path_join(dir, file);
    bool exists = access(path, F_OK) == 0;
    free(path);
    if (exists) return !written_before(earlier, name);
  }
  return false;
}

// "DIR/<stem>.png" whose files (with its --show pictures) are unique among the outputs so far,
// none of them the input file itself nor a file in DIR that an earlier prediction did not write.
static char *output_name(const char *input, const char *dir, const ImageResult *done, int n_done, const char *earlier) {
  const char *base = strrchr(input, '/');
  base = base ? base + 1 : input;
  char stem[512];
  snprintf(stem, sizeof stem, "%s", *base ? base : "image");
  char *dot = strrchr(stem, '.');
  if (dot && dot != stem) *dot = 0;
  struct stat in_st;
  bool have_in = stat(input, &in_st) == 0;
  for (int k = 1;; k++) {
    char name[600];
    if (k == 1) snprintf(name, sizeof name, "%s.png", stem);
    else snprintf(name, sizeof name, "%s-%d.png", stem, k);
    bool taken = (have_in && overwrites_input(dir, name, &in_st)) || holds_other_file(dir, name, earlier);
    for (int i = 0; i < n_done && !taken; i++) taken = outputs_collide(done[i].output, name);
    if (!taken) return detr_strdup(name, "a string");
  }
}

// --- the JSON ------------------------------------------------------------------------------------

static void put_file(void *f, const char *bytes, size_t n) { fwrite(bytes, 1, n, f); }

// A file name may be any bytes (core/json_text.h): the JSON stays valid.
static void json_string(FILE *f, const char *s) { json_quote(s, put_file, f); }

// Labels are COCO category ids (the training data's, as the reference trains), so category_id
// repeats the label: a consumer of COCO results reads category_id.
static void write_json(FILE *f, const ImageResult *res, int n) {
  fputs("[", f);
  for (int i = 0; i < n; i++) {
    const ImageResult *r = &res[i];
    fputs(i ? ",\n {\"file\": " : "\n {\"file\": ", f);
    json_string(f, r->file);
    fprintf(f, ", \"width\": %d, \"height\": %d, \"output\": ", r->w, r->h);
    json_string(f, r->output);
    fputs(", \"detections\": [", f);
    int count = detr_result_count(r->res);
    for (int k = 0; k < count; k++) {
      const detr_detection *d = detr_result_get(r->res, k);
      fprintf(f, "%s\n  {\"label\": %d, \"category_id\": %d, \"name\": ", k ? "," : "", d->label, d->label);
      json_string(f, d->name);
      fprintf(f, ", \"score\": %.6g, \"box\": [%.2f, %.2f, %.2f, %.2f], \"query\": %d}", d->score, d->box[0], d->box[1],
              d->box[2], d->box[3], d->query);
    }
    fputs(count ? "\n ]}" : "]}", f);
  }
  fputs("\n]\n", f);
}

typedef struct {
  const ImageResult *res;
  int n;
} Results;

static void print_results(FILE *f, const void *ctx) {
  const Results *r = ctx;
  write_json(f, r->res, r->n);
}

static int save_json(const char *path, const ImageResult *res, int n, char *err, size_t err_cap) {
  if (!strcmp(path, "-")) {
    write_json(stdout, res, n);
    return fflush(stdout) ? (snprintf(err, err_cap, "stdout: write failed: %m"), -1) : 0;
  }
  return atomic_file_write(path, print_results, &(Results){res, n}, err, err_cap);
}

// --- the verb ------------------------------------------------------------------------------------

typedef struct {
  const char *checkpoint, *weights, *config, *out_dir, *names_path, *device, *json_path, *bad_input, *precision;
  CliList sets, show;
  unsigned outputs;  // DETR_OUTPUT_* of --show
  bool enact;
  const char *threshold_text;  // --threshold as given, NULL: the class head's (detr_default_threshold)
  double threshold;            // -1 until the model is open
  int threads;                 // 0: OMP_NUM_THREADS, or every core
  int image_size, max_size;    // -1: the checkpoint's training run, else the model's defaults
  const char **inputs;         // [n_inputs] image files
  int n_inputs;
  BadInputPolicy policy;
} PredictArgs;

// The run: its model and what it has written so far.
typedef struct {
  const PredictArgs *a;
  detr_model *model;
  ImageResult *results;            // [n_results]
  int n_results, skipped, failed;  // failed: images that could not be read or detected in (--bad-input fail)
  long long total, nonfinite;      // detections kept, and dropped for a non-finite score or box
  FILE *log;                       // stdout, or stderr when the JSON goes to stdout
  char *dir_json;                  // DIR/predictions.json
  const char *json;                // where the predictions JSON goes: --json ("-": stdout), else dir_json
  char *earlier_json;              // the predictions JSONs found at the start (earlier runs'), "" if none
} Predictor;

// A score in [0, 1], the whole text a number.
static bool parse_threshold(const char *text, double *out) {
  char *end = NULL;
  double v = strtod(text, &end);
  if (end == text || *end || !(v >= 0.0 && v <= 1.0)) return false;
  *out = v;
  return true;
}

// Flags and their usage checks. Returns 0, 1 after --help, or 2 (message printed).
static int parse_args(int argc, char **argv, PredictArgs *a) {
  *a = (PredictArgs){.device = "cpu", .bad_input = "fail", .threshold = -1, .image_size = -1, .max_size = -1};
  CliFlag flags[] = {
      {"checkpoint", FLAG_STRING, &a->checkpoint, "a detr-c training checkpoint (model config and weights)"},
      {"weights", FLAG_STRING, &a->weights,
       "model weights safetensors (reference or transformers names), with --config"},
      {"config", FLAG_STRING, &a->config,
       "with --weights: preset (" DETR_PRESET_LIST ") or key=value file (default " SETUP_DEFAULT_PRESET ")"},
      {"set", FLAG_LIST, &a->sets, "override one model config field, e.g. --set enact_sigma=2"},
      {"enact", FLAG_BOOL, &a->enact, SETUP_ENACT_HELP},
      {"precision", FLAG_STRING, &a->precision, SETUP_PRECISION_HELP},
      {"out", FLAG_STRING, &a->out_dir, "output folder (created): predictions.json and the pictures"},
      {"threshold", FLAG_STRING, &a->threshold_text,
       "keep detections with score >= this (default 0.5, or 0.3 for a sigmoid class head such as Conditional "
       "DETR's, whose scores run lower; 0 keeps every query)"},
      {"image-size", FLAG_I32, &a->image_size,
       "val shortest side (default: the checkpoint's training run, else 800, 320 small, 128 tiny)", 32, 4096},
      {"max-size", FLAG_I32, &a->max_size,
       "longest side (default: the checkpoint's training run, else 1333, 512 small, 192 tiny)", 32, 8192},
      {"names", FLAG_STRING, &a->names_path, "COCO instances JSON whose categories name the labels"},
      {"device", FLAG_STRING, &a->device, "cpu or cuda (default cpu)"},
      {"threads", FLAG_I32, &a->threads, "CPU threads (default: OMP_NUM_THREADS, or every core)", 0, 1024},
      {"json", FLAG_STRING, &a->json_path,
       "where to write the predictions JSON (default DIR/predictions.json; - for stdout)"},
      {"bad-input", FLAG_STRING, &a->bad_input, "fail (default) or skip (with a warning) images that cannot be read"},
      {"show", FLAG_LIST, &a->show,
       "also picture what the model attends to: attention (each detection's cross-attention) or clusters (ENACT's "
       "clusters of the encoder)"},
  };
  a->inputs = detr_malloc((size_t)argc * sizeof(char *), "input names");
  int rc = cli_parse("predict", USAGE, argc, argv, 2, flags, (int)(sizeof flags / sizeof flags[0]), a->inputs, argc,
                     &a->n_inputs);
  if (rc) return rc == 1 ? 1 : 2;
  const char *usage_error = NULL;
  if (!a->checkpoint == !a->weights) usage_error = "exactly one of --checkpoint and --weights is required";
  else if (a->checkpoint && a->config) usage_error = "--config goes with --weights (a checkpoint stores its config)";
  else if (!a->out_dir) usage_error = "--out DIR is required";
  else if (a->n_inputs == 0) usage_error = "no images given";
  else if (a->threshold_text && !parse_threshold(a->threshold_text, &a->threshold))
    usage_error = "--threshold must be a number in [0, 1]";
  else if (bad_input_policy_parse(a->bad_input, &a->policy)) usage_error = "--bad-input: expected fail or skip";
  for (int i = 0; i < a->show.count && !usage_error; i++) {
    unsigned o = !strcmp(a->show.items[i], "attention")  ? DETR_OUTPUT_ATTENTION
                 : !strcmp(a->show.items[i], "clusters") ? DETR_OUTPUT_CLUSTERS
                                                         : 0;
    if (!o) {
      fprintf(stderr, "detr predict: --show %s: unknown picture (attention or clusters)\n", a->show.items[i]);
      return 2;
    }
    a->outputs |= o;
  }
  if (usage_error) {
    fprintf(stderr, "detr predict: %s (see detr predict --help)\n", usage_error);
    return 2;
  }
  return 0;
}

// The model through the C API. Usage-level problems (config, device) return 2; unreadable or
// wrong files 1.
static int open_model(const Dist *job, const PredictArgs *a, detr_model **model) {
  char err[4608];
  Device dev;
  CliList sets = a->sets;                                     // with --precision's keys and --enact's
  if (setup_device(job, a->device, &dev, err, sizeof err) ||  // binds this rank's GPU under mpirun
      setup_precision(a->precision, true, dev, &sets, err, sizeof err) ||
      setup_enact(a->enact, &sets, err, sizeof err)) {
    fprintf(stderr, "detr predict: %s\n", err);
    return 2;
  }
  const char *all_sets[CLI_MAX_LIST + 1];
  int n_sets = 0;
  for (int i = 0; i < sets.count; i++) all_sets[n_sets++] = sets.items[i];
  all_sets[n_sets] = NULL;
  detr_options opt = detr_options_default();
  opt.device = dev == DEVICE_CUDA ? DETR_DEVICE_CUDA : DETR_DEVICE_CPU;
  opt.sets = all_sets;
  opt.image_size = a->image_size > 0 ? a->image_size : 0;  // 0: the checkpoint's training run, else the model's
  opt.max_size = a->max_size > 0 ? a->max_size : 0;
  opt.names = a->names_path;
  const char *config = a->config ? a->config : SETUP_DEFAULT_PRESET;
  detr_status st = a->checkpoint ? detr_open_checkpoint(a->checkpoint, &opt, model)
                                 : detr_open_weights(a->weights, config, &opt, model);
  if (st) {
    fprintf(stderr, "detr predict: %s\n", detr_last_error());
    return st == DETR_ERR_CONFIG || st == DETR_ERR_ARGUMENT || st == DETR_ERR_DEVICE ? 2 : 1;
  }
  if (detr_set_outputs(*model, a->outputs)) {  // the only refusal: clusters from an attention without them
    fprintf(stderr, "detr predict: --show %s; a model trained with `detr train --enact` has them\n", detr_last_error());
    detr_close(*model);
    *model = NULL;
    return 2;
  }
  return 0;
}

// An image that could not be read or detected in: skipped with a warning (--bad-input skip), or
// said and counted (fail: the verb goes on with the other images and exits 1 at the end).
static void image_failed(Predictor *p, const char *msg) {
  if (p->a->policy == BAD_INPUT_SKIP) {
    fprintf(stderr, "detr predict: warning: %s (skipped)\n", msg);
    p->skipped++;
  } else {
    fprintf(stderr, "detr predict: %s\n", msg);
    p->failed++;
  }
}

// One image: decoded here (the API's reader) for the picture, its pixels to the API as they are,
// the detections drawn into OUT/<name>.png. Returns 0 (also for an image that failed: image_failed)
// or -1 with err (its picture could not be written: the next would fail the same way).
static int predict_image(Predictor *p, const char *input, char *err, size_t err_cap) {
  const PredictArgs *a = p->a;
  Image img = {0};
  DataError derr;
  if (image_decode_file(input, &img, &derr)) {
    image_failed(p, derr.msg);
    return 0;
  }
  detr_result *res = NULL;
  if (detr_detect_rgb(p->model, img.data, (size_t)img.w * img.h * 3, img.w, img.h, a->threshold, &res)) {
    char msg[1200];
    snprintf(msg, sizeof msg, "%s: %s", input, detr_last_error());
    image_failed(p, msg);
    image_free(&img);
    return 0;
  }
  ImageResult *r = &p->results[p->n_results];
  *r = (ImageResult){.file = detr_strdup(input, "a string"),
                     .w = img.w,
                     .h = img.h,
                     .res = res,
                     .output = output_name(input, a->out_dir, p->results, p->n_results, p->earlier_json)};
  p->n_results++;
  int count = detr_result_count(res);
  p->total += count;
  p->nonfinite += detr_result_dropped(res);
  int rc = 0;
  if (a->outputs & DETR_OUTPUT_ATTENTION) {
    Image g = attention_picture(&img, res, a->threshold);
    rc = save_picture(a->out_dir, r->output, "attention", &g, err, err_cap);
  }
  if (!rc && (a->outputs & DETR_OUTPUT_CLUSTERS)) {
    Image g = clusters_picture(&img, res);
    rc = save_picture(a->out_dir, r->output, "clusters", &g, err, err_cap);
    int clusters;
    fprintf(p->log, "%s: clusters per encoder layer:", r->file);
    for (int l = 0; detr_result_clusters(res, l, NULL, NULL, &clusters); l++) fprintf(p->log, " %d", clusters);
    fputc('\n', p->log);
  }
  double s;
  Image pic = picture_of(&img, IMAGE_MAX_SIDE, &s);
  image_free(&img);
  draw_detections(&pic, res, 0, count, s);
  char *png = data_path_join(a->out_dir, r->output);
  if (!rc) rc = image_save_png(png, &pic, err, err_cap);
  image_free(&pic);
  const detr_detection *best = detr_result_get(res, 0);
  if (rc == 0 && best)
    fprintf(p->log, "%s: %d detection%s (best: %s %.2f) -> %s\n", r->file, count, count == 1 ? "" : "s", best->name,
            best->score, png);
  else if (rc == 0) fprintf(p->log, "%s: no detections >= %.2f -> %s\n", r->file, a->threshold, png);
  free(png);
  return rc ? -1 : 0;
}

// Appends the file's bytes to m (nothing when it cannot be opened).
static void append_file(FILE *m, const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, m);
  fclose(f);
}

// Before anything is written: no input is a folder; the JSON may replace an earlier one, never an
// input or another kind of file; the earlier one's list of outputs is kept (holds_other_file).
static int check_outputs(Predictor *p, char *err, size_t err_cap) {
  const PredictArgs *a = p->a;
  for (int i = 0; i < a->n_inputs; i++) {  // a folder given for its images: say how, before anything is made
    struct stat st;
    if (stat(a->inputs[i], &st) == 0 && S_ISDIR(st.st_mode)) {
      snprintf(err, err_cap, "%s is a folder: give its images (%s/*.jpg %s/*.png)", a->inputs[i], a->inputs[i],
               a->inputs[i]);
      return -1;
    }
  }
  bool to_stdout = !strcmp(p->json, "-");
  static const JsonShape predictions = {'[', "\"output\""};
  const char **inputs = detr_malloc((size_t)(a->n_inputs + 3) * sizeof(char *), "input names");
  for (int i = 0; i < a->n_inputs; i++) inputs[i] = a->inputs[i];
  inputs[a->n_inputs] = a->checkpoint;
  inputs[a->n_inputs + 1] = a->weights;
  inputs[a->n_inputs + 2] = a->names_path;
  int rc = to_stdout ? 0
                     : out_file_check(p->json, a->json_path ? "json" : "out", &predictions, inputs, a->n_inputs + 3,
                                      err, err_cap);
  free(inputs);
  if (rc) return rc;
  // What earlier runs into DIR wrote: DIR/predictions.json's list, and --json's when it is elsewhere.
  size_t len = 0;
  FILE *m = open_memstream(&p->earlier_json, &len);
  DETR_CHECK(m, "check_outputs: open_memstream failed");
  append_file(m, p->dir_json);
  if (!to_stdout && !out_file_same(p->json, p->dir_json)) append_file(m, p->json);
  fclose(m);
  return 0;
}

// Every image, then the predictions JSON. Returns 0, or -1 with err.
static int predict_all(Predictor *p, char *err, size_t err_cap) {
  const PredictArgs *a = p->a;
  DataError derr;
  if (data_mkdirs(a->out_dir, &derr)) {
    snprintf(err, err_cap, "%s", derr.msg);
    return -1;
  }
  double t0 = now_s();
  for (int i = 0; i < a->n_inputs; i++)
    if (predict_image(p, a->inputs[i], err, err_cap)) return -1;
  if (p->nonfinite)
    fprintf(stderr, "detr predict: warning: %lld detections with a non-finite score or box were left out\n",
            p->nonfinite);
  int rc = save_json(p->json, p->results, p->n_results, err, err_cap);
  double secs = now_s() - t0;
  if (rc == 0) {
    fprintf(p->log, "%d images, %lld detections, %.2f s (%.0f ms/image); wrote %s\n", p->n_results, p->total, secs,
            p->n_results ? 1e3 * secs / p->n_results : 0.0, strcmp(p->json, "-") ? p->json : "stdout");
    if (p->skipped) fprintf(stderr, "detr predict: %d unreadable images skipped\n", p->skipped);
  }
  if (rc == 0 && p->failed) {
    snprintf(err, err_cap,
             "%d of %d images failed (above); the predictions of the other %d are in %s (--bad-input skip makes "
             "such an image a warning)",
             p->failed, a->n_inputs, p->n_results, strcmp(p->json, "-") ? p->json : "stdout");
    rc = -1;
  }
  return rc;
}

int cmd_predict(int argc, char **argv, const Dist *job) {
  PredictArgs a;
  int rc = parse_args(argc, argv, &a);
  if (rc == 0) {
    Predictor p = {.a = &a, .log = a.json_path && !strcmp(a.json_path, "-") ? stderr : stdout};
    CpuShare cpu;  // a fixed --threads; else OpenMP's default (no adapting: a prediction is short)
    cpu_share_init(&cpu, a.threads);
    p.dir_json = data_path_join(a.out_dir, "predictions.json");
    p.json = a.json_path ? a.json_path : p.dir_json;
    char err[4608];
    rc = check_outputs(&p, err, sizeof err);  // before the model: a usage error
    if (rc) {
      fprintf(stderr, "detr predict: %s\n", err);
      rc = 2;
    }
    if (rc == 0) rc = open_model(job, &a, &p.model);
    if (rc == 0) {
      if (a.threshold < 0) a.threshold = detr_default_threshold(p.model);
      p.results = detr_calloc((size_t)a.n_inputs, sizeof(ImageResult), "image results");
      if (predict_all(&p, err, sizeof err)) {
        fprintf(stderr, "detr predict: %s\n", err);
        rc = 1;
      }
      for (int i = 0; i < p.n_results; i++) {
        free(p.results[i].file);
        free(p.results[i].output);
        detr_result_free(p.results[i].res);
      }
      free(p.results);
      detr_close(p.model);
    }
    free(p.earlier_json);
    free(p.dir_json);
  } else if (rc == 1) {
    rc = 0;  // --help
  }
  free(a.inputs);
  return rc;
}
