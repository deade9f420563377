#include "nn/resnet.h"

#include <stdio.h>
#include <stdlib.h>

static Conv2d conv(ParamStore *ps, const char *prefix, const char *name, int64_t in, int64_t out, int k, int stride,
                   int dilation, ParamKind kind) {
  char full[112];
  param_name_join(full, sizeof full, prefix, name);
  int pad = k == 1 ? 0 : dilation * (k / 2);
  Conv2d c = conv2d_create(ps, full, in, out, k, stride, pad, dilation, false, kind, LR_GROUP_BACKBONE);
  c.p.channels_last = true;  // the backbone runs channels last (resnet.h)
  return c;
}

static FrozenBn bn(ParamStore *ps, const char *prefix, const char *name, int64_t channels) {
  char full[112];
  param_name_join(full, sizeof full, prefix, name);
  FrozenBn b = frozen_bn_create(ps, full, channels);
  b.channels_last = true;
  return b;
}

void resnet_create(ResNet *r, ParamStore *ps, const char *prefix, int depth, int width, int layers, bool dilation,
                   bool train_layers, int frozen_stages) {
  static const int layers18[4] = {2, 2, 2, 2}, layers34[4] = {3, 4, 6, 3}, layers101[4] = {3, 4, 23, 3};
  const int *counts = depth == 18 ? layers18 : depth == 101 ? layers101 : layers34;
  DETR_CHECK(depth == 18 || depth == 34 || depth == 50 || depth == 101,
             "resnet: depth %d is not one of 18, 34, 50, 101", depth);
  bool bottleneck = depth >= 50;
  DETR_CHECK(!(dilation && !bottleneck), "resnet: dilation (DC5) needs a bottleneck ResNet (50/101), as torchvision");
  if (layers == 0) layers = 4;
  DETR_CHECK(layers == 3 || layers == 4, "resnet: %d layers, expected 3 or 4", layers);
  DETR_CHECK(!(dilation && layers < 4), "resnet: dilation (DC5) dilates layer4, which 3 layers leave out");
  int expansion = bottleneck ? 4 : 1;
  *r = (ResNet){0};
  // Stage 0 is the stem, stage k (1..4) is layer k.
  int64_t base = width > 0 ? width : 64;
  r->conv1 =
      conv(ps, prefix, "conv1", 3, base, 7, 2, 1, train_layers && frozen_stages < 1 ? PARAM_TRAINABLE : PARAM_FROZEN);
  r->conv1.p.pad_h = r->conv1.p.pad_w = 3;
  r->bn1 = bn(ps, prefix, "bn1", base);
  int64_t inplanes = base;
  int current_dilation = 1;
  for (int layer = 0; layer < layers; layer++) {
    int64_t planes = base << layer;
    int stride = layer == 0 ? 1 : 2, previous_dilation = current_dilation;
    if (layer == 3 && dilation) {  // replace_stride_with_dilation=[False, False, True]
      current_dilation *= stride;
      stride = 1;
    }
    ParamKind kind = train_layers && layer + 1 >= frozen_stages ? PARAM_TRAINABLE : PARAM_FROZEN;
    for (int i = 0; i < counts[layer]; i++) {
      ResBlock *b = &r->blocks[r->n_blocks++];
      char bp[112];
      snprintf(bp, sizeof bp, "%s.layer%d.%d", prefix, layer + 1, i);
      int s = i == 0 ? stride : 1, d = i == 0 ? previous_dilation : current_dilation;
      b->bottleneck = bottleneck;
      if (bottleneck) {  // torchvision v1.5: the stride sits on the 3x3 convolution
        b->conv1 = conv(ps, bp, "conv1", inplanes, planes, 1, 1, 1, kind);
        b->bn1 = bn(ps, bp, "bn1", planes);
        b->conv2 = conv(ps, bp, "conv2", planes, planes, 3, s, d, kind);
        b->bn2 = bn(ps, bp, "bn2", planes);
        b->conv3 = conv(ps, bp, "conv3", planes, planes * 4, 1, 1, 1, kind);
        b->bn3 = bn(ps, bp, "bn3", planes * 4);
      } else {
        b->conv1 = conv(ps, bp, "conv1", inplanes, planes, 3, s, 1, kind);
        b->bn1 = bn(ps, bp, "bn1", planes);
        b->conv2 = conv(ps, bp, "conv2", planes, planes, 3, 1, 1, kind);
        b->bn2 = bn(ps, bp, "bn2", planes);
      }
      if (i == 0 && (s != 1 || inplanes != planes * expansion)) {
        b->has_downsample = true;
        b->down_conv = conv(ps, bp, "downsample.0", inplanes, planes * expansion, 1, s, 1, kind);
        b->down_bn = bn(ps, bp, "downsample.1", planes * expansion);
      }
      inplanes = planes * expansion;
    }
  }
  r->out_channels = inplanes;
}

