// COCOeval (bbox) as pycocotools computes it. The structure follows cocoeval.py: per category,
// per image evaluateImg() for each area range (matching at 10 IoU thresholds), then accumulate()
// over images for each maxDets, then summarize(). Comments name the Python they mirror where the
// exact arithmetic or order matters.
#include "eval/cocoeval.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define N_IOU 10
#define N_REC 101
#define N_AREA 4
#define N_MAXDET 3
#define MAX_DET 100  // maxDets[-1]: evaluateImg keeps this many detections per image and category

static const int MAX_DETS[N_MAXDET] = {1, 10, 100};
// areaRng: [0 ** 2, 1e5 ** 2], [0 ** 2, 32 ** 2], [32 ** 2, 96 ** 2], [96 ** 2, 1e5 ** 2]; inclusive.
static const double AREA_LO[N_AREA] = {0, 0, 1024, 9216}, AREA_HI[N_AREA] = {1e10, 1024, 9216, 1e10};
static const char *const AREA_LABEL[N_AREA] = {"all", "small", "medium", "large"};

const char *const coco_stat_names[COCO_N_STATS] = {"AP",  "AP50", "AP75",  "APs", "APm", "APl",
                                                   "AR1", "AR10", "AR100", "ARs", "ARm", "ARl"};

// summarize()'s 12 calls: AP or AR, IoU threshold (< 0: all), area range, maxDets index.
static const struct {
  bool ap;
  double iou;
  int area, m;
} SUMMARY[COCO_N_STATS] = {
    {true, -1, 0, 2},  {true, .5, 0, 2},  {true, .75, 0, 2}, {true, -1, 1, 2},  {true, -1, 2, 2},  {true, -1, 3, 2},
    {false, -1, 0, 0}, {false, -1, 0, 1}, {false, -1, 0, 2}, {false, -1, 1, 2}, {false, -1, 2, 2}, {false, -1, 3, 2},
};

// np.linspace(start, stop, num) as numpy computes it: i * step + start, the last exactly stop.
// Not i / (num - 1) or start + i * 0.05: e.g. 35 * 0.01 != 0.35, and a threshold one ulp off
// changes which IoUs and recalls reach it.
static void linspace(double start, double stop, int num, double *out) {
  double step = (stop - start) / (num - 1);
  for (int i = 0; i < num; i++) out[i] = (double)i * step + start;
  out[num - 1] = stop;
}

// maskApi.c bbIou for one pair: crowd GTs divide by the detection's area alone.
static double box_iou(const double *d, const double *g, bool crowd) {
  double w = fmin(d[2] + d[0], g[2] + g[0]) - fmax(d[0], g[0]);
  if (w <= 0) return 0;
  double h = fmin(d[3] + d[1], g[3] + g[1]) - fmax(d[1], g[1]);
  if (h <= 0) return 0;
  double i = w * h, da = d[2] * d[3], ga = g[2] * g[3];
  return i / (crowd ? da : da + ga - i);
}

// numpy's pairwise summation (np.add.reduce over a contiguous float64 array), so that the means
// are bit-identical to summarize()'s np.mean(s[s > -1]).
static double pairwise_sum(const double *a, int64_t n) {
  if (n < 8) {
    double s = 0.;
    for (int64_t i = 0; i < n; i++) s += a[i];
    return s;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; j++) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - n % 8; i += 8)
      for (int j = 0; j < 8; j++) r[j] += a[i + j];
    double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; i++) s += a[i];
    return s;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static int64_t find_id(const int64_t *sorted, int64_t n, int64_t id) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] < id) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && sorted[lo] == id ? lo : -1;
}

// Sort keys. Ties fall back to the file position, which makes qsort behave as the stable
// mergesorts of cocoeval.py (np.argsort(-scores, kind='mergesort')).
typedef struct {
  int64_t k, img, pos;
  double score;
} Key;

static int cmp_gt_key(const void *a, const void *b) {  // category, image, file order
  const Key *x = a, *y = b;
  if (x->k != y->k) return x->k < y->k ? -1 : 1;
  if (x->img != y->img) return x->img < y->img ? -1 : 1;
  return (x->pos > y->pos) - (x->pos < y->pos);
}

