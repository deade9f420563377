#!/usr/bin/env bash
# The same small DETR trained on the synthetic set with each encoder-attention variant, same budget
# (epochs, data, pretrained backbone), once per seed: AP50 and AP on val and training images/s per run,
# then one Markdown row per variant (docs/attention.md): each seed's AP50, their mean and range.
#
#   bash bench/attention_training.sh [--detr build/detr] [--epochs 25] [--seeds "42 1 2"]
#                                    [--variants "dense enact ..."] [--backbone FILE] [--out DIR]
#
# The model and optimiser settings are the main job's (tools/main_job_config.sh: Conditional DETR,
# stride-16 ResNet-18 at width 16, hidden 128, 160-224 pixel images), on its set made with 1000
# training images (data/synth-main-1000, as when docs/attention.md's table was measured); the
# backbone is pretrained on that set for 30 epochs (OUT/backbone.safetensors, made when missing).
# A variant is an encoder_attn value, or `rcda`: Anchor DETR's decoder kind (decoder=anchor), which
# brings its own row-column decoupled attention encoder; its queries are 12 (4 anchor points x 3
# patterns: a multiple of 3 nearest the main job's 10). Each run keeps its directory under --out
# (default runs/attention/VARIANT-sSEED) with metrics.jsonl; each run's row is printed as it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
detr=build/detr
epochs=25
variants="dense enact efficient hydra focused sra swin rcda"
seeds="42 1 2"
backbone=
out=runs/attention
while [ $# -gt 0 ]; do
  case "$1" in
    --detr) detr="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --variants) variants="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
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
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $epochs epochs each, lr x0.1 at $((epochs * 2 / 3)); seeds $seeds"
echo "| variant | seed | AP50 | AP | training images/s | clusters/img (ENACT) |"
echo "|---|---|---|---|---|---|"
summary=$(mktemp)
for v in $variants; do
  case "$v" in
    rcda) variant_flags="--set decoder=anchor --set num_queries=12" ;;
    *) variant_flags="--set encoder_attn=$v" ;;
  esac
  for seed in $seeds; do
    run="$out/$v-s$seed"
    rm -rf "$run"
    "$detr" train --data "$data" --out "$run" $model $variant_flags --init-backbone "$backbone" --seed "$seed" \
      $main_train_flags --lr-drop $((epochs * 2 / 3 > 0 ? epochs * 2 / 3 : 1)) --epochs "$epochs" --eval-every "$epochs" \
      --no-progress 2> "$run.log" > /dev/null || { cat "$run.log" >&2; exit 1; }
    # Images/s over whole epochs 1.. (epoch 0 warms up), the last evaluation's AP50 and AP.
    per_epoch=$(sed -n 's/.*(\([0-9]*\) batches of \([0-9]*\) per epoch).*/\1 \2/p' "$run.log" | awk '{print $1 * $2}')
    ips=$(awk -v n="$per_epoch" '/^epoch [0-9]+ done in/ && $2 > 0 {s += $5; k++} END {printf "%.1f", k ? n * k / s : 0}' "$run.log")
    eval_line=$(grep '"type": "eval"' "$run/metrics.jsonl" | tail -1)
    field() { echo "$eval_line" | sed -n "s/.*\"$1\": \([-0-9.e]*\).*/\1/p" | awk '{printf "%.3f", $1}'; }
    clusters=$(echo "$eval_line" | sed -n 's/.*"clusters_per_image": \([0-9.]*\).*/\1/p')
    echo "| $v | $seed | $(field AP50) | $(field AP) | $ips | ${clusters:--} |"
    echo "$v $(field AP50) $(field AP) $ips" >> "$summary"
  done
done
# One row per variant: each seed's AP50 (in --seeds order), mean and range; AP's mean; images/s's median.
echo
echo "| variant | AP50 per seed | AP50 mean | AP50 range | AP mean | training images/s (median) |"
echo "|---|---|---|---|---|---|"
awk '{ap50[$1] = ap50[$1] (ap50[$1] == "" ? "" : " / ") $2; s[$1] += $2; a[$1] += $3; n[$1]++
      if (!($1 in lo) || $2 < lo[$1]) lo[$1] = $2; if (!($1 in hi) || $2 > hi[$1]) hi[$1] = $2
      ips[$1, n[$1]] = $4; if (n[$1] == 1) order[++k] = $1}
     END {for (i = 1; i <= k; i++) {v = order[i]; m = n[v]
            for (x = 1; x <= m; x++) for (y = x + 1; y <= m; y++) if (ips[v, y] < ips[v, x]) {t = ips[v, x]; ips[v, x] = ips[v, y]; ips[v, y] = t}
            med = m % 2 ? ips[v, (m + 1) / 2] : (ips[v, m / 2] + ips[v, m / 2 + 1]) / 2
            printf "| %s | %s | %.3f | %.3f | %.3f | %.1f |\n", v, ap50[v], s[v] / m, hi[v] - lo[v], a[v] / m, med}}' "$summary"
rm -f "$summary"
