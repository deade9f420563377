// Tensors, the caching allocator, scopes, the RNG and the tape's bookkeeping.
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "tensor/arena.h"
#include "tests/gradcheck.h"

START_TEST(shapes_and_host_roundtrip) {
  float host[6] = {1, 2, 3, 4, 5, 6}, back[6];
  Tensor *t = tensor_from_host(DEVICE_CPU, SHAPE(2, 3), host);
  ck_assert_int_eq(t->numel, 6);
  ck_assert_int_eq(t->shape.ndim, 2);
  tensor_to_host(t, back);
  for (int i = 0; i < 6; i++) ck_assert_float_eq(back[i], host[i]);
  Tensor *v = tensor_view(t, SHAPE(3, 2));
  ck_assert_ptr_eq(v->data, t->data);
  tensor_release(t);  // the view keeps the data alive
  ck_assert_float_eq(v->data[5], 6.0f);
  tensor_release(v);
  Tensor *z = tensor_zeros(DEVICE_CPU, SHAPE(0, 3));  // empty tensors are legal
  ck_assert_int_eq(z->numel, 0);
  tensor_release(z);
  char buf[64];
  ck_assert_str_eq(shape_str(SHAPE(2, 3, 4), buf, sizeof buf), "[2, 3, 4]");
}
END_TEST

START_TEST(rng_is_counter_based_and_sane) {
  Rng a = rng_make(42), b = rng_make(42);
  Tensor *x = tensor_new(DEVICE_CPU, SHAPE(10000)), *y = tensor_new(DEVICE_CPU, SHAPE(10000));
  tensor_uniform_(x, &a, 0.0f, 1.0f);
  tensor_uniform_(y, &b, 0.0f, 1.0f);
  ck_assert_int_eq(a.offset, b.offset);
  double mean = 0;
  for (int i = 0; i < 10000; i++) {
    ck_assert_float_eq(x->data[i], y->data[i]);
    ck_assert(x->data[i] >= 0.0f && x->data[i] < 1.0f);
    mean += x->data[i];
  }
  ck_assert_double_eq_tol(mean / 10000, 0.5, 0.02);
  // A second draw continues the stream: different values.
  tensor_uniform_(y, &b, 0.0f, 1.0f);
  ck_assert(x->data[0] != y->data[0] || x->data[1] != y->data[1]);
  tensor_normal_(x, &a, 1.0f, 2.0f);
  double m = 0, v = 0;
  for (int i = 0; i < 10000; i++) m += x->data[i];
  m /= 10000;
  for (int i = 0; i < 10000; i++) v += (x->data[i] - m) * (x->data[i] - m);
  ck_assert_double_eq_tol(m, 1.0, 0.08);
  ck_assert_double_eq_tol(sqrt(v / 10000), 2.0, 0.08);
  tensor_release(x);
  tensor_release(y);
}
END_TEST

START_TEST(scope_releases_op_outputs) {
  Tensor *x = tensor_ones(DEVICE_CPU, SHAPE(4));
  ScopeMark mark = tensor_scope_mark();
  Tensor *y = op_add(x, x);
  ck_assert_int_eq(tensor_scope_size(), mark + 1);
  ck_assert_float_eq(y->data[0], 2.0f);
  tensor_scope_release(mark);
  ck_assert_int_eq(tensor_scope_size(), mark);
  ck_assert_int_eq(x->refcount, 1);
  tensor_release(x);
}
END_TEST

