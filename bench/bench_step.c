// The whole DETR training step of detr-c: forward, loss, backward, gradient clipping, AdamW.
//   build/bench/bench_step [--preset detr-r18-small] [--size 320 | --hw HxW] [--batch 2] [--boxes 3]
//                          [--reps 5] [--enact] [--profile] [--forward] [--device cpu|cuda]
//                          [--conv auto | im2col | onednn | onednn-nchw | onednn-winograd] [--vary-size]
//                          [--precision fp32 | tf32 | bf16] [--set key=value ...]   (any model config
//                          field, e.g. --set tf32=true; --precision sets tf32 or bf16)
//                          [--weights W.safetensors] [--batch-file B.safetensors] [--capture]
//                          [--conv-survey]
// --forward times the no-grad forward alone (e.g. detr-r50 on one 800x1066 image: --batch 1
// --hw 800x1066 --forward). --conv forces one CPU convolution implementation everywhere (default
// auto: the faster per shape and pass). --vary-size gives every step its own input size, 8 and 12
// pixels smaller each (as multi-scale training's batches have): the times include creating the
// new shapes' oneDNN primitives.
// --weights loads the parameters (reference names, as `detr step --weights`) over the seeded
// initialisation; --batch-file takes the images, mask and targets from a `detr step` batch file
// (its B, H, W replace --batch and --hw): tools/gpu_bench.sh gives both implementations the same.
// Prints one JSON line: median step seconds over reps (after one warm-up step), the steps' times,
// the warm-up step's loss (first_loss: with the same weights and batch, PyTorch's should be close;
// dropout draws differ),
// the peak resident memory of the process (getrusage), and the tensor allocator's peak live bytes,
// cached bytes at the end, and peak of live + cached; with --device cuda also the device's name,
// the caching allocator's peak live and peak live + cached device memory, and the device memory in
// use at the end as the driver reports it (cudaMemGetInfo: every process, the CUDA context, cuBLAS
// and cuDNN included; the allocator never returns memory, so this is the step's high-water mark).
// --capture (with --device cuda): a profiler's capture covers the timed steps only (cudaProfilerStart
// after the warm-up, Stop after the last: ncu --profile-from-start off, tools/gpu_bench.sh --profile).
// --profile adds the per-op breakdown (on the CPU only: GPU work is asynchronous, so host-side op
// times say little there; use Nsight Systems).
// --pair-fp32 (with --precision bf16): each rep runs a bf16 step and an fp32 step of the same model,
// in turn (the order swapped every rep), and the line adds the fp32 steps, their median and the
// ratio of each rep's bf16 step to its fp32 one: the two precisions measured seconds apart, where
// separate runs on a shared machine meet different neighbours (bench/README.md#bench_step).
// --conv-survey (with --device cuda): after the warm-up step, instead of timed steps, the cost of
// the cuDNN algorithm choice: every convolution pass the step ran (geometry, direction, runs a
// step) timed by cuDNN's Find in every algorithm, and the step's convolution milliseconds with the
// algorithms detr-c picks deterministically (its default), the ones it picks with
// DETR_CUDNN_DETERMINISTIC=0 (cuDNN's heuristic order), the fastest, and the fastest deterministic
// ones, summed over the passes where all four are timed (the others counted apart). The first line
// is the summary with the passes where determinism costs most; one line a pass follows. Find's
// times leave out what detr-c adds around cuDNN (bf16 staging copies, channels-last weight copies)
// and are taken with beta = 0 on zero tensors, where the backward accumulates (beta = 1).
// bench/compare_torch.sh runs this and bench/torch_step.py alternately.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "core/runtime.h"
#include "api/model_file.h"
#include "kernels/cpu/cpu_kernels.h"
#if DETR_HAVE_CUDA
#include "kernels/cuda/cuda_kernels.h"
#endif
#include "nn/detr.h"
#include "nn/model_io.h"
#include "train/optim.h"
#include "train/step_batch.h"
#include "bench/bench_util.h"

