#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "core/clock.h"
#include "core/runtime.h"

// --- profile ---

// Grad mode, the tape and the profile are the bound runtime's (core/runtime.h).

typedef struct OpProfile {
  const char *name;
  int64_t calls;
  double forward_s, backward_s, flops;
  double recorded_s;  // the recorded calls' forward and backward time: the time flops counts
} OpProfile;

static OpProfile *profile_entry(Runtime *rt, const char *name) {
  OpProfile *profile = rt->profile;
  for (int i = 0; i < rt->profile_count; i++)
    if (profile[i].name == name || !strcmp(profile[i].name, name)) return &profile[i];
  if (rt->profile_count == RUNTIME_PROFILE_MAX_OPS) return NULL;
  profile[rt->profile_count] = (OpProfile){.name = name};
  return &profile[rt->profile_count++];
}

void autograd_profile_enable(bool on) {
  Runtime *rt = runtime_current();
  if (on && !rt->profile) rt->profile = detr_calloc(RUNTIME_PROFILE_MAX_OPS, sizeof(OpProfile), "the op profile");
  rt->profiling = on;
  rt->last_record_s = now_s();
}

void autograd_profile_reset(void) {
  Runtime *rt = runtime_current();
  rt->profile_count = 0;
  rt->last_record_s = now_s();
}

void autograd_profile_mark(void) { runtime_current()->last_record_s = now_s(); }

static int by_total_time(const void *a, const void *b) {
  const OpProfile *x = a, *y = b;
  double tx = x->forward_s + x->backward_s, ty = y->forward_s + y->backward_s;
  return (tx < ty) - (tx > ty);
}

void autograd_profile_report(FILE *f) {
  const Runtime *rt = runtime_current();
  int profile_count = rt->profile_count;
  OpProfile sorted[RUNTIME_PROFILE_MAX_OPS];
  if (profile_count) memcpy(sorted, rt->profile, sizeof(OpProfile) * (size_t)profile_count);
  qsort(sorted, (size_t)profile_count, sizeof(OpProfile), by_total_time);
  double total = 0.0, gemm = 0.0;
  for (int i = 0; i < profile_count; i++) {
    total += sorted[i].forward_s + sorted[i].backward_s;
    if (sorted[i].flops > 0) gemm += sorted[i].forward_s + sorted[i].backward_s;
  }
  fprintf(f, "%-22s %8s %10s %10s %7s %12s\n", "op", "calls", "fwd ms", "bwd ms", "share", "GFLOP/s");
  for (int i = 0; i < profile_count; i++) {
    const OpProfile *p = &sorted[i];
    double t = p->forward_s + p->backward_s;
    // Backward of a GEMM-shaped op does twice the forward's multiply-adds; the rate is over the
    // recorded calls alone (an unrecorded one - a frozen layer's, a forward without grad - counts no FLOPs).
    char rate[32] = "";
    if (p->flops > 0 && p->recorded_s > 0) snprintf(rate, sizeof rate, "%.1f", 3.0 * p->flops / p->recorded_s * 1e-9);
    fprintf(f, "%-22s %8lld %10.1f %10.1f %6.1f%% %12s\n", p->name, (long long)p->calls, p->forward_s * 1e3,
            p->backward_s * 1e3, total > 0 ? 100.0 * t / total : 0.0, rate);
  }
  if (gemm > 0)
    fprintf(f, "total %.1f ms; GEMM-shaped ops (matmul, bmm, linear, conv2d) %.1f%% of it\n", total * 1e3,
            100.0 * gemm / total);
  else  // ops count their FLOPs on their tape nodes
    fprintf(f, "total %.1f ms; no GEMM-shaped op recorded (a forward without a tape): no rates, no GEMM share\n",
            total * 1e3);
}

bool autograd_grad_enabled(void) { return runtime_current()->grad_enabled; }

bool autograd_set_grad_enabled(bool enabled) {
  Runtime *rt = runtime_current();
  bool previous = rt->grad_enabled;
  rt->grad_enabled = enabled;
  return previous;
}