START_TEST(tape_records_only_when_needed) {
  Tensor *p = test_uniform(SHAPE(3), -1, 1, 1, true), *c = test_uniform(SHAPE(3), -1, 1, 2, false);
  ScopeMark mark = tensor_scope_mark();
  op_mul(c, c);
  ck_assert_int_eq(autograd_tape_size(), 0);  // no input requires grad
  bool was = autograd_set_grad_enabled(false);
  Tensor *y = op_mul(p, c);
  ck_assert(!y->requires_grad);
  ck_assert_int_eq(autograd_tape_size(), 0);  // no-grad mode
  autograd_set_grad_enabled(was);
  Tensor *loss = op_sum_all(op_mul(p, c));
  ck_assert_int_eq(autograd_tape_size(), 2);
  autograd_backward(loss);
  ck_assert_int_eq(autograd_tape_size(), 0);  // the tape is released after backward
  for (int i = 0; i < 3; i++) ck_assert_float_eq(p->grad->data[i], c->data[i]);
  ck_assert_ptr_null(c->grad);
  // Gradients accumulate across backward calls until zeroed.
  autograd_backward(op_sum_all(op_mul(p, c)));
  ck_assert_float_eq(p->grad->data[0], 2.0f * c->data[0]);
  autograd_zero_grad(&p, 1);
  ck_assert_float_eq(p->grad->data[0], 0.0f);
  tensor_scope_release(mark);
  ck_assert_int_eq(p->refcount, 1);
  tensor_release(p);
  tensor_release(c);
}
END_TEST

// A tiny two-layer network trained with SGD: once two steps have warmed the caches, later
// steps make no system allocation for tensor data, tensor headers or tape nodes.
static void sgd_step(Tensor **params, int n, Tensor *x, const int64_t *targets) {
  ScopeMark mark = tensor_scope_mark();
  Tensor *h = op_relu(op_linear(x, params[0], params[1]));
  Tensor *logits = op_linear(h, params[2], params[3]);
  Tensor *loss = op_add(op_cross_entropy(logits, targets, NULL), op_mul_scalar(op_sum_all(h), 1e-3f));
  autograd_backward(loss);
  for (int i = 0; i < n; i++) {
    for (int64_t k = 0; k < params[i]->numel; k++) params[i]->data[k] -= 0.1f * params[i]->grad->data[k];
  }
  autograd_zero_grad(params, n);
  tensor_scope_release(mark);
}

START_TEST(steady_state_step_does_not_allocate) {
  Tensor *params[4] = {test_uniform(SHAPE(16, 8), -0.3f, 0.3f, 1, true), test_uniform(SHAPE(16), -0.1f, 0.1f, 2, true),
                       test_uniform(SHAPE(3, 16), -0.3f, 0.3f, 3, true), test_uniform(SHAPE(3), -0.1f, 0.1f, 4, true)};
  Tensor *x = test_uniform(SHAPE(5, 8), -1, 1, 5, false);
  int64_t targets[5] = {0, 1, 2, 1, 0};
  // Warm-up: step 1 creates the parameter gradients, step 2 runs with them held.
  sgd_step(params, 4, x, targets);
  sgd_step(params, 4, x, targets);
  AllocStats warm = detr_alloc_stats(DEVICE_CPU);
  uint64_t headers = tensor_header_system_allocs(), nodes = autograd_node_system_allocs();
  for (int step = 0; step < 5; step++) sgd_step(params, 4, x, targets);
  AllocStats after = detr_alloc_stats(DEVICE_CPU);
  ck_assert_uint_eq(after.system_allocs, warm.system_allocs);
  ck_assert_uint_gt(after.requests, warm.requests);  // the steps did allocate, from the cache
  ck_assert_uint_eq(tensor_header_system_allocs(), headers);
  ck_assert_uint_eq(autograd_node_system_allocs(), nodes);
  for (int i = 0; i < 4; i++) tensor_release(params[i]);
  tensor_release(x);
}
END_TEST

START_TEST(allocator_reuses_and_empties) {
  AllocStats s0 = detr_alloc_stats(DEVICE_CPU);
  void *p = detr_alloc(DEVICE_CPU, 1000);
  detr_free(DEVICE_CPU, p, 1000);
  void *q = detr_alloc(DEVICE_CPU, 1010);  // same size class: the same block
  ck_assert_ptr_eq(p, q);
  ck_assert_int_eq((intptr_t)q % 64, 0);
  detr_free(DEVICE_CPU, q, 1010);
  AllocStats s1 = detr_alloc_stats(DEVICE_CPU);
  ck_assert_uint_le(s1.system_allocs - s0.system_allocs, 1);
  detr_alloc_empty_cache(DEVICE_CPU);
  ck_assert_uint_eq(detr_alloc_stats(DEVICE_CPU).cached_bytes, 0);
}
END_TEST

