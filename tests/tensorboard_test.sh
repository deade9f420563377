#!/usr/bin/env bash
# `detr train`'s event files read by TensorBoard's own reader (tools/check_tensorboard.py:
# EventAccumulator): a run of 3 epochs with ENACT and an evaluation after each, and the same run
# resumed from its step-4 checkpoint after its later checkpoints were removed (the steps past it
# logged twice, once cut back); every scalar against metrics.jsonl, pictures at each evaluation.
# Skipped (exit 77) when the python in DETR_TB_PYTHON (default python3) has no `tensorboard`
# package (pip install tensorboard). Usage: tensorboard_test.sh DETR CHECK_TENSORBOARD_PY
set -euo pipefail
detr=$1 check=$2
python=${DETR_TB_PYTHON:-python3}
if ! "$python" -c 'import tensorboard' 2>/dev/null; then
  echo "tensorboard_test: skipped: $python has no tensorboard package (pip install tensorboard, or set DETR_TB_PYTHON)"
  exit 77
fi
dir=$(mktemp -d /tmp/tensorboard_test.XXXXXX)
trap 'rm -rf "$dir"' EXIT
flags=(--config tiny --set num_classes=100 --set enact=true --epochs 3 --batch 4 --eval-every 1 --checkpoint-every 2
       --keep 20 --workers 1 --threads 2 --seed 5 --no-progress)
"$detr" synth --out "$dir/data" --train 12 --val 4 --seed 3 >/dev/null
"$detr" train --data "$dir/data" --out "$dir/straight" "${flags[@]}" 2>"$dir/log.txt"
"$detr" train --data "$dir/data" --out "$dir/resumed" --max-steps 8 "${flags[@]}" 2>>"$dir/log.txt"
rm "$dir/resumed/ckpt-8.safetensors" "$dir/resumed/ckpt-6.safetensors"
"$detr" train --data "$dir/data" --out "$dir/resumed" --max-steps 9 --resume auto "${flags[@]}" 2>>"$dir/log.txt"
grep -q 'dropped .* events past step 4' "$dir/log.txt" || { echo "FAILED: the resumed run cut nothing"; exit 1; }
"$python" "$check" "$dir/straight" "$dir/resumed"
