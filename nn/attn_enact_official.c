// ENACT as the authors' code computes it: GSavathrakis/ENACT, DETR-ENACT/models/ENACT_attn/enact.py,
// class ClustAttn, as DETR-ENACT's and Conditional-DETR-ENACT's encoder layers call it (the steps are
// in nn/enact.h; docs/enact.md, "The two forms", lists every difference from `encoder_attn=enact`,
// the supplement's form). The layer has its own projections W_q, W_k, W_v, W_o (no in_proj/out_proj:
// EncoderAttnKind.own_projections) so that the official checkpoints load, and no padding mask: padded
// pixels take part everywhere, as in the official encoders (EncoderAttnKind.attends_padding).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn/enact.h"

int enact_official_taps(int sigma, float *taps) {
  DETR_CHECK(sigma >= 1 && sigma <= 10, "enact_official: sigma %d is not an integer in [1, 10]", sigma);
  // torch: (1. / (sigma * sqrt(Tensor([2 pi])))) * exp(-arange(...)^2 / (2 * Tensor([sigma])^2)), float32.
  float s = (float)sigma, c = 1.0f / (s * sqrtf((float)(2.0 * 3.141592653589793))), two_s2 = 2.0f * (s * s);
  int r = 3 * sigma - 1;
  for (int x = -r; x <= r; x++) taps[x + r] = c * expf(-(float)(x * x) / two_s2);
  return 2 * r + 1;
}

Tensor *enact_official_entropy(const Linear *w_prob, Tensor *k, int sigma) {
  int64_t B = k->shape.d[0], N = k->shape.d[1];
  Tensor *logit = op_reshape(linear_forward(w_prob, k), SHAPE(B, N));
  Tensor *p = op_add_scalar(op_softmax(logit, NULL), 1e-8f);  // softmax over all N, padding included
  Tensor *H = op_mul_scalar(op_mul(p, op_log(p)), (float)(-1.0 / 0.6931471805599453));  // -p log(p) / log 2
  // The 1-D smoothing over the flattened map: op_enact_smooth's 1-D form with the whole [1, N] line valid.
  int64_t *line = detr_malloc((size_t)(2 * B) * sizeof(int64_t), "enact_official_entropy line");
  for (int64_t b = 0; b < B; b++) line[b] = 1, line[B + b] = N;
  float taps[64];
  int ntaps = enact_official_taps(sigma, taps);
  Tensor *hsm = op_enact_smooth(H, 1, N, line, line + B, taps, ntaps, true);
  free(line);
  return hsm;
}

int64_t enact_official_cluster_size(const float *hsm, int64_t B, int64_t N, double *mean_length) {
  double sum = 0.0;
  for (int64_t b = 0; b < B; b++) {
    const float *m = hsm + b * N;
    // conv1d(Hsm, [-1, 2, -1], padding 'same') > 0 (the STE's forward); runs of equal value.
    int64_t runs = 1;
    bool prev_sign = false;
    for (int64_t i = 0; i < N; i++) {
      float c = -(i > 0 ? m[i - 1] : 0.0f) + 2.0f * m[i] - (i + 1 < N ? m[i + 1] : 0.0f);
      bool sign = c > 0.0f;
      if (i > 0 && sign != prev_sign) runs++;
      prev_sign = sign;
    }
    sum += (double)((float)N / (float)runs);  // region_lengths.float().mean(): float32, then .item()
  }
  double mean = sum / (double)B;  // np.mean of the images' means
  if (mean_length) *mean_length = mean;
  int64_t c = (int64_t)nearbyint(mean);  // Python's round: half to even (the default rounding mode)
  return c < 1 ? 1 : c;
}

