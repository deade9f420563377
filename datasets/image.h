// 8-bit RGB images: decoding (stb_image: JPEG baseline and progressive, PNG; grayscale, CMYK and
// alpha converted to RGB), the geometric operations DETR's augmentations need, and encoding
// (stb_image_write) for the synthetic dataset.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "datasets/data_util.h"

typedef struct {
  int w, h;
  uint8_t *data;  // [h, w, 3] RGB, row-major, malloc'd (NULL for an empty image)
} Image;

// Largest accepted width or height: corrupt headers cannot make the decoder allocate gigabytes.
#define IMAGE_MAX_SIDE 32768
// Largest accepted image, in pixels: Pillow's decompression-bomb limit (2 * Image.MAX_IMAGE_PIXELS,
// where PIL refuses to open), so every image the reference can read is read here. A PNG or JPEG
// declares its size in a few bytes of header and can ask for 32768 x 32768 pixels (3 GiB, seconds
// of decoding) in a file of a few hundred bytes: the declared size is checked before any pixel is
// decoded, and a larger image is refused with the file, its size and the limit.
#define IMAGE_MAX_PIXELS 178956970
// The pixel limit in force (IMAGE_MAX_PIXELS unless lowered): process-wide, for embedders with
// less memory and for the fuzz harnesses, whose sanitizers make a full-size decode slow.
int64_t image_max_pixels(void);
void image_set_max_pixels(int64_t max_pixels);  // 1..IMAGE_MAX_PIXELS

Image image_alloc(int w, int h);  // uninitialised pixels
void image_free(Image *img);      // frees the pixels, leaves an empty image

// Reads and decodes a JPEG or PNG file to RGB. Errors name the file: cannot open, empty,
// truncated JPEG (no end-of-image marker), larger than the side or pixel limits, or the decoder's
// reason for a corrupt file.
int image_decode_file(const char *path, Image *out, DataError *err);
// The same for bytes in memory; `name` is used in error messages.
int image_decode_memory(const uint8_t *buf, size_t n, const char *name, Image *out, DataError *err);
// Width and height from the file's header only (no pixel decode); an image over the pixel limit is an
// error.
int image_read_header(const char *path, int *w, int *h, DataError *err);

// In place: mirror left-right.
void image_hflip(Image *img);
// A new image holding rows [top, top+h) and columns [left, left+w) of src (must lie inside).
Image image_crop(const Image *src, int top, int left, int h, int w);
// A new image of out_w x out_h, bit-identical to Pillow's Image.resize(BILINEAR), which
// torchvision's F.resize applies to the PIL images the reference DETR transforms: a triangle
// filter whose support widens with the downscale factor (antialiased), 22-bit fixed-point weights,
// horizontal then vertical pass with 8-bit rounding between. Upscaling equals align_corners=False
// bilinear.
Image image_resize_bilinear(const Image *src, int out_w, int out_h);

// Writes pixels ([h, w, comp] with comp 1 = grey or 3 = RGB) as a baseline JPEG (quality 1..100)
// or a PNG. Deterministic: the same pixels give the same bytes.
int image_write_jpeg(const char *path, const uint8_t *px, int w, int h, int comp, int quality, DataError *err);
int image_write_png(const char *path, const uint8_t *px, int w, int h, int comp, DataError *err);
