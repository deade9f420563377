#include "train/cli.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_print_usage(const char *verb, const char *usage, const CliFlag *flags, int n_flags, bool to_stderr) {
  FILE *f = to_stderr ? stderr : stdout;
  fprintf(f, "usage: detr %s %s\n", verb, usage);
  for (int i = 0; i < n_flags; i++) {
    const char *arg = flags[i].kind == FLAG_BOOL ? "" : flags[i].kind == FLAG_LIST ? " VALUE (repeatable)" : " VALUE";
    fprintf(f, "  --%s%s\n      %s\n", flags[i].name, arg, flags[i].help);
  }
}

static const CliFlag *find_flag(const CliFlag *flags, int n, const char *name, size_t len) {
  for (int i = 0; i < n; i++)
    if (strlen(flags[i].name) == len && !strncmp(flags[i].name, name, len)) return &flags[i];
  return NULL;
}

int cli_parse(const char *verb, const char *usage, int argc, char **argv, int first, const CliFlag *flags,
              int n_flags, const char **positional, int max_positional, int *n_positional) {
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
      fprintf(stderr, "detr %s: unknown flag '--%.*s' (see detr %s --help)\n", verb, (int)len, name, verb);
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
  }
  return 0;
}

int cli_check_ranges(const char *verb, const CliRange *ranges, int n) {
  for (int i = 0; i < n; i++)
    if (ranges[i].value < ranges[i].lo || ranges[i].value > ranges[i].hi) {
      fprintf(stderr, "detr %s: --%s %lld is outside [%lld, %lld]\n", verb, ranges[i].name, ranges[i].value,
              ranges[i].lo, ranges[i].hi);
      return 2;
    }
  return 0;
}
