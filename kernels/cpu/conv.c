#include <float.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime.h"
#include "kernels/cpu/conv_onednn.h"
#include "kernels/cpu/parallel.h"
#include "kernels/norm_math.h"

// Convolution on the CPU: each pass (forward, backward-data, backward-weights) runs on oneDNN
// (conv_onednn.c) or on im2col + sgemm below, whichever bench_ops measured faster for its shape
// (cpu_conv2d_impl; figures in bench/README.md#bench_ops). Without oneDNN, im2col + sgemm runs everything.
//
// Convolution as im2col + sgemm: y[b] [O, HO*WO] = W [O, C*KH*KW] x col [C*KH*KW, HO*WO]. The
// output columns are processed in chunks so that col stays cache-resident between im2col and
// sgemm (a full col of a 200x267 map at 64 channels is 123 MB; unchunked, im2col traffic cost
// more than the multiply). A 1x1, stride-1, unpadded convolution uses the input as col directly.

// Floats of col per chunk (16 MiB): the best of 0.25-64 MiB on bench/bench_ops.
#define CONV_CHUNK_FLOATS (4 * 1024 * 1024)

static bool conv_is_pointwise(const ConvGeom *g) {
  return g->kh == 1 && g->kw == 1 && g->stride_h == 1 && g->stride_w == 1 && g->pad_h == 0 && g->pad_w == 0;
}

// Output columns per chunk (at least 1).
static int64_t conv_chunk_columns(const ConvGeom *g) {
  int64_t rows = g->in_ch * g->kh * g->kw, spatial = g->out_h * g->out_w;
  int64_t cols = CONV_CHUNK_FLOATS / rows;
  if (cols < 256) cols = 256;  // keep the sgemm wide enough to run at speed
  return cols < spatial ? cols : spatial;
}

// Channels last (g->channels_last): rows are output pixels, y [B*HO*WO, O] = col [B*HO*WO, K] x
// W'^T with col's K = KH*KW*C in (ky, kx, c) order, so each tap copies C contiguous floats; W'
// [O, KH, KW, C] is the weight permuted once per call (O*K floats; not needed for 1x1). Rows in
// chunks, as the columns above; a 1x1, stride-1, unpadded convolution uses x [B*H*W, C] as col.
static int64_t cl_chunk_rows(const ConvGeom *g) {
  int64_t k = g->in_ch * g->kh * g->kw, rows = g->batch * g->out_h * g->out_w;
  int64_t chunk = CONV_CHUNK_FLOATS / (k > 0 ? k : 1);
  if (chunk < 256) chunk = 256;
  return chunk < rows ? chunk : rows;
}

// The workspace floats before bf16 mode's rounded W (im2col_cl_forward): col's chunk (fp32, which
// also holds a bf16 one), 64-byte aligned.
static int64_t cl_col_floats(const ConvGeom *g) {
  int64_t k = g->in_ch * g->kh * g->kw;
  return conv_is_pointwise(g) ? 0 : (cl_chunk_rows(g) * k + 15) / 16 * 16;
}

static int64_t im2col_workspace_floats(const ConvGeom *g) {
  int64_t k = g->in_ch * g->kh * g->kw;
  if (g->channels_last && g->kh * g->kw == 1 && cpu_bf16_enabled())  // col chunk, W in bf16
    return cl_col_floats(g) + (g->out_ch * k + 1) / 2;
  if (g->channels_last)  // col chunk, then W' (or dW') where the taps are more than one
    return (conv_is_pointwise(g) ? 0 : cl_chunk_rows(g) * k) + (g->kh * g->kw > 1 ? g->out_ch * k : 0);
  if (conv_is_pointwise(g)) return 0;
  return k * conv_chunk_columns(g);
}

// Output positions t in [lo, hi) of a row segment of length seg read input columns
// base + t * stride inside [0, in_w); the others fall in the padding.
static void row_tap_range(int64_t base, int stride, int64_t in_w, int64_t seg, int64_t *lo, int64_t *hi) {
  int64_t l = base >= 0 ? 0 : (-base + stride - 1) / stride;
  int64_t h = base < in_w ? (in_w - base + stride - 1) / stride : 0;
  if (l > seg) l = seg;
  if (h > seg) h = seg;
  if (h < l) h = l;
  *lo = l;
  *hi = h;
}

// col [C*KH*KW, len] holds output columns [s0, s0 + len) of one image x [C, H, W].
static void im2col(const float *x, float *col, const ConvGeom *g, int64_t s0, int64_t len) {
  int64_t rows = g->in_ch * g->kh * g->kw;
#pragma omp parallel for schedule(static) if (rows * len > PARALLEL_MIN_LIGHT)
  for (int64_t r = 0; r < rows; r++) {
    int64_t c = r / (g->kh * g->kw), ky = (r / g->kw) % g->kh, kx = r % g->kw;
    const float *xc = x + c * g->in_h * g->in_w;
    float *dst = col + r * len;
    int64_t oy = s0 / g->out_w, ox = s0 % g->out_w;
    for (int64_t j = 0; j < len;) {  // one output row segment at a time
      int64_t seg = g->out_w - ox < len - j ? g->out_w - ox : len - j;
      int64_t iy = conv_in_coord(oy, ky, g->stride_h, g->pad_h, g->dil_h);
      if (iy < 0 || iy >= g->in_h) {
        memset(dst + j, 0, (size_t)seg * sizeof(float));
      } else {
        // Taps t in [lo, hi) read inside the row (ix = base + t * stride); the rest is padding.
        const float *xrow = xc + iy * g->in_w;
        int64_t lo, hi, base = conv_in_coord(ox, kx, g->stride_w, g->pad_w, g->dil_w);
        row_tap_range(base, g->stride_w, g->in_w, seg, &lo, &hi);
        float *out = dst + j;
        for (int64_t t = 0; t < lo; t++) out[t] = 0.0f;
        if (g->stride_w == 1) memcpy(out + lo, xrow + base + lo, (size_t)(hi - lo) * sizeof(float));
        else
          for (int64_t t = lo; t < hi; t++) out[t] = xrow[base + t * g->stride_w];
        for (int64_t t = hi; t < seg; t++) out[t] = 0.0f;
      }
      j += seg;
      ox = 0;
      oy++;
    }
  }
}

// dx [C, H, W] += col2im(dcol) for output columns [s0, s0 + len). Parallel over channels: each
// channel's taps write only to that channel.
static void col2im_add(const float *col, float *dx, const ConvGeom *g, int64_t s0, int64_t len) {
#pragma omp parallel for schedule(static) if (g->in_ch * g->kh * g->kw * len > PARALLEL_MIN_LIGHT)
  for (int64_t c = 0; c < g->in_ch; c++) {
    float *dxc = dx + c * g->in_h * g->in_w;
    for (int64_t ky = 0; ky < g->kh; ky++)
      for (int64_t kx = 0; kx < g->kw; kx++) {
        const float *src = col + ((c * g->kh + ky) * g->kw + kx) * len;
        int64_t oy = s0 / g->out_w, ox = s0 % g->out_w;
        for (int64_t j = 0; j < len;) {
          int64_t seg = g->out_w - ox < len - j ? g->out_w - ox : len - j;
          int64_t iy = conv_in_coord(oy, ky, g->stride_h, g->pad_h, g->dil_h);
          if (iy >= 0 && iy < g->in_h) {
            int64_t lo, hi, base = conv_in_coord(ox, kx, g->stride_w, g->pad_w, g->dil_w);
            row_tap_range(base, g->stride_w, g->in_w, seg, &lo, &hi);
            float *dxrow = dxc + iy * g->in_w + base;
            const float *s = src + j;
            if (g->stride_w == 1)
              for (int64_t t = lo; t < hi; t++) dxrow[t] += s[t];
            else
              for (int64_t t = lo; t < hi; t++) dxrow[t * g->stride_w] += s[t];
          }
          j += seg;
          ox = 0;
          oy++;
        }
      }
  }
}

// dbias [O] += the sums of dy over images and positions, image by image, in double (nchw or
// channels last: the same terms in the same order).
static void conv_bias_backward(const float *dy, float *dbias, const ConvGeom *g) {
  int64_t spatial = g->out_h * g->out_w;
  for (int64_t o = 0; o < g->out_ch; o++) {
    double acc = 0.0;
    for (int64_t b = 0; b < g->batch; b++)
      for (int64_t s = 0; s < spatial; s++) acc += dy[conv_offset(g->channels_last, b, o, s, g->out_ch, spatial)];
    dbias[o] += (float)acc;
  }
}

// --- channels last: im2col + sgemm over output pixels (see cl_chunk_rows) ---

