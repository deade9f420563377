// Box arithmetic for DETR's loss and matcher: format conversion and generalized IoU with its
// gradient, shared by CPU and CUDA kernels. xyxy = (x0, y0, x1, y1), cxcywh = (cx, cy, w, h).
#pragma once
#include <stdbool.h>

#include "kernels/common.h"

DETR_HD void box_cxcywh_to_xyxy(const float *b, float *o) {
  o[0] = b[0] - 0.5f * b[2];
  o[1] = b[1] - 0.5f * b[3];
  o[2] = b[0] + 0.5f * b[2];
  o[3] = b[1] + 0.5f * b[3];
}
// Backward of the (linear) conversion: d(in) += J^T d(out).
DETR_HD void box_cxcywh_to_xyxy_backward(const float *d_out, float *d_in) {
  d_in[0] += d_out[0] + d_out[2];
  d_in[1] += d_out[1] + d_out[3];
  d_in[2] += 0.5f * (d_out[2] - d_out[0]);
  d_in[3] += 0.5f * (d_out[3] - d_out[1]);
}
DETR_HD void box_xyxy_to_cxcywh(const float *b, float *o) {
  o[0] = 0.5f * (b[0] + b[2]);
  o[1] = 0.5f * (b[1] + b[3]);
  o[2] = b[2] - b[0];
  o[3] = b[3] - b[1];
}
DETR_HD void box_xyxy_to_cxcywh_backward(const float *d_out, float *d_in) {
  d_in[0] += 0.5f * d_out[0] - d_out[2];
  d_in[1] += 0.5f * d_out[1] - d_out[3];
  d_in[2] += 0.5f * d_out[0] + d_out[2];
  d_in[3] += 0.5f * d_out[1] + d_out[3];
}

// One box of op_box_convert (to_xyxy: cxcywh -> xyxy, else xyxy -> cxcywh) or, backward, of its
// gradient (in: d(out), out: d(in) accumulated): the step the CPU and CUDA kernels run per box.
DETR_HD void box_convert_one(const float *in, float *out, bool to_xyxy, bool backward) {
  if (backward && to_xyxy) box_cxcywh_to_xyxy_backward(in, out);
  else if (backward) box_xyxy_to_cxcywh_backward(in, out);
  else if (to_xyxy) box_cxcywh_to_xyxy(in, out);
  else box_xyxy_to_cxcywh(in, out);
}

DETR_HD float box_area(const float *b) { return (b[2] - b[0]) * (b[3] - b[1]); }

// The pieces of GIoU of a pair of xyxy boxes, as the reference's generalized_box_iou computes
// them: intersection (clamped at 0), union, enclosing box area.
typedef struct {
  float inter_w, inter_h, inter, uni, encl_w, encl_h, encl;
} GiouParts;

DETR_HD GiouParts box_giou_parts(const float *a, const float *b) {
  GiouParts p;
  float iw = fminf(a[2], b[2]) - fmaxf(a[0], b[0]);
  float ih = fminf(a[3], b[3]) - fmaxf(a[1], b[1]);
  p.inter_w = iw > 0.0f ? iw : 0.0f;
  p.inter_h = ih > 0.0f ? ih : 0.0f;
  p.inter = p.inter_w * p.inter_h;
  p.uni = box_area(a) + box_area(b) - p.inter;
  float ew = fmaxf(a[2], b[2]) - fminf(a[0], b[0]);
  float eh = fmaxf(a[3], b[3]) - fminf(a[1], b[1]);
  p.encl_w = ew > 0.0f ? ew : 0.0f;
  p.encl_h = eh > 0.0f ? eh : 0.0f;
  p.encl = p.encl_w * p.encl_h;
  return p;
}

DETR_HD float box_giou(const float *a, const float *b) {
  GiouParts p = box_giou_parts(a, b);
  return p.inter / p.uni - (p.encl - p.uni) / p.encl;
}

// d(giou)/d(a), d(giou)/d(b) times dg, accumulated into da, db. giou = I/U - 1 + U/E, so
// dG = (dI U - I dU)/U^2 + (dU E - U dE)/E^2, with dU = dArea_a + dArea_b - dI. min/max pick the
// box whose coordinate wins (ties go to a, as torch's max/min gradient goes to one input).
DETR_HD void box_giou_backward(const float *a, const float *b, float dg, float *da, float *db) {
  GiouParts p = box_giou_parts(a, b);
  float dI = dg * (1.0f / p.uni);                                // dG/dI (direct term)
  float dU = dg * (-p.inter / (p.uni * p.uni) + 1.0f / p.encl);  // dG/dU
  float dE = dg * (-p.uni / (p.encl * p.encl));                  // dG/dE
  dI -= dU;                                                      // U = area_a + area_b - I
  // Areas: area = (x1 - x0)(y1 - y0).
  float aw = a[2] - a[0], ah = a[3] - a[1], bw = b[2] - b[0], bh = b[3] - b[1];
  da[0] -= dU * ah;
  da[2] += dU * ah;
  da[1] -= dU * aw;
  da[3] += dU * aw;
  db[0] -= dU * bh;
  db[2] += dU * bh;
  db[1] -= dU * bw;
  db[3] += dU * bw;
  // Intersection: iw = min(x1) - max(x0) clamped; I = iw * ih.
  if (p.inter_w > 0.0f && p.inter_h > 0.0f) {
    float g_iw = dI * p.inter_h, g_ih = dI * p.inter_w;
    if (a[2] <= b[2]) da[2] += g_iw;
    else db[2] += g_iw;
    if (a[0] >= b[0]) da[0] -= g_iw;
    else db[0] -= g_iw;
    if (a[3] <= b[3]) da[3] += g_ih;
    else db[3] += g_ih;
    if (a[1] >= b[1]) da[1] -= g_ih;
    else db[1] -= g_ih;
  }
  // Enclosing box: ew = max(x1) - min(x0); E = ew * eh.
  if (p.encl_w > 0.0f && p.encl_h > 0.0f) {
    float g_ew = dE * p.encl_h, g_eh = dE * p.encl_w;
    if (a[2] >= b[2]) da[2] += g_ew;
    else db[2] += g_ew;
    if (a[0] <= b[0]) da[0] -= g_ew;
    else db[0] -= g_ew;
    if (a[3] >= b[3]) da[3] += g_eh;
    else db[3] += g_eh;
    if (a[1] <= b[1]) da[1] -= g_eh;
    else db[1] -= g_eh;
  }
}
