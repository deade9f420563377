// PVT spatial-reduction attention (Wang et al., ICCV 2021; github whai362/PVT, classification/pvt.py,
// Attention with sr_ratio): keys and values come from a reduced map,
//   SR(x) = LayerNorm(Conv2d(d, d, kernel R, stride R)(x as [B, d, H, W])),  N -> ceil(H/R) ceil(W/R)
// then DETR's multi-head attention (q from every pixel, k from SR(x + pos), v from SR(x)). Padded
// pixels are zeroed before the convolution and the map is zero-padded bottom/right to a multiple of
// R; a reduced cell with no valid pixel is a masked key. R = 1 is dense attention (PVT has no SR
// then). O(N^2 d / R^2).
#include <math.h>
#include <stdlib.h>

#include "nn/encoder_attn.h"

typedef struct {
  Conv2d sr;
  LayerNorm norm;
  int ratio;
} SraAttn;

static const AttnSettingSpec SETTINGS[] = {
    {"sra_ratio", ATTN_SETTING_INT, 2.0, 1.0, 16.0, "PVT's reduction ratio R (kernel and stride)"},
};

static void create(void *extras, ParamStore *ps, const char *prefix, int64_t dim, int64_t heads,
                   const AttnSettings *settings) {
  SraAttn *s = extras;
  s->ratio = (int)attn_setting(settings, "sra_ratio");
  if (s->ratio == 1) return;  // dense: no parameters of its own
  char name[112];
  param_name_join(name, sizeof name, prefix, "sr");
  s->sr = conv2d_create(ps, name, dim, dim, s->ratio, s->ratio, 0, 1, true, PARAM_TRAINABLE, LR_GROUP_MAIN);
  param_name_join(name, sizeof name, prefix, "norm");
  s->norm = layernorm_create(ps, name, dim);
}

static void init(void *extras, Rng *rng) {  // pvt_v2.py's _init_weights (pvt.py v1 keeps torch's conv default)
  SraAttn *s = extras;
  if (s->ratio == 1) return;
  init_kaiming_normal_fan_out(s->sr.weight, rng);  // N(0, 2 / (R^2 d)): PVT's fan_out normal
  tensor_fill_(s->sr.bias, 0.0f);
  tensor_fill_(s->norm.weight, 1.0f);
  tensor_fill_(s->norm.bias, 0.0f);
}

// SR of x [B, N, d] with padded pixels zeroed -> [B, Nr, d].
static Tensor *reduce(const SraAttn *s, Tensor *x, const FeatureGeometry *g, int64_t Hr, int64_t Wr) {
  int64_t B = g->B, d = x->shape.d[2], R = s->ratio;
  Tensor *map = op_reshape(op_transpose(op_mul(x, g->valid), 1, 2), SHAPE(B, d, g->Hp, g->Wp));
  if (Hr * R > g->Hp) {
    Tensor *parts[2] = {map, op_zeros(x->device, SHAPE(B, d, Hr * R - g->Hp, g->Wp))};
    map = op_concat(parts, 2, 2);
  }
  if (Wr * R > g->Wp) {
    Tensor *parts[2] = {map, op_zeros(x->device, SHAPE(B, d, Hr * R, Wr * R - g->Wp))};
    map = op_concat(parts, 2, 3);
  }
  Tensor *reduced = conv2d_forward(&s->sr, map);  // [B, d, Hr, Wr]
  return layernorm_forward(&s->norm, op_transpose(op_reshape(reduced, SHAPE(B, d, Hr * Wr)), 1, 2));
}

static Tensor *forward(const void *extras, const NnCtx *ctx, const EncoderAttnInput *in, AttnTrace *trace, char *err,
                       size_t err_cap) {
  const SraAttn *s = extras;
  const FeatureGeometry *g = in->geom;
  Tensor *qk = op_add(in->x, in->pos);
  if (s->ratio == 1) return mha_forward(in->proj, ctx, qk, qk, in->x, g->key_mask);
  int64_t R = s->ratio, Hr = (g->Hp + R - 1) / R, Wr = (g->Wp + R - 1) / R;
  // A reduced cell is a key when any of its pixels is valid.
  float *host = detr_malloc((size_t)(g->B * Hr * Wr) * sizeof(float), "sra attention key mask");
  for (int64_t b = 0; b < g->B; b++)
    for (int64_t cy = 0; cy < Hr; cy++)
      for (int64_t cx = 0; cx < Wr; cx++) {
        bool any = false;
        for (int64_t y = cy * R; y < (cy + 1) * R && y < g->Hp; y++)
          for (int64_t x = cx * R; x < (cx + 1) * R && x < g->Wp; x++) any |= !g->mask[(b * g->Hp + y) * g->Wp + x];
        host[(b * Hr + cy) * Wr + cx] = any ? 0.0f : -INFINITY;
      }
  Tensor *key_mask = op_constant(in->x->device, SHAPE(g->B, Hr * Wr), host);
  free(host);
  Tensor *k = reduce(s, qk, g, Hr, Wr), *v = reduce(s, in->x, g, Hr, Wr);
  return mha_forward(in->proj, ctx, qk, k, v, key_mask);
}

const EncoderAttnKind encoder_attn_sra = {
    .name = "sra",
    .summary = "PVT spatial-reduction attention: keys and values from a stride-R conv + LayerNorm, O(N^2 d / R^2)",
    .settings = SETTINGS,
    .n_settings = (int)(sizeof SETTINGS / sizeof SETTINGS[0]),
    .extras_size = sizeof(SraAttn),
    .create = create,
    .init = init,
    .forward = forward,
};
