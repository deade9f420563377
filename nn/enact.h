// ENACT: entropy-based clustering of the encoder's keys and values (docs/enact.md: the method, its
// sources, where detr-c departs from them and the erratum in the supplement's Eq. 3).
// Per encoder layer:
//   1. self-information H = -p log2(p + 1e-8), p = softmax over each image's valid pixels of
//      W_prob(k_in) (Linear(d, 1));
//   2. H smoothed by a Gaussian (differentiable), its curvature's sign Hs (no gradient);
//   3. regions: maximal runs of equal Hs in batch-flattened row-major order, without padding;
//   4. K', V' = region-softmax(Hsm)-weighted sums of k_in, v_in rows (op_enact_cluster);
//   5. every pixel's query attends to its own image's clusters only.
#pragma once
#include "nn/transformer.h"

typedef struct {
  float sigma;       // Gaussian sigma (3)
  bool one_d;        // the reference code's 1-D smoothing/curvature along each image's row-major order
  bool sign_factor;  // Algorithm 1's -Hs factor in the clustering sums
} EnactOptions;

// ENACT works on the batch's feature-map geometry (nn/encoder_attn.h) and needs each image's valid
// pixels to be its top-left valid_h x valid_w rectangle, with at least one pixel.
typedef FeatureGeometry EnactGeometry;

// The geometry of a feature-resolution mask [B, Hp*Wp] (1 = padding) on the CPU, checked as ENACT
// needs it. Returns 0, or -1 with err set when an image's valid pixels are not a non-empty
// top-left rectangle.
int enact_geometry(const uint8_t *mask, int64_t B, int64_t Hp, int64_t Wp, EnactGeometry *g, char *err, size_t err_cap);
void enact_geometry_free(EnactGeometry *g);
// The same check on a geometry made elsewhere.
int enact_check_geometry(const EnactGeometry *g, char *err, size_t err_cap);

// The Gaussian taps g(x) = exp(-x^2 / 2 sigma^2) / (sigma sqrt(2 pi)), x = -r..r, r = floor(3 sigma - 1)
// (not renormalised, as the reference code). Returns the count (2r + 1); taps has room for 64.
int enact_gaussian_taps(float sigma, float *taps);

// Curvature sign of the smoothed map hsm [B, Hp*Wp] (host): +1 where C > 0 (concave), -1 elsewhere
// in the valid region, 0 on padding. C = -(Sxx * Hsm + Syy * Hsm) with the second-order Sobel
// kernels, zero padding outside the valid region (2-D), or C = -Hsm[i-1] + 2 Hsm[i] - Hsm[i+1]
// along the valid row-major sequence (1-D). op_enact_signs on a host array.
void enact_curvature_sign(const float *hsm, const EnactGeometry *g, bool one_d, float *signs);

// Regions of a batch on the host: starts/lengths index the batch-flattened pixel order b*N + y*Wp + x.
typedef struct {
  int64_t count;              // L
  int64_t *starts, *lengths;  // [L]
  int64_t *image_offset;      // [B + 1]: image b's regions are [image_offset[b], image_offset[b+1])
  int64_t B;
} EnactRegions;

// Maximal runs of equal sign over valid pixels: a region starts at each image's first pixel, at
// every sign change and at the first valid pixel after padding. signs: 0 marks padding.
// op_enact_regions on host arrays.
void enact_find_regions(const float *signs, const EnactGeometry *g, EnactRegions *r);
// A device index's regions on the host (a copy from a GPU: after the forward, not in it).
void enact_regions_from_index(const EnactRegionIndex *index, EnactRegions *r);
// The host regions as an index on dev (regions held fixed).
EnactRegionIndex enact_regions_upload(Device dev, const EnactRegions *r);
void enact_regions_free(EnactRegions *r);
// Pixels per cluster N/L: the regions cover exactly the valid pixels.
double enact_pixels_per_cluster(const EnactRegions *r);

// What one layer's clustering did. The forward leaves it on the tensors' device (entropy, signs_t,
// index); enact_trace_to_host copies signs and regions to the host.
typedef struct {
  Tensor *entropy;         // smoothed map Hsm [B, N] (scoped)
  Tensor *signs_t;         // curvature signs [B, N] (scoped)
  EnactRegionIndex index;  // the regions (scoped)
  float *signs;            // host [B * N] (+1, -1; 0 on padding), owned, or NULL
  EnactRegions regions;    // host, owned (count 0 until copied)
  int32_t *clusters;       // [B * N] each pixel's region within its image (0, 1, ...; -1 on padding), owned,
                           // or NULL (the variant makes it for its AttnTrace)
} EnactTrace;
void enact_trace_to_host(EnactTrace *t);
void enact_trace_free(EnactTrace *t);

// The variant's per-layer state: `<layer>.self_attn.W_prob.{weight,bias}` and the options.
typedef struct {
  Linear w_prob;
  EnactOptions opt;
} EnactAttn;

