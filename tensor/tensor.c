#include "tensor/tensor.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/rng_math.h"
#if DETR_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

// --- shapes ---

Shape shape_make(const int64_t *dims, int ndim) {
  DETR_CHECK(ndim >= 0 && ndim <= DETR_MAX_DIMS, "shape_make: rank %d is not in 0..%d", ndim, DETR_MAX_DIMS);
  Shape s = {.ndim = ndim};
  for (int i = 0; i < ndim; i++) {
    DETR_CHECK(dims[i] >= -1, "shape_make: negative dimension %lld", (long long)dims[i]);  // -1: inferred by reshape
    s.d[i] = dims[i];
  }
  return s;
}

int64_t shape_numel(Shape s) {
  int64_t n = 1;
  for (int i = 0; i < s.ndim; i++) n *= s.d[i];
  return n;
}

bool shape_equal(Shape a, Shape b) {
  if (a.ndim != b.ndim) return false;
  for (int i = 0; i < a.ndim; i++)
    if (a.d[i] != b.d[i]) return false;
  return true;
}

const char *shape_str(Shape s, char *buf, size_t cap) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < s.ndim && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)s.d[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
  return buf;
}

// --- tensor headers come from a free list: a steady-state step makes no malloc for them ---

static Tensor *header_pool = NULL;  // linked through `grad`
static pthread_mutex_t header_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t header_system_allocs = 0;

uint64_t tensor_header_system_allocs(void) {
  pthread_mutex_lock(&header_lock);
  uint64_t n = header_system_allocs;
  pthread_mutex_unlock(&header_lock);
  return n;
}

static Tensor *header_get(void) {
  pthread_mutex_lock(&header_lock);
  Tensor *t = header_pool;
  if (t) header_pool = t->grad;
  else header_system_allocs++;  // under the lock: the loader's threads make tensors too
  pthread_mutex_unlock(&header_lock);
  if (!t) t = detr_malloc(sizeof(Tensor), "a tensor header");
  memset(t, 0, sizeof(*t));
  return t;
}

static void header_put(Tensor *t) {
  pthread_mutex_lock(&header_lock);
  t->grad = header_pool;
  header_pool = t;
  pthread_mutex_unlock(&header_lock);
}

static void check_device(Device dev) {
  DETR_CHECK(dev == DEVICE_CPU || dev == DEVICE_CUDA, "tensor: unknown device %d", (int)dev);
#if !DETR_HAVE_CUDA
  DETR_CHECK(dev == DEVICE_CPU, "tensor: this build has no CUDA backend (configure with -DDETR_CUDA=ON)");
#endif
}

Tensor *tensor_new(Device dev, Shape shape) {
  check_device(dev);
  for (int i = 0; i < shape.ndim; i++)
    DETR_CHECK(shape.d[i] >= 0, "tensor_new: negative dimension %lld", (long long)shape.d[i]);
  Tensor *t = header_get();
  t->shape = shape;
  t->numel = shape_numel(shape);
  t->device = dev;
  t->refcount = 1;
  t->data_refs = 1;
  t->alloc_bytes = (size_t)t->numel * sizeof(float);
  t->data = detr_alloc(dev, t->alloc_bytes);
  return t;
}

Tensor *tensor_full(Device dev, Shape shape, float value) {
  Tensor *t = tensor_new(dev, shape);
  tensor_fill_(t, value);
  return t;
}
Tensor *tensor_zeros(Device dev, Shape shape) { return tensor_full(dev, shape, 0.0f); }
Tensor *tensor_ones(Device dev, Shape shape) { return tensor_full(dev, shape, 1.0f); }

Tensor *tensor_from_host(Device dev, Shape shape, const float *host) {
  Tensor *t = tensor_new(dev, shape);
  if (dev == DEVICE_CPU) {
    if (t->numel) memcpy(t->data, host, (size_t)t->numel * sizeof(float));
  } else {
#if DETR_HAVE_CUDA
    cuda_memcpy_h2d(t->data, host, (size_t)t->numel * sizeof(float));
#endif
  }
  return t;
}

