// Swin Transformer's (shifted) window attention (Liu et al., ICCV 2021; github
// microsoft/Swin-Transformer, models/swin_transformer.py: WindowAttention and SwinTransformerBlock;
// torchvision's models/swin_transformer.py shifted_window_attention for maps that are no multiple
// of the window). The feature map is padded bottom/right to a multiple of the window W and cut into
// W x W windows; per window and head
//   softmax(q k^T / sqrt(hd) + B_rel + M) v,   B_rel[i, j] = relative_position_bias_table[idx(i - j)]
// with the learnt table [(2W-1)^2, heads] indexed by the relative position of the two pixels. Every
// odd encoder layer (index 1, 3, ...) first rolls the map by -W/2 on both axes (torch.roll), so its
// windows straddle the previous layer's, and its mask M is Swin's: the rolled map's regions
// [0, H-W), [H-W, H-W/2), [H-W/2, H) by rows times the same by columns, -100 between different
// regions of one window (pixels the roll brought together). DETR's projections: q = k from x + pos,
// v from x. Padding (docs/attention.md): a key that is DETR padding or window padding is masked
// (-inf), unlike torchvision, whose zero tokens take part; a query with no valid key in its window
// (a padded pixel) gets a zero attention output. The shift applies even where the map is one window
// wide (torchvision does not shift then), so an image's output does not depend on how much its batch
// pads it. O(N W^2 d).
#include <math.h>
#include <stdlib.h>

#include "nn/encoder_attn.h"

typedef struct {
  Tensor *table;  // relative_position_bias_table [(2W-1)^2, heads]
  int window;
  bool shift;
  int64_t heads;
} SwinAttn;

static const AttnSettingSpec SETTINGS[] = {
    {"swin_window", ATTN_SETTING_INT, 7.0, 1.0, 16.0, "Swin's window size W (W x W pixels)"},
    {"swin_shift", ATTN_SETTING_BOOL, 1.0, 0.0, 1.0, "odd encoder layers shift the windows by W/2"},
};

static void create(void *extras, ParamStore *ps, const char *prefix, int64_t dim, int64_t heads,
                   const AttnSettings *settings) {
  SwinAttn *s = extras;
  s->window = (int)attn_setting(settings, "swin_window");
  s->shift = attn_setting(settings, "swin_shift") != 0;
  s->heads = heads;
  int64_t side = 2 * s->window - 1;
  s->table = params_add(ps, SHAPE(side * side, heads), PARAM_TRAINABLE, LR_GROUP_MAIN,
                        "%s.relative_position_bias_table", prefix);
}

static void init(void *extras, Rng *rng) {  // WindowAttention: trunc_normal_(std=.02), timm's bounds [-2, 2]
  SwinAttn *s = extras;
  init_trunc_normal(s->table, rng, 0.02f, -2.0f, 2.0f);
}

// The batch's windows: padded map Hw x Ww (multiples of W), rolled by -shift, nW windows of T = W^2
// slots per image. Host arrays, freed by windows_free.
typedef struct {
  int64_t W, shift, Hw, Ww, nWw, nW, T;
  int64_t *part;      // [B * nW * T] each slot's row of x [B*N (+1), d]; B*N: a zero row (window padding)
  int64_t *unpart;    // [B * N] each pixel's slot
  float *key_mask;    // [B * nW, T] 0 valid key, -inf DETR or window padding
  float *shift_mask;  // [nW, T, T] Swin's 0 / -100 (shift > 0), else NULL
  bool padded;        // the map needed window padding (part uses the zero row)
} Windows;

// Swin's region of a rolled coordinate (the official h_slices / w_slices).
static int region(int64_t v, int64_t extent, int64_t W, int64_t shift) {
  return v < extent - W ? 0 : v < extent - shift ? 1 : 2;
}

static void shift_mask_make(Windows *w) {
  int64_t T = w->T, W = w->W;
  w->shift_mask = detr_malloc((size_t)(w->nW * T * T) * sizeof(float), "swin shift mask");
  int *label = detr_malloc((size_t)T * sizeof(int), "swin shift labels");
  for (int64_t win = 0; win < w->nW; win++) {
    int64_t Y0 = win / w->nWw * W, X0 = win % w->nWw * W;
    for (int64_t t = 0; t < T; t++)
      label[t] = 3 * region(Y0 + t / W, w->Hw, W, w->shift) + region(X0 + t % W, w->Ww, W, w->shift);
    for (int64_t i = 0; i < T; i++)
      for (int64_t j = 0; j < T; j++) w->shift_mask[(win * T + i) * T + j] = label[i] == label[j] ? 0.0f : -100.0f;
  }
  free(label);
}

