#include "cli/cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/detr.h"  // detr_config_key: the --set keys

static const CliFlag *find_flag(const CliFlag *flags, int n, const char *name, size_t len) {
  for (int i = 0; i < n; i++)
    if (strlen(flags[i].name) == len && !strncmp(flags[i].name, name, len)) return &flags[i];
  return NULL;
}

void cli_print_usage(const char *verb, const char *usage, const CliFlag *flags, int n_flags, bool to_stderr) {
  FILE *f = to_stderr ? stderr : stdout;
  fprintf(f, "usage: detr %s %s\n", verb, usage);
  for (int i = 0; i < n_flags; i++) {
    const char *arg = flags[i].kind == FLAG_BOOL ? "" : flags[i].kind == FLAG_LIST ? " VALUE (repeatable)" : " VALUE";
    fprintf(f, "  --%s%s\n      %s\n", flags[i].name, arg, flags[i].help);
  }
  if (!find_flag(flags, n_flags, "set", 3)) return;
  fprintf(f, "model config keys (--set KEY=VALUE, or KEY=VALUE lines of a --config file; docs/training.md):\n");
  char help[512];
  const char *key;
  for (int i = 0; (key = detr_config_key(i, help, sizeof help)); i++) fprintf(f, "  %-20s %s\n", key, help);
}

// --- did you mean ------------------------------------------------------------------------------

// facebookresearch/detr's main.py flags whose counterpart here has another name or form: a flag
// of the verb ("--out"), a config key ("--set ffn_dim=N"; the key must exist), or a note.
static const struct {
  const char *ref, *ours;
} REFERENCE_FLAGS[] = {
    {"output_dir", "--out"},
    {"coco_path", "--data"},
    {"num_workers", "--workers"},
    {"batch_size", "--batch"},
    {"clip_max_norm", "--clip"},
    {"bbox_loss_coef", "--bbox-loss-coef"},
    {"giou_loss_coef", "--giou-loss-coef"},
    {"eos_coef", "--eos-coef"},
    {"set_cost_class", "--cost-class"},
    {"set_cost_bbox", "--cost-bbox"},
    {"set_cost_giou", "--cost-giou"},
    {"start_epoch", "--resume"},
    {"num_queries", "--set num_queries=N"},
    {"enc_layers", "--set enc_layers=N"},
    {"dec_layers", "--set dec_layers=N"},
    {"hidden_dim", "--set hidden_dim=N"},
    {"nheads", "--set nheads=N"},
    {"dim_feedforward", "--set ffn_dim=N"},
    {"dropout", "--set dropout=P"},
    {"backbone", "--set backbone=DEPTH (18, 34, 50 or 101)"},
    {"dilation", "--set dilation=true"},
    {"no_aux_loss", "--set aux_loss=false"},
};

// Levenshtein distance, capped: short flag names only (longer ones are never close).
static int edit_distance(const char *a, size_t la, const char *b) {
  size_t lb = strlen(b);
  if (la > 63 || lb > 63) return 99;
  int row[64];
  for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
  for (size_t i = 1; i <= la; i++) {
    int diag = row[0];
    row[0] = (int)i;
    for (size_t j = 1; j <= lb; j++) {
      int up = row[j], best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      diag = up;
      row[j] = best;
    }
  }
  return row[lb];
}

// What an unknown flag (name[0..len), without dashes) probably meant: "did you mean --X?" or a
// note ending in ';'. NULL when nothing is close. Only the verb's own flags are suggested.
static const char *suggest(const char *verb, const CliFlag *flags, int n, const char *name, size_t len, char *buf,
                           size_t cap) {
  if (len == 4 && !strncmp(name, "eval", 4) && strcmp(verb, "eval"))
    return snprintf(buf, cap, "`detr eval --checkpoint CKPT --data DIR` evaluates a run's checkpoint;"), buf;
  for (size_t i = 0; i < sizeof REFERENCE_FLAGS / sizeof REFERENCE_FLAGS[0]; i++) {
    const char *ref = REFERENCE_FLAGS[i].ref, *ours = REFERENCE_FLAGS[i].ours;
    if (strlen(ref) != len || strncmp(ref, name, len)) continue;
    if (!strncmp(ours, "--set ", 6)) {  // a config key: when the verb has --set and the key exists
      size_t key_len = strcspn(ours + 6, "=");
      const char *k = NULL;
      for (int j = 0; (k = detr_config_key(j, NULL, 0)); j++)
        if (strlen(k) == key_len && !strncmp(k, ours + 6, key_len)) break;
      if (!k || !find_flag(flags, n, "set", 3)) return NULL;
    } else if (!find_flag(flags, n, ours + 2, strlen(ours + 2))) {
      return NULL;
    }
    if (!strcmp(ours, "--resume"))
      return snprintf(buf, cap, "--resume CKPT continues from the checkpoint's epoch; there is no start epoch;"), buf;
    return snprintf(buf, cap, "did you mean %s?", ours), buf;
  }
  char dashed[64];  // the reference's underscores are dashes here
  if (len >= sizeof dashed) return NULL;
  for (size_t i = 0; i < len; i++) dashed[i] = name[i] == '_' ? '-' : name[i];
  dashed[len] = 0;
  const CliFlag *best = NULL, *prefixed = NULL;
  int best_d = 3, ties = 0, n_prefixed = 0;
  for (int i = 0; i < n; i++) {
    int d = edit_distance(dashed, len, flags[i].name);
    if (d < best_d) best = &flags[i], best_d = d, ties = 0;
    else if (d == best_d && best) ties++;
    if (!strncmp(flags[i].name, dashed, len)) prefixed = &flags[i], n_prefixed++;
  }
  // Close: one flag at distance 1 or 2 (less than the name's length), or the only one it begins.
  if (best && ties == 0 && (size_t)best_d < len) return snprintf(buf, cap, "did you mean --%s?", best->name), buf;
  if (n_prefixed == 1) return snprintf(buf, cap, "did you mean --%s?", prefixed->name), buf;
  return NULL;
}

