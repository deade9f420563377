#define _GNU_SOURCE  // F_OFD_SETLK, gethostname
#include "train/run_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// Who holds (or held) a lock, as its file says.
typedef struct {
  long pid;
  char host[256];
  char command[4096];
} LockHolder;

static void this_host(char *host, size_t cap) {
  if (gethostname(host, cap) != 0) snprintf(host, cap, "?");
  host[cap - 1] = 0;
}

// What the lock file open on fd says; false when it names nobody (new, or emptied by its holder).
static bool read_holder(int fd, LockHolder *h) {
  *h = (LockHolder){.pid = -1};
  char buf[4600];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return false;
  buf[n] = 0;
  for (char *line = buf, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    if (!strncmp(line, "pid ", 4)) h->pid = strtol(line + 4, NULL, 10);
    else if (!strncmp(line, "host ", 5)) snprintf(h->host, sizeof h->host, "%.255s", line + 5);
    else if (!strncmp(line, "command ", 8)) snprintf(h->command, sizeof h->command, "%.4095s", line + 8);
  }
  return h->pid > 0;
}

// A write lock on the whole file, through the open file description (not the process: released
// when the last descriptor of it closes, whichever thread or fork holds it).
static int try_lock(int fd) {
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
  return fcntl(fd, F_OFD_SETLK, &fl);
}

// Whether fd is still the file at path (a holder that was ending may have removed it after this
// process opened it: a lock on that file would guard nothing).
static bool still_at_path(int fd, const char *path) {
  struct stat a, b;
  return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static int write_holder(int fd, const char *path, const char *command, char *err, size_t err_cap) {
  char host[256], text[4600];
  this_host(host, sizeof host);
  int n = snprintf(text, sizeof text, "pid %ld\nhost %s\ncommand %.4000s\n", (long)getpid(), host, command);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n) {
    snprintf(err, err_cap, "%s: cannot write: %s", path, strerror(errno));
    return -1;
  }
  return 0;
}

int run_lock_acquire(RunLock *l, const char *dir, const char *command, char *err, size_t err_cap) {
  *l = (RunLock){.fd = -1};
  snprintf(l->path, sizeof l->path, "%s/" RUN_LOCK_NAME, dir);
  for (int attempt = 0; attempt < 5; attempt++) {
    int fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      snprintf(err, err_cap, "%s: cannot open: %s", l->path, strerror(errno));
      return -1;
    }
    LockHolder h;
    if (try_lock(fd) != 0) {
      int e = errno;
      bool named = read_holder(fd, &h);
      close(fd);
      if (e == EAGAIN || e == EACCES) {
        snprintf(err, err_cap,
                 "another detr train (process %ld on %s) is running in this directory: %s. Wait for it to end, "
                 "stop it (kill -INT %ld: it saves a checkpoint), or train into another --out",
                 named ? h.pid : -1L, named ? h.host : "an unknown host",
                 named && h.command[0] ? h.command : "(command unknown)", named ? h.pid : -1L);
        return -1;
      }
      fprintf(stderr,
              "detr train: warning: %s: no file locks here (%s): a second detr train into this directory would "
              "not be refused\n",
              l->path, strerror(e));
      return 0;
    }
    if (!still_at_path(fd, l->path)) {  // removed by a holder that was ending: take the new one
      close(fd);
      continue;
    }
    if (read_holder(fd, &h))
      fprintf(stderr, "detr train: %s was left by a run that has ended (process %ld on %s: %s): taking it over\n",
              l->path, h.pid, h.host, h.command[0] ? h.command : "command unknown");
    if (write_holder(fd, l->path, command, err, err_cap)) {
      close(fd);
      return -1;
    }
    l->fd = fd;
    l->held = true;
    return 0;
  }
  snprintf(err, err_cap, "%s: removed and created again by other processes, five times over", l->path);
  return -1;
}

void run_lock_release_moved(RunLock *l, const char *moved_dir) {
  if (!l->held) return;
  char moved[4400];
  snprintf(moved, sizeof moved, "%s/" RUN_LOCK_NAME, moved_dir);
  unlink(moved);
  close(l->fd);
  l->held = false;
}

void run_lock_release(RunLock *l) {
  if (!l->held) return;
  if (still_at_path(l->fd, l->path)) unlink(l->path);  // removed while locked: no other can hold it
  close(l->fd);
  l->held = false;
}
