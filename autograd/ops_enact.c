// ENACT's differentiable pieces: the clustering op and the Gaussian smoothing of the entropy map.
#include <stdlib.h>
#include <string.h>

#include "autograd/op_util.h"

// --- regions ---

static EnactRegionIndex region_index_new(Device dev, int64_t cap, int64_t B) {
  EnactRegionIndex r = {.cap = cap, .B = B, .rows = cap};
  r.storage = tensor_new_scoped(dev, SHAPE(2 * (2 * cap + B + 3)));  // int64 [2 cap + B + 3]
  return r;
}

// On the CPU the count is in host memory: the clustered tensors need only its rows.
static void fit_rows(EnactRegionIndex *r) {
  if (r->storage->device == DEVICE_CPU) r->rows = enact_region_image_offset(r)[r->B];
}

void enact_region_index_read(const EnactRegionIndex *r, const int64_t *values, int64_t n, int64_t *host) {
  if (n == 0) return;
  int64_t first = values - enact_region_starts(r);  // its place in the storage, in int64
  DETR_CHECK(first >= 0 && first + n <= 2 * r->cap + r->B + 3,
             "enact_region_index_read: [%lld, +%lld) is outside the index", (long long)first, (long long)n);
  Tensor *part = tensor_view_range(r->storage, 2 * first, SHAPE(2 * n));  // 2 floats an int64
  tensor_to_host(part, (float *)host);
  tensor_release(part);
}

EnactRegionIndex enact_region_index_upload(Device dev, const int64_t *starts, const int64_t *lengths, int64_t L,
                                           const int64_t *image_offset, int64_t B) {
  DETR_CHECK(image_offset[0] == 0 && image_offset[B] == L,
             "enact_region_index: image offsets [0, %lld] do not cover %lld regions", (long long)image_offset[B],
             (long long)L);
  int64_t covered = 0;
  for (int64_t j = 0; j < L; j++) {
    DETR_CHECK(lengths[j] >= 1 && starts[j] >= covered,
               "enact_region_index: region %lld [%lld, +%lld) is empty or overlaps the previous one", (long long)j,
               (long long)starts[j], (long long)lengths[j]);
    covered = starts[j] + lengths[j];
  }
  EnactRegionIndex r = region_index_new(dev, L, B);
  int64_t n = 2 * L + B + 3, *host = detr_calloc((size_t)n, sizeof(int64_t), "enact_region_index host");
  memcpy(host, starts, (size_t)L * sizeof(int64_t));
  memcpy(host + L, lengths, (size_t)L * sizeof(int64_t));
  memcpy(host + 2 * L, image_offset, (size_t)(B + 1) * sizeof(int64_t));
  tensor_copy_from_host_(r.storage, (const float *)host);
  free(host);
  return r;
}

Tensor *op_enact_signs(Tensor *hsm, int64_t Hp, int64_t Wp, const int64_t *valid_h, const int64_t *valid_w,
                       bool one_d) {
  char s[64];
  DETR_CHECK(hsm->shape.ndim == 2 && hsm->shape.d[1] == Hp * Wp, "enact_signs: input %s is not [B, %lld]",
             shape_str(hsm->shape, s, sizeof s), (long long)(Hp * Wp));
  int64_t B = hsm->shape.d[0];
  int64_t *host = detr_malloc((size_t)(2 * B) * sizeof(int64_t), "enact_signs geometry");
  memcpy(host, valid_h, (size_t)B * sizeof(int64_t));
  memcpy(host + B, valid_w, (size_t)B * sizeof(int64_t));
  int64_t *dims = upload_block(hsm->device, host, (size_t)(2 * B) * sizeof(int64_t));
  free(host);
  Tensor *signs = tensor_new_scoped(hsm->device, hsm->shape);
  DISPATCH(hsm->device, cpu_enact_signs(hsm->data, signs->data, B, Hp, Wp, dims, dims + B, one_d),
           cuda_enact_signs(hsm->data, signs->data, B, Hp, Wp, dims, dims + B, one_d));
  detr_free(hsm->device, dims, (size_t)(2 * B) * sizeof(int64_t));  // the stream orders its reuse
  return signs;
}