static int cmp_det_key(const void *a, const void *b) {  // category, image, score descending, file order
  const Key *x = a, *y = b;
  if (x->k != y->k) return x->k < y->k ? -1 : 1;
  if (x->img != y->img) return x->img < y->img ? -1 : 1;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  return (x->pos > y->pos) - (x->pos < y->pos);
}

static int cmp_score_key(const void *a, const void *b) {  // score descending, position
  const Key *x = a, *y = b;
  if (x->score != y->score) return x->score > y->score ? -1 : 1;
  return (x->pos > y->pos) - (x->pos < y->pos);
}

// One evalImg that is not None: an image with GTs or detections of the category.
typedef struct {
  int64_t gt_first, n_gt;    // into the sorted GT keys
  int64_t det_first, n_det;  // into the category's detections (score order, at most MAX_DET)
} Group;

// Detection outcome at one IoU threshold, as accumulate() reads dtMatches/dtIgnore.
enum { DT_IGNORED = 0, DT_TP = 1, DT_FP = 2 };

// evaluateImg() for one group and area range: writes flags[t * stride + j] for the group's
// detections j (score order) and returns the number of non-ignored GTs.
static int64_t evaluate_img(const CocoEvalGt *gt, const Key *gt_keys, const Group *g, const CocoEvalDet *dets,
                            const Key *cat_dets, const double *ious, const double *thr, int area, uint8_t *flags,
                            int64_t stride, int *order, bool *ig, bool *matched) {
  int64_t G = g->n_gt, D = g->n_det, npig = 0;
  // gtind = np.argsort(_ignore, kind='mergesort'): non-ignored GTs first, each part in file order.
  // gt['ignore'] is iscrowd: _prepare() overwrites the file's "ignore" with it.
  int n_order = 0;
  for (int64_t j = 0; j < G; j++) {
    const CocoEvalGtAnn *a = &gt->anns[gt_keys[g->gt_first + j].pos];
    ig[j] = a->iscrowd || a->area < AREA_LO[area] || a->area > AREA_HI[area];
    if (!ig[j]) order[n_order++] = (int)j, npig++;
  }
  for (int64_t j = 0; j < G; j++)
    if (ig[j]) order[n_order++] = (int)j;
  for (int t = 0; t < N_IOU; t++) {
    memset(matched, 0, (size_t)G * sizeof(bool));
    for (int64_t d = 0; d < D; d++) {
      const CocoEvalDet *det = &dets[cat_dets[g->det_first + d].pos];
      double best = fmin(thr[t], 1 - 1e-10);
      int m = -1;
      for (int gi = 0; gi < G; gi++) {
        int j = order[gi];
        if (matched[gi] && !gt->anns[gt_keys[g->gt_first + j].pos].iscrowd) continue;
        // Matched to a regular GT and reaching the ignored ones: stop.
        if (m > -1 && !ig[order[m]] && ig[j]) break;
        if (ious[d * G + j] < best) continue;
        best = ious[d * G + j];
        m = gi;
      }
      // dtm holds the matched GT's id, and accumulate() reads it as a boolean.
      bool is_match = m > -1 && gt->anns[gt_keys[g->gt_first + order[m]].pos].id != 0;
      bool dt_ig = m > -1 && ig[order[m]];
      if (m > -1) matched[m] = true;
      // Unmatched detections outside the area range are ignored (detection area = w * h).
      double da = det->bbox[2] * det->bbox[3];
      if (!is_match && (da < AREA_LO[area] || da > AREA_HI[area])) dt_ig = true;
      flags[t * stride + g->det_first + d] = dt_ig ? DT_IGNORED : is_match ? DT_TP : DT_FP;
    }
  }
  return npig;
}

// One coco_evaluate call: _prepare()'s sorted ids and keys, accumulate()'s precision and recall
// arrays, and the scratch of the category at hand (sized for all detections: no category has more).
typedef struct {
  const CocoEvalGt *gt;
  const CocoEvalDet *dets;
  double thr[N_IOU], rec_thr[N_REC];
  int64_t *img_ids, *cat_ids, I, K;  // p.imgIds, p.catIds
  Key *dk, *gk;                      // detection and GT keys, sorted
  int64_t n_dk, n_gk;
  // precision[T, R, K, A, M] is only summarized at maxDets = 100: kept as prec[A][T][R][K] so that
  // s[:, :, :, a, m] flattens in numpy's (t, r, k) order. recall[T, K, A, M] as rec[M][A][T][K].
  double *prec, *rec;
  Group *groups;  // the category's groups, images in id order
  int64_t n_groups;
  Key *cat_dets, *sorted;  // the category's detections (n_cd of them), accumulate()'s score order
  int64_t n_cd;
  uint8_t *flags;  // [A][T][n_cd] detection outcomes
  double *tp, *fp, *pr, *ious;
  int *order;
  bool *ig, *gmatched;
  int64_t scratch_g, scratch_dg;  // what order, ig, gmatched and ious hold room for
  int64_t npig[N_AREA];           // the category's non-ignored GTs per area range
} Eval;

