// The public C API (include/detr.h): a model opened from a checkpoint or weights + config, and
// detection on an image file or RGB pixels - evaluation's preprocessing exactly (the val resize,
// ImageNet normalization, an all-valid mask), one image per forward or a padded and masked batch
// (detr_detect_batch), DETR's post-processing. The model is opened for inference only
// (detr_model_prepare_inference, docs/inference.md): its backbone's frozen norms folded into the
// convolutions, the decoder's terms of the learned queries computed once, and the layers free to
// compute their function in a faster order.
// `detr predict` is a user of this file. Every user-input problem is checked here or returned by
// the readers below as an error; out of memory and CUDA failures stay fatal (DETR_CHECK).
#define _POSIX_C_SOURCE 200809L
#include "include/detr.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/model_file.h"
#include "core/runtime.h"
#include "datasets/image.h"
#include "datasets/transforms.h"
#include "kernels/cpu/parallel.h"
#include "nn/postprocess.h"

#if DETR_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

struct detr_model {
  DetrModel *net;
  AugConfig aug;      // the val transform: shortest side image_size, longest at most max_size
  float lut[3][256];  // pixel value -> normalized network input, per channel
  int image_size, max_size;
  int n_labels;          // num_classes: labels 0..n_labels-1 (the last logit is no-object)
  char **names;          // [n_labels], never NULL entries
  unsigned outputs;      // DETR_OUTPUT_* a detection keeps (detr_set_outputs)
  int threads;           // OpenMP threads of a detection (0: OpenMP's default)
  Runtime *rt;           // the model's tape, scopes and precision (core/runtime.h), bound for each call
  pthread_mutex_t lock;  // a call on the model holds it: calls on one model from two threads take turns
  bool on_gpu;           // its calls hold gpu_lock too
};

// The optional outputs of a forward on one image, on the host (every query's map; what the
// result keeps of them is its detections' maps).
typedef struct {
  int h, w;            // the feature map
  float *attention;    // [Q, h * w] or NULL
  int n_layers;        // encoder layers with clusters (0: not asked for)
  int *clusters;       // [n_layers, h * w] or NULL
  int *cluster_count;  // [n_layers]
} Outputs;

struct detr_result {
  int width, height;  // of the image given
  int count, dropped;
  detr_detection *items;  // [count] by falling score
  char *strings;          // the names, NUL-separated; items[i].name points in here
  Outputs out;            // attention [count, h * w] (item i's map in row i), clusters as made
};

// Each model has a runtime of its own (core/runtime.h) and a lock: two threads detect on two models
// at once, sharing no state; calls on one model take turns (include/detr.h: Threads). Models on the
// GPU share its one stream and library handles (kernels/cuda/runtime.cu), so their calls take turns.
static pthread_mutex_t gpu_lock = PTHREAD_MUTEX_INITIALIZER;

// Locks m and binds its runtime to this thread; returns the runtime bound before (model_leave's).
static Runtime *model_enter(detr_model *m) {
  pthread_mutex_lock(&m->lock);
  if (m->on_gpu) pthread_mutex_lock(&gpu_lock);
  return runtime_bind(m->rt);
}

static void model_leave(detr_model *m, Runtime *before) {
  runtime_bind(before);
  if (m->on_gpu) pthread_mutex_unlock(&gpu_lock);
  pthread_mutex_unlock(&m->lock);
}

#define ERR_CAP 4096
static _Thread_local char last_error[ERR_CAP];

