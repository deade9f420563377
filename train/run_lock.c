#define _DEFAULT_SOURCE  // gethostname, kill
#include "train/run_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// Who holds a lock, as its file says.
typedef struct {
  long pid;
  char host[256];
  char command[4096];
} LockHolder;

static void this_host(char *host, size_t cap) {
  if (gethostname(host, cap) != 0) snprintf(host, cap, "?");
  host[cap - 1] = 0;
}

// /proc/PID/comm (the executable's name), or "" where it cannot be read.
static void process_name(const char *pid, char *name, size_t cap) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%s/comm", pid);
  name[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return;
  if (!fgets(name, (int)cap, f)) name[0] = 0;
  fclose(f);
  name[strcspn(name, "\n")] = 0;
}

// 0 with *h filled; -1 when the file is gone or names no process (one being written: retried).
static int read_holder(const char *path, LockHolder *h) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  *h = (LockHolder){.pid = -1};
  char line[4200];
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    if (!strncmp(line, "pid ", 4)) h->pid = strtol(line + 4, NULL, 10);
    else if (!strncmp(line, "host ", 5)) snprintf(h->host, sizeof h->host, "%.255s", line + 5);
    else if (!strncmp(line, "command ", 8)) snprintf(h->command, sizeof h->command, "%.4095s", line + 8);
  }
  fclose(f);
  return h->pid > 0 ? 0 : -1;
}

// Whether the holder may still be running. On this host: its pid runs a program of this one's name
// (a pid reused after a reboot by another program is no holder). Elsewhere: its lock was refreshed
// within RUN_LOCK_STALE_S. *why says how an ended holder was recognised.
static bool holder_alive(const char *path, const LockHolder *h, char *why, size_t cap) {
  char host[256];
  this_host(host, sizeof host);
  if (!strcmp(h->host, host)) {
    if (kill((pid_t)h->pid, 0) != 0 && errno == ESRCH) {
      snprintf(why, cap, "process %ld is no longer running", h->pid);
      return false;
    }
    char pid[32], theirs[64], ours[64];
    snprintf(pid, sizeof pid, "%ld", h->pid);
    process_name(pid, theirs, sizeof theirs);
    process_name("self", ours, sizeof ours);
    if (theirs[0] && ours[0] && strcmp(theirs, ours)) {
      snprintf(why, cap, "process %ld is now %s, not a detr run", h->pid, theirs);
      return false;
    }
    return true;
  }
  struct stat st;
  if (stat(path, &st) != 0) return false;
  double age = difftime(time(NULL), st.st_mtime);
  if (age < RUN_LOCK_STALE_S) return true;
  snprintf(why, cap, "its lock was last refreshed %.0f s ago (a live run refreshes it every %d s)", age,
           RUN_LOCK_REFRESH_S);
  return false;
}

// Touches the lock every RUN_LOCK_REFRESH_S until run_lock_release.
static void *refresh_thread(void *arg) {
  RunLock *l = arg;
  pthread_mutex_lock(&l->mu);
  while (!l->stopping) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += RUN_LOCK_REFRESH_S;
    pthread_cond_timedwait(&l->wake, &l->mu, &until);
    if (!l->stopping) utimensat(AT_FDCWD, l->path, NULL, 0);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

// Writes this process's holder file as path.tmp.PID (the temporary-file pattern run_dir.c knows).
static int write_holder_file(const char *tmp, const char *command, char *err, size_t err_cap) {
  char host[256];
  this_host(host, sizeof host);
  FILE *f = fopen(tmp, "w");
  if (!f || fprintf(f, "pid %ld\nhost %s\ncommand %s\n", (long)getpid(), host, command) < 0 || fclose(f) != 0) {
    snprintf(err, err_cap, "%s: cannot write: %s", tmp, strerror(errno));
    if (f) unlink(tmp);
    return -1;
  }
  return 0;
}

// Whether the lock file names this process now.
static bool names_us(const char *path) {
  LockHolder h;
  char host[256];
  this_host(host, sizeof host);
  return read_holder(path, &h) == 0 && h.pid == (long)getpid() && !strcmp(h.host, host);
}

// link() makes the lock only where none is (atomic, also over NFS); a dead holder's file is replaced
// by rename(), and read back: of two processes taking over at once, one finds the other's name.
static int take(RunLock *l, const char *tmp, char *err, size_t err_cap) {
  for (int attempt = 0; attempt < 3; attempt++) {
    if (link(tmp, l->path) == 0) return 0;
    if (errno != EEXIST) {
      snprintf(err, err_cap, "%s: cannot create: %s", l->path, strerror(errno));
      return -1;
    }
    LockHolder h;
    if (read_holder(l->path, &h)) {  // removed, or being written: look again
      usleep(100000);
      continue;
    }
    char why[512];
    if (holder_alive(l->path, &h, why, sizeof why)) {
      snprintf(err, err_cap,
               "another detr train (process %ld on %s) is running in this directory: %s. Wait for it to end, stop it "
               "(kill -INT %ld: it saves a checkpoint), or train into another --out",
               h.pid, h.host, h.command[0] ? h.command : "(command unknown)", h.pid);
      return -1;
    }
    if (rename(tmp, l->path) != 0) {
      snprintf(err, err_cap, "%s: cannot replace: %s", l->path, strerror(errno));
      return -1;
    }
    if (!names_us(l->path)) {
      snprintf(err, err_cap, "%s: another process took over the lock at the same moment", l->path);
      return -1;
    }
    fprintf(stderr, "detr train: %s was left by a run that has ended (%s, on %s: %s): taking it over\n", l->path,
            h.command[0] ? h.command : "command unknown", h.host, why);
    return 1;  // tmp is gone (renamed)
  }
  snprintf(err, err_cap, "%s: exists but names no process; remove it if no run is using this directory", l->path);
  return -1;
}

int run_lock_acquire(RunLock *l, const char *dir, const char *command, char *err, size_t err_cap) {
  *l = (RunLock){0};
  snprintf(l->path, sizeof l->path, "%s/" RUN_LOCK_NAME, dir);
  char tmp[4300];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", l->path, (long)getpid());
  if (write_holder_file(tmp, command, err, err_cap)) return -1;
  int rc = take(l, tmp, err, err_cap);
  if (rc != 1) unlink(tmp);
  if (rc < 0) return -1;
  l->held = true;
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->wake, NULL);
  l->thread_started = pthread_create(&l->refresher, NULL, refresh_thread, l) == 0;
  return 0;
}

void run_lock_release(RunLock *l) {
  if (!l->held) return;
  if (l->thread_started) {
    pthread_mutex_lock(&l->mu);
    l->stopping = true;
    pthread_cond_signal(&l->wake);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->refresher, NULL);
  }
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->wake);
  if (names_us(l->path)) unlink(l->path);
  l->held = false;
}
