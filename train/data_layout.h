// The data set a run reads, where it lies and whether it fits: a split's files on disk, that layout
// checked before anything is read, and a checkpoint's classes against the data's. The trainer's
// (train/trainer.c, train/finetune.c) and the verbs' (detr eval, detr pretrain).
#pragma once
#include <stddef.h>

#include "datasets/coco.h"

// A dataset split: ann = DIR/annotations/instances_<split>.json, or .json.gz when only that
// exists; img = DIR/<split>.
void setup_split_paths(const char *data_dir, const char *split, char *ann, size_t ann_cap, char *img, size_t img_cap);
// A checkpoint's categories ("id:name;id:name;...", CheckpointInfo.categories; NULL: unknown)
// against a dataset's. Returns 0 when they are the same (or unknown), 1 when the ids are the same
// but some names differ, 2 when the ids differ; for 1 and 2, msg says the first few differences.
int categories_compare(const char *checkpoint_categories, const CocoDataset *ds, char *msg, size_t cap);

// The data set's layout for one split, checked before anything is read, with the fix in the
// message: DIR/annotations/instances_<split>.json[.gz] and DIR/<split>/ must exist; when they do
// not, err names what is there instead (the instances files and folders) and the flag that picks
// the split (`flag`, e.g. "--train-split"). Returns 0 or -1 with err set.
int setup_check_split_layout(const char *data_dir, const char *split, const char *flag, char *err, size_t err_cap);
