// Shared set-up of the verbs: model configuration from a preset or file plus overrides, devices.
#pragma once
#include "dist/dist.h"
#include "api/model_file.h"  // CheckpointInfo, model_eval_sizes, checkpoint_info_free
#include "nn/detr.h"
#include "cli/cli.h"
#include "datasets/transforms.h"

// The model preset of --config when none is given (train, pretrain; eval and predict with --weights).
#define SETUP_DEFAULT_PRESET "detr-r18-small"

// config: a preset name (DETR_PRESET_LIST in nn/detr.h) or a file of key=value lines (# comments);
// sets: "key=value" overrides applied in order. A line or override longer than
// MODEL_CONFIG_MAX_LINE bytes, or holding a NUL byte, is an error. Returns 0, or -1 with err set
// (naming FILE:LINE).
int setup_model_config(const char *config, const CliList *sets, DetrConfig *cfg, char *err, size_t err_cap);
// Applies "key=value" overrides in order (no validation). Returns 0, or -1 with err set.
int setup_apply_sets(DetrConfig *cfg, const CliList *sets, char *err, size_t err_cap);
// The --enact flag of every verb that builds a model: a shortcut for --set encoder_attn=enact,
// appended to sets after the user's --set (so it has the last word, as --precision's keys).
// Returns 0, or -1 with err set (too many --set flags).
#define SETUP_ENACT_HELP "ENACT clustering in the encoder (same as --set encoder_attn=enact)"
int setup_enact(bool enact, CliList *sets, char *err, size_t err_cap);

// --precision fp32 | tf32 | bf16 of every verb that builds a model: the config keys tf32 and bf16,
// appended to sets (after the user's --set, so it has the last word). NULL precision: the model's
// own keys hold (a resumed run goes on in its precision), but for inference (eval, predict), which
// runs fp32 unless bf16 is asked for here: a bf16 run's checkpoint gives the same results on every
// machine. bf16 on a device that cannot run it at speed is an error naming why.
#define SETUP_PRECISION_HELP                                                                          \
  "fp32 (default), tf32 (CUDA tensor cores) or bf16 (bf16 inputs, fp32 accumulation in convolutions " \
  "and GEMMs: CPUs with AVX512-BF16 or AMX; a checkpoint keeps fp32 weights)"
int setup_precision(const char *precision, bool inference, Device dev, CliList *sets, char *err, size_t err_cap);
// "cpu" or "cuda". Returns 0, or -1 with err set (unknown name, or CUDA not built / no device).
int setup_device(const Dist *job, const char *name, Device *dev, char *err, size_t err_cap);

// A model to run: from a detr-c checkpoint (its stored config, then `sets`; the crc is verified),
// or from weights (strict) with a config from `config` (+ sets, --enact's included). info (may
// be NULL) receives the checkpoint's info (free it with checkpoint_info_free). Returns 0 or -1
// with err set. The same loader as the C API's (api/model_file.c: model_file_load).
int setup_load_model(const char *checkpoint, const char *weights, const char *config, const CliList *sets, Device dev,
                     DetrModel **out, CheckpointInfo *info, char *err, size_t err_cap);
