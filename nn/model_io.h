// Model tensors to and from safetensors files under their reference names, or transformers' (a
// file's naming is found from its tensor names: nn/hf_names.h). Loading is strict:
// every parameter and buffer must be present as F32 with the model's shape, and nothing else may
// be in the file (beyond names under the given ignored prefixes, e.g. a checkpoint's optimizer
// state). Parameters marked optional (ENACT's W_prob) may be absent and keep their values. All problems are reported by name and the load is refused.
#pragma once
#include "nn/hf_names.h"
#include "nn/params.h"
#include "tensor/safetensors.h"

// ignore_prefixes: NULL-terminated list, or NULL. Returns 0, or -1 with err listing the problems
// (the model is unchanged unless every check passed).
int params_load(ParamStore *ps, const StFile *f, const char *const *ignore_prefixes, char *err, size_t err_cap);

// Fine-tuning's load (`detr train --init`): the strict load above, but for the tensors the caller
// re-initialises (keep_init: a class head for other classes, the query embeddings for another
// num_queries), and, when partial, every other tensor that does not fit keeps its initial value
// too, listed in not_loaded ("\n  wrong shape: NAME ...", "\n  missing: NAME", "\n  unused: NAME"
// for a file entry the model has no place for).
typedef struct {
  const char *const *ignore_prefixes;  // file entries never read (a checkpoint's "optim.")
  const char *const *keep_init;        // NULL-terminated names: keep their initial values
  bool partial;
  char *not_loaded;  // may be NULL
  size_t not_loaded_cap;
} ParamsLoad;
int params_load_with(ParamStore *ps, const StFile *f, const ParamsLoad *opt, char *err, size_t err_cap);
// How a file fits the parameters, by the load's own rules: those it holds with their shape and dtype
// (fit), of another shape or dtype (other), that it lacks (missing: optional ones aside); its
// tensors with no parameter of their name (unused; a checkpoint's "optim." state aside).
typedef struct {
  int fit, other, missing, unused;
} ParamsFit;
ParamsFit params_fit(const ParamStore *ps, const StFile *f);
// The file's entry of model tensor `name` under the file's naming; NULL when absent or held in parts.
const StEntry *params_file_entry(const StFile *f, const char *name);
int params_load_file(ParamStore *ps, const char *path, char *err, size_t err_cap);
// Loads only the parameters and buffers whose names start with prefix (e.g. "backbone." from a
// `detr pretrain` file or any checkpoint); each of them must be in the file as F32 with the
// model's shape, other entries of the file are not read. Returns 0, or -1 with err naming the
// first problem (the model is unchanged unless every check passed).
int params_load_file_prefix(ParamStore *ps, const char *path, const char *prefix, char *err, size_t err_cap);
// The same, the file naming the tensors with file_prefix in place of prefix (NULL: the same names),
// e.g. a backbone saved as backbone.0.body.* into Anchor DETR's backbone.body.*.
int params_load_file_prefix_as(ParamStore *ps, const char *path, const char *prefix, const char *file_prefix, char *err,
                               size_t err_cap);
// Adds every parameter and buffer to w, with an optional name prefix ("" for none).
void params_save(const ParamStore *ps, StWriter *w, const char *prefix);
// Adds every parameter and buffer to w under transformers' names (fmt HF_TIMM or HF_RESNET; a
// packed in_proj as its q, k, v rows). Returns 0, or -1 with err naming the first tensor
// transformers' model has no place for.
int params_save_hf(const ParamStore *ps, StWriter *w, HfFormat fmt, char *err, size_t err_cap);