// col [len, KH*KW*C] holds output pixels [r0, r0 + len) (of the whole batch) of x [B, H, W, C],
// elements of `elem` bytes (fp32, or a bf16 copy).
static void im2col_cl(const void *x, void *col, size_t elem, const ConvGeom *g, int64_t r0, int64_t len) {
  int64_t C = g->in_ch, K = C * g->kh * g->kw, plane = g->out_h * g->out_w;
  size_t tap = (size_t)C * elem;
#pragma omp parallel for schedule(static) if (len * K > PARALLEL_MIN_LIGHT)
  for (int64_t r = r0; r < r0 + len; r++) {
    int64_t b = r / plane, oy = r % plane / g->out_w, ox = r % g->out_w;
    char *dst = (char *)col + (size_t)((r - r0) * K) * elem;  // [KH, KW, C]
    for (int64_t ky = 0; ky < g->kh; ky++) {
      int64_t iy = conv_in_coord(oy, ky, g->stride_h, g->pad_h, g->dil_h);
      for (int64_t kx = 0; kx < g->kw; kx++, dst += tap) {
        int64_t ix = conv_in_coord(ox, kx, g->stride_w, g->pad_w, g->dil_w);
        if (iy < 0 || iy >= g->in_h || ix < 0 || ix >= g->in_w) memset(dst, 0, tap);
        else memcpy(dst, (const char *)x + (size_t)(((b * g->in_h + iy) * g->in_w + ix) * C) * elem, tap);
      }
    }
  }
}

// The taps of output pixel r of dcol (row src [KH, KW, C]) added into dx [B, H, W, C], channels
// [c0, c1).
static inline void col2im_cl_row(const float *src, float *dx, const ConvGeom *g, int64_t r, int64_t c0, int64_t c1) {
  int64_t C = g->in_ch, plane = g->out_h * g->out_w;
  int64_t b = r / plane, oy = r % plane / g->out_w, ox = r % g->out_w;
  for (int64_t ky = 0; ky < g->kh; ky++) {
    int64_t iy = conv_in_coord(oy, ky, g->stride_h, g->pad_h, g->dil_h);
    for (int64_t kx = 0; kx < g->kw; kx++, src += C) {
      int64_t ix = conv_in_coord(ox, kx, g->stride_w, g->pad_w, g->dil_w);
      if (iy < 0 || iy >= g->in_h || ix < 0 || ix >= g->in_w) continue;
      float *d = dx + ((b * g->in_h + iy) * g->in_w + ix) * C;
      for (int64_t c = c0; c < c1; c++) d[c] += src[c];
    }
  }
}

// dx [B, H, W, C] += col2im(dcol) for output pixels [r0, r0 + len). Taps of different pixels of
// one image hit the same input, those of different images never: threads take whole images when
// the chunk spans several, else split the channels (a single-image chunk). Either way every
// element gets its terms in pixel, then tap order, whatever the thread count.
static void col2im_cl_add(const float *col, float *dx, const ConvGeom *g, int64_t r0, int64_t len) {
  int64_t C = g->in_ch, K = C * g->kh * g->kw, plane = g->out_h * g->out_w;
  int64_t b0 = r0 / plane, b1 = (r0 + len - 1) / plane + 1;  // the images the chunk touches
  if (b1 - b0 >= 2) {
#pragma omp parallel for schedule(static) if (len * K > PARALLEL_MIN_LIGHT)
    for (int64_t b = b0; b < b1; b++) {
      int64_t lo = b * plane > r0 ? b * plane : r0, hi = (b + 1) * plane < r0 + len ? (b + 1) * plane : r0 + len;
      for (int64_t r = lo; r < hi; r++) col2im_cl_row(col + (r - r0) * K, dx, g, r, 0, C);
    }
    return;
  }
#pragma omp parallel if (len * K > PARALLEL_MIN_LIGHT)
  {
    int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t c0 = C * t / nt, c1 = C * (t + 1) / nt;  // this thread's channels
    for (int64_t r = r0; r < r0 + len; r++) col2im_cl_row(col + (r - r0) * K, dx, g, r, c0, c1);
  }
}

// W' [O, KH, KW, C] from w [O, C, KH, KW] (to_tap_major), or w += the inverse of W' (a gradient).
// Element (o, c, t) of w sits at conv_weight_tap_major's (o * taps + t) * C + c of W'; the loops
// walk it without a division per element.
static void cl_weight_permute(const ConvGeom *g, float *w, float *wt, bool to_tap_major) {
  int64_t C = g->in_ch, taps = g->kh * g->kw;
#pragma omp parallel for schedule(static) if (g->out_ch * C * taps > PARALLEL_MIN_LIGHT)
  for (int64_t o = 0; o < g->out_ch; o++)
    for (int64_t c = 0; c < C; c++) {
      float *a = w + (o * C + c) * taps, *b = wt + o * taps * C + c;
      for (int64_t t = 0; t < taps; t++) {
        if (to_tap_major) b[t * C] = a[t];
        else a[t] += b[t * C];
      }
    }
}

// bf16 mode's copies on the channels-last GEMM path (a 1x1 without padding: col is x's pixels,
// gathered where the stride is 2): x16, dy16 - x's and dy's dense bf16 copies, or NULL - and W
// rounded per call into the workspace after col's chunk. A GEMM reads the copies where they are
// given (cpu_gemm_bf16: the arithmetic and bits of cpu_gemm's bf16 path, which rounds the same
// operands itself), else runs cpu_gemm on the fp32 operands.

// gathered: x16 is room for the rows the GEMM reads (x16_gathered), filled here, not x's copy.
static void im2col_cl_forward(const float *x, uint16_t *x16, bool gathered, const float *w, const float *bias, float *y,
                              const ConvGeom *g, float *workspace) {
  int64_t C = g->in_ch, O = g->out_ch, K = C * g->kh * g->kw, rows = g->batch * g->out_h * g->out_w;
  bool pointwise = conv_is_pointwise(g);
  int64_t chunk = pointwise ? rows : cl_chunk_rows(g);
  float *col = workspace, *wt = (float *)w;  // wt: W' [O, K]
  uint16_t *w16 = NULL;                      // W [O, K] in bf16, with x16 (a 1x1)
  if (x16) {
    w16 = (uint16_t *)(workspace + cl_col_floats(g));
    cpu_round_bf16(w, O, K, w16);
  } else if (g->kh * g->kw > 1) {
    wt = workspace + chunk * K;
    cl_weight_permute(g, (float *)w, wt, true);
  }
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    int64_t len = rows - r0 < chunk ? rows - r0 : chunk;
    if (x16) {                             // y [len, O] = col16 W16^T
      const uint16_t *a16 = x16 + r0 * C;  // pointwise: x's pixels are col's rows; gathered: col's rows
      if (gathered) {
        im2col_cl(x, col, sizeof(float), g, r0, len);
        cpu_round_bf16(col, len, K, x16 + r0 * K);
      } else if (!pointwise) {
        im2col_cl(x16, col, sizeof(uint16_t), g, r0, len);
        a16 = (const uint16_t *)col;
      }
      cpu_gemm_bf16(false, true, len, O, K, 1.0f, a16, w16, 0.0f, y + r0 * O, O);
      continue;
    }
    const float *a = x + r0 * C;
    if (!pointwise) {
      im2col_cl(x, col, sizeof(float), g, r0, len);
      a = col;
    }
    cpu_gemm(false, true, len, O, K, 1.0f, a, K, wt, K, 0.0f, y + r0 * O, O);  // y [len, O] = col W'^T
  }
  if (bias) {
#pragma omp parallel for schedule(static) if (rows * O > PARALLEL_MIN_LIGHT)
    for (int64_t r = 0; r < rows; r++)
      for (int64_t o = 0; o < O; o++) y[r * O + o] += bias[o];
  }
}

