// The inference path (detr_model_prepare_inference): frozen batch norm folded into the
// convolutions and their epilogues fused (op_conv2d_fused) against the training path's
// conv -> frozen_bn(+residual)(+ReLU), layer by layer within a derived rounding bound, and over the
// whole model.
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "kernels/cpu/conv_onednn.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/norm_math.h"
#include "nn/detr.h"

// The bound. Per output element i of channel o, with A_i = sum_k |x_k| |w_k| over its K = C*KH*KW
// terms and u = 2^-24 (float32's unit roundoff):
//  - training: c = fl(sum x_k w_k), |c - sum x_k w_k| <= gamma_K A_i (any order, FMA or not), then
//    y = fl(fl(c s) + t) (+ r, ReLU): |y - (s sum x_k w_k + t + r)| <= |s| gamma_K A_i + u |s c|
//    + u |c s + t| + u |v| (v the value before the ReLU, r added).
//  - folded: w'_k = fl(w_k s) = w_k s (1 + d_k), |d_k| <= u, then c' = fl(sum x_k w'_k) + t (+ r):
//    |y' - (s sum x_k w_k + t + r)| <= |s| (u + gamma_K (1 + u)) A_i + 2 u |v|.
// The ReLU is 1-Lipschitz, |c| <= A_i (1 + gamma_K) and |v| <= |s| A_i (1 + gamma_K) + |t| + |r|, so
// with gamma_K <= 1.01 K u:  |y - y'| <= u ((2.03 K + 7) |s| A_i + 6 (|t| + |r|)).
static double fold_bound(int64_t K, double s, double A, double t, double r) {
  const double u = ldexp(1.0, -24);
  return u * ((2.03 * (double)K + 7.0) * fabs(s) * A + 6.0 * (fabs(t) + fabs(r)));
}

// A_i = sum |x||w| of a channels-last convolution, in double: x [B, H, W, C], w [O, C, KH, KW],
// a [B, HO, WO, O].
static void abs_conv(const float *x, const float *w, double *a, const Conv2dParams *p, int64_t B, int64_t H, int64_t W,
                     int64_t C, int64_t O, int64_t k, int64_t HO, int64_t WO) {
  for (int64_t b = 0; b < B; b++)
    for (int64_t oy = 0; oy < HO; oy++)
      for (int64_t ox = 0; ox < WO; ox++)
        for (int64_t o = 0; o < O; o++) {
          double acc = 0;
          for (int64_t ky = 0; ky < k; ky++)
            for (int64_t kx = 0; kx < k; kx++) {
              int64_t iy = oy * p->stride_h - p->pad_h + ky * p->dilation_h,
                      ix = ox * p->stride_w - p->pad_w + kx * p->dilation_w;
              if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
              for (int64_t c = 0; c < C; c++)
                acc += fabs(x[((b * H + iy) * W + ix) * C + c]) * fabs(w[((o * C + c) * k + ky) * k + kx]);
            }
          a[((b * HO + oy) * WO + ox) * O + o] = acc;
        }
}

typedef struct {
  int64_t B, C, H, W, O;
  int k, stride;
  bool residual, relu;
} FoldCase;

// One convolution and its norm both ways; returns the largest |y - y'| / bound (<= 1 passes).
static double fold_case(const FoldCase *fc, uint64_t seed) {
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  Conv2d conv =
      conv2d_create(&ps, "c", fc->C, fc->O, fc->k, fc->stride, fc->k / 2, 1, false, PARAM_FROZEN, LR_GROUP_BACKBONE);
  conv.p.channels_last = true;
  FrozenBn bn = frozen_bn_create(&ps, "bn", fc->O);
  bn.channels_last = true;
  Rng rng = rng_make(seed);
  tensor_normal_(conv.weight, &rng, 0.0f, 0.1f);
  tensor_normal_(bn.weight, &rng, 1.0f, 0.5f);
  tensor_normal_(bn.bias, &rng, 0.0f, 0.5f);
  tensor_normal_(bn.running_mean, &rng, 0.0f, 0.5f);
  tensor_uniform_(bn.running_var, &rng, 0.01f, 1.0f);  // small variances: a wrong eps shows
  int64_t HO = conv_out_size(fc->H, fc->k, fc->stride, fc->k / 2, 1),
          WO = conv_out_size(fc->W, fc->k, fc->stride, fc->k / 2, 1);
  Tensor *x = tensor_new(DEVICE_CPU, SHAPE(fc->B, fc->H, fc->W, fc->C));
  Tensor *res = fc->residual ? tensor_new(DEVICE_CPU, SHAPE(fc->B, HO, WO, fc->O)) : NULL;
  tensor_normal_(x, &rng, 0.0f, 1.0f);
  if (res) tensor_normal_(res, &rng, 0.0f, 1.0f);

  bool was = autograd_set_grad_enabled(false);
  ScopeMark mark = tensor_scope_mark();
  Tensor *y = frozen_bn_act_forward(&bn, conv2d_forward(&conv, x), res, fc->relu);
  TensorOwner owner = {0};
  FoldedConv f = frozen_bn_fold(&conv, &bn, &owner);
  Tensor *yf = folded_conv_forward(&f, x, res, fc->relu, false);
  ck_assert(shape_equal(y->shape, yf->shape));
  if (res) {  // accumulating into the residual's own buffer: the same floats
    Tensor *acc = tensor_scoped(tensor_new(DEVICE_CPU, res->shape));
    tensor_copy_(acc, res);
    Tensor *yi = folded_conv_forward(&f, x, acc, fc->relu, true);
    ck_assert_ptr_eq(yi->data, acc->data);
    ck_assert_int_eq(memcmp(yi->data, yf->data, (size_t)yf->numel * sizeof(float)), 0);
  }

  double *a = detr_malloc((size_t)y->numel * sizeof(double), "abs conv");
  abs_conv(x->data, conv.weight->data, a, &conv.p, fc->B, fc->H, fc->W, fc->C, fc->O, fc->k, HO, WO);
  int64_t K = fc->C * fc->k * fc->k;
  double worst = 0;
  for (int64_t i = 0; i < y->numel; i++) {
    int64_t o = i % fc->O;
    float s, t;
    frozen_bn_scale_shift(bn.weight->data[o], bn.bias->data[o], bn.running_mean->data[o], bn.running_var->data[o],
                          FROZEN_BN_EPS, &s, &t);
    double bound = fold_bound(K, s, a[i], t, res ? res->data[i] : 0.0);
    double r = fabs((double)y->data[i] - (double)yf->data[i]) / bound;
    if (r > worst) worst = r;
  }
  free(a);
  folded_conv_free(&f);
  tensor_owner_clear(&owner);
  tensor_scope_release(mark);
  autograd_set_grad_enabled(was);
  tensor_release(x);
  if (res) tensor_release(res);
  params_free(&ps);
  return worst;
}

