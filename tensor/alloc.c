#include "tensor/alloc.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "tensor/arena.h"
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

static DeviceCache caches[DEVICE_COUNT] = {{.lock = PTHREAD_MUTEX_INITIALIZER}, {.lock = PTHREAD_MUTEX_INITIALIZER}};

// CPU blocks of ARENA_MIN_BYTES and more skip the cache: they come from the arena (tensor/arena.c)
// and go back to it at once, at their own size rounded to a page, not their size class. A
// training step frees one size of block (a finished ResNet stage's temporaries) and then asks for
// smaller ones (the next stage's); the cache, which reuses a block only for its own size class,
// holds both, while the arena merges freed neighbours and serves any size from them. Before the
// arena, blocks of 1 MiB and more were glibc heap blocks and the rest cached, and the heap
// fragmented: aligned_alloc's alignment slack kept a freed block from serving the next request of
// its own size, and small blocks sat between the large ones. detr-r50@512's peak RSS moved
// 1041-1083 MB from run to run and with the number of steps (its heap grew in the backbone's
// backward with 120 MB free in it); with the arena from 1 MiB, 1023 MB in every run; from 64 KiB
// (the cache had held 68 MB of blocks of 64 KiB - 1 MiB idle at the step's peak), with the
// dropout fusions of autograd/ops_matmul.c, 931 MB instead of 989. R18@320 270 -> 241 MB. Step
// times the same in each pair, the main job's too (bench/README.md#bench_step). Smaller blocks
// stay cached: a page each would waste more than their size classes do. Where the range cannot be
// reserved, or is full, the C library serves these blocks.
#define ARENA_MIN_BYTES ((size_t)64 << 10)

// The bytes a request of nbytes takes; its size class k (the cache's list); whether it is large
// (an arena block, not cached).
static size_t block_bytes(Device dev, size_t nbytes, int *k, bool *large) {
  size_t class_bytes;
  *k = size_class(nbytes, &class_bytes);
  *large = dev == DEVICE_CPU && class_bytes >= ARENA_MIN_BYTES;
  return *large ? arena_block_bytes(nbytes) : class_bytes;
}

// The range is the machine's physical memory in size, reserved at the first large block. Under
// AddressSanitizer it is never reserved: the C library (ASan's allocator) serves the large blocks,
// so a leaked or freed-then-used tensor is reported as any malloc'ed block is (the arena has no
// quarantine and LeakSanitizer does not see into it), and that build runs the fallback path. The
// arena itself is tested under ASan by its own tests (tests/test_tensor.c).
static Arena cpu_arena;
static bool cpu_arena_tried;

#if DETR_HAVE_CUDA
static void reclaim_cuda_cache(void);
#endif

static void *system_alloc(Device dev, size_t bytes, bool large) {
  if (dev == DEVICE_CPU) {
    if (large && !cpu_arena_tried) {
      cpu_arena_tried = true;
#if !defined(__SANITIZE_ADDRESS__)
      long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
      if (pages > 0 && page > 0) (void)arena_reserve(&cpu_arena, (size_t)pages * (size_t)page);
#endif
    }
    void *p = large ? arena_alloc(&cpu_arena, bytes) : NULL;
    return p ? p : aligned_alloc(64, (bytes + 63) / 64 * 64);  // C11: a multiple of the alignment
  }
#if DETR_HAVE_CUDA
  static bool reclaim_registered;  // under the cache's lock
  if (!reclaim_registered) cuda_set_memory_reclaim(reclaim_cuda_cache), reclaim_registered = true;
  return cuda_device_malloc(bytes);
#else
  DETR_FAIL("detr_alloc: this build has no CUDA backend (configure with -DDETR_CUDA=ON)");
#endif
}

static void system_free(Device dev, void *ptr, size_t bytes) {
  if (dev == DEVICE_CPU) {
    if (!arena_free(&cpu_arena, ptr, bytes)) free(ptr);
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
      system_free(dev, fl->blocks[i], 0);  // a cached block is never the arena's
      c->stats.system_frees++;
    }
    fl->count = 0;
  }
  c->stats.cached_bytes = 0;
}

void *detr_alloc(Device dev, size_t nbytes) {
  DETR_CHECK(dev >= 0 && dev < DEVICE_COUNT, "detr_alloc: bad device %d", (int)dev);
  int k;
  bool large;
  size_t block = block_bytes(dev, nbytes, &k, &large);
  DETR_CHECK(k < SIZE_CLASSES, "detr_alloc: request of %zu bytes is too large", nbytes);
  DeviceCache *c = &caches[dev];
  pthread_mutex_lock(&c->lock);
  c->stats.requests++;
  void *ptr = NULL;
  FreeList *fl = &c->lists[k];
  if (fl->count > 0) {  // never for large blocks
    ptr = fl->blocks[--fl->count];
    c->stats.cached_bytes -= block;
  } else {
    // A large block is asked for at its request's size: the arena rounds it to pages itself, and
    // AddressSanitizer's bounds are then the request's.
    size_t ask = large ? nbytes : block;
    ptr = system_alloc(dev, ask, large);
    if (!ptr) {  // out of memory: give the cache back and try once more
      empty_cache_locked(dev);
      ptr = system_alloc(dev, ask, large);
    }
    if (!ptr) {
      pthread_mutex_unlock(&c->lock);
      DETR_FAIL("detr_alloc: out of %s memory allocating %zu bytes (%zu bytes live)", device_name(dev), block,
                c->stats.live_bytes);
    }
    c->stats.system_allocs++;
  }
  c->stats.live_bytes += block;
  if (c->stats.live_bytes > c->stats.peak_live_bytes) c->stats.peak_live_bytes = c->stats.live_bytes;
  size_t held = c->stats.live_bytes + c->stats.cached_bytes;
  if (held > c->stats.peak_held_bytes) c->stats.peak_held_bytes = held;
  pthread_mutex_unlock(&c->lock);
  return ptr;
}

void detr_free(Device dev, void *ptr, size_t nbytes) {
  if (!ptr) return;
  int k;
  bool large;
  size_t block = block_bytes(dev, nbytes, &k, &large);
  DeviceCache *c = &caches[dev];
  pthread_mutex_lock(&c->lock);
  if (large) {
    system_free(dev, ptr, block);
    c->stats.system_frees++;
    c->stats.live_bytes -= block;
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
  c->stats.live_bytes -= block;
  c->stats.cached_bytes += block;
  pthread_mutex_unlock(&c->lock);
}

void detr_alloc_empty_cache(Device dev) {
  pthread_mutex_lock(&caches[dev].lock);
  empty_cache_locked(dev);
  if (dev == DEVICE_CPU) arena_trim(&cpu_arena);
  pthread_mutex_unlock(&caches[dev].lock);
}

#if DETR_HAVE_CUDA
// The CUDA kernels' own buffers (bf16 copies: cuda_device_malloc_reclaiming) give this cache back
// on out-of-memory before they fail, as detr_alloc does for tensors. Registered on the first device
// allocation; called outside the cache's lock.
static void reclaim_cuda_cache(void) { detr_alloc_empty_cache(DEVICE_CUDA); }
#endif

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
