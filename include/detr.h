/* detr.h - the C API of detr-c for object detection with DETR models (libdetr).
 *
 *   detr_model *m;
 *   if (detr_open_checkpoint("best.safetensors", NULL, &m) != DETR_OK) { puts(detr_last_error()); ... }
 *   detr_result *r;
 *   if (detr_detect_file(m, "street.jpg", 0.5f, &r) == DETR_OK) {
 *     for (int i = 0; i < detr_result_count(r); i++) {
 *       const detr_detection *d = detr_result_get(r, i);   // box in pixels, label, name, score
 *     }
 *     detr_result_free(r);
 *   }
 *   detr_close(m);
 *
 * Build: cc app.c $(pkg-config --cflags --libs detr)   (add --static for libdetr.a).
 *
 * Errors: every function that can fail returns a detr_status; DETR_OK is 0. The message of the last
 * failure on the calling thread is detr_last_error(). Bad input - a missing or unreadable file,
 * weights that are not safetensors, truncated, corrupted or of another model, a bad config, wrong
 * sizes, an image that does not decode, NULL pointers - is always an error return, never the end of
 * the process. What stays fatal (a message on stderr and exit(1)): running out of host or GPU
 * memory, a CUDA runtime failure, and internal invariant violations (bugs).
 *
 * Ownership: detr_open_* give a model, released with detr_close; detr_detect_* give a result,
 * released with detr_result_free. A result owns its strings and outlives its model. Pointers into
 * a result stay valid until it is freed; strings from detr_label_name until the model is closed.
 *
 * Threads: every function may be called from any thread. Each model has its own runtime (tape,
 * temporaries, precision) and lock: two threads detect on two models at the same time, sharing no
 * state, each detection using all cores through OpenMP/OpenBLAS (or options.threads); calls on one
 * model from several threads take turns. Models on a GPU share its stream, so their calls take turns
 * too. A model must not be closed while another thread still uses it. Results are read-only data:
 * any number of threads may read one. detr_last_error() is per thread.
 *
 * Models: DETR (ResNet-18/34/50/101 + transformer) and its encoder-attention variants (ENACT,
 * ...), from a detr-c checkpoint (`detr train` writes them; the config, class names and the
 * training image sizes are inside) or from a safetensors file of weights under the reference
 * implementation's names (official DETR weights convert to one) with a config: a preset name
 * ("detr-r50", "detr-r18-small", "tiny") or a file of key=value lines.
 */
#ifndef DETR_PUBLIC_H
#define DETR_PUBLIC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DETR_VERSION_MAJOR 0
#define DETR_VERSION_MINOR 4
#define DETR_VERSION_PATCH 0
#define DETR_VERSION_STRING "0.4.0"
/* A single number for comparisons: 0.4.0 is 400 (0.3 added detr_default_threshold, detr_set_outputs,
 * detr_result_attention and detr_result_clusters; 0.4 detr_detect_batch, detr_image,
 * detr_options.threads and detr_options.precision, which change detr_options' size: recompile
 * against this header). */
#define DETR_VERSION (DETR_VERSION_MAJOR * 10000 + DETR_VERSION_MINOR * 100 + DETR_VERSION_PATCH)

/* The library exports these symbols only; everything else in it is hidden. */
#if defined(__GNUC__) || defined(__clang__)
#define DETR_API __attribute__((visibility("default")))
#else
#define DETR_API
#endif

typedef enum detr_status {
  DETR_OK = 0,
  DETR_ERR_ARGUMENT = 1, /* a NULL pointer, a size, threshold or option out of range */
  DETR_ERR_IO = 2,       /* a file cannot be opened or read (missing, a directory, no permission) */
  DETR_ERR_FORMAT = 3,   /* a file is not what it should be: not safetensors, truncated, not a
                            detr-c checkpoint, a failed checksum, a names file that is not COCO JSON */
  DETR_ERR_MISMATCH = 4, /* weights that do not fit the model: missing, unexpected or misshapen tensors */
  DETR_ERR_CONFIG = 5,   /* an unknown preset, an unreadable or bad config file, a bad key=value */
  DETR_ERR_IMAGE = 6,    /* an image that does not decode (corrupt, truncated, not JPEG/PNG, too large) */
  DETR_ERR_DEVICE = 7,   /* the device asked for is not available (no CUDA in this build, no GPU) */
  DETR_ERR_RUNTIME = 8   /* the model refused the input (e.g. ENACT finding no valid pixel) */
} detr_status;

