// detr: the command-line tool. Each verb lives in train/cmd_<verb>.c (train/commands.h).
#include <stdio.h>
#include <string.h>

#include "autograd/ops.h"
#include "train/commands.h"
#include "train/dist.h"

static int usage(FILE *f) {
  fprintf(f,
          "usage: detr <command> [options]\n"
          "commands:\n"
          "  cocoeval    COCO bbox metrics of a results JSON (pycocotools COCOeval semantics)\n"
          "  train       train DETR / DETR+ENACT on a COCO-format dataset\n"
          "  pretrain    train a backbone as a classifier of a dataset's object crops (for train --init-backbone)\n"
          "  eval        COCO mAP of a checkpoint or weights on a dataset split\n"
          "  step        one forward + loss + backward on a batch file (parity interface)\n"
          "  synth       write the built-in synthetic COCO-format dataset\n"
          "  predict     detect objects in images: boxes, labels, scores (JSON) and pictures\n"
          "  info        describe a checkpoint or any safetensors file\n"
          "  version     print the version and the backends this build has\n"
          "  help        this text\n");
  return f == stderr ? 2 : 0;
}

static int run(int argc, char **argv) {
  if (argc < 2) return usage(stderr);
  if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) return usage(stdout);
  if (!strcmp(argv[1], "cocoeval")) return cmd_cocoeval(argc, argv);
  if (!strcmp(argv[1], "step")) return cmd_step(argc, argv);
  if (!strcmp(argv[1], "train")) return cmd_train(argc, argv);
  if (!strcmp(argv[1], "pretrain")) return cmd_pretrain(argc, argv);
  if (!strcmp(argv[1], "eval")) return cmd_eval(argc, argv);
  if (!strcmp(argv[1], "synth")) return cmd_synth(argc, argv);
  if (!strcmp(argv[1], "predict")) return cmd_predict(argc, argv);
  if (!strcmp(argv[1], "info")) return cmd_info(argc, argv);
  if (!strcmp(argv[1], "version")) {
    printf("detr-c 0.1 (backends: cpu%s; data parallel: %s)\n", DETR_HAVE_CUDA ? ", cuda" : "",
           dist_backend_name());
    return 0;
  }
  fprintf(stderr, "detr: unknown command '%s'\n", argv[1]);
  return usage(stderr);
}

int main(int argc, char **argv) {
  dist_init(&argc, &argv);  // joins the MPI job when launched by mpirun (train, eval)
  int rc = run(argc, argv);
  dist_finalize();
  return rc;
}
