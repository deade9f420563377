// The differentiable op library. Each op returns a scoped tensor (tensor/tensor.h) on the device
// of its inputs and, when an input requires grad, records its backward on the tape. Forward and
// backward of each op sit next to each other in autograd/ops_<family>.c.
#pragma once
#include "autograd/autograd.h"
#include "kernels/conv_math.h"  // ConvWeightPack

// --- constants (ops_shape.c): tensors no op computes, owned by the current scope like every op's
// output, so that a layer makes one without handling its lifetime ---
Tensor *op_constant(Device dev, Shape shape, const float *host);  // a copy of host [numel(shape)]
Tensor *op_zeros(Device dev, Shape shape);

// --- elementwise (ops_elementwise.c) ---
Tensor *op_relu(Tensor *x);
Tensor *op_sigmoid(Tensor *x);
Tensor *op_exp(Tensor *x);
Tensor *op_log(Tensor *x);
Tensor *op_neg(Tensor *x);
Tensor *op_add_scalar(Tensor *x, float s);
Tensor *op_mul_scalar(Tensor *x, float s);
Tensor *op_sqrt(Tensor *x);
Tensor *op_pow_scalar(Tensor *x, float p);  // x^p for x > 0
Tensor *op_softplus(Tensor *x);             // log(1 + e^x); x above 20, as torch
Tensor *op_sin(Tensor *x);
Tensor *op_cos(Tensor *x);
// Conditional DETR's inverse_sigmoid: log(max(x, eps) / max(1 - x, eps)) of x clamped to [0, 1].
Tensor *op_inverse_sigmoid(Tensor *x, float eps);
Tensor *op_abs(Tensor *x);  // |x|; gradient sign(x), 0 at 0 (torch)
// Binary ops broadcast numpy-style (shapes aligned at the last dim, size-1 dims stretch).
Tensor *op_add(Tensor *a, Tensor *b);
Tensor *op_sub(Tensor *a, Tensor *b);
Tensor *op_mul(Tensor *a, Tensor *b);
Tensor *op_div(Tensor *a, Tensor *b);
// Dropout with probability p, scaling kept values by 1/(1-p); identity when !training or p == 0.
// The mask is drawn from rng (advancing it) and regenerated in backward, not stored.
Tensor *op_dropout(Tensor *x, float p, bool training, Rng *rng);

// --- reductions (ops_reduce.c) ---
Tensor *op_sum(Tensor *x, int axis, bool keepdim);  // axis may be negative
Tensor *op_mean(Tensor *x, int axis, bool keepdim);
Tensor *op_sum_all(Tensor *x);  // shape [] (one element)
Tensor *op_mean_all(Tensor *x);

// --- matrix products (ops_matmul.c) ---
// [..., M, K] x [K, N] -> [..., M, N] (the leading dims of a are flattened into rows).
Tensor *op_matmul(Tensor *a, Tensor *b);
// Batched: a [B, M, K] (or [B, K, M] with trans_a), b [B, K, N] (or [B, N, K] with trans_b).
Tensor *op_bmm(Tensor *a, Tensor *b, bool trans_a, bool trans_b);
// op_bmm(op_dropout(a, p, training, rng), b, false, false) as one op: the same floats and draws,
// without keeping the dropped-out copy of a for backward.
Tensor *op_dropout_bmm(Tensor *a, Tensor *b, float p, bool training, Rng *rng);
// x [..., in] W[out, in]^T + bias[out] (bias may be NULL) -> [..., out], as torch's F.linear.
Tensor *op_linear(Tensor *x, Tensor *weight, Tensor *bias);
// relu(op_linear(x, weight, bias)) as one op: the same floats, two memory passes fewer.
Tensor *op_linear_relu(Tensor *x, Tensor *weight, Tensor *bias);
// op_dropout(op_linear_relu(x, weight, bias), p, training, rng) as one op: the same floats (but
// for a zero gradient's sign: -0 where the ops apart give +0) and the same draws from rng, one
// tensor fewer kept for backward.
Tensor *op_linear_relu_dropout(Tensor *x, Tensor *weight, Tensor *bias, float p, bool training, Rng *rng);

