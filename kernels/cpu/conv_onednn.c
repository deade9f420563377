// Convolution on oneDNN (Debian's libdnnl 2.6, OpenMP runtime: the same libgomp thread pool as
// OpenBLAS and our loops). Forward, backward-data and backward-weights primitives run on the
// framework's plain buffers: x [B, C, H, W], w [O, C, KH, KW], y [B, O, HO, WO] (channels last: x
// [B, H, W, C], y [B, HO, WO, O]), bias [O], the whole batch at once or one image at a time
// (onednn_conv2d_run).
//
// Each (geometry, pass, implementation, bias) gets its primitive once and keeps it in an LRU
// cache: creating one (descriptor, implementation choice, JIT) costs 0.5-1 ms here, so a training
// run with a new input size every step pays that per new shape (still faster: `bench_step --vary-size`,
// bench/README.md#bench_step).
//
// Layouts: blocked runs the convolution on the layouts oneDNN picks (format_tag any: nChw16c
// activations and blocked weights on AVX-512), with reorders from and to the plain buffers on each
// call; plain runs it on nchw/oihw, where oneDNN 2.6 falls back to its own im2col + sgemm
// ("gemm:jit"). conv.c chooses per pass from bench_ops' figures. A channels-last geometry keeps the
// activations in their nhwc buffers either way (only the weights are reordered, when blocked):
// oneDNN's nhwc convolutions run as fast as on nChw16c (brgconv forward on AVX-512;
// bench/README.md#bench_ops: `--conv-last`).
//
// Winograd: oneDNN's F(4x4, 3x3) ("jit_wino_4x3", AVX-512 only) computes a 3x3 stride-1
// convolution with 2.25x fewer multiplies, on nChw16c activations and its own weight layout (so a
// channels-last geometry's activations are reordered too). Its rounding is float32's: in
// tools/parity_step.py the backbone's gradients are as far from float64 as the reference's own
// float32 ones (detr-r50: median 1.11x, at most 1.27x their distance; the direct convolution's
// 0.77x, 1.14x; detr-r18-small at 320x320: 0.63x against 0.60x; bench/README.md#bench_ops).
// Where oneDNN has no Winograd for a geometry or CPU (AVX2), the entry is the direct one.
//
// Gradients accumulate (cpu_conv2d_backward's contract) while oneDNN overwrites: dx and dw are
// computed into a temporary and added by a reorder with a sum post-op (plain += converted
// temporary), which is also the pass that converts a blocked result back to the plain layout. A dx
// or dw that is to be written (set_dx, set_dw: a fresh buffer) goes through a reorder without the
// sum, or straight into the buffer where the layouts are the same (channels last); a same-layout
// gradient that accumulates is computed into the temporary and added by a plain loop (oneDNN's
// same-layout reorder with a sum is its slow generic one, "simple:any").
#include "kernels/cpu/cpu_kernels.h"

#include <stdlib.h>

#if DETR_HAVE_ONEDNN
#include <stdint.h>
#include <string.h>

#include <omp.h>
#include <pthread.h>

#include "core/runtime.h"
#include "kernels/cpu/conv_onednn.h"
#include "kernels/cpu/onednn.h"
#include "kernels/cpu/parallel.h"

// One tensor argument of a pass: the plain buffer the framework holds and the layout the
// convolution runs on. Inputs are reordered plain -> prim when they differ; an output in another
// layout is reordered prim -> plain (with a sum post-op when the pass accumulates).
typedef struct {
  int arg;                       // DNNL_ARG_*
  dnnl_memory_desc_t user;       // plain: nchw, nhwc or oihw
  dnnl_memory_desc_t prim;       // the convolution's own
  dnnl_primitive_t reorder;      // NULL: the layouts are the same (output: the accumulating reorder)
  dnnl_primitive_t reorder_set;  // a backward pass's output: the writing reorder (a fresh dx or dw), made on first use
  dnnl_primitive_t reorder_in;  // a forward output in another layout with the sum post-op: plain -> prim (the residual)
  bool takes16;  // an input the pass reads in bf16 on the plain layout itself: a caller's dense bf16 copy serves as is
  // A weight reordered in two steps (weight_goes_via_ohwi): plain -> via (ohwi, prim's type) by
  // reorder_via, then via -> prim by reorder; NULL: one step.
  dnnl_primitive_t reorder_via;
  dnnl_memory_desc_t via;
} ConvArg;

typedef struct {
  ConvGeom g;
  ConvPass pass;
  ConvImpl impl;  // CONV_IMPL_ONEDNN, _ONEDNN_PLAIN or _ONEDNN_WINOGRAD: the layouts and algorithm asked for
  bool winograd;  // oneDNN had Winograd for it (else the entry is the direct convolution)
  bool bias;      // the forward adds one / backward-weights computes its gradient
  unsigned post;  // the forward's post-ops (CONV_POST_*, inference's fused epilogue); 0 otherwise
  int nthr;       // OpenMP's thread count when it was made: its scratchpad serves that many or fewer
  dnnl_primitive_t conv;
  dnnl_primitive_desc_t fwd_pd;  // the forward's descriptor (forward entries only): the backward passes' hint
  ConvArg a[3];                  // a[0], a[1]: inputs; a[2]: the output
  dnnl_memory_desc_t bias_md;    // [O]
  size_t scratch_bytes;          // oneDNN's scratchpad for this primitive
  uint64_t used;                 // LRU stamp; 0: empty slot
} ConvPrim;

// DETR has ~20-60 distinct convolutions per input size, 2-3 passes each; training on varying input
// sizes cycles through more, and the least recently used is dropped. The cache is the process's
// (a primitive is JIT code: two runtimes' identical layers share one); every public function below
// holds cache_lock from its lookup to the end of its run, so no other thread evicts the primitive
// it runs. Two threads' oneDNN convolutions therefore take turns; each runs on every core.
#define CONV_CACHE_SIZE 256
_Static_assert(sizeof(ConvGeom) == 9 * sizeof(int64_t) + 8 * sizeof(int),
               "ConvGeom must have no padding bytes: the cache compares geometries with memcmp");

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t engine;  // made once (init_once)
static dnnl_stream_t stream;
static ConvPrim cache[CONV_CACHE_SIZE];
static uint64_t cache_clock;
// The running pass's reordered copies and oneDNN's (user-managed) scratchpad are in the caller's
// workspace, from the tensor allocator's arena: memory only while the pass runs. (A buffer kept
// here, grown to the largest pass, held 50 MB at R50@512 with Winograd's scratchpads; from the
// arena R50's peak RSS is 13 MB lower. Before the arena, the size-class cache made the workspace
// cost 106 MB more than the kept buffer.)

