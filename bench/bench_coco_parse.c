// Parsing an instances file of COCO train2017's size class.
//   build/bench/bench_coco_parse [--mb 450] [--out /tmp/detr_bench_instances.json] [--gz] [--keep]
// Writes a COCO-shaped file (118287 images, 860001 annotations - train2017's counts - with polygon
// segmentations sized so the file reaches --mb megabytes, 1% crowd annotations with RLE counts,
// the 80 COCO categories), then times coco_open on it and reports the peak resident memory
// (getrusage ru_maxrss; the writer streams through a 1 MB buffer, so the peak is the parser's).
// MB = 1e6 bytes throughout (COCO's instances_train2017.json is 469.8 MB).
// --gz writes and parses a .json.gz instead. The file is removed afterwards unless --keep.
// --check-images DIR: also fills DIR with the 118287 image files (hard links to one 640x480 JPEG)
// and times coco_open with check_images, the check `detr train` runs before its first step
// (every file's presence, header and size; the page cache warm after the first of 3 runs, and cold
// for the first with BENCH_DROP_CACHES=1 as root).
#define _DEFAULT_SOURCE  // sync, link
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "core/runtime.h"
#include "datasets/coco.h"
#include "bench/bench_util.h"

#define N_IMAGES 118287
#define N_ANNS 860001

// Peak resident set of the process so far, in MB (1e6 bytes, like the file sizes).
static double peak_rss_mb(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss * 1024.0 / 1e6;  // ru_maxrss is in KiB on Linux
}

// --- a fast streaming writer (printf would dominate the run) -------------------------------------

typedef struct {
  FILE *f;
  gzFile gz;
  char buf[1 << 20];
  size_t len;
  int64_t total;
} Out;

static void out_flush(Out *o) {
  if (o->gz ? gzwrite(o->gz, o->buf, (unsigned)o->len) != (int)o->len : fwrite(o->buf, 1, o->len, o->f) != o->len) {
    fprintf(stderr, "bench_coco_parse: write error\n");
    exit(1);
  }
  o->total += (int64_t)o->len;
  o->len = 0;
}

static void out_str(Out *o, const char *s) {
  size_t n = strlen(s);
  if (o->len + n > sizeof o->buf) out_flush(o);
  memcpy(o->buf + o->len, s, n);
  o->len += n;
}

static void out_int(Out *o, long long v) {
  char tmp[24];
  int n = 0;
  bool neg = v < 0;
  unsigned long long u = neg ? (unsigned long long)(-v) : (unsigned long long)v;
  do tmp[n++] = (char)('0' + u % 10), u /= 10;
  while (u);
  if (o->len + 24 > sizeof o->buf) out_flush(o);
  if (neg) o->buf[o->len++] = '-';
  while (n) o->buf[o->len++] = tmp[--n];
}

// A value with two decimals, as COCO writes coordinates ("473.07").
static void out_fixed2(Out *o, long long hundredths) {
  out_int(o, hundredths / 100);
  char frac[4] = {'.', (char)('0' + hundredths % 100 / 10), (char)('0' + hundredths % 10), 0};
  out_str(o, frac);
}

static uint64_t lcg_state = 88172645463325252ull;
static uint32_t rnd(uint32_t n) {  // xorshift64: fast, deterministic
  lcg_state ^= lcg_state << 13;
  lcg_state ^= lcg_state >> 7;
  lcg_state ^= lcg_state << 17;
  return (uint32_t)(lcg_state % n);
}

static const int coco_ids[80] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                 22, 23, 24, 25, 27, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44,
                                 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65,
                                 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84, 85, 86, 87, 88, 89, 90};

static int64_t bytes_of_json;  // uncompressed size of the file written

// Image i's entry of the "images" array, as train2017 writes it.
static void write_image(Out *o, int i) {
  out_str(o, i ? ",\n{\"license\": 3, \"file_name\": \"" : "\n{\"license\": 3, \"file_name\": \"");
  char name[32];
  snprintf(name, sizeof name, "%012d.jpg", i + 1);
  out_str(o, name);
  out_str(o, "\", \"coco_url\": \"http://images.cocodataset.org/train2017/");
  out_str(o, name);
  out_str(o,
          "\", \"height\": 480, \"width\": 640, \"date_captured\": \"2013-11-14 11:18:45\", \"flickr_url\": "
          "\"http://farm9.staticflickr.com/8186/8119368305_4e622c8349_z.jpg\", \"id\": ");
  out_int(o, i + 1);
  out_str(o, "}");
}

