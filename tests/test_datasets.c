// The datasets layer: the COCO reader (plain and gzip, every bad-input case under both policies),
// image decoding and Pillow-exact resizing, DETR's augmentation box arithmetic, the loader
// (padding, mask, normalization, determinism across worker counts, resumable positions,
// unreadable images) and the synthetic dataset's determinism and contents.
#define _GNU_SOURCE  // mkdtemp, nftw
#include <check.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/runtime.h"
#include "datasets/coco.h"
#include "datasets/crops.h"
#include "datasets/image.h"
#include "datasets/loader.h"
#include "datasets/synth.h"
#include "datasets/transforms.h"
#include "tests/test_datasets_fixtures.h"

// --- helpers -------------------------------------------------------------------------------------

static char tmp[64];  // this test's scratch folder (each test runs in its own process)

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static void setup_tmp(void) {
  snprintf(tmp, sizeof tmp, "/tmp/detr_test_datasets_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmp));
}

static void teardown_tmp(void) { nftw(tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

// tmp/name, in a static rotating buffer (enough for the paths one check needs).
static const char *at(const char *name) {
  static char bufs[8][256];
  static int next;
  char *b = bufs[next++ % 8];
  snprintf(b, 256, "%s/%s", tmp, name);
  return b;
}

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  ck_assert_int_eq(fclose(f), 0);
}

static void write_text(const char *path, const char *text) { write_file(path, text, strlen(text)); }

static uint8_t *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = malloc((size_t)size + 1);
  ck_assert_uint_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
  fclose(f);
  *n = (size_t)size;
  return buf;
}

// A w x h image filled with one colour, and a rectangle [x0, x1) x [y0, y1) of another.
static Image solid_image(int w, int h, const uint8_t bg[3], int x0, int y0, int x1, int y1, const uint8_t fg[3]) {
  Image img = image_alloc(w, h);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      memcpy(img.data + ((size_t)y * w + x) * 3, (x >= x0 && x < x1 && y >= y0 && y < y1) ? fg : bg, 3);
  return img;
}

static void write_png(const char *path, int w, int h, uint8_t shade) {
  uint8_t c[3] = {shade, (uint8_t)(255 - shade), (uint8_t)(shade / 2)};
  Image img = solid_image(w, h, c, 0, 0, 0, 0, c);
  DataError err;
  ck_assert_int_eq(image_write_png(path, img.data, w, h, 3, &err), DATA_OK);
  image_free(&img);
}

static void write_jpeg(const char *path, int w, int h) {
  uint8_t bg[3] = {40, 90, 200}, fg[3] = {250, 250, 10};
  Image img = solid_image(w, h, bg, w / 4, h / 4, w / 2, h / 2, fg);
  DataError err;
  ck_assert_int_eq(image_write_jpeg(path, img.data, w, h, 3, 90, &err), DATA_OK);
  image_free(&img);
}

static CocoDataset *open_ok(const char *path, const char *image_dir, BadInputPolicy policy, bool check_images) {
  CocoOpenConfig cfg = {
      .ann_path = path, .image_dir = image_dir, .policy = policy, .check_images = check_images, .quiet = true};
  CocoDataset *ds = NULL;
  DataError err;
  int rc = coco_open(&cfg, &ds, &err);
  ck_assert_msg(rc == DATA_OK, "coco_open(%s): %s", path, err.msg);
  return ds;
}

// coco_open must fail, with a message holding the file name and `expect`.
static void open_fails(const char *path, const char *image_dir, BadInputPolicy policy, bool check_images,
                       const char *expect) {
  CocoOpenConfig cfg = {
      .ann_path = path, .image_dir = image_dir, .policy = policy, .check_images = check_images, .quiet = true};
  CocoDataset *ds = (CocoDataset *)1;
  DataError err = {{0}};
  ck_assert_int_eq(coco_open(&cfg, &ds, &err), DATA_ERROR);
  ck_assert_ptr_null(ds);
  ck_assert_msg(strstr(err.msg, path) != NULL, "message does not name the file: %s", err.msg);
  ck_assert_msg(strstr(err.msg, expect) != NULL, "expected '%s' in: %s", expect, err.msg);
}

// --- parsing -------------------------------------------------------------------------------------

static void check_minimal(const CocoDataset *ds) {
  ck_assert_int_eq(ds->n_images, 3);
  ck_assert_int_eq(ds->images[0].id, 3);  // sorted by id, the reference's dataset order
  ck_assert_int_eq(ds->images[1].id, 7);
  ck_assert_int_eq(ds->images[2].id, 9);
  ck_assert_str_eq(ds->images[0].file_name, "a.png");
  ck_assert_int_eq(ds->images[1].width, 40);
  ck_assert_int_eq(ds->images[1].height, 30);
  ck_assert_int_eq(ds->n_anns, 4);
  // Image 3: annotations 11 then 13 (file order), image 7: 10 then 12, image 9: none.
  ck_assert_int_eq(ds->images[0].n_anns, 2);
  ck_assert_int_eq(ds->anns[ds->images[0].first_ann].id, 11);
  ck_assert_int_eq(ds->anns[ds->images[0].first_ann + 1].id, 13);
  ck_assert_int_eq(ds->anns[ds->images[1].first_ann].id, 10);
  ck_assert_int_eq(ds->anns[ds->images[1].first_ann + 1].id, 12);
  ck_assert_int_eq(ds->images[2].n_anns, 0);
  const CocoAnn *a10 = &ds->anns[ds->images[1].first_ann];
  ck_assert_double_eq(a10->bbox[0], 1.5);
  ck_assert_double_eq(a10->bbox[3], 20);
  ck_assert_double_eq(a10->area, 150.5);
  ck_assert_int_eq(a10->image_index, 1);
  ck_assert(!a10->iscrowd);
  const CocoAnn *a11 = &ds->anns[ds->images[0].first_ann];
  ck_assert(a11->iscrowd);
  ck_assert_double_eq(a11->area, 16);                         // no "area": bbox w*h
  ck_assert(!ds->anns[ds->images[0].first_ann + 1].iscrowd);  // "iscrowd": false
  ck_assert_int_eq(ds->n_categories, 2);
  ck_assert_int_eq(ds->categories[0].id, 2);
  ck_assert_str_eq(ds->categories[0].name, "dog");
  ck_assert_str_eq(ds->categories[0].supercategory, "");
  ck_assert_str_eq(ds->categories[1].supercategory, "animal");
  ck_assert_int_eq(ds->stats.crowd_annotations, 1);
  ck_assert_int_eq(ds->stats.images_without_annotations, 1);
  ck_assert_int_eq(coco_find_image(ds, 7), 1);
  ck_assert_int_eq(coco_find_image(ds, 8), -1);
}

START_TEST(parse_minimal_coco) {
  write_text(at("ann.json"), MINIMAL_COCO);
  CocoDataset *ds = open_ok(at("ann.json"), NULL, BAD_INPUT_FAIL, false);
  check_minimal(ds);
  // Raw labels (the reference): label = category id, num_classes = max id + 1.
  ck_assert(!ds->contiguous_labels);
  ck_assert_int_eq(ds->num_classes, 6);
  ck_assert_int_eq(coco_label_of(ds, 5), 5);
  ck_assert_int_eq(coco_label_of(ds, 2), 2);
  ck_assert_int_eq(coco_label_of(ds, 3), -1);
  ck_assert_int_eq(coco_label_of(ds, 99), -1);
  ck_assert_int_eq(coco_category_of(ds, 5), 5);
  ck_assert_int_eq(coco_category_of(ds, 4), -1);
  coco_free(ds);
  // Contiguous labels: 0..K-1 in id order.
  CocoOpenConfig cfg = {.ann_path = at("ann.json"), .contiguous_labels = true, .quiet = true};
  DataError err;
  ck_assert_int_eq(coco_open(&cfg, &ds, &err), DATA_OK);
  ck_assert_int_eq(ds->num_classes, 2);
  ck_assert_int_eq(coco_label_of(ds, 2), 0);
  ck_assert_int_eq(coco_label_of(ds, 5), 1);
  ck_assert_int_eq(coco_category_of(ds, 1), 5);
  ck_assert_int_eq(coco_category_of(ds, 2), -1);
  coco_free(ds);
}
END_TEST

START_TEST(parse_gzip_like_plain) {
  gzFile gz = gzopen(at("ann.json.gz"), "wb");
  ck_assert_ptr_nonnull(gz);
  ck_assert_int_eq(gzwrite(gz, MINIMAL_COCO, (unsigned)strlen(MINIMAL_COCO)), (int)strlen(MINIMAL_COCO));
  ck_assert_int_eq(gzclose(gz), Z_OK);
  size_t n;
  uint8_t *bytes = read_file(at("ann.json.gz"), &n);
  ck_assert(n > 2 && bytes[0] == 0x1f && bytes[1] == 0x8b);  // really compressed
  CocoDataset *ds = open_ok(at("ann.json.gz"), NULL, BAD_INPUT_FAIL, false);
  check_minimal(ds);
  coco_free(ds);
  // A gzip stream cut short is an error naming the file, whatever the policy.
  write_file(at("cut.json.gz"), bytes, n - 12);
  open_fails(at("cut.json.gz"), NULL, BAD_INPUT_SKIP, false, "truncated");
  free(bytes);
}
END_TEST

START_TEST(malformed_and_truncated_json_fail) {
  size_t len = strlen(MINIMAL_COCO);
  write_file(at("half.json"), MINIMAL_COCO, len / 2);
  open_fails(at("half.json"), NULL, BAD_INPUT_FAIL, false, "truncated JSON");
  open_fails(at("half.json"), NULL, BAD_INPUT_SKIP, false, "truncated JSON");  // syntax is never skippable
  char *bad = strdup(MINIMAL_COCO);
  strstr(bad, "},\n \"licenses\"")[1] = ';';
  write_text(at("semicolon.json"), bad);
  open_fails(at("semicolon.json"), NULL, BAD_INPUT_SKIP, false, "malformed JSON at byte");
  free(bad);
  char trailing[4096];
  snprintf(trailing, sizeof trailing, "%s x", MINIMAL_COCO);
  write_text(at("trailing.json"), trailing);
  open_fails(at("trailing.json"), NULL, BAD_INPUT_FAIL, false, "malformed JSON");
  write_text(at("empty.json"), "");
  open_fails(at("empty.json"), NULL, BAD_INPUT_FAIL, false, "empty file");
  write_text(at("array.json"), "[1, 2]");
  open_fails(at("array.json"), NULL, BAD_INPUT_FAIL, false, "top level is an array");
  write_text(at("object.json"), "{}");
  open_fails(at("object.json"), NULL, BAD_INPUT_FAIL, false, "no 'images' array");
  write_text(at("nocats.json"), "{\"images\": []}");
  open_fails(at("nocats.json"), NULL, BAD_INPUT_FAIL, false, "no 'categories' array");
  write_text(at("mapimages.json"), "{\"images\": {}, \"categories\": []}");
  open_fails(at("mapimages.json"), NULL, BAD_INPUT_SKIP, false, "'images' is an object");
  write_text(at("scalarann.json"), "{\"images\": [], \"annotations\": 3, \"categories\": []}");
  open_fails(at("scalarann.json"), NULL, BAD_INPUT_SKIP, false, "'annotations' is not an array");
  open_fails(at("does_not_exist.json"), NULL, BAD_INPUT_SKIP, false, "cannot open");
  // No annotations section at all (an image-info file) is fine.
  write_text(at("noanns.json"),
             "{\"images\": [{\"id\": 1, \"file_name\": \"a.jpg\", \"width\": 4, \"height\": 4}], \"categories\": []}");
  CocoDataset *ds = open_ok(at("noanns.json"), NULL, BAD_INPUT_FAIL, false);
  ck_assert_int_eq(ds->n_images, 1);
  ck_assert_int_eq(ds->n_anns, 0);
  coco_free(ds);
}
END_TEST

// One bad item in an otherwise valid file (image 1 of 100x80, category 3, one good annotation):
// under fail, an error naming the file and the item; under skip, the item dropped and counted.
typedef struct {
  const char *extra_image;  // appended to "images" (or NULL)
  const char *extra_ann;    // appended to "annotations" (or NULL)
  const char *message;      // expected in the fail-policy error
  size_t counter;           // offsetof(CocoStats, the counter that must be 1 under skip)
  int64_t images, anns;     // left under skip
} BadItemCase;

static const BadItemCase bad_item_cases[] = {
    {NULL, "{\"id\": 5, \"image_id\": 1, \"category_id\": 3}", "annotations[1] (id 5): missing 'bbox'",
     offsetof(CocoStats, malformed_items), 1, 1},
    {NULL, "{\"id\": 5, \"image_id\": 1, \"category_id\": 3, \"bbox\": \"1,2,3,4\"}", "'bbox' has a wrong type",
     offsetof(CocoStats, malformed_items), 1, 1},
    {NULL, "{\"id\": 5, \"image_id\": 1, \"category_id\": 3, \"bbox\": [1, 2, 3]}", "'bbox' has 3 numbers",
     offsetof(CocoStats, malformed_items), 1, 1},
    {NULL, "{\"id\": 5, \"image_id\": 1, \"category_id\": 3, \"bbox\": [1, 2, \"3\", 4]}", "not a number",
     offsetof(CocoStats, malformed_items), 1, 1},
    {NULL, "{\"id\": 5, \"image_id\": 1, \"category_id\": \"3\", \"bbox\": [1, 2, 3, 4]}",
     "'category_id' has a wrong type", offsetof(CocoStats, malformed_items), 1, 1},
    {NULL, "{\"id\": 5, \"image_id\": 1, \"category_id\": 3, \"bbox\": [1, 2, 3, 4], \"iscrowd\": 2}", "'iscrowd'",
     offsetof(CocoStats, malformed_items), 1, 1},
    {NULL, "42", "annotations[1]: not a JSON object", offsetof(CocoStats, malformed_items), 1, 1},
    {NULL, "{\"id\": 5, \"image_id\": 1, \"category_id\": 3, \"bbox\": [10, 10, 0, 5]}",
     "annotations[1] (id 5, image_id 1): box [10, 10, 0, 5] has no area", offsetof(CocoStats, zero_size_boxes), 1, 1},
    {NULL, "{\"id\": 5, \"image_id\": 1, \"category_id\": 3, \"bbox\": [10, 10, -3, 5]}",
     "has a negative width or height", offsetof(CocoStats, zero_size_boxes), 1, 1},
    {NULL, "{\"id\": 5, \"image_id\": 1, \"category_id\": 3, \"bbox\": [200, 10, 5, 5]}",
     "box [200, 10, 5, 5] lies outside the 100x80 image", offsetof(CocoStats, out_of_image_boxes), 1, 1},
    {NULL, "{\"id\": 5, \"image_id\": 1, \"category_id\": 3, \"bbox\": [-9, 10, 5, 5]}", "lies outside",
     offsetof(CocoStats, out_of_image_boxes), 1, 1},
    {NULL, "{\"id\": 5, \"image_id\": 1, \"category_id\": 4, \"bbox\": [1, 2, 3, 4]}",
     "annotations[1] (id 5, image_id 1): unknown category_id 4", offsetof(CocoStats, unknown_category_ids), 1, 1},
    {NULL, "{\"id\": 5, \"image_id\": 2, \"category_id\": 3, \"bbox\": [1, 2, 3, 4]}",
     "(id 5, image_id 2): image_id not in 'images'", offsetof(CocoStats, unknown_image_ids), 1, 1},
    {"{\"id\": 1, \"file_name\": \"dup.jpg\", \"width\": 10, \"height\": 10}", NULL,
     "images[1] (id 1): duplicate image id", offsetof(CocoStats, duplicate_ids), 1, 1},
    {"{\"id\": 2, \"file_name\": \"b.jpg\", \"height\": 10}", NULL, "images[1] (id 2): missing 'width'",
     offsetof(CocoStats, malformed_items), 1, 1},
    {"{\"id\": 2, \"file_name\": \"b.jpg\", \"width\": 0, \"height\": 10}", NULL, "'width' 0 outside",
     offsetof(CocoStats, malformed_items), 1, 1},
    {"[1, 2]", NULL, "images[1]: an array, not a JSON object", offsetof(CocoStats, malformed_items), 1, 1},
};

START_TEST(bad_items_fail_or_skip) {
  const BadItemCase *c = &bad_item_cases[_i];
  char json[2048];
  snprintf(json, sizeof json,
           "{\"images\": [{\"id\": 1, \"file_name\": \"a.jpg\", \"width\": 100, \"height\": 80}%s%s],\n"
           " \"annotations\": [{\"id\": 4, \"image_id\": 1, \"category_id\": 3, \"bbox\": [1, 2, 30, 40]}%s%s],\n"
           " \"categories\": [{\"id\": 3, \"name\": \"c\"}]}",
           c->extra_image ? ", " : "", c->extra_image ? c->extra_image : "", c->extra_ann ? ", " : "",
           c->extra_ann ? c->extra_ann : "");
  write_text(at("ann.json"), json);
  open_fails(at("ann.json"), NULL, BAD_INPUT_FAIL, false, c->message);
  CocoDataset *ds = open_ok(at("ann.json"), NULL, BAD_INPUT_SKIP, false);
  ck_assert_int_eq(*(const int64_t *)((const char *)&ds->stats + c->counter), 1);
  ck_assert_int_eq(ds->n_images, c->images);
  ck_assert_int_eq(ds->n_anns, c->anns);
  ck_assert_int_eq(ds->anns[0].id, 4);  // the good annotation survives
  ck_assert_int_eq(ds->stats.skipped_annotations + ds->stats.skipped_images, 1);
  coco_free(ds);
}
END_TEST

// Image files checked at open: missing, not an image, or a size other than the file states.
START_TEST(missing_and_corrupt_images_at_open) {
  ck_assert_int_eq(mkdir(at("img"), 0755), 0);
  write_png(at("img/good.png"), 12, 10, 100);
  write_text(at("img/garbage.jpg"), "this is not an image at all");
  write_png(at("img/small.png"), 6, 10, 50);  // the file says 12x10
  write_text(at("ann.json"),
             "{\"images\": [{\"id\": 1, \"file_name\": \"good.png\", \"width\": 12, \"height\": 10},\n"
             "  {\"id\": 2, \"file_name\": \"missing.jpg\", \"width\": 12, \"height\": 10},\n"
             "  {\"id\": 3, \"file_name\": \"garbage.jpg\", \"width\": 12, \"height\": 10},\n"
             "  {\"id\": 4, \"file_name\": \"small.png\", \"width\": 12, \"height\": 10}],\n"
             " \"annotations\": [{\"id\": 1, \"image_id\": 1, \"category_id\": 1, \"bbox\": [1, 1, 5, 5]},\n"
             "  {\"id\": 2, \"image_id\": 4, \"category_id\": 1, \"bbox\": [1, 1, 5, 5]},\n"
             "  {\"id\": 3, \"image_id\": 2, \"category_id\": 1, \"bbox\": [1, 1, 5, 5]}],\n"
             " \"categories\": [{\"id\": 1, \"name\": \"c\"}]}");
  open_fails(at("ann.json"), at("img"), BAD_INPUT_FAIL, true, "missing.jpg: missing image file: No such file");
  // Without the check, open succeeds (the loader meets the problems later).
  CocoDataset *ds = open_ok(at("ann.json"), at("img"), BAD_INPUT_FAIL, false);
  ck_assert_int_eq(ds->n_images, 4);
  coco_free(ds);
  ds = open_ok(at("ann.json"), at("img"), BAD_INPUT_SKIP, true);
  ck_assert_int_eq(ds->n_images, 1);
  ck_assert_int_eq(ds->images[0].id, 1);
  ck_assert_int_eq(ds->n_anns, 1);
  ck_assert_int_eq(ds->anns[0].image_index, 0);
  ck_assert_int_eq(ds->stats.missing_images, 1);
  ck_assert_int_eq(ds->stats.corrupt_images, 2);
  ck_assert_int_eq(ds->stats.skipped_images, 3);
  ck_assert_int_eq(ds->stats.skipped_annotations, 2);
  coco_free(ds);
  // The wrong size alone, under fail: the message gives both sizes.
  write_text(at("ann2.json"),
             "{\"images\": [{\"id\": 4, \"file_name\": \"small.png\", \"width\": 12, \"height\": 10}],"
             " \"categories\": []}");
  open_fails(at("ann2.json"), at("img"), BAD_INPUT_FAIL, true, "image is 6x10 but the annotation file says 12x10");
  // Width and height swapped (an EXIF-rotated photo, annotated upright): the message says so.
  write_text(at("ann3.json"),
             "{\"images\": [{\"id\": 4, \"file_name\": \"small.png\", \"width\": 10, \"height\": 6}],"
             " \"categories\": []}");
  open_fails(at("ann3.json"), at("img"), BAD_INPUT_FAIL, true,
             "image is 6x10 but the annotation file says 10x6: width and height are swapped, as when the file's EXIF "
             "orientation tag rotates it");
}
END_TEST

// --- images --------------------------------------------------------------------------------------

START_TEST(decode_progressive_grey_png) {
  DataError err;
  Image img;
  // Progressive JPEG, in memory and from a file.
  ck_assert_int_eq(image_decode_memory(progressive_jpeg_16x16, sizeof progressive_jpeg_16x16, "p.jpg", &img, &err),
                   DATA_OK);
  ck_assert_int_eq(img.w, 16);
  ck_assert_int_eq(img.h, 16);
  const int expect[4][3] = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {255, 255, 255}};
  for (int q = 0; q < 4; q++) {
    int x = (q % 2) ? 12 : 3, y = (q / 2) ? 12 : 3;  // away from the quadrant edges
    for (int c = 0; c < 3; c++) ck_assert_int_le(abs(img.data[(y * 16 + x) * 3 + c] - expect[q][c]), 12);
  }
  image_free(&img);
  // The same bytes cut short: a truncated JPEG, rejected with the file's name.
  write_file(at("cut.jpg"), progressive_jpeg_16x16, sizeof progressive_jpeg_16x16 - 40);
  ck_assert_int_eq(image_decode_file(at("cut.jpg"), &img, &err), DATA_ERROR);
  ck_assert_ptr_nonnull(strstr(err.msg, "cut.jpg: truncated or corrupt JPEG"));
  ck_assert_ptr_null(img.data);
  // Greyscale JPEG and PNG come out as RGB with equal channels.
  uint8_t grey[8 * 6];
  for (int i = 0; i < 48; i++) grey[i] = (uint8_t)(i * 5);
  ck_assert_int_eq(image_write_jpeg(at("grey.jpg"), grey, 8, 6, 1, 95, &err), DATA_OK);
  ck_assert_int_eq(image_decode_file(at("grey.jpg"), &img, &err), DATA_OK);
  ck_assert_int_eq(img.w, 8);
  for (int i = 0; i < 48; i++) {
    ck_assert_int_eq(img.data[i * 3], img.data[i * 3 + 1]);
    ck_assert_int_eq(img.data[i * 3], img.data[i * 3 + 2]);
  }
  image_free(&img);
  ck_assert_int_eq(image_write_png(at("grey.png"), grey, 8, 6, 1, &err), DATA_OK);
  ck_assert_int_eq(image_decode_file(at("grey.png"), &img, &err), DATA_OK);
  for (int i = 0; i < 48; i++)
    for (int c = 0; c < 3; c++) ck_assert_int_eq(img.data[i * 3 + c], grey[i]);  // lossless
  image_free(&img);
  int w, h;
  ck_assert_int_eq(image_read_header(at("grey.png"), &w, &h, &err), DATA_OK);
  ck_assert(w == 8 && h == 6);
  // Not an image; an empty file; no file.
  write_text(at("text.jpg"), "GIF89a? no");
  ck_assert_int_eq(image_decode_file(at("text.jpg"), &img, &err), DATA_ERROR);
  ck_assert_ptr_nonnull(strstr(err.msg, "text.jpg: corrupt or unsupported image"));
  write_text(at("empty.png"), "");
  ck_assert_int_eq(image_decode_file(at("empty.png"), &img, &err), DATA_ERROR);
  ck_assert_ptr_nonnull(strstr(err.msg, "empty.png: empty image file"));
  ck_assert_int_eq(image_decode_file(at("nope.png"), &img, &err), DATA_ERROR);
  ck_assert_ptr_nonnull(strstr(err.msg, "nope.png: cannot open image"));
  // A JPEG whose scan data is corrupt but whose markers are intact decodes (as with libjpeg and
  // PIL); one whose header is damaged does not.
  uint8_t broken[sizeof progressive_jpeg_16x16];
  memcpy(broken, progressive_jpeg_16x16, sizeof broken);
  broken[3] = 0x00;  // the APP0 marker becomes 0xFF00: the marker chain breaks
  ck_assert_int_eq(image_decode_memory(broken, sizeof broken, "broken.jpg", &img, &err), DATA_ERROR);
  ck_assert_ptr_nonnull(strstr(err.msg, "broken.jpg"));
}
END_TEST