// oneDNN keeps the 1024 most recently created primitives (its default) and JIT-compiles anew any
// other. Multi-scale training without --pad-multiple gives a new input size nearly every batch:
// the deep layers' sizes recur (a few per side), but the new stem and layer1 primitives of every
// batch pushed them out of 1024. With 4096, issue 18's main-job model (no --pad-multiple) trains at
// 294-312 images/s instead of 256-278, and peaks at 461 MB instead of 269 after 3 epochs (about
// 45 KB of JIT code a primitive); the main job (--pad-multiple 16: a few dozen sizes) is unchanged
// in both (bench/README.md#main_job_speed). A capacity set in the environment is kept.
#define PRIMITIVE_CACHE_CAPACITY 4096

static void onednn_init_once(void) {
  if (!getenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY") && !getenv("DNNL_PRIMITIVE_CACHE_CAPACITY"))
    DNNL_CHECK(dnnl_set_primitive_cache_capacity(PRIMITIVE_CACHE_CAPACITY));
  DNNL_CHECK(dnnl_engine_create(&engine, dnnl_cpu, 0));
  DNNL_CHECK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
}

static void onednn_init(void) { pthread_once(&init_once, onednn_init_once); }

static void md_init_type(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims, dnnl_data_type_t type,
                         dnnl_format_tag_t tag) {
  DNNL_CHECK(dnnl_memory_desc_init_by_tag(md, ndims, dims, type, tag));
}
static void md_init(dnnl_memory_desc_t *md, int ndims, const dnnl_dims_t dims, dnnl_format_tag_t tag) {
  md_init_type(md, ndims, dims, dnnl_f32, tag);
}

// The data types of x, w and y in a pass: fp32, or for CONV_IMPL_ONEDNN_BF16 the pass's inputs in
// bf16 (converted by their reorders) and its output in fp32 (the accumulation's precision), as
// oneDNN's bf16 convolutions allow: forward x, w -> y; backward-data dy, w -> dx; backward-weights
// x, dy -> dw.
static void pass_types(ConvImpl impl, ConvPass pass, dnnl_data_type_t t[3]) {
  t[0] = t[1] = t[2] = dnnl_f32;
  if (impl != CONV_IMPL_ONEDNN_BF16) return;
  static const int output[3] = {[CONV_PASS_FWD] = 2, [CONV_PASS_BWD_DATA] = 0, [CONV_PASS_BWD_WEIGHTS] = 1};
  for (int i = 0; i < 3; i++)
    if (i != output[pass]) t[i] = dnnl_bf16;
}

static dnnl_memory_t mem_wrap(const dnnl_memory_desc_t *md, void *data) {
  dnnl_memory_t m;
  DNNL_CHECK(dnnl_memory_create(&m, md, engine, data));
  return m;
}

static dnnl_primitive_t reorder_create(const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to, bool accumulate) {
  dnnl_primitive_attr_t attr;
  DNNL_CHECK(dnnl_primitive_attr_create(&attr));
  if (accumulate) {  // to = 1 * to + from
    dnnl_post_ops_t po;
    DNNL_CHECK(dnnl_post_ops_create(&po));
    DNNL_CHECK(dnnl_post_ops_append_sum(po, 1.0f));
    DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, po));
    DNNL_CHECK(dnnl_post_ops_destroy(po));
  }
  dnnl_primitive_desc_t pd;
  DNNL_CHECK(dnnl_reorder_primitive_desc_create(&pd, from, engine, to, engine, attr));
  dnnl_primitive_t p;
  DNNL_CHECK(dnnl_primitive_create(&p, pd));
  DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
  DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
  return p;
}

// Each pass's arguments, in the order ConvPrim.a holds them: the two inputs, then the output.
static const int pass_args[3][3] = {
    [CONV_PASS_FWD] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
    [CONV_PASS_BWD_DATA] = {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC},
    [CONV_PASS_BWD_WEIGHTS] = {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS},
};

// The convolution descriptor of one pass on memory descriptors x/w/y (and bias when given).
static void conv_desc(dnnl_convolution_desc_t *d, const ConvGeom *g, ConvPass pass, dnnl_alg_kind_t alg,
                      const dnnl_memory_desc_t *x, const dnnl_memory_desc_t *w, const dnnl_memory_desc_t *y,
                      const dnnl_memory_desc_t *bias) {
  // oneDNN counts dilation from 0 (no dilation); right padding as torch's (floor in the
  // output-size formula, which oneDNN's consistency check shares).
  dnnl_dims_t strides = {g->stride_h, g->stride_w}, dil = {g->dil_h - 1, g->dil_w - 1};
  dnnl_dims_t pad = {g->pad_h, g->pad_w};
  switch (pass) {
    case CONV_PASS_FWD:
      DNNL_CHECK(dnnl_dilated_convolution_forward_desc_init(d, dnnl_forward_training, alg, x, w, bias, y, strides, dil,
                                                            pad, pad));
      break;
    case CONV_PASS_BWD_DATA:
      DNNL_CHECK(dnnl_dilated_convolution_backward_data_desc_init(d, alg, x, w, y, strides, dil, pad, pad));
      break;
    default:
      DNNL_CHECK(dnnl_dilated_convolution_backward_weights_desc_init(d, alg, x, w, bias, y, strides, dil, pad, pad));
  }
}

static void prim_destroy(ConvPrim *p) {
  DNNL_CHECK(dnnl_primitive_destroy(p->conv));
  if (p->fwd_pd) DNNL_CHECK(dnnl_primitive_desc_destroy(p->fwd_pd));
  for (int i = 0; i < 3; i++) {
    if (p->a[i].reorder) DNNL_CHECK(dnnl_primitive_destroy(p->a[i].reorder));
    if (p->a[i].reorder_set) DNNL_CHECK(dnnl_primitive_destroy(p->a[i].reorder_set));
    if (p->a[i].reorder_in) DNNL_CHECK(dnnl_primitive_destroy(p->a[i].reorder_in));
    if (p->a[i].reorder_via) DNNL_CHECK(dnnl_primitive_destroy(p->a[i].reorder_via));
  }
  memset(p, 0, sizeof *p);
}