// Stores the value of a flag that takes one into its destination, as its kind reads it; 2 (with a
// message) when the value is not of that kind or outside the flag's range, else 0.
static int set_flag_value(const char *verb, const CliFlag *fl, const char *value) {
  char *end = NULL;
  errno = 0;
  switch (fl->kind) {
    case FLAG_STRING: *(const char **)fl->dest = value; break;
    case FLAG_INT:
    case FLAG_I32:
    case FLAG_I64:
    case FLAG_U64: {
      long long v = strtoll(value, &end, 10);
      if (errno || end == value || *end) {
        fprintf(stderr, "detr %s: --%s: '%s' is not an integer\n", verb, fl->name, value);
        return 2;
      }
      long long lo = fl->min, hi = fl->max;
      if (fl->kind == FLAG_I32 && !(lo || hi)) lo = INT_MIN, hi = INT_MAX;
      if (fl->kind == FLAG_U64 && !(lo || hi)) lo = 0, hi = LLONG_MAX;
      if ((lo || hi) && (v < lo || v > hi)) {
        fprintf(stderr, "detr %s: --%s %lld is outside [%lld, %lld]\n", verb, fl->name, v, lo, hi);
        return 2;
      }
      if (fl->kind == FLAG_INT) *(long long *)fl->dest = v;
      else if (fl->kind == FLAG_I32) *(int *)fl->dest = (int)v;
      else if (fl->kind == FLAG_I64) *(int64_t *)fl->dest = (int64_t)v;
      else *(uint64_t *)fl->dest = (uint64_t)v;
      break;
    }
    case FLAG_FLOAT:
    case FLAG_F32: {
      double v = strtod(value, &end);
      if (errno || end == value || *end) {
        fprintf(stderr, "detr %s: --%s: '%s' is not a number\n", verb, fl->name, value);
        return 2;
      }
      if (!isfinite(fl->kind == FLAG_F32 ? (double)(float)v
                                         : v)) {  // no setting means infinity (nan fails every check)
        fprintf(stderr, "detr %s: --%s: '%s' is not a finite number%s\n", verb, fl->name, value,
                fl->kind == FLAG_F32 && isfinite(v) ? " in single precision" : "");
        return 2;
      }
      if (fl->kind == FLAG_FLOAT) *(double *)fl->dest = v;
      else *(float *)fl->dest = (float)v;
      break;
    }
    case FLAG_LIST: {
      CliList *l = fl->dest;
      if (l->count >= CLI_MAX_LIST) {
        fprintf(stderr, "detr %s: --%s given more than %d times\n", verb, fl->name, CLI_MAX_LIST);
        return 2;
      }
      l->items[l->count++] = value;
      break;
    }
    case FLAG_BOOL: break;
  }
  return 0;
}

int cli_parse(const char *verb, const char *usage, int argc, char **argv, int first, const CliFlag *flags, int n_flags,
              const char **positional, int max_positional, int *n_positional) {
  *n_positional = 0;
  for (int i = first; i < argc; i++) {
    const char *arg = argv[i];
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
      cli_print_usage(verb, usage, flags, n_flags, false);
      return 1;
    }
    if (strncmp(arg, "--", 2) != 0 || arg[2] == 0) {
      if (*n_positional >= max_positional) {
        fprintf(stderr, "detr %s: unexpected argument '%s' (see detr %s --help)\n", verb, arg, verb);
        return 2;
      }
      positional[(*n_positional)++] = arg;
      continue;
    }
    const char *name = arg + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    const CliFlag *fl = find_flag(flags, n_flags, name, len);
    if (!fl) {
      char hint[160];
      const char *h = suggest(verb, flags, n_flags, name, len, hint, sizeof hint);
      fprintf(stderr, "detr %s: unknown flag '--%.*s' (%s%ssee detr %s --help)\n", verb, (int)len, name, h ? h : "",
              h ? " " : "", verb);
      return 2;
    }
    if (fl->kind == FLAG_BOOL) {
      if (eq) {
        fprintf(stderr, "detr %s: --%s takes no value\n", verb, fl->name);
        return 2;
      }
      *(bool *)fl->dest = true;
      continue;
    }
    const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
    if (!value) {
      fprintf(stderr, "detr %s: --%s needs a value\n", verb, fl->name);
      return 2;
    }
    if (set_flag_value(verb, fl, value)) return 2;
  }
  return 0;
}
