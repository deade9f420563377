// detr synth: writes the built-in synthetic COCO-format dataset (datasets/synth.h).
#include <limits.h>
#include <stdio.h>

#include "datasets/synth.h"
#include "train/cli.h"
#include "train/commands.h"

static const char *USAGE =
    "--out DIR [--train N] [--val M] [--seed S] [--min-side PX] [--max-side PX] [--quality Q]\n"
    "          [--max-objects N] [--min-object-side PX]\n"
    "Writes DIR/train/*.jpg, DIR/val/*.jpg, DIR/annotations/instances_{train,val}.json.";

int cmd_synth(int argc, char **argv) {
  SynthConfig cfg = synth_config_default();
  const char *out = NULL;
  long long n_train = cfg.n_train, n_val = cfg.n_val, seed = (long long)cfg.seed, min_side = cfg.min_side,
            max_side = cfg.max_side, quality = cfg.jpeg_quality, max_objects = 8, min_object_side = 10;
  const CliFlag flags[] = {
      {"out", FLAG_STRING, &out, "output folder (created if missing)"},
      {"train", FLAG_INT, &n_train, "training images (default 1000)"},
      {"val", FLAG_INT, &n_val, "validation images (default 200)"},
      {"seed", FLAG_INT, &seed, "random seed (default 0): the same seed writes byte-identical files"},
      {"min-side", FLAG_INT, &min_side, "smallest image width/height in pixels (default 256)"},
      {"max-side", FLAG_INT, &max_side, "largest image width/height in pixels (default 448)"},
      {"quality", FLAG_INT, &quality, "JPEG quality 1..100 (default 90)"},
      {"max-objects", FLAG_INT, &max_objects, "at most this many objects per image, 1..8 (default 8)"},
      {"min-object-side", FLAG_INT, &min_object_side,
       "no object side below this many pixels (default 10: COCO's small objects included)"},
  };
  int n_flags = (int)(sizeof flags / sizeof flags[0]), n_positional = 0;
  int rc = cli_parse("synth", USAGE, argc, argv, 2, flags, n_flags, NULL, 0, &n_positional);
  if (rc == 1) return 0;
  if (rc != 0) return 2;
  if (!out) {
    fprintf(stderr, "detr synth: --out DIR is required (see detr synth --help)\n");
    return 2;
  }
  const CliRange ranges[] = {
      {"train", n_train, 0, 10000000}, {"val", n_val, 0, 10000000}, {"seed", seed, 0, LLONG_MAX},
      {"min-side", min_side, 64, 4096}, {"max-side", max_side, 64, 4096}, {"quality", quality, 1, 100},
      {"max-objects", max_objects, 1, 8}, {"min-object-side", min_object_side, 10, 4096}};
  if (cli_check_ranges("synth", ranges, (int)(sizeof ranges / sizeof ranges[0]))) return 2;
  if (min_side > max_side) {
    fprintf(stderr, "detr synth: --min-side %lld is larger than --max-side %lld\n", min_side, max_side);
    return 2;
  }
  cfg.out_dir = out;
  cfg.n_train = (int)n_train;
  cfg.n_val = (int)n_val;
  cfg.seed = (uint64_t)seed;
  cfg.min_side = (int)min_side;
  cfg.max_side = (int)max_side;
  cfg.jpeg_quality = (int)quality;
  cfg.max_objects = (int)max_objects;
  cfg.min_object_side = (int)min_object_side;
  DataError err;
  if (synth_generate(&cfg, &err) != DATA_OK) {
    fprintf(stderr, "detr synth: %s\n", err.msg);
    return 1;
  }
  printf("detr synth: wrote %d train and %d val images to %s (annotations/instances_{train,val}.json)\n", cfg.n_train,
         cfg.n_val, out);
  return 0;
}