EnactRegionIndex op_enact_regions(Tensor *signs) {
  char s[64];
  DETR_CHECK(signs->shape.ndim == 2 && signs->shape.d[0] >= 1 && signs->shape.d[1] >= 1,
             "enact_regions: signs %s is not [B, N] with B, N >= 1", shape_str(signs->shape, s, sizeof s));
  int64_t B = signs->shape.d[0], N = signs->shape.d[1], M = B * N;
  EnactRegionIndex r = region_index_new(signs->device, M, B);
  size_t ws_bytes = 0;
  DISPATCH(signs->device, ws_bytes = cpu_enact_regions_workspace(M), ws_bytes = cuda_enact_regions_workspace(M));
  void *ws = detr_alloc(signs->device, ws_bytes);
  DISPATCH(signs->device,
           cpu_enact_regions(signs->data, B, N, enact_region_starts(&r), enact_region_lengths(&r),
                             enact_region_image_offset(&r), ws),
           cuda_enact_regions(signs->data, B, N, enact_region_starts(&r), enact_region_lengths(&r),
                              enact_region_image_offset(&r), ws));
  detr_free(signs->device, ws, ws_bytes);
  fit_rows(&r);
  return r;
}

EnactRegionIndex op_enact_official_regions(Tensor *hsm) {
  char s[64];
  DETR_CHECK(hsm->shape.ndim == 2 && hsm->shape.d[0] >= 1 && hsm->shape.d[1] >= 1,
             "enact_official_regions: input %s is not [B, N] with B, N >= 1", shape_str(hsm->shape, s, sizeof s));
  int64_t B = hsm->shape.d[0], N = hsm->shape.d[1];
  EnactRegionIndex r = region_index_new(hsm->device, B * N, B);  // c >= 1: at most N chunks an image
  size_t ws_bytes = (size_t)B * sizeof(int64_t);
  int64_t *ws = detr_alloc(hsm->device, ws_bytes);
  DISPATCH(hsm->device,
           cpu_enact_official_regions(hsm->data, B, N, enact_region_starts(&r), enact_region_lengths(&r),
                                      enact_region_image_offset(&r), enact_region_cluster_size(&r),
                                      enact_region_mean_length(&r), ws),
           cuda_enact_official_regions(hsm->data, B, N, enact_region_starts(&r), enact_region_lengths(&r),
                                       enact_region_image_offset(&r), enact_region_cluster_size(&r),
                                       enact_region_mean_length(&r), ws));
  detr_free(hsm->device, ws, ws_bytes);
  fit_rows(&r);
  return r;
}

// --- clustering ---

typedef struct {
  int64_t cap, B;  // the index's
} ClusterAttrs;

// in: K, V, H, the index storage, then the signs (optional).
static void enact_cluster_backward_node(TapeNode *n) {
  Tensor *K = n->in[0], *V = n->in[1], *H = n->in[2], *Kc = n->out[0], *Vc = n->out[1];
  Tensor *signs_t = n->n_in > 4 ? n->in[4] : NULL;
  const ClusterAttrs *at = NODE_ATTRS(n, ClusterAttrs);
  EnactRegionIndex r = {.storage = n->in[3], .cap = at->cap, .B = at->B};
  const int64_t *starts = enact_region_starts(&r), *lengths = enact_region_lengths(&r);
  const int64_t *count = enact_region_image_offset(&r) + r.B;
  int64_t d = K->shape.d[1], cap = Kc->shape.d[0];
  const float *signs = signs_t ? signs_t->data : NULL;
  float *dK = grad_data_or_null(K), *dV = grad_data_or_null(V), *dH = grad_data_or_null(H);
  DISPATCH(K->device,
           cpu_enact_cluster_backward(K->data, V->data, H->data, signs, starts, lengths, count, cap, d, Kc->data,
                                      Vc->data, Kc->grad->data, Vc->grad->data, dK, dV, dH),
           cuda_enact_cluster_backward(K->data, V->data, H->data, signs, starts, lengths, count, cap, d, Kc->data,
                                       Vc->data, Kc->grad->data, Vc->grad->data, dK, dV, dH));
}

