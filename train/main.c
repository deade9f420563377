// detr: the command-line tool. Verbs arrive with the training issues; `detr version` and
// `detr selftest` work now.
#include <stdio.h>
#include <string.h>

#include "autograd/ops.h"
#include "train/commands.h"

static int usage(FILE *f) {
  fprintf(f,
          "usage: detr <command> [options]\n"
          "commands:\n"
          "  step        one forward + loss + backward on a batch file (parity interface)\n"
          "  version     print the version and the backends this build has\n"
          "  help        this text\n");
  return f == stderr ? 2 : 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage(stderr);
  if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) return usage(stdout);
  if (!strcmp(argv[1], "step")) return cmd_step(argc, argv);
  if (!strcmp(argv[1], "version")) {
    printf("detr-c 0.1 (backends: cpu%s)\n", DETR_HAVE_CUDA ? ", cuda" : "");
    return 0;
  }
  fprintf(stderr, "detr: unknown command '%s'\n", argv[1]);
  return usage(stderr);
}
