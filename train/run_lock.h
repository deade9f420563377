// One process per run directory: the run holds a kernel file lock (an open file description lock,
// fcntl F_OFD_SETLK) on DIR/train.lock for as long as it lives, and the file names it (pid, host,
// command) for the message others get. A second `detr train` into the directory - a new run,
// --resume auto, --move-old-run - is refused while the lock is held, naming the holder. The kernel
// drops the lock when its holder dies (SIGKILL, a crash; on NFS, its lock manager when the host
// goes), so the lock of a run that has ended is simply taken, with a line saying whose it was.
// Under mpirun, rank 0 holds it.
#pragma once
#include <stdbool.h>
#include <stddef.h>

#define RUN_LOCK_NAME "train.lock"

typedef struct {
  char path[4200];  // DIR/train.lock
  int fd;           // the open file description that holds the lock (valid when held)
  bool held;        // false in a zeroed RunLock
} RunLock;

// Takes DIR/train.lock for this process (DIR must exist). Returns 0, or -1 with err naming the
// live holder (its pid, host and command) or the file that could not be locked. On a file system
// without file locks, warns that a second process would not be refused and returns 0.
int run_lock_acquire(RunLock *l, const char *dir, const char *command, char *err, size_t err_cap);
// The directory holding the lock was renamed to moved_dir (--move-old-run): the lock file there,
// which names this process, is removed and the lock given up, so that it can be taken anew in the
// new directory.
void run_lock_release_moved(RunLock *l, const char *moved_dir);
// Removes the lock file and gives up the lock. Safe on a lock never taken (a zeroed RunLock).
void run_lock_release(RunLock *l);
