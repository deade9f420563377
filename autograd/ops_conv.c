// 2-D convolution (oneDNN or im2col + sgemm on CPU, cuDNN on CUDA), max pooling, frozen batch norm.
#include "autograd/op_util.h"

// x is [B, C, H, W], or [B, H, W, C] when channels_last.
static ConvGeom conv_geometry(const char *op, Shape x, bool channels_last, int64_t out_ch, int64_t kh, int64_t kw,
                              int sh, int sw, int ph, int pw, int dh, int dw) {
  char s[64];
  DETR_CHECK(x.ndim == 4, "%s: input must be %s, got %s", op, channels_last ? "[B, H, W, C]" : "[B, C, H, W]",
             shape_str(x, s, sizeof s));
  DETR_CHECK(sh > 0 && sw > 0 && dh > 0 && dw > 0 && ph >= 0 && pw >= 0,
             "%s: stride and dilation must be positive and padding non-negative", op);
  int c = channels_last ? 3 : 1, h = channels_last ? 1 : 2;
  ConvGeom g = {.batch = x.d[0],
                .in_ch = x.d[c],
                .in_h = x.d[h],
                .in_w = x.d[h + 1],
                .out_ch = out_ch < 0 ? x.d[c] : out_ch,
                .kh = kh,
                .kw = kw,
                .stride_h = sh,
                .stride_w = sw,
                .pad_h = ph,
                .pad_w = pw,
                .dil_h = dh,
                .dil_w = dw,
                .channels_last = channels_last};
  g.out_h = conv_out_size(g.in_h, kh, sh, ph, dh);
  g.out_w = conv_out_size(g.in_w, kw, sw, pw, dw);
  DETR_CHECK(g.out_h > 0 && g.out_w > 0, "%s: %lldx%lld input is smaller than the %lldx%lld kernel", op,
             (long long)g.in_h, (long long)g.in_w, (long long)kh, (long long)kw);
  return g;
}

// The output shape of g: [B, O, HO, WO] or, channels last, [B, HO, WO, O].
static Shape conv_out_shape(const ConvGeom *g) {
  return g->channels_last ? SHAPE(g->batch, g->out_h, g->out_w, g->out_ch)
                          : SHAPE(g->batch, g->out_ch, g->out_h, g->out_w);
}

// --- conv2d ---

#if DETR_HAVE_CUDA
// cuDNN's workspace comes from the caching allocator like any tensor, rounded up to a power of two
// (from 1 MiB) so that a few cached blocks serve the workspaces of every geometry a multi-scale
// run meets; it goes back to the cache as soon as the call is queued (on the one stream, whatever
// reuses the block runs after the convolution).
static size_t conv_workspace_block(size_t bytes) {
  if (bytes == 0) return 0;
  size_t block = (size_t)1 << 20;
  while (block < bytes) block *= 2;
  return block;
}

static void conv2d_forward_cuda(const float *x, const float *w, const float *bias, float *y, const ConvGeom *g) {
  size_t bytes = conv_workspace_block(cuda_conv2d_forward_workspace(g));
  void *ws = bytes ? detr_alloc(DEVICE_CUDA, bytes) : NULL;
  cuda_conv2d_forward(x, w, bias, y, g, ws, bytes);
  detr_free(DEVICE_CUDA, ws, bytes);
}

static void conv2d_backward_cuda(const float *x, const float *w, const float *dy, float *dx, bool set_dx, float *dw,
                                 bool set_dw, float *db, const ConvGeom *g) {
  size_t bytes = conv_workspace_block(cuda_conv2d_backward_workspace(g, dx != NULL, dw != NULL));
  void *ws = bytes ? detr_alloc(DEVICE_CUDA, bytes) : NULL;
  cuda_conv2d_backward(x, w, dy, dx, set_dx, dw, set_dw, db, g, ws, bytes);
  detr_free(DEVICE_CUDA, ws, bytes);
}
#endif