// The forward's descriptor. On nhwc oneDNN 2.6 lists its brgemm convolution ("brgconv") first on
// AVX-512; for convolutions of up to 128 channels in and out its older direct one ("jit") runs as
// fast or faster (the main job's step 3-4%, its 3-channel stem 2x) and its code is made in about 60%
// of the time, which a new input size pays (`bench_ops 5 --conv-last`, `bench_step --vary-size`;
// bench/README.md#bench_step). So there the first other implementation is taken.
static dnnl_primitive_desc_t forward_pd_create(const dnnl_convolution_desc_t *d, const_dnnl_primitive_attr_t attr,
                                               const ConvGeom *g) {
  dnnl_primitive_desc_t pd = NULL;
  if (!g->channels_last || g->in_ch > 128 || g->out_ch > 128) {
    DNNL_CHECK(dnnl_primitive_desc_create(&pd, d, attr, engine, NULL));
    return pd;
  }
  dnnl_primitive_desc_iterator_t it;
  DNNL_CHECK(dnnl_primitive_desc_iterator_create(&it, d, attr, engine, NULL));
  for (;;) {  // oneDNN's order; the first that is not brgemm, else oneDNN's first
    dnnl_primitive_desc_t cand = dnnl_primitive_desc_iterator_fetch(it);
    DETR_CHECK(cand, "oneDNN: dnnl_primitive_desc_iterator_fetch gave no convolution");
    const char *name = NULL;
    DNNL_CHECK(dnnl_primitive_desc_query(cand, dnnl_query_impl_info_str, 0, &name));
    bool brgemm = !strncmp(name, "brg", 3);
    if (pd && brgemm) {
      DNNL_CHECK(dnnl_primitive_desc_destroy(cand));
    } else {  // oneDNN's first, or the first other one after it
      if (pd) DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
      pd = cand;
    }
    if (!brgemm || dnnl_primitive_desc_iterator_next(it) != dnnl_success) break;
  }
  DNNL_CHECK(dnnl_primitive_desc_iterator_destroy(it));
  return pd;
}

// dnnl_primitive_desc_create's descriptor, or NULL where oneDNN has no implementation of it
// (Winograd on a CPU or geometry it does not cover); any other failure fails.
static dnnl_primitive_desc_t pd_create_or_null(const dnnl_convolution_desc_t *d, const_dnnl_primitive_attr_t attr,
                                               const_dnnl_primitive_desc_t hint) {
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t st = dnnl_primitive_desc_create(&pd, d, attr, engine, hint);
  if (st == dnnl_unimplemented) return NULL;
  if (st != dnnl_success) DETR_FAIL("oneDNN: dnnl_primitive_desc_create failed: %s", dnnl_status2str(st));
  return pd;
}

// The dimensions of x [B, C, H, W] (B = 1: one image at a time), w [O, C, KH, KW] and y [B, O, HO, WO].
static void conv_dims(const ConvGeom *g, dnnl_dims_t xd, dnnl_dims_t wd, dnnl_dims_t yd) {
  xd[0] = g->batch, xd[1] = g->in_ch, xd[2] = g->in_h, xd[3] = g->in_w;
  wd[0] = g->out_ch, wd[1] = g->in_ch, wd[2] = g->kh, wd[3] = g->kw;
  yd[0] = g->batch, yd[1] = g->out_ch, yd[2] = g->out_h, yd[3] = g->out_w;
}

// The descriptor of pass with Winograd (format any everywhere: oneDNN's layouts), or NULL where
// oneDNN has none. bias: its [O] descriptor or NULL. hint: the forward's Winograd descriptor of
// the same geometry, for a backward pass (NULL: made here and dropped).
static dnnl_primitive_desc_t winograd_pd_create(const ConvGeom *g, ConvPass pass, const dnnl_memory_desc_t *bias,
                                                const_dnnl_primitive_attr_t attr, const_dnnl_primitive_desc_t hint) {
  dnnl_dims_t xd, wd, yd;
  conv_dims(g, xd, wd, yd);
  dnnl_memory_desc_t x, w, y;
  md_init(&x, 4, xd, dnnl_format_tag_any);
  md_init(&w, 4, wd, dnnl_format_tag_any);
  md_init(&y, 4, yd, dnnl_format_tag_any);
  dnnl_convolution_desc_t d;
  dnnl_primitive_desc_t fwd = NULL;
  if (pass == CONV_PASS_FWD || !hint) {
    conv_desc(&d, g, CONV_PASS_FWD, dnnl_convolution_winograd, &x, &w, &y, pass == CONV_PASS_FWD ? bias : NULL);
    fwd = pd_create_or_null(&d, attr, NULL);
    if (pass == CONV_PASS_FWD || !fwd) return fwd;
  }
  conv_desc(&d, g, pass, dnnl_convolution_winograd, &x, &w, &y, pass == CONV_PASS_BWD_WEIGHTS ? bias : NULL);
  dnnl_primitive_desc_t pd = pd_create_or_null(&d, attr, hint ? hint : fwd);
  if (fwd) DNNL_CHECK(dnnl_primitive_desc_destroy(fwd));
  return pd;
}

// The descriptor of pass with the direct convolution: on oneDNN's layouts (format any) for a
// blocked impl on nchw activations, on the nhwc buffers themselves with blocked weights for a
// blocked impl on channels-last ones, on the user's layouts for the plain impl. bias: its [O]
// descriptor or NULL. hint: the forward's direct descriptor of the same geometry and impl, for a
// backward pass (NULL: made here and dropped).
static dnnl_primitive_desc_t direct_pd_create(const ConvGeom *g, ConvPass pass, ConvImpl impl,
                                              const dnnl_memory_desc_t *bias, const_dnnl_primitive_attr_t attr,
                                              const_dnnl_primitive_desc_t hint) {
  dnnl_dims_t xd, wd, yd;
  conv_dims(g, xd, wd, yd);
  bool blocked = impl != CONV_IMPL_ONEDNN_PLAIN;
  dnnl_format_tag_t act = g->channels_last ? dnnl_nhwc : dnnl_nchw;  // dims stay in nchw order
  dnnl_format_tag_t xy_tag = blocked && !g->channels_last ? dnnl_format_tag_any : act;
  dnnl_format_tag_t w_tag = blocked ? dnnl_format_tag_any : dnnl_oihw;
  dnnl_data_type_t t[3], tf[3];  // this pass's types and the forward's
  pass_types(impl, pass, t);
  pass_types(impl, CONV_PASS_FWD, tf);
  dnnl_memory_desc_t xa, wa, ya;
  md_init_type(&xa, 4, xd, tf[0], xy_tag);
  md_init_type(&wa, 4, wd, tf[1], w_tag);
  md_init_type(&ya, 4, yd, tf[2], xy_tag);
  // The backward passes need the forward's descriptor as a hint (the layouts it chose).
  dnnl_convolution_desc_t d;
  dnnl_primitive_desc_t fwd = NULL, pd = NULL;
  if (pass == CONV_PASS_FWD || !hint) {
    conv_desc(&d, g, CONV_PASS_FWD, dnnl_convolution_direct, &xa, &wa, &ya, pass == CONV_PASS_FWD ? bias : NULL);
    fwd = forward_pd_create(&d, attr, g);
  }
  if (pass == CONV_PASS_FWD) return fwd;
  md_init_type(&xa, 4, xd, t[0], xy_tag);
  md_init_type(&wa, 4, wd, t[1], w_tag);
  md_init_type(&ya, 4, yd, t[2], xy_tag);
  conv_desc(&d, g, pass, dnnl_convolution_direct, &xa, &wa, &ya, pass == CONV_PASS_BWD_WEIGHTS ? bias : NULL);
  DNNL_CHECK(dnnl_primitive_desc_create(&pd, &d, attr, engine, hint ? hint : fwd));
  if (fwd) DNNL_CHECK(dnnl_primitive_desc_destroy(fwd));
  return pd;
}

