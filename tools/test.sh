#!/usr/bin/env bash
# Set-up, build and the full default test suite: the README's test command and what CI runs.
#   1. installs the Debian packages (tools/setup.sh)
#   2. builds with warnings as errors, the CUDA backend included when nvcc is present
#   3. runs ctest (GPU tests skip themselves without a device)
#   4. rebuilds with AddressSanitizer + UndefinedBehaviorSanitizer and runs the unit tests again
#   5. the fuzz smoke run: every libFuzzer harness over its committed corpus, then 5 s of fuzzing
#      each (tools/fuzz.sh --smoke, about a minute; skipped with a message without clang)
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
jobs=$(nproc)

cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then cuda=ON; fi
cmake -S . -B build -DDETR_CUDA=$cuda -DDETR_WERROR=ON
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs" -LE slow)

cmake -S . -B build-asan -DDETR_CUDA=OFF -DDETR_WERROR=ON -DDETR_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
   ctest --output-on-failure -j"$jobs" -L unit)

FUZZ_JOBS=$jobs bash tools/fuzz.sh --smoke
