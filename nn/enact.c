#include "nn/enact.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  int64_t N = g->Hp * g->Wp;
  for (int64_t b = 0; b < g->B; b++) {
    const float *m = hsm + b * N;
    float *s = signs + b * N;
    int64_t h = g->valid_h[b], w = g->valid_w[b];
    memset(s, 0, (size_t)N * sizeof(float));
    for (int64_t y = 0; y < h; y++)
      for (int64_t x = 0; x < w; x++) {
        float c;
        if (one_d) {  // [-1, 2, -1] along the valid row-major sequence
          int64_t i = y * w + x, n = h * w;
          float prev = i > 0 ? m[((i - 1) / w) * g->Wp + (i - 1) % w] : 0.0f;
          float next = i + 1 < n ? m[((i + 1) / w) * g->Wp + (i + 1) % w] : 0.0f;
          c = -prev + 2.0f * m[y * g->Wp + x] - next;
        } else {  // -(Sxx + Syy) = -[[2, 0, 2], [0, -8, 0], [2, 0, 2]], zero outside the valid region
          static const float sxx[3][3] = {{1, -2, 1}, {2, -4, 2}, {1, -2, 1}};
          float acc = 0.0f;
          for (int dy = -1; dy <= 1; dy++)
            for (int dx = -1; dx <= 1; dx++) {
              int64_t yy = y + dy, xx = x + dx;
              if (yy < 0 || yy >= h || xx < 0 || xx >= w) continue;
              acc += (sxx[dy + 1][dx + 1] + sxx[dx + 1][dy + 1]) * m[yy * g->Wp + xx];
            }
          c = -acc;
        }
        s[y * g->Wp + x] = c > 0.0f ? 1.0f : -1.0f;
      }
  }
}

