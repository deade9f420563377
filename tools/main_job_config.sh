# The main job's data set, model and training settings, in one place: tools/main.sh runs them;
# bench/main_job_speed.sh and bench/attention_training.sh measure them. Sourced (bash).

# The synthetic set's variant sized for a 15-minute CPU run: at most 3 objects per image, no side
# below 40 pixels, images of 160-224 pixels (the default set - up to 8 objects from 10 pixels -
# needs a larger model and hours; docs/training.md). 6000 training images seen 7 times teach the
# detector more than 1000 seen 42 times (docs/training.md, "more images, fewer epochs"); the 200
# val images are the same for any number of training images.
main_train_images=6000
main_data=data/synth-main-$main_train_images
# main_make_data DETR [DIR TRAIN_IMAGES]: writes the set (or one made the same way with another
# number of training images: the benchmarks use data/synth-main-1000) unless it is there.
main_make_data() {
  local dir="${2:-$main_data}" train="${3:-$main_train_images}"
  [ -f "$dir/annotations/instances_val.json" ] && return 0
  "$1" synth --out "$dir" --train "$train" --val 200 --seed 0 --max-objects 3 --min-object-side 40 \
    --min-side 160 --max-side 224
}

# The model (docs/training.md has what was tried): Conditional DETR (its decoder converges faster
# than DETR's: docs/conditional_detr.md) with ENACT in the encoder (`--enact`, given with the
# training flags), on a ResNet-18 of quarter width (16 channels at the stem) that stops after
# layer3 - stride 16, so that the 160-224 pixel images give 10x10 to 14x14 feature maps, on which
# ENACT forms real clusters and the reference points find the objects - every stage trained,
# hidden 128, 2 encoder and 3 decoder layers, 10 queries for at most 3 objects. Category ids of
# the synthetic set go up to 13, so 14 classes.
main_model="--config tiny --set decoder=conditional --set num_classes=14 --set frozen_stages=0 --set backbone_width=16
  --set backbone_layers=3 --set hidden_dim=128 --set ffn_dim=512 --set dec_layers=3 --set num_queries=10
  --set dropout=0"
# Optimiser, batch and image sizes (the learning-rate drop depends on the epochs: the caller's).
# Batches padded to a multiple of 16 pixels: a few dozen distinct input sizes instead of a new one
# almost every batch, so oneDNN builds each size's convolutions once (1.1x the images/s;
# bench/README.md#main_job_speed).
main_train_flags="--lr 2e-4 --lr-backbone 5e-5 --batch 4 --image-size 160 --max-size 224 --pad-multiple 16"
# main_lr_drop EPOCHS: the epoch after which the learning rate drops x0.1: 5/7 of the run, at least 1.
main_lr_drop() {
  local drop=$(($1 * 5 / 7))
  echo $((drop > 0 ? drop : 1))
}
# DETR starts from a pretrained backbone; none can be downloaded here, so the backbone first learns
# to classify the training set's object crops: 15 passes over 9495 crops, a minute (with 10, a weaker
# seed's crop accuracy stayed at 0.96 and its detector 0.15 AP50 behind; docs/training.md).
main_pretrain_epochs=15