// Waits for the device's queued work, so that a step's time includes it.
static void device_sync(Device dev) {
#if DETR_HAVE_CUDA
  if (dev == DEVICE_CUDA) cuda_synchronize();
#endif
  (void)dev;
}

// The command line's settings.
typedef struct {
  const char *preset, *weights, *batch_file, *precision;
  int size, boxes, reps, batch, height, width;
  float num_boxes;   // the loss's normaliser: the batch's boxes
  float first_loss;  // the warm-up step's total loss (a check that both sides run the same model)
  bool enact, profile, forward_only, vary, capture, pair_fp32, conv_survey;
  Device dev;
  const char *sets[32];
  int n_sets;
} StepArgs;

// --capture: a profiler's capture on (before the first timed step) or off (after the last).
static void capture(const StepArgs *a, bool on) {
#if DETR_HAVE_CUDA
  if (a->capture) cuda_profiler_capture(on);
#endif
  (void)a, (void)on;
}

// --device d: cpu, or cuda where this build has the backend and a device answers. 0, or the exit code.
static int parse_device(const char *d, Device *dev) {
  if (strcmp(d, "cpu") && strcmp(d, "cuda")) {
    fprintf(stderr, "bench_step: --device %s: expected cpu or cuda\n", d);
    return 2;
  }
  *dev = strcmp(d, "cuda") ? DEVICE_CPU : DEVICE_CUDA;
#if DETR_HAVE_CUDA
  char why[512];
  if (*dev == DEVICE_CUDA && cuda_device_probe(why, sizeof why) <= 0) {
    fprintf(stderr, "bench_step: --device cuda: %s\n", why);
    return 1;
  }
#else
  if (*dev == DEVICE_CUDA) {
    fprintf(stderr, "bench_step: --device cuda: this build has no CUDA backend\n");
    return 2;
  }
#endif
  return 0;
}

// --conv c: forces that CPU convolution implementation everywhere. 0, or the exit code.
static int parse_conv(const char *c) {
  ConvImpl impl = !strcmp(c, "im2col")            ? CONV_IMPL_IM2COL
                  : !strcmp(c, "onednn")          ? CONV_IMPL_ONEDNN
                  : !strcmp(c, "onednn-nchw")     ? CONV_IMPL_ONEDNN_PLAIN
                  : !strcmp(c, "onednn-winograd") ? CONV_IMPL_ONEDNN_WINOGRAD
                  : !strcmp(c, "onednn-bf16")     ? CONV_IMPL_ONEDNN_BF16
                                                  : CONV_IMPL_AUTO;
  if (impl == CONV_IMPL_AUTO && strcmp(c, "auto")) {
    fprintf(stderr, "bench_step: --conv takes auto, im2col, onednn, onednn-nchw, onednn-winograd or onednn-bf16\n");
    return 2;
  }
  if (impl != CONV_IMPL_AUTO && impl != CONV_IMPL_IM2COL && !DETR_HAVE_ONEDNN) {
    fprintf(stderr, "bench_step: this build has no oneDNN\n");
    return 2;
  }
  cpu_conv2d_set_impl(impl);
  return 0;
}