// Limits on what an image file can ask for, and files that would reach bugs of Debian's
// stb_image 2.27 (found by fuzz/fuzz_image.c): each refused with the file's name.
static void decode_fails(const char *path, const char *expect) {
  Image img;
  DataError err = {{0}};
  ck_assert_int_eq(image_decode_file(path, &img, &err), DATA_ERROR);
  ck_assert_ptr_null(img.data);
  ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, expect), "expected '%s' in: %s", expect, err.msg);
}

START_TEST(hostile_images) {
  DataError err;
  uint8_t grey[8 * 6] = {0};
  ck_assert_int_eq(image_write_png(at("g.png"), grey, 8, 6, 1, &err), DATA_OK);
  size_t n;
  uint8_t *png = read_file(at("g.png"), &n);
  // A bomb: IHDR (at 16) says 20000 x 20000, the data stays a few bytes.
  uint8_t *bomb = malloc(n);
  memcpy(bomb, png, n);
  const uint8_t big[8] = {0, 0, 0x4e, 0x20, 0, 0, 0x4e, 0x20};
  memcpy(bomb + 16, big, 8);
  write_file(at("bomb.png"), bomb, n);
  decode_fails(at("bomb.png"), "20000x20000 = 400000000 pixels, more than the limit of 178956970");
  int w, h;
  ck_assert_int_eq(image_read_header(at("bomb.png"), &w, &h, &err), DATA_ERROR);
  ck_assert_ptr_nonnull(strstr(err.msg, "more than the limit"));
  // A lower limit, as an embedder may set.
  image_set_max_pixels(40);
  decode_fails(at("g.png"), "8x6 = 48 pixels, more than the limit of 40");
  image_set_max_pixels(IMAGE_MAX_PIXELS);
  Image img;
  ck_assert_int_eq(image_decode_file(at("g.png"), &img, &err), DATA_OK);
  image_free(&img);
  // An IDAT chunk declaring 2 GiB in a file of a hundred bytes (stb_image allocates it first).
  memcpy(bomb, png, n);
  size_t idat = 0;
  for (size_t i = 8; i + 8 <= n; i++)
    if (!memcmp(png + i + 4, "IDAT", 4)) idat = i;
  ck_assert_uint_gt(idat, 0);
  const uint8_t len[4] = {0x7f, 0xff, 0xff, 0xf0};
  memcpy(bomb + idat, len, 4);
  write_file(at("idat.png"), bomb, n);
  decode_fails(at("idat.png"), "truncated or corrupt PNG");
  write_file(at("cut.png"), png, n - 12);  // no IEND chunk
  decode_fails(at("cut.png"), "truncated or corrupt PNG");
  free(bomb);
  free(png);

  // JPEG Huffman tables: more than 256 codes (stb_image 2.27 writes past its size[257] array),
  // and a scan selecting a table no DHT defined (it reads the uninitialised table).
  uint8_t jpg[sizeof progressive_jpeg_16x16];
  size_t dht = 0, sos = 0;
  for (size_t i = 0; i + 1 < sizeof jpg; i++) {
    if (!dht && progressive_jpeg_16x16[i] == 0xFF && progressive_jpeg_16x16[i + 1] == 0xC4) dht = i;
    if (!sos && progressive_jpeg_16x16[i] == 0xFF && progressive_jpeg_16x16[i + 1] == 0xDA) sos = i;
  }
  ck_assert(dht && sos);
  memcpy(jpg, progressive_jpeg_16x16, sizeof jpg);
  memset(jpg + dht + 5, 0xFF, 16);  // the 16 code counts of the first table
  write_file(at("dht.jpg"), jpg, sizeof jpg);
  decode_fails(at("dht.jpg"), "a Huffman table with more than 256 codes");
  memcpy(jpg, progressive_jpeg_16x16, sizeof jpg);
  jpg[sos + 6] = 0x30;  // the first component's DC table: 3, never defined
  write_file(at("undef.jpg"), jpg, sizeof jpg);
  decode_fails(at("undef.jpg"), "a scan uses a Huffman table that is not defined");
  // Fill bytes before the start-of-image marker: stb_image takes it as a JPEG, so does the check.
  uint8_t filled[sizeof progressive_jpeg_16x16 + 3] = {0xFF, 0xFF, 0xFF};
  memcpy(filled + 3, progressive_jpeg_16x16, sizeof progressive_jpeg_16x16);
  filled[3 + dht + 5] = 0xFF, filled[3 + dht + 6] = 0xFF;
  write_file(at("fill.jpg"), filled, sizeof filled);
  decode_fails(at("fill.jpg"), "a Huffman table with more than 256 codes");

  // A thin image resized without max_size (the crop branch) stops at IMAGE_MAX_SIDE.
  aug_resize_size(1, 2000, 400, 0, false, &w, &h);
  ck_assert_int_eq(h, IMAGE_MAX_SIDE);
  ck_assert_int_ge(w, 1);
  aug_resize_size(2000, 3, 400, 0, false, &w, &h);
  ck_assert_int_eq(w, IMAGE_MAX_SIDE);
  ck_assert_int_eq(h, 49);  // 400 * 32768 / 266666
}
END_TEST

