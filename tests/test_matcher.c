// Linear assignment against brute force, DETR's matcher and the set criterion's values.
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "nn/criterion.h"
#include "nn/hungarian.h"
#include "tests/gradcheck.h"

// Minimum total cost over all assignments of min(r, c) pairs: Heap's algorithm enumerates the
// permutations of the larger side; the first min(r, c) entries are the partners of the smaller.
static double brute_force(const double *cost, int r, int c) {
  int n = r < c ? r : c, big = r < c ? c : r;
  int perm[8], counter[8] = {0};
  for (int i = 0; i < big; i++) perm[i] = i;
  double best = INFINITY;
  for (int i = 0;;) {
    double total = 0;
    for (int k = 0; k < n; k++) total += r <= c ? cost[k * c + perm[k]] : cost[perm[k] * c + k];
    if (total < best) best = total;
    while (i < big && counter[i] >= i) counter[i++] = 0;
    if (i == big) break;
    int j = i % 2 == 0 ? 0 : counter[i];
    int t = perm[j];
    perm[j] = perm[i];
    perm[i] = t;
    counter[i]++;
    i = 0;
  }
  return best;
}

START_TEST(lsa_matches_brute_force) {
  Rng rng = rng_make(7);
  double cost[64];
  int64_t row_of[8], col_of[8];
  int cases = 0;
  for (int trial = 0; trial < 4000; trial++) {
    int r = 1 + (int)rng_next_below(&rng, 8), c = 1 + (int)rng_next_below(&rng, 8);
    bool integer = trial % 2 == 0;  // small integer costs create many ties
    for (int k = 0; k < r * c; k++)
      cost[k] = integer ? (double)rng_next_below(&rng, 4) : rng_next_uniform(&rng) * 10.0 - 5.0;
    ck_assert_int_eq(linear_sum_assignment(r, c, cost, row_of, col_of, NULL, NULL), LSA_OK);
    int n = r < c ? r : c;
    bool row_used[8] = {0}, col_used[8] = {0};
    double total = 0;
    for (int k = 0; k < n; k++) {
      ck_assert(row_of[k] >= 0 && row_of[k] < r && col_of[k] >= 0 && col_of[k] < c);
      ck_assert(!row_used[row_of[k]] && !col_used[col_of[k]]);
      row_used[row_of[k]] = col_used[col_of[k]] = true;
      if (k) ck_assert_int_lt(row_of[k - 1], row_of[k]);
      total += cost[row_of[k] * c + col_of[k]];
    }
    double best = brute_force(cost, r, c);
    ck_assert_msg(fabs(total - best) < 1e-9, "trial %d (%dx%d): %g vs brute force %g", trial, r, c, total, best);
    cases++;
  }
  ck_assert_int_eq(cases, 4000);
}
END_TEST

START_TEST(lsa_edge_cases) {
  int64_t row_of[4], col_of[4], br = -1, bc = -1;
  double none[1] = {0};
  ck_assert_int_eq(linear_sum_assignment(5, 0, none, row_of, col_of, NULL, NULL), LSA_OK);  // no targets
  double one[3] = {3, 1, 2};                                                                // 3 queries, 1 target
  ck_assert_int_eq(linear_sum_assignment(3, 1, one, row_of, col_of, NULL, NULL), LSA_OK);
  ck_assert_int_eq(row_of[0], 1);
  ck_assert_int_eq(col_of[0], 0);
  double constant[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};  // ties resolve to the identity, as scipy
  ck_assert_int_eq(linear_sum_assignment(3, 3, constant, row_of, col_of, NULL, NULL), LSA_OK);
  for (int i = 0; i < 3; i++) ck_assert_int_eq(col_of[i], i);
  double with_nan[4] = {1, 2, NAN, 4};
  ck_assert_int_eq(linear_sum_assignment(2, 2, with_nan, row_of, col_of, &br, &bc), LSA_INVALID);
  ck_assert_int_eq(br, 1);
  ck_assert_int_eq(bc, 0);
  double with_neg_inf[4] = {1, -INFINITY, 3, 4};
  ck_assert_int_eq(linear_sum_assignment(2, 2, with_neg_inf, row_of, col_of, &br, &bc), LSA_INVALID);
  double forbidden[4] = {INFINITY, 5, 1, INFINITY};  // +inf forbids a pair; the other pairing is forced
  ck_assert_int_eq(linear_sum_assignment(2, 2, forbidden, row_of, col_of, NULL, NULL), LSA_OK);
  ck_assert_int_eq(col_of[0], 1);
  ck_assert_int_eq(col_of[1], 0);
  double infeasible[4] = {INFINITY, 1, INFINITY, 2};  // both rows can only take column 1
  ck_assert_int_eq(linear_sum_assignment(2, 2, infeasible, row_of, col_of, NULL, NULL), LSA_INFEASIBLE);
}
END_TEST