Tensor *tensor_to_device(const Tensor *t, Device dev) {
  Tensor *out = tensor_new(dev, t->shape);
  tensor_copy_(out, t);
  return out;
}

Tensor *tensor_view(Tensor *t, Shape shape) {
  char a[64], b[64];
  DETR_CHECK(shape_numel(shape) == t->numel, "tensor_view: cannot view %s as %s", shape_str(t->shape, a, sizeof a),
             shape_str(shape, b, sizeof b));
  return tensor_view_range(t, 0, shape);
}

Tensor *tensor_view_range(Tensor *t, int64_t offset, Shape shape) {
  char a[64], b[64];
  int64_t numel = shape_numel(shape);
  DETR_CHECK(offset >= 0 && offset + numel <= t->numel, "tensor_view_range: %s at %lld is outside %s",
             shape_str(shape, b, sizeof b), (long long)offset, shape_str(t->shape, a, sizeof a));
  Tensor *v = header_get();
  v->data = t->data ? t->data + offset : NULL;
  v->bf16 = t->bf16 ? t->bf16 + offset : NULL;
  v->shape = shape;
  v->numel = numel;
  v->device = t->device;
  v->refcount = 1;
  v->data_refs = 1;
  v->view_of = tensor_retain(t);
  return v;
}

Tensor *tensor_retain(Tensor *t) {
  if (t) {
    DETR_CHECK(t->data || t->numel == 0 || t->data_refs > 0, "tensor_retain: the tensor's data was already freed");
    t->refcount++;
    t->data_refs++;
  }
  return t;
}

Tensor *tensor_retain_header(Tensor *t) {
  if (t) t->refcount++;
  return t;
}

void tensor_keep_bf16(Tensor *t) {
  DETR_CHECK(t->device == DEVICE_CPU && !t->view_of, "tensor_keep_bf16: a CPU tensor that owns its data");
  if (!t->numel) return;
  if (!t->bf16) t->bf16 = detr_malloc((size_t)t->numel * sizeof(uint16_t), "a weight's bf16 copy");
  cpu_round_bf16(t->data, 1, t->numel, t->bf16);  // (again where kept: the data may have been reloaded)
}

static void drop_data(Tensor *t) {
  if (t->view_of) tensor_release(t->view_of);
  else if (t->data) detr_free(t->device, t->data, t->alloc_bytes);
  if (!t->view_of) free(t->bf16);
  t->view_of = NULL;
  t->data = NULL;
  t->bf16 = NULL;
}

static void drop_header(Tensor *t) {
  if (--t->refcount > 0) return;
  drop_data(t);
  tensor_release(t->grad);
  header_put(t);
}

void tensor_release(Tensor *t) {
  if (!t) return;
  DETR_CHECK(t->refcount > 0 && t->data_refs > 0, "tensor_release: tensor released too often");
  if (--t->data_refs == 0) drop_data(t);
  drop_header(t);
}

void tensor_release_header(Tensor *t) {
  if (!t) return;
  DETR_CHECK(t->refcount > t->data_refs, "tensor_release_header: no header-only reference to release");
  drop_header(t);
}

// --- scopes ---

// The scope stack is the bound runtime's (core/runtime.h): a thread's ops scope into its own.

Tensor *tensor_scoped(Tensor *t) {
  Runtime *rt = runtime_current();
  if (rt->scope_count == rt->scope_capacity) {
    size_t cap = rt->scope_capacity ? 2 * rt->scope_capacity : 1024;
    rt->scope_items = detr_realloc(rt->scope_items, cap * sizeof(Tensor *), "the tensor scope");
    rt->scope_capacity = cap;
  }
  rt->scope_items[rt->scope_count++] = t;
  return t;
}

Tensor *tensor_new_scoped(Device dev, Shape shape) { return tensor_scoped(tensor_new(dev, shape)); }

ScopeMark tensor_scope_mark(void) { return runtime_current()->scope_count; }
size_t tensor_scope_size(void) { return runtime_current()->scope_count; }

void tensor_scope_release(ScopeMark mark) {
  Runtime *rt = runtime_current();
  DETR_CHECK(mark <= rt->scope_count, "tensor_scope_release: mark %zu is past the scope end %zu", mark,
             rt->scope_count);
  while (rt->scope_count > mark) tensor_release(rt->scope_items[--rt->scope_count]);
}