// The forward's post-ops (CONV_POST_*): dst = relu?(conv + bias + 1 * dst), dst holding the
// residual before the call when CONV_POST_SUM.
static void attr_set_post_ops(dnnl_primitive_attr_t attr, unsigned post) {
  if (!post) return;
  dnnl_post_ops_t po;
  DNNL_CHECK(dnnl_post_ops_create(&po));
  if (post & CONV_POST_SUM) DNNL_CHECK(dnnl_post_ops_append_sum(po, 1.0f));
  if (post & CONV_POST_RELU) DNNL_CHECK(dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f));
  DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, po));
  DNNL_CHECK(dnnl_post_ops_destroy(po));
}

// A plain oihw weight into a bf16 layout that keeps each tap's input channels together (its input
// channel blocks inside the kernel's rows and columns: brgconv's AcdB32a2b and AcdB64a2b) goes
// through ohwi in bf16 first: oneDNN 2.6's one-step reorder gathers the pairs of input channels 9
// floats apart and runs 1.1-2.1x slower than the two steps (a plain transposition, then a reorder
// reading each tap's channels in a row; `bench_weight_reorder`, 64-512 channels, cold caches:
// 512x512x3x3 1.9 against 1.2 ms). Into the layouts that keep the taps innermost (ABcd8a16b2a), and
// in fp32, the one step is mostly the faster (bench/README.md#weight_reorder).
static bool weight_goes_via_ohwi(const dnnl_memory_desc_t *user, const dnnl_memory_desc_t *prim) {
  if (user->ndims != 4 || user->data_type != dnnl_f32 || prim->data_type != dnnl_bf16 ||
      prim->format_kind != dnnl_blocked || user->dims[2] * user->dims[3] == 1)
    return false;
  dnnl_memory_desc_t oihw, ohwi;
  md_init_type(&oihw, 4, user->dims, dnnl_f32, dnnl_oihw);
  md_init_type(&ohwi, 4, user->dims, dnnl_bf16, dnnl_ohwi);  // the intermediate itself: one step
  const dnnl_dims_t *st = &prim->format_desc.blocking.strides;
  return dnnl_memory_desc_equal(user, &oihw) && !dnnl_memory_desc_equal(prim, &ohwi) && (*st)[1] < (*st)[2] &&
         (*st)[1] < (*st)[3];
}

// hint: the forward's descriptor of the same geometry and impl, for a backward pass (NULL: made
// here and dropped); hint_winograd: whether it is a Winograd one. post: the forward's post-ops.
static void prim_create(ConvPrim *p, const ConvGeom *g, ConvPass pass, ConvImpl impl, bool bias, unsigned post,
                        const_dnnl_primitive_desc_t hint, bool hint_winograd) {
  dnnl_dims_t xd, wd, yd, bd = {g->out_ch};  // bias [O]
  conv_dims(g, xd, wd, yd);
  dnnl_memory_desc_t xu, wu, yu, bmd;
  dnnl_format_tag_t act = g->channels_last ? dnnl_nhwc : dnnl_nchw;  // dims stay in nchw order
  md_init(&xu, 4, xd, act);
  md_init(&wu, 4, wd, dnnl_oihw);
  md_init(&yu, 4, yd, act);
  md_init(&bmd, 1, bd, dnnl_x);
  dnnl_primitive_attr_t attr;
  DNNL_CHECK(dnnl_primitive_attr_create(&attr));
  DNNL_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
  attr_set_post_ops(attr, post);

  dnnl_primitive_desc_t pd = NULL;
  if (impl == CONV_IMPL_ONEDNN_WINOGRAD)
    pd = winograd_pd_create(g, pass, bias ? &bmd : NULL, attr, hint_winograd ? hint : NULL);
  bool winograd = pd != NULL;
  if (!winograd) pd = direct_pd_create(g, pass, impl, bias ? &bmd : NULL, attr, hint_winograd ? NULL : hint);
  DNNL_CHECK(dnnl_primitive_attr_destroy(attr));

  const dnnl_memory_desc_t *users[3][3] = {
      [CONV_PASS_FWD] = {&xu, &wu, &yu},
      [CONV_PASS_BWD_DATA] = {&yu, &wu, &xu},
      [CONV_PASS_BWD_WEIGHTS] = {&xu, &yu, &wu},
  };
  memset(p, 0, sizeof *p);
  p->g = *g;
  p->pass = pass;
  p->impl = impl;
  p->winograd = winograd;
  p->bias = bias;
  p->post = post;
  p->bias_md = bmd;
  for (int i = 0; i < 3; i++) {
    ConvArg *a = &p->a[i];
    a->arg = pass_args[pass][i];
    a->user = *users[pass][i];
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, a->arg);
    DETR_CHECK(md, "oneDNN: dnnl_primitive_desc_query_md found no memory for argument %d", a->arg);
    a->prim = *md;
    bool same = dnnl_memory_desc_equal(&a->user, &a->prim);
    bool weight = i == 1 && pass != CONV_PASS_BWD_WEIGHTS;
    if (weight && !same && weight_goes_via_ohwi(&a->user, &a->prim)) {
      md_init_type(&a->via, 4, a->user.dims, a->prim.data_type, dnnl_ohwi);
      a->reorder_via = reorder_create(&a->user, &a->via, false);
      a->reorder = reorder_create(&a->via, &a->prim, false);
    } else if (i < 2) {
      dnnl_memory_desc_t act16;  // an activation's plain layout in bf16
      md_init_type(&act16, 4, a->user.dims, dnnl_bf16, act);
      a->takes16 = !weight && dnnl_memory_desc_equal(&act16, &a->prim);
      if (!same) a->reorder = reorder_create(&a->user, &a->prim, false);
    } else if (!same) {  // the backward passes' accumulate (the sum post-op)
      a->reorder = reorder_create(&a->prim, &a->user, pass != CONV_PASS_FWD);
      if (post & CONV_POST_SUM) a->reorder_in = reorder_create(&a->user, &a->prim, false);
    }
  }
  const dnnl_memory_desc_t *scratch_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  p->scratch_bytes = scratch_md ? dnnl_memory_desc_get_size(scratch_md) : 0;
  DNNL_CHECK(dnnl_primitive_create(&p->conv, pd));
  if (pass == CONV_PASS_FWD) p->fwd_pd = pd;  // kept for the backward passes' hint
  else DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
}