// Limits of instances files (datasets/coco.h): JSON depth (fatal), string length (a bad item).
START_TEST(hostile_coco) {
  char *json = malloc(20000);
  size_t n = (size_t)snprintf(json, 20000, "{\"info\": ");
  for (int i = 0; i < 100; i++) json[n++] = '[';
  for (int i = 0; i < 100; i++) json[n++] = ']';
  n += (size_t)snprintf(json + n, 20000 - n, ", \"images\": [], \"annotations\": [], \"categories\": []}");
  write_file(at("deep.json"), json, n);
  open_fails(at("deep.json"), NULL, BAD_INPUT_SKIP, false, "nested deeper than the limit of 64 levels");
  n = (size_t)snprintf(json, 20000, "{\"images\": [{\"id\": 1, \"width\": 9, \"height\": 9, \"file_name\": \"");
  for (int i = 0; i < COCO_MAX_STRING_BYTES + 1; i++) json[n++] = 'a';
  n += (size_t)snprintf(json + n, 20000 - n, "\"}], \"annotations\": [], \"categories\": []}");
  write_file(at("long.json"), json, n);
  open_fails(at("long.json"), NULL, BAD_INPUT_FAIL, false,
             "images[0] (id 1): 'file_name' has 4097 bytes, more than the limit of 4096");
  CocoDataset *ds = open_ok(at("long.json"), NULL, BAD_INPUT_SKIP, false);
  ck_assert_int_eq(ds->n_images, 0);
  ck_assert_int_eq(ds->stats.malformed_items, 1);
  coco_free(ds);
  // A NUL inside a name (found by fuzz/fuzz_coco.c): "a\u0000b.jpg" would have named "a".
  write_text(at("nul.json"),
             "{\"images\": [{\"id\": 1, \"width\": 9, \"height\": 9, \"file_name\": \"a\\u0000b.jpg\"}],"
             " \"annotations\": [], \"categories\": []}");
  open_fails(at("nul.json"), NULL, BAD_INPUT_FAIL, false, "images[0] (id 1): 'file_name' contains a NUL character");
  free(json);
}
END_TEST