// x16, dy16: the bf16 copies the passes read, or NULL (a 1x1; dw reads x16 with dy16); gathered:
// x16 holds the GEMM's rows (x16_gathered), not x's copy.
static void im2col_cl_backward(const float *x, const uint16_t *x16, bool gathered, const float *w, const float *dy,
                               const uint16_t *dy16, float *dx, bool set_dx, float *dw, float *dbias, const ConvGeom *g,
                               float *workspace) {
  int64_t C = g->in_ch, O = g->out_ch, K = C * g->kh * g->kw, rows = g->batch * g->out_h * g->out_w;
  bool pointwise = conv_is_pointwise(g), taps = g->kh * g->kw > 1;
  int64_t chunk = pointwise ? rows : cl_chunk_rows(g);
  float *col = workspace, *wt = taps ? workspace + chunk * K : NULL;  // W' or dW' [O, K]
  if (dx) {
    const float *wk = w;
    uint16_t *w16 = NULL;  // W [O, K] in bf16, with dy16 (a 1x1)
    if (dy16) {
      w16 = (uint16_t *)(workspace + cl_col_floats(g));
      cpu_round_bf16(w, O, K, w16);
    } else if (taps) {
      cl_weight_permute(g, (float *)w, wt, true);
      wk = wt;
    }
    if (set_dx && !pointwise) memset(dx, 0, (size_t)(g->batch * g->in_h * g->in_w * C) * sizeof(float));
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      int64_t len = rows - r0 < chunk ? rows - r0 : chunk;
      float beta = pointwise && !set_dx ? 1.0f : 0.0f;
      float *out = pointwise ? dx + r0 * C : col;  // dx [len, C] += dy W, or dcol [len, K] = dy W' scattered into dx
      if (dy16) cpu_gemm_bf16(false, false, len, K, O, 1.0f, dy16 + r0 * O, w16, beta, out, K);
      else cpu_gemm(false, false, len, K, O, 1.0f, dy + r0 * O, O, wk, K, beta, out, K);
      if (!pointwise) col2im_cl_add(col, dx, g, r0, len);
    }
  }
  if (dw) {
    float *dwk = dw;  // dW' [O, K] (+= dy^T col), added into dw [O, C, KH, KW] at the end
    if (taps) {
      memset(wt, 0, (size_t)(O * K) * sizeof(float));
      dwk = wt;
    }
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      int64_t len = rows - r0 < chunk ? rows - r0 : chunk;
      if (x16) {                             // dW += dy16^T col16
        const uint16_t *a16 = x16 + r0 * C;  // pointwise or gathered: the rows themselves
        if (!pointwise && !gathered) {
          im2col_cl(x16, col, sizeof(uint16_t), g, r0, len);
          a16 = (const uint16_t *)col;
        }
        cpu_gemm_bf16(true, false, O, K, len, 1.0f, dy16 + r0 * O, a16, 1.0f, dwk, K);
        continue;
      }
      const float *a = x + r0 * C;
      if (!pointwise) {
        im2col_cl(x, col, sizeof(float), g, r0, len);
        a = col;
      }
      cpu_gemm(true, false, O, K, len, 1.0f, dy + r0 * O, O, a, K, 1.0f, dwk, K);
    }
    if (taps) cl_weight_permute(g, dw, wt, false);
  }
  if (dbias) conv_bias_backward(dy, dbias, g);
}

_Static_assert(CONV_IMPL_AUTO == 0, "Runtime.conv_forced_impl: 0 chooses");

// The implementation a test or benchmark forces: the bound runtime's (core/runtime.h).
static ConvImpl forced_impl(void) {
  const Runtime *rt = runtime_bound();
  return rt ? (ConvImpl)rt->conv_forced_impl : CONV_IMPL_AUTO;
}

void cpu_conv2d_set_impl(ConvImpl impl) {
  DETR_CHECK(impl == CONV_IMPL_AUTO || impl == CONV_IMPL_IM2COL || DETR_HAVE_ONEDNN,
             "conv2d: this build has no oneDNN");
  char why[256];
  DETR_CHECK(impl != CONV_IMPL_ONEDNN_BF16 || cpu_bf16_supported(why, sizeof why), "conv2d: bf16: %s", why);
  runtime_current()->conv_forced_impl = (int)impl;
}

static ConvImpl bf16_conv_impl(const ConvGeom *g, ConvPass pass);

// A CPU without AVX-512 (AMD Zen 3, Intel before Skylake-SP), channels last, a k x k kernel:
// oneDNN 2.6's jit:avx2 direct convolution runs the 3x3 passes at 25-137 GFLOP/s where im2col +
// sgemm runs 57-130 on an AMD EPYC Zen 3 at 2.45 GHz, 2 threads, whose fp32 peak is 157
// (`bench_ops 5 --conv-last r50@512 / r18@320 / main@192`, bench/README.md#bench_ops). im2col's
// against oneDNN's:
//  - backward-weights from 64+ input channels: 1.1-3.3x;
//  - forward from 128+ input channels: 0.98-2.4x (from 64: 0.85-1.04x);
//  - backward-data at stride 2 from 64+ channels: 1.02-1.7x; at stride 1 from 128-256: 1.03-1.2x
//    (from 64: 0.55-0.65x, from 512: 0.74-0.91x).
// Below 64 channels (the main job's 16-32, the stem's 3) oneDNN's is the faster in every pass.
// (With AVX-512 oneDNN's direct and Winograd kernels are the faster: the rules below.)
static bool avx2_im2col_wins(const ConvGeom *g, ConvPass pass) {
  if (g->in_ch < 64) return false;
  bool strided = g->stride_h > 1 || g->stride_w > 1;
  switch (pass) {
    case CONV_PASS_BWD_WEIGHTS: return true;
    case CONV_PASS_FWD: return g->in_ch >= 128;
    case CONV_PASS_BWD_DATA: return strided || (g->in_ch >= 128 && g->in_ch <= 256);
  }
  return false;
}

// The per-pass choice, from bench_ops' medians at 2 threads (bench/README.md#bench_ops):
//  - 3x3 and 7x7: oneDNN's direct convolution on its blocked layouts, reorders included: forward
//    1.2-2.2x im2col + sgemm, backward-data 1.0-2.0x (most at 64-128 channels, where im2col's
//    column traffic costs most). Not for backward-data into fewer than 16 channels (the stem's,
//    never run in DETR: blocking pads 3 channels to 16, 0.4x), nor for backward-weights from 256
//    input channels on maps under 20x20 per image (sgemm's K = 9 C is long and its N short there:
//    im2col 1.1-1.6x oneDNN; on larger maps oneDNN 1.2-1.5x: R50's layer3, R18's 20x20 layer3).
//  - 1x1: one sgemm per image either way, and at the large maps, where most 1x1 time goes, the
//    reorders to blocked layouts cost more than the direct convolution saves: im2col + cpu_gemm
//    (measured when cpu_gemm was OpenBLAS's; it is oneDNN's sgemm now, which only widens the
//    margin. oneDNN's nchw convolution ran the 1x1 forward at mostly 1.1-1.5x OpenBLAS in
//    bench_ops but only 1.2% faster over the R50 step, for 21 MB more peak RSS in its packing
//    buffers; its backward was no faster, and backward-weights takes a per-thread copy of dw as
//    scratch, up to 69 MB.) `bench_ops --conv main@192` and `i18@192`: this choice is within 1 ms
//    per step of the fastest per pass for the main job's models. Backward-weights of a stride-1 1x1
//    from 32x32 per image up runs on oneDNN's blocked layout: im2col's sgemm there is
//    dw [O, C] += dy [O, HW] x^T with a long K and small M, N (140-400 GFLOP/s in `bench_ops --conv
//    r50@512`), oneDNN's 1.0-1.8x that; below 32x32 im2col is 1.1-2x oneDNN. R50 step: 3% faster.
ConvImpl cpu_conv2d_impl(const ConvGeom *g, ConvPass pass) {
  if (!DETR_HAVE_ONEDNN) return CONV_IMPL_IM2COL;
  // oneDNN 2.6 on nhwc activations with plain oihw weights runs its reference loop (~1 GFLOP/s,
  // `bench_ops 5 --conv-last`): forcing the plain layouts keeps oihw weights for nchw only.
  ConvImpl forced = forced_impl();
  if (forced == CONV_IMPL_ONEDNN_PLAIN && g->channels_last) return CONV_IMPL_ONEDNN;
  if (forced != CONV_IMPL_AUTO) return forced;
  int64_t out_spatial = g->out_h * g->out_w;  // per image
  // Channels last (oneDNN on the nhwc buffers themselves; im2col's rows are pixels), from
  // `bench_ops 5 --conv-last r50@512 / r18@320 / main@192` (bench/README.md#bench_ops): oneDNN
  // everywhere but
  //  - 1x1 backward-data: one sgemm dx [pixels, C] = dy W (stride 1), 1.1-1.6x oneDNN's;
  //  - 1x1 backward-weights from 256 channels: dW = dy^T x with K = all pixels, 1.0-2.1x;
  //  - 3x3 stride-2 backward-weights from 64 channels with 400+ output pixels per image: 1.1-1.5x.
  // (Below those sizes oneDNN's is up to 3x im2col's.) Passes left to im2col create no oneDNN
  // primitive, which a training run with a new input size each step pays per size.
  // And oneDNN's Winograd for a 3x3 stride-1 convolution of 64+ channels in and out with 400+
  // output pixels per image (20x20), reorders to its layouts included: 1.2-2.1x the direct one in
  // every pass (r18@320's 64x80, 128x40, 256x20, r50@512's 64x128, 128x64, 256x32); at 16x16
  // (r50's 512x16) 0.9-1.0x, at 10x10 0.4-0.6x, and below 64 channels (main@192's 16-32) 0.7-1.1x,
  // so not there (bench/README.md#bench_ops); nor where oneDNN has none (a CPU without AVX-512).
  // And not a backward pass whose Winograd workspace (its layout copies and scratchpad: the
  // transformed tiles, for backward-weights also a transformed dW per thread) is over
  // CPU_WINOGRAD_BACKWARD_MAX_BYTES: the backbone's backward is the step's memory peak, and there
  // R50@512's layer2-3 take 30-50 MB (R18's layer3 42 MB) on 2 threads: with the cap R50's peak
  // RSS is 923 MB instead of 962, its step about 5% slower (bench/README.md#bench_step); R18's the
  // same (its layer2 backward, 19 MB, stays on Winograd). More threads, larger workspaces: fewer
  // backward passes qualify.
  if (g->channels_last) {
    bool one = g->kh * g->kw == 1;
    if (g->kh == 3 && g->kw == 3 && g->stride_h == 1 && g->stride_w == 1 && g->dil_h == 1 && g->dil_w == 1 &&
        g->in_ch >= 64 && g->out_ch >= 64 && out_spatial >= 400) {
      int64_t floats = onednn_conv2d_winograd_workspace_floats(g, pass);
      if (floats >= 0 && (pass == CONV_PASS_FWD || floats * (int64_t)sizeof(float) <= CPU_WINOGRAD_BACKWARD_MAX_BYTES))
        return CONV_IMPL_ONEDNN_WINOGRAD;
      if (cpu_bf16_enabled()) return CONV_IMPL_ONEDNN_BF16;
    }
    if (cpu_bf16_enabled()) return bf16_conv_impl(g, pass);
    if (!one && !cpu_has_avx512() && avx2_im2col_wins(g, pass)) return CONV_IMPL_IM2COL;
    if (pass == CONV_PASS_BWD_DATA && one) return CONV_IMPL_IM2COL;
    if (pass == CONV_PASS_BWD_WEIGHTS && one && g->in_ch >= 256) return CONV_IMPL_IM2COL;
    // oneDNN 2.6's jit_1x1:avx2 backward-weights of a strided 1x1 from under 8 channels is wrong,
    // differently from run to run (reproduced with oneDNN alone; tests/test_reference.c's detr
    // fixture under ONEDNN_MAX_CPU_ISA=AVX2): right from 8 channels, at stride 1, with AVX-512.
    if (pass == CONV_PASS_BWD_WEIGHTS && one && (g->stride_h > 1 || g->stride_w > 1) && g->in_ch < 8 &&
        !cpu_has_avx512())
      return CONV_IMPL_IM2COL;
    if (pass == CONV_PASS_BWD_WEIGHTS && !one && g->stride_h > 1 && g->in_ch >= 64 && out_spatial >= 400)
      return CONV_IMPL_IM2COL;
    return CONV_IMPL_ONEDNN;
  }
  if (cpu_bf16_enabled()) return CONV_IMPL_ONEDNN_BF16;
  if (g->kh * g->kw > 1) {
    if (pass == CONV_PASS_BWD_DATA && g->in_ch < 16) return CONV_IMPL_IM2COL;
    if (pass == CONV_PASS_BWD_WEIGHTS && g->in_ch >= 256 && out_spatial < 400) return CONV_IMPL_IM2COL;
    return CONV_IMPL_ONEDNN;
  }
  if (pass == CONV_PASS_BWD_WEIGHTS && conv_is_pointwise(g) && out_spatial >= 1024) return CONV_IMPL_ONEDNN;
  return CONV_IMPL_IM2COL;
}