// Reads the command line into a (the defaults where it says nothing). 0, or the exit code.
static int parse_args(int argc, char **argv, StepArgs *a) {
  *a = (StepArgs){
      .preset = "detr-r18-small", .size = 320, .boxes = 3, .reps = 5, .batch = 2, .dev = DEVICE_CPU, .first_loss = NAN};
  for (int i = 1; i < argc; i++) {
    int rc = 0;
    if (!strcmp(argv[i], "--preset") && i + 1 < argc) a->preset = argv[++i];
    else if (!strcmp(argv[i], "--set") && i + 1 < argc && a->n_sets < 32) a->sets[a->n_sets++] = argv[++i];
    else if (!strcmp(argv[i], "--size") && i + 1 < argc) a->size = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--boxes") && i + 1 < argc) a->boxes = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) a->reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--enact")) a->enact = true;
    else if (!strcmp(argv[i], "--forward")) a->forward_only = true;
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc) a->batch = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--hw") && i + 1 < argc) {
      if (sscanf(argv[++i], "%dx%d", &a->height, &a->width) != 2) a->height = a->width = 0;
    } else if (!strcmp(argv[i], "--profile")) a->profile = true;
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) rc = parse_device(argv[++i], &a->dev);
    else if (!strcmp(argv[i], "--vary-size")) a->vary = true;
    else if (!strcmp(argv[i], "--weights") && i + 1 < argc) a->weights = argv[++i];
    else if (!strcmp(argv[i], "--batch-file") && i + 1 < argc) a->batch_file = argv[++i];
    else if (!strcmp(argv[i], "--capture")) a->capture = true;
    else if (!strcmp(argv[i], "--conv") && i + 1 < argc) rc = parse_conv(argv[++i]);
    else if (!strcmp(argv[i], "--precision") && i + 1 < argc) a->precision = argv[++i];
    else if (!strcmp(argv[i], "--pair-fp32")) a->pair_fp32 = true;
    else if (!strcmp(argv[i], "--conv-survey")) a->conv_survey = true;
    else {
      fprintf(stderr, "bench_step: unknown argument '%s'\n", argv[i]);
      return 2;
    }
    if (rc) return rc;
  }
  if (!a->height) a->height = a->width = a->size;
  if (a->reps < 1 || a->height - (a->vary ? 8 * a->reps : 0) < 32 || a->width - (a->vary ? 12 * a->reps : 0) < 32 ||
      a->boxes < 0 || a->batch < 1 || a->batch > 64) {
    fprintf(stderr, "bench_step: need --reps >= 1, sizes >= 32, --boxes >= 0, --batch 1..64\n");
    return 2;
  }
  if (a->conv_survey && (a->dev != DEVICE_CUDA || !DETR_HAVE_CUDA || a->forward_only || a->pair_fp32)) {
    fprintf(stderr, "bench_step: --conv-survey needs --device cuda and a training step (not --forward, --pair-fp32)\n");
    return 2;
  }
  if (a->capture && (a->dev != DEVICE_CUDA || !DETR_HAVE_CUDA)) {
    fprintf(stderr, "bench_step: --capture needs --device cuda\n");
    return 2;
  }
  if (a->pair_fp32 && (!a->precision || strcmp(a->precision, "bf16") || a->profile || a->vary)) {
    fprintf(stderr,
            "bench_step: --pair-fp32 pairs bf16 steps with fp32 ones: needs --precision bf16, not with "
            "--profile or --vary-size\n");
    return 2;
  }
  if (a->batch_file && a->vary) {
    fprintf(stderr, "bench_step: --vary-size makes its own images: not with --batch-file\n");
    return 2;
  }
  return 0;
}

// The preset with --enact, the --set overrides and --precision's keys after them (checked on the
// device: bf16 is refused where the CPU lacks it). 0, or the exit code.
static int make_config(const StepArgs *a, DetrConfig *cfg) {
  if (detr_config_preset(a->preset, cfg)) {
    fprintf(stderr, "bench_step: unknown preset '%s'\n", a->preset);
    return 2;
  }
  if (a->enact) cfg->encoder_attn = encoder_attn_find("enact");
  const char *sets[sizeof a->sets / sizeof a->sets[0] + 2];
  int n = a->n_sets;
  memcpy(sets, a->sets, (size_t)n * sizeof sets[0]);
  DetrMath math;
  char err[512];
  int k = detr_math_parse(a->precision, &math, err, sizeof err)
              ? -1
              : detr_math_keys(math, false, a->dev, sets, n, sets + n, err, sizeof err);
  if (k < 0) {
    fprintf(stderr, "bench_step: --precision %s\n", err);
    return math == DETR_MATH_BF16 ? 1 : 2;
  }
  if (model_config_apply_sets(cfg, sets, n + k, err, sizeof err)) {
    fprintf(stderr, "bench_step: %s\n", err);
    return 2;
  }
  return 0;
}