// CPU blocks of 64 KiB and more are not cached: freeing one hands it back to the arena at once (which
// reuses it for any size), so live and cached bytes both go back down. They take their size rounded
// to a page, not their size class.
START_TEST(allocator_large_blocks_are_not_cached) {
  AllocStats s0 = detr_alloc_stats(DEVICE_CPU);
  const size_t bytes = ((size_t)5 << 20) / 4 + 100;  // its size class would be 1.5 MiB
  float *a = detr_alloc(DEVICE_CPU, bytes);
  ck_assert_int_eq((intptr_t)a % 64, 0);
  a[0] = 1.0f, a[bytes / sizeof(float) - 1] = 2.0f;  // writable end to end
  AllocStats s1 = detr_alloc_stats(DEVICE_CPU);
  ck_assert_uint_eq(s1.live_bytes - s0.live_bytes, (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN);
  ck_assert_uint_eq(s1.system_allocs - s0.system_allocs, 1);
  detr_free(DEVICE_CPU, a, bytes);
  AllocStats s2 = detr_alloc_stats(DEVICE_CPU);
  ck_assert_uint_eq(s2.live_bytes, s0.live_bytes);
  ck_assert_uint_eq(s2.cached_bytes, s0.cached_bytes);
  ck_assert_uint_eq(s2.system_frees - s0.system_frees, 1);
  float *big = detr_alloc(DEVICE_CPU, (size_t)40 << 20);
  big[0] = 1.0f, big[((size_t)40 << 20) / sizeof(float) - 1] = 2.0f;
  detr_free(DEVICE_CPU, big, (size_t)40 << 20);
  AllocStats s3 = detr_alloc_stats(DEVICE_CPU);
  ck_assert_uint_eq(s3.cached_bytes, s0.cached_bytes);
  ck_assert_uint_eq(s3.system_frees - s0.system_frees, 2);
  void *small = detr_alloc(DEVICE_CPU, 4096);
  detr_free(DEVICE_CPU, small, 4096);  // below 64 KiB: cached
  ck_assert_uint_ge(detr_alloc_stats(DEVICE_CPU).cached_bytes, s0.cached_bytes + 4096);
}
END_TEST

// The arena places a block in the smallest free extent that fits, merges a freed block with free
// neighbours (so a freed run serves a larger request), and gives a freed top back.
START_TEST(arena_best_fit_merges_and_lowers_top) {
  const size_t MiB = (size_t)1 << 20;
  Arena a;
  ck_assert(arena_reserve(&a, 16 * MiB));
  char *b0 = arena_alloc(&a, MiB), *b1 = arena_alloc(&a, 2 * MiB - 100), *b2 = arena_alloc(&a, MiB);
  char *b3 = arena_alloc(&a, MiB);
  ck_assert_ptr_eq(b0, a.base);
  ck_assert_ptr_eq(b1, b0 + MiB);
  ck_assert_ptr_eq(b2, b1 + 2 * MiB);  // b1 took whole pages
  ck_assert_ptr_eq(b3, b2 + MiB);
  memset(b1, 1, 2 * MiB - 100);
  ck_assert_uint_eq(a.top, 5 * MiB);
  ck_assert(arena_free(&a, b1, 2 * MiB - 100));
  ck_assert_ptr_eq(arena_alloc(&a, MiB), b1);  // the lowest fit: b1's extent, not the top
  ck_assert(arena_free(&a, b1, MiB));
  ck_assert(arena_free(&a, b2, MiB));  // merges with b1's extent: 3 MiB free at b1
  ck_assert_int_eq(a.n_free, 1);
  ck_assert_ptr_eq(arena_alloc(&a, 3 * MiB), b1);
  ck_assert_int_eq(a.n_free, 0);
  ck_assert_uint_eq(a.top, 5 * MiB);
  ck_assert(arena_free(&a, b1, 3 * MiB));
  ck_assert(arena_free(&a, b3, MiB));  // at the top: the top falls past the free run below it too
  ck_assert_uint_eq(a.top, MiB);
  ck_assert_int_eq(a.n_free, 0);
  ck_assert_uint_eq(a.touched, 5 * MiB);  // written pages above the top keep their memory until a trim
  arena_trim(&a);
  ck_assert_uint_eq(a.touched, MiB);
  char *again = arena_alloc(&a, 2 * MiB);
  ck_assert_ptr_eq(again, b1);
  ck_assert_int_eq(again[0] | again[MiB], 0);  // b1's bytes were 1: the trimmed pages read as zeros
  ck_assert(arena_free(&a, again, 2 * MiB));
  ck_assert_ptr_null(arena_alloc(&a, 16 * MiB));  // b0 still there: no room
  ck_assert_ptr_eq(arena_alloc(&a, 15 * MiB), b0 + MiB);
  int on_stack;
  ck_assert(!arena_free(&a, &on_stack, sizeof on_stack));  // not the arena's
  arena_release(&a);
  // Best fit: extents of 3 MiB (low) and 1 MiB (high) free; a 1 MiB request takes the high one and
  // leaves the 3 MiB whole for a 3 MiB request.
  ck_assert(arena_reserve(&a, 16 * MiB));
  char *c0 = arena_alloc(&a, 3 * MiB), *c1 = arena_alloc(&a, MiB), *c2 = arena_alloc(&a, MiB);
  (void)arena_alloc(&a, MiB);
  ck_assert(arena_free(&a, c0, 3 * MiB));
  ck_assert(arena_free(&a, c2, MiB));
  ck_assert_ptr_eq(arena_alloc(&a, MiB), c2);
  ck_assert_ptr_eq(arena_alloc(&a, 3 * MiB), c0);
  (void)c1;
  arena_release(&a);
  ck_assert_ptr_null(arena_alloc(&a, MiB));  // released: unusable until reserved again
}
END_TEST

// Random allocations and frees (1 byte to 48 pages, up to 200 blocks live, a trim every 50) against
// the arena's invariants after every call: free extents sorted, non-empty, apart and below the top,
// the last not reaching it; live blocks and free extents tiling [0, top) without overlap; the live
// count right; every live block's bytes as written (no two blocks share memory).
typedef struct {
  size_t off, len;
} Span;
static int span_cmp(const void *x, const void *y) {
  const Span *a = x, *b = y;
  return a->off < b->off ? -1 : a->off > b->off;
}

START_TEST(arena_random_keeps_invariants) {
  const size_t P = ARENA_ALIGN;
  enum { SLOTS = 200 };
  Arena a;
  ck_assert(arena_reserve(&a, 4096 * P));
  char *ptr[SLOTS] = {NULL};
  size_t len[SLOTS] = {0};
  static Span spans[2 * SLOTS + 1];
  uint64_t s = 12345;
  int merges_seen = 0;
  for (int step = 0; step < 6000; step++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    int slot = (int)((s >> 33) % SLOTS);
    int free_before = a.n_free;
    if (ptr[slot]) {
      unsigned char mark = (unsigned char)(slot + 1);  // as written: no other block overlapped it
      for (size_t j = 0; j < len[slot]; j += 512) ck_assert_int_eq((unsigned char)ptr[slot][j], mark);
      ck_assert_int_eq((unsigned char)ptr[slot][len[slot] - 1], mark);
      ck_assert(arena_free(&a, ptr[slot], len[slot]));
      if (a.n_free < free_before) merges_seen++;  // both neighbours free (or the top fell)
      ptr[slot] = NULL;
    } else {
      size_t bytes = 1 + (size_t)((s >> 13) % (48 * P));
      char *p = arena_alloc(&a, bytes);
      if (p) {
        ptr[slot] = p, len[slot] = bytes;
        memset(p, (unsigned char)(slot + 1), bytes);
      }
    }
    if (step % 50 == 0) arena_trim(&a);
    int n = 0, live = 0;
    size_t total = 0;
    for (int i = 0; i < a.n_free; i++) {
      ck_assert_uint_gt(a.free[i].len, 0);
      if (i > 0) ck_assert_uint_lt(a.free[i - 1].off + a.free[i - 1].len, a.free[i].off);
      spans[n++] = (Span){a.free[i].off, a.free[i].len};
      total += a.free[i].len;
    }
    if (a.n_free > 0) ck_assert_uint_lt(a.free[a.n_free - 1].off + a.free[a.n_free - 1].len, a.top);
    for (int i = 0; i < SLOTS; i++)
      if (ptr[i]) {
        size_t l = (len[i] + P - 1) / P * P;
        spans[n++] = (Span){(size_t)(ptr[i] - a.base), l};
        total += l;
        live++;
      }
    ck_assert_int_eq(a.n_live, live);
    ck_assert_uint_eq(total, a.top);
    qsort(spans, (size_t)n, sizeof *spans, span_cmp);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
      ck_assert_uint_eq(spans[i].off, at);  // tiles: no gap, no overlap
      at += spans[i].len;
    }
    ck_assert_uint_le(a.top, a.touched);
  }
  ck_assert_int_gt(merges_seen, 100);
  ck_assert_int_gt(a.free_cap, 64);  // the extent list grew past its first allocation
  arena_release(&a);
}
END_TEST

