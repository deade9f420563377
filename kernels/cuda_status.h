// What the CUDA runtime's answer to "how many GPUs?" means, in words. Plain C with no CUDA header:
// the CUDA backend (kernels/cuda/runtime.cu, cuda_device_probe) calls it with the real status, and
// tests/test_backend.c calls it with each status in every build, GPU or not. The codes are the CUDA
// runtime's cudaError_t values; runtime.cu static_asserts that they match the toolkit's.
//
// The distinction it draws: a machine with no NVIDIA driver or no GPU has no CUDA device (tests
// skip, `--device cuda` is refused with the reason); a machine whose driver or GPUs cannot be used
// (a driver older than the runtime this build links, mismatched driver parts, busy GPUs, a fabric
// manager that is not running) has an error, which is reported as one and never as a skip.
#pragma once
#include <stddef.h>
#include <stdio.h>

#define DETR_CUDA_SUCCESS 0
#define DETR_CUDA_ERROR_INITIALIZATION 3            // cudaErrorInitializationError
#define DETR_CUDA_ERROR_INSUFFICIENT_DRIVER 35      // cudaErrorInsufficientDriver
#define DETR_CUDA_ERROR_DEVICES_UNAVAILABLE 46      // cudaErrorDevicesUnavailable
#define DETR_CUDA_ERROR_NO_DEVICE 100               // cudaErrorNoDevice
#define DETR_CUDA_ERROR_SYSTEM_NOT_READY 802        // cudaErrorSystemNotReady
#define DETR_CUDA_ERROR_SYSTEM_DRIVER_MISMATCH 803  // cudaErrorSystemDriverMismatch
#define DETR_CUDA_ERROR_COMPAT_NOT_SUPPORTED 804    // cudaErrorCompatNotSupportedOnDevice

// status, count: cudaGetDeviceCount's status and count; driver, runtime: cudaDriverGetVersion's and
// cudaRuntimeGetVersion's values (1000 * major + 10 * minor; driver 0: no driver is installed);
// name, text: cudaGetErrorName / cudaGetErrorString of status; visible: $CUDA_VISIBLE_DEVICES or
// NULL. Returns the number of usable devices (> 0, why = ""); 0 with why set when the machine has
// none for an ordinary reason (no NVIDIA driver, or the driver sees no GPU); -1 with why set when
// CUDA is there but cannot be used.
static inline int cuda_probe_explain(int status, int count, int driver, int runtime, const char *name, const char *text,
                                     const char *visible, char *why, size_t cap) {
  int dmaj = driver / 1000, dmin = driver % 1000 / 10, rmaj = runtime / 1000, rmin = runtime % 1000 / 10;
  if (cap) why[0] = 0;
  if (status == DETR_CUDA_SUCCESS && count > 0) return count;
  if (status == DETR_CUDA_SUCCESS || status == DETR_CUDA_ERROR_NO_DEVICE) {
    if (visible)
      snprintf(why, cap, "no CUDA device is visible (CUDA_VISIBLE_DEVICES=\"%s\"; NVIDIA driver for CUDA %d.%d)",
               visible, dmaj, dmin);
    else snprintf(why, cap, "the NVIDIA driver (for CUDA %d.%d) finds no GPU", dmaj, dmin);
    return 0;
  }
  if (status == DETR_CUDA_ERROR_INSUFFICIENT_DRIVER && driver == 0) {
    snprintf(why, cap, "no NVIDIA driver is installed (libcuda.so.1 was not found)");
    return 0;
  }
  switch (status) {
    case DETR_CUDA_ERROR_INSUFFICIENT_DRIVER:
      snprintf(why, cap,
               "the NVIDIA driver supports CUDA %d.%d, older than this build's CUDA runtime %d.%d: install a driver "
               "for CUDA %d.%d or newer (%s)",
               dmaj, dmin, rmaj, rmin, rmaj, rmin, name);
      break;
    case DETR_CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
      snprintf(why, cap,
               "the NVIDIA kernel module and the user-space driver (libcuda) are different versions: reload the "
               "module or reboot after a driver update (%s: %s)",
               name, text);
      break;
    case DETR_CUDA_ERROR_SYSTEM_NOT_READY:
      snprintf(why, cap,
               "the GPUs are not ready; on NVSwitch systems (HGX/DGX) nvidia-fabricmanager must be running (%s: %s)",
               name, text);
      break;
    case DETR_CUDA_ERROR_DEVICES_UNAVAILABLE:
      snprintf(why, cap,
               "every GPU is busy or unavailable: exclusive-process or prohibited compute mode, or in use "
               "(nvidia-smi -q -d COMPUTE) (%s: %s)",
               name, text);
      break;
    case DETR_CUDA_ERROR_COMPAT_NOT_SUPPORTED:
      snprintf(why, cap,
               "a forward-compatibility libcuda (for CUDA %d.%d) is loaded for a GPU that does not support it (%s: %s)",
               dmaj, dmin, name, text);
      break;
    default:
      snprintf(why, cap, "CUDA cannot be initialised: cudaGetDeviceCount failed with %s (%d): %s", name, status, text);
  }
  return -1;
}
