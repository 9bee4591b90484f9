/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* evloop.h: a libev loop run by a thread of its own, woken by other
 * threads through one ev_async (the timer thread, loop.c; each remote's
 * loop, remote-loop.c).
 *
 * The owner makes the loop (evloop_new), sets up its other watchers,
 * starts the thread (evloop_start); other threads call evloop_kick,
 * under a lock of the owner's that the kick callback also takes before
 * it breaks the loop, so that the loop cannot go away between their
 * decision and the send (ev(3), THREAD LOCKING EXAMPLE).  evloop_join
 * waits for the thread and destroys the loop.
 */
#ifndef NBDPLUG_EVLOOP_H
#define NBDPLUG_EVLOOP_H

#include <pthread.h>

#include <ev.h>

typedef void evloop_kick_fn (struct ev_loop *loop, ev_async *w, int revents);

struct evloop {
  struct ev_loop *loop;         /* Owned; read-only while the thread
                                 * runs. */
  pthread_t thread;
  const char *thread_name;      /* Borrowed (a constant). */
  ev_async kick;                /* The loop's; kick.data is the owner's. */
};

/* Make l's loop with its kick watcher (cb, data) started.  Returns 0,
 * or -1 (no memory for the loop).
 */
extern int evloop_new (struct evloop *l, const char *thread_name,
                       evloop_kick_fn *cb, void *data);

/* Start the thread that runs the loop, with every signal blocked
 * (signals belong to nbdkit's threads).  Returns 0, or -1 with errno
 * (then the loop is destroyed).
 */
extern int evloop_start (struct evloop *l);

/* Wake the loop's thread: its kick callback runs.  Any thread. */
static inline void
evloop_kick (struct evloop *l)
{
  ev_async_send (l->loop, &l->kick);
}

/* Wait for the thread (its loop was told to break) and destroy the
 * loop.
 */
extern void evloop_join (struct evloop *l);

#endif /* NBDPLUG_EVLOOP_H */