// _prepare()'s ids: p.imgIds = sorted(getImgIds()), p.catIds = np.unique(getCatIds()). -1 when an
// image id appears twice.
static int prepare_ids(Eval *e, char *err, size_t err_cap) {
  const CocoEvalGt *gt = e->gt;
  int64_t I = gt->n_images, K = 0;
  int64_t *img_ids = e->img_ids = detr_malloc((size_t)I * sizeof(int64_t), "cocoeval");
  int64_t *cat_ids = e->cat_ids = detr_malloc((size_t)gt->n_categories * sizeof(int64_t), "cocoeval");
  e->I = I;
  for (int64_t i = 0; i < I; i++) img_ids[i] = gt->images[i].id;
  qsort(img_ids, (size_t)I, sizeof(int64_t), cmp_i64);
  for (int64_t i = 1; i < I; i++)
    if (img_ids[i] == img_ids[i - 1]) {
      snprintf(err, err_cap, "image id %lld appears twice in the ground truth", (long long)img_ids[i]);
      return -1;
    }
  for (int64_t i = 0; i < gt->n_categories; i++) cat_ids[i] = gt->category_ids[i];
  qsort(cat_ids, (size_t)gt->n_categories, sizeof(int64_t), cmp_i64);
  for (int64_t i = 0; i < gt->n_categories; i++)
    if (K == 0 || cat_ids[K - 1] != cat_ids[i]) cat_ids[K++] = cat_ids[i];
  e->K = K;
  return 0;
}

// loadRes() and _prepare()'s detections: their keys in category, image, score order; those of an
// unknown category counted and left out. -1 for an unknown image or a value that is not finite.
static int prepare_dets(Eval *e, int64_t n_dets, CocoEvalResult *out, char *err, size_t err_cap) {
  Key *dk = e->dk = detr_malloc((size_t)n_dets * sizeof(Key), "cocoeval");
  int64_t n_dk = 0;
  for (int64_t i = 0; i < n_dets; i++) {
    const CocoEvalDet *d = &e->dets[i];
    int64_t img = find_id(e->img_ids, e->I, d->image_id);
    if (img < 0) {  // loadRes: assert set(annsImgIds) <= set(getImgIds())
      snprintf(err, err_cap, "detection %lld: image_id %lld is not an image of the ground truth", (long long)i,
               (long long)d->image_id);
      return -1;
    }
    bool finite = isfinite(d->score);
    for (int c = 0; c < 4; c++) finite = finite && isfinite(d->bbox[c]);
    if (!finite) {
      snprintf(err, err_cap, "detection %lld: bbox or score is not finite", (long long)i);
      return -1;
    }
    int64_t k = find_id(e->cat_ids, e->K, d->category_id);
    if (k < 0) {
      out->dets_unknown_category++;
      continue;
    }
    dk[n_dk++] = (Key){.k = k, .img = img, .pos = i, .score = d->score};
  }
  qsort(dk, (size_t)n_dk, sizeof(Key), cmp_det_key);
  e->n_dk = n_dk;
  return 0;
}

// _prepare()'s GTs: their keys in category, image, file order; those of an unknown image or
// category counted and left out.
static void prepare_gts(Eval *e, CocoEvalResult *out) {
  const CocoEvalGt *gt = e->gt;
  Key *gk = e->gk = detr_malloc((size_t)gt->n_anns * sizeof(Key), "cocoeval");
  int64_t n_gk = 0;
  for (int64_t i = 0; i < gt->n_anns; i++) {
    const CocoEvalGtAnn *a = &gt->anns[i];
    int64_t img = find_id(e->img_ids, e->I, a->image_id), k = find_id(e->cat_ids, e->K, a->category_id);
    if (img < 0) out->gts_unknown_image++;
    else if (k < 0) out->gts_unknown_category++;
    else {
      out->gts_id_zero += a->id == 0;
      gk[n_gk++] = (Key){.k = k, .img = img, .pos = i};
    }
  }
  qsort(gk, (size_t)n_gk, sizeof(Key), cmp_gt_key);
  e->n_gk = n_gk;
}

