// ENACT: regions, filters, the erratum in the supplement's Eq. 3, and the clustering op against a
// dense implementation of the same math (a masked softmax over a cluster-assignment matrix).
#define _DEFAULT_SOURCE  // mkdtemp, M_PI
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "nn/detr.h"
#include "nn/enact.h"
#include "nn/model_io.h"
#include "tests/gradcheck.h"

// Two images on a 3x4 grid; image 1 is valid in its top-left 2x3.
static void two_images(EnactGeometry *g) {
  uint8_t pad[24] = {0};
  for (int i = 12; i < 24; i++) pad[i] = ((i - 12) / 4 >= 2) || ((i - 12) % 4 >= 3);
  char err[128];
  ck_assert_int_eq(enact_geometry(pad, 2, 3, 4, g, err, sizeof err), 0);
}

START_TEST(geometry_and_regions) {
  EnactGeometry g;
  two_images(&g);
  ck_assert_int_eq(g.valid_h[1], 2);
  ck_assert_int_eq(g.valid_w[1], 3);
  // Image 0: + + + - / + + + + / + - - -   Image 1: - - - . / + - - . / . . . .
  float signs[24] = {1, 1, 1, -1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, 0, 1, -1, -1, 0, 0, 0, 0, 0};
  EnactRegions r;
  enact_find_regions(signs, &g, &r);
  // Runs continue across rows of image 0 (no padding between them); image 1 starts a new region
  // although its first sign equals image 0's last; padding ends a run.
  int64_t starts[] = {0, 3, 4, 9, 12, 16, 17}, lengths[] = {3, 1, 5, 3, 3, 1, 2};
  ck_assert_int_eq(r.count, 7);
  for (int j = 0; j < 7; j++) {
    ck_assert_int_eq(r.starts[j], starts[j]);
    ck_assert_int_eq(r.lengths[j], lengths[j]);
  }
  ck_assert_int_eq(r.image_offset[0], 0);
  ck_assert_int_eq(r.image_offset[1], 4);
  ck_assert_int_eq(r.image_offset[2], 7);
  enact_regions_free(&r);
  uint8_t holes[12] = {0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};  // padding not at the bottom/right
  EnactGeometry bad;
  char err[128];
  ck_assert_int_eq(enact_geometry(holes, 1, 3, 4, &bad, err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "top-left rectangle"));
  enact_geometry_free(&g);
}
END_TEST

START_TEST(filters) {
  float taps[64];
  ck_assert_int_eq(enact_gaussian_taps(3.0f, taps), 17);  // x in [-8, 8]
  ck_assert_double_eq_tol(taps[8], 1.0 / (3.0 * sqrt(2 * M_PI)), 1e-7);
  ck_assert_double_eq_tol(taps[0], exp(-64.0 / 18.0) / (3.0 * sqrt(2 * M_PI)), 1e-8);
  // A bump in the middle of a flat 5x5 map is concave at its centre (C > 0), convex around it.
  EnactGeometry g = {.B = 1, .Hp = 5, .Wp = 5};
  int64_t vh = 5, vw = 5;
  g.valid_h = &vh;
  g.valid_w = &vw;
  float map[25] = {0}, signs[25];
  map[12] = 1.0f;
  enact_curvature_sign(map, &g, false, signs);
  ck_assert_float_eq(signs[12], 1.0f);
  ck_assert_float_eq(signs[6], -1.0f);  // diagonal neighbour: C = -2 < 0
  enact_curvature_sign(map, &g, true, signs);
  ck_assert_float_eq(signs[12], 1.0f);   // 1-D: 2 * 1 - 0 - 0 > 0
  ck_assert_float_eq(signs[11], -1.0f);  // -1 * 1 < 0
}
END_TEST