void tensor_set_requires_grad(Tensor *t, bool requires_grad) {
  DETR_CHECK(t->grad_fn == NULL || requires_grad, "tensor_set_requires_grad: an op output cannot stop requiring grad");
  t->requires_grad = requires_grad;
}

// The tape (the runtime's): node pointers in recording order. Nodes come from a free list, shared
// by the runtimes as the allocator's caches are (a node is memory, not state), so that a
// steady-state step makes no malloc.
static TapeNode *node_pool = NULL;  // linked through `buf`
static pthread_mutex_t node_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t node_system_allocs = 0;  // under node_lock

uint64_t autograd_node_system_allocs(void) {
  pthread_mutex_lock(&node_lock);
  uint64_t n = node_system_allocs;
  pthread_mutex_unlock(&node_lock);
  return n;
}

static TapeNode *node_get(void) {
  pthread_mutex_lock(&node_lock);
  TapeNode *n = node_pool;
  if (n) node_pool = (TapeNode *)n->buf;
  else node_system_allocs++;
  pthread_mutex_unlock(&node_lock);
  if (!n) n = detr_malloc(sizeof(TapeNode), "a tape node");
  memset(n, 0, sizeof(*n));
  return n;
}

// Releases everything the node holds and returns it to the pool.
static void node_put(TapeNode *n) {
  for (int i = 0; i < n->n_out; i++) {
    if (n->out[i]->grad_fn == n) n->out[i]->grad_fn = NULL;
    tensor_release_header(n->out[i]);
  }
  for (int i = 0; i < n->n_in; i++) tensor_release_header(n->in[i]);
  for (int i = 0; i < n->n_saved; i++) tensor_release(n->saved[i]);
  if (n->buf) detr_free(n->buf_device, n->buf, n->buf_bytes);
  pthread_mutex_lock(&node_lock);
  n->buf = node_pool;
  node_pool = n;
  pthread_mutex_unlock(&node_lock);
}

bool autograd_records(int n_in, Tensor *const *in) {
  if (!runtime_current()->grad_enabled) return false;
  for (int i = 0; i < n_in; i++)
    if (in[i] && in[i]->requires_grad) return true;
  return false;
}

// The op named ran since the previous record (or mark): its forward time, counted whether or not
// it is recorded, so that a forward without a tape (inference) has a profile too. Returns its entry
// (NULL when the table is full) and the time in *took.
static OpProfile *profile_forward(Runtime *rt, const char *name, double *took) {
  double t = now_s();
  *took = t - rt->last_record_s;
  rt->last_record_s = t;
  OpProfile *p = profile_entry(rt, name);
  if (p) {
    p->calls++;
    p->forward_s += *took;
  }
  return p;
}

void autograd_profile_op(const char *name) {
  double took;
  Runtime *rt = runtime_current();
  if (rt->profiling) (void)profile_forward(rt, name, &took);
}

TapeNode *autograd_record(const char *name, BackwardFn backward, Tensor *out, int n_in, Tensor *const *in) {
  double took = 0.0;
  Runtime *rt = runtime_current();
  OpProfile *profiled = rt->profiling ? profile_forward(rt, name, &took) : NULL;
  if (!autograd_records(n_in, in)) return NULL;
  if (profiled) profiled->recorded_s += took;
  DETR_CHECK(n_in <= NODE_MAX_INPUTS, "autograd_record(%s): %d inputs, at most %d", name, n_in, NODE_MAX_INPUTS);
  if (rt->tape_count == rt->tape_capacity) {
    size_t cap = rt->tape_capacity ? 2 * rt->tape_capacity : 1024;
    rt->tape = detr_realloc(rt->tape, cap * sizeof(TapeNode *), "the tape");
    rt->tape_capacity = cap;
  }
  TapeNode *n = node_get();
  n->name = name;
  n->backward = backward;
  // Inputs and outputs are held for their shapes and .grad; their data only if saved.
  for (int i = 0; i < n_in; i++) n->in[i] = tensor_retain_header(in[i]);  // NULL inputs stay NULL
  n->n_in = n_in;
  rt->tape[rt->tape_count++] = n;
  autograd_add_output(n, out);
  return n;
}