// bf16 mode on the CPU: each pass that runs in bf16 rounds the activations it reads, and x is read
// by the forward and backward-weights, dy by backward-data and backward-weights. Where both of x's
// passes take a rounded copy (cpu_conv2d_takes_bf16), the forward rounds x once and the node keeps
// the copy (n->buf) in place of x; the backward rounds dy once for its passes. The same bits. What
// it buys is memory, not time: x lives on as 2 bytes an element (frozen batch norm keeps only a bit
// mask of it), detr-r50@512's bf16 step peaks 91 MB lower; the conversions it saves were cache-hot
// per-image copies, and the kept copy is read back from memory instead, so the step takes as long
// (bench/README.md#bench_step, `--precision bf16`).
static bool conv2d_keeps_x16(const Tensor *x, const Tensor *weight, const ConvGeom *g) {
  return x->device == DEVICE_CPU && x->numel > 0 && g->out_h * g->out_w * g->out_ch > 0 && autograd_grad_enabled() &&
         weight->requires_grad && cpu_conv2d_takes_bf16(g, CONV_PASS_FWD) &&
         cpu_conv2d_takes_bf16(g, CONV_PASS_BWD_WEIGHTS);
}

// dy's copy serves where two passes read it, or where backward-weights' GEMM reads x's (it takes both).
static bool conv2d_rounds_dy(const ConvGeom *g, bool dx, bool dw, bool x16) {
  if (!dw || g->batch * g->out_ch * g->out_h * g->out_w == 0 || g->in_ch == 0) return false;  // nothing runs
  if (!cpu_conv2d_takes_bf16(g, CONV_PASS_BWD_WEIGHTS)) return false;
  return x16 || (dx && cpu_conv2d_takes_bf16(g, CONV_PASS_BWD_DATA));
}

static void conv2d_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *w = n->in[1], *bias = n->in[2], *y = n->out[0];
  ConvGeom g = *NODE_ATTRS(n, ConvGeom);  // conv2d's and maxpool2d's attributes: the geometry
  bool set_dx, set_dw;                    // no gradient yet: the kernel writes it instead of adding to zeros
  float *dx = autograd_grad_to_write(x, &set_dx), *dw = autograd_grad_to_write(w, &set_dw);
  float *db = grad_data_or_null(bias);
  if (x->device == DEVICE_CPU) {
    const uint16_t *x16 = n->buf;            // x rounded by the forward (conv2d_keeps_x16), or NULL
    const float *xf = x16 ? NULL : x->data;  // not kept with the copy
    size_t dy16_bytes =
        conv2d_rounds_dy(&g, dx != NULL, dw != NULL, x16 != NULL) ? (size_t)y->numel * sizeof(uint16_t) : 0;
    uint16_t *dy16 = dy16_bytes ? detr_alloc(DEVICE_CPU, dy16_bytes) : NULL;  // [B, HO, WO, O], rounded there
    int64_t ws_floats = cpu_conv2d_backward_workspace_floats(&g, dx != NULL, set_dx, dw != NULL, set_dw, db != NULL);
    float *ws = detr_alloc(DEVICE_CPU, (size_t)ws_floats * sizeof(float));
    cpu_conv2d_backward(xf, x16, w->data, y->grad->data, dy16, dx, set_dx, dw, set_dw, db, &g, ws);
    detr_free(DEVICE_CPU, ws, (size_t)ws_floats * sizeof(float));
    detr_free(DEVICE_CPU, dy16, dy16_bytes);
  } else {
    DISPATCH(x->device, (void)0, conv2d_backward_cuda(x->data, w->data, y->grad->data, dx, set_dx, dw, set_dw, db, &g));
  }
}

