#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install, build, generate the synthetic COCO-format
# dataset, pretrain the backbone on its object crops, train a small Conditional DETR + ENACT on it
# on the CPU, evaluate it (COCO mAP), draw predictions, print a summary. About 4 minutes on a
# 2-core Zen 5 with the packages there; a 2-core Zen 3 took 2.4-3.2x as long for the same work
# (README). Everything lands in runs/main/ (backbone.safetensors, metrics.jsonl, chart.png,
# checkpoints, eval.json, eval.log, predict/); with another --seed or --epochs in runs/main-seedS,
# runs/main-epochsN or runs/main-epochsN-seedS, unless --out names the directory. A rerun resumes
# what its directory holds (a finished run: only the evaluation and pictures again).
#   bash tools/main.sh [--epochs N] [--seed S] [--precision fp32|bf16] [--out DIR]
# --epochs: passes over the 6000 training images (default 7; the learning rate drops x0.1 after
# 5/7 of them).
# --seed changes the pretraining's and the training's initialisation, data order and augmentation
# (not the data set). --precision bf16 trains in bf16 (docs/precision.md; runs/main-bf16...); the
# evaluation stays fp32.
set -euo pipefail
cd "$(dirname "$0")/.."
epochs=7
seed=42
precision=fp32
threshold=0.3
out=
while [ $# -gt 0 ]; do
  case "$1" in
    --epochs) epochs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --precision) precision="$2"; shift 2 ;;
    *) echo "tools/main.sh: unknown argument $1 (see the header of this file)" >&2; exit 2 ;;
  esac
done
# A run directory per setting (runs/main, runs/main-seed1, runs/main-epochs6, ...): the job resumes
# what its directory holds, and a finished run of other settings would be reported as this one's.
if [ -z "$out" ]; then
  out=runs/main
  [ "$epochs" = 7 ] || out="$out-epochs$epochs"
  [ "$seed" = 42 ] || out="$out-seed$seed"
  [ "$precision" = fp32 ] || out="$out-$precision"
fi
start=$(date +%s)
bash tools/setup.sh
# The CPU job needs no CUDA backend: skip its (slow) compilation here; tools/test.sh builds it.
cmake -S . -B build-main -DDETR_CUDA=OFF -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build-main -j"$(nproc)" --target detr_cli
detr=build-main/detr

source tools/main_job_config.sh  # main_data, main_make_data, main_model, main_train_flags, ...
data=$main_data
model=$main_model
main_make_data "$detr"
# The backbone is pretrained on the training set's object crops first (main_pretrain_epochs). Both cores, or the one another busy process leaves free (detr's default: bench/README.md#bench_step
# and bench/README.md#main_job_speed).
train_start=$(date +%s)  # pretraining, training and evaluation from here
if [ ! -f "$out/backbone.safetensors" ]; then
  mkdir -p "$out"
  "$detr" pretrain --data "$data" --out "$out/backbone.safetensors" $model --epochs "$main_pretrain_epochs" --seed "$seed"
fi
"$detr" train --data "$data" --out "$out" $model --enact --init-backbone "$out/backbone.safetensors" \
  $main_train_flags --lr-drop "$(main_lr_drop "$epochs")" \
  --epochs "$epochs" --eval-every 1 --seed "$seed" --precision "$precision" --resume auto

# Evaluated in batches of 4 as during training: padding to the batch's largest image changes a
# DETR's output a little (same weights: AP50 0.465 in batches of 4, 0.443 of 2, 2026-11-23).
"$detr" eval --checkpoint "$out/best.safetensors" --data "$data" --json "$out/eval.json" \
  --results "$out/results.json" --image-size 160 --max-size 224 --batch 4 2>&1 | tee "$out/eval.log"
# Focal sigmoid scores: a detection the model is sure of scores 0.5-0.9, the rest below 0.2.
"$detr" predict --checkpoint "$out/best.safetensors" --out "$out/predict" --threshold "$threshold" \
  "$data"/val/000000000001.jpg "$data"/val/000000000002.jpg "$data"/val/000000000003.jpg | tee "$out/predict.log"
end=$(date +%s)

# The summary: the 12 COCO numbers (eval.json), training images/s (the mean over metrics.jsonl's
# training lines), ENACT's clusters per image (detr eval's report).
coco() { sed -n "s/.*\"$1\": \([-0-9.e]*\).*/\1/p" "$out/eval.json" | awk -v k="$1" '{printf "%s %.3f", k, $1}'; }
ips=$(awk -F'"images_per_s": ' '/"type": "train"/ && NF > 1 {split($2, a, /[,}]/); s += a[1]; n++}
      END {if (n) printf "%.0f", s / n}' "$out/metrics.jsonl")
clusters=$(sed -n 's/.*clusters_per_image \([0-9.]*\).*/\1/p' "$out/eval.log" | tail -1)
echo
mmss() { printf "%d min %02d s" $(( $1 / 60 )) $(( $1 % 60 )); }
echo "main job done in $(mmss $(( end - start ))) (pretraining, training and evaluation $(mmss $(( end - train_start ))))"
echo "  COCO, best checkpoint, val: $(coco AP)  $(coco AP50)  $(coco AP75)  $(coco APs)  $(coco APm)  $(coco APl)"
echo "                              $(coco AR1)  $(coco AR10)  $(coco AR100)  $(coco ARs)  $(coco ARm)  $(coco ARl)"
echo "  training speed:             $ips images/s"
echo "  ENACT:                      $clusters clusters per image in the encoder (val)"
echo "  chart (loss, AP by epoch):  $out/chart.png"
echo "  predictions (score >= $threshold): $out/predict/*.png, $(grep -c " -> " "$out/predict.log" || true) images"
