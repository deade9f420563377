// For the benchmarks that call oneDNN's C API alone (no detr-c library: onednn_conv_versions.c also
// builds against another oneDNN release): its headers, and CHECK, which fails with file:line, the
// call's text and oneDNN's status. Not kernels/cpu/onednn.h's DNNL_CHECK: that one fails through
// libdetr's detr_fail and refuses a oneDNN not built on OpenMP, which another release may be.
#pragma once
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                         \
  do {                                                                                      \
    dnnl_status_t s_ = (call);                                                              \
    if (s_ != dnnl_success) {                                                               \
      fprintf(stderr, "%s:%d: %s failed: status %d\n", __FILE__, __LINE__, #call, (int)s_); \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)
