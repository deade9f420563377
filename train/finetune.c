#include "train/finetune.h"

#include <stdio.h>
#include <string.h>

#include "api/model_file.h"  // checkpoint_is, checkpoint_verify
#include "nn/model_io.h"
#include "train/data_layout.h"  // categories_compare

// The file's `name` has another number of rows than the model's (classes, queries) and is
// otherwise the same shape: what a re-initialisation adapts. Any other difference is a model that
// does not fit, left to the strict load.
static bool rows_differ(const StFile *f, const Tensor *t, const char *name, char *what, size_t cap) {
  const StEntry *e = params_file_entry(f, name);  // a transformers file's too
  bool same_rest = e && e->ndim == t->shape.ndim;
  for (int d = 1; same_rest && d < e->ndim; d++) same_rest = e->shape[d] == t->shape.d[d];
  if (!same_rest || e->shape[0] == t->shape.d[0]) return false;
  snprintf(what, cap, "%lld in the weights, %lld here", (long long)e->shape[0], (long long)t->shape.d[0]);
  return true;
}

int finetune_load(DetrModel *m, const char *path, const char *init_categories, const CocoDataset *train, bool partial,
                  bool say, char *err, size_t err_cap) {
  StFile *f = st_open(path, err, err_cap);
  if (!f) return -1;
  bool checkpoint = checkpoint_is(f);
  if (checkpoint && checkpoint_verify(f, NULL, err, err_cap)) {
    st_close(f);
    return -1;
  }
  if (checkpoint && say)
    fprintf(stderr,
            "detr train: --init %s: a checkpoint: its model tensors (its optimizer state, step and schedule "
            "are not used; --resume continues a run)\n",
            path);
  // The class head: other classes (another count, or known ids/names that differ).
  const char *keep[4] = {NULL};
  int n_keep = 0;
  char why[1024], class_w[112], class_b[112];  // the class head's names (the decoder kind's layout)
  snprintf(class_w, sizeof class_w, "%s.weight", decoder_layout(detr_decoder(&m->cfg))->class_embed);
  snprintf(class_b, sizeof class_b, "%s.bias", decoder_layout(detr_decoder(&m->cfg))->class_embed);
  if (rows_differ(f, m->class_embed.weight, class_w, why, sizeof why)) {
    if (say)
      fprintf(stderr, "detr train: re-initialised %s and %s: the class head's outputs (classes%s): %s\n", class_w,
              class_b, detr_classes(&m->cfg)->extra_columns ? " and no-object" : "", why);
    keep[n_keep++] = class_w;
    keep[n_keep++] = class_b;
  } else if (categories_compare(init_categories, train, why, sizeof why)) {
    if (say)
      fprintf(stderr,
              "detr train: re-initialised %s and %s: the data's categories differ from the checkpoint's "
              "(%s)\n",
              class_w, class_b, why);
    keep[n_keep++] = class_w;
    keep[n_keep++] = class_b;
  } else if (!init_categories && say) {
    fprintf(stderr,
            "detr train: warning: %s names no categories: its class head is kept, its class k taken for the "
            "data's category id k\n",
            path);
  }
  if (m->query_embed && rows_differ(f, m->query_embed, "query_embed.weight", why, sizeof why)) {
    if (say) fprintf(stderr, "detr train: re-initialised query_embed.weight: num_queries is %s\n", why);
    keep[n_keep++] = "query_embed.weight";
  }
  const char *ignore[] = {"optim.", NULL};
  char not_loaded[4096];
  ParamsLoad opt = {.ignore_prefixes = checkpoint ? ignore : NULL,
                    .keep_init = keep,
                    .partial = partial,
                    .not_loaded = not_loaded,
                    .not_loaded_cap = sizeof not_loaded};
  int rc = params_load_with(&m->params, f, &opt, err, err_cap);
  if (rc) {
    weights_mismatch_hint(&m->params, f, !partial, err, err_cap);
  } else if (partial && say) {
    ParamsFit w = params_fit(&m->params, f);
    fprintf(stderr,
            "detr train: --init-partial: loaded %d of the model's %d tensors from %s; these keep their "
            "initialisation (%d of another shape, %d missing; %d of the file's unused):%s\n",
            w.fit, w.fit + w.other + w.missing, path, w.other, w.missing, w.unused,
            not_loaded[0] ? not_loaded : " (none: all fit)");
  }
  st_close(f);
  return rc;
}
