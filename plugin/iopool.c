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

#include <ev.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backing.h"
#include "cleanup.h"
#include "conn.h"
#include "iopool.h"
#include "plugin.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static struct job *head, **tail = &head;       /* Protected by lock. */
static bool stopping;                          /* Protected by lock. */
static pthread_t *threads;                     /* Owned. */
static unsigned nr_threads;                    /* Protected by lock. */

static void
do_job (struct job *j)
{
  struct backing *bk = &backings[j->run->backing];

  j->err = backing_issue_run (bk, j->run) == 0 ? 0 : errno;
}

static void *
worker (void *arg)
{
  for (;;) {
    struct job *j;

    pthread_mutex_lock (&lock);
    while (head == NULL && !stopping)
      pthread_cond_wait (&cond, &lock);
    if (head == NULL) {
      pthread_mutex_unlock (&lock);
      return NULL;
    }
    j = head;
    head = j->next;
    if (head == NULL)
      tail = &head;
    pthread_mutex_unlock (&lock);

    do_job (j);
    conn_job_done (j->c, j);
  }
}

int
iopool_start (unsigned n)
{
  sigset_t all, old;
  int err = 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&lock);

  if (nr_threads > 0)
    return 0;
  threads = calloc (n, sizeof *threads);
  if (threads == NULL) {
    nbdkit_error ("calloc: %m");
    return -1;
  }
  /* Signals belong to nbdkit's threads. */
  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  for (; nr_threads < n; nr_threads++) {
    err = pthread_create (&threads[nr_threads], NULL, worker, NULL);
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
  return 0;
}

void
iopool_submit (struct job *j)
{
  pthread_mutex_lock (&lock);
  j->next = NULL;
  *tail = j;
  tail = &j->next;
  pthread_cond_signal (&cond);
  pthread_mutex_unlock (&lock);
}

void
iopool_stop (void)
{
  unsigned i, n;

  pthread_mutex_lock (&lock);
  stopping = true;
  n = nr_threads;
  pthread_cond_broadcast (&cond);
  pthread_mutex_unlock (&lock);
  for (i = 0; i < n; ++i)
    pthread_join (threads[i], NULL);
  free (threads);
  threads = NULL;
  nr_threads = 0;
}