// The cached primitive of (g, pass, impl, bias, post), created on first use. A primitive made for
// fewer threads than OpenMP now runs (the C API's thread option raises them) is not used: oneDNN
// sizes its per-thread scratchpad and work split when it makes one. Training's CPU share only
// lowers the count below the one its primitives were made at.
static ConvPrim *prim_get(const ConvGeom *g, ConvPass pass, ConvImpl impl, bool bias, unsigned post) {
  onednn_init();
  int nthr = omp_get_max_threads();
  ConvPrim *victim = &cache[0], *forward = NULL;  // forward: this geometry's forward entry
  for (int i = 0; i < CONV_CACHE_SIZE; i++) {
    ConvPrim *p = &cache[i];
    if (p->used && p->impl == impl && p->nthr >= nthr && !memcmp(&p->g, g, sizeof *g)) {
      if (p->pass == pass && p->bias == bias && p->post == post) {
        p->used = ++cache_clock;
        return p;
      }
      if (p->pass == CONV_PASS_FWD && !p->post) forward = p;
    }
    if (p->used < victim->used) victim = p;
  }
  // A backward pass takes the forward's descriptor as its hint: one forward descriptor less to
  // make per new shape (their implementation choice is most of a primitive's creation time).
  if (victim == forward) forward = NULL;
  if (victim->used) prim_destroy(victim);
  bool hint = pass != CONV_PASS_FWD && forward;
  prim_create(victim, g, pass, impl, bias, post, hint ? forward->fwd_pd : NULL, hint && forward->winograd);
  victim->nthr = nthr;
  victim->used = ++cache_clock;
  return victim;
}

static size_t round64(size_t bytes) { return (bytes + 63) / 64 * 64; }

// A pack's entries: the weight w reordered into one primitive's layout (md).
#define WEIGHT_PACK_LAYOUTS 4
struct ConvWeightPack {
  const float *w;  // the weight it holds copies of (bound at the first use)
  struct {
    dnnl_memory_desc_t md;
    void *data;     // dnnl_memory_desc_get_size(md) bytes, 64-byte aligned
    uint64_t used;  // LRU stamp; 0: empty
  } copy[WEIGHT_PACK_LAYOUTS];
  uint64_t clock;
};

static void reorder_run(dnnl_primitive_t r, const dnnl_memory_desc_t *from_md, const void *from,
                        const dnnl_memory_desc_t *to_md, void *to) {
  dnnl_memory_t mf = mem_wrap(from_md, (void *)from), mt = mem_wrap(to_md, to);
  dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, mf}, {DNNL_ARG_TO, mt}};
  DNNL_CHECK(dnnl_primitive_execute(r, stream, 2, args));
  DNNL_CHECK(dnnl_memory_destroy(mf));
  DNNL_CHECK(dnnl_memory_destroy(mt));
}

// Input argument a from its plain buffer into a->prim's layout at `to`; via: room for a->via where
// the weight goes in two steps (weight_goes_via_ohwi), else unused.
static void input_reorder_run(const ConvArg *a, const void *from, void *to, void *via) {
  if (a->reorder_via) {
    reorder_run(a->reorder_via, &a->user, from, &a->via, via);
    reorder_run(a->reorder, &a->via, via, &a->prim, to);
  } else {
    reorder_run(a->reorder, &a->user, from, &a->prim, to);
  }
}

// An input from its plain buffer into the pass's layout: where that is the plain layout in bf16
// (takes16) the reorder only rounds, which cpu_round_bf16 does by the same instruction without the
// reorder's costs (2.7x as fast at 2 threads for 2M floats, more for fewer; kernels/cpu/matmul_bf16.c).
static void input_to_prim(const ConvArg *a, const void *from, void *to, void *via) {
  if (a->takes16) {
    cpu_round_bf16(from, 1, (int64_t)(dnnl_memory_desc_get_size(&a->user) / sizeof(float)), to);
    return;
  }
  input_reorder_run(a, from, to, via);
}

// Bytes of a's intermediate copy (two-step weights), 64-byte rounded; 0 for one step.
static size_t via_bytes(const ConvArg *a) { return a->reorder_via ? round64(dnnl_memory_desc_get_size(&a->via)) : 0; }

// The weight argument a (plain w -> a->prim) from the pack: its kept copy, reordered on first use.
static void *weight_pack_copy(ConvWeightPack *pack, const ConvArg *a, const float *w) {
  if (!pack->w) pack->w = w;
  DETR_CHECK(pack->w == w, "conv2d: a weight pack holds another weight's copies");
  int victim = 0;
  for (int i = 0; i < WEIGHT_PACK_LAYOUTS; i++) {
    if (pack->copy[i].used && dnnl_memory_desc_equal(&pack->copy[i].md, &a->prim)) {
      pack->copy[i].used = ++pack->clock;
      return pack->copy[i].data;
    }
    if (pack->copy[i].used < pack->copy[victim].used) victim = i;
  }
  free(pack->copy[victim].data);
  void *data = detr_aligned_malloc(64, dnnl_memory_desc_get_size(&a->prim), "a convolution's kept weight copy");
  void *via = a->reorder_via ? detr_aligned_malloc(64, via_bytes(a), "a convolution weight's ohwi copy") : NULL;
  input_reorder_run(a, w, data, via);
  free(via);
  pack->copy[victim].md = a->prim;
  pack->copy[victim].data = data;
  pack->copy[victim].used = ++pack->clock;
  return data;
}

// Whether a pass of p run `batch` times goes through a copy of its output: where the layouts
// differ (reordered into out, with a sum when accumulating) or where it accumulates (added into
// out). One image at a time, dw is shared: the first image writes it (when not accumulating), the
// others add.
static bool pass_out_copy(const ConvPrim *p, int64_t batch, bool accumulate) {
  bool shared_out = p->pass == CONV_PASS_BWD_WEIGHTS;
  return p->a[2].reorder || accumulate || (shared_out && batch > 1);
}