// The supplement's printed Eq. 3: dK'/dH_i = -w_i (sum_k exp(H_k) / S^2 K_k + K_i), S = sum_k exp(H_k).
// Finite differences agree with the exact form w_i (K_i - K'_j) and not with the printed one.
START_TEST(erratum_in_eq3) {
  int64_t starts[1] = {0}, lengths[1] = {4};
  Tensor *K = test_uniform(SHAPE(4, 3), -1, 1, 1, true), *V = test_uniform(SHAPE(4, 3), -1, 1, 2, true);
  Tensor *H = test_uniform(SHAPE(4), -1, 1, 3, true);
  Tensor *R = test_uniform(SHAPE(2, 3), -1, 1, 4, false);  // dL/dK'_0 = R[0], dL/dV'_0 = R[1]
  ScopeMark mark = tensor_scope_mark();
  EnactRegionIndex one = enact_region_index_upload(DEVICE_CPU, starts, lengths, 1, (int64_t[]){0, 1}, 1);
  Tensor *vc, *kc = op_enact_cluster(K, V, H, NULL, &one, &vc);
  Tensor *both[2] = {kc, vc};
  autograd_backward(op_sum_all(op_mul(op_concat(both, 2, 0), R)));
  double S = 0;
  for (int i = 0; i < 4; i++) S += exp(H->data[i]);
  double worst_exact = 0, worst_printed = 0;
  bool was = autograd_set_grad_enabled(false);
  for (int i = 0; i < 4; i++) {
    // Finite difference of L = <R0, K'> + <R1, V'> in H_i.
    double Lpm[2];
    for (int side = 0; side < 2; side++) {
      float saved = H->data[i];
      H->data[i] = saved + (side ? -1e-3f : 1e-3f);
      Tensor *v2, *k2 = op_enact_cluster(K, V, H, NULL, &one, &v2);
      Lpm[side] = 0;
      for (int c = 0; c < 3; c++) Lpm[side] += R->data[c] * k2->data[c] + R->data[3 + c] * v2->data[c];
      H->data[i] = saved;
    }
    double fd = (Lpm[0] - Lpm[1]) / 2e-3;
    double w = exp(H->data[i]) / S, printed = 0, exact = 0;
    for (int c = 0; c < 3; c++) {
      double pk = 0, pv = 0;
      for (int k = 0; k < 4; k++) {
        pk += exp(H->data[k]) / (S * S) * K->data[k * 3 + c];
        pv += exp(H->data[k]) / (S * S) * V->data[k * 3 + c];
      }
      printed += R->data[c] * -w * (pk + K->data[i * 3 + c]) + R->data[3 + c] * -w * (pv + V->data[i * 3 + c]);
      exact +=
          R->data[c] * w * (K->data[i * 3 + c] - kc->data[c]) + R->data[3 + c] * w * (V->data[i * 3 + c] - vc->data[c]);
    }
    worst_exact = fmax(worst_exact, fabs(exact - fd));
    worst_printed = fmax(worst_printed, fabs(printed - fd));
    ck_assert_double_eq_tol(H->grad->data[i], exact, 1e-5);  // the op implements the exact form
  }
  autograd_set_grad_enabled(was);
  ck_assert_msg(worst_exact < 1e-3, "exact form vs finite differences: %g", worst_exact);
  ck_assert_msg(worst_printed > 0.05, "the printed Eq. 3 should disagree: %g", worst_printed);
  tensor_scope_release(mark);
  Tensor *owned[] = {K, V, H, R};
  for (int i = 0; i < 4; i++) tensor_release(owned[i]);
}
END_TEST

// Dense ENACT: K' = A (s . K), A [L, M] = row softmax of H restricted to each region (-inf elsewhere).
static Tensor *dense_cluster(Tensor *X, Tensor *H, const float *signs, Tensor *region_mask, Tensor *sign_col) {
  int64_t M = H->numel;
  Tensor *A = op_softmax(op_add(op_reshape(H, SHAPE(1, M)), region_mask), NULL);
  return op_matmul(A, signs ? op_mul(X, sign_col) : X);
}