typedef enum detr_device { DETR_DEVICE_CPU = 0, DETR_DEVICE_CUDA = 1 } detr_device;

/* The arithmetic of a model's convolutions and GEMMs (docs/precision.md). DEFAULT: fp32, with the
 * model's own tf32 key on CUDA (a bf16 run's checkpoint runs fp32: the same detections on every
 * machine). BF16: inputs rounded to bf16, fp32 accumulation, on a CPU with AVX512-BF16 or AMX-BF16
 * (DETR_ERR_DEVICE elsewhere, naming what is missing). A "bf16=..." or "tf32=..." in sets is
 * overridden by any precision but DEFAULT. */
typedef enum detr_precision {
  DETR_PRECISION_DEFAULT = 0,
  DETR_PRECISION_FP32 = 1,
  DETR_PRECISION_TF32 = 2, /* CUDA tensor cores */
  DETR_PRECISION_BF16 = 3
} detr_precision;

typedef struct detr_model detr_model;   /* opaque: a loaded model and its preprocessing */
typedef struct detr_result detr_result; /* opaque: the detections of one image */

/* How to open a model. Start from detr_options_default() and set what you need; a NULL options
 * pointer means the defaults. */
typedef struct detr_options {
  detr_device device;       /* DETR_DEVICE_CPU (default) or DETR_DEVICE_CUDA */
  const char *const *sets;  /* NULL-terminated "key=value" config overrides (e.g. "num_queries=50",
                              "encoder_attn=enact"), applied after the config; NULL: none */
  int image_size;           /* shortest side images are resized to, 32..4096; 0: the checkpoint's
                              training run, else the model's default (800, 320 ResNet-18/34, 128 tiny) */
  int max_size;             /* longest side limit, 32..8192; 0: likewise (1333, 512, 192) */
  const char *names;        /* a COCO instances JSON (plain or .gz) whose categories name the labels;
                              NULL: the checkpoint's names; labels without a name are "class <label>" */
  int threads;              /* CPU threads each detection of the model runs on, 1..1024; 0 (default):
                              OpenMP's default (OMP_NUM_THREADS, else every core) */
  detr_precision precision; /* DETR_PRECISION_DEFAULT (fp32) unless set */
} detr_options;

/* One detection. Boxes are absolute corners in pixels of the image given (x0, y0, x1, y1). */
typedef struct detr_detection {
  float box[4];     /* x0, y0, x1, y1 */
  float score;      /* probability of the label, in [0, 1] */
  int label;        /* the model's class index: a COCO category id for COCO-trained models */
  const char *name; /* the label's name, owned by the result */
  int query;        /* the decoder query that made it */
} detr_detection;

/* "0.3.0": the library's version (compare with DETR_VERSION_STRING, the header's). */
DETR_API const char *detr_version(void);
/* The message of the last failed call on this thread ("" when none failed). Valid until the
 * thread's next call into the library. */
DETR_API const char *detr_last_error(void);
/* "DETR_ERR_IO", ... ("unknown status" for other values). */
DETR_API const char *detr_status_name(detr_status status);
DETR_API detr_options detr_options_default(void);

/* A detr-c checkpoint. On failure *model is NULL. */
DETR_API detr_status detr_open_checkpoint(const char *path, const detr_options *options, detr_model **model);
/* Weights (safetensors, the reference implementation's names or Hugging Face transformers', whose
 * model then resizes images as transformers does) with a config: a preset name or a key=value file
 * (NULL: "detr-r50"). Loading is strict: every tensor of the model must be in the file with its
 * shape, and nothing else. On failure *model is NULL. */
DETR_API detr_status detr_open_weights(const char *weights, const char *config, const detr_options *options,
                                       detr_model **model);
/* Releases the model (NULL is fine). */
DETR_API void detr_close(detr_model *model);

/* Labels are 0 .. detr_num_labels() - 1. */
DETR_API int detr_num_labels(const detr_model *model);
/* The name of a label ("class <label>" when the model has none; NULL outside the range). */
DETR_API const char *detr_label_name(const detr_model *model, int label);
/* A score threshold that suits the model's class head: 0.5 for DETR's softmax, 0.3 for sigmoid
 * (focal-loss) heads such as Conditional DETR's, whose scores run lower (0 for a NULL model). */
