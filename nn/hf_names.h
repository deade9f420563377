// Hugging Face transformers' tensor names: a model.safetensors that save_pretrained writes for
// DetrForObjectDetection or ConditionalDetrForObjectDetection (ResNet backbones, DC5 or not) holds
// the reference's tensors under other names, in one table (nn/hf_names.c). Two layout differences:
// transformers' attention keeps q, k and v as three projections where the reference packs them into
// one in_proj ([3d, d] and [3d]: rows q, k, v), and its backbone is named as timm's ResNet (the
// default, use_timm_backbone=True: torchvision's names) or as transformers' own ResNet
// (use_timm_backbone=False: embedder, encoder.stages.S.layers.B.layer.C). Its frozen batch norms keep
// the four buffers of the reference's (weight, bias, running_mean, running_var). Loading
// (nn/model_io.c) finds the format from the names; `detr export --format transformers` writes it.
#pragma once
#include "tensor/safetensors.h"

typedef enum {
  HF_NONE,    // the reference's names (detr-c checkpoints, converted official weights)
  HF_TIMM,    // transformers, timm's backbone names
  HF_RESNET,  // transformers, its own ResNet's backbone names (the hub's "no_timm" revisions)
} HfFormat;

#define HF_NAME_MAX 256
#define HF_MAX_PARTS 3  // a packed in_proj: q, k, v

// The file's naming, from its tensor names: a transformers file has model.input_projection.* or
// model.backbone.conv_encoder.*; its backbone is transformers' ResNet when it has an embedder.
HfFormat hf_format(const StFile *f);
const char *hf_format_name(HfFormat fmt);  // "reference", "transformers (timm backbone)", ...

// The file's names of the model tensor `name` under fmt, into out: 1 name, or HF_MAX_PARTS (q, k,
// v) whose rows stack along dim 0 into the model's tensor. HF_NONE: the name itself. Returns the
// count, or 0 when transformers has no such tensor (a pre-norm encoder's final norm, Anchor DETR,
// another encoder attention's extra parameters).
int hf_names(HfFormat fmt, const char *name, char out[HF_MAX_PARTS][HF_NAME_MAX]);
