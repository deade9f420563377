// 2-D convolution on cuDNN (v9, legacy convolution API), and the custom max-pooling and frozen
// batch-norm kernels (kernels/cpu/conv.c's twins). Convolution: NCHW or NHWC float32,
// cross-correlation (as torch), one group. Forward = cudnnConvolutionForward + a bias kernel;
// backward = cudnnConvolutionBackwardData / BackwardFilter with beta = 1 (gradients accumulate, as
// the CPU kernels; beta = 0 for a fresh dx or dw, set_dx / set_dw) and a deterministic
// bias-gradient kernel.
//
// Arithmetic: the convolution descriptor's math type is CUDNN_FMA_MATH, which restricts cuDNN to
// fp32 FMA kernels, so results agree with the CPU's im2col + sgemm to fp32 rounding. With TF32 on
// (cuda_set_tf32, the `tf32` config key) it is CUDNN_DEFAULT_MATH, which lets cuDNN run fp32
// convolutions on TF32 tensor cores on sm_80+ (inputs rounded to a 10-bit mantissa), as PyTorch's
// torch.backends.cudnn.allow_tf32. With bf16 on (cuda_set_bf16, the `bf16` config key) x, w and dy
// are rounded to the nearest bf16 (kernels/bf16_math.h; the CPU's oneDNN conversion rounds the same
// way but takes denormal inputs as zero) into staging copies, cuDNN runs on bf16 tensors with fp32
// accumulation (its BFLOAT16 configuration, tensor-core math), and its bf16 result - y, dx or dw -
// is widened back into the fp32 tensor (set, or added to a gradient). cuDNN's legacy API has no
// bf16-in, fp32-out convolution, so unlike the CPU's the output is rounded to bf16 as well
// (PyTorch's autocast does the same).
//
// Algorithms: with DETR_CUDNN_DETERMINISTIC unset or anything but "0" (the default), the
// deterministic IMPLICIT_PRECOMP_GEMM / BWD_DATA_ALGO_1 / BWD_FILTER_ALGO_1 are used (bitwise
// identical results run to run); should one not support a geometry, or need more workspace than
// the limit, the first deterministic algorithm of cuDNN's heuristics that fits is taken instead.
// With DETR_CUDNN_DETERMINISTIC=0 the heuristics' first usable choice that fits the limit is
// taken (possibly faster, possibly with atomics). The limit is DETR_CUDNN_WORKSPACE_MB (default
// 1024 MiB); when no candidate fits, the one with the smallest workspace (kernels/conv_algo.h).
// Choices and their workspace sizes are cached per geometry.
//
// Workspace: the caller passes it in (autograd/ops_conv.c takes it from the caching allocator,
// tensor/alloc.c, and gives it back once the call is queued), so it is reused across calls like
// any tensor, counted in the allocator's statistics, and an out-of-memory empties the cache and
// retries instead of failing. cuda_conv2d_{forward,backward}_workspace say how much: the
// algorithm's, plus for channels last one KRSC copy of the weight per pass that reads it or writes
// dw, or in bf16 the staging copies (outside DETR_CUDNN_WORKSPACE_MB, which bounds the algorithms'
// share).
//
// Not thread-safe (like the rest of the backend: one stream, driven from one host thread).
#include <float.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/bf16_math.h"
#include "kernels/conv_algo.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_util.cuh"
#include "kernels/norm_math.h"

static int conv_int(int64_t v, const char *what) {
  DETR_CHECK(v >= 0 && v <= INT_MAX, "conv2d (cuDNN): %s = %lld does not fit an int", what, (long long)v);
  return (int)v;
}

static bool cudnn_deterministic(void) {
  const char *v = getenv("DETR_CUDNN_DETERMINISTIC");
  return !(v && v[0] == '0' && v[1] == '\0');
}

// The workspace an algorithm may ask for: DETR_CUDNN_WORKSPACE_MB (MiB), default 1 GiB.
static size_t cudnn_workspace_limit(void) {
  const char *v = getenv("DETR_CUDNN_WORKSPACE_MB");
  if (v && *v) {
    char *end = NULL;
    unsigned long long mb = strtoull(v, &end, 10);
    DETR_CHECK(end != v && *end == 0 && mb < (1ull << 40), "DETR_CUDNN_WORKSPACE_MB=%s: expected a number of MiB", v);
    return (size_t)mb << 20;
  }
  return (size_t)1024 << 20;
}

// The arithmetic of a convolution: fp32 FMA, TF32 tensor cores, or bf16 tensors (bf16 overrides TF32).
enum ConvMath { CONV_MATH_FP32, CONV_MATH_TF32, CONV_MATH_BF16 };

static ConvMath current_math(void) {
  return cuda_bf16_enabled() ? CONV_MATH_BF16 : detr_cuda_tf32() ? CONV_MATH_TF32 : CONV_MATH_FP32;
}

// --- descriptors: created per call from the geometry, destroyed on scope exit ---

struct ConvDescs {
  cudnnTensorDescriptor_t x, y;  // x [B, C, H, W], y [B, O, HO, WO]
  cudnnFilterDescriptor_t w;     // w [O, C, KH, KW]
  cudnnConvolutionDescriptor_t conv;

  ConvDescs(const ConvGeom *g, ConvMath math) {
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    int B = conv_int(g->batch, "batch"), C = conv_int(g->in_ch, "in_ch");
    int O = conv_int(g->out_ch, "out_ch");
    // Channels last: NHWC activations and an NHWC (KRSC) filter, the weight permuted so per call
    // (conv_weight_tap_major; PyTorch, too, gives cuDNN a channels-last weight with channels-last
    // activations rather than mixing the formats).
    cudnnTensorFormat_t act = g->channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    // bf16: cuDNN's BFLOAT16 configuration (x, w, y bf16; the fp32 accumulation is the convolution
    // descriptor's compute type below).
    cudnnDataType_t data = math == CONV_MATH_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, act, data, B, C, conv_int(g->in_h, "in_h"), conv_int(g->in_w, "in_w")));
    CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(y, act, data, B, O, conv_int(g->out_h, "out_h"), conv_int(g->out_w, "out_w")));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, data, act, O, C, conv_int(g->kh, "kh"), conv_int(g->kw, "kw")));
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, g->pad_h, g->pad_w, g->stride_h, g->stride_w, g->dil_h, g->dil_w,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionMathType(conv, math == CONV_MATH_FP32   ? CUDNN_FMA_MATH
                                                  : math == CONV_MATH_TF32 ? CUDNN_DEFAULT_MATH
                                                                           : CUDNN_TENSOR_OP_MATH));
    // The geometry's output size (torch's formula) must be the one cuDNN computes.
    int on, oc, oh, ow;
    CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv, x, w, &on, &oc, &oh, &ow));
    DETR_CHECK(on == B && oc == O && oh == g->out_h && ow == g->out_w,
               "conv2d (cuDNN): output [%d, %d, %d, %d] differs from the geometry's "
               "[%lld, %lld, %lld, %lld]",
               on, oc, oh, ow, (long long)g->batch, (long long)g->out_ch, (long long)g->out_h, (long long)g->out_w);
  }
  ~ConvDescs() {
    CUDNN_CHECK(cudnnDestroyConvolutionDescriptor(conv));
    CUDNN_CHECK(cudnnDestroyFilterDescriptor(w));
    CUDNN_CHECK(cudnnDestroyTensorDescriptor(y));
    CUDNN_CHECK(cudnnDestroyTensorDescriptor(x));
  }
  ConvDescs(const ConvDescs &) = delete;
  ConvDescs &operator=(const ConvDescs &) = delete;
};