START_TEST(matches_dense_implementation) {
  // The regions of the gradient tests: 24 rows, padding at 15, 19, 23, regions of length 1.
  int64_t starts[] = {0, 3, 4, 9, 12, 16, 17, 20, 21}, lengths[] = {3, 1, 5, 3, 3, 1, 2, 1, 2};
  int64_t L = 9, M = 24, d = 6;
  float signs[24];
  for (int i = 0; i < 24; i++) signs[i] = (i / 3) % 2 ? 1.0f : -1.0f;
  float *mask = malloc((size_t)(L * M) * sizeof(float)), neg_signs[24];
  for (int64_t j = 0; j < L; j++)
    for (int64_t i = 0; i < M; i++) mask[j * M + i] = i >= starts[j] && i < starts[j] + lengths[j] ? 0.0f : -INFINITY;
  for (int i = 0; i < 24; i++) neg_signs[i] = -signs[i];
  Tensor *region_mask = tensor_from_host(DEVICE_CPU, SHAPE(L, M), mask);
  Tensor *sign_col = tensor_from_host(DEVICE_CPU, SHAPE(M, 1), neg_signs);
  Tensor *sign_t = tensor_from_host(DEVICE_CPU, SHAPE(M), signs);
  free(mask);
  for (int with_sign = 0; with_sign < 2; with_sign++) {
    const float *s = with_sign ? signs : NULL;
    Tensor *in[2][3];
    for (int impl = 0; impl < 2; impl++) {  // identical inputs for both implementations
      in[impl][0] = test_uniform(SHAPE(M, d), -1, 1, 10, true);
      in[impl][1] = test_uniform(SHAPE(M, d), -1, 1, 11, true);
      in[impl][2] = test_uniform(SHAPE(M), -2, 2, 12, true);
    }
    Tensor *R = test_uniform(SHAPE(2 * L, d), -1, 1, 13, false);
    ScopeMark mark = tensor_scope_mark();
    EnactRegionIndex index = enact_region_index_upload(DEVICE_CPU, starts, lengths, L, (int64_t[]){0, L}, 1);
    // One backward per recorded graph (backward releases the whole tape): ours first, then dense.
    Tensor *vc, *kc = op_enact_cluster(in[0][0], in[0][1], in[0][2], s ? sign_t : NULL, &index, &vc);
    Tensor *ours[2] = {kc, vc};
    Tensor *yo = op_concat(ours, 2, 0);
    autograd_backward(op_sum_all(op_mul(yo, R)));
    Tensor *dense[2] = {dense_cluster(in[1][0], in[1][2], s, region_mask, sign_col),
                        dense_cluster(in[1][1], in[1][2], s, region_mask, sign_col)};
    Tensor *yd = op_concat(dense, 2, 0);
    ck_assert_double_le(max_rel_diff(yo->data, yd->data, yo->numel), 1e-6);
    autograd_backward(op_sum_all(op_mul(yd, R)));
    for (int k = 0; k < 3; k++)
      ck_assert_msg(max_rel_diff(in[0][k]->grad->data, in[1][k]->grad->data, in[0][k]->numel) < 1e-5,
                    "input %d (sign factor %d): ours and dense gradients differ", k, with_sign);
    tensor_scope_release(mark);
    for (int impl = 0; impl < 2; impl++)
      for (int k = 0; k < 3; k++) tensor_release(in[impl][k]);
    tensor_release(R);
  }
  tensor_release(region_mask);
  tensor_release(sign_col);
  tensor_release(sign_t);
}
END_TEST

// The regions as the first implementation found them on the host, one pixel at a time: a run
// opens at an image's first valid pixel, after padding or at a sign change.
static int64_t naive_regions(const float *signs, int64_t B, int64_t N, int64_t *starts, int64_t *lengths,
                             int64_t *image_offset) {
  int64_t count = 0;
  for (int64_t b = 0; b < B; b++) {
    image_offset[b] = count;
    bool open = false;
    for (int64_t p = 0; p < N; p++) {
      int64_t i = b * N + p;
      if (signs[i] == 0.0f) {
        open = false;
        continue;
      }
      if (open && signs[i] == signs[i - 1]) {
        lengths[count - 1]++;
      } else {
        starts[count] = i, lengths[count] = 1, count++;
        open = true;
      }
    }
  }
  image_offset[B] = count;
  return count;
}