// bf16 mode, channels last, where Winograd does not run: oneDNN's bf16 direct convolution, but for
// the 1x1 passes where im2col's GEMM is faster - in bf16 mode cpu_gemm rounds its inputs into bf16
// copies and runs oneDNN's bf16 matmul (fp32 accumulation: the same arithmetic) where the GEMM has
// 2^20+ multiply-adds, sgemm below; and its dw is written plain, where the direct convolution's
// goes through oneDNN's reorder from its blocked layout (2.7 GB/s for a 2048x1024 dw) and, one
// image at a time, a second reorder that sums. The bias gradient there is dy's own fp32 sum.
// `bench_ops 7 --conv-last r50@512 / r18@320 / main@192`, columns bf16 and im2col+bf16
// (bench/README.md#bench_ops):
//  - stride 2 from 64 channels, every pass: 1.0-1.4x (backward-weights 1024 -> 2048: 2.3-2.6x);
//    the main job's 16-32 channels: 0.7-1.1x, so not there;
//  - stride-1 backward-data into 512+ channels on maps of 256+ pixels: 1.0-1.4x (at 4096 pixels
//    0.84-1.18x run to run; into fewer channels 0.9-1.0x; R18's 10x10 input projection 1.0x);
//  - stride-1 backward-weights from 256+ channels on maps of 256-1024 pixels: 1.0-1.4x. On larger
//    maps and on R18's 10x10 (a GEMM of K = 200) the direct one is 1.1-1.3x.
// The forward at stride 1 stays direct (within 5% either way; the inference path fuses its
// epilogues into the direct one).
static ConvImpl bf16_conv_impl(const ConvGeom *g, ConvPass pass) {
  int64_t out_spatial = g->out_h * g->out_w;  // per image
  if (g->kh * g->kw == 1 && g->pad_h == 0 && g->pad_w == 0) {
    if (g->stride_h > 1 || g->stride_w > 1) return g->in_ch >= 64 ? CONV_IMPL_IM2COL : CONV_IMPL_ONEDNN_BF16;
    if (pass == CONV_PASS_BWD_DATA && g->in_ch >= 512 && out_spatial >= 256) return CONV_IMPL_IM2COL;
    if (pass == CONV_PASS_BWD_WEIGHTS && g->in_ch >= 256 && out_spatial >= 256 && out_spatial <= 1024)
      return CONV_IMPL_IM2COL;
  }
  return CONV_IMPL_ONEDNN_BF16;
}

// The workspace of one pass on the implementation cpu_conv2d_impl chooses.
static int64_t pass_workspace_floats(const ConvGeom *g, ConvPass pass, bool accumulate, bool bias) {
  ConvImpl impl = cpu_conv2d_impl(g, pass);
  if (impl == CONV_IMPL_IM2COL) return im2col_workspace_floats(g);
  return onednn_conv2d_workspace_floats(g, pass, impl, accumulate, bias);
}

int64_t cpu_conv2d_forward_workspace_floats(const ConvGeom *g, bool bias) {
  return pass_workspace_floats(g, CONV_PASS_FWD, false, bias);
}

int64_t cpu_conv2d_backward_workspace_floats(const ConvGeom *g, bool dx, bool set_dx, bool dw, bool set_dw,
                                             bool dbias) {
  if (g->batch * g->out_ch * g->out_h * g->out_w == 0 || g->in_ch == 0) return 0;  // nothing runs
  // The passes run one after the other on the same workspace; dbias goes with dw.
  int64_t data = dx ? pass_workspace_floats(g, CONV_PASS_BWD_DATA, !set_dx, false) : 0;
  int64_t weights = dw ? pass_workspace_floats(g, CONV_PASS_BWD_WEIGHTS, !set_dw, dbias) : 0;
  return data > weights ? data : weights;
}

// Runs the pass on oneDNN when cpu_conv2d_impl chooses it (never without oneDNN) and returns
// true; false: the caller runs im2col + sgemm. Arguments as onednn_conv2d_run's.
static bool ran_on_onednn(const ConvGeom *g, ConvPass pass, bool accumulate, const float *in0, const float *in1,
                          const uint16_t *in0_16, const uint16_t *in1_16, float *out, float *bias, float *workspace) {
  ConvImpl impl = cpu_conv2d_impl(g, pass);
  if (impl == CONV_IMPL_IM2COL) return false;
  const uint16_t *in16[2] = {in0_16, in1_16};
  onednn_conv2d_run(g, pass, impl, accumulate, in0, in1, in16, out, bias, workspace);
  return true;
}

bool cpu_conv2d_takes_bf16(const ConvGeom *g, ConvPass pass) {
  if (!cpu_bf16_enabled() || !g->channels_last) return false;
  ConvImpl impl = cpu_conv2d_impl(g, pass);
  if (impl == CONV_IMPL_ONEDNN_BF16) return true;  // channels last: on the nhwc activations themselves
  if (impl != CONV_IMPL_IM2COL || g->kh * g->kw != 1) return false;
  // The GEMM path's bf16 copies are of a 1x1's: where cpu_gemm would round its operands (the pass's
  // first chunk; a last, shorter one runs on the copies too).
  int64_t C = g->in_ch, O = g->out_ch, rows = conv_is_pointwise(g) ? g->batch * g->out_h * g->out_w : cl_chunk_rows(g);
  if (pass == CONV_PASS_FWD) return cpu_gemm_bf16_wanted(rows, O, C);
  if (pass == CONV_PASS_BWD_DATA) return cpu_gemm_bf16_wanted(rows, C, O);
  return cpu_gemm_bf16_wanted(O, C, rows);
}