// Annotation a's entry of the "annotations" array: a polygon of the given number of points (every
// 100th a crowd's RLE counts instead), a random box, image and category.
static void write_annotation(Out *o, int a, int points) {
  bool crowd = a % 100 == 99;
  int x = (int)rnd(50000), y = (int)rnd(40000), w = 100 + (int)rnd(13000), h = 100 + (int)rnd(7000);
  out_str(o, a ? ",\n{\"segmentation\": " : "\n{\"segmentation\": ");
  if (crowd) {
    out_str(o, "{\"counts\": [");
    for (int k = 0; k < 2 * points; k++) {
      if (k) out_str(o, ",");
      out_int(o, rnd(400));
    }
    out_str(o, "], \"size\": [480, 640]}");
  } else {
    out_str(o, "[[");
    for (int k = 0; k < points; k++) {
      if (k) out_str(o, ",");
      out_fixed2(o, x + (long long)rnd((uint32_t)w));
      out_str(o, ",");
      out_fixed2(o, y + (long long)rnd((uint32_t)h));
    }
    out_str(o, "]]");
  }
  out_str(o, ", \"area\": ");
  out_fixed2(o, (long long)w * h / 100);
  out_str(o, crowd ? ", \"iscrowd\": 1, \"image_id\": " : ", \"iscrowd\": 0, \"image_id\": ");
  out_int(o, 1 + (long long)rnd(N_IMAGES));
  out_str(o, ", \"bbox\": [");
  out_fixed2(o, x);
  out_str(o, ",");
  out_fixed2(o, y);
  out_str(o, ",");
  out_fixed2(o, w);
  out_str(o, ",");
  out_fixed2(o, h);
  out_str(o, "], \"category_id\": ");
  out_int(o, coco_ids[rnd(80)]);
  out_str(o, ", \"id\": ");
  out_int(o, a + 1);
  out_str(o, "}");
}

static void write_instances(const char *path, double target_mb, bool gz) {
  Out *o = calloc(1, sizeof(Out));
  if (gz) o->gz = gzopen(path, "wb1");
  else o->f = fopen(path, "wb");
  if (!o->f && !o->gz) {
    fprintf(stderr, "bench_coco_parse: cannot create %s\n", path);
    exit(1);
  }
  // ~290 bytes per image entry, ~130 bytes of fields per annotation besides its polygon, ~14
  // bytes per polygon point ("473.07,395.93,"): the polygon length that reaches the target size.
  double per_ann = target_mb * 1e6 / N_ANNS - 290.0 * N_IMAGES / N_ANNS - 130;
  int points = per_ann / 14 > 4 ? (int)(per_ann / 14) : 4;
  out_str(o,
          "{\"info\": {\"description\": \"COCO 2017 Dataset (bench)\", \"year\": 2017},\n\"licenses\": [{\"url\": "
          "\"http://creativecommons.org/licenses/by-nc-sa/2.0/\", \"id\": 1, \"name\": \"x\"}],\n\"images\": [");
  for (int i = 0; i < N_IMAGES; i++) write_image(o, i);
  out_str(o, "],\n\"annotations\": [");
  for (int a = 0; a < N_ANNS; a++) write_annotation(o, a, points);
  out_str(o, "],\n\"categories\": [");
  for (int c = 0; c < 80; c++) {
    out_str(o, c ? ", {\"supercategory\": \"thing\", \"id\": " : "{\"supercategory\": \"thing\", \"id\": ");
    out_int(o, coco_ids[c]);
    out_str(o, ", \"name\": \"category");
    out_int(o, coco_ids[c]);
    out_str(o, "\"}");
  }
  out_str(o, "]}\n");
  out_flush(o);
  if (gz ? gzclose(o->gz) != Z_OK : fclose(o->f) != 0) {
    fprintf(stderr, "bench_coco_parse: error closing %s\n", path);
    exit(1);
  }
  bytes_of_json = o->total;
  printf("wrote %s: %.1f MB of JSON (%d images, %d annotations, %d polygon points each)\n", path, o->total / 1e6,
         N_IMAGES, N_ANNS, points);
  free(o);
}

