// detr synth: writes the built-in synthetic COCO-format dataset (datasets/synth.h).
#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/commands.h"
#include "datasets/synth.h"

static const char *USAGE =
    "--out DIR [--train N] [--val M] [--seed S] [--min-side PX] [--max-side PX] [--quality Q]\n"
    "          [--max-objects N] [--min-object-side PX]\n"
    "Writes DIR/train/*.jpg, DIR/val/*.jpg, DIR/annotations/instances_{train,val}.json.";

int cmd_synth(int argc, char **argv, const Dist *job) {
  SynthConfig cfg = synth_config_default();
  const CliFlag flags[] = {
      {"out", FLAG_STRING, &cfg.out_dir, "output folder (created if missing)"},
      {"train", FLAG_I32, &cfg.n_train, "training images (default 1000)", 0, 10000000},
      {"val", FLAG_I32, &cfg.n_val, "validation images (default 200)", 0, 10000000},
      {"seed", FLAG_U64, &cfg.seed, "random seed (default 0): the same seed writes byte-identical files"},
      {"min-side", FLAG_I32, &cfg.min_side, "smallest image width/height in pixels (default 256)", 64, 4096},
      {"max-side", FLAG_I32, &cfg.max_side, "largest image width/height in pixels (default 448)", 64, 4096},
      {"quality", FLAG_I32, &cfg.jpeg_quality, "JPEG quality 1..100 (default 90)", 1, 100},
      {"max-objects", FLAG_I32, &cfg.max_objects, "at most this many objects per image, 1..8 (default 8)", 1, 8},
      {"min-object-side", FLAG_I32, &cfg.min_object_side,
       "no object side below this many pixels (default 10: COCO's small objects included)", 10, 4096},
  };
  int n_flags = (int)(sizeof flags / sizeof flags[0]), n_positional = 0;
  int rc = cli_parse("synth", USAGE, argc, argv, 2, flags, n_flags, NULL, 0, &n_positional);
  if (rc == 1) return 0;
  if (rc != 0) return 2;
  if (!cfg.out_dir) {
    fprintf(stderr, "detr synth: --out DIR is required (see detr synth --help)\n");
    return 2;
  }
  if (cfg.min_side > cfg.max_side) {
    fprintf(stderr, "detr synth: --min-side %d is larger than --max-side %d\n", cfg.min_side, cfg.max_side);
    return 2;
  }
  // A new data set goes into a new or empty folder: written over an existing one it would replace
  // its annotation files and some of its images and leave the rest, a mixture of two sets.
  DIR *d = opendir(cfg.out_dir);
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) && (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))) {}
    if (e) {
      fprintf(stderr, "detr synth: --out %s is not empty (it holds %s): give a new or empty folder\n", cfg.out_dir,
              e->d_name);
      closedir(d);
      return 2;
    }
    closedir(d);
  }
  DataError err;
  if (synth_generate(&cfg, &err) != DATA_OK) {
    fprintf(stderr, "detr synth: %s\n", err.msg);
    return 1;
  }
  printf("detr synth: wrote %d train and %d val images to %s (annotations/instances_{train,val}.json)\n", cfg.n_train,
         cfg.n_val, cfg.out_dir);
  return 0;
}
