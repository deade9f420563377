#include "tensor/alloc.h"

#include <malloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/common.h"
#if DETR_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

const char *device_name(Device dev) { return dev == DEVICE_CUDA ? "cuda" : "cpu"; }

// Size classes: 256 B minimum, then four classes per power of two (256, 320, 384, 448, 512, ...),
// so a block wastes at most 25% and a recurring request size always maps to the same class.
#define SIZE_CLASSES 256
#define MIN_CLASS_BYTES 256

static int size_class(size_t nbytes, size_t *class_bytes) {
  if (nbytes <= MIN_CLASS_BYTES) {
    *class_bytes = MIN_CLASS_BYTES;
    return 0;
  }
  int log2 = 63 - __builtin_clzll((unsigned long long)(nbytes - 1));  // 2^log2 < nbytes <= 2^(log2+1)
  size_t base = (size_t)1 << log2;
  size_t quarter = base / 4;
  size_t step = (nbytes - base + quarter - 1) / quarter;  // 1..4
  *class_bytes = base + step * quarter;
  return (log2 - 8) * 4 + (int)step;  // log2 >= 8 here
}

typedef struct {
  void **blocks;
  int count, capacity;
} FreeList;

typedef struct {
  pthread_mutex_t lock;
  FreeList lists[SIZE_CLASSES];
  AllocStats stats;
} DeviceCache;

static DeviceCache caches[DEVICE_COUNT] = {{.lock = PTHREAD_MUTEX_INITIALIZER},
                                          {.lock = PTHREAD_MUTEX_INITIALIZER}};

// CPU blocks of HEAP_MIN_BYTES and more skip the cache: they go to the C library and back at once.
// Up to HEAP_MAX_BYTES they are glibc heap blocks. A training step frees one size of block (a
// finished ResNet stage's temporaries) and then asks for smaller ones (the next stage's); the
// cache, which reuses a block only for its own size class, would hold both, while the heap
// coalesces freed neighbours and serves any size from them. Measured (bench_step, 2 threads,
// CPU-only build): detr-r50@512 peak RSS 1430 -> 1325 MB, step 1.92 -> 1.98 s;
// detr-r18-small@320 335 -> 288 MB, 0.247 -> 0.255 s. For that glibc must keep such blocks in the
// heap rather than mmap each one (a fresh mapping faults its pages in every step) and must not
// return the heap's free top to the system after each step: set_heap_policy does so, process-wide,
// on the first CPU request. Blocks of HEAP_MAX_BYTES and more are glibc's own mappings, unmapped
// when freed: cached, they stayed resident while unused, as detr-r50@512's three 32 MiB blocks of
// the frozen stem and layer1 do through the whole backward, when the step peaks (peak RSS 1180 ->
// 1041-1082 MB, the rest moved by the heap's fragmentation from run to run; the step's time the
// same, 0.78 s, alternating on an AMD Zen 5).
#define HEAP_MIN_BYTES ((size_t)1 << 20)
#define HEAP_MAX_BYTES ((size_t)32 << 20)

