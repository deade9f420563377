# The CUDA kernels that docs/cuda.md calls bitwise equal to their CPU twins must not contain a fused
# multiply-add: nvcc contracts `a * b + c` into one FMA (one rounding) by default, the CPU build
# rounds the product and the sum separately (GCC in ISO C mode: -ffp-contract=off). Such a kernel
# writes its arithmetic with __fmul_rn / __fadd_rn (never contracted, by nvcc or ptxas) or has no
# multiply-add at all. Reads the PTX that the build writes for the kernel files (tests/CMakeLists.txt,
# target cuda_ptx); needs no GPU. Usage (ctest runs it as cuda_no_fma):
#   cmake -DPTX_DIR=<build>/tests/ptx -P tests/check_no_fma.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT PTX_DIR)
  message(FATAL_ERROR "check_no_fma: pass -DPTX_DIR=<folder with the .ptx files>")
endif()

# file:kernel pairs: the kernels of the bitwise claims (docs/cuda.md, "Determinism").
set(bitwise_kernels
  elementwise:fill_kernel elementwise:uniform_kernel elementwise:accumulate_kernel
  elementwise:dropout_forward_kernel elementwise:dropout_backward_kernel
  shape:permute_kernel shape:copy_axis_range_kernel shape:index_select_kernel shape:index_add_kernel
  conv:maxpool2d_forward_kernel conv:maxpool2d_backward_kernel
  reduce:reduce_sum_thread_kernel)
# A kernel that is not bitwise, as a control: its multiply-adds are contracted, so the check sees FMAs
# (if it saw none here, the PTX would not be what the check assumes and the check would prove nothing).
set(control_kernel elementwise:unary_backward_kernel)

set(problems "")
foreach(pair ${bitwise_kernels} ${control_kernel})
  string(REPLACE ":" ";" parts "${pair}")
  list(GET parts 0 file)
  list(GET parts 1 kernel)
  set(ptx "${PTX_DIR}/${file}.ptx")
  if(NOT EXISTS "${ptx}")
    message(FATAL_ERROR "check_no_fma: ${ptx} is missing (build the cuda_ptx target)")
  endif()
  file(READ "${ptx}" text)
  # The kernel's entry: ".entry <mangled name containing the kernel's name>(" up to the "}" that
  # closes its body (a line of its own in PTX).
  string(REGEX MATCH "\\.entry [A-Za-z0-9_]*${kernel}[A-Za-z0-9_]*\\(" head "${text}")
  if(NOT head)
    list(APPEND problems "${file}.cu: no kernel ${kernel} in the PTX")
    continue()
  endif()
  string(FIND "${text}" "${head}" at)
  string(SUBSTRING "${text}" ${at} -1 rest)
  string(FIND "${rest}" "\n}\n" end)
  string(SUBSTRING "${rest}" 0 ${end} body)
  string(REGEX MATCHALL "fma\\.[a-z0-9.]+" fmas "${body}")
  string(REGEX MATCHALL "\n[ \t]*call" calls "${body}")
  list(LENGTH fmas n_fma)
  if(pair IN_LIST control_kernel)
    if(n_fma EQUAL 0)
      list(APPEND problems "${file}.cu: ${kernel} (control) has no FMA: nvcc no longer contracts, or the PTX changed")
    endif()
  elseif(n_fma GREATER 0)
    list(REMOVE_DUPLICATES fmas)
    list(APPEND problems "${file}.cu: ${kernel} has ${n_fma} fused multiply-adds (${fmas}): not bitwise the CPU's")
  elseif(calls)
    list(APPEND problems "${file}.cu: ${kernel} calls a device function: its body is not all in the PTX checked")
  endif()
endforeach()
if(problems)
  string(REPLACE ";" "\n  " listed "${problems}")
  message(FATAL_ERROR "kernels documented as bitwise equal to the CPU:\n  ${listed}")
endif()
list(LENGTH bitwise_kernels n)
message(STATUS "cuda_no_fma: ${n} kernels without fused multiply-adds")
