#include "nn/enact.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"  // the host forms of the signs and regions (cpu_enact_*)

int enact_check_geometry(const EnactGeometry *g, char *err, size_t err_cap) {
  for (int64_t b = 0; b < g->B; b++) {
    if (g->valid_h[b] == 0 || g->valid_w[b] == 0) {
      snprintf(err, err_cap, "ENACT: image %lld has no valid pixel at feature resolution", (long long)b);
      return -1;
    }
  }
  if (!g->rectangular) {
    snprintf(err, err_cap, "ENACT: an image's valid pixels are not a top-left rectangle");
    return -1;
  }
  return 0;
}

int enact_geometry(const uint8_t *mask, int64_t B, int64_t Hp, int64_t Wp, EnactGeometry *g, char *err,
                   size_t err_cap) {
  feature_geometry_make(mask, B, Hp, Wp, DEVICE_CPU, g);
  if (enact_check_geometry(g, err, err_cap)) {
    enact_geometry_free(g);
    return -1;
  }
  return 0;
}

void enact_geometry_free(EnactGeometry *g) { feature_geometry_free(g); }

int enact_gaussian_taps(float sigma, float *taps) {
  DETR_CHECK(sigma > 0.0f && sigma <= 10.0f, "ENACT: sigma %g is not in (0, 10]", sigma);
  int r = (int)floorf(3.0f * sigma - 1.0f);
  if (r < 0) r = 0;
  for (int x = -r; x <= r; x++)
    taps[x + r] = expf(-(float)(x * x) / (2.0f * sigma * sigma)) / (sigma * sqrtf(6.283185307179586f));  // sqrt(2 pi)
  return 2 * r + 1;
}

void enact_curvature_sign(const float *hsm, const EnactGeometry *g, bool one_d, float *signs) {
  cpu_enact_signs(hsm, signs, g->B, g->Hp, g->Wp, g->valid_h, g->valid_w, one_d);
}

// Room for the most regions of B images of N pixels (one a pixel), then B + 1 offsets.
static void regions_alloc(EnactRegions *r, int64_t B, int64_t M) {
  *r = (EnactRegions){.B = B};
  r->starts = detr_malloc((size_t)(2 * M + B + 1) * sizeof(int64_t), "ENACT regions");
  r->lengths = r->starts + M;
  r->image_offset = r->lengths + M;
}

void enact_find_regions(const float *signs, const EnactGeometry *g, EnactRegions *r) {
  int64_t N = g->Hp * g->Wp, M = g->B * N;
  regions_alloc(r, g->B, M);
  void *ws = detr_malloc(cpu_enact_regions_workspace(M), "enact_find_regions scan");
  cpu_enact_regions(signs, g->B, N, r->starts, r->lengths, r->image_offset, ws);
  free(ws);
  r->count = r->image_offset[g->B];
}

void enact_regions_from_index(const EnactRegionIndex *index, EnactRegions *r) {
  int64_t L;  // the count first: it sizes the rest
  enact_region_index_read(index, enact_region_image_offset(index) + index->B, 1, &L);
  regions_alloc(r, index->B, L);
  r->count = L;
  enact_region_index_read(index, enact_region_image_offset(index), index->B + 1, r->image_offset);
  enact_region_index_read(index, enact_region_starts(index), L, r->starts);
  enact_region_index_read(index, enact_region_lengths(index), L, r->lengths);
}

EnactRegionIndex enact_regions_upload(Device dev, const EnactRegions *r) {
  return enact_region_index_upload(dev, r->starts, r->lengths, r->count, r->image_offset, r->B);
}

double enact_pixels_per_cluster(const EnactRegions *r) {
  int64_t valid = 0;
  for (int64_t j = 0; j < r->count; j++) valid += r->lengths[j];
  return r->count ? (double)valid / (double)r->count : 0.0;
}

void enact_regions_free(EnactRegions *r) {
  free(r->starts);
  *r = (EnactRegions){0};
}

void enact_trace_to_host(EnactTrace *t) {
  if (!t->signs && t->signs_t) {
    t->signs = detr_malloc((size_t)t->signs_t->numel * sizeof(float), "ENACT signs");
    tensor_to_host(t->signs_t, t->signs);
  }
  if (!t->regions.starts && t->index.storage) enact_regions_from_index(&t->index, &t->regions);
}