void tensor_scope_keep(ScopeMark mark, Tensor *const *keep, int n) {
  for (int i = 0; i < n; i++) tensor_retain(keep[i]);
  tensor_scope_release(mark);
  for (int i = 0; i < n; i++) tensor_scoped(keep[i]);
}

Tensor *tensor_owner_adopt(TensorOwner *o, Tensor *t) {
  if (o->count == o->capacity) {
    o->capacity = o->capacity ? 2 * o->capacity : 64;
    o->items = detr_realloc(o->items, (size_t)o->capacity * sizeof(Tensor *), "a tensor owner");
  }
  o->items[o->count++] = t;
  return t;
}

Tensor *tensor_owner_keep(TensorOwner *o, Tensor *t) { return tensor_owner_adopt(o, tensor_retain(t)); }

void tensor_owner_clear(TensorOwner *o) {
  for (int i = 0; i < o->count; i++) tensor_release(o->items[i]);
  free(o->items);
  *o = (TensorOwner){0};
}

void tensor_run_layers(int n, TensorLayerStep step, void *state, TensorCarry *carry) {
  ScopeMark mark = tensor_scope_mark();
  for (int i = 0; i < n; i++) {
    step(state, i, carry);
    DETR_CHECK(carry->n >= 0 && carry->n <= TENSOR_CARRY_MAX, "tensor_run_layers: a carry of %d tensors (at most %d)",
               carry->n, TENSOR_CARRY_MAX);
    Tensor *keep[TENSOR_CARRY_MAX];
    int k = 0;
    for (int j = 0; j < carry->n; j++)
      if (carry->t[j]) keep[k++] = carry->t[j];
    tensor_scope_keep(mark, keep, k);
  }
}

// --- data movement ---

void tensor_copy_(Tensor *dst, const Tensor *src) {
  DETR_CHECK(!dst->bf16, "tensor_copy_: the destination is kept in bf16 (tensor_keep_bf16): its copy would go stale");
  DETR_CHECK(dst->numel == src->numel, "tensor_copy_: %lld elements into %lld", (long long)src->numel,
             (long long)dst->numel);
  size_t bytes = (size_t)src->numel * sizeof(float);
  if (bytes == 0 || dst->data == src->data) return;
  if (dst->device == DEVICE_CPU && src->device == DEVICE_CPU) {
    memcpy(dst->data, src->data, bytes);
    return;
  }
#if DETR_HAVE_CUDA
  if (dst->device == DEVICE_CUDA && src->device == DEVICE_CUDA) cuda_memcpy_d2d(dst->data, src->data, bytes);
  else if (dst->device == DEVICE_CUDA) cuda_memcpy_h2d(dst->data, src->data, bytes);
  else cuda_memcpy_d2h(dst->data, src->data, bytes);
#endif
}

void tensor_copy_from_host_(Tensor *dst, const float *host) {
  DETR_CHECK(!dst->bf16, "tensor_copy_from_host_: the destination is kept in bf16 (tensor_keep_bf16)");
  size_t bytes = (size_t)dst->numel * sizeof(float);
  if (bytes == 0) return;
  if (dst->device == DEVICE_CPU) {
    memcpy(dst->data, host, bytes);
    return;
  }
#if DETR_HAVE_CUDA
  cuda_memcpy_h2d(dst->data, host, bytes);
#endif
}

void tensor_to_host(const Tensor *t, float *host) {
  size_t bytes = (size_t)t->numel * sizeof(float);
  if (bytes == 0) return;
  if (t->device == DEVICE_CPU) {
    memcpy(host, t->data, bytes);
    return;
  }
#if DETR_HAVE_CUDA
  cuda_memcpy_d2h(host, t->data, bytes);
#endif
}

float tensor_item(const Tensor *t) {
  DETR_CHECK(t->numel == 1, "tensor_item: tensor has %lld elements, not 1", (long long)t->numel);
  float v;
  tensor_to_host(t, &v);
  return v;
}