Tensor *op_conv2d(Tensor *x, Tensor *weight, Tensor *bias, Conv2dParams p) {
  check_same_device("conv2d", x, weight);
  char sx[64], sw[64];
  DETR_CHECK(weight->shape.ndim == 4 && x->shape.ndim == 4 && weight->shape.d[1] == x->shape.d[p.channels_last ? 3 : 1],
             "conv2d: input %s%s does not fit weight %s", shape_str(x->shape, sx, sizeof sx),
             p.channels_last ? " (channels last)" : "", shape_str(weight->shape, sw, sizeof sw));
  if (bias) {
    check_same_device("conv2d", x, bias);
    DETR_CHECK(bias->numel == weight->shape.d[0], "conv2d: bias has %lld elements for %lld outputs",
               (long long)bias->numel, (long long)weight->shape.d[0]);
  }
  ConvGeom g = conv_geometry("conv2d", x->shape, p.channels_last, weight->shape.d[0], weight->shape.d[2],
                             weight->shape.d[3], p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w);
  Tensor *y = tensor_new_scoped(x->device, conv_out_shape(&g));
  const float *bias_data = bias ? bias->data : NULL;
  uint16_t *x16 = NULL;  // x rounded once, kept by the node (conv2d_keeps_x16; cpu_conv2d_x16_numel)
  size_t x16_bytes = 0;
  if (x->device == DEVICE_CPU) {
    if (conv2d_keeps_x16(x, weight, &g)) {
      x16_bytes = (size_t)cpu_conv2d_x16_numel(&g) * sizeof(uint16_t);
      x16 = detr_alloc(DEVICE_CPU, x16_bytes);  // rounded by the forward
    }
    int64_t ws_floats = cpu_conv2d_forward_workspace_floats(&g, bias_data != NULL);
    float *ws = detr_alloc(DEVICE_CPU, (size_t)ws_floats * sizeof(float));
    cpu_conv2d_forward(x->data, x16, weight->data, bias_data, y->data, &g, ws);
    detr_free(DEVICE_CPU, ws, (size_t)ws_floats * sizeof(float));
  } else {
    DISPATCH(x->device, (void)0, conv2d_forward_cuda(x->data, weight->data, bias_data, y->data, &g));
  }
  Tensor *in[3] = {x, weight, bias};
  TapeNode *n = autograd_record("conv2d", conv2d_backward_node, y, 3, in);
  if (n) {
    *NODE_ATTRS(n, ConvGeom) = g;
    if (weight->requires_grad && !x16) autograd_save(n, x);  // dW = dY x im2col(x); the output is never read
    if (x->requires_grad) autograd_save(n, weight);
    n->flops = 2.0 * (double)(g.batch * g.out_ch * g.out_h * g.out_w) * (double)(g.in_ch * g.kh * g.kw);
  }
  if (x16) node_take_block(n, DEVICE_CPU, x16, x16_bytes);  // the node's now (freed where none was recorded)
  return y;
}

// --- inference's convolution with its epilogue: no tape, nothing kept ---

