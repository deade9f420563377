#!/usr/bin/env bash
# tools/gpu_bench.sh: the DETR training step of detr-c against the reference PyTorch DETR
# (facebookresearch/detr) and Conditional DETR (Atten4Vis/ConditionalDETR) on one GPU, alternating,
# with the same weights and batch, in one command and under 10 minutes on an H100, with one report
# (docs/cuda.md, "Benchmarking against PyTorch on a GPU").
#
#   bash tools/gpu_bench.sh [--out DIR] [--work DIR] [--build DIR] [--refs DIR] [--python PY]
#                           [--no-torch] [--budget SECONDS] [--reps N] [--rounds N] [--threads N]
#                           [--profile] [--profile-variants "dense enact bf16 tf32"] [--cudnn-any]
#                           [--jobs N] [--arch SM] [--use-bundle] [--no-werror]
#                           [--cpu] [--tiny]   (the CPU path; --tiny: tiny sizes, seconds per run)
#                           [--copy-to DIR]   (at the end: report.md, runs.jsonl and logs.tar.gz there)
#                           [--parts "main bf16 enact convs"]   (a round's parts, in this order: what comes
#                           first runs before the budget can run out)
#   bash tools/gpu_bench.sh --stage-refs DETR_CHECKOUT CONDITIONAL_DETR_CHECKOUT [--refs DIR]
#
# 1. builds bench_step for the GPU (tools/gpu_check.sh --build-only: the GPU's architecture, the
#    system's packages or gpu-bundle/; --cpu: a CPU build in build-cpu);
# 2. finds a Python with PyTorch, torchvision, scipy and packaging (and CUDA, on the GPU), and the
#    reference checkouts in --refs (default refs/: detr/ and cdetr/, put there by --stage-refs);
#    where either is missing the report says so and detr-c is timed alone;
# 3. writes each model's weights (the reference's seeded initialisation, its state_dict) and each
#    batch (random images, 7 boxes each) once, as safetensors, for both implementations;
# 4. for detr-r50 and conditional-detr-r50 at 800x1066, batch 2 and 8, in fp32 (PyTorch: TF32 off
#    for matmuls and cuDNN; detr-c's default) and TF32 (PyTorch: cuDNN's default and matmul TF32;
#    detr-c: --set tf32=true): bench_step and bench/torch_step.py one after the other (each a
#    fresh process: a warm-up step, then --reps timed steps), the order swapped every round;
#    detr-c's convolutions take its deterministic cuDNN algorithms (--cudnn-any: cuDNN's heuristic
#    choice, DETR_CUDNN_DETERMINISTIC=0, as PyTorch's without cudnn.benchmark);
# 4b. detr-r50 at the larger batch in bf16: detr-c `--set bf16=true` (cuBLAS GEMMs on bf16 copies, cuDNN bf16
#    convolutions) against PyTorch's torch.autocast(bfloat16) with TF32 off for what stays fp32, and
#    both in TF32 beside them when the main part does not run (bf16 against TF32 on one machine);
# 5. ENACT against dense (detr-c, detr-r50, batch 8) at 800x1066 and 800x1333, fp32 and TF32:
#    step time and peak memory, and the memory ENACT saves against the dense attention maps;
# 5b. convs (the first round only, on a GPU): the cost of detr-c's deterministic cuDNN algorithms,
#    detr-r50 at the larger batch in fp32 and TF32 (bench_step --conv-survey: every convolution
#    pass of a step timed by cuDNN's Find in every algorithm; the step's convolution time with
#    the deterministic picks, the heuristic's, the fastest, the fastest deterministic);
# 6. with --profile: bench_step dense and with ENACT (batch 8, 800x1333, fp32, the step after the
#    warm-up: bench_step --capture) under Nsight Compute, every kernel's duration (Nsight Systems cannot make a report on
#    the lent machines): kernels per step, GPU busy time against the step's wall time (the rest is
#    the GPU waiting: launches and host round trips), the kernels that take the time;
#    --profile-variants picks them: dense, enact (as above), bf16, tf32 (detr-r50 dense at the bf16
#    part's batch and size, in that math: where bf16's conversions take their time);
# 7. the rounds after the first, with what is left of the budget.
# Report: OUT/report.md (every run's JSON in OUT/runs.jsonl, logs in OUT/logs/), rewritten after
# every run, so a run cut short still leaves one. Each run has a time cap and the whole command a
# budget (--budget, default 570 s, the build included): a run that would start past it is reported
# as skipped. Exit status: 0 done, 1 a run failed, 2 usage or build failure, 3 no usable GPU.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
t_start=$(date +%s)
out=$root/out/gpu-bench
work=""
build=""
refs=$root/refs
python=""
no_torch=0
budget=570
reps=""
rounds=2
threads=""
profile=0
profile_variants="dense enact"
cpu=0
tiny=0
check_args=()
stage=()
copy_to=""
parts="main bf16 enact convs"
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --refs) refs=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --no-torch) no_torch=1; shift ;;
    --budget) budget=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --profile) profile=1; shift ;;
    --profile-variants) profile=1; profile_variants=$2; shift 2 ;;
    --cudnn-any) export DETR_CUDNN_DETERMINISTIC=0; shift ;;
    --cpu) cpu=1; shift ;;
    --tiny) tiny=1; shift ;;
    --jobs|--arch) check_args+=("$1" "$2"); shift 2 ;;
    --use-bundle|--no-werror) check_args+=("$1"); shift ;;
    --stage-refs) stage=("$2" "$3"); shift 3 ;;
    --copy-to) copy_to=$2; shift 2 ;;
    --parts) parts=$2; shift 2 ;;
    -h|--help) sed -n '2,45p' "$0"; exit 0 ;;
    *) echo "gpu_bench: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