static void windows_make(const FeatureGeometry *g, int64_t W, int64_t shift, Windows *w) {
  int64_t B = g->B, Hp = g->Hp, Wp = g->Wp, N = Hp * Wp;
  *w = (Windows){.W = W, .shift = shift, .Hw = (Hp + W - 1) / W * W, .Ww = (Wp + W - 1) / W * W, .T = W * W};
  w->nWw = w->Ww / W;
  w->nW = w->Hw / W * w->nWw;
  w->padded = w->Hw != Hp || w->Ww != Wp;
  int64_t slots = B * w->nW * w->T;
  w->part = detr_malloc((size_t)(slots + B * N) * sizeof(int64_t), "swin window index");
  w->unpart = w->part + slots;
  w->key_mask = detr_malloc((size_t)slots * sizeof(float), "swin key mask");
  for (int64_t b = 0; b < B; b++)
    for (int64_t Y = 0; Y < w->Hw; Y++)
      for (int64_t X = 0; X < w->Ww; X++) {
        int64_t y = (Y + shift) % w->Hw, x = (X + shift) % w->Ww;  // torch.roll(-shift): rolled[Y] = map[Y + shift]
        int64_t slot = ((b * w->nW + Y / W * w->nWw + X / W) * W + Y % W) * W + X % W;
        bool real = y < Hp && x < Wp;
        w->part[slot] = real ? b * N + y * Wp + x : B * N;
        w->key_mask[slot] = real && !g->mask[b * N + y * Wp + x] ? 0.0f : -INFINITY;
        if (real) w->unpart[b * N + y * Wp + x] = slot;
      }
  if (shift > 0) shift_mask_make(w);
}

static void windows_free(Windows *w) {
  free(w->part);
  free(w->key_mask);
  free(w->shift_mask);
}

// x [B, N, d] -> its windows [B*nW, T, d] (window padding: zero rows, as torchvision's F.pad).
static Tensor *partition(Tensor *x, const Windows *w) {
  int64_t B = x->shape.d[0], N = x->shape.d[1], d = x->shape.d[2];
  Tensor *rows = op_reshape(x, SHAPE(B * N, d));
  if (w->padded) {
    Tensor *parts[2] = {rows, op_zeros(x->device, SHAPE(1, d))};
    rows = op_concat(parts, 2, 0);  // [B*N + 1, d]
  }
  return op_reshape(op_index_select(rows, w->part, B * w->nW * w->T), SHAPE(B * w->nW, w->T, d));
}

// The relative position bias [heads, T, T] gathered from the table (WindowAttention's
// relative_position_index: (dy + W-1) (2W-1) + dx + W-1 for pixel i minus pixel j).
static Tensor *relative_bias(const SwinAttn *s) {
  int64_t W = s->window, T = W * W;
  int64_t *idx = detr_malloc((size_t)(T * T) * sizeof(int64_t), "swin relative index");
  for (int64_t i = 0; i < T; i++)
    for (int64_t j = 0; j < T; j++) idx[i * T + j] = (i / W - j / W + W - 1) * (2 * W - 1) + (i % W - j % W + W - 1);
  Tensor *bias = op_index_select(s->table, idx, T * T);  // [T*T, heads]
  free(idx);
  return op_permute(op_reshape(bias, SHAPE(T, T, s->heads)), (const int[]){2, 0, 1});
}

static Tensor *forward(const void *extras, const NnCtx *ctx, const EncoderAttnInput *in, AttnTrace *trace, char *err,
                       size_t err_cap) {
  const SwinAttn *s = extras;
  const MultiheadAttention *a = in->proj;
  const FeatureGeometry *g = in->geom;
  int64_t B = g->B, N = g->Hp * g->Wp, d = a->dim, h = a->heads, hd = d / h;
  Windows w;
  windows_make(g, s->window, s->shift && in->layer % 2 == 1 ? s->window / 2 : 0, &w);
  int64_t nW = w.nW, T = w.T;
  Tensor *qk = partition(op_add(in->x, in->pos), &w), *vin = partition(in->x, &w);  // [B*nW, T, d]
  Tensor *q = op_mul_scalar(mha_project(a, qk, 0), 1.0f / sqrtf((float)hd));
  Tensor *k = mha_project(a, qk, 1), *v = mha_project(a, vin, 2);
  Tensor *logits = op_bmm(mha_split_heads(q, h), mha_split_heads(k, h), false, true);  // [B*nW*h, T, T]
  Tensor *bias = relative_bias(s);                                                     // [h, T, T]
  if (w.shift_mask) {                                                                  // [nW, h, T, T]
    bias = op_add(bias, op_constant(in->x->device, SHAPE(nW, 1, T, T), w.shift_mask));
    logits = op_add(op_reshape(logits, SHAPE(B, nW, h, T, T)), bias);
  } else {
    logits = op_add(op_reshape(logits, SHAPE(B * nW, h, T, T)), bias);
  }
  // Padded keys: -inf, per window (the mask row of window n serves its h*T logit rows).
  Tensor *key_mask = op_constant(in->x->device, SHAPE(B * nW, T), w.key_mask);
  Tensor *attn = op_reshape(op_softmax(op_reshape(logits, SHAPE(B * nW, h * T, T)), key_mask), SHAPE(B * nW * h, T, T));
  Tensor *out = mha_merge_heads(nn_dropout_bmm(ctx, attn, mha_split_heads(v, h), a->dropout), B * nW);  // [B*nW, T, d]
  out = op_index_select(op_reshape(out, SHAPE(B * nW * T, d)), w.unpart, B * N);                        // [B*N, d]
  windows_free(&w);
  return linear_forward(&a->out_proj, op_reshape(out, SHAPE(B, N, d)));
}

const EncoderAttnKind encoder_attn_swin = {
    .name = "swin",
    .summary = "Swin's (shifted) window attention with a relative position bias, W x W windows, O(N W^2 d)",
    .settings = SETTINGS,
    .n_settings = (int)(sizeof SETTINGS / sizeof SETTINGS[0]),
    .extras_size = sizeof(SwinAttn),
    .create = create,
    .init = init,
    .forward = forward,
};