// relu?(conv(x) + bias + residual) into y (a new tensor when NULL; else the residual itself, which
// the convolution then accumulates into in place). pack: weight's kept copies on the CPU, or NULL.
static Tensor *conv2d_fused(Tensor *x, Tensor *weight, Tensor *bias, Tensor *residual, bool relu, Conv2dParams p,
                            ConvWeightPack *pack, bool in_place) {
  DETR_CHECK(!autograd_grad_enabled(), "conv2d_fused: inference only (it has no backward); disable grad mode");
  if (x->device != DEVICE_CPU) {  // the separate ops (no tape with grad off)
    Tensor *y = op_conv2d(x, weight, bias, p);
    if (residual) y = op_add(y, residual);
    return relu ? op_relu(y) : y;
  }
  check_same_device("conv2d_fused", x, weight);
  char sx[64], sw[64], sr[64];
  DETR_CHECK(weight->shape.ndim == 4 && x->shape.ndim == 4 && weight->shape.d[1] == x->shape.d[p.channels_last ? 3 : 1],
             "conv2d_fused: input %s does not fit weight %s", shape_str(x->shape, sx, sizeof sx),
             shape_str(weight->shape, sw, sizeof sw));
  DETR_CHECK(!bias || (bias->device == x->device && bias->numel == weight->shape.d[0]),
             "conv2d_fused: bias must be [%lld] on the input's device", (long long)weight->shape.d[0]);
  ConvGeom g = conv_geometry("conv2d_fused", x->shape, p.channels_last, weight->shape.d[0], weight->shape.d[2],
                             weight->shape.d[3], p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w);
  Shape ys = conv_out_shape(&g);
  if (residual) {
    check_same_device("conv2d_fused", x, residual);
    DETR_CHECK(shape_equal(residual->shape, ys), "conv2d_fused: residual %s does not match the output %s",
               shape_str(residual->shape, sr, sizeof sr), shape_str(ys, sx, sizeof sx));
    DETR_CHECK(!in_place || (residual != x && residual->data != x->data),
               "conv2d_fused_into: the accumulator is the input");
  }
  Tensor *y = in_place ? residual : tensor_new_scoped(x->device, ys);
  const float *b = bias ? bias->data : NULL, *res = residual ? residual->data : NULL;
  int64_t ws_floats = cpu_conv2d_forward_fused_workspace_floats(&g, b != NULL, res != NULL, relu, pack != NULL);
  float *ws = detr_alloc(DEVICE_CPU, (size_t)ws_floats * sizeof(float));
  cpu_conv2d_forward_fused(x->data, weight->data, b, res, relu, y->data, &g, ws, pack);
  detr_free(DEVICE_CPU, ws, (size_t)ws_floats * sizeof(float));
  autograd_profile_op("conv2d_fused");
  return y;
}

Tensor *op_conv2d_fused(Tensor *x, Tensor *weight, Tensor *bias, Tensor *residual, bool relu, Conv2dParams p,
                        ConvWeightPack *pack) {
  return conv2d_fused(x, weight, bias, residual, relu, p, pack, false);
}

Tensor *op_conv2d_fused_into(Tensor *x, Tensor *weight, Tensor *bias, Tensor *acc, bool relu, Conv2dParams p,
                             ConvWeightPack *pack) {
  DETR_CHECK(acc, "conv2d_fused_into: no accumulator");
  return conv2d_fused(x, weight, bias, acc, relu, p, pack, true);
}

// --- depthwise convolution: x and the weight are kept for backward ---

static void dwconv_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *w = n->in[1], *b = n->n_in > 2 ? n->in[2] : NULL, *y = n->out[0];
  DwConvGeom g = *NODE_ATTRS(n, DwConvGeom);
  float *dx = grad_data_or_null(x), *dw = grad_data_or_null(w), *db = b ? grad_data_or_null(b) : NULL;
  DISPATCH(x->device, cpu_dwconv_backward(x->data, w->data, y->grad->data, dx, dw, db, &g),
           cuda_dwconv_backward(x->data, w->data, y->grad->data, dx, dw, db, &g));
}

Tensor *op_depthwise_conv2d(Tensor *x, Tensor *weight, Tensor *bias) {
  DETR_CHECK(x->shape.ndim == 4 && weight->shape.ndim == 4,
             "depthwise_conv2d: x must be [M, C, H, W] and the "
             "weight [C, 1, k, k]");
  int64_t C = x->shape.d[1], k = weight->shape.d[2];
  DETR_CHECK(weight->shape.d[0] == C && weight->shape.d[1] == 1 && weight->shape.d[3] == k && k % 2 == 1,
             "depthwise_conv2d: weight [%lld, %lld, %lld, %lld] for %lld channels: expected [C, 1, k, k], k odd",
             (long long)weight->shape.d[0], (long long)weight->shape.d[1], (long long)weight->shape.d[2],
             (long long)weight->shape.d[3], (long long)C);
  DETR_CHECK(!bias || (bias->shape.ndim == 1 && bias->shape.d[0] == C), "depthwise_conv2d: bias must be [%lld]",
             (long long)C);
  check_same_device("depthwise_conv2d", x, weight);
  if (bias) check_same_device("depthwise_conv2d", x, bias);
  DwConvGeom g = {.planes = x->shape.d[0] * C, .channels = C, .H = x->shape.d[2], .W = x->shape.d[3], .k = (int)k};
  Tensor *y = tensor_new_scoped(x->device, x->shape);
  DISPATCH(x->device, cpu_dwconv_forward(x->data, weight->data, bias ? bias->data : NULL, y->data, &g),
           cuda_dwconv_forward(x->data, weight->data, bias ? bias->data : NULL, y->data, &g));
  Tensor *in[3] = {x, weight, bias};
  TapeNode *n = autograd_record("depthwise_conv2d", dwconv_backward_node, y, bias ? 3 : 2, in);
  if (n) {
    *NODE_ATTRS(n, DwConvGeom) = g;
    if (weight->requires_grad) autograd_save(n, x);  // dW reads x; dx reads the weight
    if (x->requires_grad) autograd_save(n, weight);
  }
  return y;
}