void enact_find_regions(const float *signs, const EnactGeometry *g, EnactRegions *r) {
  int64_t N = g->Hp * g->Wp, M = g->B * N;
  *r = (EnactRegions){.B = g->B};
  // At most one region per valid pixel: size the arrays for that.
  r->starts = detr_malloc((size_t)(2 * M + g->B + 1) * sizeof(int64_t), "enact_find_regions starts");
  r->lengths = r->starts + M;
  r->image_offset = r->lengths + M;
  for (int64_t b = 0; b < g->B; b++) {
    r->image_offset[b] = r->count;
    bool open = false;
    for (int64_t p = 0; p < N; p++) {
      int64_t i = b * N + p;
      if (signs[i] == 0.0f) {  // padding closes a run
        open = false;
        continue;
      }
      if (open && signs[i] == signs[i - 1]) {
        r->lengths[r->count - 1]++;
      } else {
        r->starts[r->count] = i;
        r->lengths[r->count] = 1;
        r->count++;
        open = true;
      }
    }
  }
  r->image_offset[g->B] = r->count;
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

void enact_trace_free(EnactTrace *t) {
  free(t->signs);
  free(t->clusters);
  enact_regions_free(&t->regions);
  t->signs = NULL;
  t->clusters = NULL;
  t->entropy = NULL;
}

Tensor *enact_cluster_attention(const MultiheadAttention *a, const NnCtx *ctx, Tensor *query, Tensor *Kc, Tensor *Vc,
                                const EnactRegions *r) {
  int64_t B = r->B, L = r->count, d = Kc->shape.d[1], lmax = 0;
  for (int64_t b = 0; b < B; b++) {
    int64_t n = r->image_offset[b + 1] - r->image_offset[b];
    lmax = n > lmax ? n : lmax;
  }
  // Each image's clusters padded to lmax with a zero row (index L) that the key mask hides.
  int64_t *idx = detr_malloc((size_t)(B * lmax) * sizeof(int64_t), "enact_cluster_attention idx");
  float *mask = detr_malloc((size_t)(B * lmax) * sizeof(float), "enact_cluster_attention mask");
  for (int64_t b = 0; b < B; b++)
    for (int64_t k = 0; k < lmax; k++) {
      int64_t j = r->image_offset[b] + k;
      bool real = j < r->image_offset[b + 1];
      idx[b * lmax + k] = real ? j : L;
      mask[b * lmax + k] = real ? 0.0f : -INFINITY;
    }
  Tensor *zero = op_zeros(Kc->device, SHAPE(1, d));
  Tensor *kparts[2] = {Kc, zero}, *vparts[2] = {Vc, zero};
  Tensor *kpad = op_reshape(op_index_select(op_concat(kparts, 2, 0), idx, B * lmax), SHAPE(B, lmax, d));
  Tensor *vpad = op_reshape(op_index_select(op_concat(vparts, 2, 0), idx, B * lmax), SHAPE(B, lmax, d));
  Tensor *key_mask = op_constant(Kc->device, SHAPE(B, lmax), mask);
  free(idx);
  free(mask);
  return mha_forward(a, ctx, query, kpad, vpad, key_mask);
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
  // 2. Smoothing (differentiable) and the curvature sign (host, no gradient).
  float taps[64];
  int ntaps = enact_gaussian_taps(e->opt.sigma, taps);
  Tensor *hsm = op_enact_smooth(H, g->Hp, g->Wp, g->valid_h, g->valid_w, taps, ntaps, e->opt.one_d);
  EnactTrace local = {.entropy = hsm};
  const EnactTrace *use = fixed;
  if (!use) {
    // The curvature sign and the regions are computed on the host from the smoothed map [B, N]
    // (a few KB): the regions set the shapes of everything after them. On a GPU this copy is a
    // synchronisation point, one per ENACT encoder layer (docs/cuda.md).
    float *host = detr_malloc((size_t)(B * N) * sizeof(float), "enact_attention host");
    local.signs = detr_malloc((size_t)(B * N) * sizeof(float), "enact_attention signs");
    tensor_to_host(hsm, host);
    enact_curvature_sign(host, g, e->opt.one_d, local.signs);
    free(host);
    // 3. Regions of equal sign.
    enact_find_regions(local.signs, g, &local.regions);
    use = &local;
  }
  // 4. Cluster the keys' and values' inputs; 5. attend over each image's clusters.
  Tensor *vc = NULL;
  Tensor *kc = op_enact_cluster(op_reshape(k_in, SHAPE(B * N, d)), op_reshape(x, SHAPE(B * N, d)),
                                op_reshape(hsm, SHAPE(B * N)), e->opt.sign_factor ? use->signs : NULL,
                                use->regions.starts, use->regions.lengths, use->regions.count, &vc);
  Tensor *attn = enact_cluster_attention(proj, ctx, k_in, kc, vc, &use->regions);
  if (trace && !fixed) {
    *trace = local;
  } else {
    if (trace) *trace = (EnactTrace){.entropy = hsm};
    enact_trace_free(&local);
  }
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

static void release_trace(void *owned) {
  enact_trace_free(owned);
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

static Tensor *forward(const void *extras, const NnCtx *ctx, const EncoderAttnInput *in, AttnTrace *trace, char *err,
                       size_t err_cap) {
  if (enact_check_geometry(in->geom, err, err_cap)) return NULL;
  EnactTrace *t = detr_calloc(1, sizeof *t, "an ENACT trace");
  Tensor *y = enact_attention(extras, in->proj, ctx, in->x, in->pos, in->geom, NULL, t);
  if (!trace) {
    release_trace(t);
    return y;
  }
  const EnactRegions *r = &t->regions;
  if (ctx->want_clusters) t->clusters = cluster_map(r, in->x->shape.d[0] * in->x->shape.d[1]);  // [B * N]
  *trace = (AttnTrace){
      .n_stats = 2,
      .stats = {{"clusters_per_image", "clusters/img", (double)r->count / (double)r->B},
                {"compression", "N/L", enact_pixels_per_cluster(r)}},
      .n_exports = 3,
      .exports = {{"entropy", t->entropy, NULL, 0},
                  {"region_starts", NULL, r->starts, r->count},
                  {"region_lengths", NULL, r->lengths, r->count}},
      .clusters = t->clusters,
      .owned = t,
      .release = release_trace,
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