static detr_status fail(detr_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static detr_status fail(detr_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return st;
}

const char *detr_version(void) { return DETR_VERSION_STRING; }
const char *detr_last_error(void) { return last_error; }

const char *detr_status_name(detr_status status) {
  switch (status) {
    case DETR_OK: return "DETR_OK";
    case DETR_ERR_ARGUMENT: return "DETR_ERR_ARGUMENT";
    case DETR_ERR_IO: return "DETR_ERR_IO";
    case DETR_ERR_FORMAT: return "DETR_ERR_FORMAT";
    case DETR_ERR_MISMATCH: return "DETR_ERR_MISMATCH";
    case DETR_ERR_CONFIG: return "DETR_ERR_CONFIG";
    case DETR_ERR_IMAGE: return "DETR_ERR_IMAGE";
    case DETR_ERR_DEVICE: return "DETR_ERR_DEVICE";
    case DETR_ERR_RUNTIME: return "DETR_ERR_RUNTIME";
  }
  return "unknown status";
}

detr_options detr_options_default(void) { return (detr_options){.device = DETR_DEVICE_CPU}; }

// --- opening -------------------------------------------------------------------------------------

static detr_status check_options(const detr_options *o, int *n_sets, Device *dev) {
  if (o->device != DETR_DEVICE_CPU && o->device != DETR_DEVICE_CUDA)
    return fail(DETR_ERR_ARGUMENT, "options.device %d: expected DETR_DEVICE_CPU or DETR_DEVICE_CUDA", (int)o->device);
  if (o->image_size != 0 && (o->image_size < 32 || o->image_size > 4096))
    return fail(DETR_ERR_ARGUMENT, "options.image_size %d: expected 0 (default) or 32..4096", o->image_size);
  if (o->max_size != 0 && (o->max_size < 32 || o->max_size > 8192))
    return fail(DETR_ERR_ARGUMENT, "options.max_size %d: expected 0 (default) or 32..8192", o->max_size);
  if (o->threads < 0 || o->threads > 1024)
    return fail(DETR_ERR_ARGUMENT, "options.threads %d: expected 0 (default) or 1..1024", o->threads);
  if (o->precision < DETR_PRECISION_DEFAULT || o->precision > DETR_PRECISION_BF16)
    return fail(DETR_ERR_ARGUMENT, "options.precision %d: expected a DETR_PRECISION_* value", (int)o->precision);
  *n_sets = 0;
  while (o->sets && o->sets[*n_sets]) {
    if (++*n_sets > 4096) return fail(DETR_ERR_ARGUMENT, "options.sets: more than 4096 entries (not NULL-terminated?)");
  }
  *dev = DEVICE_CPU;
  if (o->device == DETR_DEVICE_CUDA) {
#if DETR_HAVE_CUDA
    char why[512];
    int n = cuda_device_probe(why, sizeof why);
    if (n <= 0) return fail(DETR_ERR_DEVICE, "CUDA: %s%s", n == 0 ? "no CUDA device: " : "", why);
    *dev = DEVICE_CUDA;
#else
    return fail(DETR_ERR_DEVICE, "CUDA: this build of libdetr has no CUDA backend (configure with -DDETR_CUDA=ON)");
#endif
  }
  return DETR_OK;
}

// The options' sets with the precision's keys after them (all[] holds n_sets + 3), NULL-terminated;
// returns how many, or -1 with last_error set (bf16 on a device without it: DETR_ERR_DEVICE).
static int precision_sets(const detr_options *o, Device dev, int n_sets, const char **all) {
  static const DetrMath MATH[] = {[DETR_PRECISION_DEFAULT] = DETR_MATH_DEFAULT,
                                  [DETR_PRECISION_FP32] = DETR_MATH_FP32,
                                  [DETR_PRECISION_TF32] = DETR_MATH_TF32,
                                  [DETR_PRECISION_BF16] = DETR_MATH_BF16};
  for (int i = 0; i < n_sets; i++) all[i] = o->sets[i];
  char why[512];
  int k = detr_math_keys(MATH[o->precision], true, dev, all, n_sets, all + n_sets, why, sizeof why);
  if (k < 0) {
    fail(DETR_ERR_DEVICE, "options.precision %s", why);
    return -1;
  }
  all[n_sets + k] = NULL;
  return n_sets + k;
}

// Names of labels 0..n-1: from the COCO file of the options, else the checkpoint's, else "class N".
static detr_status make_names(detr_model *m, const detr_options *o, const char *checkpoint, const CheckpointInfo *ci,
                              char *err, size_t err_cap) {
  LabelNames nm = {0};
  detr_status st = DETR_OK;
  if (o->names) st = label_names_from_coco(o->names, &nm, err, err_cap);
  else if (ci->categories && label_names_from_text(checkpoint, ci->categories, &nm, err, err_cap)) st = DETR_ERR_FORMAT;
  if (!st) {
    m->names = detr_calloc((size_t)m->n_labels, sizeof(char *), "label names");
    for (int i = 0; i < m->n_labels; i++) {
      char buf[32];
      snprintf(buf, sizeof buf, "class %d", i);
      m->names[i] = detr_strdup(i < nm.n && nm.name[i] ? nm.name[i] : buf, "a string");
    }
  }
  label_names_free(&nm);
  return st;
}

// Frees m, which no other thread uses: its tensors in its runtime, then the runtime.
static void model_free(detr_model *m) {
  if (!m) return;
  Runtime *before = model_enter(m);
  if (m->net) detr_model_free(m->net);
  model_leave(m, before);
  runtime_destroy(m->rt);
  pthread_mutex_destroy(&m->lock);
  for (int i = 0; m->names && i < m->n_labels; i++) free(m->names[i]);
  free(m->names);
  free(m);
}

static detr_status open_model(const char *checkpoint, const char *weights, const char *config,
                              const detr_options *options, detr_model **out) {
  last_error[0] = 0;
  if (!out) return fail(DETR_ERR_ARGUMENT, "model: NULL pointer for the result");
  *out = NULL;
  if (checkpoint ? !*checkpoint : !weights || !*weights)
    return fail(DETR_ERR_ARGUMENT, "%s: NULL or empty path", checkpoint ? "checkpoint" : "weights");
  if (config && !*config) return fail(DETR_ERR_ARGUMENT, "config: empty string (NULL means detr-r50)");
  detr_options o = options ? *options : detr_options_default();
  int n_sets = 0;
  Device dev = DEVICE_CPU;
  detr_status st = check_options(&o, &n_sets, &dev);
  if (st) return st;
  const char **sets = detr_malloc((size_t)(n_sets + 3) * sizeof(char *), "config overrides");
  int n_all = precision_sets(&o, dev, n_sets, sets);
  if (n_all < 0) {
    free(sets);
    return DETR_ERR_DEVICE;
  }

  detr_model *m = detr_calloc(1, sizeof *m, "a model");
  m->rt = runtime_create();
  pthread_mutex_init(&m->lock, NULL);
  m->on_gpu = dev == DEVICE_CUDA;
  Runtime *before = model_enter(m);
  CheckpointInfo ci;
  st = model_file_load(checkpoint, weights, config, sets, n_all, dev, &m->net, &ci, last_error, sizeof last_error);
  free(sets);
  if (!st) {
    detr_model_prepare_inference(m->net);  // the weights never change here (docs/inference.md)
    m->n_labels = (int)m->net->cfg.num_classes;
    st = make_names(m, &o, checkpoint, &ci, last_error, sizeof last_error);
  }
  if (!st) {
    // The val transform of the training run (the sizes `detr train` defaults to for the model).
    model_eval_sizes(&m->net->cfg, &ci, &m->image_size, &m->max_size);
    if (o.image_size) m->image_size = o.image_size;
    if (o.max_size) m->max_size = o.max_size;
    m->threads = o.threads;
    m->aug = aug_config_scaled(false, m->image_size, m->max_size);
    m->aug.resize_transformers = m->net->cfg.resize_transformers;
    aug_normalize_lut(&m->aug, m->lut);
  }
  checkpoint_info_free(&ci);
  model_leave(m, before);
  if (st) model_free(m);
  else *out = m;
  return st;
}

detr_status detr_open_checkpoint(const char *path, const detr_options *options, detr_model **model) {
  if (!path) path = "";  // reported as a NULL or empty path
  return open_model(path, NULL, NULL, options, model);
}

detr_status detr_open_weights(const char *weights, const char *config, const detr_options *options,
                              detr_model **model) {
  return open_model(NULL, weights, config, options, model);
}

void detr_close(detr_model *model) { model_free(model); }

int detr_num_labels(const detr_model *model) { return model ? model->n_labels : 0; }

const char *detr_label_name(const detr_model *model, int label) {
  return model && label >= 0 && label < model->n_labels ? model->names[label] : NULL;
}

double detr_default_threshold(const detr_model *model) {
  return model ? detr_classes(&model->net->cfg)->score_threshold : 0.0;
}

void detr_input_size(const detr_model *model, int *image_size, int *max_size) {
  if (image_size) *image_size = model ? model->image_size : 0;
  if (max_size) *max_size = model ? model->max_size : 0;
}

detr_status detr_set_outputs(detr_model *model, unsigned outputs) {
  last_error[0] = 0;
  if (!model) return fail(DETR_ERR_ARGUMENT, "model: NULL");
  if (outputs & ~(DETR_OUTPUT_ATTENTION | DETR_OUTPUT_CLUSTERS))
    return fail(DETR_ERR_ARGUMENT, "outputs 0x%x: unknown bits (DETR_OUTPUT_ATTENTION | DETR_OUTPUT_CLUSTERS)",
                outputs);
  const EncoderAttnKind *k = detr_encoder_attn(&model->net->cfg);
  if ((outputs & DETR_OUTPUT_CLUSTERS) && !k->clusters) {
    char some[256] = "";  // the variants that do, from the registry
    for (int i = 0, n = 0; encoder_attn_at(i) && n < (int)sizeof some; i++)
      if (encoder_attn_at(i)->clusters)
        n += snprintf(some + n, sizeof some - (size_t)n, "%s%s", n ? ", " : "", encoder_attn_at(i)->name);
    return fail(DETR_ERR_CONFIG,
                "clusters: the model's encoder attention is '%s', which forms no clusters (one that "
                "does: encoder_attn=%s)",
                k->name, some);
  }
  if ((outputs & DETR_OUTPUT_CLUSTERS) && model->net->cfg.enc_layers < 1)
    return fail(DETR_ERR_CONFIG, "clusters: the model has no encoder layer (enc_layers=0)");
  pthread_mutex_lock(&model->lock);
  model->outputs = outputs;
  pthread_mutex_unlock(&model->lock);
  return DETR_OK;
}

// --- detection -----------------------------------------------------------------------------------

static void outputs_free(Outputs *o) {
  free(o->attention);
  free(o->clusters);
  free(o->cluster_count);
  *o = (Outputs){0};
}

// The outputs asked for of image b of the forward, copied to the host. Returns DETR_OK, or
// DETR_ERR_RUNTIME when a part of the model does not report one.
static detr_status copy_outputs(const detr_model *m, const DetrOutput *fwd, int64_t b, Outputs *o) {
  *o = (Outputs){.h = (int)fwd->feat_h, .w = (int)fwd->feat_w};
  int64_t N = fwd->feat_h * fwd->feat_w;
  if (m->outputs & DETR_OUTPUT_ATTENTION) {
    if (!fwd->cross_attn)
      return fail(DETR_ERR_RUNTIME, "attention: the model's decoder '%s' does not report its cross-attention",
                  detr_decoder(&m->net->cfg)->name);
    int64_t per = fwd->cross_attn->numel / fwd->cross_attn->shape.d[0];                          // Q * N
    float *all = detr_malloc((size_t)fwd->cross_attn->numel * sizeof(float), "attention maps");  // [B, Q, N]
    tensor_to_host(fwd->cross_attn, all);
    o->attention = detr_malloc((size_t)per * sizeof(float), "attention maps");  // [Q, N]
    memcpy(o->attention, all + b * per, (size_t)per * sizeof(float));
    free(all);
  }
  if (m->outputs & DETR_OUTPUT_CLUSTERS) {
    o->n_layers = fwd->n_attn;
    o->clusters = detr_malloc((size_t)(fwd->n_attn * N) * sizeof(int), "cluster maps");  // [n_attn, N]
    o->cluster_count = detr_calloc((size_t)fwd->n_attn, sizeof(int), "cluster counts");
    for (int l = 0; l < fwd->n_attn; l++) {
      const int32_t *c = fwd->attn[l].clusters ? fwd->attn[l].clusters + b * N : NULL;  // [N]: image b
      if (!c) {
        outputs_free(o);
        return fail(DETR_ERR_RUNTIME, "clusters: encoder layer %d reports none", l);
      }
      for (int64_t i = 0; i < N; i++) {
        o->clusters[l * N + i] = c[i];
        if (c[i] >= o->cluster_count[l]) o->cluster_count[l] = c[i] + 1;
      }
    }
  }
  return DETR_OK;
}

static int by_score(const void *a, const void *b) {
  const Detection *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  if (x->query != y->query) return x->query < y->query ? -1 : 1;  // ties: query, then label (a total order)
  return (x->label > y->label) - (x->label < y->label);
}

// The detections scoring >= threshold among dets [K] (reordered), with their names copied; the
// result takes the outputs o, keeping of the attention maps its detections' queries'.
static detr_result *make_result(const detr_model *m, Detection *dets, int64_t K, double threshold, int w, int h,
                                Outputs *o) {
  detr_result *r = detr_calloc(1, sizeof *r, "a result");
  r->width = w, r->height = h;
  int64_t kept = 0;
  for (int64_t k = 0; k < K; k++) {
    const Detection *d = &dets[k];
    bool finite =
        isfinite(d->score) && isfinite(d->box[0]) && isfinite(d->box[1]) && isfinite(d->box[2]) && isfinite(d->box[3]);
    if (!finite) r->dropped++;  // NaN weights: never a silent "detection"
    else if (d->score >= threshold) dets[kept++] = *d;
  }
  qsort(dets, (size_t)kept, sizeof(Detection), by_score);
  size_t bytes = 1;
  for (int64_t i = 0; i < kept; i++) bytes += strlen(m->names[dets[i].label]) + 1;
  r->items = detr_malloc((size_t)(kept ? kept : 1) * sizeof(detr_detection), "detections");
  r->strings = detr_malloc(bytes, "label strings");
  char *s = r->strings;
  for (int64_t i = 0; i < kept; i++) {
    const Detection *d = &dets[i];
    size_t n = strlen(m->names[d->label]) + 1;
    memcpy(s, m->names[d->label], n);
    r->items[i] = (detr_detection){.box = {d->box[0], d->box[1], d->box[2], d->box[3]},
                                   .score = d->score,
                                   .label = d->label,
                                   .name = s,
                                   .query = (int)d->query};
    s += n;
  }
  r->count = (int)kept;
  r->out = *o;
  *o = (Outputs){0};
  if (r->out.attention) {  // every query's map [Q, N] -> the detections' [count, N]
    size_t N = (size_t)r->out.h * (size_t)r->out.w;
    float *maps = detr_malloc((size_t)(kept ? kept : 1) * N * sizeof(float), "attention maps");
    for (int64_t i = 0; i < kept; i++) memcpy(maps + i * N, r->out.attention + dets[i].query * N, N * sizeof(float));
    free(r->out.attention);
    r->out.attention = maps;
  }
  return r;
}

// An image after the val transform, to be normalized straight into the batch's input tensor. Where
// the transform keeps the size (a caller that sends the model's input size), the caller's bytes are
// read in place: no copy of the pixels, and no fresh float buffer whose pages the kernel would map
// and zero on every call (bench/README.md#bench_serve: 2.61 -> 2.40-2.45 ms a bf16 forward, 2 threads).
typedef struct {
  Image owned;               // the transform's output where it resized or decoded, else empty
  const unsigned char *rgb;  // [h, w, 3] the pixels to normalize: owned.data or the caller's
  int h, w;                  // after the val transform
  int ow, oh;                // as given
} Prepared;

// The val transform of rgb [height, width, 3]; img, when given, owns rgb and is consumed.
static Prepared prepare(const detr_model *m, const unsigned char *rgb, int width, int height, Image *img) {
  Prepared p = {.rgb = rgb, .w = width, .h = height, .ow = width, .oh = height};
  if (img) p.owned = *img;
  int nw, nh;
  aug_resize_size(width, height, m->aug.val_size, m->aug.max_size, m->aug.resize_transformers, &nw, &nh);
  if (nw != width || nh != height) {
    Image src = {.w = width, .h = height, .data = (uint8_t *)rgb};  // read only
    Image resized = image_resize_bilinear(&src, nw, nh);
    image_free(&p.owned);
    p.owned = resized;
    p.rgb = resized.data, p.w = nw, p.h = nh;
  }
  return p;
}

// The batch of n prepared images normalized (each channel by its table) and padded into
// pixels [n, H, W, 3] (zeros: the reference pads the normalized tensor), with the mask [n, H, W]
// (1 = padding); a row of pixels at a time, on all threads.
static void fill_batch(const detr_model *m, const Prepared *p, int n, int64_t H, int64_t W, float *pixels,
                       uint8_t *mask) {
  const float(*lut)[256] = m->lut;
#pragma omp parallel for schedule(static) if (n * H * W * 3 > PARALLEL_MIN_LIGHT)
  for (int64_t row = 0; row < n * H; row++) {
    int64_t b = row / H, y = row % H, w = y < p[b].h ? p[b].w : 0;  // the image's pixels in this row
    pad_normalize_row(w ? p[b].rgb + y * w * 3 : NULL, w, W, lut, pixels + row * W * 3, mask + row * W);
  }
}

// One forward of the n prepared images (their owned pixels freed here); out[n] their results, or all
// NULL on failure.
static detr_status detect_prepared(detr_model *m, Prepared *p, int n, double threshold, detr_result **out) {
  int64_t H = 0, W = 0, K = detr_detections_per_image(&m->net->cfg);
  int *ow = detr_malloc((size_t)(2 * n) * sizeof(int), "image sizes"), *oh = ow + n;  // [n] each
  for (int b = 0; b < n; b++) {
    if (p[b].h > H) H = p[b].h;
    if (p[b].w > W) W = p[b].w;
    ow[b] = p[b].ow, oh[b] = p[b].oh;
  }
  uint8_t *mask = detr_malloc((size_t)(n * H * W), "a padding mask");                // [n, H, W]
  Detection *dets = detr_malloc((size_t)(n * K) * sizeof(Detection), "detections");  // [n, K]
  Outputs *extra = detr_calloc((size_t)n, sizeof(Outputs), "outputs");               // [n]

  Runtime *before = model_enter(m);
  int threads_before = omp_get_max_threads();
  if (m->threads) omp_set_num_threads(m->threads);
  bool was = autograd_set_grad_enabled(false);
  ScopeMark mark = tensor_scope_mark();
  // [n, H, W, 3], padded straight into a CPU tensor: the allocator's arena keeps its pages mapped
  // from one call to the next, where a malloc'd buffer of this size is fresh pages every time.
  Tensor *images = tensor_new_scoped(DEVICE_CPU, SHAPE(n, H, W, 3));
  fill_batch(m, p, n, H, W, images->data, mask);
  for (int b = 0; b < n; b++) image_free(&p[b].owned);
  if (m->net->params.device != DEVICE_CPU) images = tensor_scoped(tensor_to_device(images, m->net->params.device));
  NnCtx ctx = {.training = false,
               .want_cross_attn = m->outputs & DETR_OUTPUT_ATTENTION,
               .want_clusters = m->outputs & DETR_OUTPUT_CLUSTERS};
  DetrOutput fwd;
  detr_status st = DETR_OK;
  if (detr_model_forward(m->net, &ctx, images, mask, &fwd, last_error, sizeof last_error)) {
    st = DETR_ERR_RUNTIME;
  } else {
    detr_postprocess_output(m->net, &fwd, ow, oh, dets);
    for (int b = 0; b < n && !st; b++) st = copy_outputs(m, &fwd, b, &extra[b]);
    detr_output_free(&fwd);
  }
  tensor_scope_release(mark);
  autograd_set_grad_enabled(was);
  omp_set_num_threads(threads_before);
  model_leave(m, before);

  for (int b = 0; b < n; b++) {
    if (!st) out[b] = make_result(m, dets + b * K, K, threshold, ow[b], oh[b], &extra[b]);
    outputs_free(&extra[b]);
  }
  free(extra), free(mask), free(dets), free(ow);
  return st;
}

// img is consumed. The forward of one image; its detections (every query's for DETR) in the
// original pixels.
static detr_status detect_image(detr_model *m, Image *img, double threshold, detr_result **out) {
  Prepared p = prepare(m, img->data, img->w, img->h, img);
  return detect_prepared(m, &p, 1, threshold, out);
}

static detr_status check_detect(const detr_model *model, double threshold, detr_result **result) {
  last_error[0] = 0;
  if (!result) return fail(DETR_ERR_ARGUMENT, "result: NULL pointer");
  *result = NULL;
  if (!model) return fail(DETR_ERR_ARGUMENT, "model: NULL");
  if (!(threshold >= 0.0 && threshold <= 1.0))
    return fail(DETR_ERR_ARGUMENT, "threshold %g: expected a number in [0, 1]", threshold);
  return DETR_OK;
}

detr_status detr_detect_file(detr_model *model, const char *path, double threshold, detr_result **result) {
  detr_status st = check_detect(model, threshold, result);
  if (st) return st;
  if (!path || !*path) return fail(DETR_ERR_ARGUMENT, "image path: NULL or empty");
  if (file_check_readable(path, last_error, sizeof last_error)) return DETR_ERR_IO;
  Image img = {0};
  DataError derr;
  if (image_decode_file(path, &img, &derr)) return fail(DETR_ERR_IMAGE, "%s", derr.msg);
  return detect_image(model, &img, threshold, result);
}

// what: "rgb" or "images[i]", for the message.
static detr_status check_rgb(const unsigned char *rgb, size_t size, int width, int height, const char *what) {
  if (!rgb) return fail(DETR_ERR_ARGUMENT, "%s: NULL pixels", what);
  if (width < 1 || height < 1 || width > IMAGE_MAX_SIDE || height > IMAGE_MAX_SIDE)
    return fail(DETR_ERR_ARGUMENT, "%s: image size %dx%d: width and height must be in 1..%d", what, width, height,
                IMAGE_MAX_SIDE);
  size_t want = (size_t)width * (size_t)height * 3;
  if (size != want)
    return fail(DETR_ERR_ARGUMENT, "%s: %zu bytes for a %dx%d image, expected %zu (width * height * 3)", what, size,
                width, height, want);
  return DETR_OK;
}

detr_status detr_detect_rgb(detr_model *model, const unsigned char *rgb, size_t size, int width, int height,
                            double threshold, detr_result **result) {
  detr_status st = check_detect(model, threshold, result);
  if (!st) st = check_rgb(rgb, size, width, height, "rgb");
  if (st) return st;
  Prepared p = prepare(model, rgb, width, height, NULL);
  return detect_prepared(model, &p, 1, threshold, result);
}

#define DETR_BATCH_MAX 64

detr_status detr_detect_batch(detr_model *model, const detr_image *images, int n, double threshold,
                              detr_result **results) {
  last_error[0] = 0;
  if (!results) return fail(DETR_ERR_ARGUMENT, "results: NULL pointer");
  if (n < 1 || n > DETR_BATCH_MAX) return fail(DETR_ERR_ARGUMENT, "n %d: expected 1..%d images", n, DETR_BATCH_MAX);
  for (int i = 0; i < n; i++) results[i] = NULL;
  detr_result *unused;
  detr_status st = check_detect(model, threshold, &unused);
  if (!st && !images) st = fail(DETR_ERR_ARGUMENT, "images: NULL");
  for (int i = 0; i < n && !st; i++) {
    char what[32];
    snprintf(what, sizeof what, "images[%d]", i);
    st = check_rgb(images[i].rgb, images[i].size, images[i].width, images[i].height, what);
  }
  if (st) return st;
  Prepared *p = detr_malloc((size_t)n * sizeof(Prepared), "a batch");
  for (int i = 0; i < n; i++) p[i] = prepare(model, images[i].rgb, images[i].width, images[i].height, NULL);
  st = detect_prepared(model, p, n, threshold, results);
  free(p);
  return st;
}

// --- results -------------------------------------------------------------------------------------

int detr_result_count(const detr_result *result) { return result ? result->count : 0; }

const detr_detection *detr_result_get(const detr_result *result, int i) {
  return result && i >= 0 && i < result->count ? &result->items[i] : NULL;
}

int detr_result_dropped(const detr_result *result) { return result ? result->dropped : 0; }

void detr_result_image_size(const detr_result *result, int *width, int *height) {
  if (width) *width = result ? result->width : 0;
  if (height) *height = result ? result->height : 0;
}

const float *detr_result_attention(const detr_result *result, int i, int *h, int *w) {
  bool ok = result && result->out.attention && i >= 0 && i < result->count;
  if (h) *h = ok ? result->out.h : 0;
  if (w) *w = ok ? result->out.w : 0;
  return ok ? result->out.attention + (size_t)i * result->out.h * result->out.w : NULL;
}

const int *detr_result_clusters(const detr_result *result, int layer, int *h, int *w, int *count) {
  int n = result ? result->out.n_layers : 0;
  if (layer < 0) layer += n;
  bool ok = layer >= 0 && layer < n;
  if (h) *h = ok ? result->out.h : 0;
  if (w) *w = ok ? result->out.w : 0;
  if (count) *count = ok ? result->out.cluster_count[layer] : 0;
  return ok ? result->out.clusters + (size_t)layer * result->out.h * result->out.w : NULL;
}

void detr_result_free(detr_result *result) {
  if (!result) return;
  outputs_free(&result->out);
  free(result->items);
  free(result->strings);
  free(result);
}