// accumulate()'s precision and recall, all -1, and the per-category scratch.
static void alloc_eval_arrays(Eval *e) {
  int64_t K = e->K, n_dk = e->n_dk;
  e->prec = detr_malloc((size_t)(N_AREA * N_IOU * N_REC * K) * sizeof(double), "cocoeval");
  e->rec = detr_malloc((size_t)(N_MAXDET * N_AREA * N_IOU * K) * sizeof(double), "cocoeval");
  for (int64_t i = 0; i < N_AREA * N_IOU * N_REC * K; i++) e->prec[i] = -1;
  for (int64_t i = 0; i < N_MAXDET * N_AREA * N_IOU * K; i++) e->rec[i] = -1;
  e->groups = detr_malloc((size_t)(e->I ? e->I : 1) * sizeof(Group), "cocoeval");
  e->cat_dets = detr_malloc((size_t)n_dk * sizeof(Key), "cocoeval");
  e->sorted = detr_malloc((size_t)n_dk * sizeof(Key), "cocoeval");
  e->flags = detr_malloc((size_t)(N_AREA * N_IOU) * (size_t)n_dk, "cocoeval");
  e->tp = detr_malloc((size_t)n_dk * sizeof(double), "cocoeval");
  e->fp = detr_malloc((size_t)n_dk * sizeof(double), "cocoeval");
  e->pr = detr_malloc((size_t)n_dk * sizeof(double), "cocoeval");
  e->scratch_g = 1, e->scratch_dg = 1;  // grown by evaluate_category
  e->ious = detr_malloc(sizeof(double), "cocoeval");
  e->order = detr_malloc(sizeof(int), "cocoeval");
  e->ig = detr_malloc(sizeof(bool), "cocoeval"), e->gmatched = detr_malloc(sizeof(bool), "cocoeval");
}

// Frees what an evaluation allocated (the parts it got to).
static void free_eval(Eval *e) {
  free(e->groups), free(e->cat_dets), free(e->sorted), free(e->flags), free(e->tp), free(e->fp), free(e->pr);
  free(e->ious), free(e->order), free(e->ig), free(e->gmatched), free(e->prec), free(e->rec), free(e->gk);
  free(e->dk), free(e->img_ids), free(e->cat_ids);
}

// Category k's groups (evalImgs that are not None), images in id order; each keeps its top MAX_DET
// detections by score. *gi and *di walk the sorted GT and detection keys. Returns their number.
static int64_t category_groups(Eval *e, int64_t k, int64_t *gi, int64_t *di) {
  const Key *gk = e->gk, *dk = e->dk;
  int64_t n_gk = e->n_gk, n_dk = e->n_dk, n_groups = 0, n_cd = 0;
  while ((*gi < n_gk && gk[*gi].k == k) || (*di < n_dk && dk[*di].k == k)) {
    int64_t img_g = *gi < n_gk && gk[*gi].k == k ? gk[*gi].img : INT64_MAX;
    int64_t img_d = *di < n_dk && dk[*di].k == k ? dk[*di].img : INT64_MAX;
    int64_t img = img_g < img_d ? img_g : img_d;
    Group *g = &e->groups[n_groups++];
    g->gt_first = *gi;
    while (*gi < n_gk && gk[*gi].k == k && gk[*gi].img == img) (*gi)++;
    g->n_gt = *gi - g->gt_first;
    g->det_first = n_cd;
    for (; *di < n_dk && dk[*di].k == k && dk[*di].img == img; (*di)++)
      if (n_cd - g->det_first < MAX_DET) e->cat_dets[n_cd++] = dk[*di];
    g->n_det = n_cd - g->det_first;
  }
  e->n_cd = n_cd;
  return e->n_groups = n_groups;
}

