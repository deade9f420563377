// parity_train_chart: the chart of tools/parity_train.py's loss-curve parity (docs/training.md). Reads
// lines "step reference_loss detr_c_loss rel_diff band" and draws two panels: the two loss curves,
// and log10 of detr-c's relative difference from the reference with log10 of the drift band (a
// difference of exactly 0 is left out: log10 has no value there).
//   parity_train_chart --title T --out FILE.png < CURVES.tsv
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "viz/draw.h"

int main(int argc, char **argv) {
  const char *title = NULL, *out = NULL;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--title")) title = argv[i + 1];
    else if (!strcmp(argv[i], "--out")) out = argv[i + 1];
  }
  if (!out) {
    fprintf(stderr, "usage: parity_train_chart --title T --out FILE.png < CURVES.tsv\n");
    return 2;
  }
  int cap = 1024, n = 0;
  double *v = detr_malloc(sizeof(double) * 6 * (size_t)cap, "parity_train_chart rows");
  double s, ref, ours, diff, band;
  while (scanf("%lf %lf %lf %lf %lf", &s, &ref, &ours, &diff, &band) == 5) {
    if (n == cap) v = detr_realloc(v, sizeof(double) * 6 * (size_t)(cap *= 2), "parity_train_chart rows");
    double *r = v + 6 * (size_t)n++;
    r[0] = s, r[1] = ref, r[2] = ours;
    r[3] = diff > 0 ? log10(diff) : NAN, r[4] = band > 0 ? log10(band) : NAN;
  }
  if (n == 0) {
    fprintf(stderr, "parity_train_chart: no rows on stdin\n");
    return 1;
  }
  double *cols = detr_malloc(sizeof(double) * 5 * (size_t)n, "parity_train_chart columns");  // column-major
  for (int c = 0; c < 5; c++)
    for (int i = 0; i < n; i++) cols[(size_t)c * n + i] = v[6 * (size_t)i + c];
  const double *x = cols;
  ChartSpec spec = {.title = title, .n_panels = 2};
  spec.panels[0] = (ChartPanel){.title = "total loss", .x_label = "step", .y_label = "loss", .n_series = 2};
  spec.panels[0].series[0] = (ChartSeries){"official (float32)", x, cols + n, n, {40, 90, 200}};
  spec.panels[0].series[1] = (ChartSeries){"detr-c", x, cols + 2 * (size_t)n, n, {220, 80, 40}};
  spec.panels[1] = (ChartPanel){.title = "relative difference vs official",
                                .x_label = "step",
                                .y_label = "log10 |L - L_ref| / L_ref",
                                .n_series = 2};
  spec.panels[1].series[0] = (ChartSeries){"band (official's own drift x2)", x, cols + 4 * (size_t)n, n, {40, 150, 60}};
  spec.panels[1].series[1] = (ChartSeries){"detr-c", x, cols + 3 * (size_t)n, n, {220, 80, 40}};
  char err[512];
  int rc = chart_write_png(out, &spec, err, sizeof err);
  if (rc) fprintf(stderr, "parity_train_chart: chart_write_png: %s\n", err);
  free(cols);
  free(v);
  return rc ? 1 : 0;
}
