// ENACT as the authors' code computes it: GSavathrakis/ENACT, DETR-ENACT/models/ENACT_attn/enact.py,
// class ClustAttn, as DETR-ENACT's and Conditional-DETR-ENACT's encoder layers call it (the steps are
// in nn/enact.h; docs/enact.md, "The two forms", lists every difference from `encoder_attn=enact`,
// the supplement's form). The layer has its own projections W_q, W_k, W_v, W_o (no in_proj/out_proj:
// EncoderAttnKind.own_projections) so that the official checkpoints load, and no padding mask: padded
// pixels take part everywhere, as in the official encoders (EncoderAttnKind.attends_padding).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/enact_math.h"  // the run count, the cluster size and the chunks, as the kernels

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
  int64_t *runs = detr_malloc((size_t)B * sizeof(int64_t), "enact_official_cluster_size runs");
  for (int64_t b = 0; b < B; b++) runs[b] = enact_official_runs(hsm + b * N, N);
  int64_t c = enact_official_size(runs, B, N, mean_length);
  free(runs);
  return c;
}

EnactRegionIndex enact_official_fixed_regions(Device dev, int64_t B, int64_t N, int64_t c) {
  DETR_CHECK(c >= 1 && c <= N, "enact_official: cluster size %lld outside [1, %lld]", (long long)c, (long long)N);
  int64_t L = N / c;
  int64_t *starts = detr_malloc((size_t)(2 * B * L + B + 1) * sizeof(int64_t), "enact_official regions");
  int64_t *lengths = starts + B * L, *offset = lengths + B * L;
  for (int64_t b = 0; b < B; b++)
    for (int64_t j = 0; j < L; j++) starts[b * L + j] = enact_official_chunk_start(b, j, N, c), lengths[b * L + j] = c;
  for (int64_t b = 0; b <= B; b++) offset[b] = b * L;
  EnactRegionIndex r = enact_region_index_upload(dev, starts, lengths, B * L, offset, B);
  free(starts);
  return r;
}

EnactRegionIndex enact_official_chunks(Tensor *hsm, int64_t fixed_c) {
  return fixed_c > 0 ? enact_official_fixed_regions(hsm->device, hsm->shape.d[0], hsm->shape.d[1], fixed_c)
                     : op_enact_official_regions(hsm);
}

Tensor *enact_official_attend(const EnactOfficial *e, Tensor *q, Tensor *kc, Tensor *vc,
                              const EnactRegionIndex *index) {
  int64_t hd = q->shape.d[2] / e->heads;
  Tensor *qp = linear_forward(&e->w_q, q);   // [B, N, d]
  Tensor *kp = linear_forward(&e->w_k, kc);  // [cap, d]
  Tensor *vp = linear_forward(&e->w_v, vc);  // [cap, d]
  // softmax(q k^T) / head_dim, unscaled logits (exact for a power-of-2 head_dim).
  return linear_forward(&e->w_o, op_cluster_attention(qp, kp, vp, index, e->heads, 1.0f, 1.0f / (float)hd, 0.0f, NULL));
}

int64_t enact_official_trace_cluster_size(const EnactOfficialTrace *t, double *mean_length) {
  int64_t host[2];  // the cluster size, then the mean length's bits
  enact_region_index_read(&t->index, enact_region_cluster_size(&t->index), 2, host);
  if (mean_length) memcpy(mean_length, &host[1], sizeof(double));
  return host[0];
}

Tensor *enact_official_attention(const EnactOfficial *e, Tensor *q_in, Tensor *k_in, Tensor *v_in, int64_t fixed_c,
                                 EnactOfficialTrace *trace) {
  int64_t B = k_in->shape.d[0], N = k_in->shape.d[1], d = k_in->shape.d[2];
  Tensor *hsm = enact_official_entropy(&e->w_prob, k_in, e->sigma);  // [B, N]
  // The cluster size and the chunks, found where hsm lives: the count stays on the device.
  EnactRegionIndex index = enact_official_chunks(hsm, fixed_c);
  Tensor *vc = NULL;
  Tensor *kc = op_enact_cluster(op_reshape(k_in, SHAPE(B * N, d)), op_reshape(v_in, SHAPE(B * N, d)),
                                op_reshape(hsm, SHAPE(B * N)), NULL, &index, &vc);  // [cap, d]
  if (trace) *trace = (EnactOfficialTrace){.entropy = hsm, .index = index};
  return enact_official_attend(e, q_in, kc, vc, &index);
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
  EnactOfficialTrace t;
  int64_t cluster_size;  // the export's host value [1], once resolved
  int32_t *clusters;     // [B * N] or NULL
  bool want_clusters;
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

// After the whole forward is queued: the cluster size to the host, then the stats and the map.
static void resolve_trace(AttnTrace *trace) {
  OfficialOwned *o = trace->owned;
  int64_t B = o->t.entropy->shape.d[0], N = o->t.entropy->shape.d[1];
  int64_t c = o->cluster_size = enact_official_trace_cluster_size(&o->t, NULL);
  trace->stats[0].value = (double)(N / c);
  trace->stats[1].value = (double)N / (double)(N / c);
  if (o->want_clusters) trace->clusters = o->clusters = chunk_map(B, N, c);
}

static Tensor *forward(const void *extras, const NnCtx *ctx, const EncoderAttnInput *in, AttnTrace *trace, char *err,
                       size_t err_cap) {
  (void)err, (void)err_cap;
  Tensor *k_in = op_add(in->x, in->pos);  // q = k = x + pos, v = x
  if (!trace) return enact_official_attention(extras, k_in, k_in, in->x, 0, NULL);
  OfficialOwned *o = detr_calloc(1, sizeof *o, "an ENACT (official) trace");
  o->want_clusters = ctx->want_clusters;
  Tensor *y = enact_official_attention(extras, k_in, k_in, in->x, 0, &o->t);
  *trace = (AttnTrace){
      .n_stats = 2,
      .stats = {{"clusters_per_image", "clusters/img", 0.0}, {"compression", "N/L", 0.0}},
      .n_exports = 2,
      .exports = {{"entropy", o->t.entropy, NULL, 0}, {"cluster_size", NULL, &o->cluster_size, 1}},
      .owned = o,
      .release = release_owned,
      .resolve = resolve_trace,
      .pending = {o->t.index.storage, NULL},
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