// --- algorithm choice and its workspace, cached per (geometry, determinism, math) ---

#define ALGO_UNSET (-1)

struct AlgoCacheEntry {
  ConvGeom g;
  bool deterministic;
  ConvMath math;
  int fwd, bwd_data, bwd_filter;  // ALGO_UNSET until first chosen
  size_t fwd_bytes, bwd_data_bytes, bwd_filter_bytes;
  int64_t calls[3];  // each pass's runs (a ConvPass index), for cuda_conv2d_survey
};

#define ALGO_CACHE_SIZE 256
static AlgoCacheEntry g_algo_cache[ALGO_CACHE_SIZE];
static int g_algo_cache_count = 0, g_algo_cache_next = 0;

static bool geom_equal(const ConvGeom *a, const ConvGeom *b) {
  return a->batch == b->batch && a->in_ch == b->in_ch && a->in_h == b->in_h && a->in_w == b->in_w &&
         a->out_ch == b->out_ch && a->kh == b->kh && a->kw == b->kw && a->out_h == b->out_h && a->out_w == b->out_w &&
         a->stride_h == b->stride_h && a->stride_w == b->stride_w && a->pad_h == b->pad_h && a->pad_w == b->pad_w &&
         a->dil_h == b->dil_h && a->dil_w == b->dil_w && a->channels_last == b->channels_last;
}

static AlgoCacheEntry *algo_cache_entry(const ConvGeom *g, bool deterministic, ConvMath math) {
  for (int i = 0; i < g_algo_cache_count; i++)
    if (g_algo_cache[i].deterministic == deterministic && g_algo_cache[i].math == math &&
        geom_equal(&g_algo_cache[i].g, g))
      return &g_algo_cache[i];
  // Not cached: take a free slot, or replace the oldest once full (the choice is recomputable).
  int slot = g_algo_cache_count < ALGO_CACHE_SIZE ? g_algo_cache_count++ : g_algo_cache_next;
  g_algo_cache_next = (slot + 1) % ALGO_CACHE_SIZE;
  AlgoCacheEntry *e = &g_algo_cache[slot];
  e->g = *g;
  e->deterministic = deterministic;
  e->math = math;
  e->fwd = e->bwd_data = e->bwd_filter = ALGO_UNSET;
  e->fwd_bytes = e->bwd_data_bytes = e->bwd_filter_bytes = 0;
  e->calls[0] = e->calls[1] = e->calls[2] = 0;
  return e;
}

// The entry for g under the current settings.
static AlgoCacheEntry *current_entry(const ConvGeom *g) {
  return algo_cache_entry(g, cudnn_deterministic(), current_math());
}

// The chooser lists the candidates - the preferred deterministic algorithm first (when
// determinism is required), then cuDNN's heuristic order - with their workspace sizes, and takes
// conv_algo_pick's choice (kernels/conv_algo.h): the first usable (deterministic) one within the
// workspace limit, else the smallest workspace. The three passes differ only in cuDNN's entry points.

#define MAX_CANDIDATES 32

static const char *const PASS_NAME[] = {"forward", "backward-data", "backward-filter"};
// The pass's deterministic algorithm preferred when determinism is required.
static const int PASS_DETERMINISTIC[] = {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                                         CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1};

// The workspace algo needs for the pass; false where cuDNN does not support it for this geometry.
static bool pass_workspace(const ConvDescs &d, ConvPass p, int algo, size_t *bytes) {
  cudnnHandle_t h = detr_cudnn_handle();
  cudnnStatus_t s;
  if (p == CONV_PASS_FWD)
    s = cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, (cudnnConvolutionFwdAlgo_t)algo, bytes);
  else if (p == CONV_PASS_BWD_DATA)
    s = cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, (cudnnConvolutionBwdDataAlgo_t)algo,
                                                     bytes);
  else
    s = cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, (cudnnConvolutionBwdFilterAlgo_t)algo,
                                                       bytes);
  return s == CUDNN_STATUS_SUCCESS;
}

// Appends cuDNN's ranked algorithms (any pass's AlgoPerf type) to opts[0..n); returns the new n.
template <class Perf>
static int append_ranked(const ConvDescs &d, ConvPass p, const Perf *perf, int returned, ConvAlgoOption *opts, int n) {
  size_t bytes = 0;
  for (int i = 0; i < returned && n < MAX_CANDIDATES; i++) {
    bool ok = perf[i].status == CUDNN_STATUS_SUCCESS && pass_workspace(d, p, (int)perf[i].algo, &bytes);
    opts[n++] = {(int)perf[i].algo, ok, perf[i].determinism == CUDNN_DETERMINISTIC, ok ? bytes : 0};
  }
  return n;
}

// The pass's algorithm for these descriptors and its workspace, into *algo and *algo_bytes; false
// (and -1) when none supports the geometry.
static bool choose_algo(const ConvDescs &d, ConvPass p, bool deterministic, int *algo, size_t *algo_bytes) {
  cudnnHandle_t h = detr_cudnn_handle();
  ConvAlgoOption opts[MAX_CANDIDATES];
  int n = 0, returned = 0;
  size_t bytes = 0;
  if (deterministic) {
    bool ok = pass_workspace(d, p, PASS_DETERMINISTIC[p], &bytes);
    opts[n++] = {PASS_DETERMINISTIC[p], ok, true, ok ? bytes : 0};
  }
  if (p == CONV_PASS_FWD) {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                       &returned, perf));
    n = append_ranked(d, p, perf, returned, opts, n);
  } else if (p == CONV_PASS_BWD_DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x,
                                                            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &returned, perf));
    n = append_ranked(d, p, perf, returned, opts, n);
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, d.x, d.y, d.conv, d.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &returned, perf));
    n = append_ranked(d, p, perf, returned, opts, n);
  }
  int k = conv_algo_pick(opts, n, deterministic, cudnn_workspace_limit());
  *algo = k >= 0 ? opts[k].algo : -1;
  *algo_bytes = k >= 0 ? opts[k].bytes : 0;
  return k >= 0;
}

