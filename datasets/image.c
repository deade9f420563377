#include "datasets/image.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <stb/stb_image.h>
#include <stb/stb_image_write.h>

#include "core/error.h"

Image image_alloc(int w, int h) {
  DETR_CHECK(w > 0 && h > 0 && w <= IMAGE_MAX_SIDE && h <= IMAGE_MAX_SIDE, "image_alloc: bad size %dx%d", w, h);
  Image img = {.w = w, .h = h};
  img.data = detr_malloc((size_t)w * (size_t)h * 3, "image pixels");
  return img;
}

void image_free(Image *img) {
  free(img->data);
  img->data = NULL;
  img->w = img->h = 0;
}

// --- decoding ----------------------------------------------------------------------------------

// A DHT segment's payload: tables of (class/id byte, 16 code counts, the symbols). Marks the
// tables it defines in defined[class][id] (when given).
static bool dht_ok(const uint8_t *p, size_t len, bool defined[2][4]) {
  size_t at = 0;
  while (at < len) {
    if (at + 17 > len) return false;
    size_t codes = 0;
    for (int i = 1; i <= 16; i++) codes += p[at + i];
    if (codes > 256 || at + 17 + codes > len) return false;
    if (defined && p[at] >> 4 <= 1 && (p[at] & 15) <= 3) defined[p[at] >> 4][p[at] & 15] = true;
    at += 17 + codes;
  }
  return true;
}

// A scan header (SOS payload: Ns, Ns x (component, DC/AC table ids), Ss, Se, Ah/Al): false when it
// selects a Huffman table no DHT defined before it. stb_image 2.27 leaves undefined tables
// uninitialised and indexes its arrays with their garbage (2.28 zeroes them).
static bool sos_tables_defined(const uint8_t *p, size_t len, bool progressive, bool defined[2][4]) {
  if (len < 1 || len < 1 + 2 * (size_t)p[0] + 3) return true;  // stb_image refuses it itself
  int ns = p[0], ss = p[1 + 2 * ns];
  for (int i = 0; i < ns; i++) {
    int td = p[2 + 2 * i] >> 4, ta = p[2 + 2 * i] & 15;
    if (td > 3 || ta > 3) return true;  // refused by stb_image
    // Sequential scans decode DC and AC; progressive ones DC (Ss = 0) or AC (Ss > 0).
    if ((!progressive || ss == 0) && !defined[0][td]) return false;
    if ((!progressive || ss > 0) && !defined[1][ta]) return false;
  }
  return true;
}

// Walks the JPEG's marker segments to its end-of-image marker. Returns 1 when the structure is
// intact; 0 when it is truncated or broken (stb_image, like libjpeg, decodes a truncated JPEG
// without complaint, filling the rest with grey; PIL, which the reference DETR reads images with,
// rejects it); -1 when a Huffman table segment (DHT) declares more than 256 codes or runs past its
// segment, -2 when a scan uses a table never defined: Debian's stb_image 2.27 reads and writes past
// its arrays on both (fixed upstream in 2.28), so such files must not reach it.
static int jpeg_walk(const uint8_t *buf, size_t n) {
  size_t pos = 0;
  while (pos < n && buf[pos] == 0xFF) pos++;               // stb_image takes FF FF .. FF D8 as the start too
  if (pos == 0 || pos >= n || buf[pos] != 0xD8) return 0;  // no start-of-image marker
  pos++;
  bool defined[2][4] = {{false}}, frame = false, progressive = false;
  for (;;) {
    if (pos >= n || buf[pos] != 0xFF) return 0;  // a marker must follow each segment
    while (pos < n && buf[pos] == 0xFF) pos++;   // fill bytes
    if (pos >= n) return 0;
    uint8_t marker = buf[pos++];
    if (marker == 0xD9) return 1;                                        // end of image
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;  // no length field
    if (pos + 2 > n) return 0;
    size_t len = ((size_t)buf[pos] << 8) | buf[pos + 1];
    if (len < 2) return 0;
    if (pos + len > n) return 0;
    if (marker == 0xC4 && !dht_ok(buf + pos + 2, len - 2, defined)) return -1;
    if (marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC)
      frame = true, progressive = marker == 0xC2;  // a frame header (stb_image reads C0..C2)
    if (marker == 0xDA && frame && !sos_tables_defined(buf + pos + 2, len - 2, progressive, defined)) return -2;
    pos += len;
    if (marker == 0xDA) {
      // Entropy-coded scan data runs to the next marker: 0xFF followed by anything but a stuffed
      // 0x00, a restart marker 0xD0..0xD7 or another fill byte.
      for (;;) {
        if (pos + 1 >= n) return 0;
        if (buf[pos] == 0xFF) {
          uint8_t next = buf[pos + 1];
          if (next != 0x00 && !(next >= 0xD0 && next <= 0xD7) && next != 0xFF) break;
        }
        pos++;
      }
    }
  }
}

