#!/usr/bin/env bash
# The fault-injection soak: a tiny training run interrupted by every fault a long run meets, resumed
# with --resume auto after each, must end with the same weights, bit for bit, as the run left alone;
# metrics.jsonl must hold each step once with the same losses and the same evaluations, and the
# file the user put in the run directory must be untouched (docs/training.md, "A run that survives").
#
# The faults, in one run: SIGKILL at random moments (--kills of them), SIGKILL while a checkpoint is
# written, SIGKILL during an evaluation, SIGTERM, a disk that fills (a file-size limit below a
# checkpoint's size: every write past it fails), and a second `detr train` started into the live
# run's directory. Then a corrupt image appearing between two launches: under --bad-input fail the
# run stops with a checkpoint of its finished steps and resumes once the file is fixed (weights as
# the clean run's); under --bad-input skip it trains on without it (weights as a run that skipped
# the same image from the same step, killed and resumed on the way).
#
#   bash tools/soak.sh [--detr BIN] [--steps N] [--kills K] [--work DIR] [--keep]
# Defaults: build/detr, 1600 steps, 10 kills, a fresh directory under /tmp removed on success.
# ctest runs it as `soak` (labels soak, slow) with fewer steps.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
detr="$root/build/detr" steps=1600 kills=10 work="" keep=false
while [ $# -gt 0 ]; do
  case "$1" in
    --detr) detr=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --kills) kills=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --keep) keep=true; shift ;;
    *) echo "soak: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$detr" ] || { echo "soak: $detr is not an executable (build first, or --detr BIN)" >&2; exit 2; }
[ -n "$work" ] || work=$(mktemp -d /tmp/detr-soak-XXXXXX)
mkdir -p "$work"
RANDOM=7  # the same moments every time the soak runs
failures=0
fail() { echo "soak: FAIL: $*"; failures=$((failures + 1)); }
say() { echo "soak: $*"; }

# 6 steps an epoch (12 images, batch 2); a checkpoint every 40 steps, the last 3 kept; an evaluation
# every 20 epochs (120 steps) and at the end.
ckpt_every=40
flags="--config tiny --set num_classes=100 --epochs 100000 --max-steps $steps --eval-every 20
  --checkpoint-every $ckpt_every --keep 3 --workers 2 --threads 2 --seed 5 --no-progress"
"$detr" synth --out "$work/data" --train 12 --val 4 --seed 3 >/dev/null

# train OUT [EXTRA...]: one launch, in the foreground, its log appended to OUT.log.
train() {
  local out=$1
  shift
  "$detr" train --data "$work/data" --out "$out" $flags "$@" >>"$out.log" 2>&1
}

# launch OUT [EXTRA...]: one launch in the background; its pid in $pid.
launch() {
  local out=$1
  shift
  "$detr" train --data "$work/data" --out "$out" $flags --resume auto "$@" >>"$out.log" 2>&1 &
  pid=$!
}

# The bytes after a safetensors file's header: every tensor's data, in the writer's order.
tensor_bytes() {
  local n
  n=$(od -An -t u8 -N8 "$1" | tr -d ' ')
  tail -c +$((8 + n + 1)) "$1"
}

same_weights() {  # A B: the same tensors, bit for bit
  if cmp -s <(tensor_bytes "$1") <(tensor_bytes "$2"); then return 0; fi
  fail "$2: its weights differ from $1's"
  return 1
}

# metrics.jsonl of a run: its train lines without the wall-clock fields, and its evaluation lines
# without their time, each step and epoch once.
metrics_of() {
  sed -E 's/, "(images_per_s|step_s|data_s|seconds|eval_s|s)": [0-9.e+-]+//g' "$1/metrics.jsonl"
}

same_metrics() {  # REF RUN
  local dup
  dup=$(grep -o '"type": "train", "step": [0-9]*' "$2/metrics.jsonl" | sort | uniq -d | head -3)
  [ -z "$dup" ] || fail "$2/metrics.jsonl: steps logged twice: $dup"
  cmp -s <(metrics_of "$1") <(metrics_of "$2") || {
    fail "$2/metrics.jsonl differs from $1's:"
    diff <(metrics_of "$1") <(metrics_of "$2") | head -6
  }
}

