// The kernels' common ground: the host/device qualifier shared by CPU and CUDA kernels and the
// limits every layer agrees on; error reporting is core/error.h's, below everything.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#ifdef __CUDACC__
#define DETR_HD static inline __host__ __device__
#else
#define DETR_HD static inline
#endif

// Maximum tensor rank; broadcasting index math is unrolled over this many dims.
#define DETR_MAX_DIMS 6
// Deepest JSON nesting a reader accepts (safetensors headers, COCO instances and results files):
// the formats need at most 5 levels (a COCO polygon list); deeper input is refused with the file
// and the limit rather than walked level by level.
#define DETR_MAX_JSON_DEPTH 64