static Image test_pattern(int w, int h) {
  Image img = image_alloc(w, h);
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++) {
      uint8_t *p = img.data + ((size_t)y * w + x) * 3;
      p[0] = (uint8_t)((x * 37 + y * 11) % 256);
      p[1] = (uint8_t)((x * 5 + y * 53 + 7) % 256);
      p[2] = (uint8_t)((x * x * 3 + y * 29) % 256);
    }
  return img;
}

START_TEST(resize_matches_pillow) {
  struct {
    int w, h, ow, oh;
    const uint8_t *expect;
  } cases[] = {{7, 5, 4, 3, pillow_7x5_to_4x3}, {7, 5, 11, 8, pillow_7x5_to_11x8}, {5, 7, 3, 9, pillow_5x7_to_3x9}};
  for (int k = 0; k < 3; k++) {
    Image src = test_pattern(cases[k].w, cases[k].h);
    Image out = image_resize_bilinear(&src, cases[k].ow, cases[k].oh);
    for (int i = 0; i < cases[k].ow * cases[k].oh * 3; i++)
      ck_assert_msg(out.data[i] == cases[k].expect[i], "case %d byte %d: %d, Pillow %d", k, i, out.data[i],
                    cases[k].expect[i]);
    image_free(&src);
    image_free(&out);
  }
  // A constant image stays constant at any size; the same size is a copy.
  uint8_t c[3] = {17, 200, 99};
  Image flat = solid_image(13, 9, c, 0, 0, 0, 0, c);
  Image big = image_resize_bilinear(&flat, 40, 3), same = image_resize_bilinear(&flat, 13, 9);
  for (int i = 0; i < 40 * 3; i++) ck_assert_int_eq(big.data[i], c[i % 3]);
  ck_assert_mem_eq(same.data, flat.data, 13 * 9 * 3);
  image_free(&flat);
  image_free(&big);
  image_free(&same);
}
END_TEST

START_TEST(flip_and_crop_pixels) {
  Image img = test_pattern(5, 3);
  Image orig = test_pattern(5, 3);
  image_hflip(&img);
  for (int y = 0; y < 3; y++)
    for (int x = 0; x < 5; x++) ck_assert_mem_eq(img.data + (y * 5 + x) * 3, orig.data + (y * 5 + 4 - x) * 3, 3);
  Image crop = image_crop(&orig, 1, 2, 2, 3);  // rows 1..2, columns 2..4
  ck_assert(crop.w == 3 && crop.h == 2);
  for (int y = 0; y < 2; y++)
    for (int x = 0; x < 3; x++) ck_assert_mem_eq(crop.data + (y * 3 + x) * 3, orig.data + ((y + 1) * 5 + x + 2) * 3, 3);
  image_free(&img);
  image_free(&orig);
  image_free(&crop);
}
END_TEST

// --- augmentation arithmetic ---------------------------------------------------------------------

START_TEST(resize_size_as_reference) {
  int w, h;
  aug_resize_size(640, 480, 800, 1333, false, &w, &h);  // int(800 * 640 / 480) = int(1066.67)
  ck_assert(w == 1066 && h == 800);
  aug_resize_size(480, 640, 800, 1333, false, &w, &h);
  ck_assert(w == 800 && h == 1066);
  aug_resize_size(2000, 500, 800, 1333, false, &w, &h);  // 4 * 800 > 1333: size = round(333.25) = 333
  ck_assert(w == 1332 && h == 333);
  aug_resize_size(1000, 500, 800, 1333, false, &w, &h);  // round(666.5) = 666: Python rounds halves to even
  ck_assert(w == 1332 && h == 666);
  aug_resize_size(1000, 500, 800, 0, false, &w, &h);  // no max size
  ck_assert(w == 1600 && h == 800);
  aug_resize_size(600, 800, 600, 1333, false, &w, &h);  // already the size: unchanged
  ck_assert(w == 600 && h == 800);
  aug_resize_size(333, 333, 320, 512, false, &w, &h);
  ck_assert(w == 320 && h == 320);
  aug_resize_size(427, 640, 320, 512, false, &w, &h);  // int(320 * 640 / 427) = int(479.63)
  ck_assert(w == 320 && h == 479);
}
END_TEST

START_TEST(box_arithmetic) {
  Target t = {0};
  float b0[4] = {10, 20, 30, 40}, b1[4] = {0, 0, 100, 50}, b2[4] = {80, 5, 95, 45};
  target_push(&t, b0, 1);
  target_push(&t, b1, 2);
  target_push(&t, b2, 3);
  target_hflip(&t, 100);  // x0' = w - x1, x1' = w - x0
  ck_assert_float_eq(t.boxes[0], 70);
  ck_assert_float_eq(t.boxes[1], 20);
  ck_assert_float_eq(t.boxes[2], 90);
  ck_assert_float_eq(t.boxes[3], 40);
  ck_assert_float_eq(t.boxes[4], 0);
  ck_assert_float_eq(t.boxes[6], 100);
  target_hflip(&t, 100);  // twice is the identity
  ck_assert_float_eq(t.boxes[0], 10);
  ck_assert_float_eq(t.boxes[2], 30);
  target_resize(&t, 100, 50, 200, 25);  // x * 2, y / 2
  ck_assert_float_eq(t.boxes[0], 20);
  ck_assert_float_eq(t.boxes[1], 10);
  ck_assert_float_eq(t.boxes[2], 60);
  ck_assert_float_eq(t.boxes[3], 20);
  target_resize(&t, 200, 25, 100, 50);
  // Crop rows [10, 40), columns [15, 85): box 0 clipped on the left, box 1 (whole image) becomes
  // the whole crop, box 2 (x from 80) keeps 5 columns.
  target_crop(&t, 10, 15, 30, 70);
  ck_assert_int_eq(t.n, 3);
  const float want[3][4] = {{0, 10, 15, 30}, {0, 0, 70, 30}, {65, 0, 70, 30}};
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 4; k++) ck_assert_float_eq(t.boxes[i * 4 + k], want[i][k]);
  ck_assert_int_eq(t.labels[2], 3);
  // A crop that misses box 0 and box 2 entirely drops them; labels follow their boxes.
  target_crop(&t, 0, 20, 30, 40);
  ck_assert_int_eq(t.n, 1);
  ck_assert_int_eq(t.labels[0], 2);
  ck_assert_float_eq(t.boxes[2], 40);
  // Normalized cxcywh of the survivor in the 40 x 30 crop.
  float out[4];
  target_to_cxcywh_normalized(&t, 40, 30, out);
  ck_assert_float_eq(out[0], 0.5f);
  ck_assert_float_eq(out[1], 0.5f);
  ck_assert_float_eq(out[2], 1.0f);
  ck_assert_float_eq(out[3], 1.0f);
  target_free(&t);
}
END_TEST

// The extent of the object's pixels (strong red) in an augmented image.
static bool red_extent(const Image *img, int *x0, int *y0, int *x1, int *y1) {
  *x0 = img->w, *y0 = img->h, *x1 = -1, *y1 = -1;
  for (int y = 0; y < img->h; y++)
    for (int x = 0; x < img->w; x++) {
      const uint8_t *p = img->data + ((size_t)y * img->w + x) * 3;
      if (p[0] > 128 && p[1] < 128) {
        if (x < *x0) *x0 = x;
        if (x > *x1) *x1 = x;
        if (y < *y0) *y0 = y;
        if (y > *y1) *y1 = y;
      }
    }
  return *x1 >= 0;
}