# wait_for PID TEST...: polls (10 ms) until the test holds; 1 when the process ended first.
wait_for() {
  local p=$1
  shift
  while ! "$@"; do
    kill -0 "$p" 2>/dev/null || return 1
    sleep 0.01
  done
}
temp_checkpoint() { compgen -G "$run/ckpt-*.safetensors.tmp.*" >/dev/null; }
# The end of the epoch before the next evaluation, whose evaluation has not finished.
eval_running() {
  local e
  e=$(grep -o '^epoch [0-9]* done' "$run.log" | tail -1 | grep -o '[0-9]*' || true)
  [ -n "$e" ] && [ $(((e + 1) % 20)) -eq 0 ] && ! grep -q "^epoch $((e + 1)): COCO evaluation" "$run.log"
}

# --- the run left alone ---
ref="$work/ref"
t0=$(date +%s)
train "$ref" || { echo "soak: the reference run failed: $ref.log" >&2; exit 1; }
ref_s=$(($(date +%s) - t0))
say "reference: $steps steps in $ref_s s"

# --- the run that meets every fault ---
run="$work/run"
mkdir -p "$run"
echo "the user's notes: not the run's" >"$run/notes.txt"
cp "$run/notes.txt" "$work/notes.orig"
faults=()
for _ in $(seq "$kills"); do faults+=(kill); done
faults+=(kill-checkpoint kill-eval term disk-full second-process)
# shuffled, the same way every time
for ((i = ${#faults[@]} - 1; i > 0; i--)); do
  j=$((RANDOM % (i + 1)))
  tmp=${faults[i]} faults[i]=${faults[j]} faults[j]=$tmp
done
# A launch that a timed fault ends runs for half to one and a half times its share of the reference
# run's time (at least 2 s), so that the faults fall all along the run.
share=$(((ref_s + ${#faults[@]} - 1) / ${#faults[@]}))
[ $share -ge 4 ] || share=4
moment() { at=$((share / 2 + RANDOM % (share + 1))).$((RANDOM % 10)); }  # into $at (no subshell: one RANDOM stream)
launches=0
for fault in "${faults[@]}"; do
  [ -f "$run/ckpt-$steps.safetensors" ] && break
  launches=$((launches + 1))
  case "$fault" in
    kill)
      launch "$run"
      moment
      sleep "$at"
      kill -KILL "$pid" 2>/dev/null || true
      { wait "$pid"; } 2>/dev/null || true
      ;;
    kill-checkpoint)
      launch "$run"
      if wait_for "$pid" temp_checkpoint; then kill -KILL "$pid"; fi
      { wait "$pid"; } 2>/dev/null || true
      ;;
    kill-eval)
      launch "$run"
      if wait_for "$pid" eval_running; then kill -KILL "$pid"; fi
      { wait "$pid"; } 2>/dev/null || true
      ;;
    term)
      launch "$run"
      moment
      sleep "$at"
      kill -TERM "$pid" 2>/dev/null || true
      rc=0 && wait "$pid" || rc=$?
      [ $rc -eq 143 ] || [ -f "$run/ckpt-$steps.safetensors" ] || fail "SIGTERM: exit status $rc, not 143"
      ;;
    disk-full)
      # Writes past 60 MB fail (EFBIG, SIGXFSZ ignored): the next checkpoint (133 MB) cannot be written.
      rc=0
      touch "$work/marker"
      (
        ulimit -f 60000
        trap '' XFSZ
        exec "$detr" train --data "$work/data" --out "$run" $flags --resume auto >>"$run.log" 2>&1
      ) || rc=$?
      [ $rc -eq 1 ] || fail "disk full: exit status $rc, not 1"
      grep -q "File too large" "$run.log" || fail "disk full: no message naming the failed write in $run.log"
      grep -q "could not be saved" "$run.log" || fail "disk full: no message saying what is kept in $run.log"
      [ -z "$(find "$run" -name '*.tmp*' -newer "$work/marker")" ] || fail "disk full: its temporary file was left"
      ;;
    second-process)
      launch "$run"
      first=$pid
      sleep 3
      rc=0
      "$detr" train --data "$work/data" --out "$run" $flags --resume auto >"$work/second.log" 2>&1 || rc=$?
      [ $rc -ne 0 ] || fail "a second process into the live run was not refused"
      grep -q "process $first" "$work/second.log" || fail "the second process refusal names no process $first: $(cat "$work/second.log")"
      kill -0 "$first" 2>/dev/null || [ -f "$run/ckpt-$steps.safetensors" ] || fail "the first process died"
      kill -KILL "$first" 2>/dev/null || true
      { wait "$first"; } 2>/dev/null || true
      ;;
  esac
  say "launch $launches: $fault; checkpoints now: $(cd "$run" && ls ckpt-*.safetensors 2>/dev/null | tr '\n' ' ')"
done
train "$run" --resume auto || fail "the last launch failed: $run.log"
say "$launches interrupted launches, then one to the end"
same_weights "$ref/ckpt-$steps.safetensors" "$run/ckpt-$steps.safetensors" && say "same weights as the reference"
same_metrics "$ref" "$run"
cmp -s "$work/notes.orig" "$run/notes.txt" || fail "the user's notes.txt was changed"
! compgen -G "$run/*.tmp*" >/dev/null || fail "temporary files left at the end: $(ls "$run")"

# --- a corrupt image appearing between two launches ---
img=$(ls "$work/data/train" | head -3 | tail -1)
cp "$work/data/train/$img" "$work/good.jpg"
half=$((steps / 2 / ckpt_every * ckpt_every))
corrupt() { head -c 300 "$work/good.jpg" >"$work/data/train/$img"; }
fix() { cp "$work/good.jpg" "$work/data/train/$img"; }

# fail: the run stops at the bad image with its finished steps saved; fixed, it ends as the reference.
bad="$work/fail"
train "$bad" --max-steps "$half"
corrupt
rc=0 && train "$bad" --resume auto || rc=$?
[ $rc -eq 1 ] || fail "--bad-input fail: exit status $rc, not 1"
grep -q "$img" "$bad.log" || fail "--bad-input fail: $img is not named in $bad.log"
grep -q -- "--bad-input skip" "$bad.log" || fail "--bad-input fail: the skipping command is not given"
fix
train "$bad" --resume auto || fail "resuming after the fix failed: $bad.log"
same_weights "$ref/ckpt-$steps.safetensors" "$bad/ckpt-$steps.safetensors" && say "--bad-input fail: stopped, fixed, resumed: same weights as the reference"
same_metrics "$ref" "$bad"

# skip: a run that skips it from the middle on, killed and resumed, ends as one left alone.
fix
for out in skip_ref skip_run; do
  train "$work/$out" --max-steps "$half" --bad-input skip
done
corrupt
train "$work/skip_ref" --resume auto --bad-input skip
launch "$work/skip_run" --bad-input skip
sleep 6
kill -KILL "$pid" 2>/dev/null || true
{ wait "$pid"; } 2>/dev/null || true
train "$work/skip_run" --resume auto --bad-input skip
fix
grep -q "$img" "$work/skip_ref.log" || fail "--bad-input skip: $img is not named in the log"
same_weights "$work/skip_ref/ckpt-$steps.safetensors" "$work/skip_run/ckpt-$steps.safetensors" &&
  say "--bad-input skip: killed and resumed: same weights as the run left alone"
same_metrics "$work/skip_ref" "$work/skip_run"
if cmp -s <(tensor_bytes "$ref/ckpt-$steps.safetensors") <(tensor_bytes "$work/skip_ref/ckpt-$steps.safetensors"); then
  fail "--bad-input skip: the weights equal the run that trained on the image (was it skipped?)"
fi

if [ $failures -eq 0 ]; then
  say "passed ($(($(date +%s) - t0)) s)"
  $keep || rm -rf "$work"
  exit 0
fi
say "$failures failure(s); the runs are in $work"
exit 1