// The fixed targets: `boxes` per image of a batch of B (tb [B * boxes * 4] and tl [B * boxes] hold
// their boxes and labels).
static DetrTarget *make_targets(int B, int boxes, int num_classes, float **tb_out, int64_t **tl_out) {
  float *tb = detr_malloc((size_t)(B * boxes * 4 + 4) * sizeof(float), "target boxes");
  int64_t *tl = detr_malloc((size_t)(B * boxes + 1) * sizeof(int64_t), "target labels");
  for (int i = 0; i < B * boxes; i++) {
    tb[4 * i + 0] = 0.2f + 0.6f * (float)((i * 37) % 11) / 10.0f;
    tb[4 * i + 1] = 0.2f + 0.6f * (float)((i * 53) % 7) / 6.0f;
    tb[4 * i + 2] = 0.1f + 0.2f * (float)(i % 3) / 2.0f;
    tb[4 * i + 3] = 0.1f + 0.2f * (float)((i + 1) % 3) / 2.0f;
    tl[i] = (i * 13) % num_classes;
  }
  DetrTarget *targets = detr_malloc(sizeof(DetrTarget) * (size_t)B, "targets");
  for (int b = 0; b < B; b++) targets[b] = (DetrTarget){boxes, tb + 4 * boxes * b, tl + boxes * b};
  *tb_out = tb;
  *tl_out = tl;
  return targets;
}

// The step's inputs into in (freed with step_batch_free): the --batch-file's (its B, H, W then set
// a's batch, height and width), else `batch` images of height x width drawn from seed 7, no
// padding, and the fixed targets. Sets a->num_boxes. 0, or -1 with err.
static int load_inputs(StepArgs *a, const DetrConfig *cfg, Device dev, StepBatch *in, char *err, size_t err_cap) {
  memset(in, 0, sizeof *in);
  if (a->batch_file) {
    StFile *f = st_open(a->batch_file, err, err_cap);
    if (!f) return -1;
    int rc = step_batch_read(f, dev, cfg->num_classes, in, err, err_cap);
    st_close(f);
    if (rc) return -1;
    a->batch = (int)in->B, a->height = (int)in->H, a->width = (int)in->W;
  } else {
    in->B = a->batch, in->H = a->height, in->W = a->width;
    in->images = tensor_new(dev, SHAPE(in->B, in->H, in->W, 3));
    Rng rng = rng_make(7);
    tensor_normal_(in->images, &rng, 0.0f, 1.0f);
    in->mask = detr_calloc((size_t)(in->B * in->H * in->W), 1, "mask");
    in->targets = make_targets(a->batch, a->boxes, (int)cfg->num_classes, &in->boxes_storage, &in->labels_storage);
  }
  int64_t total = 0;
  for (int64_t b = 0; b < in->B; b++) total += in->targets[b].n;
  a->num_boxes = total > 1 ? (float)total : 1.0f;
  return 0;
}