// Geometries of the backbone's kinds (channels last): the stem's 7x7 stride 2 from 3 channels, 1x1
// with the residual and ReLU (a bottleneck's conv3), 1x1 stride 2 (a downsample), 3x3 stride 2 and
// stride 1 + ReLU; on oneDNN (its post-ops) and on im2col + sgemm (the epilogue loop).
static const FoldCase fold_cases[] = {
    {2, 3, 20, 18, 16, 7, 2, false, true}, {2, 32, 9, 11, 64, 1, 1, true, true}, {1, 32, 10, 9, 48, 1, 2, false, false},
    {2, 24, 9, 10, 24, 3, 2, false, true}, {1, 16, 8, 12, 32, 3, 1, true, true}, {1, 48, 7, 7, 40, 3, 1, false, true},
};

START_TEST(folded_conv_within_bound) {
  ConvImpl impls[2] = {CONV_IMPL_AUTO, CONV_IMPL_IM2COL};
  for (int m = 0; m < (DETR_HAVE_ONEDNN ? 2 : 1); m++) {
    cpu_conv2d_set_impl(impls[DETR_HAVE_ONEDNN ? m : 1]);
    for (size_t i = 0; i < sizeof fold_cases / sizeof fold_cases[0]; i++) {
      double worst = fold_case(&fold_cases[i], 100 + i);
      printf("fold case %zu (%s): max |training - folded| / bound = %.3g\n", i, m ? "im2col" : "auto", worst);
      ck_assert_msg(worst <= 1.0, "case %zu (%s): |training - folded| reaches %.3g x the rounding bound", i,
                    m ? "im2col" : "auto", worst);
      ck_assert_msg(worst > 0.0 || i == 0, "case %zu: the paths agree bit for bit (does the test compare?)", i);
    }
  }
  cpu_conv2d_set_impl(CONV_IMPL_AUTO);
}
END_TEST

// The post-ops on the paths the layer check's small shapes do not reach: oneDNN's Winograd (3x3
// stride 1, 64 channels, 24x24: reorders to its layouts, the residual reordered in for the sum)
// and one image at a time (whole-batch size 0), the residual in a new output and in its own
// buffer, against the same convolution without post-ops followed by op_add and op_relu: the same
// float operations, so the same floats (with AVX-512; without it within a rounding bound, below).
START_TEST(post_ops_match_separate_ops) {
  int64_t before = onednn_conv2d_set_whole_batch_bytes(0);
  bool was = autograd_set_grad_enabled(false);
  ScopeMark mark = tensor_scope_mark();
  Rng rng = rng_make(5);
  Conv2dParams p = {1, 1, 1, 1, 1, 1, .channels_last = true};
  Tensor *x = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(2, 24, 24, 64)));
  Tensor *w = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(64, 64, 3, 3)));
  Tensor *b = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(64)));
  Tensor *res = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(2, 24, 24, 64)));
  tensor_normal_(x, &rng, 0.0f, 1.0f), tensor_normal_(w, &rng, 0.0f, 0.05f);
  tensor_normal_(b, &rng, 0.0f, 0.5f), tensor_normal_(res, &rng, 0.0f, 1.0f);
  Tensor *sep = op_relu(op_add(op_conv2d(x, w, b, p), res));
  Tensor *fused = op_conv2d_fused(x, w, b, res, true, p, NULL);
  Tensor *acc = tensor_scoped(tensor_new(DEVICE_CPU, res->shape));
  tensor_copy_(acc, res);
  Tensor *into = op_conv2d_fused_into(x, w, b, acc, true, p, NULL);
  Tensor *plain = op_conv2d_fused(x, w, b, NULL, false, p, NULL), *conv = op_conv2d(x, w, b, p);
  size_t bytes = (size_t)sep->numel * sizeof(float);
  ck_assert_int_eq(memcmp(plain->data, conv->data, bytes), 0);
  if (!DETR_HAVE_ONEDNN || cpu_has_avx512()) {
    ck_assert_int_eq(memcmp(fused->data, sep->data, bytes), 0);
    ck_assert_int_eq(memcmp(into->data, sep->data, bytes), 0);
  } else {
    // Without AVX-512 oneDNN 2.6 runs the convolution with a sum post-op on a kernel that sums in
    // another order than without one (jit:avx2: about half the outputs differ, by up to 9e-6 of
    // |conv| + |res|). There: the bound of two fp32 sums of K products in any order (each within
    // gamma_K A of the exact sum, A = sum |x| |w|, gamma_K <= 1.01 K u; the bias counted among the
    // terms, as a kernel may start its sums at it), the residual added with one rounding a side, the
    // ReLU 1-Lipschitz: u ((2.03 K + 6) (A + |b|) + 2 |r|).
    double *a = detr_malloc((size_t)sep->numel * sizeof(double), "abs conv");
    abs_conv(x->data, w->data, a, &p, 2, 24, 24, 64, 64, 3, 24, 24);
    const double u = ldexp(1.0, -24), K = 64 * 9;
    double worst = 0;
    for (int64_t i = 0; i < sep->numel; i++) {
      double bound = u * ((2.03 * K + 6) * (a[i] + fabs(b->data[i % 64])) + 2 * fabs(res->data[i]));
      double r = fmax(fabs((double)fused->data[i] - sep->data[i]), fabs((double)into->data[i] - sep->data[i])) / bound;
      if (r > worst) worst = r;
    }
    free(a);
    printf("post-ops check without AVX-512: max |fused - separate| / bound = %.3g\n", worst);
    ck_assert_msg(worst <= 1.0, "fused and separate differ by %.3g x the bound", worst);
  }
  ConvGeom g = {.batch = 1,
                .in_ch = 64,
                .in_h = 24,
                .in_w = 24,
                .out_ch = 64,
                .out_h = 24,
                .out_w = 24,
                .kh = 3,
                .kw = 3,
                .stride_h = 1,
                .stride_w = 1,
                .pad_h = 1,
                .pad_w = 1,
                .dil_h = 1,
                .dil_w = 1,
                .channels_last = true};
  printf("post-ops check: the geometry's forward runs on %s\n",
         DETR_HAVE_ONEDNN ? onednn_conv2d_impl(&g, CONV_PASS_FWD, cpu_conv2d_impl(&g, CONV_PASS_FWD)) : "im2col");
  tensor_scope_release(mark);
  autograd_set_grad_enabled(was);
  onednn_conv2d_set_whole_batch_bytes(before);
}
END_TEST