// Whether g's x16 holds the rows a strided 1x1's GEMMs read, [B, HO, WO, C], rather than x itself:
// where its forward and backward-weights both run as bf16 GEMMs, which read those pixels alone (a
// quarter of x at stride 2: a quarter of the rounding and of the copy kept).
static bool x16_gathered(const ConvGeom *g) {
  return g->channels_last && g->kh * g->kw == 1 && !conv_is_pointwise(g) &&
         cpu_conv2d_impl(g, CONV_PASS_FWD) == CONV_IMPL_IM2COL &&
         cpu_conv2d_impl(g, CONV_PASS_BWD_WEIGHTS) == CONV_IMPL_IM2COL && cpu_conv2d_takes_bf16(g, CONV_PASS_FWD) &&
         cpu_conv2d_takes_bf16(g, CONV_PASS_BWD_WEIGHTS);
}

int64_t cpu_conv2d_x16_numel(const ConvGeom *g) {
  return x16_gathered(g) ? g->batch * g->out_h * g->out_w * g->in_ch : g->batch * g->in_h * g->in_w * g->in_ch;
}

// A pass's operand: its bf16 copy where the pass takes one (else NULL, the copy ignored), and the
// fp32 one present otherwise (op_conv2d keeps only x's copy where backward-weights takes it).
static const uint16_t *pass_half(const ConvGeom *g, ConvPass pass, const void *fp32, const uint16_t *half,
                                 const char *what) {
  static const char *names[3] = {"forward", "backward-data", "backward-weights"};
  if (half && !cpu_conv2d_takes_bf16(g, pass)) half = NULL;
  DETR_CHECK(fp32 || half,
             "conv2d: the %s needs %s in fp32 (it runs in fp32: was bf16 mode turned off between a "
             "forward and its backward?)",
             names[pass], what);
  return half;
}

void cpu_conv2d_forward(const float *x, uint16_t *x16, const float *w, const float *bias, float *y, const ConvGeom *g,
                        float *workspace) {
  bool gathered = x16 && x16_gathered(g);  // filled by the GEMM path as it gathers
  if (x16 && !gathered) cpu_round_bf16(x, g->batch * g->in_h * g->in_w, g->in_ch, x16);
  x16 = (uint16_t *)pass_half(g, CONV_PASS_FWD, x, x16, "x");
  if (ran_on_onednn(g, CONV_PASS_FWD, false, x, w, x16, NULL, y, (float *)bias, workspace)) return;
  if (g->channels_last) {
    im2col_cl_forward(x, x16, gathered, w, bias, y, g, workspace);
    return;
  }
  int64_t K = g->in_ch * g->kh * g->kw, spatial = g->out_h * g->out_w;
  bool pointwise = conv_is_pointwise(g);
  int64_t chunk = pointwise ? spatial : conv_chunk_columns(g);
  for (int64_t b = 0; b < g->batch; b++) {
    const float *xb = x + b * g->in_ch * g->in_h * g->in_w;
    float *yb = y + b * g->out_ch * spatial;
    for (int64_t s0 = 0; s0 < spatial; s0 += chunk) {
      int64_t len = spatial - s0 < chunk ? spatial - s0 : chunk;
      if (pointwise) {  // col is x itself
        cpu_gemm(false, false, g->out_ch, len, K, 1.0f, w, K, xb + s0, spatial, 0.0f, yb + s0, spatial);
      } else {
        im2col(xb, workspace, g, s0, len);
        cpu_gemm(false, false, g->out_ch, len, K, 1.0f, w, K, workspace, len, 0.0f, yb + s0, spatial);
      }
    }
    if (bias) {
      for (int64_t o = 0; o < g->out_ch; o++)
        for (int64_t s = 0; s < spatial; s++) yb[o * spatial + s] += bias[o];
    }
  }
}

static unsigned conv_post(bool residual, bool relu) {
  return (residual ? CONV_POST_SUM : 0u) | (relu ? CONV_POST_RELU : 0u);
}

int64_t cpu_conv2d_forward_fused_workspace_floats(const ConvGeom *g, bool bias, bool residual, bool relu, bool packed) {
  ConvImpl impl = cpu_conv2d_impl(g, CONV_PASS_FWD);
  if (impl == CONV_IMPL_IM2COL) return im2col_workspace_floats(g);
  return onednn_conv2d_forward_post_workspace_floats(g, impl, bias, conv_post(residual, relu), packed);
}

void cpu_conv2d_forward_fused(const float *x, const float *w, const float *bias, const float *residual, bool relu,
                              float *y, const ConvGeom *g, float *workspace, ConvWeightPack *pack) {
  int64_t n = g->batch * g->out_ch * g->out_h * g->out_w;
  ConvImpl impl = cpu_conv2d_impl(g, CONV_PASS_FWD);
  if (impl != CONV_IMPL_IM2COL) {  // the residual in y, then oneDNN's sum (and ReLU) post-ops
    if (residual && residual != y) memcpy(y, residual, (size_t)n * sizeof(float));
    onednn_conv2d_forward_post(g, impl, conv_post(residual != NULL, relu), x, w, y, bias, workspace, pack);
    return;
  }
  float *res_copy = NULL;  // im2col writes y first: a residual that is y itself is kept aside
  if (residual == y) {
    res_copy = detr_malloc((size_t)n * sizeof(float), "conv2d residual");
    memcpy(res_copy, y, (size_t)n * sizeof(float));
    residual = res_copy;
  }
  cpu_conv2d_forward(x, NULL, w, bias, y, g, workspace);
  if (residual || relu) {
#pragma omp parallel for schedule(static) if (n > PARALLEL_MIN_LIGHT)
    for (int64_t i = 0; i < n; i++) {
      float v = residual ? y[i] + residual[i] : y[i];
      y[i] = relu ? unary_forward(UNARY_RELU, v, 0.0f) : v;
    }
  }
  free(res_copy);
}

// dx (written when set_dx, else accumulated) and/or dw (with dbias) by im2col + sgemm.
static void im2col_backward(const float *x, const float *w, const float *dy, float *dx, bool set_dx, float *dw,
                            float *dbias, const ConvGeom *g, float *workspace) {
  int64_t K = g->in_ch * g->kh * g->kw, spatial = g->out_h * g->out_w;
  bool pointwise = conv_is_pointwise(g);
  int64_t chunk = pointwise ? spatial : conv_chunk_columns(g);
  for (int64_t b = 0; b < g->batch; b++) {
    // x is read only for dw and w only for dx: the other may be NULL (autograd keeps what it needs).
    const float *xb = x ? x + b * g->in_ch * g->in_h * g->in_w : NULL;
    const float *dyb = dy + b * g->out_ch * spatial;
    float *dxb = dx ? dx + b * g->in_ch * g->in_h * g->in_w : NULL;
    if (pointwise) {
      // dW [O, C] += dY [O, S] x X^T [S, C];  dX [C, S] += W^T [C, O] x dY [O, S]
      if (dw) cpu_gemm(false, true, g->out_ch, K, spatial, 1.0f, dyb, spatial, xb, spatial, 1.0f, dw, K);
      if (dxb)
        cpu_gemm(true, false, K, spatial, g->out_ch, 1.0f, w, K, dyb, spatial, set_dx ? 0.0f : 1.0f, dxb, spatial);
      continue;
    }
    if (dxb && set_dx) memset(dxb, 0, (size_t)(g->in_ch * g->in_h * g->in_w) * sizeof(float));  // col2im adds
    for (int64_t s0 = 0; s0 < spatial; s0 += chunk) {
      int64_t len = spatial - s0 < chunk ? spatial - s0 : chunk;
      if (dw) {  // dW [O, K] += dY[:, chunk] [O, len] x col^T [len, K]
        im2col(xb, workspace, g, s0, len);
        cpu_gemm(false, true, g->out_ch, K, len, 1.0f, dyb + s0, spatial, workspace, len, 1.0f, dw, K);
      }
      if (dxb) {  // dcol [K, len] = W^T [K, O] x dY[:, chunk], scattered back into dx
        cpu_gemm(true, false, K, len, g->out_ch, 1.0f, w, K, dyb + s0, spatial, 0.0f, workspace, len);
        col2im_add(workspace, dxb, g, s0, len);
      }
    }
  }
  if (dbias) conv_bias_backward(dy, dbias, g);
}