// --- convolution, pooling, frozen batch norm (ops_conv.c) ---
// Channels last: activations [B, H, W, C] instead of [B, C, H, W] (the weight's layout does not
// change). The CPU's oneDNN convolutions run on such buffers without the reorders to and from its
// blocked layout that nchw needs on every call (bench/README.md#bench_ops: `--conv` against `--conv-last`).
typedef struct {
  int stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  bool channels_last;
} Conv2dParams;
// x [B, C, H, W], weight [O, C, KH, KW], bias [O] or NULL -> [B, O, HO, WO]; channels last x
// [B, H, W, C] -> [B, HO, WO, O].
Tensor *op_conv2d(Tensor *x, Tensor *weight, Tensor *bias, Conv2dParams p);
// Inference only (grad mode off; no backward): relu?(conv2d(x, weight, bias) + residual), residual
// of the output's shape or NULL. On the CPU the epilogue runs inside the convolution (oneDNN's
// post-ops); elsewhere as the separate ops. Frozen batch norm folded into weight and bias
// (resnet_fold_bn) makes a ResNet block's conv, norm, add and ReLU one op. pack: the weight's
// reordered copies kept between calls (kernels/cpu/cpu_kernels.h: conv_weight_pack_new; one per
// weight, which must not change while the pack lives), or NULL; the CPU's alone.
Tensor *op_conv2d_fused(Tensor *x, Tensor *weight, Tensor *bias, Tensor *residual, bool relu, Conv2dParams p,
                        ConvWeightPack *pack);
// The same with the residual's buffer as the output (on the CPU: the convolution accumulates into
// it, one pass less than copying it): returns relu?(conv2d(x, weight, bias) + acc), in acc on the
// CPU. acc is consumed: a dead temporary whose contents the caller no longer needs (not x).
Tensor *op_conv2d_fused_into(Tensor *x, Tensor *weight, Tensor *bias, Tensor *acc, bool relu, Conv2dParams p,
                             ConvWeightPack *pack);
// Depthwise convolution of x [M, C, H, W] with weight [C, 1, k, k] (odd k) and bias [C] (or NULL):
// stride 1, zero padding k / 2, so y is [M, C, H, W] (nn.Conv2d(C, C, k, padding=k//2, groups=C)).
Tensor *op_depthwise_conv2d(Tensor *x, Tensor *weight, Tensor *bias);
// Max pooling with -inf padding (torch semantics): x [B, C, H, W] -> [B, C, HO, WO]; channels
// last [B, H, W, C] -> [B, HO, WO, C].
Tensor *op_maxpool2d(Tensor *x, int kernel, int stride, int pad, bool channels_last);
// y = (x - mean) / sqrt(var + eps) * weight + bias per channel of x [B, C, H, W]; the four
// [C] statistics are frozen buffers (no gradient), as DETR's FrozenBatchNorm2d.
Tensor *op_frozen_batchnorm2d(Tensor *x, Tensor *weight, Tensor *bias, Tensor *running_mean, Tensor *running_var,
                              float eps);
// The same fused with what follows it in a ResNet block: relu?(frozen_bn(x) + residual), residual
// of x's shape or NULL. One pass instead of three (frozen BN, add, ReLU), and the same floats.
// channels_last: x is [B, H, W, C].
Tensor *op_frozen_batchnorm2d_act(Tensor *x, Tensor *weight, Tensor *bias, Tensor *running_mean, Tensor *running_var,
                                  float eps, Tensor *residual, bool relu, bool channels_last);