void tensor_fill_(Tensor *t, float value) {
  DETR_CHECK(!t->bf16, "tensor_fill_: the tensor is kept in bf16 (tensor_keep_bf16): its copy would go stale");
  if (t->device == DEVICE_CPU) {
    cpu_fill(t->data, t->numel, value);
    return;
  }
#if DETR_HAVE_CUDA
  cuda_fill(t->data, t->numel, value);
#endif
}

// --- random numbers ---

Rng rng_make(uint64_t seed) { return (Rng){.seed = seed, .offset = 0}; }

void tensor_uniform_(Tensor *t, Rng *rng, float low, float high) {
  if (t->device == DEVICE_CPU) {
    cpu_uniform(t->data, t->numel, rng->seed, rng->offset, low, high);
  } else {
#if DETR_HAVE_CUDA
    cuda_uniform(t->data, t->numel, rng->seed, rng->offset, low, high);
#endif
  }
  rng->offset += rng_counters_uniform((uint64_t)t->numel);
}

void tensor_normal_(Tensor *t, Rng *rng, float mean, float std) {
  if (t->device == DEVICE_CPU) {
    cpu_normal(t->data, t->numel, rng->seed, rng->offset, mean, std);
  } else {
#if DETR_HAVE_CUDA
    cuda_normal(t->data, t->numel, rng->seed, rng->offset, mean, std);
#endif
  }
  rng->offset += rng_counters_normal((uint64_t)t->numel);
}

float rng_next_uniform(Rng *rng) {
  float u = rng_uniform_at(rng->seed, rng->offset, 0);
  rng->offset += 1;
  return u;
}

uint64_t rng_next_below(Rng *rng, uint64_t n) {
  DETR_CHECK(n > 0, "rng_next_below: empty range");
  Philox4 r = philox4x32(rng->offset, rng->seed);
  rng->offset += 1;
  uint64_t word = ((uint64_t)r.v[0] << 32) | r.v[1];
  return word % n;  // bias <= n / 2^64: negligible for dataset sizes
}

// --- debugging ---

void tensor_print(FILE *f, const char *name, const Tensor *t) {
  char buf[96];
  fprintf(f, "%s: %s %s", name ? name : "tensor", device_name(t->device), shape_str(t->shape, buf, sizeof buf));
  float *host = detr_malloc((size_t)(t->numel ? t->numel : 1) * sizeof(float), "tensor_print host");
  tensor_to_host(t, host);
  int64_t last = t->shape.ndim ? t->shape.d[t->shape.ndim - 1] : 1;
  int64_t shown = t->numel < 64 ? t->numel : 64;
  for (int64_t i = 0; i < shown; i++) {
    if (last > 0 && i % last == 0) fprintf(f, "\n ");
    fprintf(f, " %10.5g", host[i]);
  }
  if (shown < t->numel) fprintf(f, " ... (%lld more)", (long long)(t->numel - shown));
  fprintf(f, "\n");
  free(host);
}

void device_set_tf32(Device dev, bool on) {
#if DETR_HAVE_CUDA
  if (dev == DEVICE_CUDA) cuda_set_tf32(on);
#endif
  (void)dev, (void)on;
}

bool device_bf16_supported(Device dev, char *why, size_t why_cap) {
  if (dev == DEVICE_CUDA) {
#if DETR_HAVE_CUDA
    return cuda_bf16_supported(why, why_cap);
#else
    snprintf(why, why_cap, "this build has no CUDA backend");
    return false;
#endif
  }
  return cpu_bf16_supported(why, why_cap);
}

bool device_set_bf16(Device dev, bool on) {
  char why[256];
  Runtime *rt = runtime_current();
  if (on && !device_bf16_supported(dev, why, sizeof why)) {
    if (!rt->bf16_fallback_said) fprintf(stderr, "detr: bf16 asked for, running fp32: %s\n", why);
    rt->bf16_fallback_said = true;
    on = false;
  }
  if (dev == DEVICE_CPU) cpu_set_bf16(on);
#if DETR_HAVE_CUDA
  if (dev == DEVICE_CUDA) cuda_set_bf16(on);
#endif
  return on;
}