// op_enact_regions (flags, scan, scatter: the GPU's formulation) finds the naive loop's regions on
// random maps of several paddings, both curvature forms; runs cross rows where no padding ends them.
START_TEST(regions_by_scan_match_naive) {
  static const int64_t vh[4] = {7, 7, 3, 1}, vw[4] = {9, 4, 9, 1};  // full, right, bottom, one pixel
  const int64_t B = 4, Hp = 7, Wp = 9, N = Hp * Wp;
  for (int one_d = 0; one_d < 2; one_d++)
    for (uint64_t seed = 0; seed < 5; seed++) {
      ScopeMark mark = tensor_scope_mark();
      Tensor *hsm = tensor_scoped(test_uniform(SHAPE(B, N), 0, 1, 700 + seed + 10 * (uint64_t)one_d, false));
      Tensor *signs = op_enact_signs(hsm, Hp, Wp, vh, vw, one_d);
      EnactRegions r;
      EnactRegionIndex index = op_enact_regions(signs);
      enact_regions_from_index(&index, &r);
      int64_t starts[4 * 63], lengths[4 * 63], offsets[5];
      int64_t count = naive_regions(signs->data, B, N, starts, lengths, offsets);
      ck_assert_int_gt(count, 2 * B);
      ck_assert_int_eq(r.count, count);
      ck_assert_mem_eq(r.image_offset, offsets, sizeof offsets);
      ck_assert_mem_eq(r.starts, starts, (size_t)count * sizeof(int64_t));
      ck_assert_mem_eq(r.lengths, lengths, (size_t)count * sizeof(int64_t));
      for (int64_t b = 0; b < B; b++)  // the signs are zero exactly on padding
        for (int64_t p = 0; p < N; p++)
          ck_assert_int_eq(signs->data[b * N + p] == 0.0f, p / Wp >= vh[b] || p % Wp >= vw[b]);
      enact_regions_free(&r);
      tensor_scope_release(mark);
    }
}
END_TEST

// The clustered attention (op_cluster_attention: each image over its own clusters, from the
// device-side offsets) against the first implementation: every image's clusters gathered into
// [B, Lmax, d] with a -inf key mask for the padding, then multi-head attention. Output and every
// gradient (inputs and the projections).
static Tensor *padded_cluster_attention(const MultiheadAttention *a, Tensor *query, Tensor *Kc, Tensor *Vc,
                                        const int64_t *offset, int64_t B) {
  int64_t L = Kc->shape.d[0], d = Kc->shape.d[1], lmax = 0;
  for (int64_t b = 0; b < B; b++) lmax = offset[b + 1] - offset[b] > lmax ? offset[b + 1] - offset[b] : lmax;
  int64_t *idx = malloc((size_t)(B * lmax) * sizeof(int64_t));
  float *mask = malloc((size_t)(B * lmax) * sizeof(float));
  for (int64_t b = 0; b < B; b++)
    for (int64_t k = 0; k < lmax; k++) {
      bool real = offset[b] + k < offset[b + 1];
      idx[b * lmax + k] = real ? offset[b] + k : L;  // row L: a zero row that the mask hides
      mask[b * lmax + k] = real ? 0.0f : -INFINITY;
    }
  Tensor *zero = op_zeros(DEVICE_CPU, SHAPE(1, d));
  Tensor *kparts[2] = {Kc, zero}, *vparts[2] = {Vc, zero};
  Tensor *kpad = op_reshape(op_index_select(op_concat(kparts, 2, 0), idx, B * lmax), SHAPE(B, lmax, d));
  Tensor *vpad = op_reshape(op_index_select(op_concat(vparts, 2, 0), idx, B * lmax), SHAPE(B, lmax, d));
  Tensor *key_mask = op_constant(DEVICE_CPU, SHAPE(B, lmax), mask);
  free(idx), free(mask);
  return mha_forward(a, &(NnCtx){.training = false}, query, kpad, vpad, key_mask);
}