Tensor *enact_official_cluster(Tensor *k, Tensor *v, Tensor *hsm, int64_t c, Tensor **vc) {
  int64_t B = k->shape.d[0], N = k->shape.d[1], d = k->shape.d[2];
  DETR_CHECK(c >= 1 && c <= N, "enact_official_cluster: cluster size %lld outside [1, %lld]", (long long)c,
             (long long)N);
  // k[:, (N % c) // 2 : N - (N % c - (N % c) // 2)] viewed as [B, L, c, d].
  int64_t L = N / c, first = (N % c) / 2;
  int64_t *starts = detr_malloc((size_t)(2 * B * L) * sizeof(int64_t), "enact_official_cluster regions");
  int64_t *lengths = starts + B * L;
  for (int64_t b = 0; b < B; b++)
    for (int64_t j = 0; j < L; j++) starts[b * L + j] = b * N + first + j * c, lengths[b * L + j] = c;
  Tensor *vflat = NULL;
  Tensor *kflat = op_enact_cluster(op_reshape(k, SHAPE(B * N, d)), op_reshape(v, SHAPE(B * N, d)),
                                   op_reshape(hsm, SHAPE(B * N)), NULL, starts, lengths, B * L, &vflat);
  free(starts);
  *vc = op_reshape(vflat, SHAPE(B, L, d));
  return op_reshape(kflat, SHAPE(B, L, d));
}

Tensor *enact_official_attend(const EnactOfficial *e, Tensor *q, Tensor *kc, Tensor *vc) {
  int64_t B = q->shape.d[0], hd = q->shape.d[2] / e->heads;
  Tensor *qh = mha_split_heads(linear_forward(&e->w_q, q), e->heads);   // [B*h, N, hd]
  Tensor *kh = mha_split_heads(linear_forward(&e->w_k, kc), e->heads);  // [B*h, L, hd]
  Tensor *vh = mha_split_heads(linear_forward(&e->w_v, vc), e->heads);  // [B*h, L, hd]
  Tensor *attn = op_softmax(op_bmm(qh, kh, false, true), NULL);         // [B*h, N, L], unscaled logits
  attn = op_mul_scalar(attn, 1.0f / (float)hd);  // softmax(...) / head_dim (exact for a power-of-2 head_dim)
  return linear_forward(&e->w_o, mha_merge_heads(op_bmm(attn, vh, false, false), B));  // [B, N, d]
}

Tensor *enact_official_attention(const EnactOfficial *e, Tensor *q_in, Tensor *k_in, Tensor *v_in, int64_t fixed_c,
                                 EnactOfficialTrace *trace) {
  int64_t B = k_in->shape.d[0], N = k_in->shape.d[1];
  Tensor *hsm = enact_official_entropy(&e->w_prob, k_in, e->sigma);  // [B, N]
  double mean = 0.0;
  int64_t c = fixed_c;
  if (c <= 0) {
    // The cluster size is read on the host from the smoothed map [B, N] (a few KB): it sets the
    // shapes after it. On a GPU this copy is a synchronisation point, one per layer, as ENACT's.
    float *host = detr_malloc((size_t)(B * N) * sizeof(float), "enact_official_attention host");
    tensor_to_host(hsm, host);
    c = enact_official_cluster_size(host, B, N, &mean);
    free(host);
  }
  Tensor *vc = NULL, *kc = enact_official_cluster(k_in, v_in, hsm, c, &vc);
  if (trace) *trace = (EnactOfficialTrace){.entropy = hsm, .cluster_size = c, .mean_length = mean};
  return enact_official_attend(e, q_in, kc, vc);
}

// --- the encoder-attention variant (nn/encoder_attn.h) ---

static const AttnSettingSpec SETTINGS[] = {
    {"enact_official_sigma", ATTN_SETTING_INT, 3.0, 1.0, 10.0, "the official smoothing's Gaussian sigma, an integer"},
};

