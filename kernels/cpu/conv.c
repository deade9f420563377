#include <float.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/norm_math.h"

// Convolution as im2col + one sgemm per image: y[b] [O, HO*WO] = W [O, C*KH*KW] x col
// [C*KH*KW, HO*WO]. A 1x1, stride-1, unpadded convolution uses the input as col directly.

static bool conv_is_pointwise(const ConvGeom *g) {
  return g->kh == 1 && g->kw == 1 && g->stride_h == 1 && g->stride_w == 1 && g->pad_h == 0 &&
         g->pad_w == 0;
}

int64_t cpu_conv2d_workspace_floats(const ConvGeom *g) {
  if (conv_is_pointwise(g)) return 0;
  return g->in_ch * g->kh * g->kw * g->out_h * g->out_w;
}

// col [C*KH*KW, HO*WO] from one image x [C, H, W].
static void im2col(const float *x, float *col, const ConvGeom *g) {
  int64_t rows = g->in_ch * g->kh * g->kw, spatial = g->out_h * g->out_w;
#pragma omp parallel for schedule(static) if (rows * spatial > 32768)
  for (int64_t r = 0; r < rows; r++) {
    int64_t c = r / (g->kh * g->kw), ky = (r / g->kw) % g->kh, kx = r % g->kw;
    const float *xc = x + c * g->in_h * g->in_w;
    float *dst = col + r * spatial;
    for (int64_t oy = 0; oy < g->out_h; oy++) {
      int64_t iy = conv_in_coord(oy, ky, g->stride_h, g->pad_h, g->dil_h);
      float *row = dst + oy * g->out_w;
      if (iy < 0 || iy >= g->in_h) {
        memset(row, 0, (size_t)g->out_w * sizeof(float));
        continue;
      }
      const float *xrow = xc + iy * g->in_w;
      for (int64_t ox = 0; ox < g->out_w; ox++) {
        int64_t ix = conv_in_coord(ox, kx, g->stride_w, g->pad_w, g->dil_w);
        row[ox] = (ix >= 0 && ix < g->in_w) ? xrow[ix] : 0.0f;
      }
    }
  }
}

// dx [C, H, W] += col2im(dcol). Parallel over channels: each channel's taps write only to it.
static void col2im_add(const float *col, float *dx, const ConvGeom *g) {
  int64_t spatial = g->out_h * g->out_w;
#pragma omp parallel for schedule(static) if (g->in_ch * g->kh * g->kw * spatial > 32768)
  for (int64_t c = 0; c < g->in_ch; c++) {
    float *dxc = dx + c * g->in_h * g->in_w;
    for (int64_t ky = 0; ky < g->kh; ky++)
      for (int64_t kx = 0; kx < g->kw; kx++) {
        const float *src = col + ((c * g->kh + ky) * g->kw + kx) * spatial;
        for (int64_t oy = 0; oy < g->out_h; oy++) {
          int64_t iy = conv_in_coord(oy, ky, g->stride_h, g->pad_h, g->dil_h);
          if (iy < 0 || iy >= g->in_h) continue;
          for (int64_t ox = 0; ox < g->out_w; ox++) {
            int64_t ix = conv_in_coord(ox, kx, g->stride_w, g->pad_w, g->dil_w);
            if (ix >= 0 && ix < g->in_w) dxc[iy * g->in_w + ix] += src[oy * g->out_w + ox];
          }
        }
      }
  }
}

void cpu_conv2d_forward(const float *x, const float *w, const float *bias, float *y,
                        const ConvGeom *g, float *workspace) {
  int64_t K = g->in_ch * g->kh * g->kw, spatial = g->out_h * g->out_w;
  for (int64_t b = 0; b < g->batch; b++) {
    const float *xb = x + b * g->in_ch * g->in_h * g->in_w;
    float *yb = y + b * g->out_ch * spatial;
    const float *col = xb;
    if (!conv_is_pointwise(g)) {
      im2col(xb, workspace, g);
      col = workspace;
    }
    cpu_gemm(false, false, g->out_ch, spatial, K, 1.0f, w, K, col, spatial, 0.0f, yb, spatial);
    if (bias) {
      for (int64_t o = 0; o < g->out_ch; o++)
        for (int64_t s = 0; s < spatial; s++) yb[o * spatial + s] += bias[o];
    }
  }
}

