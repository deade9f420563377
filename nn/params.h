// Named parameters and buffers of a model, under exactly the reference implementation's
// state_dict names (e.g. "transformer.encoder.layers.0.linear1.weight"), so that an official
// checkpoint converted to safetensors loads with no renaming.
#pragma once
#include <stdbool.h>

#include "tensor/tensor.h"

typedef enum {
  PARAM_TRAINABLE,  // takes gradients and optimizer steps
  PARAM_FROZEN,     // a parameter kept fixed (DETR: the ResNet stem and layer1)
  PARAM_BUFFER,     // not a parameter at all (frozen batch-norm statistics)
} ParamKind;

typedef enum { LR_GROUP_MAIN = 0, LR_GROUP_BACKBONE = 1 } LrGroup;

typedef struct {
  char name[112];
  Tensor *tensor;  // owned by the store
  ParamKind kind;
  LrGroup group;
  bool optional;  // may be absent from a weights file (ENACT's W_prob when loading DETR weights)
} Param;

typedef struct {
  Param *items;
  int count, capacity;
  Device device;
  TensorOwner owner;    // the parameters' tensors
  TensorOwner derived;  // what inference derives from them (folded convolutions, a decoder's query terms)
} ParamStore;

void params_init(ParamStore *ps, Device dev);
void params_free(ParamStore *ps);
// A zero-filled tensor registered as name (printf-style); trainable ones require grad.
#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
Tensor *
params_add(ParamStore *ps, Shape shape, ParamKind kind, LrGroup group, const char *fmt, ...);
// out = "prefix.name" (fails when longer than a parameter name may be).
void param_name_join(char *out, size_t cap, const char *prefix, const char *name);
Param *params_find(const ParamStore *ps, const char *name);
int64_t params_numel(const ParamStore *ps, ParamKind kind);

// --- initialisers (torch's formulas; values from our counter-based Rng, not torch's) ---
void init_uniform(Tensor *t, Rng *rng, float bound);  // U(-bound, bound)
void init_normal(Tensor *t, Rng *rng, float std);     // N(0, std^2)
// N(0, std^2) truncated to [a, b] (absolute bounds, as timm's trunc_normal_): values outside redrawn.
void init_trunc_normal(Tensor *t, Rng *rng, float std, float a, float b);
// xavier_uniform_: bound = sqrt(6 / (fan_in + fan_out)); fan_in = dims[1] * receptive field.
void init_xavier_uniform(Tensor *t, Rng *rng);
// nn.Linear / nn.Conv2d defaults: kaiming_uniform_(a = sqrt(5)) -> bound 1/sqrt(fan_in) for the
// weight, and U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias.
void init_torch_default(Tensor *weight, Tensor *bias, Rng *rng);
// torchvision ResNet convolutions: kaiming_normal_(mode = fan_out, nonlinearity = relu).
void init_kaiming_normal_fan_out(Tensor *t, Rng *rng);