// computeIoU() for one group: ious[d * G + j], the scratch grown to the group's size first.
static void compute_iou(Eval *e, const Group *g) {
  int64_t G = g->n_gt, D = g->n_det;
  if (G > e->scratch_g) {
    e->scratch_g = G;
    free(e->order), free(e->ig), free(e->gmatched);
    e->order = detr_malloc((size_t)G * sizeof(int), "cocoeval");
    e->ig = detr_malloc((size_t)G * sizeof(bool), "cocoeval");
    e->gmatched = detr_malloc((size_t)G * sizeof(bool), "cocoeval");
  }
  if (D * G > e->scratch_dg) {
    e->scratch_dg = D * G;
    free(e->ious);
    e->ious = detr_malloc((size_t)(D * G) * sizeof(double), "cocoeval");
  }
  for (int64_t d = 0; d < D; d++) {
    const CocoEvalDet *det = &e->dets[e->cat_dets[g->det_first + d].pos];
    for (int64_t j = 0; j < G; j++) {
      const CocoEvalGtAnn *a = &e->gt->anns[e->gk[g->gt_first + j].pos];
      e->ious[d * G + j] = box_iou(det->bbox, a->bbox, a->iscrowd);
    }
  }
}

// evaluate() for the current category: computeIoU() and evaluateImg() of each group and area
// range, into flags and npig.
static void evaluate_category(Eval *e) {
  int64_t n_cd = e->n_cd;
  memset(e->npig, 0, sizeof e->npig);
  for (int64_t q = 0; q < e->n_groups; q++) {
    const Group *g = &e->groups[q];
    compute_iou(e, g);
    for (int a = 0; a < N_AREA; a++)
      e->npig[a] += evaluate_img(e->gt, e->gk, g, e->dets, e->cat_dets, e->ious, e->thr, a,
                                 e->flags + (size_t)a * N_IOU * n_cd, n_cd, e->order, e->ig, e->gmatched);
  }
}

// accumulate() for category k, maxDets index m, area range a and IoU threshold t over the nd
// detections of e->sorted: the recall, and at maxDets = 100 the precision at each recall threshold.
static void accumulate_curve(Eval *e, int64_t k, int m, int a, int t, int64_t nd) {
  int64_t K = e->K, npig = e->npig[a];
  double *tp = e->tp, *fp = e->fp, *pr = e->pr;
  const uint8_t *fl = e->flags + ((size_t)a * N_IOU + (size_t)t) * (size_t)e->n_cd;
  double tps = 0, fps = 0;
  for (int64_t i = 0; i < nd; i++) {
    uint8_t f = fl[e->sorted[i].pos];
    tps += f == DT_TP, fps += f == DT_FP;
    tp[i] = tps, fp[i] = fps;
  }
  // rc = tp / npig; pr = tp / (fp + tp + np.spacing(1)), then made non-increasing.
  for (int64_t i = 0; i < nd; i++) pr[i] = tp[i] / (fp[i] + tp[i] + DBL_EPSILON);
  for (int64_t i = nd - 1; i > 0; i--)
    if (pr[i] > pr[i - 1]) pr[i - 1] = pr[i];
  e->rec[((m * N_AREA + a) * N_IOU + t) * K + k] = nd ? tp[nd - 1] / (double)npig : 0;
  if (m != N_MAXDET - 1) return;
  // np.searchsorted(rc, recThrs, side='left'); thresholds past the last detection get 0.
  double *p = e->prec + ((size_t)(a * N_IOU + t) * N_REC) * (size_t)K + (size_t)k;
  int64_t i = 0;
  for (int r = 0; r < N_REC; r++) {
    while (i < nd && tp[i] / (double)npig < e->rec_thr[r]) i++;
    p[(size_t)r * (size_t)K] = i < nd ? pr[i] : 0;
  }
}

// accumulate() for category k: for each maxDets, each image's first maxDet detections, re-sorted by
// score across images (stable: image order, then score order within the image).
static void accumulate_category(Eval *e, int64_t k) {
  for (int m = 0; m < N_MAXDET; m++) {
    int64_t nd = 0;
    for (int64_t q = 0; q < e->n_groups; q++)
      for (int64_t d = 0; d < e->groups[q].n_det && d < MAX_DETS[m]; d++) {
        int64_t pos = e->groups[q].det_first + d;
        e->sorted[nd++] = (Key){.pos = pos, .score = e->cat_dets[pos].score};
      }
    qsort(e->sorted, (size_t)nd, sizeof(Key), cmp_score_key);
    for (int a = 0; a < N_AREA; a++) {
      if (e->npig[a] == 0) continue;
      for (int t = 0; t < N_IOU; t++) accumulate_curve(e, k, m, a, t, nd);
    }
  }
}