// DIR/000000000001.jpg ... as hard links to a 640x480 JPEG (train2017's typical size), a new one
// every 50000 (ext4 allows 65000 links to a file).
static void write_images(const char *dir) {
  mkdir(dir, 0755);
  static uint8_t px[480 * 640 * 3];  // [480, 640, 3]
  for (int i = 0; i < 480 * 640 * 3; i++) px[i] = (uint8_t)((i * 7) ^ (i >> 9));
  char first[4200], path[4200];
  for (int i = 0; i < N_IMAGES; i++) {
    snprintf(path, sizeof path, "%s/%012d.jpg", dir, i + 1);
    if (i % 50000 == 0) {
      DataError err;
      snprintf(first, sizeof first, "%s", path);
      if (access(path, F_OK) != 0 && image_write_jpeg(first, px, 640, 480, 3, 90, &err) != DATA_OK) {
        fprintf(stderr, "bench_coco_parse: %s\n", err.msg);
        exit(1);
      }
      continue;
    }
    if (access(path, F_OK) != 0 && link(first, path) != 0) {
      fprintf(stderr, "bench_coco_parse: cannot link %s\n", path);
      exit(1);
    }
  }
}

static void time_check_images(const char *ann, const char *dir) {
  write_images(dir);
  if (getenv("BENCH_DROP_CACHES")) {  // root only: the first run then reads inodes and headers from disk
    sync();
    FILE *f = fopen("/proc/sys/vm/drop_caches", "w");
    if (!f || fputs("3\n", f) == EOF || fclose(f)) fprintf(stderr, "bench_coco_parse: cannot drop the page cache\n");
  }
  for (int run = 0; run < 3; run++) {
    CocoOpenConfig cfg = {.ann_path = ann, .image_dir = dir, .policy = BAD_INPUT_FAIL, .quiet = true};
    for (int check = 0; check < 2; check++) {
      cfg.check_images = check;
      CocoDataset *ds = NULL;
      DataError err;
      double t0 = now();
      if (coco_open(&cfg, &ds, &err) != DATA_OK) {
        fprintf(stderr, "bench_coco_parse: %s\n", err.msg);
        exit(1);
      }
      printf("run %d: coco_open %s the image check: %.2f s\n", run, check ? "with" : "without", now() - t0);
      coco_free(ds);
    }
  }
}

int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  double mb = 450;
  const char *out = NULL, *images = NULL;
  bool gz = false, keep = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
    else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
    else if (!strcmp(argv[i], "--gz")) gz = true;
    else if (!strcmp(argv[i], "--keep")) keep = true;
    else if (!strcmp(argv[i], "--check-images") && i + 1 < argc) images = argv[++i];
    else {
      fprintf(stderr, "usage: bench_coco_parse [--mb 450] [--out PATH] [--gz] [--keep] [--check-images DIR]\n");
      return 2;
    }
  }
  if (!out) out = gz ? "/tmp/detr_bench_instances.json.gz" : "/tmp/detr_bench_instances.json";
  double t0 = now();
  write_instances(out, mb, gz);
  struct stat st;
  stat(out, &st);
  printf("generated in %.1f s; file on disk %.1f MB; peak RSS so far %.1f MB\n", now() - t0, st.st_size / 1e6,
         peak_rss_mb());

  CocoOpenConfig cfg = {.ann_path = out, .policy = BAD_INPUT_FAIL};
  CocoDataset *ds = NULL;
  DataError err;
  t0 = now();
  if (coco_open(&cfg, &ds, &err) != DATA_OK) {
    fprintf(stderr, "bench_coco_parse: %s\n", err.msg);
    return 1;
  }
  double secs = now() - t0;
  printf("parsed in %.2f s: %lld images, %lld annotations (%lld crowd), %d categories\n", secs, (long long)ds->n_images,
         (long long)ds->n_anns, (long long)ds->stats.crowd_annotations, ds->n_categories);
  double json_mb = gz ? 0 : st.st_size / 1e6;  // for .gz: the uncompressed size printed by the writer
  printf("peak RSS %.1f MB", peak_rss_mb());
  if (json_mb > 0) printf(" (%.1f%% of the %.1f MB file)", 100.0 * peak_rss_mb() / json_mb, json_mb);
  printf("; %.0f MB/s of JSON\n", ds ? (double)bytes_of_json / 1e6 / secs : 0);
  coco_free(ds);
  if (images) time_check_images(out, images);
  if (!keep) remove(out);
  return 0;
}
