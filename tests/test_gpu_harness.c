// A self-check of tests/test_gpu.c's op and model comparisons that needs no GPU: the test file is
// compiled here with DEVICE_CUDA meaning the CPU, so each comparison runs CPU against CPU. That
// exercises the harness itself - copying inputs, seeding gradients, comparing outputs, gradients,
// loss terms, matches, ENACT regions, the run-to-run check, the training loop, the allocation count
// and the checkpoint round trip - and must pass with zero error. It verifies nothing about the CUDA
// kernels (test_gpu does, on a GPU); it keeps the GPU test from failing for its own bugs the first
// time it meets a device. The kernel-level tests (raw device pointers) are not run here.
#define _POSIX_C_SOURCE 200809L  // mkdtemp, setenv under -std=c11
#include <check.h>

#include "core/runtime.h"
#include "autograd/ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "nn/detr.h"
#include "nn/enact.h"
#include "train/checkpoint.h"

// The headers above are included once (#pragma once): the enum keeps its values, and from here on
// the test code's "GPU" tensors are CPU tensors.
#define DEVICE_CUDA DEVICE_CPU
#define main test_gpu_main
#include "tests/test_gpu.c"
#undef main

int main(void) {
  runtime_bind(runtime_create());             // the thread that runs ops (core/runtime.h)
  setenv("DETR_GPU_TEST_TIMEOUT", "600", 0);  // the CPU runs both sides here: slower than a GPU
  Suite *s = suite_create("gpu_harness");
  TCase *tc = gpu_tcase(s, "cpu_as_gpu");  // test_gpu's fixture: clean tape and scope after each test
  tcase_add_test(tc, autograd_linear);
  tcase_add_test(tc, autograd_conv2d);
  tcase_add_test(tc, autograd_add_broadcast);
  tcase_add_test(tc, autograd_enact_cluster);
  tcase_add_test(tc, ops_elementwise);
  tcase_add_test(tc, ops_dropout);
  tcase_add_test(tc, ops_reduce);
  tcase_add_test(tc, ops_matmul);
  tcase_add_test(tc, ops_pool_and_norm);
  tcase_add_test(tc, ops_softmax_layernorm);
  tcase_add_test(tc, ops_shape);
  tcase_add_test(tc, ops_losses_and_boxes);
  tcase_add_test(tc, ops_enact_smooth);
  tcase_add_test(tc, ops_enact_regions);
  tcase_add_test(tc, ops_cluster_attention);
  tcase_add_test(tc, ops_coverage);  // after every op test
  tcase_add_test(tc, model_detr_step);
  tcase_add_test(tc, model_detr_enact_step);
  tcase_add_test(tc, model_anchor_step);
  tcase_add_test(tc, model_training_steps);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  (void)test_gpu_main;  // test_gpu's own main is not used
  return failed ? 1 : 0;
}
