#!/usr/bin/env bash
# Training throughput of the main job's exact configuration (tools/main.sh), in images/s over
# whole epochs (data loading, step, optimizer: what a user sees), on an idle machine and beside a
# CPU-bound process on one core (a shell loop: what a package install or a second job does).
#
#   bash bench/main_job_speed.sh [--detr BUILD/detr ...] [--model main|issue18] [--epochs 3]
#                                [--threads T] [--images N] [--rounds 2] [--no-busy] [--pad-multiple N]
#
# Several --detr binaries are run alternately (A B A B ...), each idle and then busy, so that a
# before/after pair is measured on the same machine in one run. --model issue18 is the main job's
# model when issue #18 was written (DETR decoder, stride 32, hidden 64, 5 queries), which older
# builds can run, with that job's training flags (no --pad-multiple, which those builds lack; add
# it with --pad-multiple N where every binary has it); main is today's, with tools/main.sh's flags.
# Epoch 0 (warm-up: allocator, oneDNN primitives) is not counted. --images N trains on a set of N
# images made as the main job's (data/synth-main-N; the main job has 6000, 1000 keeps a run short):
# a build whose busy epochs take minutes (libgomp's default spin) is measured on fewer. The run directories go to a temporary folder, removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
binaries=()
model=main
epochs=3
threads=""
images=1000
busy=1
rounds=2
pad=""
while [ $# -gt 0 ]; do
  case "$1" in
    --detr) binaries+=("$2"); shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --threads) threads="--threads $2"; shift 2 ;;
    --images) images="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --no-busy) busy=0; shift ;;
    --pad-multiple) pad="--pad-multiple $2"; shift 2 ;;
    *) echo "main_job_speed.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ ${#binaries[@]} -gt 0 ] || binaries=(build/detr)
source tools/main_job_config.sh  # main_data, main_make_data, main_model, main_train_flags
case "$model" in
  main) config=$main_model flags=$main_train_flags ;;
  issue18) config="--config tiny --set num_classes=14 --set frozen_stages=0 --set backbone_width=16 --set hidden_dim=64
    --set ffn_dim=256 --set num_queries=5 --set dropout=0"
    flags="--lr 2e-4 --lr-backbone 5e-5 --batch 4 --image-size 160 --max-size 224" ;;
  *) echo "main_job_speed.sh: --model main or issue18" >&2; exit 2 ;;
esac
data=data/synth-main-$images
main_make_data "${binaries[0]}" "$data" "$images" > /dev/null
work=$(mktemp -d)
spinner=""
cleanup() { [ -n "$spinner" ] && kill "$spinner" 2> /dev/null; rm -rf "$work"; }
trap cleanup EXIT

# Images/s of epochs 1.. of one training run: the training images over each epoch's seconds.
run_one() {
  local bin="$1" out="$work/run"
  rm -rf "$out"
  "$bin" train --data "$data" --out "$out" $config --enact $flags $pad --epochs "$epochs" --eval-every 0 --checkpoint-every 1000000 \
    --no-progress $threads 2> "$work/log" > /dev/null || { cat "$work/log" >&2; exit 1; }
  local per_epoch
  per_epoch=$(sed -n 's/.*(\([0-9]*\) batches of \([0-9]*\) per epoch).*/\1 \2/p' "$work/log" | awk '{print $1 * $2}')
  awk -v n="$per_epoch" '/^epoch [0-9]+ done in/ { if ($2 > 0) printf "%s%.1f", sep, n / $5; sep = " " }' "$work/log"
  grep -o "other processes use.*" "$work/log" | sort | uniq -c | awk '{$1 = $1 "x"; printf " [%s]", $0}' || true
}

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; model $model, $epochs epochs, images/s of epochs 1..$((epochs - 1))"
for round in $(seq "$rounds"); do
  for bin in "${binaries[@]}"; do
    echo "round $round  $bin  idle: $(run_one "$bin")"
    if [ "$busy" = 1 ]; then
      bash -c 'while :; do :; done' &
      spinner=$!
      echo "round $round  $bin  busy: $(run_one "$bin")"
      kill "$spinner"; wait "$spinner" 2> /dev/null || true; spinner=""
    fi
  done
done