START_TEST(print_does_not_crash) {
  Tensor *t = tensor_full(DEVICE_CPU, SHAPE(2, 2), 0.5f);
  FILE *f = tmpfile();
  tensor_print(f, "t", t);
  ck_assert_int_gt(ftell(f), 10);
  fclose(f);
  tensor_release(t);
}
END_TEST

// op_slice of one contiguous block with nothing recorded is a view into x's data (a view of a view
// nests the offsets) that keeps it alive past x's scope; recorded, or strided, it is a copy.
START_TEST(slices_view_or_copy) {
  float host[24];
  for (int i = 0; i < 24; i++) host[i] = (float)i;
  bool was = autograd_set_grad_enabled(false);
  Tensor *x = tensor_from_host(DEVICE_CPU, SHAPE(4, 6), host);
  ScopeMark outer = tensor_scope_mark();
  ScopeMark inner = tensor_scope_mark();
  Tensor *rows = op_slice(x, 0, 1, 3);     // rows 1, 2: elements 6 .. 17
  Tensor *row2 = op_slice(rows, 0, 1, 2);  // of those, row 1: elements 12 .. 17
  ck_assert_ptr_eq(rows->data, x->data + 6);
  ck_assert_ptr_eq(row2->data, x->data + 12);
  Tensor *cols = op_slice(x, 1, 2, 4);  // strided: a copy
  ck_assert_ptr_ne(cols->data, x->data + 2);
  ck_assert_float_eq(cols->data[2], 8.0f);
  tensor_scope_keep(inner, &row2, 1);  // rows and cols freed, row2 kept; then x's own reference goes
  tensor_release(x);
  for (int i = 0; i < 6; i++) ck_assert_float_eq(row2->data[i], (float)(12 + i));
  tensor_scope_release(outer);
  autograd_set_grad_enabled(was);
  // Recorded (x needs a gradient): a copy, whose backward needs its own output.
  Tensor *w = tensor_from_host(DEVICE_CPU, SHAPE(4, 6), host);
  w->requires_grad = true;
  ScopeMark mark = tensor_scope_mark();
  Tensor *copy = op_slice(w, 0, 1, 3);
  ck_assert_ptr_ne(copy->data, w->data + 6);
  ck_assert_float_eq(copy->data[0], 6.0f);
  tensor_scope_release(mark);
  autograd_clear_tape();
  tensor_release(w);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("tensor");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);  // Check's 4 s default is too tight on a loaded 2-core machine
  tcase_add_test(tc, shapes_and_host_roundtrip);
  tcase_add_test(tc, rng_is_counter_based_and_sane);
  tcase_add_test(tc, scope_releases_op_outputs);
  tcase_add_test(tc, tape_records_only_when_needed);
  tcase_add_test(tc, steady_state_step_does_not_allocate);
  tcase_add_test(tc, allocator_reuses_and_empties);
  tcase_add_test(tc, allocator_large_blocks_are_not_cached);
  tcase_add_test(tc, arena_best_fit_merges_and_lowers_top);
  tcase_add_test(tc, arena_random_keeps_invariants);
  tcase_add_test(tc, print_does_not_crash);
  tcase_add_test(tc, slices_view_or_copy);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
