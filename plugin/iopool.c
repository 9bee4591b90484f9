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
#include "iopool.h"
#include "threads.h"

/* Protected by lock. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static list_head queues[2] = {  /* [enum pool_queue]: struct pool_job. */
  LIST_HEAD_INIT (queues[POOL_NORMAL]),
  LIST_HEAD_INIT (queues[POOL_URGENT]),
};
enum pool_state { POOL_STOPPED, POOL_RUNNING, POOL_STOPPING };
static enum pool_state state;
static pthread_t *threads;                     /* Owned. */
static unsigned nr_threads;

/* The next job, urgent first, or NULL.  Lock held. */
static struct pool_job *
next_job_locked (void)
{
  struct pool_job *job = list_pop (&queues[POOL_URGENT], struct pool_job,
                                   link);

  if (job == NULL)
    job = list_pop (&queues[POOL_NORMAL], struct pool_job, link);
  return job;
}

static void *
pool_thread (void *arg)
{
  thread_setup (THREAD_NAME_IO);

  for (;;) {
    struct pool_job *job;

    pthread_mutex_lock (&lock);
    while ((job = next_job_locked ()) == NULL && state == POOL_RUNNING)
      pthread_cond_wait (&cond, &lock);
    pthread_mutex_unlock (&lock);

    if (job == NULL)
      return NULL;
    job->fn (job);
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
iopool_submit (struct pool_job *job, enum pool_queue q)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&lock);

  if (state != POOL_RUNNING)
    return false;
  list_add_tail (&queues[q], &job->link);
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
