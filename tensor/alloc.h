// Caching allocator for tensor storage on every device. Freed blocks go back to a per-size-class
// cache and are reused, so once a training step has run, later steps make no cudaMalloc. On the
// CPU, blocks of 64 KiB and more come from an arena and go back to it instead (see tensor/alloc.c).
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum { DEVICE_CPU = 0, DEVICE_CUDA = 1, DEVICE_COUNT } Device;

const char *device_name(Device dev);

typedef struct {
  uint64_t system_allocs;  // blocks taken from the system (the CPU arena or malloc / cudaMalloc)
  uint64_t system_frees;   // blocks given back (large CPU blocks, cache trims)
  uint64_t requests;       // detr_alloc calls served
  size_t live_bytes;       // bytes handed out and not yet returned (rounded to size classes; large
                           // CPU blocks to pages)
  size_t peak_live_bytes;  // maximum of live_bytes since the last reset of the peak
  size_t cached_bytes;     // bytes held in the cache, free for reuse
  size_t peak_held_bytes;  // maximum of live_bytes + cached_bytes (the CPU arena's free extents not counted)
} AllocStats;

// Returns at least nbytes (64-byte aligned on CPU). nbytes may be 0. Fails with a message on
// out-of-memory after trying once more with the cache emptied.
void *detr_alloc(Device dev, size_t nbytes);
// Returns a block from detr_alloc(dev, nbytes) to the cache (nbytes as requested).
void detr_free(Device dev, void *ptr, size_t nbytes);
// Releases every cached block to the system, and on the CPU the arena's memory above its highest
// block in use.
void detr_alloc_empty_cache(Device dev);
AllocStats detr_alloc_stats(Device dev);
void detr_alloc_reset_peak(Device dev);