// Inference's linear (op_linear recording nothing: the bias and ReLU in the GEMM's epilogue,
// cpu_linear_fused) against the training path's (op_linear recorded: sgemm, then the bias pass)
// within the bound of two fp32 sums of K = in products in any order: each within gamma_K A of the
// exact sum, A = sum_k |x_k| |w_k|; the bias added in fp32 (u |v|, v the sum, each side) and the
// ReLU 1-Lipschitz: |y - y'| <= u ((2.03 K + 4) A + 2 |b|) with gamma_K <= 1.01 K u. Shapes of the
// main job's transformer (10 queries, 196 pixels, 47 clusters, hidden 128, ffn 512, heads of 14 and
// 4) and a row; with and without bias and ReLU. An epilogue that dropped the bias or the ReLU, or a
// transposed weight, fails it by far more than the bound.
START_TEST(linear_fused_within_bound) {
  static const int64_t shapes[][3] = {{10, 128, 128}, {196, 128, 512}, {196, 512, 128}, {47, 128, 128},
                                      {10, 128, 14},  {10, 128, 4},    {1, 3, 5}};
  const double u = ldexp(1.0, -24);
  Rng rng = rng_make(11);
  int fused_runs = 0;
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (int variant = 0; variant < 4; variant++) {
      bool with_bias = variant & 1, relu = variant & 2;
      int64_t rows = shapes[si][0], in = shapes[si][1], out = shapes[si][2];
      ScopeMark mark = tensor_scope_mark();
      Tensor *x = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(rows, in)));
      Tensor *w = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(out, in)));
      Tensor *b = with_bias ? tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(out))) : NULL;
      tensor_normal_(x, &rng, 0.0f, 1.0f), tensor_normal_(w, &rng, 0.0f, 0.1f);
      if (b) tensor_normal_(b, &rng, 0.0f, 0.5f);
      w->requires_grad = true;  // recorded while grad mode is on: the training path
      Tensor *train = relu ? op_linear_relu(x, w, b) : op_linear(x, w, b);
      autograd_clear_tape();
      bool was = autograd_set_grad_enabled(false);
      Tensor *infer = relu ? op_linear_relu(x, w, b) : op_linear(x, w, b);
      autograd_set_grad_enabled(was);
      Tensor *kernel = tensor_scoped(tensor_new(DEVICE_CPU, infer->shape));  // the op ran the fused kernel
      if (cpu_linear_fused(x->data, w->data, b ? b->data : NULL, relu, kernel->data, rows, in, out)) {
        fused_runs++;
        ck_assert_int_eq(memcmp(kernel->data, infer->data, (size_t)infer->numel * sizeof(float)), 0);
      }
      double worst = 0;  // |difference| / bound, over the elements
      for (int64_t r = 0; r < rows; r++)
        for (int64_t o = 0; o < out; o++) {
          double a = 0;
          for (int64_t k = 0; k < in; k++) a += fabs((double)x->data[r * in + k] * w->data[o * in + k]);
          double bound = u * ((2.03 * (double)in + 4.0) * a + 2.0 * (b ? fabs(b->data[o]) : 0.0));
          double d = fabs((double)train->data[r * out + o] - infer->data[r * out + o]);
          ck_assert_msg(d <= bound, "%lldx%lldx%lld bias %d relu %d: [%lld, %lld] differs by %.3g, bound %.3g",
                        (long long)rows, (long long)in, (long long)out, with_bias, relu, (long long)r, (long long)o, d,
                        bound);
          if (d / bound > worst) worst = d / bound;
        }
      if (variant == 3)
        printf("linear %lldx%lldx%lld: inference within %.3g of the bound\n", (long long)rows, (long long)in,
               (long long)out, worst);
      tensor_scope_release(mark);
    }
  // With oneDNN the op's inference output above is the fused kernel's (the memcmp, on every shape):
  // the comparison was not of the training path with itself.
  ck_assert_int_eq(fused_runs, DETR_HAVE_ONEDNN ? 28 : 0);
  // Non-finite inputs: the ReLU takes NaN to 0 and keeps inf, as the training path's (exact sums of
  // small integers, so the floats are equal).
  float xs[8] = {NAN, 1, 1, 1, INFINITY, -1, 0, 2}, ws[12] = {1, 0, 0, 0, 0, 1, 0, 0, 1, 1, 1, 1},
        bs[3] = {0.5f, -1, 2};
  ScopeMark mark = tensor_scope_mark();
  Tensor *x = tensor_scoped(tensor_from_host(DEVICE_CPU, SHAPE(2, 4), xs));
  Tensor *w = tensor_scoped(tensor_from_host(DEVICE_CPU, SHAPE(3, 4), ws));
  Tensor *b = tensor_scoped(tensor_from_host(DEVICE_CPU, SHAPE(3), bs));
  w->requires_grad = true;
  Tensor *train = op_linear_relu(x, w, b);
  autograd_clear_tape();
  bool was = autograd_set_grad_enabled(false);
  Tensor *infer = op_linear_relu(x, w, b);
  autograd_set_grad_enabled(was);
  for (int i = 0; i < 6; i++)
    ck_assert_msg(!memcmp(&train->data[i], &infer->data[i], 4),
                  "non-finite input, output %d: inference %g, training %g", i, infer->data[i], train->data[i]);
  tensor_scope_release(mark);
}
END_TEST