void cpu_conv2d_backward(const float *x, const float *w, const float *dy, float *dx, float *dw,
                         float *dbias, const ConvGeom *g, float *workspace) {
  int64_t K = g->in_ch * g->kh * g->kw, spatial = g->out_h * g->out_w;
  bool pointwise = conv_is_pointwise(g);
  for (int64_t b = 0; b < g->batch; b++) {
    const float *xb = x + b * g->in_ch * g->in_h * g->in_w;
    const float *dyb = dy + b * g->out_ch * spatial;
    float *dxb = dx ? dx + b * g->in_ch * g->in_h * g->in_w : NULL;
    if (dw) {  // dW [O, K] += dY [O, S] x col^T [S, K]
      const float *col = xb;
      if (!pointwise) {
        im2col(xb, workspace, g);
        col = workspace;
      }
      cpu_gemm(false, true, g->out_ch, K, spatial, 1.0f, dyb, spatial, col, spatial, 1.0f, dw, K);
    }
    if (dxb) {  // dcol [K, S] = W^T [K, O] x dY [O, S], then scattered back
      if (pointwise) {
        cpu_gemm(true, false, K, spatial, g->out_ch, 1.0f, w, K, dyb, spatial, 1.0f, dxb, spatial);
      } else {
        cpu_gemm(true, false, K, spatial, g->out_ch, 1.0f, w, K, dyb, spatial, 0.0f, workspace,
                 spatial);
        col2im_add(workspace, dxb, g);
      }
    }
  }
  if (dbias) {
    for (int64_t o = 0; o < g->out_ch; o++) {
      double acc = 0.0;
      for (int64_t b = 0; b < g->batch; b++) {
        const float *dyo = dy + (b * g->out_ch + o) * spatial;
        for (int64_t s = 0; s < spatial; s++) acc += dyo[s];
      }
      dbias[o] += (float)acc;
    }
  }
}

void cpu_maxpool2d_forward(const float *x, float *y, int32_t *argmax, const ConvGeom *g) {
  int64_t planes = g->batch * g->in_ch;
#pragma omp parallel for schedule(static) if (planes * g->out_h * g->out_w > 32768)
  for (int64_t p = 0; p < planes; p++) {
    const float *xp = x + p * g->in_h * g->in_w;
    for (int64_t oy = 0; oy < g->out_h; oy++)
      for (int64_t ox = 0; ox < g->out_w; ox++) {
        float best = -FLT_MAX;
        int32_t best_at = -1;
        for (int64_t ky = 0; ky < g->kh; ky++) {
          int64_t iy = conv_in_coord(oy, ky, g->stride_h, g->pad_h, g->dil_h);
          if (iy < 0 || iy >= g->in_h) continue;
          for (int64_t kx = 0; kx < g->kw; kx++) {
            int64_t ix = conv_in_coord(ox, kx, g->stride_w, g->pad_w, g->dil_w);
            if (ix < 0 || ix >= g->in_w) continue;
            float v = xp[iy * g->in_w + ix];
            if (best_at < 0 || v > best || v != v) {  // NaN propagates, as in torch
              best = v;
              best_at = (int32_t)(iy * g->in_w + ix);
            }
          }
        }
        int64_t o = (p * g->out_h + oy) * g->out_w + ox;
        y[o] = best;
        argmax[o] = best_at;
      }
  }
}

void cpu_maxpool2d_backward(const float *dy, const int32_t *argmax, float *dx, const ConvGeom *g) {
  int64_t planes = g->batch * g->in_ch, out_plane = g->out_h * g->out_w;
#pragma omp parallel for schedule(static) if (planes * out_plane > 32768)
  for (int64_t p = 0; p < planes; p++) {
    float *dxp = dx + p * g->in_h * g->in_w;
    for (int64_t o = 0; o < out_plane; o++) {
      int32_t at = argmax[p * out_plane + o];
      if (at >= 0) dxp[at] += dy[p * out_plane + o];
    }
  }
}

void cpu_frozen_bn_forward(const float *x, const float *weight, const float *bias,
                           const float *mean, const float *var, float eps, float *y,
                           float *scale, int64_t batch, int64_t channels, int64_t spatial) {
  // scale is [C] output (kept for backward); shift is recomputed: both are O(C).
  for (int64_t c = 0; c < channels; c++) {
    float shift;
    frozen_bn_scale_shift(weight[c], bias[c], mean[c], var[c], eps, &scale[c], &shift);
  }
#pragma omp parallel for schedule(static) if (batch * channels * spatial > 32768)
  for (int64_t bc = 0; bc < batch * channels; bc++) {
    int64_t c = bc % channels;
    float s, t;
    frozen_bn_scale_shift(weight[c], bias[c], mean[c], var[c], eps, &s, &t);
    const float *xp = x + bc * spatial;
    float *yp = y + bc * spatial;
    for (int64_t i = 0; i < spatial; i++) yp[i] = xp[i] * s + t;
  }
}

void cpu_channel_scale_backward(const float *dy, const float *scale, float *dx, int64_t batch,
                                int64_t channels, int64_t spatial) {
#pragma omp parallel for schedule(static) if (batch * channels * spatial > 32768)
  for (int64_t bc = 0; bc < batch * channels; bc++) {
    float s = scale[bc % channels];
    for (int64_t i = 0; i < spatial; i++) dx[bc * spatial + i] += dy[bc * spatial + i] * s;
  }
}
