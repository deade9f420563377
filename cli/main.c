// detr: the command-line tool. Each verb lives in cli/cmd_<verb>.c (cli/commands.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "autograd/ops.h"
#include "include/detr.h"
#include "kernels/cpu/cpu_kernels.h"
#include "cli/commands.h"
#include "dist/dist.h"

typedef struct {
  const char *name;
  int (*run)(int argc, char **argv, const Dist *job);
  const char *summary;
} Verb;

static const Verb VERBS[] = {
    {"cocoeval", cmd_cocoeval, "COCO bbox metrics of a results JSON (pycocotools COCOeval semantics)"},
    {"train", cmd_train, "train DETR / DETR+ENACT on a COCO-format dataset"},
    {"pretrain", cmd_pretrain,
     "train a backbone as a classifier of a dataset's object crops (for train --init-backbone)"},
    {"eval", cmd_eval, "COCO mAP of a checkpoint or weights on a dataset split"},
    {"step", cmd_step, "one forward + loss + backward on a batch file (parity interface)"},
    {"synth", cmd_synth, "write the built-in synthetic COCO-format dataset"},
    {"predict", cmd_predict, "detect objects in images: boxes, labels, scores (JSON) and pictures"},
    {"info", cmd_info, "describe a checkpoint or any safetensors file"},
    {"export", cmd_export, "write a model as a Hugging Face transformers folder (config.json, model.safetensors)"},
};
#define N_VERBS (int)(sizeof VERBS / sizeof VERBS[0])

static int usage(FILE *f) {
  fprintf(f, "usage: detr <command> [options]\ncommands:\n");
  for (int i = 0; i < N_VERBS; i++) fprintf(f, "  %-11s %s\n", VERBS[i].name, VERBS[i].summary);
  fprintf(f, "  %-11s %s\n", "version", "print the version and the backends this build has");
  fprintf(f, "  %-11s %s\n", "help", "this text; help COMMAND: the command's options (as COMMAND --help)");
  return f == stderr ? 2 : 0;
}

static const Verb *find_verb(const char *name) {
  for (int i = 0; i < N_VERBS; i++)
    if (!strcmp(VERBS[i].name, name)) return &VERBS[i];
  return NULL;
}

// `detr help VERB` runs `detr VERB --help`: one text, the verb's own.
static int help(int argc, char **argv) {
  if (argc < 3) return usage(stdout);
  if (argc > 3) {
    fprintf(stderr, "detr help: one command at a time (detr help COMMAND)\n");
    return 2;
  }
  const Verb *v = find_verb(argv[2]);
  if (!v) {
    if (!strcmp(argv[2], "help") || !strcmp(argv[2], "version")) return usage(stdout);
    fprintf(stderr, "detr help: unknown command '%s'\n", argv[2]);
    return usage(stderr);
  }
  char flag[] = "--help";
  char *args[] = {argv[0], argv[2], flag, NULL};
  Dist alone = DIST_SINGLE;
  return v->run(3, args, &alone);
}

static int run(int argc, char **argv, const Dist *job) {
  if (argc < 2) return usage(stderr);
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) return usage(stdout);
  if (!strcmp(argv[1], "help")) return help(argc, argv);
  const Verb *v = find_verb(argv[1]);
  if (v) return v->run(argc, argv, job);
  if (!strcmp(argv[1], "version")) {
    char gemm[96];
    printf("detr-c %s (backends: cpu%s; data parallel: %s; GEMM: %s)\n", DETR_VERSION_STRING,
           DETR_HAVE_CUDA ? ", cuda" : "", dist_backend_name(), cpu_gemm_library(gemm, sizeof gemm));
    return 0;
  }
  fprintf(stderr, "detr: unknown command '%s'\n", argv[1]);
  return usage(stderr);
}

int main(int argc, char **argv) {
  Runtime *rt = runtime_create();  // the state of the ops this thread runs (core/runtime.h)
  runtime_bind(rt);
  cpu_runtime_setup(argv);             // may start the program again, with libgomp's spin setting
  Dist job = dist_init(&argc, &argv);  // joins the MPI job when launched by mpirun (train, eval)
  int rc = run(argc, argv, &job);
  dist_finalize(&job);
  autograd_clear_tape();
  tensor_scope_release(0);
  runtime_bind(NULL);
  runtime_destroy(rt);
  return rc;
}
