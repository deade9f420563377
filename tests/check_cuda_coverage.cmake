# Every op runs on CUDA: fails (listing the places) when
#   - autograd/ or train/optim.c restricts an op to the CPU at run time (CPU_ONLY, "no CUDA
#     kernel", a DETR_CHECK that the device is the CPU), or
#   - an autograd/ source calls a CPU kernel cpu_X( without calling its CUDA twin cuda_X( (every
#     op dispatches with DISPATCH(dev, cpu_X(...), cuda_X(...)); a kernel with no twin cannot).
# Needs no GPU and no CUDA toolkit: it reads the sources. Usage (ctest runs it as cuda_coverage):
#   cmake -DSOURCE_DIR=<repository root> -P tests/check_cuda_coverage.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "check_cuda_coverage: pass -DSOURCE_DIR=<repository root>")
endif()

# CPU-only helpers with no op behind them: the CPU convolution's workspace sizes (the CUDA path
# asks cuDNN, cuda_conv2d_forward_workspace / cuda_conv2d_backward_workspace).
set(cpu_only_helpers "cpu_conv2d_forward_workspace_floats(" "cpu_conv2d_backward_workspace_floats(")
# Inference's fused convolution (op_conv2d_fused): the CPU fuses the epilogue into oneDNN's
# convolution; on CUDA the op runs op_conv2d, op_add and op_relu, each with its CUDA kernel.
list(APPEND cpu_only_helpers "cpu_conv2d_forward_fused(" "cpu_conv2d_forward_fused_workspace_floats(")
# Inference's linear with its epilogue in the GEMM (op_linear recording nothing): on CUDA, as in
# training, the GEMM and then the bias (and ReLU) kernel.
list(APPEND cpu_only_helpers "cpu_linear_fused(")
# Its bf16 form on a weight kept in bf16 (tensor_keep_bf16, CPU tensors only): on CUDA a model keeps
# no copies and its linear layers round as in training.
list(APPEND cpu_only_helpers "cpu_linear_bf16(")
# Training's bf16 linear with its bias and ReLU in the GEMM's epilogue: on CUDA the GEMM on the
# copies, then the bias kernel.
list(APPEND cpu_only_helpers "cpu_linear_bf16_rounded(")
# bf16 mode's convolution copies rounded once (op_conv2d): which passes read them. CUDA's bf16
# convolutions stage their own copies per pass (kernels/cuda/conv.cu).
list(APPEND cpu_only_helpers "cpu_conv2d_takes_bf16(" "cpu_conv2d_x16_numel(")

file(GLOB op_sources "${SOURCE_DIR}/autograd/*.c")
file(GLOB op_headers "${SOURCE_DIR}/autograd/*.h")
set(problems "")
foreach(f ${op_sources} ${op_headers} "${SOURCE_DIR}/train/optim.c")
  file(READ "${f}" text)
  string(REGEX MATCHALL "CPU_ONLY|no CUDA kernel|DETR_CHECK\\([^;]*== *DEVICE_CPU[^;]*;" hits "${text}")
  foreach(h ${hits})
    list(APPEND problems "${f}: run-time CPU restriction: ${h}")
  endforeach()
endforeach()
foreach(f ${op_sources})
  file(READ "${f}" text)
  string(REGEX MATCHALL "cpu_[a-z0-9_]+\\(" calls "${text}")
  if(calls)
    list(REMOVE_DUPLICATES calls)
  endif()
  foreach(c ${calls})
    if(c IN_LIST cpu_only_helpers)
      continue()
    endif()
    string(REGEX REPLACE "^cpu_" "cuda_" twin "${c}")
    string(FIND "${text}" "${twin}" at)
    if(at EQUAL -1)
      list(APPEND problems "${f}: calls ${c}...) but never ${twin}...): no CUDA path")
    endif()
  endforeach()
endforeach()
list(LENGTH op_sources n_sources)
if(n_sources EQUAL 0)
  message(FATAL_ERROR "check_cuda_coverage: no autograd sources under ${SOURCE_DIR}")
endif()
if(problems)
  string(REPLACE ";" "\n  " listed "${problems}")
  message(FATAL_ERROR "ops that cannot run on CUDA:\n  ${listed}")
endif()
message(STATUS "cuda_coverage: ${n_sources} autograd sources, every CPU kernel call has its CUDA twin")