static void choose(const ConvDescs &d, ConvPass p, bool deterministic, int *algo, size_t *algo_bytes) {
  DETR_CHECK(choose_algo(d, p, deterministic, algo, algo_bytes),
             "conv2d (cuDNN): no %s%s algorithm supports this geometry", deterministic ? "deterministic " : "",
             PASS_NAME[p]);
}

// Whether cuDNN runs at all for g (an empty output or C = 0 is handled without it).
static bool conv_uses_cudnn(const ConvGeom *g) {
  return g->batch * g->out_ch * g->out_h * g->out_w > 0 && g->in_ch > 0;
}

// The entry for g with the passes asked for chosen (descriptors made only when a choice is due).
static AlgoCacheEntry *conv_choose(const ConvGeom *g, bool fwd, bool bwd_data, bool bwd_filter) {
  AlgoCacheEntry *e = current_entry(g);
  if ((fwd && e->fwd == ALGO_UNSET) || (bwd_data && e->bwd_data == ALGO_UNSET) ||
      (bwd_filter && e->bwd_filter == ALGO_UNSET)) {
    ConvDescs d(g, e->math);
    if (fwd && e->fwd == ALGO_UNSET) choose(d, CONV_PASS_FWD, e->deterministic, &e->fwd, &e->fwd_bytes);
    if (bwd_data && e->bwd_data == ALGO_UNSET)
      choose(d, CONV_PASS_BWD_DATA, e->deterministic, &e->bwd_data, &e->bwd_data_bytes);
    if (bwd_filter && e->bwd_filter == ALGO_UNSET)
      choose(d, CONV_PASS_BWD_WEIGHTS, e->deterministic, &e->bwd_filter, &e->bwd_filter_bytes);
  }
  return e;
}

// Channels last: the bytes of one KRSC copy of the weight (the weight for the forward and
// backward-data, dw for backward-filter), 256-byte aligned, at the workspace's start; 0 for nchw.
static size_t krsc_bytes(const ConvGeom *g) {
  if (!g->channels_last) return 0;
  size_t bytes = (size_t)(g->out_ch * g->in_ch * g->kh * g->kw) * sizeof(float);
  return (bytes + 255) / 256 * 256;
}

static int64_t conv_input_numel(const ConvGeom *g) { return g->batch * g->in_ch * g->in_h * g->in_w; }
static int64_t conv_weight_numel(const ConvGeom *g) { return g->out_ch * g->in_ch * g->kh * g->kw; }
static int64_t conv_output_numel(const ConvGeom *g) { return g->batch * g->out_ch * g->out_h * g->out_w; }

// bf16: the bytes of one bf16 staging copy of n values, 256-byte aligned.
static size_t bf16_bytes(int64_t n) { return ((size_t)n * sizeof(uint16_t) + 255) / 256 * 256; }

// The workspace's copies ahead of the algorithm's share. fp32 and TF32: the KRSC weight copies of
// channels last. bf16 - forward: x', w', y' (w' in KRSC order when channels last); backward: dy',
// then for dx w' and dx', for dw x' and dw'.
static size_t forward_copies(const ConvGeom *g, ConvMath math) {
  if (math != CONV_MATH_BF16) return krsc_bytes(g);
  return bf16_bytes(conv_input_numel(g)) + bf16_bytes(conv_weight_numel(g)) + bf16_bytes(conv_output_numel(g));
}

static size_t backward_copies(const ConvGeom *g, ConvMath math, bool dx, bool dw) {
  if (math != CONV_MATH_BF16) return (dx ? krsc_bytes(g) : 0) + (dw ? krsc_bytes(g) : 0);
  size_t pass = bf16_bytes(conv_input_numel(g)) + bf16_bytes(conv_weight_numel(g));
  return bf16_bytes(conv_output_numel(g)) + (dx ? pass : 0) + (dw ? pass : 0);
}

extern "C" size_t cuda_conv2d_forward_workspace(const ConvGeom *g) {
  if (!conv_uses_cudnn(g)) return 0;
  AlgoCacheEntry *e = conv_choose(g, true, false, false);
  return forward_copies(g, e->math) + e->fwd_bytes;
}

extern "C" size_t cuda_conv2d_backward_workspace(const ConvGeom *g, bool dx, bool dw) {
  if (!conv_uses_cudnn(g) || (!dx && !dw)) return 0;
  AlgoCacheEntry *e = conv_choose(g, false, dx, dw);
  size_t a = dx ? e->bwd_data_bytes : 0, b = dw ? e->bwd_filter_bytes : 0;
  // The passes run one after the other on the stream: one buffer serves both algorithms.
  return backward_copies(g, e->math, dx, dw) + (a > b ? a : b);
}

// --- the survey: every algorithm cuDNN has for the passes run so far, timed by its Find ---

template <class Perf>
static void survey_fill(ConvSurveyRow *row, const Perf *perf, int returned) {
  for (int i = 0; i < returned && row->n < CONV_SURVEY_ALGOS; i++)
    row->algos[row->n++] = {(int)perf[i].algo,
                            (int)perf[i].mathType,
                            perf[i].determinism == CUDNN_DETERMINISTIC,
                            perf[i].status == CUDNN_STATUS_SUCCESS,
                            perf[i].time,
                            perf[i].memory};
}

// Buffers for the largest pass, allocated once (outside the tensor allocator: a measurement).
struct SurveyBuffers {
  void *x = NULL, *w = NULL, *y = NULL, *ws = NULL;
  size_t x_bytes = 0, w_bytes = 0, y_bytes = 0, ws_bytes = 0;
  static void grow(void **p, size_t *have, size_t want) {
    if (want <= *have) return;
    if (*p) CUDA_CHECK(cudaFree(*p));
    CUDA_CHECK(cudaMalloc(p, want));
    CUDA_CHECK(cudaMemset(*p, 0, want));  // zeros: no NaN or denormal slows an algorithm down
    *have = want;
  }
  ~SurveyBuffers() {
    void *all[4] = {x, w, y, ws};
    for (int i = 0; i < 4; i++)
      if (all[i]) CUDA_CHECK(cudaFree(all[i]));
  }
};