Tensor *op_enact_cluster(Tensor *K, Tensor *V, Tensor *H, Tensor *signs, const EnactRegionIndex *r, Tensor **Vc_out) {
  char sk[64], sv[64], sh[64];
  DETR_CHECK(K->shape.ndim == 2 && shape_equal(K->shape, V->shape) && H->numel == K->shape.d[0],
             "enact_cluster: K %s, V %s, H %s are not [M, d], [M, d], [M]", shape_str(K->shape, sk, sizeof sk),
             shape_str(V->shape, sv, sizeof sv), shape_str(H->shape, sh, sizeof sh));
  DETR_CHECK(!signs || signs->numel == K->shape.d[0], "enact_cluster: %lld signs for %lld rows",
             (long long)signs->numel, (long long)K->shape.d[0]);
  check_same_device("enact_cluster", K, V);
  check_same_device("enact_cluster", K, H);
  check_same_device("enact_cluster", K, r->storage);
  int64_t d = K->shape.d[1], cap = r->rows;  // the rows written: the count's first, then zeros
  Tensor *Kc = tensor_new_scoped(K->device, SHAPE(cap, d)), *Vc = tensor_new_scoped(K->device, SHAPE(cap, d));
  const int64_t *starts = enact_region_starts(r), *lengths = enact_region_lengths(r);
  const int64_t *count = enact_region_image_offset(r) + r->B;
  const float *sg = signs ? signs->data : NULL;
  DISPATCH(
      K->device,
      cpu_enact_cluster_forward(K->data, V->data, H->data, sg, starts, lengths, count, cap, d, Kc->data, Vc->data),
      cuda_enact_cluster_forward(K->data, V->data, H->data, sg, starts, lengths, count, cap, d, Kc->data, Vc->data));
  Tensor *in[5] = {K, V, H, r->storage, signs};
  TapeNode *n = autograd_record("enact_cluster", enact_cluster_backward_node, Kc, signs ? 5 : 4, in);
  if (n) {
    autograd_add_output(n, Vc);
    Tensor *read[7] = {K, V, H, r->storage, Kc, Vc, signs};  // backward reads all of them
    for (int i = 0; i < (signs ? 7 : 6); i++) autograd_save(n, read[i]);
    *NODE_ATTRS(n, ClusterAttrs) = (ClusterAttrs){.cap = r->cap, .B = r->B};
  }
  *Vc_out = Vc;
  return Kc;
}

// --- the clustered attention ---

typedef struct {
  int64_t B, N, heads, hd, cap;
  float scale, out_scale, p;  // p: dropout, drawn from (seed, offset)
  uint64_t seed, offset;
} ClusterAttnAttrs;

// in: q, k, v, the index storage; the node keeps lse [B, heads, N] in its buffer.
static void cluster_attention_backward_node(TapeNode *n) {
  Tensor *q = n->in[0], *k = n->in[1], *v = n->in[2], *o = n->out[0];
  const ClusterAttnAttrs *a = NODE_ATTRS(n, ClusterAttnAttrs);
  EnactRegionIndex r = {.storage = n->in[3], .cap = a->cap, .B = a->B};
  const int64_t *offset = enact_region_image_offset(&r);
  size_t ws_bytes = (size_t)(a->B * a->heads * a->N) * sizeof(float);
  float *ws = detr_alloc(q->device, ws_bytes);
  float *dq = grad_data_or_null(q), *dk = grad_data_or_null(k), *dv = grad_data_or_null(v);
  DISPATCH(q->device,
           cpu_cluster_attention_backward(q->data, k->data, v->data, offset, a->B, a->N, a->heads, a->hd, a->scale,
                                          a->out_scale, a->p, a->seed, a->offset, o->data, n->buf, o->grad->data, dq,
                                          dk, dv, ws),
           cuda_cluster_attention_backward(q->data, k->data, v->data, offset, a->B, a->N, a->heads, a->hd, a->scale,
                                           a->out_scale, a->p, a->seed, a->offset, o->data, n->buf, o->grad->data, dq,
                                           dk, dv, ws));
  detr_free(q->device, ws, ws_bytes);
}

