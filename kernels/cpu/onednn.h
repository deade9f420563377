// What every oneDNN kernel of kernels/cpu/ shares (conv_onednn.c, matmul_bf16.c): oneDNN's C API,
// the one runtime it may be built with, and DNNL_CHECK. Include only where DETR_HAVE_ONEDNN.
#pragma once
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include "core/error.h"

#if DNNL_CPU_RUNTIME != DNNL_RUNTIME_OMP
#error "oneDNN must be the OpenMP build: another runtime's threads fight OpenBLAS's and ours for the cores"
#endif

// Fails with file:line, the call's text and oneDNN's status name.
#define DNNL_CHECK(call)                                                                      \
  do {                                                                                        \
    dnnl_status_t st_ = (call);                                                               \
    if (st_ != dnnl_success) DETR_FAIL("oneDNN: %s failed: %s", #call, dnnl_status2str(st_)); \
  } while (0)
