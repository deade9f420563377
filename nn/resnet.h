// torchvision's ResNet-18/34/50/101 with frozen batch norm, as DETR's backbone
// (models/backbone.py): the stem and layer1 frozen, layer2-4 trained at the backbone learning
// rate, output of layer4. Parameter names under `prefix` ("backbone.0.body").
//
// It runs channels last: every activation from the stem's output on is [B, H, W, C] (the images
// are permuted once on the way in), which lets the CPU's oneDNN convolutions work on the tensors
// themselves instead of reordering to and from their blocked layout around every call; max-pool
// and the frozen batch norms take the same layout. Weights keep torch's [O, C, KH, KW], so
// checkpoints and the parity tools see no difference (bench/README.md#bench_ops: `--conv-last`).
#pragma once
#include "nn/layers.h"

typedef struct {
  Conv2d conv1, conv2, conv3;  // conv3 only in bottleneck blocks
  FrozenBn bn1, bn2, bn3;
  bool bottleneck, has_downsample;
  Conv2d down_conv;
  FrozenBn down_bn;
  FoldedConv f1, f2, f3, fdown;  // resnet_fold_bn's: each convolution with its norm folded in
} ResBlock;

#define RESNET_MAX_BLOCKS 33  // ResNet-101: 3 + 4 + 23 + 3

typedef struct {
  Conv2d conv1;
  FrozenBn bn1;
  ResBlock blocks[RESNET_MAX_BLOCKS];
  int n_blocks;
  int64_t out_channels;  // 512 (18/34) or 2048 (50/101) at width 64 with 4 layers
  FoldedConv fstem;      // conv1 with bn1 folded in
  bool folded;           // resnet_fold_bn ran: the forward with grad mode off uses the folded copies
} ResNet;

// depth 18, 34, 50 or 101; dilation: layer4 with dilation 2 instead of stride 2 (DC5);
// train_layers: false freezes everything (lr_backbone = 0). frozen_stages: how many leading stages
// stay frozen when training, 2 = the stem and layer1 as the reference (which starts from ImageNet
// weights); 0 trains the whole backbone (training from scratch).
// width: channels of the stem and layer1 (torchvision: 64; 0 means 64), doubled by each later layer.
// layers: how many of layer1..layer4 to build and run (4, DETR: output stride 32; 3: the output of
// layer3, stride 16, as torchvision's IntermediateLayerGetter returning layer3; 0 means 4).
void resnet_create(ResNet *r, ParamStore *ps, const char *prefix, int depth, int width, int layers, bool dilation,
                   bool train_layers, int frozen_stages);
void resnet_init(ResNet *r, Rng *rng);  // kaiming-normal (fan out) convolutions
// Sets every frozen batch norm's statistics to those of its input on the batch x [B, H, W, 3]
// (training from scratch: no pretrained statistics). No gradient.
void resnet_calibrate(ResNet *r, Tensor *x);
// Inference: folds every frozen batch norm into the convolution before it (nn/layers.h
// frozen_bn_fold), so that resnet_forward with grad mode off runs each convolution, its norm, the
// residual add and the ReLU as one op_conv2d_fused: no normalisation pass over the activations.
// The folded copies are the weights at the time of the call: only a model that is no longer
// trained is folded (the C API's and `detr eval`'s; with grad mode on the forward ignores them).
void resnet_fold_bn(ResNet *r, TensorOwner *owner);  // the folded tensors: owner's
void resnet_unfold_bn(ResNet *r);  // drops the folded copies (their tensors stay the owner's until it clears)
// [B, H, W, 3] -> [B, H/32, W/32, C] (H/16: 3 layers): channels last throughout, from the input
// (the loader's and the C API's layout) on
Tensor *resnet_forward(const ResNet *r, Tensor *x);
// One residual block alone (its gradient test): x [B, H, W, C].
Tensor *resblock_forward(const ResBlock *b, Tensor *x);