void enact_trace_free(EnactTrace *t) {
  free(t->signs);
  free(t->clusters);
  enact_regions_free(&t->regions);
  *t = (EnactTrace){0};
}

Tensor *enact_cluster_attention(const MultiheadAttention *a, const NnCtx *ctx, Tensor *query, Tensor *Kc, Tensor *Vc,
                                const EnactRegionIndex *index) {
  int64_t d = Kc->shape.d[1], cap = Kc->shape.d[0];
  Tensor *q = mha_project(a, query, 0);                                                        // [B, N, d]
  Tensor *k = op_reshape(mha_project(a, op_reshape(Kc, SHAPE(1, cap, d)), 1), SHAPE(cap, d));  // [cap, d]
  Tensor *v = op_reshape(mha_project(a, op_reshape(Vc, SHAPE(1, cap, d)), 2), SHAPE(cap, d));  // [cap, d]
  float scale = 1.0f / sqrtf((float)(d / a->heads));
  float p = ctx->training ? a->dropout : 0.0f;  // on the attention weights, as mha_forward
  return linear_forward(&a->out_proj, op_cluster_attention(q, k, v, index, a->heads, scale, 1.0f, p, ctx->dropout_rng));
}

Tensor *enact_attention(const EnactAttn *e, const MultiheadAttention *proj, const NnCtx *ctx, Tensor *x, Tensor *pos,
                        const EnactGeometry *g, const EnactTrace *fixed, EnactTrace *trace) {
  int64_t B = x->shape.d[0], N = x->shape.d[1], d = x->shape.d[2];
  DETR_CHECK(N == g->Hp * g->Wp && B == g->B, "enact_attention: input [%lld, %lld, .] does not fit the geometry",
             (long long)B, (long long)N);
  Tensor *k_in = op_add(x, pos);  // q = k = x + pos, v = x

  // 1. Self-information of each pixel: H = -p log2(p + 1e-8), p = softmax over valid pixels.
  Tensor *logit = op_reshape(linear_forward(&e->w_prob, k_in), SHAPE(B, N));
  Tensor *p = op_softmax(logit, g->key_mask);
  Tensor *H = op_mul_scalar(op_mul(p, op_log(op_add_scalar(p, 1e-8f))),
                            (float)(-1.0 / 0.6931471805599453) /* log2 = ln / ln 2 */);
  // 2. Smoothing (differentiable), the curvature sign (no gradient) and 3. the regions of equal
  // sign, on x's device: their count stays there (the kernels after read it).
  float taps[64];
  int ntaps = enact_gaussian_taps(e->opt.sigma, taps);
  Tensor *hsm = op_enact_smooth(H, g->Hp, g->Wp, g->valid_h, g->valid_w, taps, ntaps, e->opt.one_d);
  EnactTrace local = {.entropy = hsm};
  if (fixed) {
    local.signs_t = op_constant(x->device, SHAPE(B, N), fixed->signs);
    local.index = enact_regions_upload(x->device, &fixed->regions);
  } else {
    local.signs_t = op_enact_signs(hsm, g->Hp, g->Wp, g->valid_h, g->valid_w, e->opt.one_d);
    local.index = op_enact_regions(local.signs_t);
  }
  // 4. Cluster the keys' and values' inputs; 5. attend over each image's clusters.
  Tensor *vc = NULL;
  Tensor *kc =
      op_enact_cluster(op_reshape(k_in, SHAPE(B * N, d)), op_reshape(x, SHAPE(B * N, d)), op_reshape(hsm, SHAPE(B * N)),
                       e->opt.sign_factor ? local.signs_t : NULL, &local.index, &vc);
  Tensor *attn = enact_cluster_attention(proj, ctx, k_in, kc, vc, &local.index);
  if (trace) *trace = local;
  return attn;
}

// --- the encoder-attention variant (nn/encoder_attn.h) ---

static const AttnSettingSpec SETTINGS[] = {
    {"enact_sigma", ATTN_SETTING_FLOAT, 3.0, 1e-3, 10.0, "the Gaussian's sigma, in (0, 10]"},
    {"enact_1d", ATTN_SETTING_BOOL, 0.0, 0.0, 1.0, "the reference code's 1-D smoothing and curvature"},
    {"enact_sign_factor", ATTN_SETTING_BOOL, 0.0, 0.0, 1.0, "Algorithm 1's -Hs factor in the clustering sums"},
};

