#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/, clang, ASan + UBSan) into build-fuzz/ and runs them one
# at a time (fuzz/README.md):
#   bash tools/fuzz.sh [SECONDS] [HARNESS...]   each harness for SECONDS (default 600), starting
#                                               from fuzz/corpus/<h>/; new inputs go to
#                                               build-fuzz/corpus/<h>/, findings to build-fuzz/artifacts/<h>/
#   bash tools/fuzz.sh --smoke                  what tools/test.sh runs: every input of every committed
#                                               corpus (the regression inputs), then 5 s of fuzzing each
#   bash tools/fuzz.sh --seeds                  rewrites the seed-* files of fuzz/corpus/ (fuzz_seeds)
# Without clang or its libFuzzer runtime, --smoke prints why and succeeds (the rest of the project
# does not need them); the other modes fail. Environment: FUZZ_JOBS (build jobs, default nproc),
# FUZZ_ARGS (more libFuzzer flags).
set -euo pipefail
cd "$(dirname "$0")/.."

HARNESSES=(safetensors model_load checkpoint coco coco_gz cocoeval_results image config metrics)
declare -A DICT=([safetensors]=safetensors [model_load]=safetensors [checkpoint]=safetensors [coco]=json
                 [coco_gz]=json [cocoeval_results]=json [image]=image [config]=config [metrics]=metrics)

mode=run seconds=600
case "${1:-}" in
  --smoke) mode=smoke seconds=5; shift ;;
  --seeds) mode=seeds; shift ;;
  -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
  ''|*[!0-9]*) ;;
  *) seconds=$1; shift ;;
esac
if [ $# -gt 0 ]; then
  for h in "$@"; do
    [ -n "${DICT[$h]:-}" ] || { echo "fuzz: unknown harness '$h' (one of ${HARNESSES[*]})" >&2; exit 2; }
  done
  HARNESSES=("$@")
fi

# clang and libFuzzer's runtime (Debian: clang, libclang-rt-dev).
missing=""
if ! command -v clang >/dev/null 2>&1; then
  missing="clang is not installed"
else
  probe=$(mktemp -d)
  printf '#include <omp.h>\n#include <stddef.h>\n#include <stdint.h>\n%s\n' \
    'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return omp_get_max_threads() < 0; }' >"$probe/p.c"
  clang -fopenmp -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" >/dev/null 2>&1 ||
    missing="clang cannot build a libFuzzer target with OpenMP (libclang-rt-dev or libomp-dev missing)"
  rm -rf "$probe"
fi
if [ -n "$missing" ]; then
  echo "fuzz: SKIPPED: $missing; install clang, libclang-rt-dev and libomp-dev (tools/setup.sh does) to fuzz" >&2
  [ "$mode" = smoke ] && exit 0
  exit 1
fi

jobs=${FUZZ_JOBS:-$(nproc)}
cmake -S . -B build-fuzz -DDETR_FUZZ=ON -DCMAKE_C_COMPILER=clang -DDETR_WERROR=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-fuzz -j"$jobs" >build-fuzz/build.log 2>&1 || { cat build-fuzz/build.log; exit 1; }

if [ "$mode" = seeds ]; then
  for h in "${HARNESSES[@]}"; do rm -f fuzz/corpus/"$h"/seed-*; done
  build-fuzz/fuzz/fuzz_seeds fuzz/corpus
  du -sh fuzz/corpus
  exit 0
fi

mkdir -p build-fuzz/logs
summary=build-fuzz/logs/summary.txt
printf '%-17s %-6s %10s %7s %7s %8s %7s\n' harness result execs exec/s cov ft corpus >"$summary"
# One harness: its run, then its summary row (and the lines of a failure) in build-fuzz/logs/<h>.row.
fuzz_one() {
  local h=$1 work art log rc
  if [ "$mode" = smoke ]; then
    work=build-fuzz/corpus-smoke/$h
    rm -rf "$work"
  else
    work=build-fuzz/corpus/$h
  fi
  art=build-fuzz/artifacts/$h
  log=build-fuzz/logs/$h.log
  mkdir -p "$work" "$art"
  # -close_fd_mask=3: the readers' warnings (skipped items) and `detr info`'s output would flood
  # the log; sanitizer reports and the harnesses' own assertion messages still reach it.
  set +e
  # shellcheck disable=SC2086
  nice -n 10 build-fuzz/fuzz/fuzz_"$h" -dict=fuzz/dict/"${DICT[$h]}".dict -max_total_time="$seconds" \
    -rss_limit_mb=2048 -timeout=10 -close_fd_mask=3 -print_final_stats=1 -artifact_prefix="$art"/ \
    ${FUZZ_ARGS:-} "$work" fuzz/corpus/"$h" >"$log" 2>&1
  rc=$?
  set -e
  local execs rate last cov ft files result=ok
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1 || true)
  cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  files=$(find "$work" fuzz/corpus/"$h" -type f | wc -l)
  [ $rc -eq 0 ] || result=FAIL
  {
    printf '%-17s %-6s %10s %7s %7s %8s %7s\n' "$h" "$result" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "$files"
    if [ $rc -ne 0 ]; then
      grep -E 'ERROR|runtime error|SUMMARY|assertion|Test unit written' "$log" | head -8 | sed 's/^/    /'
      echo "    log: $log; reproduce: build-fuzz/fuzz/fuzz_$h <the unit written above>"
    fi
  } >build-fuzz/logs/"$h".row
}

# The smoke run fuzzes as many harnesses at once as there are jobs (each is one process on one
# core); a long run takes them one at a time, each with the whole machine.
parallel=1
[ "$mode" = smoke ] && parallel=$jobs
running=0
for h in "${HARNESSES[@]}"; do
  fuzz_one "$h" &
  running=$((running + 1))
  if [ $running -ge "$parallel" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait
failed=()
for h in "${HARNESSES[@]}"; do
  tee -a "$summary" <build-fuzz/logs/"$h".row
  grep -q "^$h *FAIL" build-fuzz/logs/"$h".row && failed+=("$h")
done
[ "$mode" = run ] && echo "fuzz: summary in $summary; new corpus inputs in build-fuzz/corpus/"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (fix the reader, then add the input to fuzz/corpus/<harness>/ as crash-<what>)" >&2
  exit 1
fi
echo "fuzz: ${#HARNESSES[@]} harnesses passed ($mode, ${seconds}s each)"
