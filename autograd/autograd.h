// Tape-based reverse-mode autograd. Every op whose inputs require grad (with grad mode on)
// appends a TapeNode holding its inputs, whatever it saved for backward and its backward
// function. autograd_backward walks the tape in reverse, accumulating into Tensor.grad, then
// releases the tape. Leaf tensors (parameters) keep their .grad across steps until zeroed.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "tensor/tensor.h"

#define NODE_MAX_INPUTS 8
#define NODE_MAX_OUTPUTS 2
#define NODE_MAX_SAVED 8
#define NODE_ATTRS_BYTES 104  // the largest op attributes: conv2d's and maxpool2d's ConvGeom

typedef struct TapeNode TapeNode;
typedef void (*BackwardFn)(TapeNode *node);

struct TapeNode {
  const char *name;  // the op, for error messages
  BackwardFn backward;
  Tensor *out[NODE_MAX_OUTPUTS];
  int n_out;
  Tensor *in[NODE_MAX_INPUTS];
  int n_in;
  Tensor *saved[NODE_MAX_SAVED];  // extra tensors backward needs (references held)
  int n_saved;
  double flops;  // multiply-adds x 2 of the forward (GEMM-shaped ops set it; for the profile)
  void *buf;     // op-private data (e.g. argmax indices), from detr_alloc on buf_device
  size_t buf_bytes;
  Device buf_device;
  // The op's attributes (sizes, flags, scalars): a struct of the op's own, through NODE_ATTRS.
  _Alignas(max_align_t) unsigned char attrs[NODE_ATTRS_BYTES];
};

// node's attributes as the op's struct Type, e.g. `NODE_ATTRS(n, SliceAttrs)->start`; the op
// writes them when recording and its backward reads them. A Type that does not fit the node is a
// compile-time error.
#define NODE_ATTRS(node, Type)                                                                   \
  ((void)sizeof(struct {                                                                         \
     _Static_assert(sizeof(Type) <= NODE_ATTRS_BYTES && _Alignof(Type) <= _Alignof(max_align_t), \
                    #Type " does not fit TapeNode.attrs");                                       \
     char unused;                                                                                \
   }),                                                                                           \
   (Type *)(node)->attrs)

// Grad mode. autograd_set_grad_enabled returns the previous mode, to restore it later.
bool autograd_grad_enabled(void);
bool autograd_set_grad_enabled(bool enabled);

void tensor_set_requires_grad(Tensor *t, bool requires_grad);

// Records an op producing `out` from `in`. Returns NULL (and records nothing) when grad mode is
// off or no input requires grad; otherwise out->requires_grad is set and the node is returned
// for the op to fill in its attributes and saved tensors.
TapeNode *autograd_record(const char *name, BackwardFn backward, Tensor *out, int n_in, Tensor *const *in);
// Whether autograd_record would record an op of these inputs now: for an op that must know before
// its kernel runs (what it keeps for a backward is written by the forward's kernel).
bool autograd_records(int n_in, Tensor *const *in);
void autograd_add_output(TapeNode *node, Tensor *out);
// Keeps t's data for backward (inputs and outputs are otherwise held without their data: an op
// saves exactly what its backward reads).
void autograd_save(TapeNode *node, Tensor *t);

// The gradient buffer of t, created zero-filled on first use; backward kernels accumulate into it.
Tensor *autograd_grad(Tensor *t);
// For a backward kernel that can either write or add its whole term: t's gradient buffer, created
// without zero fill when t has none yet, in which case *overwrite is set true and the kernel must
// write every element instead of adding (a convolution's dx: oneDNN and cuDNN write it directly,
// no zero fill, no add pass). NULL when t takes no gradient.
float *autograd_grad_to_write(Tensor *t, bool *overwrite);
// For a backward whose gradient for input t is exactly its output's gradient g (add, reshape), or
// one it can write into g's buffer in place once nothing else reads g (frozen batch norm's
// residual): when t needs a gradient and has none yet, t's gradient becomes g itself (a view of its
// data: no zero fill, no add pass) and true is returned; the caller then must not add into t as
// well. Only for t produced by an op (parameters keep buffers of their own) and g an op output's
// gradient, which the tape drops once its producer has run, so the data has no other user.
bool autograd_grad_take(Tensor *t, Tensor *g);

// Backward from a one-element loss (seeded with 1), or from `out` seeded with grad_out.
// Both release the tape afterwards.
void autograd_backward(Tensor *loss);
void autograd_backward_with(Tensor *out, const Tensor *grad_out);
// Drops the tape without running backward (e.g. after an evaluation forward in grad mode).
void autograd_clear_tape(void);
size_t autograd_tape_size(void);
// Tape nodes obtained from the system allocator (they are recycled through a free list).
uint64_t autograd_node_system_allocs(void);

// Per-op profile: with profiling on, every op's forward time (the time since the previous op asked
// autograd_record, so ops must ask as they run, as they do; recorded or not, so that a forward
// without a tape - inference - has a profile too) and recorded ops' backward time are summed by op
// name, with the FLOPs recorded GEMM-shaped ops declare. The report lists ops by total time.
void autograd_profile_enable(bool on);
void autograd_profile_reset(void);
void autograd_profile_mark(void);  // restart the forward clock (e.g. at a step's start)
void autograd_profile_report(FILE *f);
// For an op that never records (inference only: op_conv2d_fused): its forward time, as a recorded op's.
void autograd_profile_op(const char *name);

// Zero-fills the .grad of each tensor that has one.
void autograd_zero_grad(Tensor *const *params, int n);
// Releases the .grad of each tensor that has one (torch's zero_grad(set_to_none=True)): the next
// backward makes it afresh, and a kernel that writes its whole term (autograd_grad_to_write: a
// convolution's or linear layer's dW) then writes instead of adding to zeros, and no pass zeroes
// it between steps. Until then the memory is free for the forward's activations.
void autograd_drop_grad(Tensor *const *params, int n);
