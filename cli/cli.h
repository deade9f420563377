// Flag parsing shared by the `detr` verbs: --name VALUE or --name=VALUE, repeatable list flags,
// boolean switches; unknown flags and bad values are errors naming the flag.
#pragma once
#include <stdbool.h>
#include <stddef.h>

// FLAG_INT, FLAG_I32, FLAG_I64 and FLAG_U64 write a long long, int, int64_t or uint64_t; FLAG_FLOAT
// and FLAG_F32 a double or float. So a verb binds its flags to its options' own fields.
typedef enum {
  FLAG_STRING,
  FLAG_INT,
  FLAG_I32,
  FLAG_I64,
  FLAG_U64,
  FLAG_FLOAT,
  FLAG_F32,
  FLAG_BOOL,
  FLAG_LIST
} FlagKind;

#define CLI_MAX_LIST 64

typedef struct {
  const char *items[CLI_MAX_LIST];
  int count;
} CliList;

typedef struct {
  const char *name;  // without the leading dashes
  FlagKind kind;
  void *dest;  // const char **, the integer or float type of its kind, bool *, CliList *
  const char *help;
  long long min, max;  // integer kinds: a given value must lie in [min, max] (unchecked when both are 0)
} CliFlag;

// Parses argv[first..argc). Positional arguments go to positional[] (at most max_positional).
// Returns 0, 1 when --help was asked (usage printed to stdout), or 2 after printing an error.
int cli_parse(const char *verb, const char *usage, int argc, char **argv, int first, const CliFlag *flags, int n_flags,
              const char **positional, int max_positional, int *n_positional);
void cli_print_usage(const char *verb, const char *usage, const CliFlag *flags, int n_flags, bool to_stderr);
