// The choice of a cuDNN convolution algorithm among candidates, as plain C: kernels/cuda/conv.cu
// fills the candidates from cuDNN (the preferred deterministic algorithm first, then cuDNN's
// heuristic order) and tests/test_backend.c checks the rule in every build, GPU or not.
#pragma once
#include <stdbool.h>
#include <stddef.h>

typedef struct {
  int algo;            // a cudnnConvolution*Algo_t
  bool usable;         // cuDNN supports it for this geometry (its workspace query succeeded)
  bool deterministic;  // the same bits on every run
  size_t bytes;        // the workspace it needs
} ConvAlgoOption;

// Index of the option to run, or -1 when none is usable (deterministic when required): the first
// usable (deterministic) option whose workspace fits limit_bytes; when none fits, the one with the
// smallest workspace (the earliest among equals). A fast algorithm's workspace can be gigabytes
// (FFT, Winograd at large sizes), so the limit, not only the order, decides.
static inline int conv_algo_pick(const ConvAlgoOption *opts, int n, bool need_deterministic, size_t limit_bytes) {
  int smallest = -1;
  for (int i = 0; i < n; i++) {
    if (!opts[i].usable || (need_deterministic && !opts[i].deterministic)) continue;
    if (opts[i].bytes <= limit_bytes) return i;
    if (smallest < 0 || opts[i].bytes < opts[smallest].bytes) smallest = i;
  }
  return smallest;
}
