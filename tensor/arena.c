#define _GNU_SOURCE  // MAP_ANONYMOUS, MAP_NORESERVE
#include "tensor/arena.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

// Under AddressSanitizer the free extents, and each block's slack past its request, are poisoned:
// a read past a block's end or of a freed block is reported as for malloc's blocks. (The tensor
// allocator does not use the arena in such a build, tensor/alloc.c; the arena's tests do.)
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

bool arena_reserve(Arena *a, size_t range_bytes) {
  memset(a, 0, sizeof *a);
  void *p = mmap(NULL, range_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  a->base = p;
  a->range_bytes = range_bytes;
  return true;
}

void arena_release(Arena *a) {
  if (a->base) {
    UNPOISON(a->base, a->high);  // ASan's shadow outlives the mapping
    munmap(a->base, a->range_bytes);
  }
  free(a->free);
  memset(a, 0, sizeof *a);
}

static void remove_extent(Arena *a, int i) {
  memmove(&a->free[i], &a->free[i + 1], (size_t)(a->n_free - i - 1) * sizeof(ArenaExtent));
  a->n_free--;
}

void *arena_alloc(Arena *a, size_t bytes) {
  if (!a->base || bytes == 0) return NULL;
  size_t len = arena_block_bytes(bytes);
  if (a->n_live + 1 > a->free_cap) {  // room for the extent this block may leave when freed
    int cap = a->free_cap ? 2 * a->free_cap : 64;
    ArenaExtent *grown = realloc(a->free, (size_t)cap * sizeof(ArenaExtent));
    if (!grown) return NULL;
    a->free = grown;
    a->free_cap = cap;
  }
  char *p = NULL;
  int best = -1;  // the smallest extent that fits; of equals the lowest
  for (int i = 0; i < a->n_free; i++)
    if (a->free[i].len >= len && (best < 0 || a->free[i].len < a->free[best].len)) best = i;
  if (best >= 0) {
    ArenaExtent *e = &a->free[best];
    p = a->base + e->off;
    e->off += len, e->len -= len;
    if (e->len == 0) remove_extent(a, best);
  }
  if (!p) {
    if (len > a->range_bytes - a->top) return NULL;
    p = a->base + a->top;
    a->top += len;
    if (a->top > a->touched) a->touched = a->top;
    if (a->top > a->high) a->high = a->top;
  }
  a->n_live++;
  UNPOISON(p, bytes);
  POISON(p + bytes, len - bytes);
  return p;
}

bool arena_free(Arena *a, void *ptr, size_t bytes) {
  char *p = ptr;
  if (!a->base || p < a->base || p >= a->base + a->range_bytes) return false;
  size_t off = (size_t)(p - a->base), len = arena_block_bytes(bytes);
  POISON(p, len);
  int at = 0, hi = a->n_free;  // binary search: the first extent above the block
  while (at < hi) {
    int mid = (at + hi) / 2;
    if (a->free[mid].off < off) at = mid + 1;
    else hi = mid;
  }
  bool join_prev = at > 0 && a->free[at - 1].off + a->free[at - 1].len == off;
  bool join_next = at < a->n_free && off + len == a->free[at].off;
  if (join_prev && join_next) {
    a->free[at - 1].len += len + a->free[at].len;
    remove_extent(a, at);
  } else if (join_prev) {
    a->free[at - 1].len += len;
  } else if (join_next) {
    a->free[at].off = off;
    a->free[at].len += len;
  } else {  // free_cap >= n_live > n_free: no growth needed
    memmove(&a->free[at + 1], &a->free[at], (size_t)(a->n_free - at) * sizeof(ArenaExtent));
    a->free[at] = (ArenaExtent){off, len};
    a->n_free++;
  }
  a->n_live--;
  // A free extent reaching the top goes back to the space above it.
  if (a->n_free > 0 && a->free[a->n_free - 1].off + a->free[a->n_free - 1].len == a->top) {
    a->top = a->free[a->n_free - 1].off;
    a->n_free--;
  }
  return true;
}

void arena_trim(Arena *a) {
  if (!a->base || a->touched <= a->top) return;
  (void)madvise(a->base + a->top, a->touched - a->top, MADV_DONTNEED);  // advice: a failure keeps the memory
  a->touched = a->top;
}