// One timed step on images: the no-grad forward alone (--forward), else forward, loss, backward,
// clipping and AdamW; *first_loss, while NaN, takes the step's total loss (a read that waits for the
// device: only the warm-up step's). 0, or 1 with a message.
static int step(const StepArgs *a, DetrModel *m, AdamW *opt, const CriterionConfig *ccfg, NnCtx *ctx, Tensor *images,
                const uint8_t *mask, const DetrTarget *targets, float *first_loss) {
  ScopeMark mark = tensor_scope_mark();
  DetrOutput out;
  CriterionResult loss;
  char err[256];
  if (a->forward_only) {  // inference: no tape, no loss
    bool was = autograd_set_grad_enabled(false);
    NnCtx eval = {.training = false};
    if (detr_model_forward(m, &eval, images, mask, &out, err, sizeof err)) {
      fprintf(stderr, "bench_step: %s\n", err);
      return 1;
    }
    autograd_set_grad_enabled(was);
    detr_output_free(&out);
    tensor_scope_release(mark);
    return 0;
  }
  if (detr_model_forward(m, ctx, images, mask, &out, err, sizeof err) ||
      criterion_forward(ccfg, out.layers[out.n_layers - 1], out.layers, m->cfg.aux_loss ? out.n_layers - 1 : 0, targets,
                        a->num_boxes, NULL, &loss, err, sizeof err)) {
    fprintf(stderr, "bench_step: %s\n", err);
    return 1;
  }
  if (first_loss && isnan(*first_loss)) *first_loss = tensor_item(loss.total);  // the warm-up step only
  autograd_backward(loss.total);
  adamw_clip_step(opt, 0.1f);  // clipping, AdamW, gradients released
  criterion_result_free(&loss);
  detr_output_free(&out);
  tensor_scope_release(mark);
  return 0;
}

// The median of v [n].
static double median_of(const double *v, int n) {
  double *sorted = malloc(sizeof(double) * (size_t)n);
  DETR_CHECK(sorted, "bench_step: out of memory");
  memcpy(sorted, v, sizeof(double) * (size_t)n);
  qsort(sorted, (size_t)n, sizeof(double), cmp_double);
  double med = sorted[n / 2];
  free(sorted);
  return med;
}

// --pair-fp32's fields: the fp32 steps t32, their median, each rep's t / t32 and the ratios' median.
static void print_pairs(int reps, const double *t, const double *t32) {
  double *ratio = malloc(sizeof(double) * (size_t)reps);
  DETR_CHECK(ratio, "bench_step: out of memory");
  printf(", \"fp32_median_s\": %.4f, \"fp32_steps_s\": [", median_of(t32, reps));
  for (int r = 0; r < reps; r++) printf(r ? ", %.4f" : "%.4f", t32[r]);
  printf("], \"pair_ratios\": [");
  for (int r = 0; r < reps; r++) printf(r ? ", %.3f" : "%.3f", ratio[r] = t[r] / t32[r]);
  printf("], \"ratio_median\": %.3f", median_of(ratio, reps));
  free(ratio);
}

#if DETR_HAVE_CUDA
// The GPU's name as a JSON string's contents (quotes and backslashes blanked).
static void gpu_name_json(char *name, size_t cap) {
  cuda_device_name(name, cap);
  for (char *c = name; *c; c++)
    if (*c == '"' || *c == '\\') *c = ' ';
}
#endif