// Whatever flip, resize and crop do to the image, the box stays on the object: its edges are
// within a pixel (bilinear blending) of the red pixels' extent.
START_TEST(augmentation_keeps_boxes_on_objects) {
  const uint8_t bg[3] = {60, 160, 60}, red[3] = {255, 0, 0};
  AugConfig train = aug_config_scaled(true, 160, 266), val = aug_config_scaled(false, 160, 266);
  ck_assert_int_eq(aug_config_validate(&train, NULL), DATA_OK);
  ck_assert_int_eq(train.scales[0], 96);
  ck_assert_int_eq(train.crop_min, 77);
  int kept = 0, dropped = 0, cropped = 0, flipped_side = 0;
  for (int seed = 0; seed < 80; seed++) {
    const AugConfig *cfg = seed < 76 ? &train : &val;
    Image img = solid_image(200, 150, bg, 130, 40, 190, 100, red);  // the object: x [130, 190), y [40, 100)
    Target t = {0};
    float box[4] = {130, 40, 190, 100};
    target_push(&t, box, 7);
    Rng rng = loader_sample_rng(1234, 0, seed);
    aug_apply(&img, &t, cfg, &rng);
    ck_assert_int_le(img.w > img.h ? img.w : img.h, 266 + 2);  // max_size, up to the reference's rounding
    int x0, y0, x1, y1;
    bool visible = red_extent(&img, &x0, &y0, &x1, &y1);
    if (t.n == 0) {
      ck_assert_msg(!visible, "seed %d: the box was dropped but the object is visible", seed);
      dropped++;
    } else {
      ck_assert_int_eq(t.labels[0], 7);
      const float *b = t.boxes;
      // Inside the image, up to float32 rounding of the resize ratio (as the reference).
      ck_assert(b[0] >= 0 && b[1] >= 0 && b[2] <= img.w + 1e-3f && b[3] <= img.h + 1e-3f && b[2] > b[0] && b[3] > b[1]);
      if (!visible) {  // a sliver thinner than a pixel after the crop
        ck_assert(b[2] - b[0] < 2 || b[3] - b[1] < 2);
      } else {
        ck_assert_msg(fabsf(b[0] - x0) <= 1.01f && fabsf(b[1] - y0) <= 1.01f && fabsf(b[2] - (x1 + 1)) <= 1.01f &&
                          fabsf(b[3] - (y1 + 1)) <= 1.01f,
                      "seed %d: box [%g %g %g %g], object pixels [%d %d %d %d] in %dx%d", seed, b[0], b[1], b[2], b[3],
                      x0, y0, x1 + 1, y1 + 1, img.w, img.h);
        kept++;
        if (b[2] - b[0] < (b[3] - b[1]) * 0.99f) cropped++;  // the object is square: narrower = cut by the crop
        if (b[0] < img.w / 2.0f - 1) flipped_side++;         // the object started on the right
      }
    }
    image_free(&img);
    target_free(&t);
  }
  ck_assert_int_gt(kept, 40);
  ck_assert_int_gt(cropped, 3);        // the crop branch ran and cut the object
  ck_assert_int_gt(flipped_side, 10);  // flips ran
  (void)dropped;
}
END_TEST

// --- samples and the loader ----------------------------------------------------------------------

// Crowd annotations stay in the dataset for evaluation but are never targets; boxes partly outside
// the image are clipped as the reference does.
START_TEST(crowd_kept_for_eval_not_targets) {
  ck_assert_int_eq(mkdir(at("img"), 0755), 0);
  write_png(at("img/a.png"), 20, 10, 30);
  write_text(at("ann.json"),
             "{\"images\": [{\"id\": 5, \"file_name\": \"a.png\", \"width\": 20, \"height\": 10}],\n"
             " \"annotations\": [{\"id\": 1, \"image_id\": 5, \"category_id\": 9, \"bbox\": [2, 3, 8, 4]},\n"
             "  {\"id\": 2, \"image_id\": 5, \"category_id\": 4, \"bbox\": [0, 0, 20, 10], \"iscrowd\": 1},\n"
             "  {\"id\": 3, \"image_id\": 5, \"category_id\": 4, \"bbox\": [15.5, -2, 10, 5]}],\n"
             " \"categories\": [{\"id\": 4, \"name\": \"x\"}, {\"id\": 9, \"name\": \"y\"}]}");
  CocoDataset *ds = open_ok(at("ann.json"), at("img"), BAD_INPUT_FAIL, true);
  ck_assert_int_eq(ds->n_anns, 3);
  ck_assert_int_eq(ds->stats.crowd_annotations, 1);
  ck_assert_int_eq(ds->stats.clamped_boxes, 1);
  Image img = {0};
  Target t = {0};
  DataError err;
  ck_assert_int_eq(coco_load_sample(ds, 0, &img, &t, &err), DATA_OK);
  ck_assert(img.w == 20 && img.h == 10);
  ck_assert_int_eq(t.n, 2);  // the crowd box is not a target
  ck_assert_int_eq(t.labels[0], 9);
  ck_assert_int_eq(t.labels[1], 4);
  const float want[2][4] = {{2, 3, 10, 7}, {15.5f, 0, 20, 3}};  // xyxy, the second clipped to the image
  for (int i = 0; i < 2; i++)
    for (int k = 0; k < 4; k++) ck_assert_float_eq(t.boxes[i * 4 + k], want[i][k]);
  image_free(&img);
  target_free(&t);
  coco_free(ds);
}
END_TEST

// A 20x10 PNG (id 1, one box) and a 10x14 one (id 2), listed in the other order.
static CocoDataset *two_pngs(void) {
  ck_assert_int_eq(mkdir(at("img"), 0755), 0);
  write_png(at("img/wide.png"), 20, 10, 200);
  write_png(at("img/tall.png"), 10, 14, 60);
  write_text(at("ann.json"),
             "{\"images\": [{\"id\": 2, \"file_name\": \"tall.png\", \"width\": 10, \"height\": 14},\n"
             "  {\"id\": 1, \"file_name\": \"wide.png\", \"width\": 20, \"height\": 10}],\n"
             " \"annotations\": [{\"id\": 1, \"image_id\": 1, \"category_id\": 3, \"bbox\": [2, 3, 8, 4]}],\n"
             " \"categories\": [{\"id\": 3, \"name\": \"c\"}]}");
  CocoDataset *ds = open_ok(at("ann.json"), at("img"), BAD_INPUT_FAIL, true);
  return ds;
}

// pad_multiple rounds the padded size up (14 x 20 -> 16 x 24 at 8); the extra rows and columns are
// padding like the rest (mask 1, image 0), the targets keep the unpadded sizes; 0 and 257 are refused.
START_TEST(batch_pad_multiple) {
  CocoDataset *ds = two_pngs();
  LoaderConfig cfg = loader_config_default(false);
  ck_assert_int_eq(cfg.pad_multiple, 1);
  cfg.aug = aug_config_scaled(false, 10, 1000);
  cfg.num_workers = 0;
  DataLoader *L;
  DataError err;
  for (int bad = 0; bad < 2; bad++) {
    cfg.pad_multiple = bad ? 257 : 0;
    ck_assert_int_eq(loader_create(ds, &cfg, (LoaderPosition){0, 0}, &L, &err), DATA_ERROR);
    ck_assert_ptr_nonnull(strstr(err.msg, "pad multiple"));
  }
  cfg.pad_multiple = 8;
  ck_assert_int_eq(loader_create(ds, &cfg, (LoaderPosition){0, 0}, &L, &err), DATA_OK);
  const Batch *b;
  ck_assert_int_eq(loader_next(L, &b, &err), DATA_OK);
  ck_assert(b->size == 2 && b->h == 16 && b->w == 24);
  for (int i = 0; i < 2; i++) {
    const BatchTarget *t = &b->targets[i];
    ck_assert(t->w == (i ? 10 : 20) && t->h == (i ? 14 : 10));
    int64_t valid = 0;
    for (int y = 0; y < b->h; y++)
      for (int x = 0; x < b->w; x++) {
        bool inside = y < t->h && x < t->w;
        valid += inside;
        ck_assert_int_eq(b->mask[((size_t)i * b->h + y) * b->w + x], inside ? 0 : 1);
        for (int c = 0; c < 3 && !inside; c++)
          ck_assert_float_eq(b->images[(((size_t)i * b->h + y) * b->w + x) * 3 + c], 0.0f);
      }
    ck_assert_int_eq(valid, (int64_t)t->w * t->h);
  }
  loader_free(L);
  coco_free(ds);
}
END_TEST

// Two PNGs of different sizes, no resize (val, shortest side already val_size): the batch pads
// bottom/right with 0, the mask marks exactly the padding, pixels are (v/255 - mean)/std.
START_TEST(batch_padding_mask_normalization) {
  CocoDataset *ds = two_pngs();
  LoaderConfig cfg = loader_config_default(false);
  cfg.aug = aug_config_scaled(false, 10, 1000);
  cfg.num_workers = 1;
  DataLoader *L;
  DataError err;
  ck_assert_int_eq(loader_create(ds, &cfg, (LoaderPosition){0, 0}, &L, &err), DATA_OK);
  ck_assert_int_eq(loader_batches_per_epoch(L), 1);
  const Batch *b;
  ck_assert_int_eq(loader_next(L, &b, &err), DATA_OK);
  ck_assert_int_eq(b->size, 2);
  ck_assert(b->h == 14 && b->w == 20);
  ck_assert(b->epoch == 0 && b->index == 0);
  const BatchTarget *wide = &b->targets[0], *tall = &b->targets[1];  // dataset order: id 1, id 2
  ck_assert_int_eq(wide->image_id, 1);
  ck_assert_int_eq(tall->image_id, 2);
  ck_assert(wide->w == 20 && wide->h == 10 && wide->orig_w == 20 && wide->orig_h == 10);
  ck_assert(tall->w == 10 && tall->h == 14);
  ck_assert_int_eq(wide->n, 1);
  ck_assert_int_eq(wide->labels[0], 3);
  // bbox [2, 3, 8, 4] -> xyxy [2, 3, 10, 7] -> cxcywh / (20, 10, 20, 10)
  ck_assert_float_eq(wide->boxes[0], 6.0f / 20);
  ck_assert_float_eq(wide->boxes[1], 5.0f / 10);
  ck_assert_float_eq(wide->boxes[2], 8.0f / 20);
  ck_assert_float_eq(wide->boxes[3], 4.0f / 10);
  ck_assert_int_eq(tall->n, 0);
  const uint8_t shades[2] = {200, 60};
  for (int i = 0; i < 2; i++) {
    const BatchTarget *t = &b->targets[i];
    uint8_t px[3] = {shades[i], (uint8_t)(255 - shades[i]), (uint8_t)(shades[i] / 2)};
    for (int y = 0; y < b->h; y++)
      for (int x = 0; x < b->w; x++) {
        bool inside = y < t->h && x < t->w;
        ck_assert_int_eq(b->mask[((size_t)i * b->h + y) * b->w + x], inside ? 0 : 1);
        for (int c = 0; c < 3; c++) {
          float v = b->images[(((size_t)i * b->h + y) * b->w + x) * 3 + c];  // [B, H, W, 3]
          float want = inside ? ((float)px[c] / 255.0f - cfg.aug.mean[c]) / cfg.aug.std[c] : 0.0f;
          ck_assert_float_eq(v, want);
        }
      }
  }
  // The images as a tensor.
  Tensor *images = batch_images_tensor(b, DEVICE_CPU);
  char s[64];
  ck_assert_str_eq(shape_str(images->shape, s, sizeof s), "[2, 14, 20, 3]");
  ck_assert_mem_eq(images->data, b->images, sizeof(float) * 2 * 3 * 14 * 20);
  tensor_release(images);
  // One pass: the end, and it stays the end.
  ck_assert_int_eq(loader_next(L, &b, &err), LOADER_END);
  ck_assert_int_eq(loader_next(L, &b, &err), LOADER_END);
  loader_free(L);
  coco_free(ds);
}
END_TEST

