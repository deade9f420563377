// COCO detection datasets: an instances JSON (plain or .json.gz) read with a streaming parser
// (YAJL callbacks; segmentation polygons and RLEs are skipped as they stream past, never built),
// category-id mapping, validation of every annotation under a bad-input policy, and loading one
// sample (decoded image + the training targets the reference DETR builds from it).
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "datasets/data_util.h"
#include "datasets/image.h"
#include "datasets/transforms.h"

// Limits an instances file cannot exceed, each a clear error naming the file and the limit, so
// that a small file cannot make a reader allocate or work without bound (eval/cocoeval_io.c
// applies them too):
#define COCO_MAX_CATEGORY_ID (1 << 20)  // the label map is an array indexed by category id
#define COCO_MAX_STRING_BYTES 4096      // a file_name, category name or supercategory (a bad item)
// Items per byte on disk and a .gz file's expansion: datasets/json_stream.h's JSON_* limits, as
// for every JSON input.

typedef struct {
  int64_t id;
  const char *file_name;  // relative to the image folder (points into the dataset's string pool)
  int width, height;      // as the annotation file states them
  int64_t first_ann;      // this image's annotations are anns[first_ann, first_ann + n_anns)
  int n_anns;
} CocoImage;

typedef struct {
  int64_t id;
  int64_t image_id;
  int64_t image_index;  // into images
  int category_id;
  bool iscrowd;        // kept for evaluation, never a training target
  double bbox[4];      // x, y, w, h as in the file
  double area;         // the segmentation area (bbox w*h when the file has none)
  int64_t file_index;  // position in the file's "annotations" array (for messages)
} CocoAnn;

typedef struct {
  int id;
  const char *name;
  const char *supercategory;
} CocoCategory;

// What the reader saw and what it skipped (skip policy) or clamped.
typedef struct {
  int64_t images, annotations, categories;  // kept
  int64_t crowd_annotations;                // of the kept annotations
  int64_t images_without_annotations;
  int64_t clamped_boxes;  // partly outside their image: kept, clipped for training as the reference
  // Skipped under BAD_INPUT_SKIP (each also printed as a warning, the first few of each kind):
  int64_t malformed_items;       // missing or mistyped fields
  int64_t duplicate_ids;         // an image or category id seen before
  int64_t unknown_image_ids;     // annotation of an image the file does not list
  int64_t unknown_category_ids;  // annotation with a category the file does not list
  int64_t zero_size_boxes;       // bbox width or height <= 0
  int64_t duplicate_files;       // an image file named by a second image id
  int64_t out_of_image_boxes;    // bbox entirely outside its image
  int64_t missing_images;        // image file absent or unreadable (check_images)
  int64_t corrupt_images;        // not a JPEG/PNG, or a size other than the file states (check_images)
  int64_t skipped_annotations;   // total annotations dropped, including those of skipped images
  int64_t skipped_images;        // total images dropped
} CocoStats;

typedef struct {
  const char *ann_path;   // instances_*.json or .json.gz
  const char *image_dir;  // folder the file_names are relative to (may be NULL: no image access)
  BadInputPolicy policy;
  bool check_images;       // at open: every image file exists and its header matches its size
  bool contiguous_labels;  // labels 0..K-1 in category-id order; default: label = category id
  bool quiet;              // no summary line on stderr (warnings are still printed)
  bool categories_only;    // the categories alone (class names): images and annotations skipped unread
} CocoOpenConfig;

typedef struct {
  char *ann_path, *image_dir;
  CocoImage *images;  // [n_images], sorted by id: the reference's dataset order
  int64_t n_images;
  CocoAnn *anns;  // [n_anns], grouped by image, file order within an image
  int64_t n_anns;
  CocoCategory *categories;  // [n_categories], sorted by id
  int n_categories;
  int max_category_id;
  bool contiguous_labels;
  int num_classes;         // model classes without no-object: max id + 1, or n_categories
  int *label_of_category;  // [max_category_id + 1]: label, or -1 for ids the file does not list
  char *strings;           // pool holding file and category names
  CocoStats stats;
} CocoDataset;

// Reads and validates an annotation file. Bad items are skipped with warnings or fail the call,
// per cfg->policy; malformed or truncated JSON always fails. On failure *out is NULL and err
// names the file and the item.
int coco_open(const CocoOpenConfig *cfg, CocoDataset **out, DataError *err);
void coco_free(CocoDataset *ds);

// Category id -> label (-1 if unknown), label -> category id (-1 if none).
int coco_label_of(const CocoDataset *ds, int category_id);
int coco_category_of(const CocoDataset *ds, int label);
// Index of an image id in ds->images, or -1.
int64_t coco_find_image(const CocoDataset *ds, int64_t image_id);
// One line: kept counts, then what was skipped or clamped.
void coco_print_stats(const CocoDataset *ds, FILE *f);

// Decodes image `index` and builds its targets as the reference's ConvertCocoPolysToMask: crowd
// annotations dropped, boxes to x0y0x1y1 in float32 clamped to the decoded image, empty boxes
// dropped, labels mapped. img must be empty or previously returned (it is freed first).
int coco_load_sample(const CocoDataset *ds, int64_t index, Image *img, Target *target, DataError *err);
