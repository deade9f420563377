// The training history for the chart (train/history.h).
#include "train/history.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "viz/draw.h"

void history_add_step(TrainHistory *h, double step, double loss) {
  if (h->n == h->cap) {
    int cap = h->cap ? 2 * h->cap : 1024;
    double *a = detr_realloc(h->step, sizeof(double) * (size_t)cap, "loss history steps");
    h->step = a;
    double *b = detr_realloc(h->loss, sizeof(double) * (size_t)cap, "loss history");
    h->loss = b;
    h->cap = cap;
  }
  h->step[h->n] = step, h->loss[h->n] = loss;
  h->n++;
}

void history_add_eval(TrainHistory *h, double epoch, double ap, double ap50) {
  if (h->n_evals == HISTORY_MAX_EVALS) return;
  h->epoch[h->n_evals] = epoch + 1, h->ap[h->n_evals] = ap, h->ap50[h->n_evals] = ap50;
  h->n_evals++;
}

// A number after `"key": ` in a JSON line, or NAN.
static double json_number(const char *line, const char *key) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"%s\": ", key);
  const char *at = strstr(line, pattern);
  return at ? strtod(at + strlen(pattern), NULL) : NAN;
}

void history_load(TrainHistory *h, const char *metrics_path) {
  FILE *f = fopen(metrics_path, "r");
  if (!f) return;
  char line[HISTORY_MAX_LINE];
  bool partial = false;
  int loaded = 0;
  while (fgets(line, sizeof line, f)) {
    // A line longer than the buffer (not one this program writes) is skipped whole: its
    // continuation must not be read as a line of its own.
    bool complete = strchr(line, '\n') || feof(f);
    bool skip = partial;
    partial = !complete;
    if (skip || !complete) continue;
    if (strstr(line, "\"type\": \"eval\"")) {
      history_add_eval(h, json_number(line, "epoch"), json_number(line, "AP"), json_number(line, "AP50"));
    } else if (strstr(line, "\"type\": \"train\"") && loaded < HISTORY_MAX_LOADED_STEPS) {
      history_add_step(h, json_number(line, "step"), json_number(line, "loss"));
      loaded++;
    }
  }
  fclose(f);
}

void history_free(TrainHistory *h) {
  free(h->step), free(h->loss);
  h->step = h->loss = NULL;
  h->n = h->cap = 0;
}

void history_chart_render(const TrainHistory *h, const char *title, Image *out) {
  *out = (Image){0};
  int n = h->n;
  double *mean = detr_malloc(sizeof(double) * (size_t)n, "chart running mean");  // [n]
  double run = 0;
  for (int i = 0; i < n; i++) {  // running mean over the last 50 steps
    run += h->loss[i] - (i >= 50 ? h->loss[i - 50] : 0.0);
    mean[i] = run / (i + 1 < 50 ? i + 1 : 50);
  }
  ChartSpec spec = {.title = title, .n_panels = 2};
  spec.panels[0] = (ChartPanel){.title = "loss", .x_label = "step", .y_label = "weighted loss", .n_series = 2};
  spec.panels[0].series[0] =
      (ChartSeries){.name = "step", .x = h->step, .y = h->loss, .n = n, .colour = {190, 200, 230}};
  spec.panels[0].series[1] =
      (ChartSeries){.name = "mean of 50", .x = h->step, .y = mean, .n = n, .colour = {30, 80, 200}};
  spec.panels[1] = (ChartPanel){.title = "COCO AP (val)", .x_label = "epoch", .y_label = "AP", .n_series = 2};
  spec.panels[1].series[0] =
      (ChartSeries){.name = "AP", .x = h->epoch, .y = h->ap, .n = h->n_evals, .colour = {200, 60, 40}};
  spec.panels[1].series[1] =
      (ChartSeries){.name = "AP50", .x = h->epoch, .y = h->ap50, .n = h->n_evals, .colour = {40, 160, 60}};
  chart_render(&spec, out);
  free(mean);
}
