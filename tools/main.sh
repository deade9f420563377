#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install, build, generate the synthetic COCO-format
# dataset, train a small DETR+ENACT on it on the CPU, evaluate it (COCO mAP), draw predictions.
# About 15 minutes on 2 cores. Everything lands in runs/main/ (metrics.jsonl, chart.png,
# checkpoints, eval.json, predict/).
#   bash tools/main.sh [--epochs N] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=6
out=runs/main
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "tools/main.sh: unknown argument $1 (see the header of this file)" >&2; exit 2 ;;
  esac
done
start=$(date +%s)
bash tools/setup.sh
# The CPU job needs no CUDA backend: skip its (slow) compilation here; tools/test.sh builds it.
cmake -S . -B build-main -DDETR_CUDA=OFF -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build-main -j"$(nproc)" --target detr_cli
detr=build-main/detr

data=data/synth
if [ ! -f "$data/annotations/instances_val.json" ]; then
  "$detr" synth --out "$data" --train 1000 --val 200 --seed 0
fi

# A small DETR+ENACT trained from scratch (no pretrained backbone can be downloaded): ResNet-18
# with every stage trained, hidden 64, 2+2 layers, 20 queries, 192-pixel images. Category ids of
# the synthetic set go up to 13, so 14 classes (+ no-object).
"$detr" train --data "$data" --out "$out" --config tiny --enact \
  --set num_classes=14 --set frozen_stages=0 --set hidden_dim=64 --set ffn_dim=256 --set num_queries=20 \
  --set dropout=0 --lr 2e-4 --lr-backbone 1e-4 --image-size 192 --max-size 288 \
  --epochs "$epochs" --eval-every 2 --resume auto

"$detr" eval --checkpoint "$out/best.safetensors" --data "$data" --json "$out/eval.json" \
  --results "$out/results.json" --image-size 192 --max-size 288
"$detr" predict --checkpoint "$out/best.safetensors" --out "$out/predict" --threshold 0.5 \
  "$data"/val/000000000001.jpg "$data"/val/000000000002.jpg "$data"/val/000000000003.jpg > /dev/null

echo
echo "main job done in $(( ($(date +%s) - start) / 60 )) min:"
echo "  COCO metrics of the best checkpoint: $out/eval.json (printed above)"
echo "  loss and mAP chart:                  $out/chart.png"
echo "  predictions drawn:                   $out/predict/*.png"