Tensor *op_cluster_attention(Tensor *q, Tensor *k, Tensor *v, const EnactRegionIndex *r, int64_t heads, float scale,
                             float out_scale, float p, Rng *rng) {
  DETR_CHECK(p >= 0.0f && p < 1.0f && (p == 0.0f || rng),
             "cluster_attention: dropout %g is not in [0, 1) with a stream", p);
  char sq[64], sk[64], sv[64];
  DETR_CHECK(q->shape.ndim == 3 && k->shape.ndim == 2 && shape_equal(k->shape, v->shape) &&
                 k->shape.d[1] == q->shape.d[2] && q->shape.d[0] == r->B && k->shape.d[0] == r->rows && heads >= 1 &&
                 q->shape.d[2] % heads == 0,
             "cluster_attention: q %s, k %s, v %s are not [%lld, N, heads*hd], [%lld, heads*hd] x 2 (heads %lld)",
             shape_str(q->shape, sq, sizeof sq), shape_str(k->shape, sk, sizeof sk), shape_str(v->shape, sv, sizeof sv),
             (long long)r->B, (long long)r->rows, (long long)heads);
  check_same_device("cluster_attention", q, k);
  check_same_device("cluster_attention", q, v);
  check_same_device("cluster_attention", q, r->storage);
  int64_t B = q->shape.d[0], N = q->shape.d[1], hd = q->shape.d[2] / heads;
  const int64_t *offset = enact_region_image_offset(r);
  if (q->device == DEVICE_CPU)  // the counts are in host memory here (a GPU's come from op_enact_*regions)
    for (int64_t b = 0; b < B; b++)
      DETR_CHECK(offset[b + 1] - offset[b] <= N,
                 "cluster_attention: image %lld has %lld clusters, more than its %lld queries", (long long)b,
                 (long long)(offset[b + 1] - offset[b]), (long long)N);
  Tensor *o = tensor_new_scoped(q->device, q->shape);
  size_t lse_bytes = (size_t)(B * heads * N) * sizeof(float);
  float *lse = detr_alloc(q->device, lse_bytes);  // [B, heads, N]
  uint64_t seed = p > 0.0f ? rng->seed : 0, draw = p > 0.0f ? rng->offset : 0;
  if (p > 0.0f) rng->offset += rng_counters_uniform((uint64_t)(B * heads * N * N));  // the dense numbering
  DISPATCH(q->device,
           cpu_cluster_attention_forward(q->data, k->data, v->data, offset, B, N, heads, hd, scale, out_scale, p, seed,
                                         draw, o->data, lse),
           cuda_cluster_attention_forward(q->data, k->data, v->data, offset, B, N, heads, hd, scale, out_scale, p, seed,
                                          draw, o->data, lse));
  Tensor *in[4] = {q, k, v, r->storage};
  TapeNode *n = autograd_record("cluster_attention", cluster_attention_backward_node, o, 4, in);
  if (n) {
    Tensor *read[5] = {q, k, v, r->storage, o};
    for (int i = 0; i < 5; i++) autograd_save(n, read[i]);
    *NODE_ATTRS(n, ClusterAttnAttrs) = (ClusterAttnAttrs){.B = B,
                                                          .N = N,
                                                          .heads = heads,
                                                          .hd = hd,
                                                          .cap = r->cap,
                                                          .scale = scale,
                                                          .out_scale = out_scale,
                                                          .p = p,
                                                          .seed = seed,
                                                          .offset = draw};
  }
  node_take_block(n, q->device, lse, lse_bytes);
  return o;
}

