// Backend rules that need no GPU, checked in every build (CPU-only too): what a CUDA device probe's
// status means (kernels/cuda_status.h: a missing driver is "no device", an old driver is an error),
// the choice of a cuDNN algorithm under a workspace limit (kernels/conv_algo.h), fills that write
// the exact bits of -0.0 (kernels/elementwise_math.h, cpu_fill; cuda_fill asks the same helper), and
// the tf32 config key. On a machine with CUDA, the live probe must not report an error either.
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/runtime.h"
#include "kernels/conv_algo.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda_status.h"
#include "kernels/elementwise_math.h"
#include "nn/detr.h"
#if DETR_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif

static int probe(int status, int count, int driver, char *why) {
  return cuda_probe_explain(status, count, driver, 13000, "cudaErrorX", "some text", NULL, why, 512);
}

START_TEST(probe_no_driver_is_no_device) {
  char why[512];
  // What the CUDA 13 runtime reports on a machine without libcuda.so.1 (this one, when it has no GPU).
  ck_assert_int_eq(probe(DETR_CUDA_ERROR_INSUFFICIENT_DRIVER, 0, 0, why), 0);
  ck_assert_msg(strstr(why, "no NVIDIA driver"), "%s", why);
  // A driver but no GPU, or none visible.
  ck_assert_int_eq(probe(DETR_CUDA_ERROR_NO_DEVICE, 0, 13000, why), 0);
  ck_assert_msg(strstr(why, "finds no GPU") && strstr(why, "13.0"), "%s", why);
  ck_assert_int_eq(cuda_probe_explain(DETR_CUDA_ERROR_NO_DEVICE, 0, 12080, 13000, "n", "t", "", why, sizeof why), 0);
  ck_assert_msg(strstr(why, "CUDA_VISIBLE_DEVICES=\"\""), "%s", why);
  ck_assert_int_eq(probe(DETR_CUDA_SUCCESS, 0, 13000, why), 0);
}
END_TEST

START_TEST(probe_old_driver_is_an_error) {
  char why[512];
  // A driver for CUDA 12.8 under this build's 13.0 runtime: an error naming both versions, not a skip.
  ck_assert_int_eq(probe(DETR_CUDA_ERROR_INSUFFICIENT_DRIVER, 0, 12080, why), -1);
  ck_assert_msg(strstr(why, "12.8") && strstr(why, "13.0") && strstr(why, "cudaErrorX"), "%s", why);
  // Every other failure is an error too, with its name and text.
  const int errors[] = {DETR_CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, DETR_CUDA_ERROR_SYSTEM_NOT_READY,
                        DETR_CUDA_ERROR_DEVICES_UNAVAILABLE,    DETR_CUDA_ERROR_COMPAT_NOT_SUPPORTED,
                        DETR_CUDA_ERROR_INITIALIZATION,         999};
  for (size_t i = 0; i < sizeof errors / sizeof *errors; i++) {
    ck_assert_int_eq(probe(errors[i], 0, 13000, why), -1);
    ck_assert_msg(strstr(why, "cudaErrorX") && strstr(why, "some text"), "status %d: %s", errors[i], why);
  }
  ck_assert_msg(probe(DETR_CUDA_ERROR_SYSTEM_NOT_READY, 0, 13000, why) < 0 && strstr(why, "fabricmanager"), "%s", why);
}
END_TEST

START_TEST(probe_devices) {
  char why[512];
  ck_assert_int_eq(probe(DETR_CUDA_SUCCESS, 2, 13000, why), 2);
  ck_assert_str_eq(why, "");
#if DETR_HAVE_CUDA
  // This machine: a GPU, or a clean "no device" with its reason; never an error in a test setup
  // that is meant to work (an error here is the message `--device cuda` would print).
  char live[512];
  int n = cuda_device_probe(live, sizeof live);
  ck_assert_msg(n >= 0, "cuda_device_probe: %s", live);
  ck_assert_msg(n > 0 || strlen(live) > 0, "no device and no reason");
#endif
}
END_TEST

static ConvAlgoOption opt(int algo, bool usable, bool det, size_t bytes) {
  return (ConvAlgoOption){.algo = algo, .usable = usable, .deterministic = det, .bytes = bytes};
}

