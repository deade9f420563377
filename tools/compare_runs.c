// compare_runs: the AP50 curves of several training runs in one chart (docs/conditional_detr.md's
// DETR vs Conditional DETR). Reads each run's metrics.jsonl: AP50 by epoch, and by training time
// (the sum over its steps of batch / images_per_s: the time spent in training steps, evaluation
// left out).
//   compare_runs --out FILE.png [--batch B] [--title T] RUN_DIR=NAME ...   (at most 4 runs)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "viz/draw.h"

#define MAX_RUNS CHART_MAX_SERIES
#define MAX_EVALS 4096

typedef struct {
  const char *name;
  double epoch[MAX_EVALS], minutes[MAX_EVALS], ap50[MAX_EVALS];
  int n;
} Run;

// A number after `"key": ` in a JSON line of metrics.jsonl, or NAN.
static double number_after(const char *line, const char *key) {
  char pattern[64];
  snprintf(pattern, sizeof pattern, "\"%s\": ", key);
  const char *at = strstr(line, pattern);
  return at ? strtod(at + strlen(pattern), NULL) : NAN;
}

static int read_run(const char *dir, double batch, Run *r) {
  char path[4200], line[8192];
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  FILE *f = fopen(path, "r");
  if (!f) {
    perror(path);
    return -1;
  }
  double seconds = 0;
  while (fgets(line, sizeof line, f)) {
    if (strstr(line, "\"type\": \"train\"")) {
      double ips = number_after(line, "images_per_s");
      if (ips > 0) seconds += batch / ips;
    } else if (strstr(line, "\"type\": \"eval\"") && r->n < MAX_EVALS) {
      r->epoch[r->n] = number_after(line, "epoch") + 1;  // epochs completed
      r->minutes[r->n] = seconds / 60;
      r->ap50[r->n++] = number_after(line, "AP50");
    }
  }
  fclose(f);
  if (r->n == 0) fprintf(stderr, "compare_runs: %s has no evaluation\n", path);
  return r->n ? 0 : -1;
}

int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  const char *out = NULL, *title = "AP50 (val)";
  double batch = 4;
  static Run runs[MAX_RUNS];
  int n = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc) batch = atof(argv[++i]);
    else if (!strcmp(argv[i], "--title") && i + 1 < argc) title = argv[++i];
    else if (n < MAX_RUNS && strchr(argv[i], '=')) {
      char *eq = strchr(argv[i], '=');
      *eq = 0;
      runs[n].name = eq + 1;
      if (read_run(argv[i], batch, &runs[n])) return 1;
      n++;
    } else {
      fprintf(stderr, "usage: compare_runs --out FILE.png [--batch B] [--title T] RUN_DIR=NAME ... (1..%d runs)\n",
              MAX_RUNS);
      return 2;
    }
  }
  if (!out || n == 0 || !(batch > 0)) {
    fprintf(stderr, "compare_runs: --out and at least one RUN_DIR=NAME are required\n");
    return 2;
  }
  static const Rgb colours[MAX_RUNS] = {{200, 60, 40}, {30, 80, 200}, {40, 160, 60}, {150, 90, 170}};
  ChartSpec spec = {.title = title, .n_panels = 2};
  spec.panels[0] = (ChartPanel){.title = "by epoch", .x_label = "epochs", .y_label = "AP50", .n_series = n};
  spec.panels[1] = (ChartPanel){
      .title = "by training time", .x_label = "minutes in training steps", .y_label = "AP50", .n_series = n};
  for (int i = 0; i < n; i++) {
    spec.panels[0].series[i] = (ChartSeries){runs[i].name, runs[i].epoch, runs[i].ap50, runs[i].n, colours[i]};
    spec.panels[1].series[i] = (ChartSeries){runs[i].name, runs[i].minutes, runs[i].ap50, runs[i].n, colours[i]};
  }
  char err[1024];
  if (chart_write_png(out, &spec, err, sizeof err)) {
    fprintf(stderr, "compare_runs: %s\n", err);
    return 1;
  }
  for (int i = 0; i < n; i++)
    printf("%s: %d evaluations, last AP50 %.3f at epoch %g (%.1f min in training steps)\n", runs[i].name, runs[i].n,
           runs[i].ap50[runs[i].n - 1], runs[i].epoch[runs[i].n - 1], runs[i].minutes[runs[i].n - 1]);
  return 0;
}