// summarize(): each stat the mean of its entries > -1, or -1 when there are none.
static void summarize(const Eval *e, CocoEvalResult *out) {
  int64_t K = e->K;
  double *vals = detr_malloc((size_t)(N_IOU * N_REC * K) * sizeof(double), "cocoeval");
  for (int s = 0; s < COCO_N_STATS; s++) {
    int64_t n = 0;
    for (int t = 0; t < N_IOU; t++) {
      if (SUMMARY[s].iou >= 0 && e->thr[t] != SUMMARY[s].iou) continue;  // np.where(iouThr == p.iouThrs)
      if (SUMMARY[s].ap) {
        const double *p = e->prec + (size_t)(SUMMARY[s].area * N_IOU + t) * N_REC * (size_t)K;
        for (int64_t i = 0; i < N_REC * K; i++)
          if (p[i] > -1) vals[n++] = p[i];
      } else {
        const double *p = e->rec + (size_t)((SUMMARY[s].m * N_AREA + SUMMARY[s].area) * N_IOU + t) * (size_t)K;
        for (int64_t i = 0; i < K; i++)
          if (p[i] > -1) vals[n++] = p[i];
      }
    }
    out->stats[s] = n ? (0. + pairwise_sum(vals, n)) / (double)n : -1;
  }
  free(vals);
}

int coco_evaluate(const CocoEvalGt *gt, const CocoEvalDet *dets, int64_t n_dets, CocoEvalResult *out, char *err,
                  size_t err_cap) {
  memset(out, 0, sizeof *out);
  Eval e = {.gt = gt, .dets = dets};
  linspace(.5, .95, N_IOU, e.thr);
  linspace(0., 1., N_REC, e.rec_thr);
  if (prepare_ids(&e, err, err_cap) || prepare_dets(&e, n_dets, out, err, err_cap)) {
    free_eval(&e);
    return -1;
  }
  prepare_gts(&e, out);
  alloc_eval_arrays(&e);
  int64_t gi = 0, di = 0;
  for (int64_t k = 0; k < e.K; k++) {
    if (category_groups(&e, k, &gi, &di) == 0) continue;  // E empty: precision and recall stay -1
    evaluate_category(&e);
    accumulate_category(&e, k);
  }
  summarize(&e, out);
  free_eval(&e);
  return 0;
}

void coco_print_summary(const CocoEvalResult *r, FILE *f) {
  for (int s = 0; s < COCO_N_STATS; s++) {
    // iStr = ' {:<18} {} @[ IoU={:<9} | area={:>6s} | maxDets={:>3d} ] = {:0.3f}'
    char iou[16];
    if (SUMMARY[s].iou < 0) snprintf(iou, sizeof iou, "%0.2f:%0.2f", .5, .95);
    else snprintf(iou, sizeof iou, "%0.2f", SUMMARY[s].iou);
    fprintf(f, " %-18s %s @[ IoU=%-9s | area=%6s | maxDets=%3d ] = %0.3f\n",
            SUMMARY[s].ap ? "Average Precision" : "Average Recall", SUMMARY[s].ap ? "(AP)" : "(AR)", iou,
            AREA_LABEL[SUMMARY[s].area], MAX_DETS[SUMMARY[s].m], r->stats[s]);
  }
}

int coco_write_stats_json(const char *path, const CocoEvalResult *r, char *err, size_t err_cap) {
  size_t n = strlen(path) + 8;
  char *tmp = detr_malloc(n, "cocoeval");
  snprintf(tmp, n, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  if (!f) {
    snprintf(err, err_cap, "%s: cannot write: %s", tmp, strerror(errno));
    free(tmp);
    return -1;
  }
  fputc('{', f);
  for (int s = 0; s < COCO_N_STATS; s++) fprintf(f, "%s\"%s\": %.17g", s ? ", " : "", coco_stat_names[s], r->stats[s]);
  fputs("}\n", f);
  bool ok = !ferror(f);
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) {
    snprintf(err, err_cap, "%s: cannot write: %s", ok ? path : tmp, strerror(errno));
    remove(tmp);
    free(tmp);
    return -1;
  }
  free(tmp);
  return 0;
}
