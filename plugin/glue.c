/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* glue.c: carrying out the engine's actions.  See glue.h. */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdlib.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backing.h"
#include "conn.h"
#include "glue.h"
#include "iopool.h"
#include "plugin.h"
#include "remote.h"
#include "request.h"

pthread_mutex_t eng_lock = PTHREAD_MUTEX_INITIALIZER;
struct engine *eng;

int
glue_wait (struct waiter *w)
{
  while (sem_wait (&w->done) == -1 && errno == EINTR)
    ;
  return w->err;
}

void
glue_begin (struct glue_actions *a)
{
  eng_actions_init (&a->eng);
  a->wake = NULL;
}

void
glue_end_locked (struct glue_actions *a)
{
  struct eng_op *op;

  for (op = a->eng.reply; op != NULL; op = op->reply_next) {
    struct waiter *w = op->waiter;

    if (w) {
      w->err = op->err;
      w->next = a->wake;
      a->wake = w;
    }
  }
  a->eng.reply = NULL;
  a->eng.reply_tail = &a->eng.reply;
  request_recycle_locked (&a->eng);
  glue_kick_timer_locked ();
}

/* Post every waiter, then free every released op.  Once posted, a
 * waiter's stack frame may be gone: read its next first.
 */
static void
answer_and_release (struct glue_actions *a)
{
  struct waiter *w, *wnext;
  struct eng_op *op, *next;

  for (w = a->wake; w != NULL; w = wnext) {
    wnext = w->next;
    sem_post (&w->done);
  }
  a->wake = NULL;
  for (op = a->eng.release; op != NULL; op = next) {
    next = op->release_next;
    request_free (op);
  }
  a->eng.release = NULL;
  a->eng.release_tail = &a->eng.release;
}

/* Hand run r's result to the engine; what that unblocks joins a. */
static void
complete_into (struct glue_actions *a, struct eng_run *r, int err)
{
  pthread_mutex_lock (&eng_lock);
  engine_complete (eng, r, err, now_ns (), &a->eng);
  glue_end_locked (a);
  pthread_mutex_unlock (&eng_lock);
}

void
glue_perform (struct glue_actions *a, uint32_t inline_runs)
{
  for (;;) {
    struct eng_run *list, *r, *next, *mine = NULL;
    int err;

    answer_and_release (a);
    list = a->eng.issue;
    if (list == NULL)
      return;
    a->eng.issue = NULL;
    a->eng.issue_tail = &a->eng.issue;
    for (r = list; r != NULL; r = next) {
      struct remote *rem = backings[r->run->backing].remote;

      next = r->issue_next;
      if (rem) {
        /* Asynchronous: the remote's loop hands it back.  Done at once
         * (a trim the server cannot do, no connection, no memory):
         * its result goes to the engine now.
         */
        if (!remote_submit (rem, r, &err))
          complete_into (a, r, err);
        continue;
      }
      if (mine == NULL && inline_runs > 0) {
        mine = r;
        continue;
      }
      if (iopool_submit (r))
        continue;
      /* The pool is not running (server exit): issue here. */
      if (mine == NULL)
        mine = r;
      else
        glue_issue (r, GLUE_INLINE_ALL);
    }
    if (mine == NULL)
      continue;
    if (inline_runs > 0 && inline_runs != GLUE_INLINE_ALL)
      inline_runs--;

    err = backing_issue_run (&backings[mine->run->backing], mine->run) == 0
      ? 0 : errno;
    complete_into (a, mine, err);
  }
}

void
glue_runs_done (struct eng_run *const *runs, const int *errs, size_t n)
{
  struct glue_actions a;
  uint64_t now = now_ns ();
  size_t i;

  glue_begin (&a);
  pthread_mutex_lock (&eng_lock);
  for (i = 0; i < n; ++i)
    engine_complete (eng, runs[i], errs[i], now, &a.eng);
  glue_end_locked (&a);
  pthread_mutex_unlock (&eng_lock);
  glue_perform (&a, GLUE_INLINE_NONE);
}

void
glue_issue (struct eng_run *r, uint32_t inline_runs)
{
  struct glue_actions a;

  glue_begin (&a);
  a.eng.issue = r;
  r->issue_next = NULL;
  a.eng.issue_tail = &r->issue_next;
  glue_perform (&a, inline_runs == 0 ? 1 : inline_runs);
}
