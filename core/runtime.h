// The runtime: the mutable state ops read and write as they run - grad mode, the autograd tape
// and op profile (autograd/tape.c), the tensor scopes (tensor/tensor.c), each device's precision
// and the kernel settings tests and benchmarks vary (kernels/). Nothing else in the project is
// mutable and process-wide but the caches listed in tools/globals_allowed.txt, each with why.
//
// A caller creates a runtime once and binds it to the thread that runs ops: the CLI one for its
// process (cli/main.c), the C API one per model, bound for each call (api/detr_api.c), so two
// threads detecting on two models share no state. nn/ passes its NnCtx down explicitly; the ops
// below it find the runtime through the thread's binding, as PyTorch's ops find grad mode and
// autocast: a parameter on each of some 640 op calls would carry nothing more. OpenMP's worker
// threads have none bound: kernels read the runtime before a parallel region, never inside one.
//
// Each layer keeps its part in the fields marked with its folder; core names their types only.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct TapeNode;
struct OpProfile;
struct Tensor;

typedef struct Runtime {
  // autograd/tape.c
  bool grad_enabled;                 // ops record onto the tape (autograd_set_grad_enabled)
  struct TapeNode **tape;            // [tape_capacity], the recorded ops in order
  size_t tape_count, tape_capacity;  //
  bool profiling;                    // autograd_profile_enable
  struct OpProfile *profile;         // [RUNTIME_PROFILE_MAX_OPS] once profiling was on
  int profile_count;                 //
  double last_record_s;              // the forward clock: when the previous op ran
  // tensor/tensor.c
  struct Tensor **scope_items;         // [scope_capacity], tensors owned by the open scopes
  size_t scope_count, scope_capacity;  //
  bool bf16_fallback_said;             // device_set_bf16 said once that bf16 is not available
  // kernels/
  bool bf16_cpu, bf16_cuda;             // bf16 mixed precision per device (device_set_bf16)
  bool tf32;                            // CUDA GEMMs and convolutions in TF32 (device_set_tf32)
  int conv_forced_impl;                 // cpu_conv2d_set_impl's ConvImpl; 0 = choose
  int64_t gemm_bf16_min_batched_width;  // cpu_gemm_bf16_set_min_batched_width; -1 = default
  int64_t conv_whole_batch_bytes;       // onednn_conv2d_set_whole_batch_bytes; -1 = default
} Runtime;

#define RUNTIME_PROFILE_MAX_OPS 64

// A runtime with grad mode on, fp32, nothing recorded or scoped.
Runtime *runtime_create(void);
// Frees rt; it must be bound to no thread, its tape cleared and its scopes released.
void runtime_destroy(Runtime *rt);
// Binds rt (or NULL) to the calling thread; returns the runtime bound before, to restore.
Runtime *runtime_bind(Runtime *rt);
// The calling thread's runtime; a thread without one is a programming error, said with the caller.
#define runtime_current() runtime_current_at(__FILE__, __LINE__)
Runtime *runtime_current_at(const char *file, int line);
// The calling thread's runtime or NULL (OpenMP workers, loader threads).
Runtime *runtime_bound(void);

#ifdef __cplusplus
}
#endif
