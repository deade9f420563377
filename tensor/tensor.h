// Tensor: float32, contiguous row-major, on the CPU or a CUDA device, reference counted.
//
// Ownership: tensor_new* return a tensor the caller owns (release with tensor_release). Ops
// return *scoped* tensors: the current scope owns them and tensor_scope_release(mark) drops them
// all at once (a training step is one scope). tensor_retain keeps one alive past its scope.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/error.h"
#include "kernels/common.h"  // DETR_MAX_DIMS
#include "tensor/alloc.h"

typedef struct {
  int ndim;
  int64_t d[DETR_MAX_DIMS];
} Shape;

Shape shape_make(const int64_t *dims, int ndim);
#define SHAPE(...) shape_make((const int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
int64_t shape_numel(Shape s);
bool shape_equal(Shape a, Shape b);
// "[2, 3, 4]" into buf.
const char *shape_str(Shape s, char *buf, size_t cap);

struct TapeNode;

typedef struct Tensor {
  float *data;  // numel floats on `device`
  Shape shape;
  int64_t numel;
  Device device;
  int refcount;            // references to the tensor (header): tensor_retain and tensor_retain_header
  int data_refs;           // those of them that also need its data; at 0 the data is freed early
  struct Tensor *view_of;  // when set, `data` belongs to that tensor (a reference is held)
  size_t alloc_bytes;      // bytes of the owned allocation (0 for views)
  bool requires_grad;
  struct Tensor *grad;       // accumulated gradient (same shape), or NULL
  struct TapeNode *grad_fn;  // the node that produced this tensor, NULL for leaves
  uint16_t *bf16;            // a constant tensor's data rounded to bf16 (tensor_keep_bf16), or NULL
} Tensor;

// --- creation (caller owns the result) ---
Tensor *tensor_new(Device dev, Shape shape);  // uninitialised
Tensor *tensor_zeros(Device dev, Shape shape);
Tensor *tensor_ones(Device dev, Shape shape);
Tensor *tensor_full(Device dev, Shape shape, float value);
Tensor *tensor_from_host(Device dev, Shape shape, const float *host);
Tensor *tensor_to_device(const Tensor *t, Device dev);  // a copy on dev
// A tensor sharing t's data with another shape of the same numel (reshape without copy).
Tensor *tensor_view(Tensor *t, Shape shape);
// A tensor of `shape` on t's elements offset .. offset + numel(shape) - 1 (a contiguous slice).
Tensor *tensor_view_range(Tensor *t, int64_t offset, Shape shape);

// A weight that no longer changes (a model prepared for inference) keeps its data rounded to bf16
// beside it, so that bf16 mode's GEMMs read that instead of rounding it in every forward (views of t
// made afterwards point into the copy too). CPU only; the copy is freed with the data; called again,
// it rounds the data again. The writers that could leave the copy stale refuse such a tensor:
// tensor_copy_, tensor_fill_, loading parameters, AdamW.
void tensor_keep_bf16(Tensor *t);

Tensor *tensor_retain(Tensor *t);
void tensor_release(Tensor *t);
// A reference to the tensor that does not keep its data alive: autograd's nodes hold their inputs
// and outputs so (they need their shapes and .grad), and hold data only of what their backward
// reads (autograd_save). When the last data-holding reference goes, `data` is freed and NULL.
Tensor *tensor_retain_header(Tensor *t);
void tensor_release_header(Tensor *t);

// --- scopes: ops create their outputs here ---
typedef size_t ScopeMark;
Tensor *tensor_scoped(Tensor *t);  // hands ownership of t to the current scope, returns t
Tensor *tensor_new_scoped(Device dev, Shape shape);
ScopeMark tensor_scope_mark(void);
void tensor_scope_release(ScopeMark mark);  // releases every tensor scoped since mark
size_t tensor_scope_size(void);
// Releases everything scoped since mark except the n tensors in keep, which are scoped again
// (they stay valid). Frees a block's dead intermediates early: what the tape still needs for
// backward is held by its nodes, so only tensors nothing refers to any more are freed.
void tensor_scope_keep(ScopeMark mark, Tensor *const *keep, int n);