// ENACT's attention of an encoder layer: x, pos [B, N, d] (q = k = x + pos, v = x); proj: the
// layer's DETR projections; g: the batch geometry (checked by the caller). fixed: host signs and
// regions to use instead of computing them (gradient checks hold them fixed), or NULL. trace (may
// be NULL) receives the smoothed entropy, the signs and the regions, on the device. Returns
// [B, N, d] before the layer's residual. Nothing is read on the host: the regions are found, the
// keys clustered and the attention computed where the tensors live.
Tensor *enact_attention(const EnactAttn *e, const MultiheadAttention *proj, const NnCtx *ctx, Tensor *x, Tensor *pos,
                        const EnactGeometry *g, const EnactTrace *fixed, EnactTrace *trace);

// Attention of every pixel's query [B, N, d] over its own image's clusters Kc, Vc [cap, d] (the
// index's regions; multi-head, 1/sqrt(head_dim), the layer's attention dropout when training)
// through the layer's projections: op_cluster_attention.
Tensor *enact_cluster_attention(const MultiheadAttention *a, const NnCtx *ctx, Tensor *query, Tensor *Kc, Tensor *Vc,
                                const EnactRegionIndex *index);

// --- ENACT as the authors' code computes it (nn/attn_enact_official.c, `encoder_attn=enact_official`;
// docs/enact.md, "The two forms"): GSavathrakis/ENACT, DETR-ENACT/models/ENACT_attn/enact.py, ClustAttn.
// Per layer, on the whole padded map flattened to N = Hp*Wp (no mask anywhere):
//   1. H = -(p + 1e-8) log2(p + 1e-8), p = softmax over all N of W_prob(k_in);
//   2. Hsm = H convolved along the flattened sequence (zero ends) with the 6 sigma - 1 Gaussian taps;
//   3. curvature -Hsm[i-1] + 2 Hsm[i] - Hsm[i+1] > 0 per pixel; each image's mean run length of equal
//      sign, N / runs (float32); one cluster size c = round-half-even(mean over the batch) (no gradient);
//   4. the sequence trimmed by (N mod c)/2 pixels at the start and the rest at the end, cut into
//      chunks of c; K', V' = softmax(Hsm over the chunk)-weighted sums of k_in, v_in (op_enact_cluster);
//   5. W_o(softmax(W_q(q_in) W_k(K')^T) / head_dim W_v(V')) per head: no 1/sqrt(head_dim) inside.
// The pieces are separate so that another layer (Anchor-DETR-ENACT clusters the row and column keys)
// can call them.

// The layer's state: `<layer>.self_attn.{W_q,W_k,W_v,W_o,W_prob}.{weight,bias}` (the official names).
typedef struct {
  Linear w_q, w_k, w_v, w_o, w_prob;
  int64_t heads;
  int sigma;  // an integer: the official arange(-(3 sigma - 1), 3 sigma) is then symmetric and odd
} EnactOfficial;

// The official taps in its float32 order: (1 / (sigma sqrt(2 pi))) exp(-x^2 / (2 sigma^2)),
// x = -(3 sigma - 1) .. 3 sigma - 1. Returns the count 6 sigma - 1 (taps has room for 64).
int enact_official_taps(int sigma, float *taps);
// Steps 1-2: k [B, N, d] -> Hsm [B, N] (differentiable w.r.t. W_prob and k).
Tensor *enact_official_entropy(const Linear *w_prob, Tensor *k, int sigma);
// Step 3 on the host: hsm [B * N] -> c (>= 1); *mean_length: the batch's mean run length before rounding.
// (op_enact_official_regions computes the same where hsm lives.)
int64_t enact_official_cluster_size(const float *hsm, int64_t B, int64_t N, double *mean_length);
// The chunks of cluster size c as an index on dev (a cluster size held fixed).
EnactRegionIndex enact_official_fixed_regions(Device dev, int64_t B, int64_t N, int64_t c);
// Step 4's chunks of hsm [B, N] on its device: of the cluster size found there, or of fixed_c > 0.
EnactRegionIndex enact_official_chunks(Tensor *hsm, int64_t fixed_c);
// Step 5: q [B, N, d] over each image's chunks K', V' [cap, d] of the index -> [B, N, d].
Tensor *enact_official_attend(const EnactOfficial *e, Tensor *q, Tensor *kc, Tensor *vc, const EnactRegionIndex *index);

typedef struct {
  Tensor *entropy;         // Hsm [B, N] (scoped)
  EnactRegionIndex index;  // the chunks and the cluster size, on the tensors' device (scoped)
} EnactOfficialTrace;
// The trace's cluster size c and the mean run length it was rounded from (a copy from a GPU).
int64_t enact_official_trace_cluster_size(const EnactOfficialTrace *t, double *mean_length);
// ClustAttn.forward(q_in, k_in, v_in): [B, N, d] each -> [B, N, d], the cluster size found where the
// tensors live. fixed_c > 0 uses that cluster size instead (gradient checks hold it fixed). trace
// may be NULL.
Tensor *enact_official_attention(const EnactOfficial *e, Tensor *q_in, Tensor *k_in, Tensor *v_in, int64_t fixed_c,
                                 EnactOfficialTrace *trace);
