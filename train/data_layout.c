#define _DEFAULT_SOURCE  // access
#include "train/data_layout.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void setup_split_paths(const char *data_dir, const char *split, char *ann, size_t ann_cap, char *img, size_t img_cap) {
  snprintf(ann, ann_cap, "%s/annotations/instances_%s.json", data_dir, split);
  size_t len = strlen(ann);
  if (access(ann, F_OK) != 0 && len + 3 < ann_cap) {
    memcpy(ann + len, ".gz", 4);
    if (access(ann, F_OK) != 0) ann[len] = 0;  // neither exists: report the plain name
  }
  snprintf(img, img_cap, "%s/%s", data_dir, split);
}

// The name of category `id` in ds, or NULL.
static const char *category_name(const CocoDataset *ds, long id) {
  for (int i = 0; i < ds->n_categories; i++)
    if (ds->categories[i].id == id) return ds->categories[i].name;
  return NULL;
}

int categories_compare(const char *checkpoint_categories, const CocoDataset *ds, char *msg, size_t cap) {
  if (!checkpoint_categories) return 0;
  enum { SHOWN = 4 };  // differences named in msg
  size_t n = 0;
  int id_diffs = 0, name_diffs = 0;
  char names[1024] = "";  // the name differences, said only when the ids agree
  size_t nn = 0;
  msg[0] = 0;
  // Checkpoints written before 2026-11-26 kept at most 4095 bytes of the text, the last item
  // possibly cut: such a text is compared up to its last whole item, and the data's ids past it
  // are not called missing.
  const char *p = checkpoint_categories, *stop = p + strlen(p);
  bool truncated = stop - p >= 4095;
  long last_id = LONG_MAX;
  if (truncated) {
    stop = strrchr(p, ';') ? strrchr(p, ';') : p;
    last_id = -1;
  }
  while (p < stop) {  // "id:name" items as label_names_from_text reads them
    size_t len = strcspn(p, ";");
    char *end = NULL;
    long id = strtol(p, &end, 10);
    if (end != p && *end == ':' && end < p + len) {
      if (truncated && id > last_id) last_id = id;
      const char *name = end + 1, *theirs = category_name(ds, id);
      int name_len = (int)(p + len - name);
      if (!theirs) {
        if (id_diffs++ < SHOWN && n < cap)
          n += (size_t)snprintf(msg + n, cap - n, "%sid %ld (%.*s) only in the checkpoint", id_diffs > 1 ? "; " : "",
                                id, name_len, name);
      } else {
        if ((strlen(theirs) != (size_t)name_len || strncmp(theirs, name, (size_t)name_len)) && name_diffs++ < SHOWN &&
            nn < sizeof names)
          nn +=
              (size_t)snprintf(names + nn, sizeof names - nn, "%sid %ld is '%.*s' in the checkpoint, '%s' in the data",
                               name_diffs > 1 ? "; " : "", id, name_len, name, theirs);
      }
    }
    p += len + (p[len] == ';');
  }
  for (int i = 0; i < ds->n_categories; i++) {
    char key[32];
    int klen = snprintf(key, sizeof key, "%d:", ds->categories[i].id);
    bool found = ds->categories[i].id > last_id;  // or an item of the checkpoint's text starting "id:"
    for (const char *q = checkpoint_categories; q && !found; q = strchr(q, ';'), q = q ? q + 1 : NULL)
      found = !strncmp(q, key, (size_t)klen);
    if (!found && id_diffs++ < SHOWN && n < cap)
      n += (size_t)snprintf(msg + n, cap - n, "%sid %d (%s) only in the data", id_diffs > 1 ? "; " : "",
                            ds->categories[i].id, ds->categories[i].name);
  }
  if (id_diffs) {
    if (id_diffs > SHOWN && n < cap) snprintf(msg + n, cap - n, "; %d differences in all", id_diffs);
    return 2;
  }
  if (!name_diffs) return 0;
  snprintf(msg, cap, "%s%s", names, name_diffs > SHOWN ? "; more names differ" : "");
  return 1;
}

// Up to `cap` bytes of the names in dir that pass keep(), ", "-separated.
static void list_names(const char *dir, bool (*keep)(const char *dir, const char *name), char *out, size_t cap) {
  size_t n = 0;
  out[0] = 0;
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d)) && n < cap)
    if (e->d_name[0] != '.' && keep(dir, e->d_name))
      n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? ", " : "", e->d_name);
  closedir(d);
}

static bool is_instances_file(const char *dir, const char *name) {
  (void)dir;
  return !strncmp(name, "instances_", 10) && strstr(name, ".json");
}

static bool is_folder(const char *dir, const char *name) {
  char path[4200];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int setup_check_split_layout(const char *data_dir, const char *split, const char *flag, char *err, size_t err_cap) {
  char ann[4096], img[4096], there[1024], dir[4200];
  setup_split_paths(data_dir, split, ann, sizeof ann, img, sizeof img);
  if (!is_folder(data_dir, ".")) {
    struct stat st;
    if (stat(data_dir, &st) == 0)  // an annotation file, say: the root above it is meant
      snprintf(err, err_cap,
               "--data %s: not a folder: --data takes the dataset's root, the folder that holds "
               "annotations/instances_<split>.json and <split>/",
               data_dir);
    else snprintf(err, err_cap, "--data %s: no such folder", data_dir);
    return -1;
  }
  if (access(ann, F_OK) != 0) {
    snprintf(dir, sizeof dir, "%s/annotations", data_dir);
    list_names(dir, is_instances_file, there, sizeof there);
    snprintf(err, err_cap,
             "%s: no such file. A data set holds annotations/instances_<split>.json and the images in "
             "<split>/; %s has %s%s (pick the split with %s NAME, e.g. %s train2017 for COCO)",
             ann, dir, there[0] ? "" : "no instances_*.json", there, flag, flag);
    return -1;
  }
  if (!is_folder(img, ".")) {
    list_names(data_dir, is_folder, there, sizeof there);
    snprintf(err, err_cap,
             "%s/: no such folder: the images of split '%s' go in %s/ (the folder named as the split; "
             "pick another with %s NAME). %s holds the folders: %s",
             img, split, img, flag, data_dir, there[0] ? there : "none");
    return -1;
  }
  return 0;
}
