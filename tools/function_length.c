// function_length: no function definition of the given C and CUDA sources is longer than 80 lines,
// counted from the first line of its signature to its closing brace. The ctest entry
// `function_length` runs it on the project's sources (tests/CMakeLists.txt).
//
//   function_length [--max N] FILE...
//
// Prints `FILE:LINE NAME (N lines)` for each longer function and exits 1; exits 0 when there is
// none, 2 when a file cannot be read. The sources are laid out the clang-format way: a definition
// starts at column 0 (its signature may go on over the following lines), its signature ends with
// `) {` and its body ends with a `}` at column 0. Declarations, preprocessor lines, comments and
// the `{` blocks that are no function - data tables (`= {`), struct, enum, extern "C",
// namespace - are not counted.
#define _POSIX_C_SOURCE 200809L  // getline, strdup
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIGNATURE_LINES 20

typedef struct {
  char **lines;
  int n;
} Lines;

// Reads a file into lines without their line ends; false when it cannot be read.
static bool read_lines(const char *path, Lines *out) {
  FILE *f = fopen(path, "r");
  if (!f) return false;
  out->lines = NULL;
  out->n = 0;
  int cap = 0;
  char *line = NULL;
  size_t line_cap = 0;
  ssize_t len;
  while ((len = getline(&line, &line_cap, f)) >= 0) {
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
    if (out->n == cap) {
      cap = cap ? 2 * cap : 256;
      out->lines = realloc(out->lines, (size_t)cap * sizeof *out->lines);
      if (!out->lines) return false;
    }
    out->lines[out->n++] = strdup(line);
  }
  free(line);
  bool ok = !ferror(f);
  fclose(f);
  return ok;
}

// Frees what read_lines allocated.
static void free_lines(Lines *l) {
  for (int i = 0; i < l->n; i++) free(l->lines[i]);
  free(l->lines);
}

// The length of a line without a trailing // comment and trailing white space.
static size_t code_length(const char *line) {
  size_t n = strlen(line);
  const char *comment = strstr(line, "//");
  if (comment && !memchr(line, '"', (size_t)(comment - line))) n = (size_t)(comment - line);
  while (n > 0 && isspace((unsigned char)line[n - 1])) n--;
  return n;
}

// Whether a line goes on on the next one (a macro's lines).
static bool ends_with_backslash(const char *line) {
  size_t n = strlen(line);
  return n > 0 && line[n - 1] == '\\';
}

// Whether a line can begin a definition: code at column 0, not a preprocessor line or a comment.
static bool starts_at_column_0(const char *line) { return isalpha((unsigned char)line[0]) || line[0] == '_'; }

// Whether a signature (the text before its `{`) is a function's: it ends with `)` and has no `=`
// outside parentheses, which a data table's initialiser has.
static bool is_function_signature(const char *sig, size_t n) {
  while (n > 0 && isspace((unsigned char)sig[n - 1])) n--;
  if (n == 0 || sig[n - 1] != ')') return false;
  int depth = 0;
  for (size_t i = 0; i < n; i++) {
    if (sig[i] == '(') depth++;
    else if (sig[i] == ')') depth--;
    else if (sig[i] == '=' && depth == 0) return false;
  }
  return true;
}

// Copies the function's name - the identifier before the first `(` of its signature - into name.
static void function_name(const char *sig, char *name, size_t cap) {
  const char *paren = strchr(sig, '(');
  const char *end = paren ? paren : sig;
  while (end > sig && isspace((unsigned char)end[-1])) end--;
  const char *begin = end;
  while (begin > sig && (isalnum((unsigned char)begin[-1]) || begin[-1] == '_')) begin--;
  size_t n = (size_t)(end - begin) < cap - 1 ? (size_t)(end - begin) : cap - 1;
  memcpy(name, begin, n);
  name[n] = '\0';
}

// Collects the signature starting at line `first` into sig; returns the line that ends it with
// `{`, or -1 when these lines are no definition with a body (a declaration, a one-line body, a
// macro call, a blank line).
static int read_signature(const Lines *l, int first, char *sig, size_t cap) {
  size_t used = 0;
  for (int i = first; i < l->n && i < first + MAX_SIGNATURE_LINES; i++) {
    const char *line = l->lines[i];
    size_t n = code_length(line);
    if (n == 0 || line[0] == '#') return -1;
    // A signature goes on at column 0 only after a line that is no complete call (`template <T>`,
    // `static void` before the name on its own line).
    if (i > first && !isspace((unsigned char)line[0]) && sig[used - 1] == ')') return -1;
    if (used + n + 2 > cap) return -1;
    if (used) sig[used++] = ' ';
    memcpy(sig + used, line, n);
    used += n;
    sig[used] = '\0';
    char last = line[n - 1];
    if (last == '{') return i;
    if (last == ';' || last == '}') return -1;
  }
  return -1;
}

// Reports each function of one file longer than max_lines; returns how many there are.
static int check_file(const char *path, const Lines *l, int max_lines) {
  int found = 0;
  char sig[4096], name[256];
  bool in_comment = false;
  for (int i = 0; i < l->n; i++) {
    const char *line = l->lines[i];
    if (in_comment) {
      in_comment = !strstr(line, "*/");
      continue;
    }
    if (line[0] == '#') {  // a preprocessor line and its continuation lines
      while (i + 1 < l->n && ends_with_backslash(l->lines[i])) i++;
      continue;
    }
    if (line[0] == '/' && line[1] == '*') {
      in_comment = !strstr(line + 2, "*/");
      continue;
    }
    if (!starts_at_column_0(line)) continue;
    int open = read_signature(l, i, sig, sizeof sig);
    if (open < 0) continue;
    size_t sig_len = strlen(sig);
    if (!is_function_signature(sig, sig_len - 1)) {  // a table, struct or namespace: its lines are indented
      i = open;
      continue;
    }
    int close = open + 1;
    while (close < l->n && l->lines[close][0] != '}') close++;
    int length = close - i + 1;
    if (length > max_lines) {
      function_name(sig, name, sizeof name);
      printf("%s:%d %s (%d lines)\n", path, i + 1, name, length);
      found++;
    }
    i = close;
  }
  return found;
}

int main(int argc, char **argv) {
  int max_lines = 80, first_file = 1;
  if (argc > 2 && strcmp(argv[1], "--max") == 0) {
    max_lines = atoi(argv[2]);
    first_file = 3;
  }
  if (first_file >= argc || max_lines <= 0) {
    fprintf(stderr, "usage: function_length [--max N] FILE...\n");
    return 2;
  }
  int found = 0;
  for (int a = first_file; a < argc; a++) {
    Lines l;
    if (!read_lines(argv[a], &l)) {
      fprintf(stderr, "function_length: cannot read %s\n", argv[a]);
      return 2;
    }
    found += check_file(argv[a], &l, max_lines);
    free_lines(&l);
  }
  if (found) {
    printf("%d function%s over %d lines (signature to closing brace): split %s\n", found, found == 1 ? "" : "s",
           max_lines, found == 1 ? "it" : "them");
    return 1;
  }
  return 0;
}
