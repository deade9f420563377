#include "core/runtime.h"

#include <stdlib.h>

#include "core/error.h"

// The one mutable variable of the runtime's own: which runtime this thread runs ops in.
static _Thread_local Runtime *bound_runtime = NULL;

Runtime *runtime_create(void) {
  Runtime *rt = detr_calloc(1, sizeof(Runtime), "a runtime");
  rt->grad_enabled = true;
  rt->gemm_bf16_min_batched_width = -1;
  rt->conv_whole_batch_bytes = -1;
  return rt;
}

void runtime_destroy(Runtime *rt) {
  if (!rt) return;
  DETR_CHECK(bound_runtime != rt, "runtime_destroy: the runtime is still bound to this thread (runtime_bind(NULL))");
  DETR_CHECK(rt->tape_count == 0, "runtime_destroy: %zu ops still on the tape (autograd_clear_tape)", rt->tape_count);
  DETR_CHECK(rt->scope_count == 0, "runtime_destroy: %zu tensors still scoped (tensor_scope_release)", rt->scope_count);
  free(rt->tape);
  free(rt->profile);
  free(rt->scope_items);
  free(rt);
}

Runtime *runtime_bind(Runtime *rt) {
  Runtime *before = bound_runtime;
  bound_runtime = rt;
  return before;
}

Runtime *runtime_bound(void) { return bound_runtime; }

Runtime *runtime_current_at(const char *file, int line) {
  if (!bound_runtime)
    detr_fail(file, line,
              "no runtime bound to this thread: create one and bind it first (runtime_bind, core/runtime.h)");
  return bound_runtime;
}
