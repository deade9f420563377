// test_gpu's per-test fixture and watchdog, checked without a GPU (tests/test_gpu.c compiled with
// DEVICE_CUDA meaning the CPU, as test_gpu_harness does):
//   test_gpu_fixture             a test that fails mid-way with a tape node recorded, tensors scoped,
//                                grad mode off, TF32 on and a cuDNN setting in the environment; after
//                                it the fixture must have put all of it back. Exit 0 when it did.
//   test_gpu_fixture --watchdog  a test that hangs, under DETR_GPU_TEST_TIMEOUT=1: the watchdog must
//                                end the process, naming the test (ctest matches its message).
#define _POSIX_C_SOURCE 200809L
#include <check.h>

#include "core/runtime.h"
#include "autograd/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "nn/detr.h"
#include "nn/enact.h"
#include "train/checkpoint.h"

#define DEVICE_CUDA DEVICE_CPU
#define main test_gpu_main
#include "tests/test_gpu.c"
#undef main

START_TEST(fails_with_state_left_behind) {
  Tensor *x = tensor_scoped(tensor_ones(DEVICE_CPU, SHAPE(3, 4)));
  tensor_set_requires_grad(x, true);
  Tensor *y = op_relu(x);  // a tape node, and a scoped output
  (void)y;
  ck_assert_int_gt((int)autograd_tape_size(), 0);
  cuda_set_tf32(true);
  setenv("DETR_CUDNN_DETERMINISTIC", "0", 1);
  setenv("DETR_CUDNN_WORKSPACE_MB", "0", 1);
  autograd_set_grad_enabled(false);
  ck_abort_msg("a deliberate failure: the fixture must clean up after it");
}
END_TEST

START_TEST(hangs) {
  for (;;) pause();  // what a kernel that never finishes looks like from the host
}
END_TEST

int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  bool watchdog = argc > 1 && !strcmp(argv[1], "--watchdog");
  if (watchdog) setenv("DETR_GPU_TEST_TIMEOUT", "1", 1);
  Suite *s = suite_create("gpu_fixture");
  TCase *tc = gpu_tcase(s, "fixture");
  tcase_add_test(tc, watchdog ? hangs : fails_with_state_left_behind);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);  // as test_gpu
  ScopeMark before = tensor_scope_mark();
  srunner_run_all(sr, CK_SILENT);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  (void)test_gpu_main;
  if (watchdog) {
    fprintf(stderr, "test_gpu_fixture: the hanging test returned: no watchdog\n");
    return 1;
  }
  const char *problems[8];
  int n = 0;
  if (failed != 1) problems[n++] = "the deliberate failure was not counted";
  if (autograd_tape_size() != 0) problems[n++] = "the tape still holds the failed test's nodes";
  if (tensor_scope_size() != before) problems[n++] = "tensors scoped by the failed test are still in scope";
  if (!autograd_set_grad_enabled(true)) problems[n++] = "grad mode is still off";
  if (cuda_tf32_enabled()) problems[n++] = "TF32 is still on";
  if (getenv("DETR_CUDNN_DETERMINISTIC") || getenv("DETR_CUDNN_WORKSPACE_MB"))
    problems[n++] = "the cuDNN settings are still in the environment";
  for (int i = 0; i < n; i++) fprintf(stderr, "test_gpu_fixture: %s\n", problems[i]);
  if (!n)
    printf("test_gpu_fixture: after a failed test the tape, scope, grad mode, TF32 and cuDNN settings are clean\n");
  return n ? 1 : 0;
}
