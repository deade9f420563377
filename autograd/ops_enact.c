// ENACT's differentiable pieces: the clustering op and the Gaussian smoothing of the entropy map.
#include <stdlib.h>
#include <string.h>

#include "autograd/op_util.h"

// --- clustering: node buffer = [starts L][lengths L] int64, then signs [M] float (optional) ---

typedef struct {
  int64_t regions;  // L
  bool has_signs;   // the node buffer ends with signs [M]
} ClusterAttrs;

// The node buffer lives on the tensors' device: [starts L][lengths L] int64, then signs [M] float.
static void enact_cluster_backward_node(TapeNode *n) {
  Tensor *K = n->in[0], *V = n->in[1], *H = n->in[2], *Kc = n->out[0], *Vc = n->out[1];
  const ClusterAttrs *at = NODE_ATTRS(n, ClusterAttrs);
  int64_t L = at->regions, d = K->shape.d[1];
  const int64_t *starts = n->buf, *lengths = starts + L;
  const float *signs = at->has_signs ? (const float *)(lengths + L) : NULL;
  float *dK = grad_data_or_null(K), *dV = grad_data_or_null(V), *dH = grad_data_or_null(H);
  DISPATCH(K->device,
           cpu_enact_cluster_backward(K->data, V->data, H->data, signs, starts, lengths, L, d, Kc->data, Vc->data,
                                      Kc->grad->data, Vc->grad->data, dK, dV, dH),
           cuda_enact_cluster_backward(K->data, V->data, H->data, signs, starts, lengths, L, d, Kc->data, Vc->data,
                                       Kc->grad->data, Vc->grad->data, dK, dV, dH));
}

Tensor *op_enact_cluster(Tensor *K, Tensor *V, Tensor *H, const float *signs, const int64_t *starts,
                         const int64_t *lengths, int64_t L, Tensor **Vc_out) {
  char sk[64], sv[64], sh[64];
  DETR_CHECK(K->shape.ndim == 2 && shape_equal(K->shape, V->shape) && H->numel == K->shape.d[0],
             "enact_cluster: K %s, V %s, H %s are not [M, d], [M, d], [M]", shape_str(K->shape, sk, sizeof sk),
             shape_str(V->shape, sv, sizeof sv), shape_str(H->shape, sh, sizeof sh));
  check_same_device("enact_cluster", K, V);
  check_same_device("enact_cluster", K, H);
  int64_t M = K->shape.d[0], d = K->shape.d[1];
  int64_t covered = 0;
  for (int64_t j = 0; j < L; j++) {
    DETR_CHECK(lengths[j] >= 1 && starts[j] >= covered && starts[j] + lengths[j] <= M,
               "enact_cluster: region %lld [%lld, +%lld) is empty, overlaps the previous one or leaves [0, %lld)",
               (long long)j, (long long)starts[j], (long long)lengths[j], (long long)M);
    covered = starts[j] + lengths[j];
  }
  Tensor *Kc = tensor_new_scoped(K->device, SHAPE(L, d)), *Vc = tensor_new_scoped(K->device, SHAPE(L, d));
  // Regions (and signs) in one block on the tensors' device: the kernels read them there, and the
  // node keeps the block for backward.
  size_t index_bytes = (size_t)(2 * L) * sizeof(int64_t), sign_bytes = signs ? (size_t)M * sizeof(float) : 0;
  size_t bytes = index_bytes + sign_bytes;
  char *host = detr_malloc(bytes, "enact_cluster regions");
  memcpy(host, starts, (size_t)L * sizeof(int64_t));
  memcpy(host + (size_t)L * sizeof(int64_t), lengths, (size_t)L * sizeof(int64_t));
  if (signs) memcpy(host + index_bytes, signs, sign_bytes);
  char *block = upload_block(K->device, host, bytes);
  free(host);
  const int64_t *dev_starts = (const int64_t *)block, *dev_lengths = dev_starts + L;
  const float *dev_signs = signs ? (const float *)(block + index_bytes) : NULL;
  DISPATCH(K->device,
           cpu_enact_cluster_forward(K->data, V->data, H->data, dev_signs, dev_starts, dev_lengths, L, d, Kc->data,
                                     Vc->data),
           cuda_enact_cluster_forward(K->data, V->data, H->data, dev_signs, dev_starts, dev_lengths, L, d, Kc->data,
                                      Vc->data));
  Tensor *in[3] = {K, V, H};
  TapeNode *n = autograd_record("enact_cluster", enact_cluster_backward_node, Kc, 3, in);
  if (n) {
    autograd_add_output(n, Vc);
    Tensor *read[5] = {K, V, H, Kc, Vc};  // backward reads all five
    for (int i = 0; i < 5; i++) autograd_save(n, read[i]);
    *NODE_ATTRS(n, ClusterAttrs) = (ClusterAttrs){.regions = L, .has_signs = signs != NULL};
  }
  node_take_block(n, K->device, block, bytes);  // the node owns the block now (or it is freed)
  *Vc_out = Vc;
  return Kc;
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
