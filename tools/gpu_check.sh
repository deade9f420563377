#!/usr/bin/env bash
# tools/gpu_check.sh: everything the CUDA backend has to prove on a real GPU, in one command and
# under 10 minutes on one H100, with one report file (docs/cuda.md, "Checking on a GPU").
#
#   bash tools/gpu_check.sh [--out DIR] [--build DIR] [--bundle DIR] [--use-bundle] [--jobs N]
#                           [--arch SM] [--budget SECONDS] [--no-sanitizer] [--no-werror]
#                           [--only REGEX]   (the build, then only the steps whose names match)
#                           [--build-only] [--targets "T ..."]   (configure and build, those targets only; no GPU needed)
#
# 1. builds for the GPU it finds (nvidia-smi's compute capability; without one, for DETR_CUDA_ARCHS'
#    default 80;90), against the system's packages or, when the system lacks them (a bare, offline
#    machine with only the CUDA toolkit, CMake and a compiler), against the .deb files of
#    tools/gpu_bundle.sh unpacked into a private prefix (--use-bundle: always the bundle);
# 2. without a usable GPU: says so with the reason and exits 3 (an unusable CUDA - a driver older
#    than the runtime - is the same, with that reason);
# 3. ctest -L gpu, plainly and with CUDA_LAUNCH_BLOCKING=1;
# 4. `detr step` on CUDA against the CPU (same weights, batch and dropout) for the tiny, small and
#    R50 presets, each with and without ENACT (tests/step_compare.c judges);
# 5. bench_step --device cuda: detr-r50 at 800x1066, batch 2, plain, with ENACT, with TF32;
# 6. detr synth, then the tiny preset trained for 200 steps on the GPU (its first steps against the
#    same run on the CPU), and detr eval of the result on the GPU;
# 7. the GPU tests under compute-sanitizer memcheck and racecheck (our kernels; with what is left
#    of the budget, case by case);
# and writes OUT/report.md (steps, status, times, details; logs in OUT/logs/).
#
# Every step has a time cap and the whole run a budget (--budget, default 570 s): a step that would
# start past it is reported as skipped. Exit status: 0 every check passed (warnings allowed), 1 a
# check failed, 2 usage or build failure, 3 no usable GPU (after building).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
t_start=$(date +%s)
out=$root/out/gpu-check
build=$root/build-gpu-check
bundle=${DETR_GPU_BUNDLE:-$root/gpu-bundle}
use_bundle=0
jobs=$(nproc 2>/dev/null || echo 4)
arch=""
budget=570
sanitizer=1
werror=ON
only=""
build_only=0
targets=""
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --bundle) bundle=$2; shift 2 ;;
    --use-bundle) use_bundle=1; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --no-sanitizer) sanitizer=0; shift ;;
    --no-werror) werror=OFF; shift ;;
    --only) only=$2; shift 2 ;;  # a host compiler newer than ours may warn where ours did not
    --build-only) build_only=1; shift ;;  # tools/gpu_bench.sh builds this way
    --targets) targets=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out/logs"
report=$out/report.md
logs=$out/logs

# --- bookkeeping: each step's row (name | status | seconds | note) and free-form details ---

rows=()
details=()
failed=0
elapsed() { echo $(( $(date +%s) - t_start )); }
say() { echo "gpu_check: $*"; }
row() {  # row NAME STATUS SECONDS NOTE
  rows+=("| $1 | $2 | $3 | $4 |")
  say "$(printf '%-22s %-8s %5ss  %s' "$1" "$2" "$3" "$4")"
  case $2 in FAIL|TIMEOUT) failed=1 ;; esac
}
detail() { details+=("$1"); }

write_report() {
  {
    echo "# detr-c GPU check"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet 2>/dev/null || echo ' (with local changes)'), total $(elapsed) s."
    echo
    echo "| step | status | s | note |"
    echo "|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
    echo
    for d in "${details[@]}"; do
      printf '%s\n\n' "$d"
    done
    echo "Logs: $logs/"
  } > "$report"
}
trap write_report EXIT