static void create(void *extras, ParamStore *ps, const char *prefix, int64_t dim, int64_t heads,
                   const AttnSettings *settings) {
  EnactOfficial *e = extras;
  static const char *const names[5] = {"W_q", "W_k", "W_v", "W_o", "W_prob"};
  Linear *layers[5] = {&e->w_q, &e->w_k, &e->w_v, &e->w_o, &e->w_prob};
  for (int i = 0; i < 5; i++) {
    char name[112];
    param_name_join(name, sizeof name, prefix, names[i]);
    *layers[i] = linear_create(ps, name, dim, i == 4 ? 1 : dim, true, PARAM_TRAINABLE, LR_GROUP_MAIN);
  }
  e->heads = heads;
  e->sigma = (int)attn_setting(settings, "enact_official_sigma");
}

// nn.Linear's default, then the transformer's xavier_uniform_ reset of every matrix (ClustAttn's own
// _reset_parameters does the same before it).
static void init(void *extras, Rng *rng) {
  EnactOfficial *e = extras;
  Linear *layers[5] = {&e->w_q, &e->w_k, &e->w_v, &e->w_o, &e->w_prob};
  for (int i = 0; i < 5; i++) {
    init_torch_default(layers[i]->weight, layers[i]->bias, rng);
    init_xavier_uniform(layers[i]->weight, rng);
  }
}

typedef struct {
  int64_t cluster_size;  // the export's host value [1]
  int32_t *clusters;     // [B * N] or NULL
} OfficialOwned;

static void release_owned(void *owned) {
  OfficialOwned *o = owned;
  free(o->clusters);
  free(o);
}

// Each pixel's chunk within its image; the trimmed pixels at either end are in none (-1). [B * N]
static int32_t *chunk_map(int64_t B, int64_t N, int64_t c) {
  int32_t *map = detr_malloc((size_t)(B * N) * sizeof(int32_t), "an ENACT (official) cluster map");
  int64_t first = (N % c) / 2, end = first + (N / c) * c;
  for (int64_t i = 0; i < B * N; i++) {
    int64_t p = i % N;
    map[i] = p >= first && p < end ? (int32_t)((p - first) / c) : -1;
  }
  return map;
}

static Tensor *forward(const void *extras, const NnCtx *ctx, const EncoderAttnInput *in, AttnTrace *trace, char *err,
                       size_t err_cap) {
  (void)err, (void)err_cap;
  Tensor *k_in = op_add(in->x, in->pos);  // q = k = x + pos, v = x
  EnactOfficialTrace t;
  Tensor *y = enact_official_attention(extras, k_in, k_in, in->x, 0, &t);
  if (!trace) return y;
  int64_t B = in->x->shape.d[0], N = in->x->shape.d[1];
  OfficialOwned *o = detr_calloc(1, sizeof *o, "an ENACT (official) trace");
  o->cluster_size = t.cluster_size;
  if (ctx->want_clusters) o->clusters = chunk_map(B, N, t.cluster_size);
  *trace = (AttnTrace){
      .n_stats = 2,
      .stats = {{"clusters_per_image", "clusters/img", (double)(N / t.cluster_size)},
                {"compression", "N/L", (double)N / (double)(N / t.cluster_size)}},
      .n_exports = 2,
      .exports = {{"entropy", t.entropy, NULL, 0}, {"cluster_size", NULL, &o->cluster_size, 1}},
      .clusters = o->clusters,
      .owned = o,
      .release = release_owned,
  };
  return y;
}

const EncoderAttnKind encoder_attn_enact_official = {
    .name = "enact_official",
    .summary =
        "ENACT as its authors' ClustAttn: fixed chunks of the batch's mean run length, own W_q/W_k/W_v/W_o, "
        "no padding mask, O(N L d)",
    .settings = SETTINGS,
    .n_settings = (int)(sizeof SETTINGS / sizeof SETTINGS[0]),
    .extras_size = sizeof(EnactOfficial),
    .clusters = true,
    .own_projections = true,
    .attends_padding = true,
    .create = create,
    .init = init,
    .forward = forward,
};