static pthread_once_t heap_policy_once = PTHREAD_ONCE_INIT;
static void set_heap_policy(void) {
  (void)mallopt(M_MMAP_THRESHOLD, (int)HEAP_MAX_BYTES);  // advice: a failure only costs memory
  (void)mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

static bool uncached(Device dev, size_t class_bytes) {
  return dev == DEVICE_CPU && class_bytes >= HEAP_MIN_BYTES;
}

static void *system_alloc(Device dev, size_t bytes) {
  if (dev == DEVICE_CPU) return aligned_alloc(64, bytes);
#if DETR_HAVE_CUDA
  return cuda_device_malloc(bytes);
#else
  DETR_FAIL("detr_alloc: this build has no CUDA backend (configure with -DDETR_CUDA=ON)");
#endif
}

static void system_free(Device dev, void *ptr) {
  if (dev == DEVICE_CPU) {
    free(ptr);
    return;
  }
#if DETR_HAVE_CUDA
  cuda_device_free(ptr);
#endif
}

static void empty_cache_locked(Device dev) {
  DeviceCache *c = &caches[dev];
  for (int k = 0; k < SIZE_CLASSES; k++) {
    FreeList *fl = &c->lists[k];
    for (int i = 0; i < fl->count; i++) {
      system_free(dev, fl->blocks[i]);
      c->stats.system_frees++;
    }
    fl->count = 0;
  }
  c->stats.cached_bytes = 0;
}

void *detr_alloc(Device dev, size_t nbytes) {
  DETR_CHECK(dev >= 0 && dev < DEVICE_COUNT, "detr_alloc: bad device %d", (int)dev);
  size_t class_bytes;
  int k = size_class(nbytes, &class_bytes);
  DETR_CHECK(k < SIZE_CLASSES, "detr_alloc: request of %zu bytes is too large", nbytes);
  DeviceCache *c = &caches[dev];
  if (dev == DEVICE_CPU) pthread_once(&heap_policy_once, set_heap_policy);
  pthread_mutex_lock(&c->lock);
  c->stats.requests++;
  void *ptr = NULL;
  FreeList *fl = &c->lists[k];
  if (fl->count > 0) {  // never for uncached sizes
    ptr = fl->blocks[--fl->count];
    c->stats.cached_bytes -= class_bytes;
  } else {
    ptr = system_alloc(dev, class_bytes);
    if (!ptr) {  // out of memory: give the cache back and try once more
      empty_cache_locked(dev);
      ptr = system_alloc(dev, class_bytes);
    }
    if (!ptr) {
      pthread_mutex_unlock(&c->lock);
      DETR_FAIL("detr_alloc: out of %s memory allocating %zu bytes (%zu bytes live)",
                device_name(dev), class_bytes, c->stats.live_bytes);
    }
    c->stats.system_allocs++;
  }
  c->stats.live_bytes += class_bytes;
  if (c->stats.live_bytes > c->stats.peak_live_bytes) c->stats.peak_live_bytes = c->stats.live_bytes;
  size_t held = c->stats.live_bytes + c->stats.cached_bytes;
  if (held > c->stats.peak_held_bytes) c->stats.peak_held_bytes = held;
  pthread_mutex_unlock(&c->lock);
  return ptr;
}

void detr_free(Device dev, void *ptr, size_t nbytes) {
  if (!ptr) return;
  size_t class_bytes;
  int k = size_class(nbytes, &class_bytes);
  DeviceCache *c = &caches[dev];
  pthread_mutex_lock(&c->lock);
  if (uncached(dev, class_bytes)) {
    system_free(dev, ptr);
    c->stats.system_frees++;
    c->stats.live_bytes -= class_bytes;
    pthread_mutex_unlock(&c->lock);
    return;
  }
  FreeList *fl = &c->lists[k];
  if (fl->count == fl->capacity) {
    int cap = fl->capacity ? 2 * fl->capacity : 16;
    void **grown = realloc(fl->blocks, (size_t)cap * sizeof(void *));
    if (!grown) {
      pthread_mutex_unlock(&c->lock);
      DETR_FAIL("detr_free: out of host memory growing the free list");
    }
    fl->blocks = grown;
    fl->capacity = cap;
  }
  fl->blocks[fl->count++] = ptr;
  c->stats.live_bytes -= class_bytes;
  c->stats.cached_bytes += class_bytes;
  pthread_mutex_unlock(&c->lock);
}

void detr_alloc_empty_cache(Device dev) {
  pthread_mutex_lock(&caches[dev].lock);
  empty_cache_locked(dev);
  pthread_mutex_unlock(&caches[dev].lock);
}

AllocStats detr_alloc_stats(Device dev) {
  pthread_mutex_lock(&caches[dev].lock);
  AllocStats s = caches[dev].stats;
  pthread_mutex_unlock(&caches[dev].lock);
  return s;
}

void detr_alloc_reset_peak(Device dev) {
  pthread_mutex_lock(&caches[dev].lock);
  caches[dev].stats.peak_live_bytes = caches[dev].stats.live_bytes;
  pthread_mutex_unlock(&caches[dev].lock);
}