# run_step NAME CAP_SECONDS CMD...: runs CMD with a time cap (and within the budget), output to
# logs/NAME.log. Sets $step_rc (124: timed out) and $step_secs; records nothing (the caller does).
run_step() {
  local name=$1 cap=$2
  shift 2
  local left=$(( budget - $(elapsed) - 5 ))
  step_secs=0
  if [ -n "$only" ] && [ "$name" != configure ] && [ "$name" != build ] && ! [[ $name =~ $only ]]; then
    step_rc=200  # not run: --only
    return
  fi
  if [ "$left" -lt 15 ]; then
    step_rc=200  # not run: the budget is spent
    return
  fi
  [ "$cap" -gt "$left" ] && cap=$left
  local t0
  t0=$(date +%s)
  timeout --kill-after=10 "$cap" "$@" > "$logs/$name.log" 2>&1
  step_rc=$?
  step_secs=$(( $(date +%s) - t0 ))
}

# check NAME CAP CMD...: run_step plus the row: PASS on status 0, SKIP when the budget was spent,
# TIMEOUT, else FAIL with the log's last line.
check() {
  local name=$1
  run_step "$@"
  case $step_rc in
    0) row "$name" PASS "$step_secs" "" ;;
    200) row "$name" SKIP 0 "time budget spent or --only" ;;
    124|137) row "$name" TIMEOUT "$step_secs" "cap reached: see logs/$name.log" ;;
    *) row "$name" FAIL "$step_secs" "exit $step_rc: $(tail -n 1 "$logs/$name.log" | cut -c1-160 | tr '|' '/')" ;;
  esac
}

# --- the machine ---

cuda_bin=""
for d in "${CUDA_HOME:-}" /usr/local/cuda; do
  [ -n "$d" ] && [ -x "$d/bin/nvcc" ] && { cuda_bin=$d/bin; break; }
done
[ -z "$cuda_bin" ] && command -v nvcc >/dev/null && cuda_bin=$(dirname "$(command -v nvcc)")
if [ -z "$cuda_bin" ]; then
  row toolkit FAIL 0 "no nvcc (CUDA_HOME, /usr/local/cuda, PATH)"
  exit 2
fi
export PATH=$cuda_bin:$PATH
gpu_info=""
if command -v nvidia-smi >/dev/null; then
  gpu_info=$(nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total --format=csv,noheader 2>&1) || gpu_info="nvidia-smi failed: $gpu_info"
else
  gpu_info="no nvidia-smi (no NVIDIA driver installed?)"
fi
if [ -z "$arch" ]; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | grep -E '^[0-9]+$' | sort -u | paste -sd';' -)
  [ -z "$arch" ] && arch="80;90"
fi
detail "## Machine

