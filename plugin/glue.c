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

/* Answer every op on the reply list, then free every released one.
 * After sem_post the waiter's stack frame may be gone: nothing of it is
 * touched again.
 */
static void
answer_and_release (struct eng_actions *a)
{
  struct eng_op *op, *next;

  for (op = a->reply; op != NULL; op = next) {
    struct waiter *w = op->waiter;

    next = op->reply_next;
    if (w) {
      w->err = op->err;
      sem_post (&w->done);
    }
  }
  for (op = a->release; op != NULL; op = next) {
    next = op->release_next;
    request_free (op);
  }
}

void
glue_perform (struct eng_actions *a, uint32_t inline_runs)
{
  for (;;) {
    struct eng_run *first, *r, *next;
    int err;

    answer_and_release (a);
    first = a->issue;
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
    eng_actions_init (a);
    pthread_mutex_lock (&eng_lock);
    engine_complete (eng, first, err, now_ns (), a);
    glue_kick_timer_locked ();
    pthread_mutex_unlock (&eng_lock);
  }
}

void
glue_issue (struct eng_run *r, uint32_t inline_runs)
{
  struct eng_actions a;

  eng_actions_init (&a);
  a.issue = r;
  r->issue_next = NULL;
  a.issue_tail = &r->issue_next;
  glue_perform (&a, inline_runs == 0 ? 1 : inline_runs);
}