// One pass of e's geometry: detr-c's choice either way (-1 where none), then cuDNN's Find with the
// workspace limit's bytes (an algorithm that needs more is reported as not run). Find lists each
// (algorithm, math type) it tried, fastest first.
static void survey_pass(const AlgoCacheEntry *e, ConvPass p, SurveyBuffers *b, ConvSurveyRow *row) {
  const ConvGeom *g = &e->g;
  ConvDescs d(g, e->math);
  *row = ConvSurveyRow{};
  row->g = *g;
  row->pass = p;
  row->calls = e->calls[p];
  size_t bytes = 0, elem = e->math == CONV_MATH_BF16 ? sizeof(uint16_t) : sizeof(float);
  choose_algo(d, p, true, &row->pick_deterministic, &bytes);
  choose_algo(d, p, false, &row->pick_any, &bytes);
  SurveyBuffers::grow(&b->x, &b->x_bytes, (size_t)conv_input_numel(g) * elem);
  SurveyBuffers::grow(&b->w, &b->w_bytes, (size_t)conv_weight_numel(g) * elem);
  SurveyBuffers::grow(&b->y, &b->y_bytes, (size_t)conv_output_numel(g) * elem);
  size_t limit = cudnn_workspace_limit();
  if (!b->ws && limit) {  // the workspace's contents do not matter: allocated, not cleared
    CUDA_CHECK(cudaMalloc(&b->ws, limit));
    b->ws_bytes = limit;
  }
  cudnnHandle_t h = detr_cudnn_handle();
  int max = 0, returned = 0;
  if (p == CONV_PASS_FWD) {
    CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max));
    cudnnConvolutionFwdAlgoPerf_t perf[CONV_SURVEY_ALGOS];
    CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, d.x, b->x, d.w, b->w, d.conv, d.y, b->y,
                                                       max < CONV_SURVEY_ALGOS ? max : CONV_SURVEY_ALGOS, &returned,
                                                       perf, b->ws, b->ws_bytes));
    survey_fill(row, perf, returned);
  } else if (p == CONV_PASS_BWD_DATA) {
    CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max));
    cudnnConvolutionBwdDataAlgoPerf_t perf[CONV_SURVEY_ALGOS];
    CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w, b->w, d.y, b->y, d.conv, d.x, b->x,
                                                            max < CONV_SURVEY_ALGOS ? max : CONV_SURVEY_ALGOS,
                                                            &returned, perf, b->ws, b->ws_bytes));
    survey_fill(row, perf, returned);
  } else {
    CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max));
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CONV_SURVEY_ALGOS];
    CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x, b->x, d.y, b->y, d.conv, d.w, b->w,
                                                              max < CONV_SURVEY_ALGOS ? max : CONV_SURVEY_ALGOS,
                                                              &returned, perf, b->ws, b->ws_bytes));
    survey_fill(row, perf, returned);
  }
}

extern "C" int cuda_conv2d_survey(ConvSurveyRow *rows, int cap) {
  CUDA_CHECK(cudaStreamSynchronize(detr_cuda_stream()));  // the passes counted have run
  bool deterministic = cudnn_deterministic();
  ConvMath math = current_math();
  SurveyBuffers buffers;
  int total = 0;
  for (int i = 0; i < g_algo_cache_count; i++) {
    const AlgoCacheEntry *e = &g_algo_cache[i];
    if (e->deterministic != deterministic || e->math != math) continue;
    for (int p = 0; p < 3; p++) {
      if (e->calls[p] == 0) continue;
      if (total < cap) survey_pass(e, (ConvPass)p, &buffers, &rows[total]);
      total++;
    }
  }
  return total;
}

// w' [O, KH, KW, C] = w [O, C, KH, KW] (to_krsc), or w (+)= the inverse of w' (a gradient: add, or
// set when `set`).
__global__ void weight_krsc_kernel(float *w, float *wk, int64_t channels, int64_t taps, int64_t total, bool to_krsc,
                                   bool set) {
  GRID_STRIDE_LOOP(i, total) {
    int64_t j = conv_weight_tap_major(i, channels, taps);
    if (to_krsc) wk[j] = w[i];
    else w[i] = set ? wk[j] : w[i] + wk[j];
  }
}

static void weight_krsc(const ConvGeom *g, float *w, float *wk, bool to_krsc, bool set) {
  int64_t total = g->out_ch * g->in_ch * g->kh * g->kw;
  if (total <= 0) return;
  weight_krsc_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(
      w, wk, g->in_ch, g->kh * g->kw, total, to_krsc, set);
  CUDA_CHECK_LAUNCH("weight_krsc_kernel");
}

// --- bf16 staging (kernels/bf16_math.h's rounding: to nearest even, as the CPU's) ---

// dst [n] = src rounded to the nearest bf16.
__global__ void to_bf16_kernel(const float *src, uint16_t *dst, int64_t n) {
  GRID_STRIDE_LOOP(i, n) dst[i] = bf16_from_float(src[i]);
}

// The same, four values a thread (src 16-byte, dst 8-byte aligned): one 16-byte load and one 8-byte
// store instead of four 4-byte loads and 2-byte stores. On an H100 (ncu, detr-r50 bf16 step, batch 8
// at 800x1066) the one-a-thread form moved 1.3 TB/s on copies of 0.3-17M values, this one 2.75 TB/s;
// the step's conversions took 18.0 ms instead of 26.4, the step 96.5 ms instead of 104.3.
__global__ void to_bf16_x4_kernel(const float *src, uint16_t *dst, int64_t n) {
  int64_t n4 = n / 4;
  GRID_STRIDE_LOOP(i, n4) {
    float4 v = reinterpret_cast<const float4 *>(src)[i];
    uint2 packed;  // little endian: the lower half holds the lower index
    packed.x = (uint32_t)bf16_from_float(v.x) | (uint32_t)bf16_from_float(v.y) << 16;
    packed.y = (uint32_t)bf16_from_float(v.z) | (uint32_t)bf16_from_float(v.w) << 16;
    reinterpret_cast<uint2 *>(dst)[i] = packed;
  }
  GRID_STRIDE_LOOP(i, n - 4 * n4) dst[4 * n4 + i] = bf16_from_float(src[4 * n4 + i]);
}

// dst [n] (+)= src widened to fp32 (set: =).
__global__ void from_bf16_kernel(const uint16_t *src, float *dst, int64_t n, bool set) {
  GRID_STRIDE_LOOP(i, n) dst[i] = set ? bf16_to_float(src[i]) : dst[i] + bf16_to_float(src[i]);
}

// The same, four values a thread (src 8-byte, dst 16-byte aligned).
__global__ void from_bf16_x4_kernel(const uint16_t *src, float *dst, int64_t n, bool set) {
  int64_t n4 = n / 4;
  GRID_STRIDE_LOOP(i, n4) {
    uint2 packed = reinterpret_cast<const uint2 *>(src)[i];
    float4 v = make_float4(bf16_to_float((uint16_t)packed.x), bf16_to_float((uint16_t)(packed.x >> 16)),
                           bf16_to_float((uint16_t)packed.y), bf16_to_float((uint16_t)(packed.y >> 16)));
    float4 *d = reinterpret_cast<float4 *>(dst) + i;
    if (!set) {
      float4 old = *d;
      v.x += old.x, v.y += old.y, v.z += old.z, v.w += old.w;
    }
    *d = v;
  }
  GRID_STRIDE_LOOP(i, n - 4 * n4) {
    int64_t j = 4 * n4 + i;
    dst[j] = set ? bf16_to_float(src[j]) : dst[j] + bf16_to_float(src[j]);
  }
}