DETR_API double detr_default_threshold(const detr_model *model);
/* The sizes images are resized to before the forward pass (either pointer may be NULL). */
DETR_API void detr_input_size(const detr_model *model, int *image_size, int *max_size);

/* Detects objects in a JPEG or PNG file (grey, CMYK and alpha are converted to RGB). Keeps the
 * detections scoring >= threshold (0..1; 0 keeps one per query), by falling score. On failure
 * *result is NULL. */
DETR_API detr_status detr_detect_file(detr_model *model, const char *path, double threshold, detr_result **result);
/* The same on pixels in memory: height rows of width pixels of 3 bytes (R, G, B), no padding between
 * rows; size must be width * height * 3 bytes. Width and height are 1..32768. */
DETR_API detr_status detr_detect_rgb(detr_model *model, const unsigned char *rgb, size_t size, int width, int height,
                                     double threshold, detr_result **result);

/* One image of a batch: pixels as detr_detect_rgb takes them. */
typedef struct detr_image {
  const unsigned char *rgb; /* height rows of width pixels of 3 bytes (R, G, B) */
  size_t size;              /* width * height * 3 */
  int width, height;        /* 1..32768 */
} detr_image;

/* Detects objects in n images (1..64) with one forward pass: each image resized as
 * detr_detect_rgb's, the batch padded at the bottom and right to its largest height and width with
 * the padding masked, as the reference batches images (util/misc.py, nested_tensor_from_tensor_list).
 * results[i] is image i's (as detr_detect_rgb's; free each). An image that needs no padding (the
 * batch's largest in both sides, or all of one size) gets its detections alone, up to float
 * rounding; a padded one's differ a little, through the backbone's convolutions reading the
 * padding (deep features near its bottom and right edges) and the mask at feature resolution.
 * Attention and cluster maps (detr_set_outputs) cover the batch's padded feature map, the image at
 * its top left. On failure every results[i] is NULL. */
DETR_API detr_status detr_detect_batch(detr_model *model, const detr_image *images, int n, double threshold,
                                       detr_result **results);

/* What a detection may keep beyond the boxes, for pictures of what the model attends to (`detr
 * predict --show`); off by default. */
#define DETR_OUTPUT_ATTENTION 1u /* each detection's cross-attention map: detr_result_attention */
#define DETR_OUTPUT_CLUSTERS 2u  /* the encoder attention's clusters (ENACT): detr_result_clusters */
/* Asks the model's later detections for these outputs (DETR_OUTPUT_* or'ed; 0: none). Off, a
 * detection costs what it did without them. DETR_ERR_CONFIG, and nothing changed, when the model
 * cannot give one: clusters from an encoder attention that forms none (the message names it). */
DETR_API detr_status detr_set_outputs(detr_model *model, unsigned outputs);

/* Detections in a result, by falling score (ties: query order). */
DETR_API int detr_result_count(const detr_result *result);
/* Detection i (0 <= i < count), or NULL outside the range. */
DETR_API const detr_detection *detr_result_get(const detr_result *result, int i);
/* Queries left out because their score or box was not finite (NaN weights): never a detection. */
DETR_API int detr_result_dropped(const detr_result *result);
/* Detection i's attention map (DETR_OUTPUT_ATTENTION): the last decoder layer's cross-attention
 * weights of its query averaged over the heads, on the feature map of the resized image: *h rows
 * of *w, row-major from the top-left. Softmax weights sum to 1; the k-means cross-attention's
 * (each head 1/n on the n positions its query won) sum to the share of heads whose query won any,
 * and may all be 0. NULL (sizes 0) when not asked for or i is out of range. */
DETR_API const float *detr_result_attention(const detr_result *result, int i, int *h, int *w);
/* Encoder layer `layer`'s clusters (DETR_OUTPUT_CLUSTERS; 0 is the first layer, -1 the last):
 * each feature-map position's cluster, 0 .. *count - 1, *h rows of *w as above. NULL (sizes 0)
 * when not asked for or no such layer. */
DETR_API const int *detr_result_clusters(const detr_result *result, int layer, int *h, int *w, int *count);
/* The size of the image the result is for (either pointer may be NULL). */
DETR_API void detr_result_image_size(const detr_result *result, int *width, int *height);
/* Releases the result (NULL is fine). */
DETR_API void detr_result_free(detr_result *result);

#ifdef __cplusplus
}
#endif
#endif /* DETR_PUBLIC_H */