// --- max pooling: argmax indices (int32, per plane) are kept for backward ---

static void maxpool_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *y = n->out[0];
  ConvGeom g = *NODE_ATTRS(n, ConvGeom);
  float *dx = grad_data_or_null(x);
  if (!dx) return;
  DISPATCH(x->device, cpu_maxpool2d_backward(y->grad->data, n->buf, dx, &g),
           cuda_maxpool2d_backward(y->grad->data, n->buf, dx, &g));
}

Tensor *op_maxpool2d(Tensor *x, int kernel, int stride, int pad, bool channels_last) {
  DETR_CHECK(kernel > 0 && 2 * pad <= kernel, "maxpool2d: padding %d is more than half the kernel %d", pad, kernel);
  ConvGeom g = conv_geometry("maxpool2d", x->shape, channels_last, -1, kernel, kernel, stride, stride, pad, pad, 1, 1);
  Tensor *y = tensor_new_scoped(x->device, conv_out_shape(&g));
  // The indices only for a backward (y's shape, on x's device): inference keeps none.
  size_t idx_bytes = autograd_records(1, &x) ? (size_t)y->numel * sizeof(int32_t) : 0;
  int32_t *argmax = idx_bytes ? detr_alloc(x->device, idx_bytes) : NULL;
  DISPATCH(x->device, cpu_maxpool2d_forward(x->data, y->data, argmax, &g),
           cuda_maxpool2d_forward(x->data, y->data, argmax, &g));
  TapeNode *n = autograd_record("maxpool2d", maxpool_backward_node, y, 1, &x);
  if (n) *NODE_ATTRS(n, ConvGeom) = g;
  if (argmax) node_take_block(n, x->device, argmax, idx_bytes);  // the node owns the indices now
  return y;
}

// --- frozen batch norm: y = relu?(x * scale[c] + shift[c] + residual); the statistics take no
// gradient ---

typedef struct {
  bool relu;
  int64_t batch, channels, spatial;  // the kernels' [B, C, S] view of x
} FrozenBnAttrs;

static void frozen_bn_backward_node(TapeNode *n) {
  Tensor *x = n->in[0], *residual = n->n_in > 1 ? n->in[1] : NULL, *y = n->out[0], *scale = n->saved[0];
  FrozenBnAttrs a = *NODE_ATTRS(n, FrozenBnAttrs);
  bool relu = a.relu;
  int64_t B = a.batch, C = a.channels, S = a.spatial;
  // The residual's gradient is g = relu'(y) dy, x's is g * scale: an op-made input without a
  // gradient yet takes dy's buffer (dead after this node; autograd_grad_take) and the kernel writes
  // its gradient there in place - no zero fill, no add pass. The residual first (x's gradient is
  // computed from dy before the residual's overwrites it); x only where there is no residual.
  bool take_res = residual && residual != x && autograd_grad_take(residual, y->grad);
  bool take_x = !residual && autograd_grad_take(x, y->grad);
  float *dres = take_res ? y->grad->data : residual ? grad_data_or_null(residual) : NULL;
  float *dx = take_x ? y->grad->data : grad_data_or_null(x);
  if (!dx && !dres) return;
  const uint8_t *mask = n->buf;  // the ReLU's, under ReLU
  DISPATCH(x->device,
           cpu_frozen_bn_backward(mask, y->grad->data, scale->data, relu, dx, take_x, dres, take_res, B, C, S),
           cuda_frozen_bn_backward(mask, y->grad->data, scale->data, relu, dx, take_x, dres, take_res, B, C, S));
}