// The cross-attention with its projections moved onto the queries (attention_fold_projections)
// against the projections then attention_heads, within a bound derived for each path's rounding
// from the exact value (in double), u = 2^-24, gamma_n <= 1.01 n u:
//  - logits: each path's head-h logit of (q, j) is within 1.01 n_L u M_L of the exact one up to a
//    constant over j (the keys' biases, which one path adds and the other drops), where
//    M_L = scale sum_t sum_{r in h} |q_t,r| (sum_c |W_t,rc| |x_t,jc| + |b_t,r|) and n_L = T din + T hd + 4
//    (projection, product and the scaling: one sum of din + T hd terms on one side, hd + T din on the other).
//    Softmax subtracts the row's maximum m in fp32 (u |L_j - m| more), so with e the largest of
//    these over a row, P_j = P*_j (1 + r), |r| <= e^(2e) - 1 + 6u (exp_poly's 1.5 ulp, the
//    reciprocal and the product: rel_P).
//  - outputs: out_r = sum_j P_j (W_v,r . x_v,j + b_v,r); with V_jr = sum_c |W_v,rc| |x_v,jc| + |b_v,r|,
//    both paths are within (rel_P + 1.01 (L + dv_in + 3) u) (1 + rel_P) sum_j P*_j V_jr of it (the
//    value projection and the weighted sum in either order; the bias is b_v sum_j P_j = b_v).
// The test requires |folded - projected| <= twice that. A dropped value bias, a head's rows mixed up,
// or a transposed weight fails it by orders of magnitude. Shapes: the main job's decoder (2 terms:
// content and position, 4 heads of 32, 10 queries, 196 keys) and DETR's (1 term, 8 heads of 16),
// image 1 padded at its last keys.
typedef struct {
  int64_t B, Q, L, d, heads, n_terms;
  bool last_image_padded;  // every key of the last image padding (else its last L/5): outputs 0 both ways
} FoldAttnCase;

static Tensor *concat_head_parts(Tensor *const *parts, int n, int64_t heads) {  // [B, L, d] each -> [B, L, n d]
  int64_t B = parts[0]->shape.d[0], L = parts[0]->shape.d[1], d = parts[0]->shape.d[2];
  Tensor *r[ATTN_MAX_KEY_TERMS];
  for (int t = 0; t < n; t++) r[t] = op_reshape(parts[t], SHAPE(B, L, heads, d / heads));
  return op_reshape(op_concat(r, n, 3), SHAPE(B, L, n * d));
}

