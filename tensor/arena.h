// An arena for the CPU allocator's large blocks (tensor/alloc.c): one reserved address range, a
// block placed in the smallest free extent that fits (best fit; the lowest of equals), else at the
// top, a freed block merged with its free neighbours. Best fit keeps large extents whole for
// large requests: detr-r50@512 peaks at 931 MB with it, 977 MB with address-ordered first fit.
// Pages take memory when first written and keep it while the arena lives: like a heap that is
// never trimmed, without a heap's other tenants. Not thread-safe: tensor/alloc.c calls it under
// its lock.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#define ARENA_ALIGN 4096  // every block starts on a page and takes whole pages

// The bytes a block of `bytes` takes in the arena.
static inline size_t arena_block_bytes(size_t bytes) { return (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN; }

typedef struct {
  size_t off, len;
} ArenaExtent;

typedef struct {
  char *base;  // the reserved range, range_bytes long; NULL before arena_reserve
  size_t range_bytes;
  size_t top;            // the end of the highest block in use
  size_t touched;        // the highest top since the last trim: pages below may hold memory
  size_t high;           // the highest top ever (what AddressSanitizer may have poisoned)
  ArenaExtent *free;     // free extents below top, sorted by offset, never adjacent
  int n_free, free_cap;  // free_cap >= n_live: a free never has to grow the list
  int n_live;            // blocks handed out
} Arena;

// Reserves range_bytes of address space (no memory). False, with the arena unusable, on failure.
bool arena_reserve(Arena *a, size_t range_bytes);
// Unmaps the range (tests); the arena can be reserved again.
void arena_release(Arena *a);
// A block of at least `bytes`, or NULL when the arena is not reserved or has no room.
void *arena_alloc(Arena *a, size_t bytes);
// Returns a block of `bytes` (as allocated) and true, or false when ptr is not in the arena.
bool arena_free(Arena *a, void *ptr, size_t bytes);
// Gives the memory of the pages above the top back to the system (they read as zeros when used
// again). Free extents below the top keep theirs.
void arena_trim(Arena *a);