static CocoDataset *tiny_synth(int n_train, int n_val) {
  SynthConfig sc = synth_config_default();
  sc.out_dir = tmp;
  sc.n_train = n_train;
  sc.n_val = n_val;
  sc.min_side = 64;
  sc.max_side = 96;
  sc.seed = 5;
  DataError err;
  ck_assert_msg(synth_generate(&sc, &err) == DATA_OK, "%s", err.msg);
  return open_ok(at("annotations/instances_train.json"), at("train"), BAD_INPUT_FAIL, true);
}

typedef struct {
  int n;
  Batch b[8];  // deep copies
} BatchLog;

static void copy_batch(Batch *dst, const Batch *src) {
  *dst = *src;
  size_t plane = (size_t)src->h * src->w;
  dst->images = malloc(sizeof(float) * src->size * 3 * plane);
  memcpy(dst->images, src->images, sizeof(float) * src->size * 3 * plane);
  dst->mask = malloc(src->size * plane);
  memcpy(dst->mask, src->mask, src->size * plane);
  dst->targets = malloc(sizeof(BatchTarget) * src->size);
  int total = 0;
  for (int i = 0; i < src->size; i++) total += src->targets[i].n;
  dst->box_pool = malloc(sizeof(float) * 4 * (total + 1));
  dst->label_pool = malloc(sizeof(int64_t) * (total + 1));
  int at_box = 0;
  for (int i = 0; i < src->size; i++) {
    BatchTarget t = src->targets[i];
    memcpy(dst->box_pool + at_box * 4, t.boxes, sizeof(float) * 4 * t.n);
    memcpy(dst->label_pool + at_box, t.labels, sizeof(int64_t) * t.n);
    t.boxes = dst->box_pool + at_box * 4;
    t.labels = dst->label_pool + at_box;
    dst->targets[i] = t;
    at_box += t.n;
  }
}

static void free_log(BatchLog *log) {
  for (int i = 0; i < log->n; i++) {
    free(log->b[i].images);
    free(log->b[i].mask);
    free(log->b[i].targets);
    free(log->b[i].box_pool);
    free(log->b[i].label_pool);
  }
  log->n = 0;
}

static void run_loader(const CocoDataset *ds, LoaderConfig cfg, LoaderPosition start, int n_batches, BatchLog *log) {
  DataLoader *L;
  DataError err;
  ck_assert_msg(loader_create(ds, &cfg, start, &L, &err) == DATA_OK, "%s", err.msg);
  for (int i = 0; i < n_batches; i++) {
    const Batch *b;
    ck_assert_msg(loader_next(L, &b, &err) == DATA_OK, "%s", err.msg);
    copy_batch(&log->b[log->n++], b);
  }
  loader_free(L);
}

static void assert_same_batch(const Batch *a, const Batch *b) {
  ck_assert(a->size == b->size && a->h == b->h && a->w == b->w && a->epoch == b->epoch && a->index == b->index);
  size_t plane = (size_t)a->h * a->w;
  ck_assert_mem_eq(a->images, b->images, sizeof(float) * a->size * 3 * plane);
  ck_assert_mem_eq(a->mask, b->mask, a->size * plane);
  for (int i = 0; i < a->size; i++) {
    const BatchTarget *x = &a->targets[i], *y = &b->targets[i];
    ck_assert(x->image_id == y->image_id && x->n == y->n && x->w == y->w && x->h == y->h);
    if (x->n) {
      ck_assert_mem_eq(x->boxes, y->boxes, sizeof(float) * 4 * x->n);
      ck_assert_mem_eq(x->labels, y->labels, sizeof(int64_t) * x->n);
    }
  }
}

static LoaderConfig small_train_config(int workers) {
  LoaderConfig cfg = loader_config_default(true);
  cfg.batch_size = 3;
  cfg.num_workers = workers;
  cfg.prefetch = workers > 0 ? 2 * workers : 1;
  cfg.aug = aug_config_scaled(true, 64, 107);
  cfg.seed = 99;
  return cfg;
}

// The same batches, bit for bit, with 0, 1 and 4 workers, across an epoch boundary.
START_TEST(loader_same_batches_any_worker_count) {
  CocoDataset *ds = tiny_synth(10, 0);
  BatchLog logs[3] = {{0}};
  const int workers[3] = {0, 1, 4};
  for (int k = 0; k < 3; k++) run_loader(ds, small_train_config(workers[k]), (LoaderPosition){0, 0}, 6, &logs[k]);
  for (int k = 1; k < 3; k++)
    for (int i = 0; i < 6; i++) assert_same_batch(&logs[0].b[i], &logs[k].b[i]);
  // 10 images, batches of 3, drop_last: 3 batches per epoch; batch 3 is epoch 1's first.
  ck_assert(logs[0].b[2].epoch == 0 && logs[0].b[2].index == 2);
  ck_assert(logs[0].b[3].epoch == 1 && logs[0].b[3].index == 0);
  // Each epoch shuffles anew, and an epoch sees 9 distinct images.
  bool same_order = true;
  int64_t seen = 0;
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) {
      same_order &= logs[0].b[i].targets[j].dataset_index == logs[0].b[3 + i].targets[j].dataset_index;
      seen |= (int64_t)1 << logs[0].b[i].targets[j].dataset_index;
    }
  ck_assert(!same_order);
  ck_assert_int_eq(__builtin_popcountll((unsigned long long)seen), 9);
  // Another seed: other batches.
  LoaderConfig other = small_train_config(2);
  other.seed = 100;
  BatchLog log_other = {0};
  run_loader(ds, other, (LoaderPosition){0, 0}, 1, &log_other);
  ck_assert(log_other.b[0].h != logs[0].b[0].h || log_other.b[0].w != logs[0].b[0].w ||
            log_other.b[0].targets[0].dataset_index != logs[0].b[0].targets[0].dataset_index ||
            memcmp(log_other.b[0].images, logs[0].b[0].images, sizeof(float) * 3 * logs[0].b[0].h * logs[0].b[0].w));
  free_log(&log_other);
  for (int k = 0; k < 3; k++) free_log(&logs[k]);
  coco_free(ds);
}
END_TEST

// Workers run in the background; a batch the consumer needs that no worker has started, or one a
// worker has not finished in time, the consumer builds itself (into its spare slot while a worker
// still owns the batch's slot). The batches stay the same bit for bit.
static void check_consumer_builds(const CocoDataset *ds, const BatchLog *reference, int prefetch, int delay_us,
                                  LoaderStats *stats) {
  LoaderConfig cfg = small_train_config(2);
  cfg.prefetch = prefetch;
  cfg.worker_wait_us = 0;  // take over any batch not ready on arrival
  cfg.worker_delay_us = delay_us;
  DataLoader *L;
  DataError err;
  ck_assert_msg(loader_create(ds, &cfg, (LoaderPosition){0, 0}, &L, &err) == DATA_OK, "%s", err.msg);
  if (delay_us) usleep(100000);  // the workers claim the first batches and sit in their delay
  BatchLog log = {0};
  for (int i = 0; i < 8; i++) {
    const Batch *b;
    ck_assert_msg(loader_next(L, &b, &err) == DATA_OK, "%s", err.msg);
    copy_batch(&log.b[log.n++], b);
    assert_same_batch(&reference->b[i], &log.b[i]);
  }
  *stats = loader_stats(L);
  if (delay_us) {  // a seek while workers still hold abandoned batches, then the same batches again
    ck_assert(loader_seek(L, (LoaderPosition){0, 1}, &err) == DATA_OK);
    const Batch *b;
    ck_assert_msg(loader_next(L, &b, &err) == DATA_OK, "%s", err.msg);
    assert_same_batch(&reference->b[1], b);
  }
  loader_free(L);
  free_log(&log);
}

START_TEST(loader_consumer_builds_what_workers_have_not) {
  CocoDataset *ds = tiny_synth(10, 0);
  BatchLog reference = {0};
  run_loader(ds, small_train_config(0), (LoaderPosition){0, 0}, 8, &reference);
  LoaderStats st;
  // One slot: the consumer frees it and asks for the next batch under one lock, so it always finds
  // the next batch unclaimed (workers can claim only batch 0).
  check_consumer_builds(ds, &reference, 1, 0, &st);
  ck_assert_int_ge(st.consumer_builds, 7);
  // Slow workers (200 ms before each batch) holding every slot: the consumer takes their batches
  // over, and builds a batch whose slot a worker still owns into the spare.
  check_consumer_builds(ds, &reference, 4, 200000, &st);
  ck_assert_int_ge(st.taken_over, 1);
  ck_assert_int_gt(st.consumer_builds, st.taken_over);
  free_log(&reference);
  coco_free(ds);
}
END_TEST