START_TEST(cluster_attention_matches_padded) {
  ParamStore ps;
  params_init(&ps, DEVICE_CPU);
  MultiheadAttention mha = mha_create(&ps, "attn", 16, 4, 0.0f);
  Rng rng = rng_make(3);
  for (int i = 0; i < ps.count; i++) tensor_uniform_(ps.items[i].tensor, &rng, -0.5f, 0.5f);
  const int64_t B = 3, N = 10, L = 12, offsets[4] = {0, 7, 8, 12};  // 7, 1 and 4 clusters
  int64_t starts[12], lengths[12];
  for (int64_t j = 0; j < L; j++) starts[j] = j, lengths[j] = 1;
  Tensor *in[2][3];
  float *grads[2][3 + 4];
  Tensor *y[2];
  for (int impl = 0; impl < 2; impl++) {
    in[impl][0] = test_uniform(SHAPE(B, N, 16), -1, 1, 720, true);
    in[impl][1] = test_uniform(SHAPE(L, 16), -1, 1, 721, true);
    in[impl][2] = test_uniform(SHAPE(L, 16), -1, 1, 722, true);
    ScopeMark mark = tensor_scope_mark();
    EnactRegionIndex index = enact_region_index_upload(DEVICE_CPU, starts, lengths, L, offsets, B);
    Tensor *out = impl ? padded_cluster_attention(&mha, in[impl][0], in[impl][1], in[impl][2], offsets, B)
                       : enact_cluster_attention(&mha, &(NnCtx){.training = false}, in[impl][0], in[impl][1],
                                                 in[impl][2], &index);
    y[impl] = tensor_retain(out);
    Tensor *R = tensor_scoped(test_uniform(out->shape, -1, 1, 723, false));
    autograd_backward(op_sum_all(op_mul(out, R)));
    for (int k = 0; k < 3; k++) {
      grads[impl][k] = malloc((size_t)in[impl][k]->numel * sizeof(float));
      memcpy(grads[impl][k], in[impl][k]->grad->data, (size_t)in[impl][k]->numel * sizeof(float));
    }
    Tensor *w[4] = {mha.in_proj_weight, mha.in_proj_bias, mha.out_proj.weight, mha.out_proj.bias};
    for (int k = 0; k < 4; k++) {
      grads[impl][3 + k] = malloc((size_t)w[k]->numel * sizeof(float));
      memcpy(grads[impl][3 + k], w[k]->grad->data, (size_t)w[k]->numel * sizeof(float));
    }
    autograd_zero_grad(w, 4);
    tensor_scope_release(mark);
  }
  ck_assert_double_le(max_rel_diff(y[0]->data, y[1]->data, y[0]->numel), 1e-5);
  static const char *names[7] = {"query",           "Kc",           "Vc", "in_proj_weight", "in_proj_bias",
                                 "out_proj.weight", "out_proj.bias"};
  int64_t sizes[7] = {in[0][0]->numel,           in[0][1]->numel,         in[0][2]->numel,
                      mha.in_proj_weight->numel, mha.in_proj_bias->numel, mha.out_proj.weight->numel,
                      mha.out_proj.bias->numel};
  for (int k = 0; k < 7; k++) {
    ck_assert_msg(max_rel_diff(grads[0][k], grads[1][k], sizes[k]) < 1e-4, "gradient of %s: %g", names[k],
                  max_rel_diff(grads[0][k], grads[1][k], sizes[k]));
    free(grads[0][k]), free(grads[1][k]);
  }
  for (int impl = 0; impl < 2; impl++) {
    tensor_release(y[impl]);
    for (int k = 0; k < 3; k++) tensor_release(in[impl][k]);
  }
  params_free(&ps);
}
END_TEST

