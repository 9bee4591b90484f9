/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* iopool.c: see iopool.h. */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "cleanup.h"
#include "glue.h"
#include "iopool.h"
#include "threads.h"

/* Protected by lock. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static list_head runs = LIST_HEAD_INIT (runs);  /* By issue_link. */
static list_head syncs = LIST_HEAD_INIT (syncs); /* By link. */
enum pool_state { POOL_STOPPED, POOL_RUNNING, POOL_STOPPING };
static enum pool_state state;
static pthread_t *threads;                     /* Owned. */
static unsigned nr_threads;

static void *
pool_thread (void *arg)
{
  thread_setup (THREAD_NAME_IO);

  for (;;) {
    struct eng_run *r = NULL;
    struct eng_sync *s = NULL;

    pthread_mutex_lock (&lock);
    while (list_empty (&runs) && list_empty (&syncs) &&
           state == POOL_RUNNING)
      pthread_cond_wait (&cond, &lock);
    /* A sync first: FLUSHes wait for it, and it blocks no write. */
    s = list_pop (&syncs, struct eng_sync, link);
    if (s == NULL)
      r = list_pop (&runs, struct eng_run, issue_link);
    pthread_mutex_unlock (&lock);

    if (s != NULL)
      glue_sync (s, GLUE_INLINE_ALL);
    else if (r != NULL)
      glue_issue (r, GLUE_INLINE_ALL);
    else
      return NULL;
  }
}

int
iopool_start (unsigned n)
{
  sigset_t all, old;
  int err = 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&lock);

  if (state != POOL_STOPPED)
    return 0;
  threads = calloc (n, sizeof *threads);
  if (threads == NULL) {
    nbdkit_error ("calloc: %m");
    return -1;
  }
  /* Signals belong to nbdkit's threads. */
  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  for (nr_threads = 0; nr_threads < n; nr_threads++) {
    err = pthread_create (&threads[nr_threads], NULL, pool_thread, NULL);
    if (err != 0)
      break;
  }
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (nr_threads == 0) {
    errno = err;
    nbdkit_error ("pthread_create: %m");
    free (threads);
    threads = NULL;
    return -1;
  }
  state = POOL_RUNNING;
  return 0;
}

bool
iopool_submit (struct eng_run *r)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&lock);

  if (state != POOL_RUNNING)
    return false;
  list_add_tail (&runs, &r->issue_link);
  pthread_cond_signal (&cond);
  return true;
}

bool
iopool_submit_sync (struct eng_sync *s)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&lock);

  if (state != POOL_RUNNING)
    return false;
  list_add_tail (&syncs, &s->link);
  pthread_cond_signal (&cond);
  return true;
}

void
iopool_stop (void)
{
  unsigned i, n;

  pthread_mutex_lock (&lock);
  if (state != POOL_RUNNING) {
    pthread_mutex_unlock (&lock);
    return;
  }
  state = POOL_STOPPING;
  n = nr_threads;
  pthread_cond_broadcast (&cond);
  pthread_mutex_unlock (&lock);
  /* The threads drain the queue before they see the state. */
  for (i = 0; i < n; ++i)
    pthread_join (threads[i], NULL);
  pthread_mutex_lock (&lock);
  free (threads);
  threads = NULL;
  nr_threads = 0;
  state = POOL_STOPPED;
  pthread_mutex_unlock (&lock);
}
