#define _POSIX_C_SOURCE 200809L  // fileno, fsync
#include "core/atomic_file.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

int atomic_file_write(const char *path, void (*write)(FILE *f, const void *ctx), const void *ctx, char *err,
                      size_t err_cap) {
  char tmp[4200];
  if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= sizeof tmp) {
    snprintf(err, err_cap, "%s: path too long", path);
    return -1;
  }
  FILE *f = fopen(tmp, "w");
  if (!f) {
    snprintf(err, err_cap, "%s: cannot write: %s", tmp, strerror(errno));
    return -1;
  }
  write(f, ctx);
  errno = 0;
  if (ferror(f) || fflush(f) || fsync(fileno(f))) {
    snprintf(err, err_cap, "%s: write failed: %s", tmp, strerror(errno ? errno : EIO));
    fclose(f);
    remove(tmp);
    return -1;
  }
  if (fclose(f) || rename(tmp, path)) {
    snprintf(err, err_cap, "%s: write or rename to %s failed: %s", tmp, path, strerror(errno));
    remove(tmp);
    return -1;
  }
  return 0;
}
