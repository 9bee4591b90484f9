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

void
glue_perform (struct glue_actions *a, uint32_t inline_runs)
{
  for (;;) {
    struct eng_run *first, *r, *next;
    int err;

    answer_and_release (a);
    first = a->eng.issue;
    if (first == NULL)
      return;
    for (r = first->issue_next; r != NULL; r = next) {
      next = r->issue_next;
      if (!iopool_submit (r))
        glue_issue (r, GLUE_INLINE_ALL);
    }
    if (inline_runs == 0 && iopool_submit (first))
      return;
    if (inline_runs > 0 && inline_runs != GLUE_INLINE_ALL)
      inline_runs--;

    err = backing_issue_run (&backings[first->run->backing], first->run) == 0
      ? 0 : errno;
    glue_begin (a);
    pthread_mutex_lock (&eng_lock);
    engine_complete (eng, first, err, now_ns (), &a->eng);
    glue_end_locked (a);
    pthread_mutex_unlock (&eng_lock);
  }
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