static void create(void *extras, ParamStore *ps, const char *prefix, int64_t dim, int64_t heads,
                   const AttnSettings *settings) {
  EnactAttn *e = extras;
  char name[112];
  param_name_join(name, sizeof name, prefix, "W_prob");
  e->w_prob = linear_create(ps, name, dim, 1, true, PARAM_TRAINABLE, LR_GROUP_MAIN);
  e->opt = (EnactOptions){.sigma = (float)attn_setting(settings, "enact_sigma"),
                          .one_d = attn_setting(settings, "enact_1d") != 0,
                          .sign_factor = attn_setting(settings, "enact_sign_factor") != 0};
}

static void init(void *extras, Rng *rng) {
  EnactAttn *e = extras;
  init_torch_default(e->w_prob.weight, e->w_prob.bias, rng);
}

// The trace's owned data: the layer's EnactTrace and whether a cluster map was asked for.
typedef struct {
  EnactTrace t;
  bool want_clusters;
} EnactOwned;

static void release_trace(void *owned) {
  enact_trace_free(&((EnactOwned *)owned)->t);
  free(owned);
}

// The regions as a map: each pixel's region numbered within its image, -1 on padding. [B * N]
static int32_t *cluster_map(const EnactRegions *r, int64_t n_pixels) {
  int32_t *map = detr_malloc((size_t)n_pixels * sizeof(int32_t), "an ENACT cluster map");
  for (int64_t i = 0; i < n_pixels; i++) map[i] = -1;
  for (int64_t b = 0; b < r->B; b++)
    for (int64_t j = r->image_offset[b]; j < r->image_offset[b + 1]; j++)
      for (int64_t k = 0; k < r->lengths[j]; k++) map[r->starts[j] + k] = (int32_t)(j - r->image_offset[b]);
  return map;
}

// After the whole forward is queued: the regions to the host, then the stats, the exports and the
// cluster map.
static void resolve_trace(AttnTrace *trace) {
  EnactOwned *o = trace->owned;
  EnactTrace *t = &o->t;
  enact_trace_to_host(t);
  const EnactRegions *r = &t->regions;
  trace->stats[0].value = (double)r->count / (double)r->B;
  trace->stats[1].value = enact_pixels_per_cluster(r);
  trace->exports[1] = (AttnExport){"region_starts", NULL, r->starts, r->count};
  trace->exports[2] = (AttnExport){"region_lengths", NULL, r->lengths, r->count};
  if (o->want_clusters) trace->clusters = t->clusters = cluster_map(r, t->signs_t->numel);  // [B * N]
}

static Tensor *forward(const void *extras, const NnCtx *ctx, const EncoderAttnInput *in, AttnTrace *trace, char *err,
                       size_t err_cap) {
  if (enact_check_geometry(in->geom, err, err_cap)) return NULL;
  if (!trace) return enact_attention(extras, in->proj, ctx, in->x, in->pos, in->geom, NULL, NULL);
  EnactOwned *o = detr_calloc(1, sizeof *o, "an ENACT trace");
  o->want_clusters = ctx->want_clusters;
  Tensor *y = enact_attention(extras, in->proj, ctx, in->x, in->pos, in->geom, NULL, &o->t);
  *trace = (AttnTrace){
      .n_stats = 2,
      .stats = {{"clusters_per_image", "clusters/img", 0.0}, {"compression", "N/L", 0.0}},
      .n_exports = 3,
      .exports = {{"entropy", o->t.entropy, NULL, 0},
                  {"region_starts", NULL, NULL, 0},
                  {"region_lengths", NULL, NULL, 0}},
      .owned = o,
      .release = release_trace,
      .resolve = resolve_trace,
      .pending = {o->t.signs_t, o->t.index.storage},
  };
  return y;
}

const EncoderAttnKind encoder_attn_enact = {
    .name = "enact",
    .summary = "entropy-curvature regions cluster K and V; dense attention over each image's clusters, O(N L d)",
    .settings = SETTINGS,
    .n_settings = (int)(sizeof SETTINGS / sizeof SETTINGS[0]),
    .extras_size = sizeof(EnactAttn),
    .clusters = true,
    .create = create,
    .init = init,
    .forward = forward,
};
