// Batches for the trainer: worker threads decode and augment samples ahead of the consumer, and
// batches come out in order. A batch depends only on (seed, epoch, batch number): the epoch's
// shuffle comes from (seed, epoch), each sample's augmentation from (seed, epoch, dataset index),
// so 0, 1 or N workers give byte-identical batches, and a run resumed at a saved position sees
// the same batches an uninterrupted run would.
//
// Batches are host structs holding what the reference DETR's NestedTensor + targets hold, images
// channels last (the backbone's layout, so the forward permutes nothing): images padded bottom/right to the largest in the batch (its height and width rounded up to a multiple of
// LoaderConfig.pad_multiple), a mask with 1 at padding, per-image targets with normalized cxcywh
// boxes relative to the unpadded augmented image.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "datasets/coco.h"
#include "datasets/transforms.h"
#include "tensor/tensor.h"

typedef struct {
  int64_t image_id;
  int64_t dataset_index;  // into ds->images
  int orig_w, orig_h;     // decoded image size
  int w, h;               // after augmentation (the unpadded part of the batch image)
  int n;                  // boxes
  const float *boxes;     // [n, 4] cx, cy, w, h divided by (w, h, w, h)
  const int64_t *labels;  // [n]
} BatchTarget;

typedef struct {
  int size;              // images (fewer than batch_size at an epoch's end, or after skipped images)
  int h, w;              // padded size
  float *images;         // [size, h, w, 3] normalized, 0 in the padding
  uint8_t *mask;         // [size, h, w] 1 = padding
  BatchTarget *targets;  // [size]
  int64_t epoch, index;  // which batch this is: number `index` of epoch `epoch`
  int skipped;           // images of this batch dropped under the skip policy
  // Storage, reused from batch to batch (capacities in elements).
  float *box_pool;      // [sum n, 4]
  int64_t *label_pool;  // [sum n]
  int64_t images_cap, mask_cap, pool_cap, targets_cap;
} Batch;

// Where the loader is: the next batch it delivers is number `batch` of `epoch`. Save both in a
// checkpoint and pass them back to resume.
typedef struct {
  int64_t epoch, batch;
} LoaderPosition;

typedef struct {
  int batch_size;  // 2
  // Decode/augment threads; 0 loads on the calling thread. They run at background priority
  // (SCHED_IDLE): on cores the training leaves idle, never preempting its compute threads. A batch
  // the consumer needs and no worker has started, or one a worker has not finished within the
  // wait below (a busy machine starves background threads), the consumer builds itself.
  int num_workers;
  // Microseconds the consumer waits for a worker's unfinished batch before building it itself; -1
  // (default): 2 ms + twice the batch's build time as measured so far (CPU time per image).
  int worker_wait_us;
  // Tests: a worker sleeps this long before each batch it builds (a slow or starved worker). 0.
  int worker_delay_us;
  int prefetch;    // batches decoded ahead (>= 1): default 2 per worker
  bool shuffle;    // a new order every epoch (train)
  bool drop_last;  // drop an epoch's incomplete last batch (train, as the reference)
  // The padded height and width are multiples of this (1: the largest image's, as the reference).
  // Random scales give almost every batch a new size, and each new size builds its oneDNN
  // convolutions anew; a multiple such as 16 leaves a few dozen sizes, each built once
  // (bench/README.md#main_job_speed). 1..256.
  int pad_multiple;
  bool single_pass;  // end after the starting epoch (evaluation)
  uint64_t seed;
  AugConfig aug;
  BadInputPolicy policy;  // unreadable image: fail, or skip it (warning + count)
  bool quiet;             // no summary of skipped images on loader_free
  // Data parallelism: with shards > 1 a batch is this process's slice `shard` of a global batch
  // of batch_size * shards samples, so the ranks of a run together see exactly the batches one
  // process with the global batch size would. Slices left empty (the end of a single pass, or
  // every image skipped) are delivered with size 0, so every rank steps through the same batches.
  int shard, shards;  // 0, 1: not sharded
} LoaderConfig;

// The reference's settings: train (shuffle, drop_last, train augmentation) or val (one pass in
// dataset order, val resize).
LoaderConfig loader_config_default(bool train);
// The same with a run's batch size, worker threads, transform and bad-input policy.
LoaderConfig loader_config_make(bool train, int batch_size, int num_workers, AugConfig aug, BadInputPolicy policy);

typedef struct DataLoader DataLoader;

enum { LOADER_END = 1 };  // loader_next after the last batch of a single pass

// ds must outlive the loader (it is read by the workers, never written).
int loader_create(const CocoDataset *ds, const LoaderConfig *cfg, LoaderPosition start, DataLoader **out,
                  DataError *err);
// The next batch, valid until the next loader_next/loader_seek/loader_free. Returns DATA_OK,
// LOADER_END or DATA_ERROR (an image failed under the fail policy: err names the file; the
// loader stays failed until loader_seek). One consumer thread.
int loader_next(DataLoader *L, const Batch **batch, DataError *err);
// Restarts at pos (drops what was prefetched). Returns DATA_ERROR for a position outside the data.
int loader_seek(DataLoader *L, LoaderPosition pos, DataError *err);
int64_t loader_batches_per_epoch(const DataLoader *L);
typedef struct {
  int64_t skipped_images;   // unreadable images dropped from the batches delivered so far
  int64_t consumer_builds;  // batches the consumer built itself although there are workers
  int64_t taken_over;       // of them, batches a worker had started and not finished in time
} LoaderStats;
LoaderStats loader_stats(const DataLoader *L);
void loader_free(DataLoader *L);

// The sample order of an epoch: perm[i] is the dataset index at position i ([n]).
void loader_epoch_order(uint64_t seed, int64_t epoch, bool shuffle, int64_t n, int64_t *perm);
// The augmentation stream of one sample.
Rng loader_sample_rng(uint64_t seed, int64_t epoch, int64_t dataset_index);

// The batch's images as a tensor (the caller owns it).
Tensor *batch_images_tensor(const Batch *b, Device dev);  // [size, h, w, 3]