- host: $(uname -n), $(uname -sr), $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-unknown OS}"), $(nproc) cores
- CUDA toolkit: $("$cuda_bin/nvcc" --version | tail -n 2 | head -n 1)
- compiler: $(${CC:-cc} --version 2>/dev/null | head -n 1); $(cmake --version | head -n 1)
- GPUs (nvidia-smi): ${gpu_info:-none}
- built for: sm_${arch//;/, sm_}"
say "CUDA toolkit in $cuda_bin; GPUs: ${gpu_info:-none}; building for $arch"

# --- dependencies: the system's, or the bundle's unpacked into a private prefix ---

system_has_deps() {
  command -v pkg-config >/dev/null || return 1
  PKG_CONFIG_PATH="/usr/lib/$(gcc -dumpmachine 2>/dev/null)/openblas-openmp/pkgconfig:${PKG_CONFIG_PATH:-}" \
    pkg-config --exists openblas check yajl zlib 2>/dev/null || return 1
  [ -f /usr/include/stb/stb_image.h ] || [ -f /usr/local/include/stb/stb_image.h ]
}

# unpack_bundle PREFIX: every .deb of the bundle into PREFIX (dpkg -x, or ar + tar without dpkg),
# .pc files and absolute symlinks pointed into PREFIX. Redone when the bundle's manifest changes.
unpack_bundle() {
  local prefix=$1
  if [ -f "$prefix/MANIFEST" ] && cmp -s "$prefix/MANIFEST" "$bundle/MANIFEST"; then return 0; fi
  rm -rf "$prefix"
  mkdir -p "$prefix"
  local deb
  for deb in "$bundle"/debs/*.deb; do
    if command -v dpkg >/dev/null; then
      dpkg -x "$deb" "$prefix" || return 1
    else
      local tmp
      tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$deb" && tar -xf data.tar.* -C "$prefix") || return 1
      rm -rf "$tmp"
    fi
  done
  # pkg-config files name /usr/...: the prefix's copy instead.
  find "$prefix" -name '*.pc' -print0 |
    xargs -0 -r sed -i -E "s#(^|[=[:space:]'\"]|-I|-L)/usr(/|\$|[[:space:]])#\\1$prefix/usr\\2#g"
  # Absolute symlinks (libz.so -> /lib/.../libz.so.1.2.13) to their target inside the prefix.
  local link target
  while IFS= read -r -d '' link; do
    target=$(readlink "$link")
    case $target in /*) [ -e "$prefix$target" ] && ln -sfn "$prefix$target" "$link" ;; esac
  done < <(find "$prefix" -type l -print0)
  cp "$bundle/MANIFEST" "$prefix/MANIFEST"
}

cmake_args=(-DDETR_CUDA=ON "-DDETR_CUDA_ARCHS=$arch" "-DDETR_WERROR=$werror" -DCMAKE_BUILD_TYPE=Release)

# cuDNN: the toolkit's or the system's, else a Python wheel's (nvidia/cudnn, as an image built for
# PyTorch carries it: lib/libcudnn.so.9 with no unversioned link, so CMake is told the file).
cudnn_note="beside the toolkit"
if ! ls "$cuda_bin"/../lib64/libcudnn.so* "$cuda_bin"/../lib/libcudnn.so* \
        /usr/lib/"$(gcc -dumpmachine 2>/dev/null)"/libcudnn.so* >/dev/null 2>&1; then
  cudnn_note="none found (the toolkit has none, and no Python nvidia/cudnn)"
  for py in python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null || continue
    wheel=$("$py" -c 'import sys, os
for p in sys.path:
    d = os.path.join(p, "nvidia", "cudnn")
    if os.path.isfile(os.path.join(d, "include", "cudnn.h")): print(d); break' 2>/dev/null)
    lib=$(ls "$wheel"/lib/libcudnn.so.[0-9]* 2>/dev/null | grep -E 'libcudnn\.so\.[0-9]+$' | head -n 1)
    if [ -n "$wheel" ] && [ -n "$lib" ]; then
      cmake_args+=("-DCUDNN_LIBRARY=$lib" "-DCUDNN_INCLUDE_DIR=$wheel/include")
      # cuDNN loads its engine libraries (libcudnn_*.so.9, same folder) by name at run time.
      export LD_LIBRARY_PATH=$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      cudnn_note="Python wheel: $lib"
      break
    fi
  done
fi
say "cuDNN: $cudnn_note"
detail "## cuDNN

$cudnn_note"
deps_mode=system
if [ "$use_bundle" = 1 ] || ! system_has_deps; then deps_mode=bundle; fi
# A build directory configured the other way holds that way's cached pkg-config results: start over.
want_prefix=$([ "$deps_mode" = bundle ] && echo "$build/deps")
if [ -f "$build/CMakeCache.txt" ] &&
   [ "$(sed -n 's/^DETR_DEPS_PREFIX:PATH=//p' "$build/CMakeCache.txt")" != "$want_prefix" ]; then
  say "$build was configured with other dependencies: starting it over"
  rm -rf "$build"
fi
mkdir -p "$build"
if [ "$deps_mode" = bundle ]; then
  why=$([ "$use_bundle" = 1 ] && echo "--use-bundle" || echo "the system lacks pkg-config, OpenBLAS, Check, YAJL, zlib or stb")
  if [ ! -f "$bundle/MANIFEST" ]; then
    row dependencies FAIL 0 "$why, and there is no bundle in $bundle: run tools/gpu_bundle.sh on a machine with the package registries"
    exit 2
  fi
  t0=$(date +%s)
  if ! unpack_bundle "$build/deps" > "$logs/dependencies.log" 2>&1; then
    row dependencies FAIL $(( $(date +%s) - t0 )) "unpacking $bundle failed: see logs/dependencies.log"
    exit 2
  fi
  . /etc/os-release 2>/dev/null
  b_distro=$(sed -n 's/^distro=//p' "$bundle/MANIFEST") b_release=$(sed -n 's/^release=//p' "$bundle/MANIFEST")
  note="$why: $(grep -c '^[a-z0-9].* [0-9a-f]\{64\}$' "$bundle/MANIFEST") packages of $b_distro $b_release unpacked into $build/deps"
  if [ "$b_distro $b_release" != "${ID:-?} ${VERSION_ID:-?}" ]; then
    note="$note; WARNING: this machine is ${ID:-?} ${VERSION_ID:-?}"
  fi
  row dependencies PASS $(( $(date +%s) - t0 )) "$note"
  # MPI is left out: the bundle has none, and a stray system MPI would mix into a hermetic build.
  cmake_args+=("-DDETR_DEPS_PREFIX=$build/deps" -DDETR_MPI=OFF)
else
  row dependencies PASS 0 "the system's packages"
fi

# --- build ---

check configure 120 cmake -S "$root" -B "$build" "${cmake_args[@]}"
[ "$step_rc" = 0 ] || exit 2
# Where each dependency was found; from a bundle, nothing may come from the system's /usr.
deps_used=$(grep -E '^(OPENBLAS|CHECK|LIBSUBUNIT|YAJL|ZLIB)_(INCLUDE_DIRS|LIBRARY_DIRS|INCLUDEDIR|LIBDIR):|^(STB_INCLUDE_DIR|DNNL_INCLUDE_DIR|DNNL_LIBRARY|CUDNN_LIBRARY|NCCL_LIBRARY|PKG_CONFIG_EXECUTABLE|MPI_C_LIB_NAMES):' "$build/CMakeCache.txt" | sed 's/:[A-Z]*=/ = /')
if [[ " ${cmake_args[*]} " == *DETR_DEPS_PREFIX* ]]; then
  # cuDNN and NCCL belong to the CUDA install, not to the bundle: only the bundle's own count.
  leaks=$(grep -vE '^(CUDNN|NCCL)_' <<<"$deps_used" | grep -E ' = /usr/(include|lib)')
  if [ -n "$leaks" ]; then
    row hermetic FAIL 0 "dependencies found outside the bundle's prefix: $(tr '\n' ' ' <<<"$leaks" | cut -c1-200)"
  else
    row hermetic PASS 0 "every dependency from the bundle's prefix (CMakeCache.txt)"
  fi
fi
check build 420 cmake --build "$build" -j "$jobs" ${targets:+--target $targets}
[ "$step_rc" = 0 ] || exit 2
detail "## Build

\`cmake ${cmake_args[*]}\`, then \`cmake --build -j $jobs\`. Dependencies as configured (CMakeCache.txt):

$(sed 's/^/    /' <<<"$deps_used")"
[ "$build_only" = 1 ] && exit 0
detr=$build/detr
cmp=$build/tests/step_compare

# --- is there a GPU to run on? ---

probe=$("$build/tests/test_gpu" --probe 2>&1)
probe_rc=$?
if [ "$probe_rc" != 0 ]; then
  what=$([ "$probe_rc" = 77 ] && echo "NO GPU" || echo "CUDA UNUSABLE")
  why=$(head -n 1 <<<"$probe" | sed -E 's/^no CUDA device: skipping \((.*)\)$/\1/' | tr '|' '/')
  row gpu FAIL 0 "$what: $why"
  echo
  echo "gpu_check: $what: $why"
  echo "gpu_check: the build succeeded; nothing was run on a GPU. Report: $report"
  detail "## No GPU run

The build succeeded; no GPU check ran. \`test_gpu --probe\` said: \`$(head -n 1 <<<"$probe")\`"
  exit 3
fi
row gpu PASS 0 "$(sed 's/^test_gpu: //' <<<"$probe" | head -n 1)"

# --- ctest -L gpu, plainly and with blocking launches ---

check ctest-gpu 300 ctest --test-dir "$build" -L gpu -V  # -V: test_gpu's per-test times in the log
check ctest-gpu-blocking 300 env CUDA_LAUNCH_BLOCKING=1 ctest --test-dir "$build" -L gpu --output-on-failure
detail "## Per-test times (test_gpu)

\`\`\`
$(grep -h '^test_gpu:' "$logs/ctest-gpu.log" 2>/dev/null | head -n 60)
\`\`\`"

# --- detr step: CUDA against the CPU ---

steps_detail="## detr step, CUDA against the CPU

Same weights (step_compare weights, on the CPU), same batch (2 images, the second with its right
third padded), same dropout masks. Tolerance on max|cuda - cpu| / max(1, max|cpu|) per tensor, or
4 x the CPU's own spread (how far the CPU's tensor moves when the images move by 1e-5, largest of
three draws).
"
for spec in "tiny 128x192 1e-3" "detr-r18-small 320x384 1e-3" "detr-r50 512x640 5e-3"; do
  set -- $spec
  preset=$1 hw=$2 tol=$3
  for enact in false true; do
    name=step-$preset$([ "$enact" = true ] && echo -enact)
    dir=$out/step/$name
    mkdir -p "$dir"
    classes=$([ "$preset" = tiny ] && echo 7 || echo 91)
    run_step "$name" 150 bash -c "set -e
      '$cmp' batch --out '$dir/batch.safetensors' --batch 2 --hw $hw --classes $classes --boxes 4 --seed 11
      for k in 1 2 3; do
        '$cmp' batch --out '$dir/batch-noise'\$k.safetensors --batch 2 --hw $hw --classes $classes --boxes 4 --seed 11 \
          --noise 1e-5 --noise-seed \$k
      done
      '$cmp' weights --config $preset --set enact=$enact --seed 12 --out '$dir/weights.safetensors'
      step() { '$detr' step --config $preset --set enact=$enact --weights '$dir/weights.safetensors' --seed 13 \"\$@\"; }
      step --batch '$dir/batch.safetensors' --device cpu --out '$dir/cpu.safetensors'
      step --batch '$dir/batch.safetensors' --device cuda --out '$dir/cuda.safetensors'
      # The CPU's own spread: its step with the images moved by 1e-5, three draws.
      for k in 1 2 3; do
        step --batch '$dir/batch-noise'\$k.safetensors --device cpu --out '$dir/cpu-noise'\$k.safetensors
      done
      '$cmp' diff '$dir/cpu.safetensors' '$dir/cuda.safetensors' --tol $tol \
        --spread '$dir/cpu-noise1.safetensors' --spread '$dir/cpu-noise2.safetensors' --spread '$dir/cpu-noise3.safetensors'"
    verdict=$(grep -m1 '^step_compare:' "$logs/$name.log" 2>/dev/null | sed 's/^step_compare: //')
    case $step_rc in
      0) row "$name" PASS "$step_secs" "$verdict" ;;
      3) row "$name" WARN "$step_secs" "$verdict" ;;
      200) row "$name" SKIP 0 "time budget spent or --only" ;;
      124|137) row "$name" TIMEOUT "$step_secs" "cap reached" ;;
      *) row "$name" FAIL "$step_secs" "${verdict:-exit $step_rc: $(tail -n 1 "$logs/$name.log" | cut -c1-150 | tr '|' '/')}" ;;
    esac
    steps_detail="$steps_detail
\`$name\` ($hw, tolerance $tol):
\`\`\`
$(grep -E '^  |^step_compare:|detr step: loss' "$logs/$name.log" 2>/dev/null)
\`\`\`"
  done
done
detail "$steps_detail"

# --- bench_step on CUDA: detr-r50 at 800x1066, batch 2 ---

bench_detail="## bench_step --device cuda, detr-r50, 800x1066, batch 2 (median of 5 steps after a warm-up)
"
for spec in "plain" "enact --enact" "tf32 --set tf32=true"; do
  set -- $spec
  name=bench-r50-$1
  shift
  check "$name" 120 "$build/bench/bench_step" --device cuda --preset detr-r50 --hw 800x1066 --batch 2 --reps 5 "$@"
  bench_detail="$bench_detail
- $name: \`$(grep -m1 '^{' "$logs/$name.log" 2>/dev/null)\`"
done
detail "$bench_detail"

# --- training: the tiny preset, 200 steps on the synthetic set ---

data=$out/synth
check synth 60 "$detr" synth --out "$data" --train 400 --val 40 --seed 0
# The synthetic set's category ids go up to 13: num_classes 14.
train_args=(--data "$data" --config tiny --set num_classes=14 --batch 2 --seed 7 --epochs 100 --eval-every 0 --no-progress --workers 4)
rm -rf "$out/train-gpu" "$out/train-cpu"
check train-tiny-gpu 180 "$detr" train "${train_args[@]}" --device cuda --max-steps 200 --out "$out/train-gpu"
check train-tiny-cpu-20 90 "$detr" train "${train_args[@]}" --device cpu --max-steps 20 --out "$out/train-cpu"
# The first steps of both runs: the same data order, augmentation and dropout, so the losses agree
# to rounding until a matching flips (docs/cuda.md).
losses() { grep '"type": "train"' "$1/metrics.jsonl" 2>/dev/null | sed -E 's/.*"step": ([0-9]+),.*"loss": ([-0-9.e+naif]+).*/\1 \2/'; }
# "step cpu_loss gpu_loss" for the steps both runs logged, in step order.
paired_losses() { awk 'NR == FNR { cpu[$1] = $2; next } ($1 in cpu) { print $1, cpu[$1], $2 }' <(losses "$1") <(losses "$2"); }
if [ -f "$out/train-gpu/metrics.jsonl" ] && [ -f "$out/train-cpu/metrics.jsonl" ]; then
  parity=$(paired_losses "$out/train-cpu" "$out/train-gpu" | awk '
    { d = $2 - $3; if (d < 0) d = -d; s = ($2 < 0 ? -$2 : $2); if (s < 1) s = 1; r = d / s
      if (NR <= 3 && r > worst3) worst3 = r; if (r > worst) worst = r; n++ }
    END { printf "%d steps compared; first 3: max relative difference %.3g; all: %.3g\n", n, worst3, worst
          exit (n >= 3 && worst3 <= 1e-3) ? 0 : 1 }')
  prc=$?
  row train-parity $([ $prc = 0 ] && echo PASS || echo FAIL) 0 "$parity"
  first=$(losses "$out/train-gpu" | head -n 1) last=$(losses "$out/train-gpu" | tail -n 1)
  detail "## Training, tiny preset, 200 steps on the GPU

first logged step and loss: $first; last: $last.
Images per second (mean over the logged steps after the first 10): $(grep '"type": "train"' "$out/train-gpu/metrics.jsonl" | sed -E 's/.*"images_per_s": ([0-9.]+).*/\1/' | awk 'NR > 10 { s += $1; n++ } END { if (n) printf "%.1f", s / n; else print "n/a" }').

CPU against GPU, first 20 steps: $parity

\`\`\`
$(paired_losses "$out/train-cpu" "$out/train-gpu" | awk '{print "step " $1 ": cpu " $2 ", cuda " $3}' | head -n 20)
\`\`\`"
else
  row train-parity SKIP 0 "a training run is missing"
fi
ckpt=$(ls -t "$out"/train-gpu/ckpt-*.safetensors 2>/dev/null | head -n 1)
if [ -n "$ckpt" ]; then
  check eval-tiny-gpu 90 "$detr" eval --checkpoint "$ckpt" --data "$data" --device cuda --json "$out/eval.json"
  detail "## Evaluation of the GPU-trained tiny model on the GPU

\`\`\`
$(grep -E '^ Average' "$logs/eval-tiny-gpu.log" 2>/dev/null | head -n 3)
\`\`\`"
else
  row eval-tiny-gpu SKIP 0 "no checkpoint from the training run"
fi

# --- compute-sanitizer: memcheck and racecheck on our kernels (*_kernel), one test case at a time ---
# (last: the parity checks above say more per second; these get the rest of the budget)

sanitizer_bin=$(command -v compute-sanitizer || true)
[ -z "$sanitizer_bin" ] && [ -x "$cuda_bin/../compute-sanitizer/compute-sanitizer" ] && sanitizer_bin=$cuda_bin/../compute-sanitizer/compute-sanitizer
if [ "$sanitizer" = 0 ]; then
  row sanitizer SKIP 0 "--no-sanitizer"
elif [ -z "$sanitizer_bin" ]; then
  row sanitizer SKIP 0 "no compute-sanitizer in the toolkit"
else
  filter=()
  "$sanitizer_bin" --help 2>&1 | grep -q -- '--kernel-name ' && filter=(--kernel-name kns=_kernel)
  # tool, test case, cap: memcheck on the op, kernel and model cases, racecheck (shared memory: the
  # block reductions) on the ops. Last in the run: they take what the budget has left.
  for spec in "memcheck ops 60" "memcheck kernels 40" "memcheck model 40" "racecheck ops 40"; do
    set -- $spec
    name=$1-$2
    run_step "$name" "$3" env CK_RUN_CASE="$2" DETR_GPU_TEST_TIMEOUT=0 "$sanitizer_bin" --tool "$1" \
      --error-exitcode 86 --print-limit 20 "${filter[@]}" "$build/tests/test_gpu"
    done_tests=$(grep -c '^test_gpu: [a-z_0-9]* *[0-9.]* s$' "$logs/$name.log" 2>/dev/null)
    reported=$(grep -m1 -E '^=+ (Invalid|Error|Race|Program hit|.*[Hh]azard)' "$logs/$name.log" 2>/dev/null | cut -c1-150 | tr '|' '/')
    if [ -n "$reported" ]; then
      row "$name" FAIL "$step_secs" "$reported"
      continue
    fi
    case $step_rc in
      0) row "$name" PASS "$step_secs" "$done_tests tests, no errors" ;;
      200) row "$name" SKIP 0 "time budget spent or --only" ;;
      124|137) row "$name" PARTIAL "$step_secs" "cap reached after $done_tests tests without an error report" ;;
      *) row "$name" FAIL "$step_secs" "exit $step_rc: $(tail -n 1 "$logs/$name.log" | cut -c1-150 | tr '|' '/')" ;;
    esac
  done
fi

say "done in $(elapsed) s: $([ $failed = 0 ] && echo 'every check passed' || echo 'FAILURES (see the report)'); report: $report"
exit $failed