// Whether argument i of p comes from a ConvWeightPack (packed: one is given) instead of the
// workspace: the forward's weight.
static bool arg_packed(const ConvPrim *p, int i, bool packed) { return packed && p->pass == CONV_PASS_FWD && i == 1; }

// Workspace bytes of one pass: its prim-layout copies (out_copy: the output's; none for an argument
// a pack holds), backward-weights' dbias [O], the scratchpad.
static size_t pass_buffer_bytes(const ConvPrim *p, bool out_copy, bool packed) {
  size_t bytes = round64(p->scratch_bytes);
  for (int i = 0; i < 3; i++)
    if (i < 2 ? p->a[i].reorder != NULL && !arg_packed(p, i, packed) : out_copy)
      bytes += round64(dnnl_memory_desc_get_size(&p->a[i].prim)) + (i < 2 ? via_bytes(&p->a[i]) : 0);
  if (p->pass == CONV_PASS_BWD_WEIGHTS && p->bias) bytes += round64((size_t)p->g.out_ch * sizeof(float));
  return bytes;
}

// One run's output from its copy (buf) into the plain buffer (img, out_floats): the forward's
// reordered, a backward pass's added (add) or written; nothing where the pass wrote img itself.
static void pass_output(const ConvPrim *p, bool add, bool out_copy, const float *buf, float *img, int64_t out_floats) {
  if (p->a[2].reorder) {  // the forward's writes; a backward pass's sums, or writes (reorder_set)
    dnnl_primitive_t r = p->pass == CONV_PASS_FWD || add ? p->a[2].reorder : p->a[2].reorder_set;
    reorder_run(r, &p->a[2].prim, buf, &p->a[2].user, img);
  } else if (out_copy) {  // the same layout
    if (add) {
#pragma omp parallel for schedule(static) if (out_floats > PARALLEL_MIN_LIGHT)
      for (int64_t j = 0; j < out_floats; j++) img[j] += buf[j];
    } else {
      memcpy(img, buf, (size_t)out_floats * sizeof(float));
    }
  }
}

// Runs one pass of primitive p (of batch p->g.batch) `batch` times over consecutive parts of the
// buffers: in0, in1 plain inputs, out the plain output (overwritten by the forward, accumulated
// into by the backward passes where `accumulate`); bias: the forward's bias or backward-weights'
// dbias (accumulated), NULL when p has none. in16: NULL, or per input its dense bf16 copy on the
// plain layout (NULL where none), read as is in place of converting the input (an argument that
// takes16). pack: the forward's weight copies kept between calls, or NULL. workspace:
// pass_buffer_bytes(p, pass_out_copy(...), pack != NULL).
static void pass_run(ConvPrim *p, int64_t batch, bool accumulate, const float *in0, const float *in1,
                     const uint16_t *const *in16, float *out, float *bias, char *workspace, ConvWeightPack *pack) {
  const ConvGeom *g = &p->g;
  int64_t x_img = g->in_ch * g->in_h * g->in_w, y_img = g->out_ch * g->out_h * g->out_w;
  // What each argument holds: 1: x or dx, 2: y or dy (both per image), 0: w or dw (shared).
  static const int holds[3][3] = {
      [CONV_PASS_FWD] = {1, 0, 2}, [CONV_PASS_BWD_DATA] = {2, 0, 1}, [CONV_PASS_BWD_WEIGHTS] = {1, 2, 0}};
  int64_t step[3];  // elements from one image to the next in each plain argument
  for (int i = 0; i < 3; i++) step[i] = holds[p->pass][i] == 1 ? x_img : holds[p->pass][i] == 2 ? y_img : 0;

  bool shared_out = !step[2];
  bool out_copy = pass_out_copy(p, batch, accumulate);
  if (p->a[2].reorder && p->pass != CONV_PASS_FWD && !accumulate && !p->a[2].reorder_set)
    p->a[2].reorder_set = reorder_create(&p->a[2].prim, &p->a[2].user, false);  // a gradient to be written
  // The output's floats per call: the primitive's images (g->batch of them), or dw.
  int64_t out_floats = step[2] ? step[2] * g->batch : g->out_ch * g->in_ch * g->kh * g->kw;
  char *ws = workspace;
  void *scratchpad = ws;
  ws += round64(p->scratch_bytes);
  const char *user[3] = {(const char *)in0, (const char *)in1, (const char *)out};
  size_t elem[3] = {sizeof(float), sizeof(float), sizeof(float)};  // bytes per element of each plain argument
  bool as_is[2] = {false, false};                                  // an input read from its bf16 copy
  for (int i = 0; i < 2; i++) {
    if (!in16 || !in16[i]) continue;
    DETR_CHECK(p->a[i].takes16,
               "onednn_conv2d_run: input %d of pass %d is given in bf16, which the pass does not "
               "read on its plain layout",
               i, (int)p->pass);
    user[i] = (const char *)in16[i], elem[i] = sizeof(uint16_t), as_is[i] = true;
  }
  void *buf[3] = {NULL, NULL, NULL};  // prim-layout copies
  for (int i = 0; i < 3; i++) {
    if (i < 2 ? !p->a[i].reorder || as_is[i] : !out_copy) continue;
    if (arg_packed(p, i, pack != NULL)) {  // the weight, kept reordered
      buf[i] = weight_pack_copy(pack, &p->a[i], (const float *)user[i]);
      continue;
    }
    buf[i] = ws;
    ws += round64(dnnl_memory_desc_get_size(&p->a[i].prim));
    if (i < 2 && !step[i]) {  // the weight: once per call (its intermediate copy after the copies)
      input_to_prim(&p->a[i], user[i], buf[i], ws);
      ws += via_bytes(&p->a[i]);
    }
  }
  int64_t O = g->out_ch;
  float *dbias = p->pass == CONV_PASS_BWD_WEIGHTS && p->bias ? (float *)ws : NULL;  // [O], added into bias

  dnnl_exec_arg_t args[5];
  int n = 0;
  for (int i = 0; i < 3; i++)
    args[n].arg = p->a[i].arg, args[n].memory = mem_wrap(&p->a[i].prim, buf[i] ? buf[i] : (void *)user[i]), n++;
  if (p->bias) {
    args[n].arg = p->pass == CONV_PASS_FWD ? DNNL_ARG_BIAS : DNNL_ARG_DIFF_BIAS;
    args[n].memory = mem_wrap(&p->bias_md, dbias ? dbias : bias), n++;
  }
  if (p->scratch_bytes) {
    dnnl_memory_desc_t smd;
    dnnl_dims_t sd = {(int64_t)p->scratch_bytes};
    DNNL_CHECK(dnnl_memory_desc_init_by_tag(&smd, 1, sd, dnnl_u8, dnnl_x));
    args[n].arg = DNNL_ARG_SCRATCHPAD;
    args[n].memory = mem_wrap(&smd, scratchpad), n++;
  }
  for (int64_t b = 0; b < batch; b++) {
    char *img[3];  // this image's part of each plain argument (the weights: all of them)
    for (int i = 0; i < 3; i++) img[i] = (char *)user[i] + (size_t)(b * step[i]) * elem[i];
    for (int i = 0; i < 3; i++) {
      if (!step[i]) continue;
      if (!buf[i]) DNNL_CHECK(dnnl_memory_set_data_handle(args[i].memory, img[i]));
      else if (i < 2) input_to_prim(&p->a[i], img[i], buf[i], NULL);
    }
    if (p->a[2].reorder_in) reorder_run(p->a[2].reorder_in, &p->a[2].user, img[2], &p->a[2].prim, buf[2]);
    DNNL_CHECK(dnnl_primitive_execute(p->conv, stream, n, args));
    pass_output(p, accumulate || (shared_out && b > 0), out_copy, buf[2], (float *)img[2], out_floats);
    if (dbias)
      for (int64_t o = 0; o < O; o++) bias[o] += dbias[o];
  }
  for (int i = 0; i < n; i++) DNNL_CHECK(dnnl_memory_destroy(args[i].memory));
}