// --- tensors a long-lived object owns: a model's parameters and what it derives from them ---
// Model code declares the owner of what outlives a forward; the owner releases it all at once.
typedef struct {
  Tensor **items;  // [capacity]
  int count, capacity;
} TensorOwner;
// o takes t over: a tensor made unscoped for it (tensor_zeros, tensor_from_host), whose reference o
// now holds. Returns t.
Tensor *tensor_owner_adopt(TensorOwner *o, Tensor *t);
// o keeps t alive with a reference of its own: an op's output (scoped), which the scope releases as
// usual. Returns t.
Tensor *tensor_owner_keep(TensorOwner *o, Tensor *t);
// Releases every tensor o holds; o is empty after, and reusable.
void tensor_owner_clear(TensorOwner *o);

// --- a stack of layers, each one's temporaries freed after it: the lifetimes of model code ---
// A layer's step sets `carry` to every tensor that must outlive it: its output (the next layer's
// input) and the outputs the caller collects (each layer's, so far). NULL entries are allowed.
#define TENSOR_CARRY_MAX 64
typedef struct {
  Tensor *t[TENSOR_CARRY_MAX];
  int n;
} TensorCarry;
typedef void (*TensorLayerStep)(void *state, int layer, TensorCarry *carry);
// Runs step(state, i, carry) for i in [0, n). After each step every tensor made since the call
// began is released but those in carry; what the tape saved for backward lives on with the tape.
// So a stack holds one layer's temporaries at a time, and the carry's tensors end in the caller's
// scope. Model code (nn/) leaves every lifetime to this and to the scope of its caller.
void tensor_run_layers(int n, TensorLayerStep step, void *state, TensorCarry *carry);

// --- data movement and filling ---
void tensor_copy_(Tensor *dst, const Tensor *src);            // same numel, any devices
void tensor_copy_from_host_(Tensor *dst, const float *host);  // dst->numel floats
void tensor_to_host(const Tensor *t, float *host);            // t->numel floats
void tensor_fill_(Tensor *t, float value);

// Device-wide math setting: TF32 tensor-core math for matmuls (cuBLAS) and convolutions (cuDNN)
// on CUDA (sm_80+), off by default. No effect on the CPU or in a build without CUDA.
void device_set_tf32(Device dev, bool on);
// bf16 mixed precision for dev's convolutions and GEMMs (cpu_set_bf16, cuda_set_bf16).
// Where the device cannot run it at speed (a CPU without AVX512-BF16 or AMX; a GPU older than sm_80)
// it warns once on stderr and stays fp32: a model saved with bf16 still opens everywhere. Returns
// whether bf16 is on. Callers that were asked for bf16 explicitly check device_bf16_supported first.
bool device_set_bf16(Device dev, bool on);
bool device_bf16_supported(Device dev, char *why, size_t why_cap);
float tensor_item(const Tensor *t);  // the single element of a 1-element tensor

// --- random numbers: a counter-based stream (kernels/rng_math.h), the same on every device ---
typedef struct {
  uint64_t seed;
  uint64_t offset;  // next unused counter; each draw advances it
} Rng;
Rng rng_make(uint64_t seed);
void tensor_uniform_(Tensor *t, Rng *rng, float low, float high);
void tensor_normal_(Tensor *t, Rng *rng, float mean, float std);
// A uniform float in [0,1) and an integer in [0,n) from the host stream (augmentation, shuffles).
float rng_next_uniform(Rng *rng);
uint64_t rng_next_below(Rng *rng, uint64_t n);

// Tensor headers obtained from the system allocator (they are recycled through a free list).
uint64_t tensor_header_system_allocs(void);

// --- debugging ---
void tensor_print(FILE *f, const char *name, const Tensor *t);
