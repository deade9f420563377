#include "train/progress.h"

#include <stdio.h>
#include <unistd.h>

#include "core/clock.h"

void progress_init(Progress *p, bool enabled, int64_t first_step, int64_t total_steps) {
  *p = (Progress){.enabled = enabled,
                  .tty = isatty(STDERR_FILENO),
                  .first_step = first_step,
                  .total_steps = total_steps,
                  .t_start = now_s()};
}

static void format_eta(double s, char *buf, size_t cap) {
  if (s < 0 || s > 1e7) {
    snprintf(buf, cap, "?");
    return;
  }
  int h = (int)(s / 3600), m = (int)(s / 60) % 60, sec = (int)s % 60;
  if (h) snprintf(buf, cap, "%dh%02dm", h, m);
  else snprintf(buf, cap, "%dm%02ds", m, sec);
}

void progress_update(Progress *p, int64_t step, int64_t epoch, int64_t epochs, int images, double step_seconds,
                     const double terms[4], const AttnStatSums *attn) {
  if (!p->enabled) return;
  double rate = step_seconds > 0 ? images / step_seconds : 0.0, t = now_s();
  p->rate_ema = p->rate_ema > 0 ? 0.9 * p->rate_ema + 0.1 * rate : rate;
  if (!p->tty && t - p->t_last_print < 5.0 && step != p->total_steps) return;
  p->t_last_print = t;
  double done = (double)(step - p->first_step), left = (double)(p->total_steps - step);
  double eta = done > 0 ? (t - p->t_start) / done * left : -1;
  char eta_text[32];
  format_eta(eta, eta_text, sizeof eta_text);
  int width = 24, filled = p->total_steps > 0 ? (int)(width * (double)step / (double)p->total_steps) : 0;
  char bar[32];
  for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
  bar[width] = 0;
  // Epochs count from 0, as in the log lines, metrics.jsonl, results-epoch<E>.json and the reference.
  fprintf(stderr,
          "%s[%s] step %lld/%lld epoch %lld (of 0-%lld)  %.2f img/s  ETA %s  loss %.3f (ce %.3f bbox %.3f giou %.3f)",
          p->tty ? "\r" : "", bar, (long long)step, (long long)p->total_steps, (long long)epoch, (long long)epochs - 1,
          p->rate_ema, eta_text, terms[0], terms[1], terms[2], terms[3]);
  for (int i = 0; attn && i < attn->n; i++) fprintf(stderr, "  %s %.1f", attn->label[i], attn_stats_mean(attn, i));
  if (p->tty) {
    fprintf(stderr, "\033[K");  // clear the rest of the line
    p->line_open = true;
  } else {
    fprintf(stderr, "\n");
  }
}

void progress_end_line(Progress *p) {
  if (p->enabled && p->line_open) fprintf(stderr, "\n");
  p->line_open = false;
}