// Whether p is aligned to `bytes`.
static bool aligned(const void *p, uintptr_t bytes) { return (uintptr_t)p % bytes == 0; }

// to_bf16: wb = w [O, C, KH, KW] rounded to bf16, in KRSC order when krsc (channels last); else
// w (+)= such a copy widened (a gradient: add, or set when `set`).
__global__ void weight_bf16_kernel(float *w, uint16_t *wb, int64_t channels, int64_t taps, int64_t total, bool krsc,
                                   bool to_bf16, bool set) {
  GRID_STRIDE_LOOP(i, total) {
    int64_t j = krsc ? conv_weight_tap_major(i, channels, taps) : i;
    if (to_bf16) wb[j] = bf16_from_float(w[i]);
    else w[i] = set ? bf16_to_float(wb[j]) : w[i] + bf16_to_float(wb[j]);
  }
}

extern "C" void cuda_to_bf16(const float *src, uint16_t *dst, int64_t n) {
  if (n <= 0) return;
  if (n >= 4 && aligned(src, 16) && aligned(dst, 8)) {
    to_bf16_x4_kernel<<<detr_grid_size(n / 4, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(src, dst, n);
    CUDA_CHECK_LAUNCH("to_bf16_x4_kernel");
    return;
  }
  to_bf16_kernel<<<detr_grid_size(n, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(src, dst, n);
  CUDA_CHECK_LAUNCH("to_bf16_kernel");
}

static void from_bf16(const uint16_t *src, float *dst, int64_t n, bool set) {
  if (n <= 0) return;
  if (n >= 4 && aligned(src, 8) && aligned(dst, 16)) {
    from_bf16_x4_kernel<<<detr_grid_size(n / 4, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(src, dst, n, set);
    CUDA_CHECK_LAUNCH("from_bf16_x4_kernel");
    return;
  }
  from_bf16_kernel<<<detr_grid_size(n, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(src, dst, n, set);
  CUDA_CHECK_LAUNCH("from_bf16_kernel");
}

static void weight_bf16(const ConvGeom *g, float *w, uint16_t *wb, bool to_bf16, bool set) {
  int64_t total = conv_weight_numel(g);
  if (total <= 0) return;
  weight_bf16_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(
      w, wb, g->in_ch, g->kh * g->kw, total, g->channels_last, to_bf16, set);
  CUDA_CHECK_LAUNCH("weight_bf16_kernel");
}

static void check_workspace(const char *pass, size_t need, void *ws, size_t have) {
  DETR_CHECK(need <= have && (need == 0 || ws),
             "conv2d (cuDNN) %s: the algorithm needs a %zu-byte workspace, %zu given "
             "(cuda_conv2d_*_workspace)",
             pass, need, ws ? have : 0);
}

// --- bias ---

// y [B, O, S] (channels last: [B, S, O]) += bias [O], S = HO * WO.
__global__ void conv_bias_forward_kernel(float *y, const float *bias, int64_t total, int64_t out_ch, int64_t spatial,
                                         int channels_last) {
  GRID_STRIDE_LOOP(i, total) y[i] += bias[channels_last ? i % out_ch : (i / spatial) % out_ch];
}

// dbias [O] += sum over b, s of dy [B, O, S]. One block per channel (grid-stride over channels);
// thread t sums the flattened (b, s) positions t, t + DETR_BLOCK, ... (adjacent threads read
// adjacent floats of a plane), then a fixed tree adds the partials: no atomics, the same result
// on every run. Double accumulation, as the CPU's.
__global__ void conv_bias_backward_kernel(const float *dy, float *dbias, int64_t batch, int64_t out_ch, int64_t spatial,
                                          int channels_last) {
  __shared__ double partial[DETR_BLOCK];  // blockDim.x == DETR_BLOCK, a power of two
  int64_t per_channel = batch * spatial;
  for (int64_t o = blockIdx.x; o < out_ch; o += gridDim.x) {
    double acc = 0.0;
    for (int64_t t = threadIdx.x; t < per_channel; t += DETR_BLOCK) {
      int64_t b = t / spatial, s = t % spatial;
      acc += dy[conv_offset(channels_last, b, o, s, out_ch, spatial)];
    }
    partial[threadIdx.x] = acc;
    __syncthreads();
    for (int step = DETR_BLOCK / 2; step > 0; step >>= 1) {
      if ((int)threadIdx.x < step) partial[threadIdx.x] += partial[threadIdx.x + step];
      __syncthreads();
    }
    if (threadIdx.x == 0) dbias[o] += (float)partial[0];
    __syncthreads();  // partial[0] is read before the next channel overwrites it
  }
}

extern "C" void cuda_conv2d_forward(const float *x, const float *w, const float *bias, float *y, const ConvGeom *g,
                                    void *workspace, size_t workspace_bytes) {
  int64_t total = conv_output_numel(g);
  if (total == 0) return;
  if (g->in_ch == 0) {  // an empty sum (cuDNN rejects C = 0): zeros, then the bias, as the CPU
    CUDA_CHECK(cudaMemsetAsync(y, 0, (size_t)total * sizeof(float), detr_cuda_stream()));
  } else {
    AlgoCacheEntry *e = conv_choose(g, true, false, false);
    e->calls[CONV_PASS_FWD]++;
    size_t copies = forward_copies(g, e->math);
    check_workspace("forward", copies + e->fwd_bytes, workspace, workspace_bytes);
    char *algo_ws = (char *)workspace + copies;
    ConvDescs d(g, e->math);
    cudnnConvolutionFwdAlgo_t algo = (cudnnConvolutionFwdAlgo_t)e->fwd;
    const float one = 1.0f, zero = 0.0f;  // beta = 0: y is overwritten
    if (e->math == CONV_MATH_BF16) {      // x', w' (KRSC when channels last) and y' at the workspace's start
      uint16_t *xb = (uint16_t *)workspace, *wb = (uint16_t *)((char *)xb + bf16_bytes(conv_input_numel(g)));
      uint16_t *yb = (uint16_t *)((char *)wb + bf16_bytes(conv_weight_numel(g)));
      cuda_to_bf16(x, xb, conv_input_numel(g));
      weight_bf16(g, (float *)w, wb, true, false);
      CUDNN_CHECK(cudnnConvolutionForward(detr_cudnn_handle(), &one, d.x, xb, d.w, wb, d.conv, algo,
                                          e->fwd_bytes ? algo_ws : NULL, e->fwd_bytes, &zero, d.y, yb));
      from_bf16(yb, y, total, true);
    } else {
      const float *wk = w;  // channels last: the KRSC copy at the workspace's start
      if (copies) {
        weight_krsc(g, (float *)w, (float *)workspace, true, false);
        wk = (const float *)workspace;
      }
      CUDNN_CHECK(cudnnConvolutionForward(detr_cudnn_handle(), &one, d.x, x, d.w, wk, d.conv, algo,
                                          e->fwd_bytes ? algo_ws : NULL, e->fwd_bytes, &zero, d.y, y));
    }
  }
  if (bias) {
    int64_t spatial = g->out_h * g->out_w;
    conv_bias_forward_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(
        y, bias, total, g->out_ch, spatial, g->channels_last);
    CUDA_CHECK_LAUNCH("conv_bias_forward_kernel");
  }
}

// dx [B, C, H, W] += conv^T(dy) (set_dx: =), dw [O, C, KH, KW] += dy (*) x (set_dw: =); either may
// be NULL.
static void conv_backward_cudnn(const float *x, const float *w, const float *dy, float *dx, bool set_dx, float *dw,
                                bool set_dw, const ConvGeom *g, void *ws, size_t ws_bytes) {
  AlgoCacheEntry *e = conv_choose(g, false, dx != NULL, dw != NULL);
  e->calls[CONV_PASS_BWD_DATA] += dx != NULL;
  e->calls[CONV_PASS_BWD_WEIGHTS] += dw != NULL;
  ConvDescs d(g, e->math);
  cudnnHandle_t h = detr_cudnn_handle();
  const float one = 1.0f, zero = 0.0f;  // alpha = 1, beta = 1: gradients accumulate (beta 0 when set)
  size_t copies = backward_copies(g, e->math, dx != NULL, dw != NULL);
  char *algo_ws = (char *)ws + copies;
  size_t algo_bytes = ws_bytes >= copies ? ws_bytes - copies : 0;
  if (copies)
    DETR_CHECK(copies <= ws_bytes && ws,
               "conv2d (cuDNN) backward: the weight copies need %zu bytes of "
               "workspace, %zu given (cuda_conv2d_backward_workspace)",
               copies, ws ? ws_bytes : 0);
  if (e->math == CONV_MATH_BF16) {  // dy', then w' and dx', then x' and dw' (backward_copies' order)
    int64_t nx = conv_input_numel(g), nw = conv_weight_numel(g);
    char *next = (char *)ws;
    uint16_t *dyb = (uint16_t *)next;
    next += bf16_bytes(conv_output_numel(g));
    cuda_to_bf16(dy, dyb, conv_output_numel(g));
    if (dx) {
      uint16_t *wb = (uint16_t *)next, *dxb = (uint16_t *)(next + bf16_bytes(nw));
      next += bf16_bytes(nw) + bf16_bytes(nx);
      weight_bf16(g, (float *)w, wb, true, false);
      check_workspace("backward-data", e->bwd_data_bytes, algo_ws, algo_bytes);
      CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, d.w, wb, d.y, dyb, d.conv,
                                               (cudnnConvolutionBwdDataAlgo_t)e->bwd_data,
                                               e->bwd_data_bytes ? algo_ws : NULL, e->bwd_data_bytes, &zero, d.x, dxb));
      from_bf16(dxb, dx, nx, set_dx);
    }
    if (dw) {
      uint16_t *xb = (uint16_t *)next, *dwb = (uint16_t *)(next + bf16_bytes(nx));
      cuda_to_bf16(x, xb, nx);
      check_workspace("backward-filter", e->bwd_filter_bytes, algo_ws, algo_bytes);
      CUDNN_CHECK(cudnnConvolutionBackwardFilter(
          h, &one, d.x, xb, d.y, dyb, d.conv, (cudnnConvolutionBwdFilterAlgo_t)e->bwd_filter,
          e->bwd_filter_bytes ? algo_ws : NULL, e->bwd_filter_bytes, &zero, d.w, dwb));
      weight_bf16(g, dw, dwb, false, set_dw);  // dw (+)= dw' (from KRSC order when channels last)
    }
    return;
  }
  // Channels last: KRSC copies at the workspace's start, the weight's (for dx) and dw's.
  size_t wk_bytes = krsc_bytes(g);
  const float *wk = w;
  float *dwk = dw;
  if (wk_bytes && dx) {
    weight_krsc(g, (float *)w, (float *)ws, true, false);
    wk = (const float *)ws;
  }
  if (wk_bytes && dw) dwk = (float *)((char *)ws + (dx ? wk_bytes : 0));
  if (dx) {
    check_workspace("backward-data", e->bwd_data_bytes, algo_ws, algo_bytes);
    CUDNN_CHECK(cudnnConvolutionBackwardData(
        h, &one, d.w, wk, d.y, dy, d.conv, (cudnnConvolutionBwdDataAlgo_t)e->bwd_data,
        e->bwd_data_bytes ? algo_ws : NULL, e->bwd_data_bytes, set_dx ? &zero : &one, d.x, dx));
  }
  if (dw) {
    check_workspace("backward-filter", e->bwd_filter_bytes, algo_ws, algo_bytes);
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(
        h, &one, d.x, x, d.y, dy, d.conv, (cudnnConvolutionBwdFilterAlgo_t)e->bwd_filter,
        e->bwd_filter_bytes ? algo_ws : NULL, e->bwd_filter_bytes, set_dw || wk_bytes ? &zero : &one, d.w, dwk));
    if (wk_bytes) weight_krsc(g, dw, dwk, false, set_dw);  // dw (+)= the KRSC result
  }
}

extern "C" void cuda_conv2d_backward(const float *x, const float *w, const float *dy, float *dx, bool set_dx, float *dw,
                                     bool set_dw, float *dbias, const ConvGeom *g, void *workspace,
                                     size_t workspace_bytes) {
  if (!dx && !dw && !dbias) return;
  if (conv_output_numel(g) == 0 || g->in_ch == 0) {  // no terms: a gradient to be written is zero
    int64_t nx = g->batch * g->in_ch * g->in_h * g->in_w, nw = g->out_ch * g->in_ch * g->kh * g->kw;
    if (dx && set_dx) CUDA_CHECK(cudaMemsetAsync(dx, 0, (size_t)nx * sizeof(float), detr_cuda_stream()));
    if (dw && set_dw) CUDA_CHECK(cudaMemsetAsync(dw, 0, (size_t)nw * sizeof(float), detr_cuda_stream()));
  }
  if (conv_output_numel(g) == 0) return;  // no output: every gradient term is zero
  if (g->in_ch == 0) dx = dw = NULL;      // both are empty
  if (dx || dw) conv_backward_cudnn(x, w, dy, dx, set_dx, dw, set_dw, g, workspace, workspace_bytes);
  if (dbias) {
    unsigned int grid = (unsigned int)(g->out_ch < 65535 ? g->out_ch : 65535);
    conv_bias_backward_kernel<<<grid, DETR_BLOCK, 0, detr_cuda_stream()>>>(dy, dbias, g->batch, g->out_ch,
                                                                           g->out_h * g->out_w, g->channels_last);
    CUDA_CHECK_LAUNCH("conv_bias_backward_kernel");
  }
}

// --- max pooling: -inf padding (padded taps are skipped), argmax per output kept for backward ---

// x [B, C, in_h, in_w] -> y, argmax [B, C, out_h, out_w] (channels last: [B, in_h, in_w, C] ->
// [B, out_h, out_w, C]); argmax is the position iy * in_w + ix within the input plane (-1 for a
// window with no input pixel, which padding <= kernel / 2 rules out), or NULL (none kept).
__global__ void maxpool2d_forward_kernel(const float *x, float *y, int32_t *argmax, ConvGeom g, int64_t total) {
  GRID_STRIDE_LOOP(o, total) {
    int64_t b, c, s;
    conv_decode(g.channels_last, o, g.in_ch, g.out_h * g.out_w, &b, &c, &s);
    int64_t ox = s % g.out_w, oy = s / g.out_w;
    float best = -FLT_MAX;
    int32_t best_at = -1;
    for (int64_t ky = 0; ky < g.kh; ky++) {
      int64_t iy = conv_in_coord(oy, ky, g.stride_h, g.pad_h, g.dil_h);
      if (iy < 0 || iy >= g.in_h) continue;
      for (int64_t kx = 0; kx < g.kw; kx++) {
        int64_t ix = conv_in_coord(ox, kx, g.stride_w, g.pad_w, g.dil_w);
        if (ix < 0 || ix >= g.in_w) continue;
        float v = x[conv_offset(g.channels_last, b, c, iy * g.in_w + ix, g.in_ch, g.in_h * g.in_w)];
        if (maxpool_takes(v, best, best_at)) {
          best = v;
          best_at = (int32_t)(iy * g.in_w + ix);
        }
      }
    }
    y[o] = best;
    if (argmax) argmax[o] = best_at;
  }
}

// Gather form of the backward, no atomics: thread i owns input pixel (p, iy, ix) and adds dy of
// every output whose argmax is i, in increasing output order - the order in which the CPU's
// scatter loop adds them, so the result is the CPU's bit for bit. dx: x's shape.
__global__ void maxpool2d_backward_kernel(const float *dy, const int32_t *argmax, float *dx, ConvGeom g,
                                          int64_t total) {
  GRID_STRIDE_LOOP(i, total) {
    int64_t b, c, s;
    conv_decode(g.channels_last, i, g.in_ch, g.in_h * g.in_w, &b, &c, &s);
    int64_t ix = s % g.in_w, iy = s / g.in_w;
    int64_t oy0, oy1, ox0, ox1;
    conv_out_range(iy, g.kh, g.stride_h, g.pad_h, g.dil_h, g.out_h, &oy0, &oy1);
    conv_out_range(ix, g.kw, g.stride_w, g.pad_w, g.dil_w, g.out_w, &ox0, &ox1);
    int32_t self = (int32_t)(iy * g.in_w + ix);
    float acc = dx[i];
    bool hit = false;
    for (int64_t oy = oy0; oy <= oy1; oy++)
      for (int64_t ox = ox0; ox <= ox1; ox++) {
        int64_t o = conv_offset(g.channels_last, b, c, oy * g.out_w + ox, g.in_ch, g.out_h * g.out_w);
        if (argmax[o] == self) {
          acc += dy[o];
          hit = true;
        }
      }
    if (hit) dx[i] = acc;
  }
}

// --- depthwise convolution (kernels/conv_math.h) ---

// One thread per output element; y [planes, H, W].
__global__ void dwconv_forward_kernel(const float *x, const float *w, const float *bias, float *y, DwConvGeom g,
                                      int64_t total) {
  GRID_STRIDE_LOOP(i, total) {
    int64_t HW = g.H * g.W, p = i / HW, at = i % HW, c = p % g.channels;
    y[i] = dwconv_at(x + p * HW, w + c * g.k * g.k, g.H, g.W, g.k, at / g.W, at % g.W) + (bias ? bias[c] : 0.0f);
  }
}

// Gather form, no atomics: one thread per input element.
__global__ void dwconv_input_grad_kernel(const float *w, const float *dy, float *dx, DwConvGeom g, int64_t total) {
  GRID_STRIDE_LOOP(i, total) {
    int64_t HW = g.H * g.W, p = i / HW, at = i % HW, c = p % g.channels;
    dx[i] += dwconv_input_grad_at(dy + p * HW, w + c * g.k * g.k, g.H, g.W, g.k, at / g.W, at % g.W);
  }
}

// One block per (channel, tap), or per channel for the bias (taps = 0): the block's threads
// split each image's pixels, then a fixed-order block sum (deterministic).
__global__ void dwconv_param_grad_kernel(const float *x, const float *dy, float *dw, float *dbias, DwConvGeom g) {
  int64_t HW = g.H * g.W, kk = (int64_t)g.k * g.k, images = g.planes / g.channels;
  int64_t rows = dw ? g.channels * kk : g.channels;
  BLOCK_STRIDE_LOOP(row, rows) {
    int64_t c = dw ? row / kk : row, tap = dw ? row % kk : 0;
    double acc = 0.0;
    for (int64_t m = 0; m < images; m++) {
      int64_t p = m * g.channels + c;
      if (dw)
        acc += dwconv_weight_grad_part(x + p * HW, dy + p * HW, g.H, g.W, g.k, (int)(tap / g.k), (int)(tap % g.k),
                                       threadIdx.x, blockDim.x);
      else
        for (int64_t i = threadIdx.x; i < HW; i += blockDim.x) acc += dy[p * HW + i];
    }
    acc = block_sum<DETR_BLOCK>(acc);
    if (threadIdx.x == 0) {
      if (dw) dw[row] += (float)acc;
      else dbias[row] += (float)acc;
    }
  }
}

extern "C" void cuda_dwconv_forward(const float *x, const float *w, const float *bias, float *y, const DwConvGeom *g) {
  int64_t total = g->planes * g->H * g->W;
  if (total <= 0) return;
  dwconv_forward_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(x, w, bias, y, *g,
                                                                                                  total);
  CUDA_CHECK_LAUNCH("dwconv_forward_kernel");
}

extern "C" void cuda_dwconv_backward(const float *x, const float *w, const float *dy, float *dx, float *dw,
                                     float *dbias, const DwConvGeom *g) {
  int64_t total = g->planes * g->H * g->W;
  if (total <= 0) return;
  cudaStream_t s = detr_cuda_stream();
  if (dx) {
    dwconv_input_grad_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, s>>>(w, dy, dx, *g, total);
    CUDA_CHECK_LAUNCH("dwconv_input_grad_kernel");
  }
  if (dw) {
    dwconv_param_grad_kernel<<<detr_block_grid(g->channels * g->k * g->k), DETR_BLOCK, 0, s>>>(x, dy, dw, NULL, *g);
    CUDA_CHECK_LAUNCH("dwconv_param_grad_kernel (weight)");
  }
  if (dbias) {
    dwconv_param_grad_kernel<<<detr_block_grid(g->channels), DETR_BLOCK, 0, s>>>(x, dy, NULL, dbias, *g);
    CUDA_CHECK_LAUNCH("dwconv_param_grad_kernel (bias)");
  }
}

static void check_plane_index(const ConvGeom *g, const char *what) {
  DETR_CHECK(g->in_h * g->in_w <= INT32_MAX, "%s: a %lldx%lld plane overflows the int32 argmax", what,
             (long long)g->in_h, (long long)g->in_w);
}

extern "C" void cuda_maxpool2d_forward(const float *x, float *y, int32_t *argmax, const ConvGeom *g) {
  check_plane_index(g, "cuda_maxpool2d_forward");
  int64_t total = g->batch * g->in_ch * g->out_h * g->out_w;
  if (total <= 0) return;
  maxpool2d_forward_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(x, y, argmax, *g,
                                                                                                     total);
  CUDA_CHECK_LAUNCH("maxpool2d_forward_kernel");
}

extern "C" void cuda_maxpool2d_backward(const float *dy, const int32_t *argmax, float *dx, const ConvGeom *g) {
  check_plane_index(g, "cuda_maxpool2d_backward");
  int64_t total = g->batch * g->in_ch * g->in_h * g->in_w;
  if (total <= 0 || g->out_h <= 0 || g->out_w <= 0) return;
  maxpool2d_backward_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(dy, argmax, dx,
                                                                                                      *g, total);
  CUDA_CHECK_LAUNCH("maxpool2d_backward_kernel");
}

// --- frozen batch norm: y = x * scale[c] + shift[c] (kernels/norm_math.h) ---

// scale [C] (kept for backward).
__global__ void frozen_bn_scale_kernel(const float *weight, const float *bias, const float *mean, const float *var,
                                       float eps, float *scale, int64_t channels) {
  GRID_STRIDE_LOOP(c, channels) {
    float shift;
    frozen_bn_scale_shift(weight[c], bias[c], mean[c], var[c], eps, &scale[c], &shift);
  }
}

// x, y [B, C, S]: each element recomputes its channel's scale and shift (a few flops; the kernel
// is bound by memory traffic), as the CPU recomputes them per (b, c) plane. residual (or NULL) and
// relu: the fused add and ReLU of op_frozen_batchnorm2d_act.
__global__ void frozen_bn_forward_kernel(const float *x, const float *weight, const float *bias, const float *mean,
                                         const float *var, float eps, const float *residual, bool relu, float *y,
                                         int64_t channels, int64_t spatial, int64_t total) {
  GRID_STRIDE_LOOP(i, total) {
    int64_t c = (i / spatial) % channels;
    float s, t;
    frozen_bn_scale_shift(weight[c], bias[c], mean[c], var[c], eps, &s, &t);
    y[i] = frozen_bn_act_elem(x[i], s, t, residual, i, relu);
  }
}

// mask byte j: bits of y's elements 8j .. 8j+7 (relu_mask_byte).
__global__ void relu_mask_kernel(const float *y, uint8_t *mask, int64_t total) {
  GRID_STRIDE_LOOP(j, (total + 7) / 8) mask[j] = relu_mask_byte(y + 8 * j, total - 8 * j);
}

extern "C" void cuda_frozen_bn_forward(const float *x, const float *weight, const float *bias, const float *mean,
                                       const float *var, float eps, const float *residual, bool relu, float *y,
                                       uint8_t *relu_mask, float *scale, int64_t batch, int64_t channels,
                                       int64_t spatial) {
  if (channels <= 0) return;
  cudaStream_t stream = detr_cuda_stream();
  frozen_bn_scale_kernel<<<detr_grid_size(channels, DETR_BLOCK), DETR_BLOCK, 0, stream>>>(weight, bias, mean, var, eps,
                                                                                          scale, channels);
  CUDA_CHECK_LAUNCH("frozen_bn_scale_kernel");
  int64_t total = batch * channels * spatial;
  if (total <= 0) return;
  frozen_bn_forward_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, stream>>>(
      x, weight, bias, mean, var, eps, residual, relu, y, channels, spatial, total);
  CUDA_CHECK_LAUNCH("frozen_bn_forward_kernel");
  if (relu && relu_mask) {
    relu_mask_kernel<<<detr_grid_size((total + 7) / 8, DETR_BLOCK), DETR_BLOCK, 0, stream>>>(y, relu_mask, total);
    CUDA_CHECK_LAUNCH("relu_mask_kernel");
  }
}

// dx [B, C, S] += g * scale[c] (set_dx: =), dresidual += g (set_dresidual: = g); either may be dy
// itself when set (each element is read before it is written); g = dy, masked by y > 0 under
// ReLU (relu_mask read only then).
__global__ void frozen_bn_backward_kernel(const uint8_t *relu_mask, const float *dy, const float *scale, bool relu,
                                          float *dx, bool set_dx, float *dresidual, bool set_dresidual,
                                          int64_t channels, int64_t spatial, int64_t total) {
  GRID_STRIDE_LOOP(i, total) {
    float g = relu ? frozen_bn_relu_grad(relu_mask_bit(relu_mask, i), dy[i]) : dy[i];
    if (dx) {
      float gs = g * scale[(i / spatial) % channels];
      dx[i] = set_dx ? gs : dx[i] + gs;
    }
    if (dresidual) dresidual[i] = set_dresidual ? g : dresidual[i] + g;
  }
}

extern "C" void cuda_frozen_bn_backward(const uint8_t *relu_mask, const float *dy, const float *scale, bool relu,
                                        float *dx, bool set_dx, float *dresidual, bool set_dresidual, int64_t batch,
                                        int64_t channels, int64_t spatial) {
  int64_t total = batch * channels * spatial;
  if (total <= 0 || (!dx && !dresidual)) return;
  frozen_bn_backward_kernel<<<detr_grid_size(total, DETR_BLOCK), DETR_BLOCK, 0, detr_cuda_stream()>>>(
      relu_mask, dy, scale, relu, dx, set_dx, dresidual, set_dresidual, channels, spatial, total);
  CUDA_CHECK_LAUNCH("frozen_bn_backward_kernel");
}