void cpu_conv2d_backward(const float *x, const uint16_t *x16, const float *w, const float *dy, uint16_t *dy16,
                         float *dx, bool set_dx, float *dw, bool set_dw, float *dbias, const ConvGeom *g,
                         float *workspace) {
  if (g->batch * g->out_ch * g->out_h * g->out_w == 0 || g->in_ch == 0) {  // no terms: a fresh gradient is 0
    if (dx && set_dx) memset(dx, 0, (size_t)(g->batch * g->in_ch * g->in_h * g->in_w) * sizeof(float));
    if (dw && set_dw) memset(dw, 0, (size_t)(g->out_ch * g->in_ch * g->kh * g->kw) * sizeof(float));
    return;
  }
  if (dy16) cpu_round_bf16(dy, g->batch * g->out_h * g->out_w, g->out_ch, dy16);
  // The two passes may run on different implementations; dbias goes with dw (oneDNN fuses it).
  const uint16_t *dy16_data = dx ? pass_half(g, CONV_PASS_BWD_DATA, dy, dy16, "dy") : NULL;
  if (dx && !ran_on_onednn(g, CONV_PASS_BWD_DATA, !set_dx, dy, w, dy16_data, NULL, dx, NULL, workspace)) {
    if (g->channels_last) im2col_cl_backward(NULL, NULL, false, w, dy, dy16_data, dx, set_dx, NULL, NULL, g, workspace);
    else im2col_backward(NULL, w, dy, dx, set_dx, NULL, NULL, g, workspace);
  }
  if (dw) {
    const uint16_t *x16_w = pass_half(g, CONV_PASS_BWD_WEIGHTS, x, x16, "x");
    const uint16_t *dy16_w = pass_half(g, CONV_PASS_BWD_WEIGHTS, dy, dy16, "dy");
    bool gemm = cpu_conv2d_impl(g, CONV_PASS_BWD_WEIGHTS) == CONV_IMPL_IM2COL;
    DETR_CHECK(!gemm || !x16_w || dy16_w, "conv2d: backward-weights' GEMM has x's bf16 copy but not dy's");
    if (!ran_on_onednn(g, CONV_PASS_BWD_WEIGHTS, !set_dw, x, dy, x16_w, dy16_w, dw, dbias, workspace)) {
      if (set_dw) memset(dw, 0, (size_t)(g->out_ch * g->in_ch * g->kh * g->kw) * sizeof(float));  // im2col adds
      if (g->channels_last)
        im2col_cl_backward(x, x16_w, x16_w && x16_gathered(g), NULL, dy, dy16_w, NULL, false, dw, dbias, g, workspace);
      else im2col_backward(x, NULL, dy, NULL, false, dw, dbias, g, workspace);
    }
  } else if (dbias) {
    conv_bias_backward(dy, dbias, g);
  }
}

// The outputs o in [*lo, *hi) whose tap k reads an input coordinate o * stride - pad + k * dil in
// [0, in), clipped to [o_begin, o_end).
static void pool_out_range(int64_t k, int stride, int pad, int dil, int64_t in, int64_t o_begin, int64_t o_end,
                           int64_t *lo, int64_t *hi) {
  int64_t shift = conv_in_coord(0, k, stride, pad, dil);  // input coordinate of output 0
  int64_t first = shift >= 0 ? 0 : (-shift + stride - 1) / stride;
  int64_t last = in - 1 - shift < 0 ? -1 : (in - 1 - shift) / stride;  // last o with coordinate < in
  *lo = first > o_begin ? first : o_begin;
  *hi = last + 1 < o_end ? last + 1 : o_end;
}

// Tap by tap over a row of outputs rather than output by output: each output's choice depends on
// the one before it (compare, select), and 9 such steps in a chain per output made the main job's
// stem pool latency-bound (3.7 ms a step; bench/README.md#bench_step, `--profile`). Across the row
// the chains are independent. Every output still sees its taps in torch's order (rows, then
// columns).
#define POOL_ROW_CHUNK 256

// One tap of a row of max-pool windows: outputs o in [lo, hi) read x[shift + o * stride]; best and
// at are indexed by o. Inlined with a literal stride where the caller has one.
static inline __attribute__((always_inline)) void pool_row_taps(const float *x, float *best, int32_t *at, int64_t shift,
                                                                int stride, int64_t lo, int64_t hi) {
  const float *xs = x + shift;  // addressed in 64 bits: an affine index the compiler can vectorize
#pragma omp simd
  for (int64_t o = lo; o < hi; o++) {
    int32_t a = (int32_t)(shift + o * stride);
    float v = xs[o * stride];
    bool take = maxpool_takes(v, best[o], at[o]);
    best[o] = take ? v : best[o];
    at[o] = take ? a : at[o];
  }
}

// Channels last: the window's taps in torch's order for a block of up to POOL_CL_BLOCK channels of
// one output pixel at a time (the channels are contiguous: the compare and select vectorize across
// them), the block's maxima - and their taps' input positions iy * in_w + ix, as the nchw kernel's
// argmax, where one is kept - held in registers over the window and stored once. Against the kernel
// before it, which loaded and stored the running best and its index at every tap, on the main job's
// stem pool (16 channels): inference 250 -> 127 us a 223x213 picture (1 thread), training's forward
// 9.7-12.6 -> 5.0-5.6 ms over 20 steps (bench/README.md#bench_step).
enum { POOL_CL_BLOCK = 16 };

// The POOL_CL_BLOCK-or-fewer channels c0.. of output pixel (b, oy, ox) into y and, with_argmax,
// argmax (the pixel's [C] each). A literal with_argmax at each call: the indices cost nothing
// without.
static inline __attribute__((always_inline)) void pool_pixel_block(const float *x, float *y, int32_t *argmax,
                                                                   bool with_argmax, const ConvGeom *g, int64_t b,
                                                                   int64_t oy, int64_t ox, int64_t c0, int64_t n) {
  float best[POOL_CL_BLOCK];  // -FLT_MAX and -1 where the window has no tap
  int32_t at[POOL_CL_BLOCK];  // read only with_argmax
  for (int64_t c = 0; c < POOL_CL_BLOCK; c++) best[c] = -FLT_MAX, at[c] = -1;
  bool first = true;  // the first tap is taken as it is (maxpool_takes with nothing taken yet)
  for (int64_t ky = 0; ky < g->kh; ky++) {
    int64_t iy = conv_in_coord(oy, ky, g->stride_h, g->pad_h, g->dil_h);
    if (iy < 0 || iy >= g->in_h) continue;
    for (int64_t kx = 0; kx < g->kw; kx++) {
      int64_t ix = conv_in_coord(ox, kx, g->stride_w, g->pad_w, g->dil_w);
      if (ix < 0 || ix >= g->in_w) continue;
      const float *xp = x + ((b * g->in_h + iy) * g->in_w + ix) * g->in_ch + c0;
      int32_t pos = (int32_t)(iy * g->in_w + ix);
      if (first) {
#pragma omp simd
        for (int64_t c = 0; c < n; c++) best[c] = xp[c], at[c] = pos;
      } else {
#pragma omp simd
        for (int64_t c = 0; c < n; c++) {
          bool take = maxpool_takes(xp[c], best[c], 0);  // a tap is taken (the first)
          best[c] = take ? xp[c] : best[c];
          if (with_argmax) at[c] = take ? pos : at[c];
        }
      }
      first = false;
    }
  }
  for (int64_t c = 0; c < n; c++) y[c0 + c] = best[c];
  if (with_argmax)
    for (int64_t c = 0; c < n; c++) argmax[c0 + c] = at[c];
}

// The pixels of output row (image b, row oy) of y and, with_argmax, argmax [B, HO, WO, C].
static inline __attribute__((always_inline)) void pool_row_blocks(const float *x, float *y, int32_t *argmax,
                                                                  bool with_argmax, const ConvGeom *g, int64_t b,
                                                                  int64_t oy) {
  int64_t C = g->in_ch;
  for (int64_t ox = 0; ox < g->out_w; ox++) {
    int64_t pixel = ((b * g->out_h + oy) * g->out_w + ox) * C;
    int32_t *ap = with_argmax ? argmax + pixel : NULL;
    int64_t c0 = 0;
    for (; c0 + POOL_CL_BLOCK <= C; c0 += POOL_CL_BLOCK)  // a literal width: the block stays in registers
      pool_pixel_block(x, y + pixel, ap, with_argmax, g, b, oy, ox, c0, POOL_CL_BLOCK);
    if (c0 < C) pool_pixel_block(x, y + pixel, ap, with_argmax, g, b, oy, ox, c0, C - c0);
  }
}