// A run resumed from a saved position sees the batches an uninterrupted run sees; seek rewinds.
START_TEST(loader_resumes_at_saved_position) {
  CocoDataset *ds = tiny_synth(10, 0);
  LoaderConfig cfg = small_train_config(2);
  BatchLog full = {0}, resumed = {0};
  run_loader(ds, cfg, (LoaderPosition){0, 0}, 5, &full);
  DataLoader *L;
  DataError err;
  ck_assert_int_eq(loader_create(ds, &cfg, (LoaderPosition){0, 0}, &L, &err), DATA_OK);
  const Batch *b;
  for (int i = 0; i < 3; i++) ck_assert_int_eq(loader_next(L, &b, &err), DATA_OK);  // all of epoch 0
  ck_assert_int_eq(loader_seek(L, (LoaderPosition){0, 0}, &err), DATA_OK);
  ck_assert_int_eq(loader_next(L, &b, &err), DATA_OK);
  assert_same_batch(b, &full.b[0]);
  ck_assert_int_eq(loader_seek(L, (LoaderPosition){0, 3}, &err), DATA_OK);  // == (1, 0)
  ck_assert_int_eq(loader_next(L, &b, &err), DATA_OK);
  assert_same_batch(b, &full.b[3]);
  ck_assert_int_eq(loader_seek(L, (LoaderPosition){0, 4}, &err), DATA_ERROR);
  ck_assert_ptr_nonnull(strstr(err.msg, "outside the data"));
  ck_assert_int_eq(loader_seek(L, (LoaderPosition){-1, 0}, &err), DATA_ERROR);
  loader_free(L);
  run_loader(ds, cfg, (LoaderPosition){0, 2}, 3, &resumed);  // a fresh process resuming at (0, 2)
  for (int i = 0; i < 3; i++) assert_same_batch(&resumed.b[i], &full.b[2 + i]);
  free_log(&full);
  free_log(&resumed);
  // Configuration errors are messages, not crashes.
  LoaderConfig bad = cfg;
  bad.batch_size = 0;
  ck_assert_int_eq(loader_create(ds, &bad, (LoaderPosition){0, 0}, &L, &err), DATA_ERROR);
  bad = cfg;
  bad.batch_size = 11;  // more than the 10 images, drop_last
  ck_assert_int_eq(loader_create(ds, &bad, (LoaderPosition){0, 0}, &L, &err), DATA_ERROR);
  ck_assert_ptr_nonnull(strstr(err.msg, "not enough for a batch"));
  bad = cfg;
  bad.aug.n_scales = 0;
  ck_assert_int_eq(loader_create(ds, &bad, (LoaderPosition){0, 0}, &L, &err), DATA_ERROR);
  ck_assert_int_eq(loader_create(ds, &cfg, (LoaderPosition){0, 9}, &L, &err), DATA_ERROR);
  coco_free(ds);
}
END_TEST

// Unreadable images met by the loader: fail names the file; skip drops them (whole batches too)
// and counts them.
START_TEST(loader_unreadable_images_policy) {
  ck_assert_int_eq(mkdir(at("img"), 0755), 0);
  write_jpeg(at("img/1.jpg"), 32, 24);
  write_jpeg(at("img/5.jpg"), 32, 24);
  write_jpeg(at("img/full.jpg"), 32, 24);
  size_t n;
  uint8_t *bytes = read_file(at("img/full.jpg"), &n);
  write_file(at("img/2.jpg"), bytes, n / 2);  // truncated
  free(bytes);
  write_text(at("img/3.jpg"), "corrupt");
  // image 4 is missing
  write_text(at("ann.json"),
             "{\"images\": [{\"id\": 1, \"file_name\": \"1.jpg\", \"width\": 32, \"height\": 24},\n"
             "  {\"id\": 2, \"file_name\": \"2.jpg\", \"width\": 32, \"height\": 24},\n"
             "  {\"id\": 3, \"file_name\": \"3.jpg\", \"width\": 32, \"height\": 24},\n"
             "  {\"id\": 4, \"file_name\": \"4.jpg\", \"width\": 32, \"height\": 24},\n"
             "  {\"id\": 5, \"file_name\": \"5.jpg\", \"width\": 32, \"height\": 24}],\n"
             " \"categories\": [{\"id\": 1, \"name\": \"c\"}]}");
  CocoDataset *ds = open_ok(at("ann.json"), at("img"), BAD_INPUT_FAIL, false);
  LoaderConfig cfg = loader_config_default(false);
  cfg.aug = aug_config_scaled(false, 24, 64);
  cfg.num_workers = 2;
  cfg.quiet = true;
  DataLoader *L;
  DataError err;
  const Batch *b;
  // fail: batch [1, 2] -> the truncated JPEG stops the loader with its name; it stays failed.
  ck_assert_int_eq(loader_create(ds, &cfg, (LoaderPosition){0, 0}, &L, &err), DATA_OK);
  ck_assert_int_eq(loader_next(L, &b, &err), DATA_ERROR);
  ck_assert_ptr_null(b);
  ck_assert_msg(strstr(err.msg, "2.jpg: truncated or corrupt JPEG") && strstr(err.msg, "image id 2"), "%s", err.msg);
  ck_assert_int_eq(loader_next(L, &b, &err), DATA_ERROR);
  ck_assert_int_eq(loader_seek(L, (LoaderPosition){0, 1}, &err), DATA_OK);  // batch [3, 4]
  ck_assert_int_eq(loader_next(L, &b, &err), DATA_ERROR);
  ck_assert_msg(strstr(err.msg, "3.jpg: corrupt or unsupported image"), "%s", err.msg);
  loader_free(L);
  // skip: [1, -] [-, -] [5]: two batches delivered, the all-bad one passed over.
  cfg.policy = BAD_INPUT_SKIP;
  ck_assert_int_eq(loader_create(ds, &cfg, (LoaderPosition){0, 0}, &L, &err), DATA_OK);
  ck_assert_int_eq(loader_next(L, &b, &err), DATA_OK);
  ck_assert(b->size == 1 && b->skipped == 1 && b->targets[0].image_id == 1 && b->index == 0);
  ck_assert_int_eq(loader_next(L, &b, &err), DATA_OK);
  ck_assert(b->size == 1 && b->targets[0].image_id == 5 && b->index == 2);
  ck_assert_int_eq(loader_next(L, &b, &err), LOADER_END);
  ck_assert_int_eq(loader_stats(L).skipped_images, 3);
  loader_free(L);
  coco_free(ds);
}
END_TEST

// Under skip, images that all vanish after the open (no check at open) end the endless training
// stream with an error after one epoch of empty batches, instead of spinning forever.
START_TEST(loader_no_readable_image_is_an_error) {
  ck_assert_int_eq(mkdir(at("img"), 0755), 0);
  write_text(at("ann.json"),
             "{\"images\": [{\"id\": 1, \"file_name\": \"1.jpg\", \"width\": 32, \"height\": 24},\n"
             "  {\"id\": 2, \"file_name\": \"2.jpg\", \"width\": 32, \"height\": 24},\n"
             "  {\"id\": 3, \"file_name\": \"3.jpg\", \"width\": 32, \"height\": 24}],\n"
             " \"categories\": [{\"id\": 1, \"name\": \"c\"}]}");
  CocoDataset *ds = open_ok(at("ann.json"), at("img"), BAD_INPUT_SKIP, false);
  for (int workers = 0; workers <= 2; workers += 2) {
    LoaderConfig cfg = loader_config_default(true);  // training: no end of its own
    cfg.aug = aug_config_scaled(false, 24, 64);
    cfg.batch_size = 1;
    cfg.num_workers = workers;
    cfg.policy = BAD_INPUT_SKIP;
    cfg.quiet = true;
    DataLoader *L;
    DataError err;
    const Batch *b;
    ck_assert_int_eq(loader_create(ds, &cfg, (LoaderPosition){0, 0}, &L, &err), DATA_OK);
    ck_assert_int_eq(loader_next(L, &b, &err), DATA_ERROR);
    ck_assert_msg(strstr(err.msg, "no image of a whole epoch could be read"), "%s", err.msg);
    loader_free(L);
  }
  coco_free(ds);
}
END_TEST

// One file under two ids, and boxes written as corners: refused at open with what to do.
START_TEST(duplicate_files_and_corner_boxes) {
  write_text(at("dup.json"),
             "{\"images\": [{\"id\": 1, \"file_name\": \"a.jpg\", \"width\": 32, \"height\": 24},\n"
             "  {\"id\": 2, \"file_name\": \"a.jpg\", \"width\": 32, \"height\": 24}],\n"
             " \"annotations\": [{\"id\": 1, \"image_id\": 2, \"category_id\": 1, \"bbox\": [1, 1, 5, 5]}],\n"
             " \"categories\": [{\"id\": 1, \"name\": \"c\"}]}");
  open_fails(at("dup.json"), NULL, BAD_INPUT_FAIL, false, "image ids 1 and 2 both name the file a.jpg");
  CocoDataset *ds = open_ok(at("dup.json"), NULL, BAD_INPUT_SKIP, false);
  ck_assert(ds->n_images == 1 && ds->images[0].id == 1 && ds->n_anns == 0 && ds->stats.duplicate_files == 1);
  coco_free(ds);
  // Corners [x0, y0, x1, y1] of boxes in the right half of a 100x100 image: as [x, y, w, h] they
  // reach past it. Real COCO-style boxes near the border (one of four past it) pass.
  const char *corners =
      "{\"images\": [{\"id\": 1, \"file_name\": \"a.jpg\", \"width\": 100, \"height\": 100}],\n"
      " \"annotations\": [%s],\n \"categories\": [{\"id\": 1, \"name\": \"c\"}]}";
  char json[1024], anns[512] = "";
  for (int i = 0, n = 0; i < 4; i++)
    n += snprintf(anns + n, sizeof anns - (size_t)n,
                  "%s{\"id\": %d, \"image_id\": 1, \"category_id\": 1, \"bbox\": "
                  "[%d, %d, %d, %d]}",
                  i ? ", " : "", i + 1, 50 + i, 40 + i, 90 + i, 80 + i);
  snprintf(json, sizeof json, corners, anns);
  write_text(at("xyxy.json"), json);
  open_fails(at("xyxy.json"), NULL, BAD_INPUT_SKIP, false, "the boxes look like corners");
  snprintf(json, sizeof json, corners,
           "{\"id\": 1, \"image_id\": 1, \"category_id\": 1, \"bbox\": [60, 40, 30, 20]},"
           "{\"id\": 2, \"image_id\": 1, \"category_id\": 1, \"bbox\": [10, 10, 20, 20]},"
           "{\"id\": 3, \"image_id\": 1, \"category_id\": 1, \"bbox\": [5, 50, 20, 30]},"
           "{\"id\": 4, \"image_id\": 1, \"category_id\": 1, \"bbox\": [80, 80, 30, 30]}");
  write_text(at("xywh.json"), json);
  coco_free(open_ok(at("xywh.json"), NULL, BAD_INPUT_FAIL, false));
}
END_TEST

