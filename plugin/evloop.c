/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* evloop.c: see evloop.h. */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>

#include "evloop.h"
#include "threads.h"

int
evloop_new (struct evloop *l, const char *thread_name, evloop_kick_fn *cb,
            void *data)
{
  /* Never the default loop: it installs a SIGCHLD handler and reaps
   * every child, which would break nbdkit --run (ev.pod).  NOSIGMASK:
   * libev must not change the signal mask of a threaded program; the
   * thread blocks all signals itself (evloop_start).
   */
  l->loop = ev_loop_new (EVFLAG_AUTO | EVFLAG_NOSIGMASK);
  if (l->loop == NULL)
    return -1;
  l->thread_name = thread_name;
  ev_async_init (&l->kick, cb);
  l->kick.data = data;
  ev_async_start (l->loop, &l->kick);
  return 0;
}

static void *
evloop_thread (void *vl)
{
  struct evloop *l = vl;

  thread_setup (l->thread_name);
  ev_run (l->loop, 0);
  return NULL;
}

int
evloop_start (struct evloop *l)
{
  sigset_t all, old;
  int err;

  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  err = pthread_create (&l->thread, NULL, evloop_thread, l);
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (err != 0) {
    ev_loop_destroy (l->loop);
    l->loop = NULL;
    errno = err;
    return -1;
  }
  return 0;
}

void
evloop_join (struct evloop *l)
{
  pthread_join (l->thread, NULL);
  ev_loop_destroy (l->loop);
  l->loop = NULL;
}