// True when a PNG's chunks (length, type, data, crc) lie inside the file up to its IEND chunk. A
// chunk length is 31 bits, and stb_image allocates for an IDAT's declared length before reading
// it: a 100-byte file could ask for 2 GiB. PIL refuses a PNG without IEND too.
static bool png_is_complete(const uint8_t *buf, size_t n) {
  static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (n < 8 || memcmp(buf, sig, 8)) return false;
  for (size_t pos = 8;;) {
    if (n - pos < 12) return false;
    uint32_t len = (uint32_t)buf[pos] << 24 | (uint32_t)buf[pos + 1] << 16 | (uint32_t)buf[pos + 2] << 8 | buf[pos + 3];
    if (len > 0x7FFFFFFFu || n - pos - 12 < len) return false;
    if (!memcmp(buf + pos + 4, "IEND", 4)) return true;
    pos += 12 + (size_t)len;
  }
}

static _Atomic int64_t max_pixels = IMAGE_MAX_PIXELS;

int64_t image_max_pixels(void) { return max_pixels; }

void image_set_max_pixels(int64_t n) {
  DETR_CHECK(n >= 1 && n <= IMAGE_MAX_PIXELS, "image_set_max_pixels: %lld not in 1..%d", (long long)n,
             IMAGE_MAX_PIXELS);
  max_pixels = n;
}

int image_decode_memory(const uint8_t *buf, size_t n, const char *name, Image *out, DataError *err) {
  *out = (Image){0};
  if (n == 0) return data_error(err, "%s: empty image file", name);
  if (n > (size_t)INT32_MAX) return data_error(err, "%s: image file larger than 2 GiB", name);
  if (buf[0] == 0xFF) {  // what stb_image tries as a JPEG
    int walk = jpeg_walk(buf, n);
    if (walk == 0)
      return data_error(err, "%s: truncated or corrupt JPEG (no end-of-image marker after its segments)", name);
    if (walk == -1) return data_error(err, "%s: corrupt JPEG (a Huffman table with more than 256 codes)", name);
    if (walk == -2) return data_error(err, "%s: corrupt JPEG (a scan uses a Huffman table that is not defined)", name);
  }
  if (buf[0] == 0x89 && !png_is_complete(buf, n))
    return data_error(err, "%s: truncated or corrupt PNG (a chunk runs past the end of the file, or no IEND chunk)",
                      name);
  int w = 0, h = 0, comp = 0;
  // The size the header declares, before the decoder allocates for it (stb_image allocates the
  // whole output, and for PNG a zlib buffer of the declared size, before reading the pixels).
  if (stbi_info_from_memory(buf, (int)n, &w, &h, &comp)) {
    if (w > IMAGE_MAX_SIDE || h > IMAGE_MAX_SIDE)
      return data_error(err, "%s: image is %dx%d, larger than the limit of %d pixels per side", name, w, h,
                        IMAGE_MAX_SIDE);
    if ((int64_t)w * h > max_pixels)
      return data_error(err, "%s: image is %dx%d = %lld pixels, more than the limit of %lld (a decompression bomb?)",
                        name, w, h, (long long)w * h, (long long)max_pixels);
  }
  uint8_t *px = stbi_load_from_memory(buf, (int)n, &w, &h, &comp, 3);  // any layout -> RGB
  if (!px) return data_error(err, "%s: corrupt or unsupported image (%s)", name, stbi_failure_reason());
  out->w = w;
  out->h = h;
  // stb allocates with malloc and image_free frees with free: the pixels can be adopted as they are.
  out->data = px;
  return DATA_OK;
}