// --- softmax and normalisation (ops_softmax.c) ---
// Over the last axis of x viewed as [A, R, N] with an additive mask [A, N] (or NULL): rows
// a*R .. a*R+R-1 of x all use mask row a (e.g. a key-padding mask of -inf over [B, heads*Lq, Lk]).
// A row whose entries are all -inf gives zeros.
Tensor *op_softmax(Tensor *x, Tensor *mask);
Tensor *op_log_softmax(Tensor *x, Tensor *mask);
// Cluster-wise argmax (kMaX-DeepLab's k-means assignment; docs/kmeans_cross_attention.md): logits
// x [N, Q, L] viewed as [A, R, Q, L] with an additive key-padding mask [A, L] (0 valid, -inf padded)
// or NULL. y[n, q, l] = w(n, q) when q = argmax_q' x[n, q', l] (the first on ties) and pixel l is
// not padded, else 0; w = 1 (mean false: the sum) or 1 / #pixels assigned to q (mean true). y is
// a constant: no tape node, no gradient into x. winners (may be NULL) receives a [N, L] tensor of
// each pixel's query as a float (-1: padded).
Tensor *op_cluster_argmax(Tensor *x, Tensor *mask, bool mean, Tensor **winners);
// Layer norm over the last axis; weight and bias [N] (both or neither may be NULL).
Tensor *op_layernorm(Tensor *x, Tensor *weight, Tensor *bias, float eps);

// --- shapes and indexing (ops_shape.c) ---
Tensor *op_reshape(Tensor *x, Shape shape);      // a view; one dim may be -1
Tensor *op_permute(Tensor *x, const int *perm);  // copies; perm has x->shape.ndim entries
Tensor *op_transpose(Tensor *x, int dim0, int dim1);
Tensor *op_concat(Tensor *const *xs, int n, int axis);
Tensor *op_slice(Tensor *x, int axis, int64_t start,
                 int64_t end);  // [start, end); may share x's data (one block, not recorded)
// Rows of x [R, ...] picked by host indices idx[0..n) -> [n, ...].
Tensor *op_index_select(Tensor *x, const int64_t *idx, int64_t n);

// --- losses and boxes (ops_loss.c) ---
// sum_i w[t_i] * -log softmax(logits_i)[t_i] / sum_i w[t_i]: logits [N, C], host targets[N] in
// [0, C), class weights [C] (NULL = all 1). torch's F.cross_entropy(weight=w) with mean reduction.
Tensor *op_cross_entropy(Tensor *logits, const int64_t *targets, Tensor *class_weight);
// Sigmoid focal loss (RetinaNet) summed over every element of logits [N, C] (shape []): targets
// [N] host, in [0, C]; row r's binary target is 1 at column targets[r] only (C: all 0).
// alpha_t BCE (1 - p_t)^gamma (kernels/loss_math.h); alpha < 0: no alpha weighting.
Tensor *op_sigmoid_focal_loss(Tensor *logits, const int64_t *targets, float alpha, float gamma);
// sum |a - b| over all elements (shape []).
Tensor *op_l1_sum(Tensor *a, Tensor *b);
// Boxes [..., 4]: (cx, cy, w, h) <-> (x0, y0, x1, y1).
Tensor *op_box_cxcywh_to_xyxy(Tensor *boxes);
Tensor *op_box_xyxy_to_cxcywh(Tensor *boxes);
// Generalized IoU of matched pairs a[i], b[i] of xyxy boxes [N, 4] -> [N]: IoU from the areas,
// intersection and union, minus (enclosing - union) / enclosing.
Tensor *op_box_giou(Tensor *a, Tensor *b);