[ -n "${parts// /}" ] || { echo "gpu_bench: --parts names no part (main, bf16, enact, convs)" >&2; exit 2; }
for p in $parts; do
  case $p in main|bf16|enact|convs) ;; *) echo "gpu_bench: --parts: unknown part '$p' (main, bf16, enact, convs)" >&2; exit 2 ;; esac
done
for v in $profile_variants; do
  case $v in dense|enact|bf16|tf32) ;; *) echo "gpu_bench: --profile-variants: unknown '$v' (dense, enact, bf16, tf32)" >&2; exit 2 ;; esac
done

# --- --stage-refs: the reference checkouts' Python sources into refs/ (git-ignored), to carry ---

if [ ${#stage[@]} = 2 ]; then
  for pair in "detr:${stage[0]}" "cdetr:${stage[1]}"; do
    name=${pair%%:*} src=${pair#*:}
    [ -d "$src/models" ] && [ -d "$src/util" ] || { echo "gpu_bench: $src has no models/ and util/" >&2; exit 2; }
    rm -rf "${refs:?}/$name"
    mkdir -p "$refs/$name"
    (cd "$src" && find models util -name '*.py' -print0 | xargs -0 cp --parents -t "$refs/$name" && cp LICENSE "$refs/$name/")
    echo "$(git -C "$src" config --get remote.origin.url 2>/dev/null || echo "$src") $(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)" \
      > "$refs/$name/SOURCE"
    echo "gpu_bench: $refs/$name: $(find "$refs/$name" -type f | wc -l) files, $(du -sh "$refs/$name" | cut -f1) ($(cat "$refs/$name/SOURCE"))"
  done
  exit 0
fi

dev=$([ "$cpu" = 1 ] && echo cpu || echo cuda)
[ -n "$build" ] || build=$root/$([ "$cpu" = 1 ] && echo build-cpu || echo build-gpu-check)
[ -n "$work" ] || work=$root/out/gpu-bench-work
[ -n "$reps" ] || reps=$([ "$tiny" = 1 ] && echo 2 || echo 5)
[ -n "$threads" ] || threads=$([ "$cpu" = 1 ] && echo 2 || nproc)
if [ "$tiny" = 1 ]; then  # model:decoder pairs, batches, sizes
  models=(tiny:detr tiny:conditional) batches=(2 4) hw=64x96 boxes=3 enact_hws=(64x96 96x128) enact_batch=4 cap=120
else
  models=(detr-r50:detr conditional-detr-r50:conditional) batches=(2 8) hw=800x1066 boxes=7
  enact_hws=(800x1066 800x1333) enact_batch=8 cap=150
fi
maths=(fp32 tf32)
rm -rf "$out/logs" "$out/runs.jsonl" "$out/meta.txt" "$out"/ncu-*.csv
mkdir -p "$out/logs" "$work"
runs=$out/runs.jsonl meta=$out/meta.txt logs=$out/logs
elapsed() { echo $(( $(date +%s) - t_start )); }
say() { echo "gpu_bench: $*"; }
meta_add() { printf '%s\t%s\n' "$1" "$2" >> "$meta"; }
failed=0

report_py=""
for p in python3 /usr/bin/python3 "$python"; do
  [ -n "$p" ] && "$p" -c 'import json, statistics' 2>/dev/null && { report_py=$p; break; }
done
write_report() {
  if [ -n "$report_py" ]; then
    "$report_py" "$root/tools/gpu_bench_report.py" --runs "$runs" --meta "$meta" --elapsed "$(elapsed)" \
      --profiled "$enact_batch:${enact_hws[-1]}" --profiled-step "${batches[-1]}:$hw" > "$out/report.md.tmp" &&
      mv "$out/report.md.tmp" "$out/report.md"
  else  # no Python at all: the raw lines
    { echo "# detr-c GPU bench (no Python for the tables: raw results)"; cat "$meta" "$runs" 2>/dev/null; } > "$out/report.md"
  fi
}
# At exit (also cut short): the report, and with --copy-to three files there (the device tool
# brings back few files: the logs, the build's and the profiles travel as one archive).
finish() {
  write_report
  if [ -n "$copy_to" ]; then
    mkdir -p "$copy_to" && cp "$out/report.md" "$runs" "$copy_to/" 2>/dev/null
    tar -czf "$copy_to/logs.tar.gz" -C "$out" $(cd "$out" && ls -d logs build meta.txt ncu-*.csv 2>/dev/null) 2>/dev/null
  fi
}
trap finish EXIT

meta_add mode "$([ "$cpu" = 1 ] && echo "CPU" || echo "GPU")$([ "$tiny" = 1 ] && echo ", tiny sizes")"
meta_add commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with local changes)')"
meta_add date "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
meta_add host "$(uname -n), $(nproc) cores, $(. /etc/os-release 2>/dev/null; echo "${PRETTY_NAME:-unknown OS}")"
meta_add "detr-c cuDNN algorithms" "$([ "${DETR_CUDNN_DETERMINISTIC:-1}" = 0 ] && echo "cuDNN's heuristic choice (--cudnn-any), as PyTorch's without cudnn.benchmark" || echo "deterministic (detr-c's default; --cudnn-any: cuDNN's heuristic choice, as PyTorch's)")"
meta_add settings "$reps timed steps per run after one warm-up step; up to $rounds rounds; $boxes boxes per image; budget $budget s; PyTorch threads $threads"

# --- build ---

t0=$(date +%s)
if [ "$cpu" = 1 ]; then
  { [ -f "$build/CMakeCache.txt" ] || cmake -S "$root" -B "$build" -DDETR_CUDA=OFF -DCMAKE_BUILD_TYPE=Release; } > "$logs/build.log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" --target bench_step >> "$logs/build.log" 2>&1
else
  bash "$root/tools/gpu_check.sh" --build-only --targets bench_step --build "$build" --out "$out/build" \
    --budget "$budget" "${check_args[@]}" > "$logs/build.log" 2>&1
fi
build_rc=$?
meta_add build "$build: $([ $build_rc = 0 ] && echo ok || echo "FAILED (exit $build_rc, logs/build.log)") in $(( $(date +%s) - t0 )) s"
if [ $build_rc != 0 ]; then
  say "build failed: see $logs/build.log"
  tail -n 5 "$logs/build.log"
  exit 2
fi
bench=$build/bench/bench_step
# cuDNN from a Python wheel loads its engine libraries by name: its folder on bench_step's library
# path (bench_step's only: PyTorch keeps the cuDNN it comes with).
bench_ld=${LD_LIBRARY_PATH:-}
cudnn_lib=$(sed -n 's/^CUDNN_LIBRARY:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)
[ -n "$cudnn_lib" ] && [ -f "$cudnn_lib" ] && bench_ld=$(dirname "$cudnn_lib")${bench_ld:+:$bench_ld}

# --- the GPU ---

if [ "$cpu" = 0 ]; then
  meta_add "GPU (nvidia-smi)" "$(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | head -n 1 || echo 'no nvidia-smi')"
  probe=$(timeout 60 env LD_LIBRARY_PATH="$bench_ld" "$bench" --device cuda --preset tiny --hw 64x64 --reps 1 2>&1)
  if [ $? != 0 ]; then
    meta_add "NO GPU" "bench_step --device cuda: $(tail -n 1 <<<"$probe")"
    say "no usable GPU: $(tail -n 1 <<<"$probe")"
    exit 3
  fi
  meta_add "GPU (detr-c)" "$(sed -n 's/.*"gpu": "\([^"]*\)".*/\1/p' <<<"$probe")"
else
  meta_add CPU "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
fi

# --- PyTorch and the reference checkouts ---

torch_py="" torch_why=""
if [ "$no_torch" = 1 ]; then
  torch_why="--no-torch"
else
  check='import torch, torchvision, scipy, packaging, numpy
import sys
if sys.argv[1] == "cuda" and not torch.cuda.is_available(): sys.exit("torch.cuda.is_available() is False")
print(f"PyTorch {torch.__version__}, torchvision {torchvision.__version__}, cuDNN {torch.backends.cudnn.version()}, CUDA {torch.version.cuda}")'
  for p in ${python:-python3 /opt/torch/.venv/bin/python3}; do
    command -v "$p" >/dev/null || { torch_why="$torch_why$p: not found; "; continue; }
    if v=$("$p" -c "$check" "$dev" 2>&1); then torch_py=$p; break; fi
    torch_why="$torch_why$p: $(tail -n 1 <<<"$v"); "
  done
fi
if [ -n "$torch_py" ]; then
  meta_add PyTorch "$torch_py: $v"
else
  meta_add "PyTorch MISSING" "${torch_why:-no python3}: detr-c is timed alone, with its own seeded weights and batch"
fi
repo_of() { [ "$1" = conditional ] && echo "$refs/cdetr" || echo "$refs/detr"; }
for m in "${models[@]}"; do
  r=$(repo_of "${m#*:}")
  if [ -f "$r/models/transformer.py" ]; then
    meta_add "reference ${m#*:}" "$r ($(cat "$r/SOURCE" 2>/dev/null || git -C "$r" rev-parse HEAD 2>/dev/null || echo 'source unknown'))"
  else
    meta_add "reference ${m#*:} MISSING" "no $r/models/transformer.py (tools/gpu_bench.sh --stage-refs): detr-c alone for $m"
  fi
done
# torch_for MODEL: whether PyTorch runs for that model:decoder.
torch_for() { [ -n "$torch_py" ] && [ -f "$(repo_of "${1#*:}")/models/transformer.py" ]; }

# --- runs ---

n_run=0
# run_one SECTION MODEL:DECODER BATCH HW MATH IMPL ROUND [ARGS...]: one process, its JSON line (or its
# failure) appended to runs.jsonl with the run's settings; the report rewritten.
run_one() {
  local section=$1 md=$2 batch=$3 hw=$4 math=$5 impl=$6 round=$7
  shift 7
  local preset=${md%%:*} decoder=${md#*:} status secs=0 result=null shared=false
  n_run=$((n_run + 1))
  local name log left
  name=$(printf '%03d-%s-%s-%s-b%s-%s-%s' "$n_run" "$section" "$preset" "$decoder" "$batch" "$hw" "$math")-$impl
  log=$logs/$name.log
  left=$(( budget - $(elapsed) - 5 ))
  local run_cap=$cap
  [ "$run_cap" -gt "$left" ] && run_cap=$left
  if [ "$left" -lt $([ "$cpu" = 1 ] && echo 10 || echo 30) ]; then
    status=skipped
  else
    local inputs=() t0
    [ -f "$work/weights-$preset-$decoder.safetensors" ] && inputs+=(--weights "$work/weights-$preset-$decoder.safetensors")
    [ -f "$work/batch-b$batch-$hw.safetensors" ] && inputs+=(--batch-file "$work/batch-b$batch-$hw.safetensors")
    [ ${#inputs[@]} = 4 ] && shared=true
    t0=$(date +%s)
    if [[ $impl == detr-c* ]]; then
      local sets=(--set "decoder=$decoder")
      [ "$math" = tf32 ] && sets+=(--set tf32=true)
      [ "$math" = bf16 ] && sets+=(--set bf16=true)
      timeout --kill-after=10 "$run_cap" env OMP_NUM_THREADS="$threads" LD_LIBRARY_PATH="$bench_ld" "$bench" \
        --device "$dev" --preset "$preset" \
        "${sets[@]}" --batch "$batch" --hw "$hw" --boxes "$boxes" --reps "$reps" "${inputs[@]}" "$@" > "$log" 2>&1
    else
      local torch_math=$math torch_precision=fp32  # bf16: autocast, TF32 off for the ops it leaves in fp32
      [ "$math" = bf16 ] && torch_math=fp32 torch_precision=bf16
      timeout --kill-after=10 "$run_cap" "$torch_py" "$root/bench/torch_step.py" --detr-repo "$(repo_of "$decoder")" \
        --preset "$preset" --decoder "$decoder" --device "$dev" --math "$torch_math" --precision "$torch_precision" \
        --batch "$batch" --hw "$hw" \
        --boxes "$boxes" --reps "$reps" --threads "$threads" "${inputs[@]}" > "$log" 2>&1
    fi
    local rc=$?
    secs=$(( $(date +%s) - t0 ))
    result=$(grep -m1 '^{' "$log")
    case $rc in
      0) status=ok; [ -n "$result" ] || { status=failed; result=null; } ;;
      124|137) status=timeout; result=null ;;
      *) status="failed (exit $rc: $(tail -n 1 "$log" | cut -c1-200 | tr -d '"\\'))"; result=null; failed=1 ;;
    esac
  fi
  printf '{"n": %d, "section": "%s", "model": "%s", "decoder": "%s", "batch": %s, "hw": "%s", "math": "%s", "impl": "%s", "round": %s, "status": "%s", "secs": %s, "shared_inputs": %s, "log": "logs/%s.log", "result": %s}\n' \
    "$n_run" "$section" "$preset" "$decoder" "$batch" "$hw" "$math" "$impl" "$round" "$status" "$secs" "$shared" "$name" "$result" >> "$runs"
  say "$(printf '%-6s %-32s b%-2s %-9s %-5s %-8s round %s: %s, %s s' "$section" "$preset:$decoder" "$batch" "$hw" "$math" "$impl" "$round" "${status%% *}" "$secs")"
  write_report
}

# The inputs: each model's weights and each batch, written once by the reference's code.
t0=$(date +%s)
rm -f "$work"/weights-*.safetensors "$work"/batch-*.safetensors
if [ -n "$torch_py" ]; then
  for m in "${models[@]}"; do
    torch_for "$m" || continue
    "$torch_py" "$root/bench/torch_step.py" --detr-repo "$(repo_of "${m#*:}")" --preset "${m%%:*}" --decoder "${m#*:}" \
      --write-weights "$work/weights-${m%%:*}-${m#*:}.safetensors" >> "$logs/inputs.log" 2>&1 ||
      meta_add "inputs" "writing $m's weights failed (logs/inputs.log)"
  done
  specs=()
  for spec in $(for b in "${batches[@]}"; do echo "$b:$hw"; done) $(for h in "${enact_hws[@]}"; do echo "$enact_batch:$h"; done); do
    specs+=(--write-batch "$spec:$work/batch-b${spec%%:*}-${spec#*:}.safetensors")
  done
  "$torch_py" "$root/bench/torch_step.py" --detr-repo "$refs/detr" --preset "${models[0]%%:*}" --boxes "$boxes" \
    "${specs[@]}" >> "$logs/inputs.log" 2>&1 || meta_add "inputs" "writing the batches failed (logs/inputs.log)"
  meta_add inputs "weights and batches written by bench/torch_step.py in $(( $(date +%s) - t0 )) s ($work)"
fi

# main_round ROUND: every model, batch and math, detr-c and PyTorch one after the other (PyTorch
# first in even rounds).
main_round() {
  local m b math first second
  for m in "${models[@]}"; do
    for b in "${batches[@]}"; do
      for math in "${maths[@]}"; do
        first=detr-c second=pytorch
        [ $(( $1 % 2 )) = 0 ] && first=pytorch second=detr-c
        for impl in $first $second; do
          [ "$impl" = pytorch ] && ! torch_for "$m" && continue
          run_one step "$m" "$b" "$hw" "$math" "$impl" "$1"
        done
      done
    done
  done
}
# bf16_round ROUND: the first model at the larger batch in bf16, and in TF32 where the main part does
# not run that already, detr-c and PyTorch one after the other (PyTorch first in even rounds). On the
# CPU path PyTorch is left out (Debian's 1.13 cannot run DETR under CPU autocast, docs/precision.md),
# and so is TF32 (a CUDA setting: fp32 math there).
bf16_round() {
  local m=${models[0]} b=${batches[-1]} first=detr-c second=pytorch math maths_here=bf16
  [ $(( $1 % 2 )) = 0 ] && first=pytorch second=detr-c
  [ "$cpu" = 0 ] && [[ " $parts " != *" main "* ]] && maths_here="bf16 tf32"
  for math in $maths_here; do
    for impl in $first $second; do
      [ "$impl" = pytorch ] && { [ "$cpu" = 1 ] || ! torch_for "$m"; } && continue
      run_one step "$m" "$b" "$hw" "$math" "$impl" "$1"
    done
  done
}
# enact_round ROUND: detr-c's detr-r50 (the tiny preset with --tiny), dense and ENACT one after the
# other (ENACT first in even rounds).
enact_round() {
  local h math v
  for h in "${enact_hws[@]}"; do
    for math in "${maths[@]}"; do
      for v in $([ $(( $1 % 2 )) = 1 ] && echo "dense enact" || echo "enact dense"); do
        if [ "$v" = dense ]; then
          run_one enact "${models[0]%%:*}:detr" "$enact_batch" "$h" "$math" detr-c "$1"
        else
          run_one enact "${models[0]%%:*}:detr" "$enact_batch" "$h" "$math" detr-c-enact "$1" --enact
        fi
      done
    done
  done
}
# convs_round ROUND: the cuDNN algorithm survey of detr-r50's step at the larger batch, fp32 and TF32
# (once: Find's timings do not change between rounds; cuDNN only, so not on the CPU path).
convs_round() {
  local math
  [ "$1" = 1 ] || return 0
  if [ "$cpu" = 1 ]; then
    meta_add convs "skipped: the survey times cuDNN's algorithms (a GPU's)"
    return 0
  fi
  for math in "${maths[@]}"; do
    run_one convs "${models[0]%%:*}:detr" "${batches[-1]}" "$hw" "$math" detr-c "$1" --conv-survey
  done
}
# round ROUND: the parts asked for, in their order.
round() {
  local p
  for p in $parts; do "${p}_round" "$1"; done
}
round 1

# --- Nsight Compute: every kernel's duration in one step, dense and ENACT ---

# profile_one VARIANT: bench_step under ncu, one row per kernel launch in OUT/ncu-VARIANT.csv. dense
# and enact: batch 8 at the ENACT part's larger size, fp32; bf16 and tf32: dense at the bf16 part's
# batch and size, in that math.
profile_one() {
  local v=$1 left b pb=$enact_batch phw=${enact_hws[-1]} args=()
  case $v in
    enact) args=(--enact) ;;
    bf16|tf32) pb=${batches[-1]} phw=$hw args=(--set "$v=true") ;;
  esac
  left=$(( budget - $(elapsed) - 10 ))
  if [ "$left" -lt 45 ]; then
    meta_add "ncu $v" "skipped: $left s left"
    return
  fi
  local label=${args[*]:-fp32}
  b=$work/batch-b$pb-$phw.safetensors
  [ -f "$b" ] && args+=(--batch-file "$b" --weights "$work/weights-${models[0]%%:*}-detr.safetensors")
  local t0=$(date +%s)
  timeout --kill-after=10 $(( left < 150 ? left : 150 )) env LD_LIBRARY_PATH="$bench_ld" "$ncu_bin" \
    --metrics gpu__time_duration.sum --csv --page raw --print-units base --clock-control none --cache-control none \
    --profile-from-start off --log-file "$out/ncu-$v.csv" \
    "$bench" --device cuda --capture --preset "${models[0]%%:*}" --reps 1 --batch "$pb" --hw "$phw" \
    "${args[@]}" > "$logs/ncu-$v.log" 2>&1
  meta_add "ncu $v" "exit $? in $(( $(date +%s) - t0 )) s: ncu-$v.csv (batch $pb, $phw, $label, the step after the warm-up)"
}
if [ "$profile" = 1 ] && [ "$cpu" = 0 ]; then
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
  if [ -z "$ncu_bin" ]; then
    meta_add ncu "no ncu on this machine"
  else
    for v in $profile_variants; do profile_one "$v"; done
  fi
  write_report
fi

for ((r = 2; r <= rounds; r++)); do
  round "$r"
done
say "done in $(elapsed) s; report: $out/report.md"
exit $failed
