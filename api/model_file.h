// The inference side of model files, shared by the public API (api/detr_api.c) and the `detr`
// verbs (cli/): model configs from a preset or a key=value file plus overrides, what a detr-c
// checkpoint says about its run (config, class names, image sizes), its format and crc32 check,
// class names from a COCO instances file, and loading a model for inference from a checkpoint or
// from weights + a config. Every problem with a file or a config is returned with a message naming
// it (and a detr_status saying which kind); out of host memory stays fatal (DETR_CHECK).
// train/checkpoint.c writes checkpoints with the format string and crc defined here.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "include/detr.h"
#include "nn/detr.h"
#include "tensor/safetensors.h"

#define CHECKPOINT_FORMAT "detr-c checkpoint 1"

// crc32 over (name, bytes) of every tensor in order: computable from the writer's inputs and
// from the file's entries alike. Start with crc32(0, Z_NULL, 0).
unsigned long checkpoint_crc_update(unsigned long crc, const char *name, const void *data, size_t nbytes);
// Whether an open safetensors file is a detr-c checkpoint (its "format" metadata).
bool checkpoint_is(const StFile *f);
// Checks the "format" metadata and the crc32 of an open file. Returns 0, or -1 with err naming the
// file; `hint` (may be NULL) is appended to the message for a file of another format.
int checkpoint_verify(const StFile *f, const char *hint, char *err, size_t err_cap);

// A config file's line or a --set override longer than this, or a line holding a NUL byte, is an
// error (naming FILE:LINE).
#define MODEL_CONFIG_MAX_LINE 1024

// Applies one "key=value" line (# comments and blank lines ignored) to cfg; `where` prefixes errors.
int model_config_line(DetrConfig *cfg, char *line, const char *where, char *err, size_t err_cap);
// Applies "key=value" overrides in order (no validation). Returns 0, or -1 with err set.
int model_config_apply_sets(DetrConfig *cfg, const char *const *sets, int n_sets, char *err, size_t err_cap);
// config: a preset (DETR_PRESET_LIST in nn/detr.h) or a file of key=value lines over detr-r50;
// then the overrides; then validation. Returns 0, or -1 with err set.
int model_config_load(const char *config, const char *const *sets, int n_sets, DetrConfig *cfg, char *err,
                      size_t err_cap);

// The settings a training run ran with, stored typed in each of its checkpoints (metadata
// "run_settings": key=value lines): what a resumed run continues with (docs/cli.md, "Stopping and
// resuming"), and the sizes, batch and padding `detr eval` evaluates with. known is false for a
// checkpoint without them (one written before they were stored, or by no training run).
typedef struct {
  bool known;
  int epochs, lr_drop, batch, pad_multiple, image_size, max_size;
  int augment;  // 0 or 1
  float lr, lr_backbone, weight_decay, clip;
  // Loss and matcher weights as given (NaN: the model's own, from its class head).
  float ce, bbox, giou, eos, cost_class, cost_bbox, cost_giou;
} RunSettings;

// s as "key=value\n" lines (floats to 9 significant digits: read back exactly).
void run_settings_format(const RunSettings *s, char *out, size_t cap);
// Reads run_settings_format's lines into s (known set): every key must be there once, with a value
// its detr train flag allows; a key this version does not know is ignored. Returns 0, or -1 with
// err naming `where` and what is wrong.
int run_settings_parse(const char *text, RunSettings *s, const char *where, char *err, size_t err_cap);

// What a detr-c checkpoint says about the run that made it (its metadata).
typedef struct {
  DetrConfig cfg;    // the stored model config
  char *categories;  // "id:name;..." of the training data, or NULL
  RunSettings run;   // the run's settings (run.known: the checkpoint holds them)
} CheckpointInfo;
// detr train's --batch when none is given, and detr eval's for a checkpoint that does not say its run's.
#define CHECKPOINT_TRAIN_DEFAULT_BATCH 2

// From an open file: checks the format (not the crc: checkpoint_verify) and reads the stored
// config. Returns 0, or -1 with err naming the file.
int checkpoint_info_read(const StFile *f, CheckpointInfo *ci, char *err, size_t err_cap);
void checkpoint_info_free(CheckpointInfo *ci);
// Evaluation image sizes: the training run's (ci may be NULL), else the model's run defaults
// (detr_run_defaults).
void model_eval_sizes(const DetrConfig *cfg, const CheckpointInfo *ci, int *image_size, int *max_size);

// The presets (DETR_PRESETS) whose model every tensor of f fits, with the file's own numbers of
// classes and queries: "detr-r50" or "conditional-detr-r50, ..." in out, "" when none. Builds each
// preset's model (an error path: some memory and a fraction of a second).
void weights_fitting_presets(const StFile *f, char *out, size_t cap);
// Appends to err what leads to the fix of a mismatch between f and the model: the presets its
// tensors fit (--config), and what --init-partial would load (with_partial).
void weights_mismatch_hint(const ParamStore *ps, const StFile *f, bool with_partial, char *err, size_t err_cap);

// A file that open() can read and that is a regular file. Returns 0, or -1 with err naming the
// path and errno's reason (the I/O errors of the readers, told apart from their format errors).
int file_check_readable(const char *path, char *err, size_t err_cap);

// Class names by label.
typedef struct {
  char **name;  // [n]: name of label i, or NULL
  int n;
} LabelNames;

void label_names_free(LabelNames *nm);
// The "categories" of a COCO instances file (plain or .gz), streamed (a 450 MB train2017 file needs
// no memory for its annotations); a file with only that array is accepted. The limits are those of
// COCO instances files (datasets/coco.h: name length, no NUL in a name, JSON depth, gzip expansion).
// Returns DETR_OK, DETR_ERR_IO (cannot open) or DETR_ERR_FORMAT (not such a file), with err naming
// the file.
detr_status label_names_from_coco(const char *path, LabelNames *nm, char *err, size_t err_cap);
// A checkpoint's "categories" metadata "id:name;id:name;..." (ids past the largest label name
// nothing). Returns 0, or -1 naming the entry.
int label_names_from_text(const char *path, const char *text, LabelNames *nm, char *err, size_t err_cap);

// A model for inference: from a detr-c checkpoint (its stored config, then `sets`; the crc is
// verified) or from weights (strict: every tensor present with its shape, nothing else) with
// `config` (a preset or key=value file; NULL: detr-r50) then `sets`. Exactly one of checkpoint and
// weights. info (may be NULL) receives the checkpoint's info (free with checkpoint_info_free; all
// -1/NULL for weights). A checkpoint's config must match the sizes of its own query_embed,
// class_embed, last decoder FFN and stem before the model is built (a small file cannot ask for a
// huge model). Returns DETR_OK, or DETR_ERR_IO (a file cannot be read), DETR_ERR_FORMAT (not
// a safetensors file / not a detr-c checkpoint / corrupted), DETR_ERR_CONFIG (bad config or
// override) or DETR_ERR_MISMATCH (tensors do not fit the model), with err naming the file.
detr_status model_file_load(const char *checkpoint, const char *weights, const char *config, const char *const *sets,
                            int n_sets, Device dev, DetrModel **out, CheckpointInfo *info, char *err, size_t err_cap);
