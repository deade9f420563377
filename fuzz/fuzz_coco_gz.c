// The coco harness on gzip-compressed input (.json.gz).
#define FUZZ_COCO_GZIP 1
#include "fuzz_coco.c"