void resnet_init(ResNet *r, Rng *rng) {
  init_kaiming_normal_fan_out(r->conv1.weight, rng);
  for (int i = 0; i < r->n_blocks; i++) {
    ResBlock *b = &r->blocks[i];
    init_kaiming_normal_fan_out(b->conv1.weight, rng);
    init_kaiming_normal_fan_out(b->conv2.weight, rng);
    if (b->bottleneck) init_kaiming_normal_fan_out(b->conv3.weight, rng);
    if (b->has_downsample) init_kaiming_normal_fan_out(b->down_conv.weight, rng);
  }
}

// --- calibration of the frozen batch norms for training from scratch ---
//
// DETR freezes batch norm because it starts from ImageNet statistics. Without pretrained weights
// the statistics are the identity (mean 0, var 1) and activations grow block after block. This
// sets each norm's running mean/var to the per-channel statistics of its input on a batch, once,
// before training, as a pretrained backbone's norms would be: every layer starts normalised.

static Tensor *calibrated(const FrozenBn *bn, Tensor *x) {  // x [B, H, W, C]
  int64_t C = x->shape.d[3], rows = x->numel / C;
  float *host = detr_malloc((size_t)x->numel * sizeof(float), "resnet_calibrate host");
  float *mean = detr_malloc((size_t)(2 * C) * sizeof(float), "resnet_calibrate mean");
  float *var = mean + C;
  tensor_to_host(x, host);
  for (int64_t c = 0; c < C; c++) {
    double s = 0, ss = 0;
    for (int64_t r = 0; r < rows; r++) {  // image, then position: the order of the nchw sum
      double v = host[r * C + c];
      s += v, ss += v * v;
    }
    double n = (double)rows, mu = s / n;
    mean[c] = (float)mu;
    var[c] = (float)(ss / n - mu * mu > 0 ? ss / n - mu * mu : 0);
  }
  tensor_copy_from_host_(bn->running_mean, mean);
  tensor_copy_from_host_(bn->running_var, var);
  free(host), free(mean);
  return frozen_bn_forward(bn, x);
}

// The stem (i 0) or block i - 1 on carry->t[0], its batch norms calibrated on the way.
static void calibrate_step(void *state, int i, TensorCarry *carry) {
  ResNet *r = state;
  Tensor *x = carry->t[0];
  if (i == 0) {
    carry->t[0] = op_maxpool2d(op_relu(calibrated(&r->bn1, conv2d_forward(&r->conv1, x))), 3, 2, 1, true);
    return;
  }
  const ResBlock *b = &r->blocks[i - 1];
  Tensor *out = op_relu(calibrated(&b->bn1, conv2d_forward(&b->conv1, x)));
  out = calibrated(&b->bn2, conv2d_forward(&b->conv2, out));
  if (b->bottleneck) out = calibrated(&b->bn3, conv2d_forward(&b->conv3, op_relu(out)));
  Tensor *identity = b->has_downsample ? calibrated(&b->down_bn, conv2d_forward(&b->down_conv, x)) : x;
  carry->t[0] = op_relu(op_add(out, identity));
  if (i == r->n_blocks) carry->n = 0;  // only the statistics were wanted: the last activation goes too
}

void resnet_calibrate(ResNet *r, Tensor *x) {
  bool was = autograd_set_grad_enabled(false);
  TensorCarry carry = {.t = {x}, .n = 1};
  tensor_run_layers(1 + r->n_blocks, calibrate_step, r, &carry);
  autograd_set_grad_enabled(was);
}

