// Focused Linear Attention (FLatten; Han et al., ICCV 2023; github LeapLabTHU/FLatten-Transformer,
// models/flatten_pvt.py, FocusedLinearAttention):
//   q' = (ReLU(q) + 1e-6) / softplus(scale),  f_p(x) = ||x|| / ||x^p|| * x^p   (norms over the d channels)
//   per head: out = f_p(q') (f_p(k')^T v / n) / (f_p(q') . mean_t f_p(k'_t) + 1e-6)  +  DWC(v)
// with `scale` a learnable [1, 1, d] (zeros: softplus gives ln 2), p the focusing factor (3), and DWC
// a depthwise k x k convolution (k = 5, padding k/2, bias) of each head's values over the feature
// map, its hd channels shared by the heads. Padding: padded keys are zeroed after f_p (they drop
// out of both sums, and n, the mean's count, is the image's number of valid pixels) and padded
// values are zeroed before the DWC. FLatten's learnable
// positional_encoding is not used: DETR's sine encoding is already in q and k. O(N d^2 / h).
#include <stdio.h>
#include <stdlib.h>

#include "nn/encoder_attn.h"

typedef struct {
  Tensor *scale;                  // [1, 1, d]
  Tensor *dwc_weight, *dwc_bias;  // [hd, 1, k, k], [hd]
  int kernel;
  float focusing;
} FocusedAttn;

static const AttnSettingSpec SETTINGS[] = {
    {"focused_factor", ATTN_SETTING_FLOAT, 3.0, 1.0, 10.0, "FLatten's focusing factor p"},
    {"focused_kernel", ATTN_SETTING_INT, 5.0, 1.0, 15.0, "the odd kernel size of the depthwise convolution"},
};

static void create(void *extras, ParamStore *ps, const char *prefix, int64_t dim, int64_t heads,
                   const AttnSettings *settings) {
  FocusedAttn *f = extras;
  f->focusing = (float)attn_setting(settings, "focused_factor");
  f->kernel = (int)attn_setting(settings, "focused_kernel");
  DETR_CHECK(f->kernel % 2 == 1, "config focused_kernel: %d is not odd", f->kernel);
  int64_t hd = dim / heads, k = f->kernel;
  f->scale = params_add(ps, SHAPE(1, 1, dim), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.scale", prefix);
  f->dwc_weight = params_add(ps, SHAPE(hd, 1, k, k), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.dwc.weight", prefix);
  f->dwc_bias = params_add(ps, SHAPE(hd), PARAM_TRAINABLE, LR_GROUP_MAIN, "%s.dwc.bias", prefix);
}

static void init(void *extras, Rng *rng) {
  FocusedAttn *f = extras;
  tensor_fill_(f->scale, 0.0f);                         // as the official module
  init_torch_default(f->dwc_weight, f->dwc_bias, rng);  // nn.Conv2d's default
}

// f_p of x [B, N, d] (x > 0): ||x|| / ||x^p|| * x^p over the last axis.
static Tensor *focus(Tensor *x, float p) {
  Tensor *norm = op_sqrt(op_sum(op_mul(x, x), -1, true));
  Tensor *xp = op_pow_scalar(x, p);
  Tensor *norm_p = op_sqrt(op_sum(op_mul(xp, xp), -1, true));
  return op_mul(op_div(xp, norm_p), norm);
}

static Tensor *forward(const void *extras, const NnCtx *ctx, const EncoderAttnInput *in, AttnTrace *trace, char *err,
                       size_t err_cap) {
  const FocusedAttn *f = extras;
  const MultiheadAttention *a = in->proj;
  const FeatureGeometry *g = in->geom;
  int64_t B = in->x->shape.d[0], N = in->x->shape.d[1], h = a->heads, hd = a->dim / h;
  Tensor *qk = op_add(in->x, in->pos);
  Tensor *q = mha_project(a, qk, 0), *k = mha_project(a, qk, 1), *v = mha_project(a, in->x, 2);  // [B, N, d]
  Tensor *scale = op_softplus(f->scale);                                                         // [1, 1, d]
  q = focus(op_div(op_add_scalar(op_relu(q), 1e-6f), scale), f->focusing);
  k = op_mul(focus(op_div(op_add_scalar(op_relu(k), 1e-6f), scale), f->focusing), g->valid);  // padded keys: 0
  Tensor *qh = mha_split_heads(q, h), *kh = mha_split_heads(k, h), *vh = mha_split_heads(v, h);
  // 1 / n per image and head: the official code's means over the keys (k^T v / n, mean_t k).
  float *host = detr_malloc((size_t)(B * h) * sizeof(float), "focused attention means");
  for (int64_t b = 0; b < B; b++) {
    int64_t valid = 0;
    for (int64_t p = 0; p < N; p++) valid += !g->mask[b * N + p];
    for (int64_t j = 0; j < h; j++) host[b * h + j] = 1.0f / (float)(valid ? valid : 1);
  }
  Tensor *inv_n = op_constant(in->x->device, SHAPE(B * h, 1, 1), host);
  free(host);
  Tensor *kv = op_mul(op_bmm(kh, vh, true, false), inv_n);                // [B*h, hd, hd]
  Tensor *k_mean = op_mul(op_sum(kh, 1, true), inv_n);                    // [B*h, 1, hd]
  Tensor *denom = op_add_scalar(op_bmm(qh, k_mean, false, true), 1e-6f);  // [B*h, N, 1]
  Tensor *out = op_div(op_bmm(qh, kv, false, false), denom);              // [B*h, N, hd]
  // DWC over each head's value map (padded pixels zeroed): [B*h, hd, Hp, Wp].
  Tensor *vmap =
      op_reshape(op_transpose(mha_split_heads(op_mul(v, g->valid), h), 1, 2), SHAPE(B * h, hd, g->Hp, g->Wp));
  Tensor *dwc = op_depthwise_conv2d(vmap, f->dwc_weight, f->dwc_bias);
  out = op_add(out, op_transpose(op_reshape(dwc, SHAPE(B * h, hd, N)), 1, 2));
  return linear_forward(&a->out_proj, mha_merge_heads(out, B));
}

const EncoderAttnKind encoder_attn_focused = {
    .name = "focused",
    .summary =
        "FLatten's focused linear attention f_p(q) (f_p(k)^T v) / normaliser + depthwise conv of v, O(N d^2 / h)",
    .settings = SETTINGS,
    .n_settings = (int)(sizeof SETTINGS / sizeof SETTINGS[0]),
    .extras_size = sizeof(FocusedAttn),
    .create = create,
    .init = init,
    .forward = forward,
};