static double fold_attention_case(const FoldAttnCase *c, uint64_t seed) {
  const double u = ldexp(1.0, -24);
  int64_t B = c->B, Q = c->Q, L = c->L, d = c->d, H = c->heads, T = c->n_terms, hd = d / H;
  Rng rng = rng_make(seed);
  ScopeMark mark = tensor_scope_mark();
  Tensor *q[ATTN_MAX_KEY_TERMS], *w[ATTN_MAX_KEY_TERMS], *bias[ATTN_MAX_KEY_TERMS], *x[ATTN_MAX_KEY_TERMS];
  AttnKeyTerm terms[ATTN_MAX_KEY_TERMS];
  for (int t = 0; t < T; t++) {
    q[t] = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(B, Q, d))),
    w[t] = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(d, d)));
    bias[t] = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(d))),
    x[t] = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(B, L, d)));
    tensor_normal_(q[t], &rng, 0.0f, 1.0f), tensor_normal_(w[t], &rng, 0.0f, 0.1f);
    tensor_normal_(bias[t], &rng, 0.0f, 0.5f), tensor_normal_(x[t], &rng, 0.0f, 1.0f);
    terms[t] = (AttnKeyTerm){.query = q[t], .weight = w[t], .keys = x[t]};
  }
  Tensor *wv = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(d, d))),
         *bv = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(d)));
  Tensor *xv = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(B, L, d)));
  tensor_normal_(wv, &rng, 0.0f, 0.1f), tensor_normal_(bv, &rng, 0.0f, 0.5f), tensor_normal_(xv, &rng, 0.0f, 1.0f);
  float *mask_host = detr_calloc((size_t)(B * L), sizeof(float), "mask");  // the last image's last L/5 keys padded
  for (int64_t j = c->last_image_padded ? 0 : L - L / 5; j < L; j++) mask_host[(B - 1) * L + j] = -INFINITY;
  Tensor *mask = tensor_scoped(tensor_from_host(DEVICE_CPU, SHAPE(B, L), mask_host));
  float scale = 1.0f / sqrtf((float)(T * hd));  // attention_heads' own: heads of T hd

  bool was = autograd_set_grad_enabled(false);
  Tensor *keys[ATTN_MAX_KEY_TERMS];
  for (int t = 0; t < T; t++) keys[t] = op_linear(x[t], w[t], bias[t]);
  Tensor *proj_weights = NULL, *fold_weights = NULL;
  Tensor *projected = attention_heads(&(NnCtx){0}, concat_head_parts(q, (int)T, H), concat_head_parts(keys, (int)T, H),
                                      op_linear(xv, wv, bv), H, mask, 0.0f, &proj_weights);
  Tensor *folded = attention_fold_projections(terms, (int)T, wv, bv, xv, H, scale, mask, &fold_weights);
  autograd_set_grad_enabled(was);

  double worst = 0;
  int64_t n_l = T * d + T * hd + 4;
  double *logit = detr_malloc((size_t)L * 2 * sizeof(double), "logits"), *mag = logit + L;
  double *weight_bound = detr_calloc((size_t)(B * Q * L), sizeof(double), "weight bounds");  // [B, Q, L]
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t iq = 0; iq < Q; iq++) {
        if (c->last_image_padded && b == B - 1) {  // no distribution: the weights and outputs are zeros
          for (int64_t r = h * hd; r < (h + 1) * hd; r++)
            ck_assert_msg(folded->data[(b * Q + iq) * d + r] == 0 && projected->data[(b * Q + iq) * d + r] == 0,
                          "a row whose keys are all padding: folded %g, projected %g (0 both)",
                          folded->data[(b * Q + iq) * d + r], projected->data[(b * Q + iq) * d + r]);
          continue;
        }
        double m = -INFINITY;
        for (int64_t j = 0; j < L; j++) {  // exact logits (with the keys' biases) and their M_L
          double l = 0, a = 0;
          for (int64_t t = 0; t < T; t++)
            for (int64_t r = h * hd; r < (h + 1) * hd; r++) {
              double qv = q[t]->data[(b * Q + iq) * d + r], k = bias[t]->data[r], ka = fabs(k);
              for (int64_t cc = 0; cc < d; cc++) {
                double p = (double)w[t]->data[r * d + cc] * x[t]->data[(b * L + j) * d + cc];
                k += p, ka += fabs(p);
              }
              l += qv * k, a += fabs(qv) * ka;
            }
          logit[j] = scale * l, mag[j] = scale * a;
          if (mask_host[b * L + j] == 0 && logit[j] > m) m = logit[j];
        }
        double e = 0, sum = 0;
        for (int64_t j = 0; j < L; j++)
          if (mask_host[b * L + j] == 0) {
            e = fmax(
                e, 1.01 * (double)n_l * u * mag[j] + 1.01 * u * (fabs(logit[j] - m) + 2.02 * (double)n_l * u * mag[j]));
            sum += exp(logit[j] - m);
          }
        double rel_p = expm1(2 * e) + 6 * u;
        for (int64_t j = 0; j < L; j++)  // each path's weight within rel_P of the exact one; their head mean
          if (mask_host[b * L + j] == 0)
            weight_bound[(b * Q + iq) * L + j] += 2 * rel_p * exp(logit[j] - m) / sum / (double)H;
        for (int64_t r = h * hd; r < (h + 1) * hd; r++) {
          double exact = 0, pv = 0;
          for (int64_t j = 0; j < L; j++) {
            if (mask_host[b * L + j] != 0) continue;
            double p = exp(logit[j] - m) / sum, v = bv->data[r], va = fabs(v);
            for (int64_t cc = 0; cc < d; cc++) {
              double t = (double)wv->data[r * d + cc] * xv->data[(b * L + j) * d + cc];
              v += t, va += fabs(t);
            }
            exact += p * v, pv += p * va;
          }
          double bound = (rel_p + 1.01 * (double)(L + d + 3) * u) * (1 + rel_p) * pv;
          double diff = fabs((double)folded->data[(b * Q + iq) * d + r] - projected->data[(b * Q + iq) * d + r]);
          ck_assert_msg(diff <= 2 * bound,
                        "B%lld Q%lld L%lld d%lld heads %lld terms %lld: out[%lld, %lld, %lld] folded %.9g, "
                        "projected %.9g (exact %.9g): differs by %.3g, bound %.3g",
                        (long long)B, (long long)Q, (long long)L, (long long)d, (long long)H, (long long)T,
                        (long long)b, (long long)iq, (long long)r, folded->data[(b * Q + iq) * d + r],
                        projected->data[(b * Q + iq) * d + r], exact, diff, 2 * bound);
          worst = fmax(worst, diff / (2 * bound));
        }
      }
  // The weights averaged over the heads: each head's within rel_P of the exact one, both ways, so
  // the two within twice the mean of those (plus the mean's own rounding).
  for (int64_t i = 0; i < proj_weights->numel; i++) {
    double bound = weight_bound[i] + 2 * (H + 1) * u * fabs(proj_weights->data[i]);
    ck_assert_msg(fabs((double)fold_weights->data[i] - proj_weights->data[i]) <= bound,
                  "weights %lld: folded %g, projected %g, bound %.3g", (long long)i, fold_weights->data[i],
                  proj_weights->data[i], bound);
  }
  free(weight_bound);
  free(logit);
  free(mask_host);
  tensor_scope_release(mark);
  return worst;
}

