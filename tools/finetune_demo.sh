#!/usr/bin/env bash
# Fine-tuning onto one's own classes, end to end (docs/finetune.md): the main job's best checkpoint
# (tools/main.sh: Conditional DETR + ENACT on six shape classes) fine-tuned onto a relabelled copy
# of its data with three classes - round (ellipse, ring), boxy (rectangle, diamond), pointy
# (triangle, cross) - beside the same model trained for the same steps from the pretrained
# backbone alone; both evaluated, then the fine-tuned model's predictions and pictures.
#   bash tools/finetune_demo.sh [--steps 300] [--out runs/finetune]
# Needs runs/main/best.safetensors and runs/main/backbone.safetensors (bash tools/main.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=300 out=runs/finetune
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "usage: bash tools/finetune_demo.sh [--steps N] [--out DIR]" >&2; exit 2 ;;
  esac
done
detr=build-main/detr
source tools/main_job_config.sh  # main_data, main_model, main_train_flags
[ -f runs/main/best.safetensors ] || { echo "finetune_demo: run bash tools/main.sh first" >&2; exit 1; }

# 1. Your own data: a COCO-format folder, annotations/instances_{train,val}.json and the images in
#    train/ and val/. Here the main job's pictures with new labels (the images linked, not copied).
data=$main_data-3class
if [ ! -f "$data/annotations/instances_val.json" ]; then
  mkdir -p "$data/annotations"
  ln -sfn "$(realpath "$main_data/train")" "$data/train"
  ln -sfn "$(realpath "$main_data/val")" "$data/val"
  for split in train val; do
    sed -E -e 's/"category_id": (3|13),/"category_id": X1,/; s/"category_id": (1|7),/"category_id": X2,/' \
      -e 's/"category_id": (4|9),/"category_id": X3,/; s/"category_id": X([123]),/"category_id": \1,/' \
      -e '/"supercategory": "shape"/d' \
      -e 's/^"categories": \[$/"categories": [\n{"id": 1, "name": "round"},\n{"id": 2, "name": "boxy"},\n{"id": 3, "name": "pointy"}/' \
      "$main_data/annotations/instances_$split.json" >"$data/annotations/instances_$split.json"
  done
fi

# 2. Fine-tune from the checkpoint: no --config (the checkpoint's model), no file edited; the
#    class head is re-initialised for the three classes and the log says so.
run="--data $data --lr 2e-4 --lr-backbone 5e-5 --batch 4 --max-steps $steps --seed 0 --resume auto"
"$detr" train $run --out "$out/from-checkpoint" --init runs/main/best.safetensors 2>&1 | tee "$out.init.log"

# 3. The baseline: the same model and steps from the pretrained backbone alone.
"$detr" train $run --out "$out/from-backbone" $main_model --set num_classes=4 --enact \
  --image-size 160 --max-size 224 --pad-multiple 16 --init-backbone runs/main/backbone.safetensors

# 4. Both evaluated as their runs would (sizes, padding and batch from the checkpoints).
for r in from-checkpoint from-backbone; do
  "$detr" eval --checkpoint "$out/$r/ckpt-$steps.safetensors" --data "$data" --json "$out/$r/eval.json" \
    2>&1 | tee "$out/$r/eval.log"
done

# 5. Predictions with the new class names, and what the model attends to.
"$detr" predict --checkpoint "$out/from-checkpoint/ckpt-$steps.safetensors" --out "$out/predict" \
  --show attention --show clusters "$data"/val/000000000001.jpg "$data"/val/000000000002.jpg

ap() { sed -n "s/.*\"$2\": \([-0-9.e]*\).*/\1/p" "$out/$1/eval.json" | awk '{printf "%.3f", $1}'; }
echo
echo "after $steps steps on three classes (val, $(grep -c '"file_name"' "$data/annotations/instances_val.json") images):"
echo "  fine-tuned from the main job's checkpoint: AP50 $(ap from-checkpoint AP50)  AP $(ap from-checkpoint AP)"
echo "  from the pretrained backbone alone:        AP50 $(ap from-backbone AP50)  AP $(ap from-backbone AP)"
