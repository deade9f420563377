// detect: objects in an image with libdetr. Build: cc detect.c $(pkg-config --cflags --libs detr)
//   detect CHECKPOINT IMAGE [THRESHOLD]            a detr-c checkpoint (`detr train` writes them)
//   detect WEIGHTS IMAGE THRESHOLD CONFIG          weights + a preset name or key=value file
#include <detr.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  if (argc < 3 || argc > 5) {
    fprintf(stderr, "usage: %s CHECKPOINT IMAGE [THRESHOLD] | WEIGHTS IMAGE THRESHOLD CONFIG\n", argv[0]);
    return 2;
  }
  detr_model *model;
  detr_status st =
      argc == 5 ? detr_open_weights(argv[1], argv[4], NULL, &model) : detr_open_checkpoint(argv[1], NULL, &model);
  detr_result *result = NULL;
  if (st == DETR_OK) st = detr_detect_file(model, argv[2], argc > 3 ? atof(argv[3]) : 0.5, &result);
  if (st != DETR_OK) {
    fprintf(stderr, "detect: %s: %s\n", detr_status_name(st), detr_last_error());
    detr_close(model);
    return 1;
  }
  for (int i = 0; i < detr_result_count(result); i++) {
    const detr_detection *d = detr_result_get(result, i);
    printf("%s (label %d): %.6g at [%.2f, %.2f, %.2f, %.2f]\n", d->name, d->label, d->score, d->box[0], d->box[1],
           d->box[2], d->box[3]);
  }
  detr_result_free(result);
  detr_close(model);
  return 0;
}