// Two images, 4 queries, 3 classes + no-object. Image 0 has targets equal to queries 2 and 0's
// boxes with confident matching logits; image 1 has no targets.
static void small_problem(Tensor **logits, Tensor **boxes, DetrTarget *targets, float *tboxes, int64_t *labels) {
  float lg[2 * 4 * 4], bx[2 * 4 * 4];
  Rng rng = rng_make(3);
  for (int i = 0; i < 32; i++) lg[i] = rng_next_uniform(&rng) * 2 - 1;
  for (int i = 0; i < 32; i++) bx[i] = 0.2f + 0.6f * rng_next_uniform(&rng);
  lg[2 * 4 + 1] = 6;  // query 2 of image 0 is confident in class 1
  lg[0 * 4 + 2] = 6;  // query 0 in class 2
  float t0[4] = {0.3f, 0.4f, 0.2f, 0.3f}, t1[4] = {0.7f, 0.6f, 0.3f, 0.2f};
  memcpy(bx + 2 * 4, t0, sizeof t0);
  memcpy(bx + 0 * 4, t1, sizeof t1);
  memcpy(tboxes, t0, sizeof t0);
  memcpy(tboxes + 4, t1, sizeof t1);
  labels[0] = 1;
  labels[1] = 2;
  targets[0] = (DetrTarget){.n = 2, .boxes = tboxes, .labels = labels};
  targets[1] = (DetrTarget){.n = 0, .boxes = tboxes, .labels = labels};
  *logits = tensor_from_host(DEVICE_CPU, SHAPE(2, 4, 4), lg);
  *boxes = tensor_from_host(DEVICE_CPU, SHAPE(2, 4, 4), bx);
}

START_TEST(matcher_finds_the_obvious_assignment) {
  Tensor *logits, *boxes;
  DetrTarget targets[2];
  float tb[8];
  int64_t labels[2];
  small_problem(&logits, &boxes, targets, tb, labels);
  DetrMatch m[2];
  char err[256];
  MatcherWeights w = {1, 5, 2};
  ck_assert_int_eq(detr_hungarian_match(logits, boxes, targets, w, m, err, sizeof err), 0);
  ck_assert_int_eq(m[0].n, 2);
  ck_assert_int_eq(m[0].query[0], 0);  // queries ascending
  ck_assert_int_eq(m[0].target[0], 1);
  ck_assert_int_eq(m[0].query[1], 2);
  ck_assert_int_eq(m[0].target[1], 0);
  ck_assert_int_eq(m[1].n, 0);
  detr_matches_free(m, 2);
  logits->data[5] = NAN;  // image 0, query 1
  ck_assert_int_eq(detr_hungarian_match(logits, boxes, targets, w, m, err, sizeof err), -1);
  ck_assert_msg(strstr(err, "image 0") && strstr(err, "NaN"), "message: %s", err);
  tensor_release(logits);
  tensor_release(boxes);
}
END_TEST

// The criterion's terms against a direct double-precision computation of the same formulas.
START_TEST(criterion_values) {
  Tensor *logits, *boxes;
  DetrTarget targets[2];
  float tb[8];
  int64_t labels[2];
  small_problem(&logits, &boxes, targets, tb, labels);
  CriterionConfig cfg = criterion_config_default(3);
  CriterionResult r;
  char err[256];
  ScopeMark mark = tensor_scope_mark();
  DetrLayerOutput out = {logits, boxes};
  ck_assert_int_eq(criterion_forward(&cfg, out, &out, 1, targets, 2.0f, NULL, &r, err, sizeof err), 0);
  ck_assert_int_eq(r.n_terms, 6);
  // loss_ce: weighted mean over the 8 queries; queries 0 and 2 of image 0 are matched.
  double num = 0, den = 0;
  for (int q = 0; q < 8; q++) {
    const float *row = logits->data + q * 4;
    int cls = q == 0 ? 2 : q == 2 ? 1 : 3;
    double z = 0;
    for (int c = 0; c < 4; c++) z += exp(row[c]);
    double w = cls == 3 ? 0.1 : 1.0;
    num += w * (log(z) - row[cls]);
    den += w;
  }
  ck_assert_double_eq_tol(criterion_term(&r, "loss_ce"), num / den, 1e-5);
  ck_assert_double_eq_tol(criterion_term(&r, "loss_ce_0"), num / den, 1e-5);
  // Matched boxes equal their targets: L1 0 and GIoU 1, so both box losses vanish.
  ck_assert_double_eq_tol(criterion_term(&r, "loss_bbox"), 0.0, 1e-6);
  ck_assert_double_eq_tol(criterion_term(&r, "loss_giou"), 0.0, 1e-6);
  ck_assert_double_eq_tol(tensor_item(r.total), 2 * num / den, 1e-5);
  ck_assert_float_eq(r.class_error, 0.0f);
  ck_assert_int_eq(r.matches[0].n, 2);
  criterion_result_free(&r);
  tensor_scope_release(mark);
  tensor_release(logits);
  tensor_release(boxes);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("matcher");
  TCase *tc = tcase_create("matcher");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, lsa_matches_brute_force);
  tcase_add_test(tc, lsa_edge_cases);
  tcase_add_test(tc, matcher_finds_the_obvious_assignment);
  tcase_add_test(tc, criterion_values);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
