// `detr step`'s batch file and its forward, loss and backward (train/step_batch.h), moved out of
// cli/cmd_step.c so the fuzz harnesses, tools/train_steps.c and test_reference reach them.
#include "train/step_batch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"

static const StEntry *need(const StFile *f, const char *name, StDtype dtype, int ndim, char *err, size_t err_cap) {
  const StEntry *e = st_find(f, name);
  if (!e) snprintf(err, err_cap, "%s: no tensor '%s'", st_path(f), name);
  else if (e->dtype != dtype)
    snprintf(err, err_cap, "%s: '%s' is %s, expected %s", st_path(f), name, st_dtype_name(e->dtype),
             st_dtype_name(dtype));
  else if (e->ndim != ndim)
    snprintf(err, err_cap, "%s: '%s' has %d dimensions, expected %d", st_path(f), name, e->ndim, ndim);
  else return e;
  return NULL;
}

int step_batch_read(const StFile *f, Device dev, int64_t num_classes, StepBatch *b, char *err, size_t err_cap) {
  memset(b, 0, sizeof *b);
  const StEntry *img = need(f, "images", ST_F32, 4, err, err_cap);
  if (!img) return -1;
  // H, W >= 1: an empty images tensor (any dimension 0) could declare a B or H x W of 2^62 that
  // the file does not hold; with every dimension positive the file's bytes bound them.
  if (img->shape[1] != 3 || img->shape[0] < 1 || img->shape[2] < 1 || img->shape[3] < 1) {
    snprintf(err, err_cap, "%s: images must be [B >= 1, 3, H >= 1, W >= 1]", st_path(f));
    return -1;
  }
  b->B = img->shape[0], b->H = img->shape[2], b->W = img->shape[3];
  const StEntry *mask = st_find(f, "mask");
  if (!mask || (mask->dtype != ST_U8 && mask->dtype != ST_BOOL) || mask->ndim != 3 || mask->shape[0] != b->B ||
      mask->shape[1] != b->H || mask->shape[2] != b->W) {
    snprintf(err, err_cap, "%s: mask must be U8 [%lld, %lld, %lld]", st_path(f), (long long)b->B, (long long)b->H,
             (long long)b->W);
    return -1;
  }
  // The file holds the reference's layout, [B, 3, H, W]; the model takes [B, H, W, 3].
  // Copied out first: a tensor's bytes in the file need not be aligned for float.
  int64_t plane = b->H * b->W;
  float *planes = detr_malloc(img->nbytes, "planes");  // [B, 3, H, W]
  float *pixels = detr_malloc(img->nbytes, "pixels");  // [B, H, W, 3]
  memcpy(planes, st_data(f, img), img->nbytes);
  for (int64_t i = 0; i < b->B; i++)
    for (int64_t s = 0; s < plane; s++)
      for (int c = 0; c < 3; c++) pixels[(i * plane + s) * 3 + c] = planes[(i * 3 + c) * plane + s];
  free(planes);
  b->mask = detr_malloc((size_t)(b->B * b->H * b->W), "mask");
  b->targets = detr_calloc((size_t)b->B, sizeof(DetrTarget), "targets");
  memcpy(b->mask, st_data(f, mask), mask->nbytes);
  b->images = tensor_from_host(dev, SHAPE(b->B, b->H, b->W, 3), pixels);
  free(pixels);
  int64_t total = 0;
  for (int64_t i = 0; i < b->B; i++) {
    char nb[64], nl[64];
    snprintf(nb, sizeof nb, "targets.%lld.boxes", (long long)i);
    snprintf(nl, sizeof nl, "targets.%lld.labels", (long long)i);
    const StEntry *eb = need(f, nb, ST_F32, 2, err, err_cap), *el = eb ? need(f, nl, ST_I64, 1, err, err_cap) : NULL;
    if (!eb || !el) return -1;
    if (eb->shape[1] != 4 || el->shape[0] != eb->shape[0]) {
      snprintf(err, err_cap, "%s: %s must be [n, 4] and %s [n]", st_path(f), nb, nl);
      return -1;
    }
    total += eb->shape[0];
  }
  b->boxes_storage = detr_malloc((size_t)(total ? total : 1) * 4 * sizeof(float), "boxes_storage");
  b->labels_storage = detr_malloc((size_t)(total ? total : 1) * sizeof(int64_t), "labels_storage");
  int64_t at = 0;
  for (int64_t i = 0; i < b->B; i++) {
    char nb[64], nl[64];
    snprintf(nb, sizeof nb, "targets.%lld.boxes", (long long)i);
    snprintf(nl, sizeof nl, "targets.%lld.labels", (long long)i);
    const StEntry *eb = st_find(f, nb), *el = st_find(f, nl);
    int64_t n = eb->shape[0];
    memcpy(b->boxes_storage + 4 * at, st_data(f, eb), eb->nbytes);
    memcpy(b->labels_storage + at, st_data(f, el), el->nbytes);
    for (int64_t k = 0; k < n; k++) {
      int64_t label = b->labels_storage[at + k];
      if (label < 0 || label > num_classes) {
        snprintf(err, err_cap, "%s: %s[%lld] = %lld is outside [0, %lld]", st_path(f), nl, (long long)k,
                 (long long)label, (long long)num_classes);
        return -1;
      }
      const float *bx = b->boxes_storage + 4 * (at + k);
      for (int c = 0; c < 4; c++)
        if (!isfinite(bx[c])) {
          snprintf(err, err_cap, "%s: %s[%lld] is not finite", st_path(f), nb, (long long)k);
          return -1;
        }
    }
    b->targets[i] = (DetrTarget){.n = n, .boxes = b->boxes_storage + 4 * at, .labels = b->labels_storage + at};
    at += n;
  }
  return 0;
}

void step_batch_free(StepBatch *b) {
  tensor_release(b->images);
  free(b->mask);
  free(b->targets);
  free(b->boxes_storage);
  free(b->labels_storage);
}

int step_forward_backward(DetrModel *m, const NnCtx *ctx, Tensor *images, const uint8_t *mask,
                          const DetrTarget *targets, int64_t B, DetrOutput *out, CriterionResult *loss, char *err,
                          size_t err_cap) {
  if (detr_model_forward(m, ctx, images, mask, out, err, err_cap)) return -1;
  int64_t boxes = 0;
  for (int64_t i = 0; i < B; i++) boxes += targets[i].n;
  CriterionConfig ccfg = detr_criterion_config(&m->cfg);
  int n_aux = m->cfg.aux_loss ? out->n_layers - 1 : 0;
  if (criterion_forward(&ccfg, out->layers[out->n_layers - 1], out->layers, n_aux, targets,
                        boxes > 1 ? (float)boxes : 1.0f, NULL, loss, err, err_cap)) {
    detr_output_free(out);
    return -1;
  }
  autograd_backward(loss->total);
  return 0;
}
