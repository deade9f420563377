// The training history `detr train` keeps for chart.png: every logged step's loss and every
// evaluation's AP, in memory; a resumed run first reads back what its metrics.jsonl holds.
#pragma once
#include <stddef.h>

#include "datasets/image.h"

#define HISTORY_MAX_EVALS 512               // evaluations drawn (the first ones)
#define HISTORY_MAX_LOADED_STEPS (1 << 22)  // train lines read back from a metrics.jsonl
#define HISTORY_MAX_LINE 8192               // longer lines of a metrics.jsonl are skipped whole

typedef struct {
  double *step, *loss;  // [n]
  int n, cap;
  double epoch[HISTORY_MAX_EVALS], ap[HISTORY_MAX_EVALS], ap50[HISTORY_MAX_EVALS];  // [n_evals], epochs from 1
  int n_evals;
} TrainHistory;

void history_add_step(TrainHistory *h, double step, double loss);
void history_add_eval(TrainHistory *h, double epoch, double ap, double ap50);  // epoch from 0
// Appends what metrics_path holds (a missing file adds nothing). Reads the lines this program
// writes and tolerates anything else: unknown lines and lines over HISTORY_MAX_LINE bytes are
// skipped whole, a missing or unparsable number is a NaN (a gap in the chart), and at most
// HISTORY_MAX_LOADED_STEPS train lines and HISTORY_MAX_EVALS evaluations are taken.
void history_load(TrainHistory *h, const char *metrics_path);
void history_free(TrainHistory *h);
// The chart: the loss and its 50-step running mean by step, AP and AP50 by epoch, into *out
// (free it with image_free).
void history_chart_render(const TrainHistory *h, const char *title, Image *out);