START_TEST(attention_fold_within_bound) {
  static const FoldAttnCase cases[] = {{2, 10, 196, 128, 4, 2, false},
                                       {2, 10, 150, 128, 8, 1, false},
                                       {1, 3, 40, 32, 2, 2, false},
                                       {2, 10, 60, 64, 2, 2, true}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const FoldAttnCase *c = &cases[i];
    int64_t widths[ATTN_MAX_KEY_TERMS] = {c->d, c->d, c->d, c->d};
    double worst = fold_attention_case(c, 40 + i);
    printf("attention fold %lld queries x %lld keys, %lld heads, %lld terms: within %.3g of the bound (pays: %d)\n",
           (long long)c->Q, (long long)c->L, (long long)c->heads, (long long)c->n_terms, worst,
           attention_fold_pays(DEVICE_CPU, c->Q, c->L, c->d, c->heads, widths, (int)c->n_terms, c->d));
  }
  // Where it pays: the main job's decoder (10 queries, 4 heads of 32, 196 keys) and not DETR-R50's
  // (100 queries, 8 heads of 32, 850 keys).
  int64_t w128[2] = {128, 128}, w256 = 256;
  ck_assert(attention_fold_pays(DEVICE_CPU, 10, 196, 128, 4, w128, 2, 128));
  ck_assert(!attention_fold_pays(DEVICE_CPU, 100, 850, 256, 8, &w256, 1, 256));
}
END_TEST

// A weight pack (the weight's reordered copies kept between forwards) gives the same floats as
// reordering each call, through changes of layout: channels last (oneDNN's brgemm convolution
// above 128 channels, its own weight layout) and nchw (the direct one on blocked activations,
// another), each again after the other from the kept copy, and in bf16 where the CPU has it (bf16
// copies). A pack that returned a copy of another layout fails this.
START_TEST(weight_pack_matches_reordering) {
  bool was = autograd_set_grad_enabled(false);
  ScopeMark mark = tensor_scope_mark();
  Rng rng = rng_make(7);
  Tensor *w = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(256, 256, 3, 3)));
  Tensor *b = tensor_scoped(tensor_new(DEVICE_CPU, SHAPE(256)));
  tensor_normal_(w, &rng, 0.0f, 0.02f), tensor_normal_(b, &rng, 0.0f, 0.5f);
  ConvWeightPack *pack = conv_weight_pack_new();
  const bool last[] = {true, false, true, false};
  for (int bf16 = 0; bf16 < (cpu_bf16_supported(NULL, 0) ? 2 : 1); bf16++) {
    cpu_set_bf16(bf16);
    // oneDNN's direct convolution, AUTO's choice here with AVX-512; without it AUTO takes im2col
    // from 128 channels (conv.c), which has no pack to test
    if (DETR_HAVE_ONEDNN) cpu_conv2d_set_impl(bf16 ? CONV_IMPL_ONEDNN_BF16 : CONV_IMPL_ONEDNN);
    for (size_t i = 0; i < sizeof last / sizeof last[0]; i++) {
      Conv2dParams p = {1, 1, 1, 1, 1, 1, .channels_last = last[i]};
      Tensor *x = tensor_scoped(tensor_new(DEVICE_CPU, last[i] ? SHAPE(2, 8, 8, 256) : SHAPE(2, 256, 8, 8)));
      tensor_normal_(x, &rng, 0.0f, 1.0f);
      Tensor *packed = op_conv2d_fused(x, w, b, NULL, true, p, pack);
      Tensor *plain = op_conv2d_fused(x, w, b, NULL, true, p, NULL);
      ck_assert_msg(!memcmp(packed->data, plain->data, (size_t)plain->numel * sizeof(float)),
                    "%s %s: the packed weight's output differs", last[i] ? "channels last" : "nchw",
                    bf16 ? "bf16" : "fp32");
    }
  }
  cpu_set_bf16(false);
  cpu_conv2d_set_impl(CONV_IMPL_AUTO);
  conv_weight_pack_free(pack);
  tensor_scope_release(mark);
  autograd_set_grad_enabled(was);
}
END_TEST

// A pack is bound to the weight it was first used with: another weight through it fails (exit 1).
START_TEST(weight_pack_refuses_another_weight) {
  autograd_set_grad_enabled(false);
  Conv2dParams p = {1, 1, 1, 1, 1, 1, .channels_last = true};
  Tensor *x = tensor_ones(DEVICE_CPU, SHAPE(1, 8, 8, 32));
  Tensor *w1 = tensor_ones(DEVICE_CPU, SHAPE(32, 32, 3, 3)), *w2 = tensor_ones(DEVICE_CPU, SHAPE(32, 32, 3, 3));
  ConvWeightPack *pack = conv_weight_pack_new();
  op_conv2d_fused(x, w1, NULL, NULL, false, p, pack);
  op_conv2d_fused(x, w2, NULL, NULL, false, p, pack);
}
END_TEST

