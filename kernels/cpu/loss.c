#include <math.h>

#include "kernels/box_math.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/loss_math.h"

float cpu_cross_entropy_forward(const float *logits, const int64_t *targets, const float *weight, float *lse,
                                int64_t rows, int64_t classes) {
  double loss = 0.0, wsum = 0.0;
  for (int64_t r = 0; r < rows; r++) {
    const float *x = logits + r * classes;
    float max = -INFINITY;
    for (int64_t c = 0; c < classes; c++) max = x[c] > max ? x[c] : max;
    double s = 0.0;
    for (int64_t c = 0; c < classes; c++) s += expf(x[c] - max);
    lse[r] = log_sum_exp(max, s);
    float w = cross_entropy_weight(weight, targets[r]);
    loss += cross_entropy_term(w, lse[r], x[targets[r]]);
    wsum += w;
  }
  return (float)(loss / wsum);
}

void cpu_cross_entropy_backward(const float *logits, const int64_t *targets, const float *weight, const float *lse,
                                float dloss, float *dlogits, int64_t rows, int64_t classes) {
  double wsum = 0.0;
  for (int64_t r = 0; r < rows; r++) wsum += cross_entropy_weight(weight, targets[r]);
  float scale = (float)(dloss / wsum);
  for (int64_t r = 0; r < rows; r++) {
    float w = cross_entropy_weight(weight, targets[r]) * scale;
    for (int64_t c = 0; c < classes; c++)
      dlogits[r * classes + c] += cross_entropy_backward_elem(logits[r * classes + c], lse[r], w, c == targets[r]);
  }
}

float cpu_l1_sum_forward(const float *a, const float *b, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; i++) s += l1_elem(a[i], b[i]);
  return (float)s;
}

void cpu_l1_sum_backward(const float *a, const float *b, float dloss, float *da, float *db, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float d = l1_backward_elem(a[i], b[i], dloss);
    if (da) da[i] += d;
    if (db) db[i] -= d;
  }
}

float cpu_focal_loss_forward(const float *logits, const int64_t *targets, int64_t rows, int64_t classes, float alpha,
                             float gamma) {
  double s = 0.0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < classes; c++) s += focal_elem(logits[r * classes + c], c == targets[r], alpha, gamma);
  return (float)s;
}

void cpu_focal_loss_backward(const float *logits, const int64_t *targets, float dloss, float *dlogits, int64_t rows,
                             int64_t classes, float alpha, float gamma) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < classes; c++)
      dlogits[r * classes + c] += focal_backward_elem(logits[r * classes + c], c == targets[r], alpha, gamma, dloss);
}

static void box_convert(const float *in, float *out, int64_t boxes, bool to_xyxy, bool backward) {
  for (int64_t i = 0; i < boxes; i++) box_convert_one(in + 4 * i, out + 4 * i, to_xyxy, backward);
}

void cpu_box_convert_forward(const float *in, float *out, int64_t boxes, bool to_xyxy) {
  box_convert(in, out, boxes, to_xyxy, false);
}

void cpu_box_convert_backward(const float *dout, float *din, int64_t boxes, bool to_xyxy) {
  box_convert(dout, din, boxes, to_xyxy, true);
}

void cpu_box_giou_forward(const float *a, const float *b, float *out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = box_giou(a + 4 * i, b + 4 * i);
}

void cpu_box_giou_backward(const float *a, const float *b, const float *dout, float *da, float *db, int64_t n) {
  float scratch_a[4], scratch_b[4];
  for (int64_t i = 0; i < n; i++) {
    float *ga = da ? da + 4 * i : scratch_a, *gb = db ? db + 4 * i : scratch_b;
    box_giou_backward(a + 4 * i, b + 4 * i, dout[i], ga, gb);
  }
}