// A pass whose whole batch of x and y takes at most CONV_WHOLE_BATCH_BYTES runs as one primitive
// over the batch; a larger one image at a time, which keeps the layout copies at one image's size
// (R50 at 512x512, batch 2: 16-24 MB less peak RSS than whole-batch copies, the same step time).
// Small convolutions gain from one call per batch: fewer calls and reorders (backward-weights
// converts and sums dw once, not once per image) and more parallel work per call. `bench_step`,
// alternating: the main job's step 4.5% faster, issue 18's model's 10%, detr-r18-small's and R50's
// 2-4%; peak RSS 1.4 MB more for the main job's, the same for R18 and R50 (at 16 MiB R50 took 22 MB
// more; bench/README.md#bench_step).
#define CONV_WHOLE_BATCH_BYTES ((int64_t)8 << 20)

// The size a benchmark sets (the bound runtime's, core/runtime.h), else CONV_WHOLE_BATCH_BYTES.
static int64_t whole_batch_bytes(void) {
  const Runtime *rt = runtime_bound();
  return rt && rt->conv_whole_batch_bytes >= 0 ? rt->conv_whole_batch_bytes : CONV_WHOLE_BATCH_BYTES;
}

int64_t onednn_conv2d_set_whole_batch_bytes(int64_t bytes) {
  int64_t before = whole_batch_bytes();
  runtime_current()->conv_whole_batch_bytes = bytes < 0 ? -1 : bytes;
  return before;
}

static bool has_winograd;  // written once (winograd_once)
static pthread_once_t winograd_once = PTHREAD_ONCE_INIT;

static void winograd_probe(void) {  // a 16-channel 3x3 convolution on 8x8, the simplest Winograd covers
  onednn_init();
  ConvGeom g = {.batch = 1,
                .in_ch = 16,
                .in_h = 8,
                .in_w = 8,
                .out_ch = 16,
                .out_h = 8,
                .out_w = 8,
                .kh = 3,
                .kw = 3,
                .stride_h = 1,
                .stride_w = 1,
                .pad_h = 1,
                .pad_w = 1,
                .dil_h = 1,
                .dil_w = 1};
  dnnl_primitive_desc_t pd = winograd_pd_create(&g, CONV_PASS_FWD, NULL, NULL, NULL);
  has_winograd = pd != NULL;
  if (pd) DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
}

bool onednn_conv2d_has_winograd(void) {
  pthread_once(&winograd_once, winograd_probe);
  return has_winograd;
}

// The geometry a pass of g runs on (*runs times): the whole batch at once (1), or one image at a
// time (g->batch).
static ConvGeom pass_geometry(const ConvGeom *g, ConvPass pass, ConvImpl impl, bool accumulate, int64_t *runs) {
  // Channels last: no copies of x or y are made (oneDNN's direct convolution runs on nhwc itself),
  // so the whole batch always, but for a dx that accumulates (computed into a copy, then added) and
  // for Winograd (on nChw16c copies) and bf16 (on converted copies), which follow the size rule so that the copies stay at one
  // image's size for large maps.
  bool copies = !g->channels_last || impl == CONV_IMPL_ONEDNN_WINOGRAD || impl == CONV_IMPL_ONEDNN_BF16 ||
                (pass == CONV_PASS_BWD_DATA && accumulate);
  ConvGeom run = *g;
  *runs = 1;
  if (copies && (g->in_ch * g->in_h * g->in_w + g->out_ch * g->out_h * g->out_w) * g->batch * (int64_t)sizeof(float) >
                    whole_batch_bytes()) {
    run.batch = 1;  // one image's primitive, shared by every batch size
    *runs = g->batch;
  }
  return run;
}

// The primitive that runs a pass of g, and how many times (*runs). Winograd on a CPU without it is
// the direct convolution, the same entries.
static ConvPrim *pass_prim(const ConvGeom *g, ConvPass pass, ConvImpl impl, bool accumulate, bool bias, unsigned post,
                           int64_t *runs) {
  DETR_CHECK(impl == CONV_IMPL_ONEDNN || impl == CONV_IMPL_ONEDNN_PLAIN || impl == CONV_IMPL_ONEDNN_WINOGRAD ||
                 impl == CONV_IMPL_ONEDNN_BF16,
             "onednn_conv2d: implementation %d is not oneDNN's", (int)impl);
  if (impl == CONV_IMPL_ONEDNN_WINOGRAD && !onednn_conv2d_has_winograd()) impl = CONV_IMPL_ONEDNN;
  ConvGeom run = pass_geometry(g, pass, impl, accumulate, runs);
  return prim_get(&run, pass, impl, bias, post);
}

// Winograd's workspace per (geometry, pass), from its descriptor alone (no primitive, no JIT), so
// that conv.c can weigh it before choosing: the last WINOGRAD_SIZES asked, least recently used
// dropped. Its scratchpad grows with the thread count (a transformed dW per thread), which is
// part of the key (the C API's thread option changes it between calls).
#define WINOGRAD_SIZES 256
static struct {
  ConvGeom g;
  ConvPass pass;
  int nthr;        // OpenMP's thread count: the scratchpad's size depends on it
  int64_t floats;  // -1: no Winograd for it
  uint64_t used;
} winograd_sizes[WINOGRAD_SIZES];
static uint64_t winograd_sizes_clock;

