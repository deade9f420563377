#!/usr/bin/env bash
# Set-up, build and the default test suite: the README's test command. CI runs it with --full.
#   1. installs the Debian packages (tools/setup.sh)
#   2. builds with warnings as errors, the CUDA backend included when nvcc is present
#   3. runs ctest (GPU tests skip themselves without a device; the `slow` label is left out), with
#      TensorBoard's reader pip-installed in build/tb-venv for the event-file test
#   4. rebuilds with AddressSanitizer + UndefinedBehaviorSanitizer (at -O1, ASan's recommended
#      level: the same tests take 0.6x the time they take at -O0) and runs the unit tests again,
#      but for the runs of the built `detr` tool (label `train`) and the source checks (`source`)
#   5. ThreadSanitizer over the C API's two-thread tests (test_api)
#   6. the fuzz smoke run: every libFuzzer harness over its committed corpus, then 5 s of fuzzing
#      each, two at a time (tools/fuzz.sh --smoke; skipped with a message without clang)
#   bash tools/test.sh [--full]
# --full (CI): step 4 runs the `train` label under the sanitizers too (a few minutes more).
set -euo pipefail
cd "$(dirname "$0")/.."
full=false
case "${1:-}" in
  --full) full=true ;;
  '') ;;
  *) echo "tools/test.sh: unknown argument $1 (tools/test.sh [--full])" >&2; exit 2 ;;
esac
bash tools/setup.sh
jobs=$(nproc)

cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=ON; fi
cmake -S . -B build -DDETR_CUDA=$cuda -DDETR_WERROR=ON
cmake --build build -j"$jobs"
# TensorBoard's own reader for the event-file test (tests/tensorboard_test.sh): PyPI's tensorboard in a
# venv beside the build; where pip cannot reach PyPI, that test skips itself and says so.
tb_python=$PWD/build/tb-venv/bin/python
if ! "$tb_python" -c 'import tensorboard' 2>/dev/null; then
  { python3 -m venv build/tb-venv && "$tb_python" -m pip install -q tensorboard; } ||
    echo "tools/test.sh: could not install the tensorboard package: the tensorboard_reader test will skip"
fi
export DETR_TB_PYTHON=$tb_python
(cd build && ctest --output-on-failure -j"$jobs" -LE slow)

cmake -S . -B build-asan -DDETR_CUDA=OFF -DDETR_WERROR=ON -DDETR_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS_DEBUG="-g -O1"
cmake --build build-asan -j"$jobs"
skip='train|source'
$full && skip=source
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j"$jobs" -L unit -LE "$skip")

# ThreadSanitizer over the C API's threads: two models detecting on two threads at once, and one model
# from two (test_api). OpenMP and OpenBLAS at one thread: their runtimes are not instrumented. Without
# address-space randomisation (setarch -R): kernels that randomise mmap with more bits than TSan's
# memory layout allows make it stop with "unexpected memory mapping".
cmake -S . -B build-tsan -DDETR_CUDA=OFF -DDETR_WERROR=ON -DDETR_TSAN=ON -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS_DEBUG="-g -O1"
cmake --build build-tsan -j"$jobs" --target test_api
(cd build-tsan && OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 \
   setarch "$(uname -m)" -R ctest --output-on-failure -R '^api$')

FUZZ_JOBS=$jobs bash tools/fuzz.sh --smoke
