// One process per run directory: DIR/train.lock names the run that holds it (pid, host, command).
// A second `detr train` into the directory - a new run, --resume auto, --move-old-run - is refused
// while the holder lives, with its pid and command. A lock whose holder has ended is taken over,
// with a line saying so: on this host, a holder whose pid no longer runs detr; on another host of a
// shared file system (rank 0 of an mpirun there), a lock not refreshed for RUN_LOCK_STALE_S (a
// thread of the holder touches it every RUN_LOCK_REFRESH_S, through evaluations and long steps).
#pragma once
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#define RUN_LOCK_NAME "train.lock"
#define RUN_LOCK_REFRESH_S 30
#define RUN_LOCK_STALE_S 300

typedef struct {
  char path[4200];  // DIR/train.lock
  bool held;
  pthread_t refresher;
  pthread_mutex_t mu;
  pthread_cond_t wake;
  bool stopping, thread_started;
} RunLock;

// Takes DIR/train.lock for this process (DIR must exist). Returns 0, or -1 with err naming the
// live holder (its pid, host and command) or the file that could not be written.
int run_lock_acquire(RunLock *l, const char *dir, const char *command, char *err, size_t err_cap);
// Removes the lock file (when it still names this process) and stops the refreshing thread.
// Safe on a lock never taken.
void run_lock_release(RunLock *l);
