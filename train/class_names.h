// Class names for `detr predict`: from the "categories" of a COCO instances file (--names, plain or
// .json.gz, streamed) or from a checkpoint's "categories" metadata ("id:name;id:name;..."). Labels
// are category ids; ids beyond CLASS_NAMES_MAX_ID name nothing.
#pragma once
#include <stddef.h>

#define CLASS_NAMES_MAX_ID 1000000

typedef struct {
  char **name;  // [n]: name of label i, or NULL
  int n;
} ClassNames;

// Names label (0..CLASS_NAMES_MAX_ID; others are ignored), replacing an earlier name.
void class_names_set(ClassNames *nm, int label, const char *name);
void class_names_free(ClassNames *nm);
// Each returns 0, or -1 with err naming the file and the entry (malformed JSON, a category without
// an integer id or a string name, no categories, ...). The file's limits are those of COCO
// instances files (datasets/coco.h: string length, JSON depth, gzip expansion).
int class_names_from_coco(const char *path, ClassNames *nm, char *err, size_t cap);
int class_names_from_text(const char *path, const char *text, ClassNames *nm, char *err, size_t cap);