Tensor *op_frozen_batchnorm2d_act(Tensor *x, Tensor *weight, Tensor *bias, Tensor *running_mean, Tensor *running_var,
                                  float eps, Tensor *residual, bool relu, bool channels_last) {
  char s[64], sr[64];
  DETR_CHECK(x->shape.ndim == 4, "frozen_batchnorm2d: input must be %s, got %s",
             channels_last ? "[B, H, W, C]" : "[B, C, H, W]", shape_str(x->shape, s, sizeof s));
  // The kernels see [B, C, S]; channels last is [B*H*W, C, 1].
  int64_t C = x->shape.d[channels_last ? 3 : 1], S = channels_last ? 1 : x->shape.d[2] * x->shape.d[3];
  int64_t B = x->numel / (C * S > 0 ? C * S : 1);
  Tensor *stats[4] = {weight, bias, running_mean, running_var};
  for (int i = 0; i < 4; i++) {
    check_same_device("frozen_batchnorm2d", x, stats[i]);
    DETR_CHECK(stats[i]->numel == C,
               "frozen_batchnorm2d: statistic %d has %lld elements for %lld "
               "channels",
               i, (long long)stats[i]->numel, (long long)C);
  }
  if (residual) {
    check_same_device("frozen_batchnorm2d", x, residual);
    DETR_CHECK(shape_equal(residual->shape, x->shape), "frozen_batchnorm2d: residual %s does not match input %s",
               shape_str(residual->shape, sr, sizeof sr), shape_str(x->shape, s, sizeof s));
  }
  Tensor *y = tensor_new_scoped(x->device, x->shape);
  Tensor *scale = tensor_new_scoped(x->device, SHAPE(C));
  const float *res = residual ? residual->data : NULL;
  // The ReLU's mask for the backward: bits (kernels/norm_math.h), not y itself, which then lives
  // only as long as its readers need it (bf16 mode's next convolution keeps a bf16 copy instead).
  Tensor *inputs[2] = {x, residual};
  size_t mask_bytes = relu && autograd_records(residual ? 2 : 1, inputs) ? (size_t)(x->numel + 7) / 8 : 0;
  uint8_t *mask = mask_bytes ? detr_alloc(x->device, mask_bytes) : NULL;
  DISPATCH(x->device,
           cpu_frozen_bn_forward(x->data, weight->data, bias->data, running_mean->data, running_var->data, eps, res,
                                 relu, y->data, mask, scale->data, B, C, S),
           cuda_frozen_bn_forward(x->data, weight->data, bias->data, running_mean->data, running_var->data, eps, res,
                                  relu, y->data, mask, scale->data, B, C, S));
  const char *name = residual ? (relu ? "frozen_bn_add_relu" : "frozen_bn_add")
                     : relu   ? "frozen_bn_relu"
                              : "frozen_batchnorm2d";
  TapeNode *n = autograd_record(name, frozen_bn_backward_node, y, residual ? 2 : 1, inputs);
  if (n) {
    *NODE_ATTRS(n, FrozenBnAttrs) = (FrozenBnAttrs){.relu = relu, .batch = B, .channels = C, .spatial = S};
    autograd_save(n, scale);
  }
  if (mask) node_take_block(n, x->device, mask, mask_bytes);  // the node's (freed where none was recorded)
  return y;
}

Tensor *op_frozen_batchnorm2d(Tensor *x, Tensor *weight, Tensor *bias, Tensor *running_mean, Tensor *running_var,
                              float eps) {
  return op_frozen_batchnorm2d_act(x, weight, bias, running_mean, running_var, eps, NULL, false, false);
}
