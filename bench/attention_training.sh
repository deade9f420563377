#!/usr/bin/env bash
# The same small DETR trained on the synthetic set with each encoder-attention variant, same budget
# (epochs, data, seed, pretrained backbone): AP50 on val and training images/s per variant, one
# Markdown table row each (docs/attention.md).
#
#   bash bench/attention_training.sh [--detr build/detr] [--epochs 25] [--variants "dense enact ..."]
#                                    [--backbone FILE] [--out DIR]
#
# The model and optimiser settings are the main job's (tools/main_job_config.sh: Conditional DETR,
# stride-16 ResNet-18 at width 16, hidden 128, 160-224 pixel images), on its set made with 1000
# training images (data/synth-main-1000, as when docs/attention.md's table was measured); the
# backbone is pretrained on that set for 30 epochs (OUT/backbone.safetensors, made when missing).
# Each variant's run keeps its directory under --out (default runs/attention) with metrics.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
detr=build/detr
epochs=25
variants="dense enact efficient hydra focused sra"
backbone=
out=runs/attention
while [ $# -gt 0 ]; do
  case "$1" in
    --detr) detr="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --variants) variants="$2"; shift 2 ;;
    --backbone) backbone="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "attention_training.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
backbone=${backbone:-$out/backbone.safetensors}
source tools/main_job_config.sh  # main_data, main_make_data, main_model, main_train_flags
data=data/synth-main-1000
model=$main_model
main_make_data "$detr" "$data" 1000 > /dev/null
if [ ! -f "$backbone" ]; then
  mkdir -p "$(dirname "$backbone")"
  "$detr" pretrain --data "$data" --out "$backbone" $model --epochs 30 --no-progress > /dev/null
fi
mkdir -p "$out"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $epochs epochs each, lr x0.1 at $((epochs * 2 / 3))"
echo "| variant | AP50 | AP | training images/s | clusters/img (ENACT) |"
echo "|---|---|---|---|---|"
for v in $variants; do
  run="$out/$v"
  rm -rf "$run"
  "$detr" train --data "$data" --out "$run" $model --set encoder_attn="$v" --init-backbone "$backbone" \
    $main_train_flags --lr-drop $((epochs * 2 / 3 > 0 ? epochs * 2 / 3 : 1)) --epochs "$epochs" --eval-every "$epochs" \
    --no-progress 2> "$run.log" > /dev/null || { cat "$run.log" >&2; exit 1; }
  # Images/s over whole epochs 1.. (epoch 0 warms up), the last evaluation's AP50 and AP.
  per_epoch=$(sed -n 's/.*(\([0-9]*\) batches of \([0-9]*\) per epoch).*/\1 \2/p' "$run.log" | awk '{print $1 * $2}')
  ips=$(awk -v n="$per_epoch" '/^epoch [0-9]+ done in/ && $2 > 0 {s += $5; k++} END {printf "%.1f", k ? n * k / s : 0}' "$run.log")
  eval_line=$(grep '"type": "eval"' "$run/metrics.jsonl" | tail -1)
  field() { echo "$eval_line" | sed -n "s/.*\"$1\": \([-0-9.e]*\).*/\1/p" | awk '{printf "%.3f", $1}'; }
  clusters=$(echo "$eval_line" | sed -n 's/.*"clusters_per_image": \([0-9.]*\).*/\1/p')
  echo "| $v | $(field AP50) | $(field AP) | $ips | ${clusters:--} |"
done
