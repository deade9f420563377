#define _POSIX_C_SOURCE 200809L  // O_CLOEXEC under -std=c11
#include "datasets/data_util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

int bad_input_policy_parse(const char *s, BadInputPolicy *out) {
  if (!strcmp(s, "fail")) *out = BAD_INPUT_FAIL;
  else if (!strcmp(s, "skip")) *out = BAD_INPUT_SKIP;
  else return -1;
  return 0;
}

int data_error(DataError *err, const char *fmt, ...) {
  if (!err) return DATA_ERROR;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  return DATA_ERROR;
}

static pthread_mutex_t warn_lock = PTHREAD_MUTEX_INITIALIZER;

void data_warn(int64_t *stream, const char *fmt, ...) {
  pthread_mutex_lock(&warn_lock);
  int64_t seen = (*stream)++;
  if (seen < DATA_WARN_LIMIT) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fprintf(stderr, "detr: warning: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (seen == DATA_WARN_LIMIT - 1)
      fprintf(stderr, "detr: warning: further warnings of this kind are counted, not printed\n");
  }
  pthread_mutex_unlock(&warn_lock);
}

char *data_path_join(const char *dir, const char *name) {
  if (!dir || !dir[0]) return detr_strdup(name, "path");
  size_t a = strlen(dir), b = strlen(name);
  bool slash = dir[a - 1] != '/';
  char *p = detr_malloc(a + slash + b + 1, "path");
  memcpy(p, dir, a);
  if (slash) p[a] = '/';
  memcpy(p + a + slash, name, b + 1);
  return p;
}

int data_mkdirs(const char *dir, DataError *err) {
  char *path = detr_strdup(dir, "directory path");
  int rc = DATA_OK;
  // Create each prefix ending at a '/', then the whole path; 0777 less the umask, as mkdir -p.
  for (char *p = path + 1;; p++) {
    if (*p == '/' || *p == '\0') {
      char saved = *p;
      *p = '\0';
      if (mkdir(path, 0777) != 0 && errno != EEXIST) {
        rc = data_error(err, "%s: cannot create directory: %s", path, strerror(errno));
        break;
      }
      *p = saved;
      if (saved == '\0') break;
    }
  }
  if (rc == DATA_OK) {
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) rc = data_error(err, "%s: not a directory", dir);
  }
  free(path);
  return rc;
}

void data_reserve(void **buf, int64_t *cap, int64_t need, size_t elem, const char *what) {
  if (need <= *cap) return;
  int64_t c = *cap ? *cap : 16;
  while (c < need) c += c / 2 + 16;  // x1.5: bounded overshoot for the big annotation arrays
  *buf = detr_realloc(*buf, (size_t)c * elem, what);
  *cap = c;
}

int64_t data_regular_file_size(const char *path, char *err, size_t err_cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    snprintf(err, err_cap, "%s: cannot open: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  int rc = fstat(fd, &st);
  close(fd);
  if (rc || !S_ISREG(st.st_mode)) {
    snprintf(err, err_cap, "%s: not a regular file", path);
    return -1;
  }
  return (int64_t)st.st_size;
}
