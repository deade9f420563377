// The input batch of `detr step` (the parity interface, tools/parity_step.py): a safetensors file
// of images F32 [B, 3, H, W] (normalized), mask U8 or BOOL [B, H, W] (1 = padding),
// targets.{i}.boxes F32 [n, 4] (normalized cxcywh, finite) and targets.{i}.labels I64 [n] (in
// 0..num_classes) for each image i.
#pragma once
#include "nn/criterion.h"
#include "nn/detr.h"
#include "nn/matcher.h"
#include "tensor/safetensors.h"

typedef struct {
  int64_t B, H, W;
  Tensor *images;        // owned, [B, H, W, 3]: the file's [B, 3, H, W] channels last, the backbone's layout
  uint8_t *mask;         // [B, H, W]
  DetrTarget *targets;   // [B], pointing into the file's data (valid while it is open)
  float *boxes_storage;  // aligned copies of the targets
  int64_t *labels_storage;
} StepBatch;

// Reads and checks the batch (images uploaded to dev). Returns 0, or -1 with err naming the file and
// the tensor; b must then still be freed with step_batch_free (it is zeroed first).
int step_batch_read(const StFile *f, Device dev, int64_t num_classes, StepBatch *b, char *err, size_t err_cap);
void step_batch_free(StepBatch *b);

// `detr step`'s computation (and tools/train_steps.c's, tests/test_reference.c's): the forward of
// images [B, H, W, 3] under ctx, the model's set criterion over every decoder layer (auxiliary
// losses where the config has them) normalised by the batch's box count, and the backward. Returns
// 0 with *out and *loss to free (detr_output_free, criterion_result_free), or -1 with err set and
// nothing to free.
int step_forward_backward(DetrModel *m, const NnCtx *ctx, Tensor *images, const uint8_t *mask,
                          const DetrTarget *targets, int64_t B, DetrOutput *out, CriterionResult *loss, char *err,
                          size_t err_cap);