// Only a regular file is opened: fopen succeeds on a folder (whose "size" is then LONG_MAX) and
// blocks on a named pipe.
static FILE *open_image_file(const char *path, DataError *err) {
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    data_error(err, "%s: is a %s, not an image file", path, S_ISDIR(st.st_mode) ? "folder" : "special file");
    return NULL;
  }
  FILE *f = fopen(path, "rb");
  if (!f) data_error(err, "%s: cannot open image: %s", path, strerror(errno));
  return f;
}

int image_decode_file(const char *path, Image *out, DataError *err) {
  *out = (Image){0};
  FILE *f = open_image_file(path, err);
  if (!f) return DATA_ERROR;
  int rc = DATA_OK;
  uint8_t *buf = NULL;
  long size = -1;
  if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
    rc = data_error(err, "%s: cannot determine the file size: %s", path, strerror(errno));
  } else {
    buf = detr_malloc((size_t)size, "encoded image");
    if (size > 0 && fread(buf, 1, (size_t)size, f) != (size_t)size)
      rc = data_error(err, "%s: read error: %s", path, ferror(f) ? strerror(errno) : "file shrank while reading");
  }
  fclose(f);
  if (rc == DATA_OK) rc = image_decode_memory(buf, (size_t)size, path, out, err);
  free(buf);
  return rc;
}

// The DHT segments of a JPEG file's header (up to its frame header, all that stbi_info reads),
// read from f: false when one would overflow stb_image's tables (see jpeg_walk). Leaves f at its
// start.
static bool jpeg_header_tables_ok(FILE *f) {
  uint8_t seg[65536];
  bool ok = true;
  int c = fgetc(f);
  if (c == 0xFF) {
    while ((c = fgetc(f)) == 0xFF) {}
  }
  if (c == 0xD8) {
    for (;;) {
      // As stb_image, which scans past bytes between segments to the next marker.
      while ((c = fgetc(f)) != 0xFF && c != EOF) {}
      while (c == 0xFF) c = fgetc(f);
      if (c == EOF || c == 0xD9 || c == 0xDA || (c >= 0xC0 && c <= 0xCF && c != 0xC4 && c != 0xC8 && c != 0xCC))
        break;  // the end, a scan or a frame header: stbi_info stops here
      if (c == 0x01 || (c >= 0xD0 && c <= 0xD7)) continue;
      if (fread(seg, 1, 2, f) != 2) break;
      size_t len = ((size_t)seg[0] << 8) | seg[1];
      if (len < 2) break;
      if (c == 0xC4) {
        size_t got = fread(seg, 1, len - 2, f);  // stb_image reads zeros past the end
        memset(seg + got, 0, len - 2 - got);
        if (!dht_ok(seg, len - 2, NULL)) {
          ok = false;
          break;
        }
      } else if (fseek(f, (long)len - 2, SEEK_CUR) != 0) {
        break;
      }
    }
  }
  rewind(f);
  return ok;
}

int image_read_header(const char *path, int *w, int *h, DataError *err) {
  FILE *f = open_image_file(path, err);
  if (!f) return DATA_ERROR;
  if (!jpeg_header_tables_ok(f)) {
    fclose(f);
    return data_error(err, "%s: corrupt JPEG (a Huffman table with more than 256 codes)", path);
  }
  int comp = 0;
  int ok = stbi_info_from_file(f, w, h, &comp);
  fclose(f);
  if (!ok) return data_error(err, "%s: not a readable JPEG or PNG (%s)", path, stbi_failure_reason());
  if ((int64_t)*w * *h > max_pixels)
    return data_error(err, "%s: image is %dx%d = %lld pixels, more than the limit of %lld (a decompression bomb?)",
                      path, *w, *h, (long long)*w * *h, (long long)max_pixels);
  return DATA_OK;
}

// --- geometry ----------------------------------------------------------------------------------

void image_hflip(Image *img) {
  for (int y = 0; y < img->h; y++) {
    uint8_t *row = img->data + (size_t)y * img->w * 3;  // [w, 3]
    for (int l = 0, r = img->w - 1; l < r; l++, r--) {
      for (int c = 0; c < 3; c++) {
        uint8_t t = row[l * 3 + c];
        row[l * 3 + c] = row[r * 3 + c];
        row[r * 3 + c] = t;
      }
    }
  }
}