// Prints the JSON line: the median and each step's seconds, peak memory, the allocators' figures
// (t32: --pair-fp32's fp32 steps, or NULL).
static void print_report(const StepArgs *a, const DetrConfig *cfg, const double *t, const double *t32) {
  int reps = a->reps;
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  AllocStats alloc = detr_alloc_stats(DEVICE_CPU);  // the tensor allocator: peak live, cached now
  char loss_text[32] = "null";                      // --forward has no loss
  if (!isnan(a->first_loss)) snprintf(loss_text, sizeof loss_text, "%.6g", a->first_loss);
  char gemm[96];
  printf(
      "{\"impl\": \"detr-c\", \"preset\": \"%s\", \"decoder\": \"%s\", \"encoder_attn\": \"%s\", \"size\": %d, "
      "\"hw\": \"%dx%d\", \"batch\": %d, \"what\": \"%s\", "
      "\"enact\": %s, \"tf32\": %s, \"bf16\": %s, \"gemm\": \"%s\", \"median_s\": %.4f, \"peak_rss_mb\": %.1f, "
      "\"alloc_peak_mb\": %.1f, "
      "\"alloc_cached_mb\": %.1f, \"alloc_held_peak_mb\": %.1f, \"first_loss\": %s, \"steps_s\": [",
      a->preset, detr_decoder(cfg)->name, detr_encoder_attn(cfg)->name, a->size, a->height, a->width, a->batch,
      a->forward_only ? "forward" : "train step", a->enact ? "true" : "false", cfg->tf32 ? "true" : "false",
      cfg->bf16 ? "true" : "false", cpu_gemm_library(gemm, sizeof gemm), median_of(t, reps), ru.ru_maxrss / 1024.0,
      alloc.peak_live_bytes / 1048576.0, alloc.cached_bytes / 1048576.0, alloc.peak_held_bytes / 1048576.0, loss_text);
  for (int r = 0; r < reps; r++) printf(r ? ", %.4f" : "%.4f", t[r]);
  printf("]");
  if (t32) print_pairs(reps, t, t32);
#if DETR_HAVE_CUDA
  if (a->dev == DEVICE_CUDA) {
    AllocStats ds = detr_alloc_stats(DEVICE_CUDA);
    size_t used, total;
    char name[256];
    cuda_device_memory(&used, &total);
    gpu_name_json(name, sizeof name);
    printf(
        ", \"device\": \"cuda\", \"gpu\": \"%s\", \"peak_device_mb\": %.1f, \"peak_device_held_mb\": %.1f, "
        "\"device_used_mb\": %.1f, \"device_total_mb\": %.1f",
        name, ds.peak_live_bytes / 1048576.0, ds.peak_held_bytes / 1048576.0, used / 1048576.0, total / 1048576.0);
  }
#endif
  printf("}\n");
}

#if DETR_HAVE_CUDA
// --- --conv-survey ---

static const char *const PASS_NAMES[3] = {"forward", "backward-data", "backward-filter"};

// Index in row->algos of algorithm algo, timed, or -1 (listed under several math types: the fastest,
// Find's order).
static int algo_index(const ConvSurveyRow *row, int algo) {
  for (int i = 0; i < row->n; i++)
    if (row->algos[i].algo == algo && row->algos[i].ran) return i;
  return -1;
}

// Index of the fastest timed algorithm (deterministic ones only, or any), or -1.
static int fastest_index(const ConvSurveyRow *row, bool deterministic) {
  int best = -1;
  for (int i = 0; i < row->n; i++)
    if (row->algos[i].ran && (!deterministic || row->algos[i].deterministic) &&
        (best < 0 || row->algos[i].ms < row->algos[best].ms))
      best = i;
  return best;
}

static double row_ms(const ConvSurveyRow *row, int index) {
  return index < 0 ? NAN : (double)row->calls * row->algos[index].ms;
}

static void geometry_text(const ConvGeom *g, char *out, size_t cap) {
  snprintf(out, cap, "%lldx%lldx%lldx%lld -> %lld %lldx%lld s%d p%d d%d%s", (long long)g->batch, (long long)g->in_ch,
           (long long)g->in_h, (long long)g->in_w, (long long)g->out_ch, (long long)g->kh, (long long)g->kw,
           g->stride_h, g->pad_h, g->dil_h, g->channels_last ? " nhwc" : "");
}

static void print_json_ms(const char *key, double ms) {
  if (isnan(ms)) printf("\"%s\": null", key);
  else printf("\"%s\": %.3f", key, ms);
}

