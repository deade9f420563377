// The training progress line on stderr: step, epoch, images/s, ETA and the main loss terms.
// On a terminal it redraws in place; otherwise it prints a line every few seconds.
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

// Seconds on the monotonic clock (for durations and rates).
double now_s(void);

void progress_init(Progress *p, bool enabled, int64_t first_step, int64_t total_steps);
void progress_update(Progress *p, int64_t step, int64_t epoch, int64_t epochs, int images, double step_seconds,
                     const double terms[4], const AttnStatSums *attn);  // total, ce, bbox, giou
void progress_end_line(Progress *p);