// --- ENACT (ops_enact.c; nn/enact.h builds the layer from them) ---
// Regions found where the data lives (a GPU's regions never come to the host mid-forward): int64
// arrays kept in the storage of a float tensor (tensors hold floats; the tape then keeps the arrays
// alive as it keeps any saved tensor): starts [cap], lengths [cap], image_offset [B + 1] (image b's
// regions are [image_offset[b], image_offset[b+1]), image_offset[B] the count L <= cap), then two
// slots for the authors' form: its cluster size and mean run length (a double's bits).
typedef struct {
  Tensor *storage;  // [2 * (2 cap + B + 3)] floats, scoped
  int64_t cap, B;
  // The rows of the clustered tensors made from it: cap on a GPU (the count stays there); the count
  // itself on the CPU, which reads it for free, so that nothing is projected for rows no one reads.
  int64_t rows;
} EnactRegionIndex;
static inline int64_t *enact_region_starts(const EnactRegionIndex *r) { return (int64_t *)r->storage->data; }
static inline int64_t *enact_region_lengths(const EnactRegionIndex *r) { return enact_region_starts(r) + r->cap; }
static inline int64_t *enact_region_image_offset(const EnactRegionIndex *r) { return enact_region_lengths(r) + r->cap; }
static inline int64_t *enact_region_cluster_size(const EnactRegionIndex *r) {
  return enact_region_image_offset(r) + r->B + 1;
}
static inline double *enact_region_mean_length(const EnactRegionIndex *r) {
  return (double *)(enact_region_cluster_size(r) + 1);
}
// n int64 values of the index from `values` (a pointer into one of its arrays, as the accessors
// above give) into host: a copy from a GPU (a synchronisation), a read on the CPU.
void enact_region_index_read(const EnactRegionIndex *r, const int64_t *values, int64_t n, int64_t *host);
// Regions given on the host (tests, regions held fixed): L regions, image_offset [B + 1].
EnactRegionIndex enact_region_index_upload(Device dev, const int64_t *starts, const int64_t *lengths, int64_t L,
                                           const int64_t *image_offset, int64_t B);
// The curvature sign of the smoothed map hsm [B, Hp*Wp] (no gradient): +1 where concave, -1
// elsewhere on each image's valid top-left valid_h x valid_w pixels (host [B]), 0 on padding; 2-D
// Sobel curvature or (one_d) along the valid pixels' row-major sequence.
Tensor *op_enact_signs(Tensor *hsm, int64_t Hp, int64_t Wp, const int64_t *valid_h, const int64_t *valid_w, bool one_d);
// The maximal runs of equal sign of signs [B, N] within each image (0 ends a run), on its device
// (cap = B*N: at most one region a pixel).
EnactRegionIndex op_enact_regions(Tensor *signs);
// The authors' chunks of hsm [B, N]: one cluster size c for the batch (the images' mean run length of
// the 1-D curvature sign, rounded), N / c chunks per image after trimming (N mod c) / 2 at the start.
EnactRegionIndex op_enact_official_regions(Tensor *hsm);
// Clustering (the supplement's Eq. 2): K, V [M, d], H [M] -> K' (returned) and V' (*Vc_out),
// [r->rows, d]: row j < L = sum over region j of w_i s_i K_i with w = softmax of H within the region and
// s_i = -signs[i] (signs [M] on K's device, or NULL for s = 1); rows from L on are zero. Gradients
// reach K, V and H (the exact form of Eq. 3; docs/enact.md).
Tensor *op_enact_cluster(Tensor *K, Tensor *V, Tensor *H, Tensor *signs, const EnactRegionIndex *r, Tensor **Vc_out);
// Gaussian smoothing of x [B, Hp*Wp] inside each image's valid top-left valid_h x valid_w region
// (zero outside): rows then columns, or (one_d) along the valid pixels' row-major sequence.
Tensor *op_enact_smooth(Tensor *x, int64_t Hp, int64_t Wp, const int64_t *valid_h, const int64_t *valid_w,
                        const float *taps, int ntaps, bool one_d);
// Attention of each image's queries over that image's clusters only: q [B, N, heads*hd], k, v
// [r->rows, heads*hd] (row j: region j of r; rows from the count on are not read) -> [B, N, heads*hd]; per head
// out_scale dropout_p(softmax(scale q k^T)) v, the dropout drawn from rng (p = 0: none, rng may be
// NULL). No padding to the longest image, nothing read on the host. An image has at most N clusters
// (a region or chunk holds at least one pixel; checked on the CPU): the dropout numbering and the
// GPU's grid rest on it.
Tensor *op_cluster_attention(Tensor *q, Tensor *k, Tensor *v, const EnactRegionIndex *r, int64_t heads, float scale,
                             float out_scale, float p, Rng *rng);