Image image_crop(const Image *src, int top, int left, int h, int w) {
  DETR_CHECK(top >= 0 && left >= 0 && h > 0 && w > 0 && top + h <= src->h && left + w <= src->w,
             "image_crop: region (top %d, left %d, %dx%d) outside the %dx%d image", top, left, w, h, src->w, src->h);
  Image out = image_alloc(w, h);
  for (int y = 0; y < h; y++)
    memcpy(out.data + (size_t)y * w * 3, src->data + ((size_t)(top + y) * src->w + left) * 3, (size_t)w * 3);
  return out;
}

// Pillow's resampling (libImaging/Resample.c) for 8-bit images with the bilinear filter,
// reproduced to the bit: output i of an axis is centred on input coordinate (i + 0.5) * scale; the
// triangle filter is stretched by max(scale, 1) so that a downscale averages every input pixel it
// covers; taps outside the image are dropped and the rest renormalised; weights become 22-bit fixed
// point; the horizontal pass (rows the vertical pass reads only) rounds to 8 bits, then the
// vertical pass.
#define PIL_PRECISION_BITS (32 - 8 - 2)

typedef struct {
  int max_taps;
  int *starts, *counts;  // [out]
  int32_t *weights;      // [out, max_taps]
} Taps;

static Taps make_taps(int in, int out) {
  double scale = (double)in / out;
  double filterscale = scale < 1.0 ? 1.0 : scale;
  double support = 1.0 * filterscale;  // the bilinear filter's support is 1
  Taps t;
  t.max_taps = (int)ceil(support) * 2 + 1;
  t.starts = detr_malloc(sizeof(int) * (size_t)out, "resize taps");
  t.counts = detr_malloc(sizeof(int) * (size_t)out, "resize taps");
  t.weights = detr_calloc((size_t)out * (size_t)t.max_taps, sizeof(int32_t), "resize weights");
  double *k = detr_malloc(sizeof(double) * (size_t)t.max_taps, "resize weights");
  for (int i = 0; i < out; i++) {
    double center = (i + 0.5) * scale, ss = 1.0 / filterscale;
    int lo = (int)(center - support + 0.5), hi = (int)(center + support + 0.5);  // C truncation, as Pillow
    if (lo < 0) lo = 0;
    if (hi > in) hi = in;
    int count = hi - lo;
    DETR_CHECK(count > 0 && count <= t.max_taps, "make_taps: %d taps (max %d)", count, t.max_taps);
    double total = 0.0;
    for (int x = 0; x < count; x++) {
      double v = fabs((x + lo - center + 0.5) * ss);
      k[x] = v < 1.0 ? 1.0 - v : 0.0;
      total += k[x];
    }
    int32_t *w = t.weights + (size_t)i * t.max_taps;
    for (int x = 0; x < count; x++) {
      double v = total != 0.0 ? k[x] / total : k[x];
      w[x] = (int32_t)(v < 0 ? -0.5 + v * (1 << PIL_PRECISION_BITS) : 0.5 + v * (1 << PIL_PRECISION_BITS));
    }
    t.starts[i] = lo;
    t.counts[i] = count;
  }
  free(k);
  return t;
}

static void free_taps(Taps *t) {
  free(t->starts);
  free(t->counts);
  free(t->weights);
}

static inline uint8_t clip8(int32_t acc) {
  int32_t v = acc >> PIL_PRECISION_BITS;
  return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)v;
}

// Rows [row0, row0 + rows) of src resampled along x into dst ([rows, out_w, 3]).
static void resample_rows(const Image *src, int row0, int rows, const Taps *tx, int out_w, uint8_t *dst) {
  for (int y = 0; y < rows; y++) {
    const uint8_t *row = src->data + (size_t)(row0 + y) * src->w * 3;  // [src.w, 3]
    uint8_t *o = dst + (size_t)y * out_w * 3;
    for (int x = 0; x < out_w; x++) {
      const int32_t *w = tx->weights + (size_t)x * tx->max_taps;
      const uint8_t *p = row + (size_t)tx->starts[x] * 3;
      int32_t r = 1 << (PIL_PRECISION_BITS - 1), g = r, b = r;
      for (int k = 0; k < tx->counts[x]; k++, p += 3) {
        r += p[0] * w[k];
        g += p[1] * w[k];
        b += p[2] * w[k];
      }
      o[x * 3 + 0] = clip8(r);
      o[x * 3 + 1] = clip8(g);
      o[x * 3 + 2] = clip8(b);
    }
  }
}