// --- the synthetic dataset -----------------------------------------------------------------------

static bool same_file(const char *a, const char *b) {
  size_t na, nb;
  uint8_t *x = read_file(a, &na), *y = read_file(b, &nb);
  bool same = na == nb && memcmp(x, y, na) == 0;
  free(x);
  free(y);
  return same;
}

START_TEST(synth_is_deterministic) {
  char dir_a[300], dir_b[300], dir_c[300];
  snprintf(dir_a, sizeof dir_a, "%s/a", tmp);
  snprintf(dir_b, sizeof dir_b, "%s/b", tmp);
  snprintf(dir_c, sizeof dir_c, "%s/c/nested", tmp);  // missing parents are created
  SynthConfig sc = synth_config_default();
  sc.n_train = 6;
  sc.n_val = 4;
  sc.min_side = 64;
  sc.max_side = 128;
  sc.seed = 11;
  DataError err;
  sc.out_dir = dir_a;
  ck_assert_int_eq(synth_generate(&sc, &err), DATA_OK);
  sc.out_dir = dir_b;
  ck_assert_int_eq(synth_generate(&sc, &err), DATA_OK);
  sc.out_dir = dir_c;
  sc.seed = 12;
  ck_assert_int_eq(synth_generate(&sc, &err), DATA_OK);
  const char *files[] = {"annotations/instances_train.json", "annotations/instances_val.json", "train/000000000001.jpg",
                         "train/000000000006.jpg",           "val/000000000001.jpg",           "val/000000000004.jpg"};
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char a[400], b[400], c[400];
    snprintf(a, sizeof a, "%s/%s", dir_a, files[i]);
    snprintf(b, sizeof b, "%s/%s", dir_b, files[i]);
    snprintf(c, sizeof c, "%s/%s", dir_c, files[i]);
    ck_assert_msg(same_file(a, b), "%s differs between two runs with the same seed", files[i]);
    ck_assert_msg(!same_file(a, c), "%s is the same with another seed", files[i]);
  }
  // An output folder that cannot be made is an error naming it.
  write_text(at("plainfile"), "x");
  sc.out_dir = at("plainfile");
  ck_assert_int_eq(synth_generate(&sc, &err), DATA_ERROR);
  ck_assert_ptr_nonnull(strstr(err.msg, "plainfile"));
  sc.out_dir = dir_a;
  sc.min_side = 10;
  ck_assert_int_eq(synth_generate(&sc, &err), DATA_ERROR);
}
END_TEST

// detr pretrain's crops: one per training box, in dataset order with its label; the batch is the
// normalized centre window without augmentation and a seeded random window/flip with it.
START_TEST(crops_cut_every_box) {
  CocoDataset *ds = tiny_synth(6, 2);
  CropSet c;
  DataError err;
  ck_assert_int_eq(crops_extract(ds, 5, 0.3f, &c, &err), DATA_ERROR);  // side below 8
  ck_assert_msg(strstr(err.msg, "side 5"), "%s", err.msg);
  ck_assert_msg(crops_extract(ds, 40, 0.3f, &c, &err) == DATA_OK, "%s", err.msg);
  ck_assert_int_eq(c.n, ds->n_anns);  // the training split has no crowd boxes
  ck_assert_int_eq(c.num_classes, ds->num_classes);
  for (int64_t i = 0; i < c.n; i++) ck_assert_int_eq(c.labels[i], coco_label_of(ds, ds->anns[i].category_id));
  AugConfig norm = aug_config_scaled(false, 32, 32);
  float lut[3][256], a[2 * 3 * 32 * 32], b[2 * 3 * 32 * 32];
  aug_normalize_lut(&norm, lut);
  int64_t idx[2] = {1, 0};
  crops_batch(&c, idx, 2, 32, false, NULL, a);
  const uint8_t *px = c.pixels + ((size_t)1 * 40 * 40 + (size_t)(4 + 5) * 40 + (4 + 7)) * 3;  // crop 1, window (4, 4)
  ck_assert_float_eq(a[(5 * 32 + 7) * 3 + 0], lut[0][px[0]]);                                 // [n, 32, 32, 3]
  ck_assert_float_eq(a[(5 * 32 + 7) * 3 + 2], lut[2][px[2]]);
  Rng r1 = rng_make(9), r2 = rng_make(9);
  crops_batch(&c, idx, 2, 32, true, &r1, a);
  crops_batch(&c, idx, 2, 32, true, &r2, b);
  ck_assert_int_eq(memcmp(a, b, sizeof a), 0);
  crops_free(&c);
  coco_free(ds);
}
END_TEST

START_TEST(synth_has_what_coco_has) {
  SynthConfig sc = synth_config_default();
  sc.out_dir = tmp;
  sc.n_train = 40;
  sc.n_val = 30;
  sc.min_side = 160;
  sc.max_side = 224;
  DataError err;
  ck_assert_int_eq(synth_generate(&sc, &err), DATA_OK);
  // Strict policy, images checked: every box valid, every file readable at its stated size.
  CocoDataset *train = open_ok(at("annotations/instances_train.json"), at("train"), BAD_INPUT_FAIL, true);
  CocoDataset *val = open_ok(at("annotations/instances_val.json"), at("val"), BAD_INPUT_FAIL, true);
  ck_assert_int_eq(train->n_images, 40);
  ck_assert_int_eq(val->n_images, 30);
  ck_assert_int_eq(train->n_categories, SYNTH_NUM_CATEGORIES);
  ck_assert_int_eq(train->num_classes, 14);  // ids 1, 3, 4, 7, 9, 13: not contiguous
  ck_assert_int_eq(train->stats.crowd_annotations, 0);
  ck_assert_int_gt(val->stats.crowd_annotations, 0);
  ck_assert_int_gt(train->stats.images_without_annotations + val->stats.images_without_annotations, 0);
  ck_assert_int_eq(train->stats.clamped_boxes + val->stats.clamped_boxes, 0);
  int sizes[3] = {0, 0, 0}, per_category[14] = {0}, overlapping = 0;
  const CocoDataset *both[2] = {train, val};
  for (int d = 0; d < 2; d++) {
    for (int64_t i = 0; i < both[d]->n_anns; i++) {
      const CocoAnn *a = &both[d]->anns[i];
      if (a->iscrowd) continue;
      sizes[a->area < 32 * 32 ? 0 : a->area < 96 * 96 ? 1 : 2]++;
      per_category[a->category_id]++;
    }
    for (int64_t i = 0; i < both[d]->n_images; i++) {  // boxes that overlap (occlusion)
      const CocoImage *im = &both[d]->images[i];
      for (int p = 0; p < im->n_anns; p++)
        for (int q = p + 1; q < im->n_anns; q++) {
          const double *u = both[d]->anns[im->first_ann + p].bbox, *v = both[d]->anns[im->first_ann + q].bbox;
          if (u[0] < v[0] + v[2] && v[0] < u[0] + u[2] && u[1] < v[1] + v[3] && v[1] < u[1] + u[3]) overlapping++;
        }
    }
  }
  for (int k = 0; k < 3; k++) ck_assert_msg(sizes[k] > 5, "area class %d: %d objects", k, sizes[k]);
  for (int c = 0; c < SYNTH_NUM_CATEGORIES; c++) ck_assert_int_gt(per_category[synth_categories[c].id], 3);
  ck_assert_int_gt(overlapping, 0);
  // The samples decode at their stated size.
  Image img = {0};
  Target t = {0};
  ck_assert_int_eq(coco_load_sample(train, 0, &img, &t, &err), DATA_OK);
  ck_assert(img.w >= 160 && img.w <= 224 && img.h >= 160 && img.h <= 224);
  image_free(&img);
  target_free(&t);
  coco_free(train);
  coco_free(val);
}
END_TEST

START_TEST(policy_names) {
  BadInputPolicy p;
  ck_assert_int_eq(bad_input_policy_parse("skip", &p), 0);
  ck_assert_int_eq(p, BAD_INPUT_SKIP);
  ck_assert_int_eq(bad_input_policy_parse("fail", &p), 0);
  ck_assert_int_eq(p, BAD_INPUT_FAIL);
  ck_assert_int_eq(bad_input_policy_parse("ignore", &p), -1);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("datasets");
  TCase *tc = tcase_create("datasets");
  tcase_add_checked_fixture(tc, setup_tmp, teardown_tmp);
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, parse_minimal_coco);
  tcase_add_test(tc, parse_gzip_like_plain);
  tcase_add_test(tc, malformed_and_truncated_json_fail);
  tcase_add_loop_test(tc, bad_items_fail_or_skip, 0, (int)(sizeof bad_item_cases / sizeof bad_item_cases[0]));
  tcase_add_test(tc, missing_and_corrupt_images_at_open);
  tcase_add_test(tc, decode_progressive_grey_png);
  tcase_add_test(tc, hostile_images);
  tcase_add_test(tc, hostile_coco);
  tcase_add_test(tc, resize_matches_pillow);
  tcase_add_test(tc, flip_and_crop_pixels);
  tcase_add_test(tc, resize_size_as_reference);
  tcase_add_test(tc, box_arithmetic);
  tcase_add_test(tc, augmentation_keeps_boxes_on_objects);
  tcase_add_test(tc, crowd_kept_for_eval_not_targets);
  tcase_add_test(tc, batch_padding_mask_normalization);
  tcase_add_test(tc, batch_pad_multiple);
  tcase_add_test(tc, loader_same_batches_any_worker_count);
  tcase_add_test(tc, loader_consumer_builds_what_workers_have_not);
  tcase_add_test(tc, loader_resumes_at_saved_position);
  tcase_add_test(tc, loader_unreadable_images_policy);
  tcase_add_test(tc, loader_no_readable_image_is_an_error);
  tcase_add_test(tc, duplicate_files_and_corner_boxes);
  tcase_add_test(tc, synth_is_deterministic);
  tcase_add_test(tc, synth_has_what_coco_has);
  tcase_add_test(tc, crops_cut_every_box);
  tcase_add_test(tc, policy_names);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