START_TEST(conv_algo_respects_workspace_limit) {
  const size_t MiB = (size_t)1 << 20;
  // cuDNN's heuristic order: a fast algorithm wanting 3 GiB first.
  ConvAlgoOption o[] = {opt(5, true, false, 3072 * MiB), opt(1, true, false, 8 * MiB), opt(0, true, true, 0)};
  ck_assert_int_eq(conv_algo_pick(o, 3, false, 1024 * MiB), 1);  // the first that fits, not the first
  ck_assert_int_eq(conv_algo_pick(o, 3, false, 4096 * MiB), 0);  // fits: heuristic order
  ck_assert_int_eq(conv_algo_pick(o, 3, false, 0), 2);           // only the zero-workspace one
  ck_assert_int_eq(conv_algo_pick(o, 3, true, 1024 * MiB), 2);   // determinism required
  // Nothing fits: the smallest workspace (the earliest among equals), never a failure.
  ConvAlgoOption big[] = {opt(2, true, true, 900 * MiB), opt(3, true, true, 300 * MiB), opt(4, true, true, 300 * MiB)};
  ck_assert_int_eq(conv_algo_pick(big, 3, true, 100 * MiB), 1);
  // Unusable candidates are skipped whatever their size; none usable: -1.
  ConvAlgoOption bad[] = {opt(1, false, true, 0), opt(2, true, false, 0)};
  ck_assert_int_eq(conv_algo_pick(bad, 2, false, 0), 1);
  ck_assert_int_eq(conv_algo_pick(bad, 2, true, 0), -1);
  ck_assert_int_eq(conv_algo_pick(bad, 0, false, 0), -1);
}
END_TEST

static uint32_t bits(float v) {
  uint32_t b;
  memcpy(&b, &v, sizeof b);
  return b;
}

START_TEST(fill_writes_exact_bits) {
  ck_assert(fill_is_zero_bits(0.0f));
  ck_assert(!fill_is_zero_bits(-0.0f));  // equal to 0.0f, but not the same bits
  ck_assert(!fill_is_zero_bits(1e-45f));
  ck_assert(!fill_is_zero_bits(NAN));
  const float values[] = {-0.0f, 0.0f, 1.5f, -INFINITY};
  float x[37];
  for (size_t v = 0; v < sizeof values / sizeof *values; v++) {
    for (int i = 0; i < 37; i++) x[i] = 7.0f;
    cpu_fill(x, 37, values[v]);
    for (int i = 0; i < 37; i++)
      ck_assert_msg(bits(x[i]) == bits(values[v]), "cpu_fill(%g): element %d has bits %08x, expected %08x", values[v],
                    i, bits(x[i]), bits(values[v]));
  }
  cpu_fill(x, 37, -0.0f);
  ck_assert(1.0f / x[36] == -INFINITY);  // what the sign of a zero is for
}
END_TEST

START_TEST(tf32_config_key) {
  DetrConfig cfg;
  char err[256], text[4096];
  ck_assert_int_eq(detr_config_preset("detr-r50", &cfg), 0);
  ck_assert(!cfg.tf32);  // off by default: parity with the CPU
  ck_assert_int_eq(detr_config_set(&cfg, "tf32", "true", err, sizeof err), 0);
  ck_assert(cfg.tf32);
  ck_assert_int_ne(detr_config_set(&cfg, "tf32", "fast", err, sizeof err), 0);
  detr_config_format(&cfg, text, sizeof text);
  ck_assert_msg(strstr(text, "tf32=true\n"), "%s", text);
  ck_assert_int_eq(detr_config_set(&cfg, "tf32", "0", err, sizeof err), 0);
  ck_assert(!cfg.tf32);
}
END_TEST

int main(void) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  Suite *s = suite_create("backend");
  TCase *tc = tcase_create("backend");
  tcase_add_test(tc, probe_no_driver_is_no_device);
  tcase_add_test(tc, probe_old_driver_is_an_error);
  tcase_add_test(tc, probe_devices);
  tcase_add_test(tc, conv_algo_respects_workspace_limit);
  tcase_add_test(tc, fill_writes_exact_bits);
  tcase_add_test(tc, tf32_config_key);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