Image image_resize_bilinear(const Image *src, int out_w, int out_h) {
  DETR_CHECK(src->data && out_w > 0 && out_h > 0, "image_resize_bilinear: %dx%d -> %dx%d", src->w, src->h, out_w,
             out_h);
  Image out = image_alloc(out_w, out_h);
  bool need_x = out_w != src->w, need_y = out_h != src->h;
  if (!need_x && !need_y) {
    memcpy(out.data, src->data, (size_t)out_w * out_h * 3);
    return out;
  }
  Taps ty = make_taps(src->h, out_h);
  if (!need_y) {
    Taps tx = make_taps(src->w, out_w);
    resample_rows(src, 0, src->h, &tx, out_w, out.data);
    free_taps(&tx);
    free_taps(&ty);
    return out;
  }
  // The vertical pass reads source rows [first, last) only.
  int first = ty.starts[0], last = ty.starts[out_h - 1] + ty.counts[out_h - 1];
  const uint8_t *mid = src->data + (size_t)first * src->w * 3;  // [last - first, mid_w, 3]
  uint8_t *mid_buf = NULL;
  int mid_w = src->w;
  if (need_x) {
    Taps tx = make_taps(src->w, out_w);
    mid_buf = detr_malloc((size_t)(last - first) * out_w * 3, "resize buffer");
    resample_rows(src, first, last - first, &tx, out_w, mid_buf);
    free_taps(&tx);
    mid = mid_buf;
    mid_w = out_w;
  }
  for (int y = 0; y < out_h; y++) {
    const int32_t *w = ty.weights + (size_t)y * ty.max_taps;
    const uint8_t *base = mid + (size_t)(ty.starts[y] - first) * mid_w * 3;
    uint8_t *o = out.data + (size_t)y * out_w * 3;
    for (int i = 0; i < out_w * 3; i++) {
      int32_t acc = 1 << (PIL_PRECISION_BITS - 1);
      const uint8_t *p = base + i;
      for (int k = 0; k < ty.counts[y]; k++, p += (size_t)mid_w * 3) acc += *p * w[k];
      o[i] = clip8(acc);
    }
  }
  free(mid_buf);
  free_taps(&ty);
  return out;
}

// --- encoding ----------------------------------------------------------------------------------

typedef struct {
  FILE *f;
  int err_no;  // errno of the first failed write, 0 while all went through
} WriteSink;

static void sink_write(void *ctx, void *data, int size) {
  WriteSink *s = ctx;
  if (!s->err_no && fwrite(data, 1, (size_t)size, s->f) != (size_t)size) s->err_no = errno ? errno : EIO;
}

static int write_image(const char *path, const uint8_t *px, int w, int h, int comp, int quality, bool png,
                       DataError *err) {
  DETR_CHECK(comp == 1 || comp == 3, "write_image: %d components (1 or 3)", comp);
  WriteSink sink = {.f = fopen(path, "wb")};
  if (!sink.f) return data_error(err, "%s: cannot create: %s", path, strerror(errno));
  int ok = png ? stbi_write_png_to_func(sink_write, &sink, w, h, comp, px, w * comp)
               : stbi_write_jpg_to_func(sink_write, &sink, w, h, comp, px, quality);
  if (fclose(sink.f) != 0 && !sink.err_no) sink.err_no = errno;
  if (sink.err_no) return data_error(err, "%s: write error: %s", path, strerror(sink.err_no));
  if (!ok) return data_error(err, "%s: the %s encoder failed", path, png ? "PNG" : "JPEG");
  return DATA_OK;
}

int image_write_jpeg(const char *path, const uint8_t *px, int w, int h, int comp, int quality, DataError *err) {
  return write_image(path, px, w, h, comp, quality, false, err);
}

int image_write_png(const char *path, const uint8_t *px, int w, int h, int comp, DataError *err) {
  return write_image(path, px, w, h, comp, 0, true, err);
}
