#include "nn/params.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"

void params_init(ParamStore *ps, Device dev) { *ps = (ParamStore){.device = dev}; }

void params_free(ParamStore *ps) {
  tensor_owner_clear(&ps->derived);
  tensor_owner_clear(&ps->owner);
  free(ps->items);
  *ps = (ParamStore){.device = ps->device};
}

Tensor *params_add(ParamStore *ps, Shape shape, ParamKind kind, LrGroup group, const char *fmt, ...) {
  char name[sizeof ps->items[0].name];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  DETR_CHECK(n > 0 && (size_t)n < sizeof name, "params_add: name too long");
  DETR_CHECK(params_find(ps, name) == NULL, "params_add: '%s' registered twice", name);
  if (ps->count == ps->capacity) {
    int cap = ps->capacity ? 2 * ps->capacity : 128;
    Param *grown = detr_realloc(ps->items, (size_t)cap * sizeof(Param), "parameters");
    ps->items = grown;
    ps->capacity = cap;
  }
  Param *p = &ps->items[ps->count++];
  *p = (Param){0};
  memcpy(p->name, name, sizeof name);
  p->tensor = tensor_owner_adopt(&ps->owner, tensor_zeros(ps->device, shape));
  p->kind = kind;
  p->group = group;
  tensor_set_requires_grad(p->tensor, kind == PARAM_TRAINABLE);
  return p->tensor;
}

void param_name_join(char *out, size_t cap, const char *prefix, const char *name) {
  size_t a = strlen(prefix), b = strlen(name);
  DETR_CHECK(a + 1 + b < cap, "parameter name %s.%s is too long", prefix, name);
  memcpy(out, prefix, a);
  out[a] = '.';
  memcpy(out + a + 1, name, b + 1);
}

Param *params_find(const ParamStore *ps, const char *name) {
  for (int i = 0; i < ps->count; i++)
    if (!strcmp(ps->items[i].name, name)) return &ps->items[i];
  return NULL;
}

int64_t params_numel(const ParamStore *ps, ParamKind kind) {
  int64_t n = 0;
  for (int i = 0; i < ps->count; i++)
    if (ps->items[i].kind == kind) n += ps->items[i].tensor->numel;
  return n;
}

void init_uniform(Tensor *t, Rng *rng, float bound) { tensor_uniform_(t, rng, -bound, bound); }
void init_normal(Tensor *t, Rng *rng, float std) { tensor_normal_(t, rng, 0.0f, std); }

void init_trunc_normal(Tensor *t, Rng *rng, float std, float a, float b) {
  DETR_CHECK(a < 0.0f && b > 0.0f && std > 0.0f, "init_trunc_normal: [%g, %g] does not hold 0", a, b);
  tensor_normal_(t, rng, 0.0f, std);
  float *host = detr_malloc((size_t)t->numel * sizeof(float), "init_trunc_normal");
  tensor_to_host(t, host);
  for (int64_t i = 0; i < t->numel; i++)
    while (!(host[i] >= a && host[i] <= b)) {  // Box-Muller from the host stream
      float u1 = rng_next_uniform(rng), u2 = rng_next_uniform(rng);
      host[i] = std * sqrtf(-2.0f * logf(1.0f - u1)) * cosf(6.2831853f * u2);
    }
  tensor_copy_from_host_(t, host);
  free(host);
}

// torch's _calculate_fan_in_and_fan_out: dims 0 and 1 times the receptive field (dims 2..).
static void fans(const Tensor *t, double *fan_in, double *fan_out) {
  DETR_CHECK(t->shape.ndim >= 2, "init: fan of a tensor with fewer than 2 dimensions");
  double receptive = 1;
  for (int d = 2; d < t->shape.ndim; d++) receptive *= (double)t->shape.d[d];
  *fan_in = (double)t->shape.d[1] * receptive;
  *fan_out = (double)t->shape.d[0] * receptive;
}

void init_xavier_uniform(Tensor *t, Rng *rng) {
  double fi, fo;
  fans(t, &fi, &fo);
  init_uniform(t, rng, (float)sqrt(6.0 / (fi + fo)));
}

void init_torch_default(Tensor *weight, Tensor *bias, Rng *rng) {
  double fi, fo;
  fans(weight, &fi, &fo);
  float bound = fi > 0 ? (float)(1.0 / sqrt(fi)) : 0.0f;
  init_uniform(weight, rng, bound);
  if (bias) init_uniform(bias, rng, bound);
}

void init_kaiming_normal_fan_out(Tensor *t, Rng *rng) {
  double fi, fo;
  fans(t, &fi, &fo);
  init_normal(t, rng, (float)sqrt(2.0 / fo));
}
