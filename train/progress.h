// The training progress line on stderr. On a terminal it redraws in place; otherwise it prints a
// line every few seconds:
//   [######..] step 120/5000 epoch 3 (of 0-49)  41.20 img/s  ETA 2m01s  loss 2.345 (ce 1.100 bbox
//   0.200 giou 0.500)  clusters/img 37.0  N/L 4.1
// steps done of the run's total; the epoch from 0, as in the logs and metrics.jsonl; images/s
// (averaged); the time left; the step's total loss (weighted, auxiliary outputs included) and the
// last decoder layer's unweighted terms; the encoder attention's statistics (ENACT: clusters per
// image, pixels per cluster).
#pragma once
#include "nn/encoder_attn.h"
#include <stdbool.h>
#include <stdint.h>

typedef struct {
  bool enabled, tty;
  int64_t first_step, total_steps;
  double t_start, t_last_print, rate_ema;  // images/s, exponentially averaged
  bool line_open;
} Progress;

void progress_init(Progress *p, bool enabled, int64_t first_step, int64_t total_steps);
void progress_update(Progress *p, int64_t step, int64_t epoch, int64_t epochs, int images, double step_seconds,
                     const double terms[4], const AttnStatSums *attn);  // total, ce, bbox, giou
void progress_end_line(Progress *p);
