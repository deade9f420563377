// Fine-tuning's start (`detr train --init FILE`): the model tensors of plain weights (the
// reference's names: an official DETR or Conditional DETR file converted to safetensors) or of a
// detr-c checkpoint (its optimizer state, step and schedule are not used), adapted to the data:
// the class head is re-initialised, the way the model initialises it, when the data's classes
// differ from the weights' (their number, or their ids and names where both are known), and the
// query embeddings when num_queries differs. Each re-initialised tensor is logged with its reason;
// any other tensor that does not fit is an error naming it, or, when partial, keeps its
// initialisation and is listed.
#pragma once
#include "datasets/coco.h"
#include "nn/detr.h"

// m: initialised (detr_model_init). init_categories: a checkpoint's "id:name;..." (NULL: plain
// weights, or unknown). say: log what was re-initialised (rank 0 of a data-parallel run). Returns
// 0, or -1 with err set (the model unchanged).
int finetune_load(DetrModel *m, const char *path, const char *init_categories, const CocoDataset *train, bool partial,
                  bool say, char *err, size_t err_cap);
