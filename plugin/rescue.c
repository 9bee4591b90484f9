/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* rescue.c: see rescue.h. */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "conn.h"
#include "rescue.h"

/* How long the aborting thread waits for the rescue.  Bounded: the
 * abort may come from the plugin's own assertion with eng_lock held.
 */
#define RESCUE_WAIT_S 10

enum rescue_state {
  RESCUE_STOPPED,
  RESCUE_ARMED,
};

static enum rescue_state state = RESCUE_STOPPED;
static int wake_pipe[2] = { -1, -1 };   /* handler -> thread */
static int done_pipe[2] = { -1, -1 };   /* thread -> handler */
static pthread_t thread;
static pid_t rescue_tid;                /* The thread's, for the handler. */
static struct sigaction old_action;

static void *
rescue_thread (void *arg)
{
  char c;
  ssize_t r;

  __atomic_store_n (&rescue_tid, gettid (), __ATOMIC_RELEASE);
  do
    r = read (wake_pipe[0], &c, 1);
  while (r == -1 && errno == EINTR);
  if (r == 1) {
    /* An abort: the exit's write-out, every connection's held data. */
    conns_rescue ();
    c = 0;
    if (write (done_pipe[1], &c, 1) != 1) {
      /* The handler then waits RESCUE_WAIT_S: nothing else to do. */
    }
  }
  return NULL;                  /* r == 0: rescue_stop closed the pipe. */
}

/* Wake the rescue thread and wait for it, at most RESCUE_WAIT_S.  Not
 * on the rescue thread itself (an assertion in the write-out): nobody
 * else would do the rescue, so waiting would only delay the abort.
 */
static void
wait_for_rescue (void)
{
  char c = 0;
  struct pollfd p = { .fd = done_pipe[0], .events = POLLIN };

  if (gettid () == __atomic_load_n (&rescue_tid, __ATOMIC_ACQUIRE))
    return;
  /* The thread answers once; its byte stays in the pipe, so that every
   * thread aborting at the same time sees it.
   */
  if (write (wake_pipe[1], &c, 1) == 1)
    while (poll (&p, 1, RESCUE_WAIT_S * 1000) == -1 && errno == EINTR)
      ;
}

/* Only async-signal-safe calls here (POSIX.1-2017 2.4.3): write, poll,
 * sigaction, raise, and gettid (one system call).
 *
 * The process must die of SIGABRT however SIGABRT came: abort(3)
 * raises it again after a handler returns, but a SIGABRT sent by
 * kill(2) is not raised again, and the process would go on serving
 * with the engine shut down by the rescue.  So the handler restores the
 * default action and raises SIGABRT itself: blocked while the handler
 * runs (no SA_NODEFER), it is delivered when the handler returns, with
 * a core as for any abort.  Not SA_RESETHAND: a second thread aborting
 * during the rescue would then die at once, cutting the write-out
 * short.
 */
static void
on_abort (int sig)
{
  struct sigaction dfl;

  wait_for_rescue ();
  memset (&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset (&dfl.sa_mask);
  sigaction (SIGABRT, &dfl, NULL);
  raise (sig);
}

static void
close_pipes (void)
{
  int i;

  for (i = 0; i < 2; ++i) {
    if (wake_pipe[i] >= 0)
      close (wake_pipe[i]);
    if (done_pipe[i] >= 0)
      close (done_pipe[i]);
    wake_pipe[i] = done_pipe[i] = -1;
  }
}

/* The rescue thread starts with SIGABRT blocked: a SIGABRT sent to the
 * process (kill -ABRT) then goes to another thread, whose handler waits
 * for the rescue thread.  abort(3) on the rescue thread unblocks it.
 */
static int
start_thread (void)
{
  sigset_t abrt, old;
  int err;

  sigemptyset (&abrt);
  sigaddset (&abrt, SIGABRT);
  err = pthread_sigmask (SIG_BLOCK, &abrt, &old);
  if (err != 0)
    return err;
  err = pthread_create (&thread, NULL, rescue_thread, NULL);
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  return err;
}

int
rescue_start (void)
{
  struct sigaction sa;
  int err;

  if (pipe2 (wake_pipe, O_CLOEXEC) == -1 ||
      pipe2 (done_pipe, O_CLOEXEC) == -1) {
    nbdkit_error ("pipe2: %m");
    close_pipes ();
    return -1;
  }
  err = start_thread ();
  if (err != 0) {
    errno = err;
    nbdkit_error ("pthread_create: %m");
    close_pipes ();
    return -1;
  }
  memset (&sa, 0, sizeof sa);
  sa.sa_handler = on_abort;
  sigemptyset (&sa.sa_mask);
  if (sigaction (SIGABRT, &sa, &old_action) == -1) {
    nbdkit_error ("sigaction: %m");
    close (wake_pipe[1]);
    wake_pipe[1] = -1;
    pthread_join (thread, NULL);
    close_pipes ();
    return -1;
  }
  state = RESCUE_ARMED;
  return 0;
}

void
rescue_stop (void)
{
  if (state != RESCUE_ARMED)
    return;
  sigaction (SIGABRT, &old_action, NULL);
  /* EOF on the pipe ends the thread (a rescue under way finishes). */
  close (wake_pipe[1]);
  wake_pipe[1] = -1;
  pthread_join (thread, NULL);
  close_pipes ();
  state = RESCUE_STOPPED;
}