// --- smoothing: linear and self-adjoint, so backward applies the same filter to the gradient.
// The geometry block lives on x's device (the node keeps it): [valid_h B][valid_w B] int64, then
// the taps [ntaps] float. ---

// y [B, Hp*Wp] += smooth(x); geom = the block above, on dev. Workspace: B*Hp*Wp floats on dev.
static void smooth(Device dev, const float *x, float *y, int64_t B, int64_t Hp, int64_t Wp, const int64_t *geom,
                   int64_t ntaps, bool one_d) {
  const int64_t *vh = geom, *vw = geom + B;
  const float *taps = (const float *)(geom + 2 * B);
  size_t ws_bytes = (size_t)(B * Hp * Wp) * sizeof(float);
  float *ws = detr_alloc(dev, ws_bytes);
  DISPATCH(dev, cpu_enact_smooth(x, y, B, Hp, Wp, vh, vw, taps, ntaps, !one_d, ws),
           cuda_enact_smooth(x, y, B, Hp, Wp, vh, vw, taps, ntaps, !one_d, ws));
  detr_free(dev, ws, ws_bytes);
}

typedef struct {
  int64_t Hp, Wp;  // the padded map, x [B, Hp*Wp]
  int64_t ntaps;
  bool one_d;
} SmoothAttrs;

static void enact_smooth_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *y = n->out[0];
  float *dx = grad_data_or_null(x);
  if (!dx) return;
  const SmoothAttrs *at = NODE_ATTRS(n, SmoothAttrs);
  smooth(x->device, y->grad->data, dx, x->shape.d[0], at->Hp, at->Wp, n->buf, at->ntaps, at->one_d);
}

Tensor *op_enact_smooth(Tensor *x, int64_t Hp, int64_t Wp, const int64_t *valid_h, const int64_t *valid_w,
                        const float *taps, int ntaps, bool one_d) {
  char s[64];
  DETR_CHECK(x->shape.ndim == 2 && x->shape.d[1] == Hp * Wp, "enact_smooth: input %s is not [B, %lld]",
             shape_str(x->shape, s, sizeof s), (long long)(Hp * Wp));
  DETR_CHECK(ntaps % 2 == 1, "enact_smooth: %d taps, expected an odd count", ntaps);
  int64_t B = x->shape.d[0];
  for (int64_t b = 0; b < B; b++)
    DETR_CHECK(valid_h[b] >= 1 && valid_h[b] <= Hp && valid_w[b] >= 1 && valid_w[b] <= Wp,
               "enact_smooth: image %lld's valid region %lldx%lld is outside %lldx%lld", (long long)b,
               (long long)valid_h[b], (long long)valid_w[b], (long long)Hp, (long long)Wp);
  size_t dims_bytes = (size_t)(2 * B) * sizeof(int64_t), bytes = dims_bytes + (size_t)ntaps * sizeof(float);
  char *host = detr_malloc(bytes, "enact_smooth geometry");
  memcpy(host, valid_h, (size_t)B * sizeof(int64_t));
  memcpy(host + (size_t)B * sizeof(int64_t), valid_w, (size_t)B * sizeof(int64_t));
  memcpy(host + dims_bytes, taps, (size_t)ntaps * sizeof(float));
  int64_t *geom = upload_block(x->device, host, bytes);
  free(host);
  Tensor *y = tensor_new_scoped(x->device, x->shape);
  tensor_fill_(y, 0.0f);
  smooth(x->device, x->data, y->data, B, Hp, Wp, geom, ntaps, one_d);
  TapeNode *n = autograd_record("enact_smooth", enact_smooth_backward_node, y, 1, &x);
  if (n) *NODE_ATTRS(n, SmoothAttrs) = (SmoothAttrs){.Hp = Hp, .Wp = Wp, .ntaps = ntaps, .one_d = one_d};
  node_take_block(n, x->device, geom, bytes);
  return y;
}