static int64_t winograd_workspace_floats_locked(const ConvGeom *g, ConvPass pass);

int64_t onednn_conv2d_winograd_workspace_floats(const ConvGeom *g, ConvPass pass) {
  if (!onednn_conv2d_has_winograd()) return -1;
  pthread_mutex_lock(&cache_lock);
  int64_t floats = winograd_workspace_floats_locked(g, pass);
  pthread_mutex_unlock(&cache_lock);
  return floats;
}

static int64_t winograd_workspace_floats_locked(const ConvGeom *g, ConvPass pass) {
  int64_t runs;
  ConvGeom run = pass_geometry(g, pass, CONV_IMPL_ONEDNN_WINOGRAD, false, &runs);
  int victim = 0;
  for (int i = 0; i < WINOGRAD_SIZES; i++) {
    if (winograd_sizes[i].used && winograd_sizes[i].pass == pass && winograd_sizes[i].nthr == omp_get_max_threads() &&
        !memcmp(&winograd_sizes[i].g, &run, sizeof run)) {
      winograd_sizes[i].used = ++winograd_sizes_clock;
      return winograd_sizes[i].floats;
    }
    if (winograd_sizes[i].used < winograd_sizes[victim].used) victim = i;
  }
  dnnl_primitive_attr_t attr;
  DNNL_CHECK(dnnl_primitive_attr_create(&attr));
  DNNL_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
  dnnl_primitive_desc_t pd = winograd_pd_create(&run, pass, NULL, attr, NULL);
  DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
  int64_t floats = -1;
  if (pd) {  // as pass_buffer_bytes: the scratchpad and a copy of each argument (all in Winograd's layouts)
    const dnnl_memory_desc_t *scratch = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t bytes = scratch ? round64(dnnl_memory_desc_get_size(scratch)) : 0;
    for (int i = 0; i < 3; i++)
      bytes += round64(
          dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, pass_args[pass][i])));
    floats = (int64_t)((bytes + sizeof(float) - 1) / sizeof(float));
    DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
  }
  winograd_sizes[victim].g = run;
  winograd_sizes[victim].pass = pass;
  winograd_sizes[victim].nthr = omp_get_max_threads();
  winograd_sizes[victim].floats = floats;
  winograd_sizes[victim].used = ++winograd_sizes_clock;
  return floats;
}

int64_t onednn_conv2d_workspace_floats(const ConvGeom *g, ConvPass pass, ConvImpl impl, bool accumulate, bool bias) {
  int64_t runs;
  pthread_mutex_lock(&cache_lock);
  const ConvPrim *p = pass_prim(g, pass, impl, accumulate, bias, 0, &runs);
  size_t bytes = pass_buffer_bytes(p, pass_out_copy(p, runs, accumulate), false);
  pthread_mutex_unlock(&cache_lock);
  return (int64_t)((bytes + sizeof(float) - 1) / sizeof(float));
}

void onednn_conv2d_run(const ConvGeom *g, ConvPass pass, ConvImpl impl, bool accumulate, const float *in0,
                       const float *in1, const uint16_t *const *in16, float *out, float *bias, float *workspace) {
  DETR_CHECK(!bias || pass != CONV_PASS_BWD_DATA, "onednn_conv2d_run: backward-data has no bias");
  DETR_CHECK(pass != CONV_PASS_FWD || !accumulate, "onednn_conv2d_run: the forward writes y");
  DETR_CHECK(((uintptr_t)workspace & 63) == 0, "onednn_conv2d_run: the workspace is not 64-byte aligned");
  int64_t runs;
  pthread_mutex_lock(&cache_lock);
  ConvPrim *p = pass_prim(g, pass, impl, accumulate, bias != NULL, 0, &runs);
  pass_run(p, runs, accumulate, in0, in1, in16, out, bias, (char *)workspace, NULL);
  pthread_mutex_unlock(&cache_lock);
}

int64_t onednn_conv2d_forward_post_workspace_floats(const ConvGeom *g, ConvImpl impl, bool bias, unsigned post,
                                                    bool packed) {
  int64_t runs;
  pthread_mutex_lock(&cache_lock);
  const ConvPrim *p = pass_prim(g, CONV_PASS_FWD, impl, false, bias, post, &runs);
  size_t bytes = pass_buffer_bytes(p, pass_out_copy(p, runs, false), packed);
  pthread_mutex_unlock(&cache_lock);
  return (int64_t)((bytes + sizeof(float) - 1) / sizeof(float));
}

void onednn_conv2d_forward_post(const ConvGeom *g, ConvImpl impl, unsigned post, const float *x, const float *w,
                                float *y, const float *bias, float *workspace, ConvWeightPack *pack) {
  DETR_CHECK(((uintptr_t)workspace & 63) == 0, "onednn_conv2d_forward_post: the workspace is not 64-byte aligned");
  int64_t runs;
  pthread_mutex_lock(&cache_lock);
  ConvPrim *p = pass_prim(g, CONV_PASS_FWD, impl, false, bias != NULL, post, &runs);
  pass_run(p, runs, false, x, w, NULL, y, (float *)bias, (char *)workspace, pack);
  pthread_mutex_unlock(&cache_lock);
}

const char *onednn_conv2d_impl(const ConvGeom *g, ConvPass pass, ConvImpl impl) {
  ConvGeom one = *g;
  one.batch = 1;
  pthread_mutex_lock(&cache_lock);  // the name is the primitive's: valid while it stays cached
  ConvPrim *p = prim_get(&one, pass, impl, false, 0);
  const_dnnl_primitive_desc_t pd;
  DNNL_CHECK(dnnl_primitive_get_primitive_desc(p->conv, &pd));
  const char *name = NULL;
  DNNL_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name));
  pthread_mutex_unlock(&cache_lock);
  return name;
}

#else
struct ConvWeightPack {
  int unused;  // no copies: without oneDNN nothing is reordered
};
#endif

ConvWeightPack *conv_weight_pack_new(void) { return detr_calloc(1, sizeof(ConvWeightPack), "a conv weight pack"); }

void conv_weight_pack_free(ConvWeightPack *pack) {
  if (!pack) return;
#if DETR_HAVE_ONEDNN
  for (int i = 0; i < WEIGHT_PACK_LAYOUTS; i++) free(pack->copy[i].data);
#endif
  free(pack);
}