void autograd_add_output(TapeNode *node, Tensor *out) {
  DETR_CHECK(node->n_out < NODE_MAX_OUTPUTS, "autograd(%s): too many outputs", node->name);
  node->out[node->n_out++] = tensor_retain_header(out);
  out->requires_grad = true;
  out->grad_fn = node;
}

void autograd_save(TapeNode *node, Tensor *t) {
  DETR_CHECK(node->n_saved < NODE_MAX_SAVED, "autograd(%s): too many saved tensors", node->name);
  node->saved[node->n_saved++] = tensor_retain(t);
}

Tensor *autograd_grad(Tensor *t) {
  if (!t->grad) t->grad = tensor_zeros(t->device, t->shape);
  return t->grad;
}

float *autograd_grad_to_write(Tensor *t, bool *overwrite) {
  *overwrite = false;
  if (!t || !t->requires_grad) return NULL;
  if (!t->grad) {
    t->grad = tensor_new(t->device, t->shape);
    *overwrite = true;
  }
  return t->grad->data;
}

bool autograd_grad_take(Tensor *t, Tensor *g) {
  if (!t->requires_grad || t->grad || !t->grad_fn || t->numel != g->numel) return false;
  t->grad = tensor_view(g, t->shape);
  return true;
}

void autograd_clear_tape(void) {
  Runtime *rt = runtime_current();
  while (rt->tape_count > 0) node_put(rt->tape[--rt->tape_count]);
}

size_t autograd_tape_size(void) { return runtime_current()->tape_count; }

void autograd_backward_with(Tensor *out, const Tensor *grad_out) {
  DETR_CHECK(out->requires_grad, "autograd_backward: the output does not require grad");
  DETR_CHECK(shape_equal(out->shape, grad_out->shape), "autograd_backward: grad shape mismatch");
  tensor_copy_(autograd_grad(out), grad_out);
  Runtime *rt = runtime_current();
  // Reverse recording order is a topological order of the graph.
  for (size_t k = rt->tape_count; k-- > 0;) {
    TapeNode *n = rt->tape[k];
    bool has_grad = false;
    for (int i = 0; i < n->n_out; i++) has_grad = has_grad || n->out[i]->grad != NULL;
    if (has_grad) {
      double t0 = rt->profiling ? now_s() : 0.0;
      for (int i = 0; i < n->n_out; i++) autograd_grad(n->out[i]);  // unused outputs: zeros
      n->backward(n);
      if (rt->profiling) {
        OpProfile *p = profile_entry(rt, n->name);
        if (p) {
          double took = now_s() - t0;
          p->backward_s += took;
          p->recorded_s += took;
          p->flops += n->flops;
        }
      }
    }
    // An op output's gradient is dead once its producer has run: free it now.
    for (int i = 0; i < n->n_out; i++) {
      tensor_release(n->out[i]->grad);
      n->out[i]->grad = NULL;
    }
    rt->tape_count = k;
    node_put(n);
  }
}

void autograd_backward(Tensor *loss) {
  DETR_CHECK(loss->numel == 1,
             "autograd_backward: loss has %lld elements; use "
             "autograd_backward_with for a non-scalar output",
             (long long)loss->numel);
  Tensor *one = tensor_ones(loss->device, loss->shape);
  autograd_backward_with(loss, one);
  tensor_release(one);
}

void autograd_zero_grad(Tensor *const *params, int n) {
  for (int i = 0; i < n; i++)
    if (params[i]->grad) tensor_fill_(params[i]->grad, 0.0f);
}

void autograd_drop_grad(Tensor *const *params, int n) {
  for (int i = 0; i < n; i++)
    if (params[i]->grad) {
      tensor_release(params[i]->grad);
      params[i]->grad = NULL;
    }
}