// DETR weights (no W_prob) load into DETR+ENACT; everything else must still match strictly.
// The official form's pieces (nn/attn_enact_official.c): its taps, its cluster size (a run is a
// maximal stretch of equal sign of conv1d(Hsm, [-1, 2, -1]) > 0 over the whole flattened map; each
// image's mean run length N / runs in float32; the batch's mean rounded half to even, as Python's
// round) and its chunks (N mod c pixels trimmed, half at the start).
START_TEST(official_form_pieces) {
  float taps[64];
  ck_assert_int_eq(enact_official_taps(3, taps), 17);
  for (int x = -8; x <= 8; x++) {
    double want = exp(-(double)(x * x) / 18.0) / (3.0 * sqrt(2.0 * M_PI));
    ck_assert_msg(fabs(taps[x + 8] - want) < 5e-7 * want, "tap %d: %g, expected %g", x, taps[x + 8], want);
    ck_assert(taps[x + 8] == taps[8 - x]);
  }
  // A spike is the one positive curvature; a spike at the end leaves 2 runs.
  float end5[5] = {0, 0, 0, 0, 1}, end7[7] = {0, 0, 0, 0, 0, 0, 1}, two[24] = {0};
  double mean;
  ck_assert_int_eq(enact_official_cluster_size(end5, 1, 5, &mean), 2);  // 2.5 -> 2 (half to even, not 3)
  ck_assert_double_eq(mean, 2.5);
  ck_assert_int_eq(enact_official_cluster_size(end7, 1, 7, &mean), 4);  // 3.5 -> 4
  two[5] = 1;                                                           // image 0: runs F T F: 12 / 3 = 4
  two[12 + 3] = two[12 + 8] = 1;                                        // image 1: 5 runs: 2.4
  ck_assert_int_eq(enact_official_cluster_size(two, 2, 12, &mean), 3);
  ck_assert_double_eq_tol(mean, (4.0 + (double)(12.0f / 5.0f)) / 2.0, 1e-15);
  // Chunks of 3 over N = 11: pixel 0 and pixel 10 trimmed; equal entropies give each chunk's mean.
  Tensor *k = tensor_zeros(DEVICE_CPU, SHAPE(1, 11, 1)), *h = tensor_zeros(DEVICE_CPU, SHAPE(1, 11));
  for (int i = 0; i < 11; i++) k->data[i] = (float)i;
  ScopeMark mark = tensor_scope_mark();
  EnactRegionIndex chunks = enact_official_fixed_regions(DEVICE_CPU, 1, 11, 3);
  Tensor *vc = NULL, *kc = op_enact_cluster(op_reshape(k, SHAPE(11, 1)), op_reshape(k, SHAPE(11, 1)),
                                            op_reshape(h, SHAPE(11)), NULL, &chunks, &vc);
  ck_assert_int_eq(kc->shape.d[0], 3);
  for (int j = 0; j < 3; j++) {
    ck_assert_float_eq_tol(kc->data[j], (float)(3 * j + 2), 1e-6f);
    ck_assert_float_eq_tol(vc->data[j], (float)(3 * j + 2), 1e-6f);
  }
  tensor_scope_release(mark);
  tensor_release(k), tensor_release(h);
}
END_TEST

START_TEST(detr_weights_load_into_enact) {
  DetrConfig cfg;
  ck_assert_int_eq(detr_config_preset("tiny", &cfg), 0);
  DetrModel *plain = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(plain, 3);
  char dir[] = "/tmp/detr-enact-XXXXXX", path[256], err[2048];
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/detr.safetensors", dir);
  StWriter *w = st_writer_new();
  params_save(&plain->params, w, "");
  ck_assert_int_eq(st_writer_save(w, path, err, sizeof err), 0);
  st_writer_free(w);
  cfg.encoder_attn = encoder_attn_find("enact");
  DetrModel *enact = detr_model_create(&cfg, DEVICE_CPU);
  detr_model_init(enact, 4);
  ck_assert_ptr_nonnull(params_find(&enact->params, "transformer.encoder.layers.1.self_attn.W_prob.weight"));
  ck_assert_msg(params_load_file(&enact->params, path, err, sizeof err) == 0, "%s", err);
  Param *a = params_find(&plain->params, "transformer.encoder.layers.0.linear1.weight");
  Param *b = params_find(&enact->params, "transformer.encoder.layers.0.linear1.weight");
  ck_assert_mem_eq(a->tensor->data, b->tensor->data, (size_t)a->tensor->numel * sizeof(float));
  // The other way round, an ENACT file into plain DETR has unexpected tensors: refused by name.
  snprintf(path, sizeof path, "%s/enact.safetensors", dir);
  w = st_writer_new();
  params_save(&enact->params, w, "");
  ck_assert_int_eq(st_writer_save(w, path, err, sizeof err), 0);
  st_writer_free(w);
  ck_assert_int_eq(params_load_file(&plain->params, path, err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "unexpected: transformer.encoder.layers.0.self_attn.W_prob.weight"));
  detr_model_free(plain);
  detr_model_free(enact);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("enact");
  TCase *tc = tcase_create("enact");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, geometry_and_regions);
  tcase_add_test(tc, filters);
  tcase_add_test(tc, erratum_in_eq3);
  tcase_add_test(tc, matches_dense_implementation);
  tcase_add_test(tc, detr_weights_load_into_enact);
  tcase_add_test(tc, official_form_pieces);
  tcase_add_test(tc, regions_by_scan_match_naive);
  tcase_add_test(tc, cluster_attention_matches_padded);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