// One output row; argmax NULL: none kept (inference).
CPU_AVX2_CLONES static void maxpool_row_cl(const float *x, float *y, int32_t *argmax, const ConvGeom *g, int64_t b,
                                           int64_t oy) {
  if (argmax) pool_row_blocks(x, y, argmax, true, g, b, oy);
  else pool_row_blocks(x, y, NULL, false, g, b, oy);
}

enum { POOL_SEPARABLE_MAX_KH = 8 };  // taller windows take the kernel above

// The running maximum's step: v where maxpool_takes takes it (a tap was taken already), else best.
static inline float pool_max(float v, float best) { return maxpool_takes(v, best, 0) ? v : best; }

// Channels last without argmax (inference): the window's maximum is taken separably - over its rows
// for every input column of the output row first (vmax [in_w, C], contiguous: one vector loop), then
// over its columns from vmax - where the kernel above takes the 9 taps pixel by pixel. The same
// values: the maximum of a set does not depend on the order it is taken in, a NaN anywhere gives NaN
// (maxpool_takes lets one in and keeps it), and a tie between +0 and -0, where the order would pick
// the sign, cannot come from a ReLU before the pool. The main job's stem pool on a picture 223 high,
// 213 wide ([112, 107, 16] in): 131 -> 38 us on 1 thread, 80 -> 20 us on 2 (hot;
// bench/README.md#bench_serve).
CPU_AVX2_CLONES static void maxpool_row_cl_values(const float *x, float *y, float *vmax, const ConvGeom *g, int64_t b,
                                                  int64_t oy) {
  int64_t C = g->in_ch, row = g->in_w * C;
  const float *rows[POOL_SEPARABLE_MAX_KH];  // the window's rows inside the picture, in tap order
  int n_rows = 0;
  for (int64_t ky = 0; ky < g->kh; ky++) {
    int64_t iy = conv_in_coord(oy, ky, g->stride_h, g->pad_h, g->dil_h);
    if (iy >= 0 && iy < g->in_h) rows[n_rows++] = x + (b * g->in_h + iy) * row;
  }
  int done = 1;       // rows taken into vmax
  if (n_rows >= 3) {  // the first three in one pass (a 3x3 window's all)
    const float *r0 = rows[0], *r1 = rows[1], *r2 = rows[2];
#pragma omp simd
    for (int64_t i = 0; i < row; i++) vmax[i] = pool_max(r2[i], pool_max(r1[i], r0[i]));
    done = 3;
  } else if (n_rows > 0) {
    memcpy(vmax, rows[0], (size_t)row * sizeof(float));
  }
  for (int r = done; r < n_rows; r++) {
    const float *xr = rows[r];
#pragma omp simd
    for (int64_t i = 0; i < row; i++) vmax[i] = pool_max(xr[i], vmax[i]);
  }
  float *yr = y + (b * g->out_h + oy) * g->out_w * C;
  if (n_rows == 0) {  // every row of the window in the padding (as above: not for torch's pools)
    for (int64_t i = 0; i < g->out_w * C; i++) yr[i] = -FLT_MAX;
    return;
  }
  for (int64_t ox = 0; ox < g->out_w; ox++) {
    float *yp = yr + ox * C;
    bool taken = false;
    for (int64_t kx = 0; kx < g->kw; kx++) {
      int64_t ix = conv_in_coord(ox, kx, g->stride_w, g->pad_w, g->dil_w);
      if (ix < 0 || ix >= g->in_w) continue;
      const float *v = vmax + ix * C;
      if (!taken) {
        memcpy(yp, v, (size_t)C * sizeof(float));
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; c++) yp[c] = pool_max(v[c], yp[c]);
      }
      taken = true;
    }
    if (!taken)  // a window wholly in the padding (not for torch's pools: pad <= kernel / 2)
      for (int64_t c = 0; c < C; c++) yp[c] = -FLT_MAX;
  }
}

void cpu_maxpool2d_forward(const float *x, float *y, int32_t *argmax, const ConvGeom *g) {
  if (g->channels_last && !argmax && g->kh <= POOL_SEPARABLE_MAX_KH) {
#pragma omp parallel if (g->batch * g->out_h * g->out_w * g->in_ch > PARALLEL_MIN_LIGHT)
    {
      float *vmax = detr_malloc((size_t)(g->in_w * g->in_ch) * sizeof(float), "max-pool rows");  // [in_w, C]
#pragma omp for schedule(static)
      for (int64_t r = 0; r < g->batch * g->out_h; r++)
        maxpool_row_cl_values(x, y, vmax, g, r / g->out_h, r % g->out_h);
      free(vmax);
    }
    return;
  }
  if (g->channels_last) {
#pragma omp parallel for schedule(static) if (g->batch * g->out_h * g->out_w * g->in_ch > PARALLEL_MIN_LIGHT)
    for (int64_t r = 0; r < g->batch * g->out_h; r++) maxpool_row_cl(x, y, argmax, g, r / g->out_h, r % g->out_h);
    return;
  }
  int64_t planes = g->batch * g->in_ch;
#pragma omp parallel for schedule(static) if (planes * g->out_h * g->out_w > PARALLEL_MIN_LIGHT)
  for (int64_t p = 0; p < planes; p++) {
    const float *xp = x + p * g->in_h * g->in_w;
    for (int64_t oy = 0; oy < g->out_h; oy++) {
      float *yr = y + (p * g->out_h + oy) * g->out_w;
      int32_t *ar = argmax ? argmax + (p * g->out_h + oy) * g->out_w : NULL;
      for (int64_t o0 = 0; o0 < g->out_w; o0 += POOL_ROW_CHUNK) {
        int64_t o1 = o0 + POOL_ROW_CHUNK < g->out_w ? o0 + POOL_ROW_CHUNK : g->out_w;
        float best[POOL_ROW_CHUNK];  // [o1 - o0]
        int32_t at[POOL_ROW_CHUNK];  // [o1 - o0], -1: no tap taken yet
        for (int64_t o = 0; o < o1 - o0; o++) best[o] = -FLT_MAX, at[o] = -1;
        for (int64_t ky = 0; ky < g->kh; ky++) {
          int64_t iy = conv_in_coord(oy, ky, g->stride_h, g->pad_h, g->dil_h);
          if (iy < 0 || iy >= g->in_h) continue;
          for (int64_t kx = 0; kx < g->kw; kx++) {
            int64_t lo, hi;
            pool_out_range(kx, g->stride_w, g->pad_w, g->dil_w, g->in_w, o0, o1, &lo, &hi);
            int64_t shift = iy * g->in_w + conv_in_coord(0, kx, g->stride_w, g->pad_w, g->dil_w);
            if (g->stride_w == 2)  // ResNet's stem pool: a constant stride vectorizes the gather
              pool_row_taps(xp, best - o0, at - o0, shift, 2, lo, hi);
            else pool_row_taps(xp, best - o0, at - o0, shift, g->stride_w, lo, hi);
          }
        }
        memcpy(yr + o0, best, (size_t)(o1 - o0) * sizeof *best);
        if (argmax) memcpy(ar + o0, at, (size_t)(o1 - o0) * sizeof *at);
      }
    }
  }
}

void cpu_dwconv_forward(const float *x, const float *w, const float *bias, float *y, const DwConvGeom *g) {
  int64_t HW = g->H * g->W;
#pragma omp parallel for schedule(static) if (g->planes * HW * g->k * g->k > PARALLEL_MIN_LIGHT)
  for (int64_t p = 0; p < g->planes; p++) {
    int64_t c = p % g->channels;
    const float *wc = w + c * g->k * g->k;
    float b = bias ? bias[c] : 0.0f;
    for (int64_t i = 0; i < HW; i++)
      y[p * HW + i] = dwconv_at(x + p * HW, wc, g->H, g->W, g->k, i / g->W, i % g->W) + b;
  }
}

void cpu_dwconv_backward(const float *x, const float *w, const float *dy, float *dx, float *dw, float *dbias,
                         const DwConvGeom *g) {
  int64_t HW = g->H * g->W, kk = (int64_t)g->k * g->k, images = g->planes / g->channels;
  if (dx) {
#pragma omp parallel for schedule(static) if (g->planes * HW * kk > PARALLEL_MIN_LIGHT)
    for (int64_t p = 0; p < g->planes; p++) {
      const float *wc = w + (p % g->channels) * kk;
      for (int64_t i = 0; i < HW; i++)
        dx[p * HW + i] += dwconv_input_grad_at(dy + p * HW, wc, g->H, g->W, g->k, i / g->W, i % g->W);
    }
  }
  if (dw) {  // one (channel, tap) per iteration: the images in order, so the sum is deterministic
#pragma omp parallel for schedule(static) if (g->planes * HW * kk > PARALLEL_MIN_LIGHT)
    for (int64_t ct = 0; ct < g->channels * kk; ct++) {
      int64_t c = ct / kk, tap = ct % kk;
      double acc = 0.0;
      for (int64_t m = 0; m < images; m++) {
        int64_t p = m * g->channels + c;
        acc += dwconv_weight_grad_part(x + p * HW, dy + p * HW, g->H, g->W, g->k, (int)(tap / g->k), (int)(tap % g->k),
                                       0, 1);
      }
      dw[ct] += (float)acc;
    }
  }
  if (dbias) {
    for (int64_t c = 0; c < g->channels; c++) {
      double acc = 0.0;
      for (int64_t m = 0; m < images; m++)
        for (int64_t i = 0; i < HW; i++) acc += dy[(m * g->channels + c) * HW + i];
      dbias[c] += (float)acc;
    }
  }
}