// Each norm fused with the ReLU and residual add after it (op_frozen_batchnorm2d_act): the same
// floats as the separate ops, in a third of the memory passes (bench/README.md#bench_step).
Tensor *resblock_forward(const ResBlock *b, Tensor *x) {
  Tensor *out = frozen_bn_act_forward(&b->bn1, conv2d_forward(&b->conv1, x), NULL, true);
  out = conv2d_forward(&b->conv2, out);
  const FrozenBn *last_bn = &b->bn2;
  if (b->bottleneck) {
    out = conv2d_forward(&b->conv3, frozen_bn_act_forward(&b->bn2, out, NULL, true));
    last_bn = &b->bn3;
  }
  // After the last convolution, as before the fusion: the tape's order, and so the order in which
  // x's two gradients are summed, is the unfused block's.
  Tensor *identity = b->has_downsample ? frozen_bn_forward(&b->down_bn, conv2d_forward(&b->down_conv, x)) : x;
  return frozen_bn_act_forward(last_bn, out, identity, true);
}

void resnet_fold_bn(ResNet *r, TensorOwner *owner) {
  resnet_unfold_bn(r);
  r->fstem = frozen_bn_fold(&r->conv1, &r->bn1, owner);
  for (int i = 0; i < r->n_blocks; i++) {
    ResBlock *b = &r->blocks[i];
    b->f1 = frozen_bn_fold(&b->conv1, &b->bn1, owner);
    b->f2 = frozen_bn_fold(&b->conv2, &b->bn2, owner);
    if (b->bottleneck) b->f3 = frozen_bn_fold(&b->conv3, &b->bn3, owner);
    if (b->has_downsample) b->fdown = frozen_bn_fold(&b->down_conv, &b->down_bn, owner);
  }
  r->folded = true;
}

void resnet_unfold_bn(ResNet *r) {
  folded_conv_free(&r->fstem);
  for (int i = 0; i < r->n_blocks; i++) {
    ResBlock *b = &r->blocks[i];
    folded_conv_free(&b->f1), folded_conv_free(&b->f2), folded_conv_free(&b->f3), folded_conv_free(&b->fdown);
  }
  r->folded = false;
}

// A block on the folded convolutions: conv1 + ReLU, conv2 (+ ReLU), conv3 + residual + ReLU, each
// one op; the downsample's output, made first, is the last convolution's residual. That residual,
// or the block's input (read by conv1 before; resnet_forward drops it after the block), is dead
// after the last convolution, which accumulates into its buffer: the residual is read in place
// instead of copied into a new output.
static Tensor *resblock_forward_folded(const ResBlock *b, Tensor *x) {
  Tensor *identity = b->has_downsample ? folded_conv_forward(&b->fdown, x, NULL, false, false) : x;
  Tensor *out = folded_conv_forward(&b->f1, x, NULL, true, false);
  if (b->bottleneck) out = folded_conv_forward(&b->f2, out, NULL, true, false);
  return folded_conv_forward(b->bottleneck ? &b->f3 : &b->f2, out, identity, true, true);
}

typedef struct {
  const ResNet *r;
  bool folded;
} ForwardStep;

// The stem (i 0) or block i - 1 on carry->t[0] (tensor_run_layers): after each, everything made
// since the start but the newest activation is released - what backward needs is held by the tape,
// the rest (all of it in the frozen stages, and each block's input once the next has read it) freed.
static void forward_step(void *state, int i, TensorCarry *carry) {
  const ForwardStep *s = state;
  const ResNet *r = s->r;
  Tensor *x = carry->t[0];
  if (i == 0) {
    x = s->folded ? folded_conv_forward(&r->fstem, x, NULL, true, false)
                  : frozen_bn_act_forward(&r->bn1, conv2d_forward(&r->conv1, x), NULL, true);
    carry->t[0] = op_maxpool2d(x, 3, 2, 1, true);
    return;
  }
  const ResBlock *b = &r->blocks[i - 1];
  carry->t[0] = s->folded ? resblock_forward_folded(b, x) : resblock_forward(b, x);
}

Tensor *resnet_forward(const ResNet *r, Tensor *x) {
  ForwardStep s = {.r = r, .folded = r->folded && !autograd_grad_enabled()};
  TensorCarry carry = {.t = {x}, .n = 1};
  tensor_run_layers(1 + r->n_blocks, forward_step, &s, &carry);
  return carry.t[0];
}
