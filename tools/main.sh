#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install, build, generate the synthetic COCO-format
# dataset, pretrain the backbone on its object crops, train a small DETR+ENACT on it on the CPU,
# evaluate it (COCO mAP), draw predictions. About 15 minutes on 2 cores. Everything lands in
# runs/main/ (backbone.safetensors, metrics.jsonl, chart.png, checkpoints, eval.json, predict/).
#   bash tools/main.sh [--epochs N] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=70
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

# The synthetic set's variant sized for a 15-minute CPU run: at most 3 objects per image, no side
# below 40 pixels, images of 160-224 pixels (the default set - up to 8 objects from 10 pixels -
# needs a larger model and hours; docs/training.md).
data=data/synth-main
if [ ! -f "$data/annotations/instances_val.json" ]; then
  "$detr" synth --out "$data" --train 1000 --val 200 --seed 0 --max-objects 3 --min-object-side 40 \
    --min-side 160 --max-side 224
fi

# The model: DETR+ENACT with a ResNet-18 of quarter width (16 channels at the stem; 2.5x the
# images per second of width 32, and as good a classifier), every stage trained, hidden 64, 2+2
# layers, 5 queries for at most 3 objects (fewer queries, each matched more often, leave DETR's
# early phase sooner). Category ids of the synthetic set go up to 13, so 14 classes (+ no-object). DETR starts from a pretrained backbone; none can be downloaded here, so
# the backbone first learns to classify the training set's object crops (about a minute).
model="--config tiny --set num_classes=14 --set frozen_stages=0 --set backbone_width=16 --set hidden_dim=64
  --set ffn_dim=256 --set num_queries=5 --set dropout=0"
if [ ! -f "$out/backbone.safetensors" ]; then
  mkdir -p "$out"
  "$detr" pretrain --data "$data" --out "$out/backbone.safetensors" $model --epochs 10
fi
"$detr" train --data "$data" --out "$out" $model --enact --init-backbone "$out/backbone.safetensors" \
  --lr 2e-4 --lr-backbone 5e-5 --lr-drop $(( epochs * 2 / 3 > 0 ? epochs * 2 / 3 : 1 )) --batch 4 --image-size 160 --max-size 224 \
  --epochs "$epochs" --eval-every 10 --resume auto

"$detr" eval --checkpoint "$out/best.safetensors" --data "$data" --json "$out/eval.json" \
  --results "$out/results.json" --image-size 160 --max-size 224
"$detr" predict --checkpoint "$out/best.safetensors" --out "$out/predict" --threshold 0.3 \
  "$data"/val/000000000001.jpg "$data"/val/000000000002.jpg "$data"/val/000000000003.jpg > /dev/null

echo
echo "main job done in $(( ($(date +%s) - start) / 60 )) min:"
echo "  COCO metrics of the best checkpoint: $out/eval.json (printed above)"
echo "  loss and mAP chart:                  $out/chart.png"
echo "  predictions drawn:                   $out/predict/*.png"