// The summary line, then one line a pass. 0, or 1 when no pass was found.
static int print_conv_survey(const StepArgs *a, const DetrConfig *cfg) {
  enum { CAP = 1024, COSTLIEST = 8 };
  detr_alloc_empty_cache(DEVICE_CUDA);  // the step's cached blocks back to the driver: room for Find
  ConvSurveyRow *rows = malloc(CAP * sizeof *rows);
  DETR_CHECK(rows, "bench_step: out of memory for the survey");
  int n = cuda_conv2d_survey(rows, CAP);
  if (n > CAP) fprintf(stderr, "bench_step: %d convolution passes, the first %d surveyed\n", n, CAP), n = CAP;
  if (n == 0) {
    fprintf(stderr, "bench_step: --conv-survey: the step ran no cuDNN convolution\n");
    free(rows);
    return 1;
  }
  // Each pass's cost of determinism: its deterministic pick's time less the fastest's, per step. The
  // totals add the same passes in every column: those with all four timed.
  double total[4] = {0}, *cost = malloc((size_t)n * sizeof(double));
  int left_out = 0, *order = malloc((size_t)n * sizeof(int));
  DETR_CHECK(cost && order, "bench_step: out of memory for the survey");
  for (int i = 0; i < n; i++) {
    const ConvSurveyRow *r = &rows[i];
    double ms[4] = {row_ms(r, algo_index(r, r->pick_deterministic)), row_ms(r, algo_index(r, r->pick_any)),
                    row_ms(r, fastest_index(r, false)), row_ms(r, fastest_index(r, true))};
    bool complete = !isnan(ms[0]) && !isnan(ms[1]) && !isnan(ms[2]) && !isnan(ms[3]);
    for (int k = 0; k < 4 && complete; k++) total[k] += ms[k];
    left_out += !complete;
    cost[i] = isnan(ms[0]) || isnan(ms[2]) ? 0.0 : ms[0] - ms[2];
    order[i] = i;
  }
  for (int i = 1; i < n; i++)  // by cost, the largest first (insertion: n is small)
    for (int j = i; j > 0 && cost[order[j]] > cost[order[j - 1]]; j--) {
      int t = order[j];
      order[j] = order[j - 1], order[j - 1] = t;
    }
  char gpu[256], geom[128];
  gpu_name_json(gpu, sizeof gpu);
  printf(
      "{\"impl\": \"detr-c\", \"what\": \"conv survey\", \"preset\": \"%s\", \"hw\": \"%dx%d\", \"batch\": %d, "
      "\"tf32\": %s, \"bf16\": %s, \"gpu\": \"%s\", \"passes\": %d, \"step_conv_ms\": {",
      a->preset, a->height, a->width, a->batch, cfg->tf32 ? "true" : "false", cfg->bf16 ? "true" : "false", gpu, n);
  static const char *const KEYS[4] = {"deterministic_picks", "heuristic_picks", "fastest", "fastest_deterministic"};
  for (int k = 0; k < 4; k++) {
    if (k) printf(", ");
    print_json_ms(KEYS[k], total[k]);
  }
  printf("}, \"passes_left_out\": %d, \"costliest\": [", left_out);
  for (int i = 0; i < n && i < COSTLIEST; i++) {
    const ConvSurveyRow *r = &rows[order[i]];
    int best = fastest_index(r, false);
    geometry_text(&r->g, geom, sizeof geom);
    printf("%s{\"conv\": \"%s\", \"pass\": \"%s\", \"calls\": %lld, ", i ? ", " : "", geom, PASS_NAMES[r->pass],
           (long long)r->calls);
    print_json_ms("deterministic_ms", row_ms(r, algo_index(r, r->pick_deterministic)));
    printf(", ");
    print_json_ms("fastest_ms", row_ms(r, best));
    printf(", \"fastest_algo\": %d, \"fastest_is_deterministic\": %s}", best < 0 ? -1 : r->algos[best].algo,
           best >= 0 && r->algos[best].deterministic ? "true" : "false");
  }
  printf("]}\n");
  for (int i = 0; i < n; i++) {
    const ConvSurveyRow *r = &rows[i];
    geometry_text(&r->g, geom, sizeof geom);
    printf(
        "{\"conv\": \"%s\", \"pass\": \"%s\", \"calls\": %lld, \"pick_deterministic\": %d, \"pick_heuristic\": %d, "
        "\"algos\": [",
        geom, PASS_NAMES[r->pass], (long long)r->calls, r->pick_deterministic, r->pick_any);
    for (int k = 0; k < r->n; k++) {
      const ConvAlgoTime *t = &r->algos[k];
      printf("%s{\"algo\": %d, \"math_type\": %d, \"deterministic\": %s, ", k ? ", " : "", t->algo, t->math_type,
             t->deterministic ? "true" : "false");
      print_json_ms("ms", t->ran ? (double)t->ms : NAN);
      printf(", \"workspace_mb\": %.1f}", t->bytes / 1048576.0);
    }
    printf("]}\n");
  }
  free(cost), free(order), free(rows);
  return 0;
}
#endif

