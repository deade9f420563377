// The model's detections on the first val images, drawn for TensorBoard (train/val_pictures.h).
#include "train/val_pictures.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "core/error.h"
#include "datasets/loader.h"
#include "nn/postprocess.h"
#include "viz/draw.h"

static int by_score(const void *a, const void *b) {
  float sa = ((const Detection *)a)->score, sb = ((const Detection *)b)->score;
  return (sa < sb) - (sa > sb);  // best first
}

static int clamp_px(double v, int hi) { return v < -1.0 ? -1 : v > hi ? hi : (int)lrint(v); }

// A box [x0, y0, x1, y1] in image pixels on the picture at scale s.
static DrawRect box_on(const float box[4], double s, const Image *pic) {
  return (DrawRect){clamp_px(box[0] * s, pic->w), clamp_px(box[1] * s, pic->h), clamp_px(box[2] * s, pic->w),
                    clamp_px(box[3] * s, pic->h)};
}

// dets [n], best first: boxes lowest score first (the best on top), then the labels, each where it
// covers no label placed before it.
static void draw_dets(Image *pic, double s, const Detection *dets, int n, const CocoDataset *ds) {
  int thick = 1 + (pic->w > pic->h ? pic->w : pic->h) / 400, scale = draw_text_scale(pic->w, pic->h);
  for (int i = n - 1; i >= 0; i--) {
    DrawRect b = box_on(dets[i].box, s, pic);
    draw_rect(pic, b.x0, b.y0, b.x1, b.y1, draw_class_colour(dets[i].label), thick);
  }
  DrawRect taken[64];
  for (int k = 0; k < n && k < 64; k++) {
    int category = coco_category_of(ds, dets[k].label), c = 0;
    while (c < ds->n_categories && ds->categories[c].id != category) c++;
    char text[160];
    if (c < ds->n_categories) snprintf(text, sizeof text, "%s %.2f", ds->categories[c].name, dets[k].score);
    else snprintf(text, sizeof text, "label %d %.2f", dets[k].label, dets[k].score);
    int lw = draw_text_width(text, scale) + 2 * scale, lh = draw_text_height(text, scale) + 2 * scale;
    taken[k] = draw_place_label(pic->w, pic->h, box_on(dets[k].box, s, pic), lw, lh, taken, k);
    draw_label(pic, taken[k].x0, taken[k].y0, text, draw_class_colour(dets[k].label), scale, scale);
  }
}

// One picture: image `index` of ds as decoded from its file, scaled up, its ground truth in white,
// then its best detections (dets [K], any order; sorted here).
static int draw_one(const CocoDataset *ds, int64_t index, Detection *dets, int64_t K, Image *pic, char *err,
                    size_t err_cap) {
  Image img = {0};
  Target gt = {0};
  DataError derr;
  if (coco_load_sample(ds, index, &img, &gt, &derr)) {
    snprintf(err, err_cap, "%s", derr.msg);
    target_free(&gt);
    return -1;
  }
  int dw, dh;
  draw_display_size(img.w, img.h, &dw, &dh);
  *pic = image_resize_bilinear(&img, dw, dh);
  double s = (double)dw / img.w;
  for (int i = 0; i < gt.n; i++) {
    DrawRect b = box_on(gt.boxes + 4 * i, s, pic);
    draw_rect(pic, b.x0, b.y0, b.x1, b.y1, (Rgb){255, 255, 255}, 1);
  }
  qsort(dets, (size_t)K, sizeof *dets, by_score);
  int shown = gt.n > 0 ? gt.n : 1;
  draw_dets(pic, s, dets, shown < K ? shown : (int)K, ds);
  image_free(&img);
  target_free(&gt);
  return 0;
}

// The forward pass of one batch without gradients, and its detections in image pixels:
// dets [b->size * K].
static int detect(const DetrModel *m, const Batch *b, Detection *dets, char *err, size_t err_cap) {
  bool was = autograd_set_grad_enabled(false);
  ScopeMark mark = tensor_scope_mark();
  NnCtx ctx = {.training = false};
  Tensor *images = tensor_scoped(batch_images_tensor(b, m->params.device));
  DetrOutput o;
  int rc = detr_model_forward(m, &ctx, images, b->mask, &o, err, err_cap);
  if (rc == 0) {
    int ow[VAL_PICTURES_MAX], oh[VAL_PICTURES_MAX];
    for (int i = 0; i < b->size; i++) ow[i] = b->targets[i].orig_w, oh[i] = b->targets[i].orig_h;
    detr_postprocess_output(m, &o, ow, oh, dets);
    detr_output_free(&o);
  }
  tensor_scope_release(mark);
  autograd_set_grad_enabled(was);
  return rc;
}

int val_pictures_draw(const DetrModel *m, const CocoDataset *ds, AugConfig aug, int pad_multiple, int n,
                      ValPictures *out, char *err, size_t err_cap) {
  memset(out, 0, sizeof *out);
  n = n < VAL_PICTURES_MAX ? n : VAL_PICTURES_MAX;
  n = n < ds->n_images ? n : (int)ds->n_images;
  if (n <= 0) return 0;
  LoaderConfig lc = loader_config_make(false, n, 0, aug, BAD_INPUT_SKIP);
  lc.quiet = true;
  lc.pad_multiple = pad_multiple > 1 ? pad_multiple : 1;
  DataLoader *loader = NULL;
  DataError derr;
  const Batch *b;
  if (loader_create(ds, &lc, (LoaderPosition){0, 0}, &loader, &derr) || loader_next(loader, &b, &derr) != DATA_OK) {
    snprintf(err, err_cap, "%s", derr.msg);
    loader_free(loader);
    return -1;
  }
  int64_t K = detr_detections_per_image(&m->cfg);
  Detection *dets = detr_malloc((size_t)(b->size * K) * sizeof *dets, "val picture detections");
  int rc = detect(m, b, dets, err, err_cap);
  for (int i = 0; rc == 0 && i < b->size; i++) {
    int64_t index = b->targets[i].dataset_index;
    rc = draw_one(ds, index, dets + i * K, K, &out->img[out->n], err, err_cap);
    if (rc == 0) snprintf(out->name[out->n++], sizeof out->name[0], "%s", ds->images[index].file_name);
  }
  free(dets);
  loader_free(loader);
  if (rc) val_pictures_free(out);
  return rc;
}

void val_pictures_free(ValPictures *p) {
  for (int i = 0; i < p->n; i++) image_free(&p->img[i]);
  p->n = 0;
}