// op_conv2d_fused refuses to run with grad mode on (it records no backward): exit 1.
START_TEST(fused_refuses_grad_mode) {
  Tensor *x = tensor_new(DEVICE_CPU, SHAPE(1, 4, 4, 2)), *w = tensor_new(DEVICE_CPU, SHAPE(2, 2, 1, 1));
  tensor_fill_(x, 1.0f);
  tensor_fill_(w, 1.0f);
  op_conv2d_fused(x, w, NULL, NULL, true, (Conv2dParams){1, 1, 0, 0, 1, 1, .channels_last = true}, NULL);
}
END_TEST

// The whole model: a small ResNet-50 or ResNet-18 DETR with every norm calibrated and perturbed, the folded
// forward's logits and boxes against the training path's. Each layer's rounding is bounded above
// (folded_conv_within_bound); through 17 blocks the differences grow (in this model from 6e-7 of
// the range after the stem to 1.3e-4 after the last block, where im2col + sgemm instead of oneDNN,
// another summation order, moves it by 2e-5), which no bound derived here covers. So the model
// check is a sanity limit, 2^-10 of each output's range, with the measured figures printed beside
// two float32 references: the same model with every backbone weight moved by one ulp (at random up
// or down, at least the fold's half-ulp rounding) and on im2col + sgemm. A wrong fold (a wrong eps,
// a missed norm, a dropped residual) is caught by the layer check or moves the outputs by far more.
static double max_rel(const Tensor *a, const Tensor *b) {
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < a->numel; i++) scale = fmax(scale, fabs(a->data[i]));
  for (int64_t i = 0; i < a->numel; i++) worst = fmax(worst, fabs((double)a->data[i] - b->data[i]));
  return worst / (scale > 0 ? scale : 1);
}

static void model_outputs(DetrModel *m, Tensor *images, const uint8_t *mask, float *out, int64_t n_logits,
                          int64_t n_boxes) {
  bool was = autograd_set_grad_enabled(false);
  ScopeMark mark = tensor_scope_mark();
  NnCtx ctx = {.training = false};
  DetrOutput o;
  char err[256];
  ck_assert_int_eq(detr_model_forward(m, &ctx, images, mask, &o, err, sizeof err), 0);
  const DetrLayerOutput *last = &o.layers[o.n_layers - 1];
  ck_assert_int_eq(last->logits->numel, n_logits);
  ck_assert_int_eq(last->boxes->numel, n_boxes);
  memcpy(out, last->logits->data, (size_t)n_logits * sizeof(float));
  memcpy(out + n_logits, last->boxes->data, (size_t)n_boxes * sizeof(float));
  detr_output_free(&o);
  tensor_scope_release(mark);
  autograd_set_grad_enabled(was);
}

// The last layer's logits of a forward with grad mode on (recorded), into out [n_logits].
static void recorded_logits(DetrModel *m, Tensor *images, const uint8_t *mask, float *out, int64_t n_logits) {
  ScopeMark mark = tensor_scope_mark();
  NnCtx ctx = {.training = false};
  DetrOutput o;
  char err[256];
  ck_assert_int_eq(detr_model_forward(m, &ctx, images, mask, &o, err, sizeof err), 0);
  memcpy(out, o.layers[o.n_layers - 1].logits->data, (size_t)n_logits * sizeof(float));
  detr_output_free(&o);
  tensor_scope_release(mark);
  autograd_clear_tape();
}

// Every backbone convolution weight one ulp up or down at random (on), or back (off: the same
// draws, as the rng is copied).
static void perturb_backbone(DetrModel *m, Rng *rng, bool on) {
  static Rng saved;
  if (on) saved = *rng;
  Rng r = saved;
  for (int i = 0; i < m->params.count; i++) {
    Param *p = &m->params.items[i];
    if (p->tensor->shape.ndim != 4 || strncmp(p->name, "backbone.", 9)) continue;
    for (int64_t k = 0; k < p->tensor->numel; k++) {
      float *w = &p->tensor->data[k];
      bool up = rng_next_uniform(&r) < 0.5f;
      *w = nextafterf(*w, (up == on) ? INFINITY : -INFINITY);
    }
  }
}