void cpu_maxpool2d_backward(const float *dy, const int32_t *argmax, float *dx, const ConvGeom *g) {
  int64_t planes = g->batch * g->in_ch, out_plane = g->out_h * g->out_w;
  if (g->channels_last) {  // per image, outputs in order: each element's terms in the nchw order
    int64_t C = g->in_ch, in_plane = g->in_h * g->in_w;
#pragma omp parallel for schedule(static) if (planes * out_plane > PARALLEL_MIN_LIGHT)
    for (int64_t b = 0; b < g->batch; b++)
      for (int64_t o = 0; o < out_plane; o++) {
        const int32_t *at = argmax + (b * out_plane + o) * C;
        const float *d = dy + (b * out_plane + o) * C;
        float *dxb = dx + b * in_plane * C;
        for (int64_t c = 0; c < C; c++)
          if (at[c] >= 0) dxb[at[c] * C + c] += d[c];
      }
    return;
  }
#pragma omp parallel for schedule(static) if (planes * out_plane > PARALLEL_MIN_LIGHT)
  for (int64_t p = 0; p < planes; p++) {
    float *dxp = dx + p * g->in_h * g->in_w;
    for (int64_t o = 0; o < out_plane; o++) {
      int32_t at = argmax[p * out_plane + o];
      if (at >= 0) dxp[at] += dy[p * out_plane + o];
    }
  }
}

// The ReLU's mask 8 elements at a time (kernels/norm_math.h's bits): the byte of y[0..7], and dy
// gated by a byte - frozen_bn_relu_grad's dy or +0 per bit. As loops over bits neither vectorizes
// (the backward ran 4x slower than reading y); SSE2 (every x86-64) compares and selects 4 lanes at
// once. The same bits either way (test_ops: frozen_bn_channels_last_matches_nchw).
#if defined(__SSE2__)
#include <emmintrin.h>
static inline uint8_t relu_mask_byte8(const float *y) {
  __m128 zero = _mm_setzero_ps();
  int lo = _mm_movemask_ps(_mm_cmpgt_ps(_mm_loadu_ps(y), zero));
  int hi = _mm_movemask_ps(_mm_cmpgt_ps(_mm_loadu_ps(y + 4), zero));
  return (uint8_t)(lo | hi << 4);
}
static inline void relu_gate8(uint8_t bits, const float *dy, float *g) {
  __m128i b = _mm_set1_epi32(bits), lo = _mm_set_epi32(8, 4, 2, 1), hi = _mm_set_epi32(128, 64, 32, 16);
  __m128 keep_lo = _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(b, lo), lo));
  __m128 keep_hi = _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_and_si128(b, hi), hi));
  _mm_storeu_ps(g, _mm_and_ps(keep_lo, _mm_loadu_ps(dy)));
  _mm_storeu_ps(g + 4, _mm_and_ps(keep_hi, _mm_loadu_ps(dy + 4)));
}
#else
static inline uint8_t relu_mask_byte8(const float *y) { return relu_mask_byte(y, 8); }
static inline void relu_gate8(uint8_t bits, const float *dy, float *g) {
  for (int t = 0; t < 8; t++) g[t] = frozen_bn_relu_grad((bits >> t) & 1, dy[t]);
}
#endif

// x, y [B, C, S] as rows for both kernels below: with S > 1 a row is one channel's plane (its
// scale and shift one number), with S == 1 (channels last: [B*H*W, C, 1]) a row holds one pixel's
// C channels (a scale and shift per element).

void cpu_frozen_bn_forward(const float *x, const float *weight, const float *bias, const float *mean, const float *var,
                           float eps, const float *residual, bool relu, float *y, uint8_t *relu_mask, float *scale,
                           int64_t batch, int64_t channels, int64_t spatial) {
  // scale [C] is an output (kept for backward), shift [C] a temporary: each computed once.
  float *shift = detr_malloc((size_t)(channels > 0 ? channels : 1) * sizeof(float), "frozen batch-norm shifts");
  for (int64_t c = 0; c < channels; c++)
    frozen_bn_scale_shift(weight[c], bias[c], mean[c], var[c], eps, &scale[c], &shift[c]);
  bool last = spatial == 1;
  int64_t rows = last ? batch : batch * channels, n = last ? channels : spatial;
  uint8_t *mask = relu ? relu_mask : NULL;
  bool row_bytes = n % 8 == 0;  // each row's mask is whole bytes of its own: written with the row, still in cache
#pragma omp parallel for schedule(static) if (rows * n > PARALLEL_MIN_LIGHT)
  for (int64_t r = 0; r < rows; r++) {
    const float *sc = last ? scale : scale + r % channels, *sh = last ? shift : shift + r % channels;
    const float *xp = x + r * n, *rp = residual ? residual + r * n : NULL;
    float *yp = y + r * n;
    if (last)
      for (int64_t i = 0; i < n; i++) yp[i] = frozen_bn_act_elem(xp[i], sc[i], sh[i], rp, i, relu);
    else
      for (int64_t i = 0; i < n; i++) yp[i] = frozen_bn_act_elem(xp[i], sc[0], sh[0], rp, i, relu);
    if (mask && row_bytes)
      for (int64_t i = 0; i < n; i += 8) mask[(r * n + i) / 8] = relu_mask_byte8(yp + i);
  }
  if (mask && !row_bytes) {
    int64_t total = rows * n, bytes = (total + 7) / 8;
#pragma omp parallel for schedule(static) if (total > PARALLEL_MIN_LIGHT)
    for (int64_t j = 0; j < bytes; j++) mask[j] = relu_mask_byte(y + 8 * j, total - 8 * j);
  }
  free(shift);
}

void cpu_frozen_bn_backward(const uint8_t *relu_mask, const float *dy, const float *scale, bool relu, float *dx,
                            bool set_dx, float *dresidual, bool set_dresidual, int64_t batch, int64_t channels,
                            int64_t spatial) {
  // The flags, `last` too, are loop-invariant (GCC unswitches them). Each chunk is read (gated
  // into `gate`, or read through g = dy) before it is written: dresidual may be dy itself where it
  // is written, dx only without dresidual (kernel_twins.h).
  bool last = spatial == 1;
  int64_t rows = last ? batch : batch * channels, n = last ? channels : spatial;
  bool bytes = n % 8 == 0;  // rows of whole mask bytes: 8 elements a byte
#pragma omp parallel for schedule(static) if (rows * n > PARALLEL_MIN_LIGHT)
  for (int64_t r = 0; r < rows; r++) {
    const float *sc = last ? scale : scale + r % channels;
    // In chunks: dy through the ReLU into g (mask bytes, 8 elements at a time), then the two
    // gradients from g in loops GCC vectorizes as it did on dy itself.
    enum { CHUNK = 256 };
    float gate[CHUNK];
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
      int64_t len = n - i0 < CHUNK ? n - i0 : CHUNK;
      const float *dyp = dy + r * n + i0, *g = dyp;
      float *dxp = dx ? dx + r * n + i0 : NULL, *drp = dresidual ? dresidual + r * n + i0 : NULL;
      const float *scp = last ? sc + i0 : sc;
      if (relu && bytes) {
        for (int64_t t = 0; t < len; t += 8) relu_gate8(relu_mask[(r * n + i0 + t) / 8], dyp + t, gate + t);
        g = gate;
      } else if (relu) {
        for (int64_t t = 0; t < len; t++)
          gate[t] = frozen_bn_relu_grad(relu_mask_bit(relu_mask, r * n + i0 + t), dyp[t]);
        g = gate;
      }
      if (dxp)
        for (int64_t t = 0; t < len; t++) {
          float gs = g[t] * scp[last ? t : 0];
          dxp[t] = set_dx ? gs : dxp[t] + gs;
        }
      if (drp)
        for (int64_t t = 0; t < len; t++) drp[t] = set_dresidual ? g[t] : drp[t] + g[t];
    }
  }
}