int main(int argc, char **argv) {
  runtime_bind(runtime_create());  // the thread that runs ops (core/runtime.h)
  cpu_runtime_setup(argv);         // libgomp's spin setting, as the detr command has it
  StepArgs a;
  DetrConfig cfg;
  int rc = parse_args(argc, argv, &a);
  if (!rc) rc = make_config(&a, &cfg);
  if (rc) return rc;
  a.enact = cfg.encoder_attn == encoder_attn_find("enact");
  Device dev = a.dev;
  cpu_flush_denormals(true);  // as `detr train` runs
  DetrModel *m = detr_model_create(&cfg, dev);
  detr_model_init(m, 1);
  char err[4096];
  StepBatch in;
  if ((a.weights && params_load_file(&m->params, a.weights, err, sizeof err)) ||
      load_inputs(&a, &cfg, dev, &in, err, sizeof err)) {
    fprintf(stderr, "bench_step: %s\n", err);
    return 1;
  }
  AdamW opt;
  adamw_init(&opt, &m->params, optim_config_default());
  const int height = a.height, width = a.width;
  Tensor *images = in.images;
  Rng rng = rng_make(8);  // --vary-size's images
  CriterionConfig ccfg = detr_criterion_config(&cfg);
  Rng drop = rng_make(3);
  NnCtx ctx = {.training = true, .dropout_rng = &drop};
  double *t = malloc(sizeof(double) * (size_t)a.reps),
         *t32 = a.pair_fp32 ? malloc(sizeof(double) * (size_t)a.reps) : NULL;
  DETR_CHECK(t && (t32 || !a.pair_fp32), "bench_step: out of memory");
  bool asked_bf16 = m->cfg.bf16;                             // the precision asked for, resolved at creation
  for (int r = -1; r < (a.conv_survey ? 0 : a.reps); r++) {  // --conv-survey: the warm-up step alone
    if (r == 0 && a.profile) {
      autograd_profile_reset();
      autograd_profile_enable(true);
    }
    if (a.vary && r >= 0) {  // step r: (height - 8 (r + 1)) x (width - 12 (r + 1)); the mask is all valid
      if (images != in.images) tensor_release(images);
      images = tensor_new(dev, SHAPE(a.batch, height - 8 * (r + 1), width - 12 * (r + 1), 3));
      tensor_normal_(images, &rng, 0.0f, 1.0f);
    }
    if (r == 0) capture(&a, true);
    for (int half = 0; half < (a.pair_fp32 ? 2 : 1); half++) {
      bool fp32_now = a.pair_fp32 && (half == (r & 1));  // even reps fp32 first, odd reps second
      m->cfg.bf16 = asked_bf16 && !fp32_now;             // each forward sets the kernels' precision from its model's
      double t0 = now();
      if (a.profile) autograd_profile_mark();
      if (step(&a, m, &opt, &ccfg, &ctx, images, in.mask, in.targets, fp32_now ? NULL : &a.first_loss)) return 1;
      device_sync(dev);
      if (r >= 0) (fp32_now ? t32 : t)[r] = now() - t0;
    }
  }
  m->cfg.bf16 = asked_bf16;
  capture(&a, false);
#if DETR_HAVE_CUDA
  if (a.conv_survey) rc = print_conv_survey(&a, &m->cfg);
  else
#endif
    print_report(&a, &m->cfg, t, t32);
  if (a.profile) autograd_profile_report(stderr);
  adamw_free(&opt);
  detr_model_free(m);
  if (images != in.images) tensor_release(images);
  step_batch_free(&in);
  free(t), free(t32);
  return rc;
}