// _i: 0 a ResNet-50 (bottleneck blocks), 1 a ResNet-18 (basic blocks), both of width 16; 2 the main
// job's shape of model (ResNet-18 to stride 16, Conditional DETR's decoder, hidden 128 in 4 heads,
// 10 queries), whose cross-attention runs with its projections moved onto the queries as well
// (attention_fold_within_bound).
START_TEST(folded_model_matches_training_forward) {
  DetrConfig cfg;
  ck_assert_int_eq(detr_config_preset("tiny", &cfg), 0);
  cfg.backbone_depth = _i ? 18 : 50;
  cfg.backbone_width = 16;
  if (_i == 2) {
    static const char *const sets[][2] = {{"decoder", "conditional"}, {"backbone_layers", "3"},
                                          {"hidden_dim", "128"},      {"nheads", "4"},
                                          {"ffn_dim", "256"},         {"dec_layers", "3"}};
    char err[256];
    for (size_t k = 0; k < sizeof sets / sizeof *sets; k++)
      ck_assert_msg(detr_config_set(&cfg, sets[k][0], sets[k][1], err, sizeof err) == 0, "%s", err);
    int64_t widths[2] = {128, 128};  // 6 x 8 tokens of the 96 x 128 images at stride 16
    ck_assert(attention_fold_pays(DEVICE_CPU, cfg.num_queries, 48, 128, 4, widths, 2, 128));
  }
  DetrModel *m = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(m, 7);
  Rng rng = rng_make(8);
  if (_i == 2)  // Conditional DETR starts every box at its reference point (a zero last layer): not here
    tensor_normal_(m->bbox_embed.layers[m->bbox_embed.n_layers - 1].weight, &rng, 0.0f, 0.1f);
  Tensor *images = tensor_new(DEVICE_CPU, SHAPE(2, 96, 128, 3));
  tensor_normal_(images, &rng, 0.0f, 1.0f);
  resnet_calibrate(&m->backbone, images);      // the activations stay normalised, as with real statistics
  for (int i = 0; i < m->params.count; i++) {  // and the affine parts away from the identity
    Param *p = &m->params.items[i];
    if (p->kind == PARAM_BUFFER && strstr(p->name, "bn") && strstr(p->name, ".weight"))
      tensor_uniform_(p->tensor, &rng, 0.5f, 1.5f);
    if (p->kind == PARAM_BUFFER && strstr(p->name, "bn") && strstr(p->name, ".bias"))
      tensor_normal_(p->tensor, &rng, 0.0f, 0.2f);
  }
  uint8_t *mask = detr_calloc(2 * 96 * 128, 1, "mask");
  for (int y = 0; y < 96; y++)
    for (int x = 100; x < 128; x++) mask[96 * 128 + y * 128 + x] = 1;  // image 1 padded on the right
  int64_t nl = 2 * cfg.num_queries * (cfg.num_classes + detr_classes(&cfg)->extra_columns),
          nb = 2 * cfg.num_queries * 4;
  float *train = detr_malloc((size_t)(3 * (nl + nb)) * sizeof(float), "outputs");
  float *im2col = train + nl + nb, *folded = im2col + nl + nb;
  model_outputs(m, images, mask, train, nl, nb);
  cpu_conv2d_set_impl(CONV_IMPL_IM2COL);
  model_outputs(m, images, mask, im2col, nl, nb);
  cpu_conv2d_set_impl(CONV_IMPL_AUTO);
  float *recorded = detr_malloc((size_t)(2 * nl) * sizeof(float), "logits");  // before, after
  recorded_logits(m, images, mask, recorded, nl);
  float *ulp = detr_malloc((size_t)(nl + nb) * sizeof(float), "outputs");
  perturb_backbone(m, &rng, true);
  model_outputs(m, images, mask, ulp, nl, nb);
  perturb_backbone(m, &rng, false);
  detr_model_prepare_inference(m);  // from here on the forward with grad mode off runs the folded copies
  model_outputs(m, images, mask, folded, nl, nb);
  const DecoderKind *dk = detr_decoder(&m->cfg);
  if (dk->release_inference) {  // the decoder's prepared query terms are the floats its forward computes
    float *computed = detr_malloc((size_t)(nl + nb) * sizeof(float), "outputs");
    dk->release_inference(m->decoder_state);
    model_outputs(m, images, mask, computed, nl, nb);
    ck_assert_msg(!memcmp(computed, folded, (size_t)(nl + nb) * sizeof(float)),
                  "the decoder's prepared terms change the outputs");
    dk->prepare_inference(m->decoder_state, m->query_embed, &m->params.derived);
    free(computed);
  }
  for (int part = 0; part < 2; part++) {  // logits, boxes
    int64_t off = part ? nl : 0, n = part ? nb : nl;
    Tensor ta = {.numel = n, .data = train + off}, ti = {.numel = n, .data = im2col + off},
           tf = {.numel = n, .data = folded + off}, tu = {.numel = n, .data = ulp + off};
    double order = max_rel(&ta, &ti), weights = max_rel(&ta, &tu), fold = max_rel(&ta, &tf);
    printf(
        "%s: folded vs training %.3g; weights 1 ulp off %.3g, im2col vs oneDNN %.3g (max |difference| / max |value|)\n",
        part ? "boxes" : "logits", fold, weights, order);
    ck_assert_msg(fold > 0, "%s: the folded path gives the training path's floats: is it used?",
                  part ? "boxes" : "logits");
    ck_assert_msg(fold <= 0x1p-10,
                  "%s: folded differs by %.3g of the range (one ulp of the weights: %.3g, another "
                  "summation order: %.3g)",
                  part ? "boxes" : "logits", fold, weights, order);
  }
  free(ulp);
  // With grad mode on neither the folded copies nor the folded attention are used: the training
  // path, the same floats as a recorded forward before the model was prepared.
  recorded_logits(m, images, mask, recorded + nl, nl);
  ck_assert_int_eq(memcmp(recorded, recorded + nl, (size_t)nl * sizeof(float)), 0);
  free(mask);
  free(train);
  free(recorded);
  tensor_release(images);
  detr_model_free(m);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("infer");
  TCase *tc = tcase_create("fold");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, folded_conv_within_bound);
  tcase_add_test(tc, post_ops_match_separate_ops);
  tcase_add_test(tc, linear_fused_within_bound);
  tcase_add_test(tc, attention_fold_within_bound);
  tcase_add_test(tc, weight_pack_matches_reordering);
  if (DETR_HAVE_ONEDNN) tcase_add_exit_test(tc, weight_pack_refuses_another_weight, 1);
  tcase_add_exit_test(tc, fused_refuses_grad_mode, 1);
  tcase_add_loop_test(tc, folded_model_matches_training_forward, 0, 3);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
