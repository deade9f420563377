#define _GNU_SOURCE  // SCHED_IDLE
#include "datasets/loader.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/rng_math.h"

// --- order and randomness ------------------------------------------------------------------------

// Distinct tags keep the data streams apart from each other and from the model's rng_make(seed).
#define TAG_SHUFFLE 0x53485546464C4500ull
#define TAG_SAMPLE 0x53414D504C450000ull

Rng loader_sample_rng(uint64_t seed, int64_t epoch, int64_t dataset_index) {
  return rng_make(rng_mix64(rng_mix64(rng_mix64(seed ^ TAG_SAMPLE) + (uint64_t)epoch) + (uint64_t)dataset_index));
}

void loader_epoch_order(uint64_t seed, int64_t epoch, bool shuffle, int64_t n, int64_t *perm) {
  for (int64_t i = 0; i < n; i++) perm[i] = i;
  if (!shuffle) return;
  Rng rng = rng_make(rng_mix64(rng_mix64(seed ^ TAG_SHUFFLE) + (uint64_t)epoch));
  for (int64_t i = n - 1; i > 0; i--) {  // Fisher-Yates
    int64_t j = (int64_t)rng_next_below(&rng, (uint64_t)(i + 1));
    int64_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

// --- the loader ----------------------------------------------------------------------------------

typedef enum { SLOT_EMPTY, SLOT_WORKING, SLOT_READY } SlotState;

// One batch in flight. Batch g (global number epoch * batches_per_epoch + index) lives in slot
// g % n_slots; slots [next_deliver, next_deliver + n_slots) are all distinct, so a worker may
// start batch g once g < next_deliver + n_slots and its slot is empty (a slot whose batch the
// consumer built itself stays the worker's until it finishes).
typedef struct {
  SlotState state;
  bool abandoned;  // the consumer built this batch itself: the worker stops and empties the slot
  int64_t g;
  int count;         // samples in this batch
  int64_t *indices;  // [batch_size] dataset indices, copied from the epoch order at claim time
  int status;        // DATA_OK, or DATA_ERROR with err
  DataError err;
  Batch batch;
} Slot;

// Per-thread decode/augment buffers.
typedef struct {
  Image *images;         // [batch_size]
  Target *targets;       // [batch_size]
  int *orig_w, *orig_h;  // [batch_size] decoded sizes
  int64_t *kept;         // [batch_size] dataset indices of the samples that loaded
} Scratch;

typedef struct {
  DataLoader *L;
  Scratch scratch;
  int64_t *order;  // [n] an epoch's order, shuffled here without the lock, then swapped with the loader's
} Worker;

struct DataLoader {
  const CocoDataset *ds;
  LoaderConfig cfg;
  int64_t n;             // images in the dataset
  int64_t bpe;           // batches per epoch
  int64_t global_batch;  // samples per batch over all shards (batch_size * shards)
  int shard;             // which batch_size slice of it this loader delivers
  float lut[3][256];     // pixel value -> normalized float, per channel

  pthread_mutex_t lock;
  pthread_cond_t work_cv;   // workers: a slot became free, or stop/pause changed
  pthread_cond_t ready_cv;  // consumer/seek: a slot became ready, or a worker went idle
  Slot *slots;              // [n_slots]
  int n_slots;
  int64_t next_claim;     // next batch a worker starts
  int64_t next_deliver;   // next batch loader_next returns (or the one the consumer holds)
  int64_t end_g;          // one past the last batch (single pass), else INT64_MAX
  int64_t empty_run;      // batches in a row whose every image was skipped: an epoch of them is an error
  uint8_t *ever_skipped;  // [n]: 1 once image i was skipped (the summary counts images, not skips)
  int64_t distinct_skipped;
  bool holding;  // the consumer holds slot next_deliver (or `spare`)
  bool holding_spare;
  Slot spare;          // a batch the consumer builds itself while its slot is still a worker's
  double image_cpu_s;  // moving average of one sample's build time (CPU time of the building thread)
  LoaderStats stats;
  bool stop, paused;
  int busy;  // slots being built
  bool failed;
  DataError fail_err;
  int64_t order_epoch;  // the epoch whose order `order` holds (-1: none)
  int64_t *order;       // [n]
  int64_t warnings;

  Worker *workers;  // [num_workers]
  pthread_t *threads;
  int n_threads;
  Worker inline_worker;  // num_workers == 0: batches built by loader_next itself
};

LoaderConfig loader_config_default(bool train) {
  return (LoaderConfig){.batch_size = 2,
                        .num_workers = 2,
                        .worker_wait_us = -1,
                        .prefetch = 4,
                        .shuffle = train,
                        .drop_last = train,
                        .pad_multiple = 1,
                        .single_pass = !train,
                        .seed = 42,
                        .aug = aug_config_detr(train),
                        .policy = BAD_INPUT_FAIL};
}

LoaderConfig loader_config_make(bool train, int batch_size, int num_workers, AugConfig aug, BadInputPolicy policy) {
  LoaderConfig c = loader_config_default(train);
  c.batch_size = batch_size;
  c.num_workers = num_workers;
  c.aug = aug;
  c.policy = policy;
  return c;
}

static void scratch_init(Scratch *s, int batch_size) {
  s->images = detr_calloc((size_t)batch_size, sizeof(Image), "loader images");
  s->targets = detr_calloc((size_t)batch_size, sizeof(Target), "loader targets");
  s->orig_w = detr_calloc((size_t)batch_size, sizeof(int), "loader sizes");
  s->orig_h = detr_calloc((size_t)batch_size, sizeof(int), "loader sizes");
  s->kept = detr_calloc((size_t)batch_size, sizeof(int64_t), "loader indices");
}

static void scratch_free(Scratch *s, int batch_size) {
  for (int i = 0; s->images && i < batch_size; i++) {
    image_free(&s->images[i]);
    target_free(&s->targets[i]);
  }
  free(s->images);
  free(s->targets);
  free(s->orig_w);
  free(s->orig_h);
  free(s->kept);
}

// Pads the augmented images into the batch buffers, normalizes, converts the boxes.
static void collate(DataLoader *L, Batch *b, const Scratch *s, const int64_t *indices, int m) {
  const CocoDataset *ds = L->ds;
  int H = 0, W = 0, total = 0;
  for (int i = 0; i < m; i++) {
    if (s->images[i].h > H) H = s->images[i].h;
    if (s->images[i].w > W) W = s->images[i].w;
    total += s->targets[i].n;
  }
  int pm = L->cfg.pad_multiple;
  H = (H + pm - 1) / pm * pm;
  W = (W + pm - 1) / pm * pm;
  b->size = m;
  b->h = H;
  b->w = W;
  int64_t plane = (int64_t)H * W;
  void *p = b->images;
  data_reserve(&p, &b->images_cap, (int64_t)m * 3 * plane, sizeof(float), "batch images");
  b->images = p;
  p = b->mask;
  data_reserve(&p, &b->mask_cap, (int64_t)m * plane, 1, "batch mask");
  b->mask = p;
  if (total > b->pool_cap) {
    int64_t cap = b->pool_cap;
    p = b->box_pool;
    data_reserve(&p, &cap, total, 4 * sizeof(float), "batch boxes");
    b->box_pool = p;
    b->label_pool = detr_realloc(b->label_pool, (size_t)cap * sizeof(int64_t), "batch labels");
    b->pool_cap = cap;
  }
  p = b->targets;
  data_reserve(&p, &b->targets_cap, m, sizeof(BatchTarget), "batch targets");
  b->targets = p;
  int64_t box_at = 0;
  for (int i = 0; i < m; i++) {
    const Image *im = &s->images[i];
    const Target *t = &s->targets[i];
    float *dst = b->images + (int64_t)i * plane * 3;  // [H, W, 3]
    uint8_t *mask = b->mask + (int64_t)i * plane;     // [H, W]
    for (int y = 0; y < H; y++) {
      int valid = y < im->h ? im->w : 0;
      pad_normalize_row(valid ? im->data + (int64_t)y * im->w * 3 : NULL, valid, W, L->lut, dst + (int64_t)y * W * 3,
                        mask + (int64_t)y * W);
    }
    BatchTarget *bt = &b->targets[i];
    int64_t idx = indices[i];
    float *boxes = b->box_pool + box_at * 4;
    int64_t *labels = b->label_pool + box_at;
    target_to_cxcywh_normalized(t, im->w, im->h, boxes);
    if (t->n) memcpy(labels, t->labels, sizeof(int64_t) * (size_t)t->n);
    *bt = (BatchTarget){.image_id = ds->images[idx].id,
                        .dataset_index = idx,
                        .orig_w = s->orig_w[i],
                        .orig_h = s->orig_h[i],
                        .w = im->w,
                        .h = im->h,
                        .n = t->n,
                        .boxes = boxes,
                        .labels = labels};
    box_at += t->n;
  }
}

// Loads, augments and collates the slot's samples (no lock held: reads only shared, constant state,
// and `abandoned` and `stop`, atomically: a batch the consumer has built itself, or one of a loader
// being freed, is left unfinished).
static void build_batch(DataLoader *L, Slot *slot, Scratch *s) {
  int64_t epoch = slot->g / L->bpe;
  int m = 0, skipped = 0;
  slot->status = DATA_OK;
  for (int k = 0; k < slot->count; k++) {
    if (__atomic_load_n(&slot->abandoned, __ATOMIC_RELAXED) || __atomic_load_n(&L->stop, __ATOMIC_RELAXED)) return;
    int64_t idx = slot->indices[k];
    DataError e;
    if (coco_load_sample(L->ds, idx, &s->images[m], &s->targets[m], &e) != DATA_OK) {
      if (L->cfg.policy == BAD_INPUT_FAIL) {
        slot->status = DATA_ERROR;
        slot->err = e;
        return;
      }
      if (!__atomic_load_n(&slot->abandoned, __ATOMIC_RELAXED))  // else the consumer warns
        data_warn(&L->warnings, "%s - skipped", e.msg);
      skipped++;
      if (!__atomic_exchange_n(&L->ever_skipped[idx], 1, __ATOMIC_RELAXED))
        __atomic_add_fetch(&L->distinct_skipped, 1, __ATOMIC_RELAXED);
      continue;
    }
    s->orig_w[m] = s->images[m].w;
    s->orig_h[m] = s->images[m].h;
    Rng rng = loader_sample_rng(L->cfg.seed, epoch, idx);
    aug_apply(&s->images[m], &s->targets[m], &L->cfg.aug, &rng);
    s->kept[m++] = idx;
  }
  collate(L, &slot->batch, s, s->kept, m);
  slot->batch.epoch = epoch;
  slot->batch.index = slot->g % L->bpe;
  slot->batch.skipped = skipped;
}

// Under the lock: batch g's sample indices into slot (its own, or the consumer's spare).
static void assign(DataLoader *L, Slot *slot, int64_t g) {
  int64_t epoch = g / L->bpe, first = (g % L->bpe) * L->global_batch + (int64_t)L->shard * L->cfg.batch_size;
  if (L->order_epoch != epoch) {
    loader_epoch_order(L->cfg.seed, epoch, L->cfg.shuffle, L->n, L->order);
    L->order_epoch = epoch;
  }
  int64_t left = L->n - first > 0 ? L->n - first : 0;  // a shard past the end of a last batch: empty
  slot->count = (int)(left < L->cfg.batch_size ? left : L->cfg.batch_size);
  memcpy(slot->indices, L->order + first, sizeof(int64_t) * (size_t)slot->count);
  slot->g = g;
}

// Under the lock: marks batch g as being built in its slot.
static Slot *claim(DataLoader *L, int64_t g) {
  Slot *slot = &L->slots[g % L->n_slots];
  DETR_CHECK(slot->state == SLOT_EMPTY, "loader: slot of batch %lld still in use", (long long)g);
  assign(L, slot, g);
  slot->state = SLOT_WORKING;
  L->busy++;
  return slot;
}

static bool can_claim(const DataLoader *L) {
  return !L->paused && L->next_claim < L->next_deliver + L->n_slots && L->next_claim < L->end_g &&
         L->slots[L->next_claim % L->n_slots].state == SLOT_EMPTY;
}

static double thread_cpu_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

// Builds the slot's batch with the lock released (taken again on return), timing a finished build
// for the consumer's wait bound: CPU time, which a starved background thread does not inflate.
static void build_unlocked(DataLoader *L, Slot *slot, Scratch *s) {
  pthread_mutex_unlock(&L->lock);
  double t0 = thread_cpu_s();
  build_batch(L, slot, s);
  double per_image = slot->count > 0 ? (thread_cpu_s() - t0) / slot->count : 0.0;
  pthread_mutex_lock(&L->lock);
  if (slot->count > 0 && !slot->abandoned && !L->stop)  // not a build stopped half-way
    L->image_cpu_s = L->image_cpu_s > 0.0 ? 0.8 * L->image_cpu_s + 0.2 * per_image : per_image;
}

// Workers run at background priority (SCHED_IDLE): decoding in the compute threads' idle moments
// instead of taking their cores in the middle of a parallel loop, which stalls both threads at its
// barrier. Measured (bench/README.md#main_job_speed), with the consumer's takeover below: issue 18's
// model 256-286 -> 333-370 images/s, the main job 217-227 -> 244-263. A system that refuses
// SCHED_IDLE leaves the workers at normal priority.
static void *worker_main(void *arg) {
  Worker *w = arg;
  DataLoader *L = w->L;
#ifdef SCHED_IDLE
  struct sched_param background = {0};
  (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &background);
#endif
  pthread_mutex_lock(&L->lock);
  for (;;) {
    while (!L->stop && !can_claim(L)) pthread_cond_wait(&L->work_cv, &L->lock);
    if (L->stop) break;
    int64_t epoch = L->next_claim / L->bpe;
    if (L->order_epoch != epoch) {     // a new epoch's order: shuffled without the lock (a background
      pthread_mutex_unlock(&L->lock);  // thread holding it could stall the consumer), then swapped in
      loader_epoch_order(L->cfg.seed, epoch, L->cfg.shuffle, L->n, w->order);
      pthread_mutex_lock(&L->lock);
      if (L->order_epoch != epoch) {
        int64_t *t = L->order;
        L->order = w->order;
        w->order = t;
        L->order_epoch = epoch;
      }
      continue;  // claims may have moved meanwhile: check again
    }
    Slot *slot = claim(L, L->next_claim++);
    if (L->cfg.worker_delay_us > 0) {  // tests: a slow or starved worker
      pthread_mutex_unlock(&L->lock);
      usleep((useconds_t)L->cfg.worker_delay_us);
      pthread_mutex_lock(&L->lock);
    }
    build_unlocked(L, slot, &w->scratch);
    slot->state = slot->abandoned ? SLOT_EMPTY : SLOT_READY;  // abandoned: the consumer built it
    __atomic_store_n(&slot->abandoned, false, __ATOMIC_RELAXED);
    L->busy--;
    pthread_cond_broadcast(&L->ready_cv);
    pthread_cond_broadcast(&L->work_cv);  // an emptied slot can be claimed
  }
  pthread_mutex_unlock(&L->lock);
  return NULL;
}

static int check_position(const DataLoader *L, LoaderPosition pos, DataError *err) {
  if (pos.epoch < 0 || pos.batch < 0 || pos.batch > L->bpe || pos.epoch > INT64_MAX / (L->bpe + 1) - 1)
    return data_error(err, "loader: position (epoch %lld, batch %lld) outside the data (%lld batches per epoch)",
                      (long long)pos.epoch, (long long)pos.batch, (long long)L->bpe);
  return DATA_OK;
}

// Under the lock, with no slot being built: every slot empty, delivery restarts at pos.
static void reset_to(DataLoader *L, LoaderPosition pos) {
  for (int i = 0; i < L->n_slots; i++) {
    L->slots[i].state = SLOT_EMPTY;
    __atomic_store_n(&L->slots[i].abandoned, false, __ATOMIC_RELAXED);
  }
  int64_t g = pos.epoch * L->bpe + pos.batch;  // batch == bpe is the next epoch's first batch
  L->next_claim = L->next_deliver = g;
  L->end_g = L->cfg.single_pass ? (g / L->bpe + 1) * L->bpe : INT64_MAX;
  L->holding = L->holding_spare = false;
  L->failed = false;
  L->empty_run = 0;
}

int loader_create(const CocoDataset *ds, const LoaderConfig *cfg, LoaderPosition start, DataLoader **out,
                  DataError *err) {
  *out = NULL;
  if (cfg->batch_size < 1) return data_error(err, "loader: batch size %d", cfg->batch_size);
  if (cfg->num_workers < 0 || cfg->num_workers > 256) return data_error(err, "loader: %d workers", cfg->num_workers);
  if (cfg->worker_wait_us < -1 || cfg->worker_delay_us < 0)
    return data_error(err, "loader: worker wait %d us, delay %d us", cfg->worker_wait_us, cfg->worker_delay_us);
  if (cfg->prefetch < 1) return data_error(err, "loader: prefetch %d (at least 1 batch)", cfg->prefetch);
  if (cfg->pad_multiple < 1 || cfg->pad_multiple > 256)
    return data_error(err, "loader: pad multiple %d (1..256)", cfg->pad_multiple);
  if (aug_config_validate(&cfg->aug, err) != DATA_OK) return DATA_ERROR;
  if (!ds->image_dir) return data_error(err, "loader: %s was opened without an image folder", ds->ann_path);
  int shards = cfg->shards > 1 ? cfg->shards : 1;
  if (cfg->shard < 0 || cfg->shard >= shards) return data_error(err, "loader: shard %d of %d", cfg->shard, shards);
  int64_t global_batch = (int64_t)cfg->batch_size * shards;
  int64_t bpe = cfg->drop_last ? ds->n_images / global_batch : (ds->n_images + global_batch - 1) / global_batch;
  if (bpe < 1)
    return data_error(err, "loader: %s has %lld images, not enough for a batch of %lld", ds->ann_path,
                      (long long)ds->n_images, (long long)global_batch);
  DataLoader *L = detr_calloc(1, sizeof(DataLoader), "loader");
  L->ds = ds;
  L->cfg = *cfg;
  L->n = ds->n_images;
  L->ever_skipped = detr_calloc((size_t)ds->n_images, 1, "the loader's skipped images");
  L->bpe = bpe;
  L->global_batch = global_batch;
  L->shard = shards > 1 ? cfg->shard : 0;
  if (check_position(L, start, err) != DATA_OK) {
    free(L->ever_skipped);
    free(L);
    return DATA_ERROR;
  }
  aug_normalize_lut(&cfg->aug, L->lut);
  L->order = detr_malloc(sizeof(int64_t) * (size_t)L->n, "epoch order");
  L->order_epoch = -1;
  L->n_slots = cfg->prefetch;
  L->slots = detr_calloc((size_t)L->n_slots, sizeof(Slot), "loader slots");
  for (int i = 0; i < L->n_slots; i++)
    L->slots[i].indices = detr_malloc(sizeof(int64_t) * (size_t)cfg->batch_size, "batch indices");
  L->spare.indices = detr_malloc(sizeof(int64_t) * (size_t)cfg->batch_size, "batch indices");
  pthread_mutex_init(&L->lock, NULL);
  pthread_cond_init(&L->work_cv, NULL);
  pthread_condattr_t monotonic;  // the consumer's bounded wait counts on CLOCK_MONOTONIC
  pthread_condattr_init(&monotonic);
  pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
  pthread_cond_init(&L->ready_cv, &monotonic);
  pthread_condattr_destroy(&monotonic);
  reset_to(L, start);
  L->inline_worker.L = L;
  scratch_init(&L->inline_worker.scratch, cfg->batch_size);
  if (cfg->num_workers > 0) {
    L->workers = detr_calloc((size_t)cfg->num_workers, sizeof(Worker), "loader workers");
    L->threads = detr_calloc((size_t)cfg->num_workers, sizeof(pthread_t), "loader threads");
    for (int i = 0; i < cfg->num_workers; i++) {
      L->workers[i].L = L;
      L->workers[i].order = detr_malloc(sizeof(int64_t) * (size_t)L->n, "epoch order");
      scratch_init(&L->workers[i].scratch, cfg->batch_size);
      int rc = pthread_create(&L->threads[i], NULL, worker_main, &L->workers[i]);
      if (rc != 0) {
        data_error(err, "loader: cannot start worker thread %d: %s", i, strerror(rc));
        loader_free(L);
        return DATA_ERROR;
      }
      L->n_threads++;
    }
  }
  *out = L;
  return DATA_OK;
}

// Under the lock: how long the consumer waits for a worker's unfinished batch of `count` images.
static double worker_wait_s(const DataLoader *L, int count) {
  if (L->cfg.worker_wait_us >= 0) return 1e-6 * L->cfg.worker_wait_us;
  return 0.002 + 2.0 * L->image_cpu_s * count;
}

// Under the lock: waits until slot holds batch g ready, at most wait_s; false when it does not.
static bool wait_ready(DataLoader *L, Slot *slot, int64_t g, double wait_s) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  double ns = (double)until.tv_nsec + wait_s * 1e9;
  until.tv_sec += (time_t)(ns / 1e9);
  until.tv_nsec = (long)(ns - 1e9 * (double)(time_t)(ns / 1e9));
  while (!(slot->state == SLOT_READY && slot->g == g))
    if (pthread_cond_timedwait(&L->ready_cv, &L->lock, &until) == ETIMEDOUT)
      return slot->state == SLOT_READY && slot->g == g;
  return true;
}

int loader_next(DataLoader *L, const Batch **out, DataError *err) {
  *out = NULL;
  pthread_mutex_lock(&L->lock);
  if (L->holding) {  // the consumer is done with the batch it held: free its slot
    if (!L->holding_spare) L->slots[L->next_deliver % L->n_slots].state = SLOT_EMPTY;
    L->next_deliver++;
    L->holding = L->holding_spare = false;
    pthread_cond_broadcast(&L->work_cv);
  }
  for (;;) {
    if (L->failed) {
      if (err) *err = L->fail_err;
      pthread_mutex_unlock(&L->lock);
      return DATA_ERROR;
    }
    if (L->next_deliver >= L->end_g) {
      pthread_mutex_unlock(&L->lock);
      return LOADER_END;
    }
    int64_t g = L->next_deliver;
    Slot *slot = &L->slots[g % L->n_slots], *got = slot;
    if (L->next_claim == g) {  // no worker has started it: build it here
      L->next_claim = g + 1;
      pthread_cond_broadcast(&L->work_cv);  // the batch after it may be claimable now
      if (slot->state == SLOT_EMPTY) {
        claim(L, g);
        build_unlocked(L, slot, &L->inline_worker.scratch);
        slot->state = SLOT_READY;
        L->busy--;
      } else {  // the slot is still a worker's (a batch the consumer built earlier): the spare
        got = &L->spare;
      }
      if (L->n_threads > 0) L->stats.consumer_builds++;
    } else if (!wait_ready(L, slot, g, worker_wait_s(L, slot->count))) {
      // A worker is still on it (a busy machine starves background threads): build it here.
      __atomic_store_n(&slot->abandoned, true, __ATOMIC_RELAXED);
      got = &L->spare;
      L->stats.consumer_builds++;
      L->stats.taken_over++;
    }
    if (got == &L->spare) {
      assign(L, got, g);
      build_unlocked(L, got, &L->inline_worker.scratch);
    }
    if (got->status != DATA_OK) {
      L->failed = true;
      L->fail_err = got->err;
      continue;
    }
    L->stats.skipped_images += got->batch.skipped;
    if (got->batch.size == 0 && L->global_batch == L->cfg.batch_size) {  // all skipped: go on to the next
      if (got == slot) slot->state = SLOT_EMPTY;
      L->next_deliver++;
      pthread_cond_broadcast(&L->work_cv);
      if (++L->empty_run >= L->bpe) {  // not one image of a whole epoch could be read: nothing will come
        L->failed = true;
        data_error(&L->fail_err,
                   "%s: no image of a whole epoch could be read (%lld batches, %lld images skipped so "
                   "far; see the warnings above)",
                   L->ds->ann_path, (long long)L->bpe, (long long)L->stats.skipped_images);
      }
      continue;
    }
    L->empty_run = 0;
    L->holding = true;
    L->holding_spare = got == &L->spare;
    *out = &got->batch;
    pthread_mutex_unlock(&L->lock);
    return DATA_OK;
  }
}

int loader_seek(DataLoader *L, LoaderPosition pos, DataError *err) {
  if (check_position(L, pos, err) != DATA_OK) return DATA_ERROR;
  pthread_mutex_lock(&L->lock);
  L->paused = true;  // no new claims; let the batches being built finish
  while (L->busy > 0) pthread_cond_wait(&L->ready_cv, &L->lock);
  reset_to(L, pos);
  L->paused = false;
  pthread_cond_broadcast(&L->work_cv);
  pthread_mutex_unlock(&L->lock);
  return DATA_OK;
}

int64_t loader_batches_per_epoch(const DataLoader *L) { return L->bpe; }

LoaderStats loader_stats(const DataLoader *L) {
  DataLoader *M = (DataLoader *)L;
  pthread_mutex_lock(&M->lock);
  LoaderStats st = L->stats;
  pthread_mutex_unlock(&M->lock);
  return st;
}

void loader_free(DataLoader *L) {
  if (!L) return;
  pthread_mutex_lock(&L->lock);
  __atomic_store_n(&L->stop, true, __ATOMIC_RELAXED);  // read by builds in progress
  pthread_cond_broadcast(&L->work_cv);
  pthread_mutex_unlock(&L->lock);
  for (int i = 0; i < L->n_threads; i++) pthread_join(L->threads[i], NULL);
  if (L->stats.skipped_images > 0 && !L->cfg.quiet) {
    fflush(stdout);
    int64_t images = __atomic_load_n(&L->distinct_skipped, __ATOMIC_RELAXED);
    fprintf(stderr, "detr: %s: the loader skipped %lld unreadable image%s", L->ds->ann_path, (long long)images,
            images == 1 ? "" : "s");
    if (L->stats.skipped_images > images)
      fprintf(stderr, " (%lld times, over the epochs)", (long long)L->stats.skipped_images);
    fputc('\n', stderr);
  }
  for (int i = 0; L->workers && i < L->cfg.num_workers; i++) {
    scratch_free(&L->workers[i].scratch, L->cfg.batch_size);
    free(L->workers[i].order);
  }
  scratch_free(&L->inline_worker.scratch, L->cfg.batch_size);
  for (int i = 0; i <= L->n_slots; i++) {  // the slots, then the spare
    Slot *slot = i < L->n_slots ? &L->slots[i] : &L->spare;
    Batch *b = &slot->batch;
    free(b->images);
    free(b->mask);
    free(b->targets);
    free(b->box_pool);
    free(b->label_pool);
    free(slot->indices);
  }
  pthread_cond_destroy(&L->work_cv);
  pthread_cond_destroy(&L->ready_cv);
  pthread_mutex_destroy(&L->lock);
  free(L->slots);
  free(L->ever_skipped);
  free(L->order);
  free(L->workers);
  free(L->threads);
  free(L);
}

// --- tensors -------------------------------------------------------------------------------------

Tensor *batch_images_tensor(const Batch *b, Device dev) {
  return tensor_from_host(dev, SHAPE(b->size, b->h, b->w, 3), b->images);
}
