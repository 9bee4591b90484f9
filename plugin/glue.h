/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* glue.h: the plumbing around the engine (src/engine.h): its lock, the
 * threads that carry out its actions, and its one timer.
 *
 * Every engine call is made under eng_lock, and then, after the lock is
 * dropped, glue_perform() carries out what the engine asked for:
 * answering waiting workers, freeing released requests, and issuing
 * runs.  Who issues a run depends on who got it: the nbdkit worker
 * whose request unplugged issues one run itself (the kernel's submitter
 * flushes its own plug; no hand-off for the common case), and hands the
 * rest to the I/O pool (iopool.h), so that a slow backend pays its
 * per-operation latency in parallel; a pool thread goes on with the
 * runs its completion unblocked; the timer thread, which is about to
 * wait anyway, issues the runs of its unplugs to a fast local file
 * itself (backing_fast) rather than wake a pool thread for them.
 *
 * A run for an asynchronous backend (backend.h: file=nbd://...) is
 * handed to it by the thread that got it: it is queued to its
 * remote's loop (remote.h), which has many commands in flight at once,
 * and that loop hands it back through the run's done callback when the
 * server answered.  A remote loop must never block: what a completion
 * unblocks goes to the pool (local files) or back to a remote loop
 * (remote files).
 *
 * The timer: one libev loop, owned by one thread (loop.c), arms one
 * ev_timer at engine_next_deadline().  Other threads only call
 * ev_async_send, under eng_lock, when a call moved the deadline earlier
 * than the armed one: a stream of requests that only pushes the idle
 * deadline later costs no wake-up (libev's "method 3": the timer
 * rereads the stored last activity when it fires).
 */
#ifndef NBDPLUG_GLUE_H
#define NBDPLUG_GLUE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "engine.h"

extern pthread_mutex_t eng_lock;

struct backing;

/* The engine whose actions glue carries out and the backing files of
 * its runs and syncs ([nr_backings]), borrowed from the entry
 * (.get_ready) until glue_fini_locked (.unload, eng_lock held).
 * Returns 0, or -1 after nbdkit_error (no memory).
 */
extern int glue_init (struct engine *e, struct backing *backings,
                      size_t nr_backings);
extern void glue_fini_locked (void);

/* A worker waiting for its request's answer: lives on its stack until
 * it is answered.
 *
 * Waiters sleep on a futex word shared by a group (their connection),
 * each with its own bit (its thread's slot): whoever answers several
 * waiters of one group at once (hold mode: every member of a run) wakes
 * them with one FUTEX_WAKE_BITSET, not one system call (and one
 * preemption by the woken thread) per waiter.  A waiter whose bit is
 * shared by another thread of the group may wake for nothing and sleeps
 * again: `state` decides, never the wake-up.  Answering a waiter that
 * never slept (a worker that wrote its own run) makes no system call.
 */
enum waiter_state {
  WAITER_AWAKE,                 /* Not answered, not asleep. */
  WAITER_ASLEEP,                /* Not answered, in (or going to) FUTEX_WAIT:
                                 * the answer must wake it. */
  WAITER_DONE,                  /* Answered: err is valid. */
};

struct waiter {
  uint32_t state;               /* Atomic: enum waiter_state. */
  int err;
  uint32_t bit;                 /* Its thread's bit of the futex mask. */
  uint32_t *word;               /* Its group's futex word. */
  struct waiter *next;          /* In a struct glue_actions' wake list. */
};

/* Set up w for a request of the connection with this id (0: none). */
extern void glue_waiter_init (struct waiter *w, uint64_t group);

/* The engine's actions, with its answers already taken out of the ops
 * (engine.h: an answered op may be freed by another thread as soon as
 * the lock is dropped).
 */
struct glue_actions {
  struct eng_actions eng;
  struct waiter *wake;          /* Borrowed from their waiting workers. */
};

/* How many runs the caller of glue_perform issues itself. */
#define GLUE_INLINE_NONE 0      /* A remote's loop (never blocks). */
#define GLUE_INLINE_ONE 1       /* An nbdkit worker. */
#define GLUE_INLINE_ALL UINT32_MAX      /* A pool thread. */
#define GLUE_INLINE_FAST (UINT32_MAX - 1)       /* The timer thread: as
                                 * ONE, for a file whose runs are fast
                                 * (backing_fast), else NONE; syncs go
                                 * to the pool. */

/* Before an engine call: empty action lists. */
extern void glue_begin (struct glue_actions *a);

/* After an engine call, with eng_lock held: take the answers out of the
 * ops, and wake the timer thread if the engine's next deadline moved
 * earlier than the armed one.
 */
extern void glue_end_locked (struct glue_actions *a);

/* Wake the timer thread if needed (part of glue_end_locked). */
extern void glue_kick_timer_locked (void);

/* Carry out a's actions (eng_lock not held).  Issues up to `inline_runs`
 * runs in the calling thread, each with the other runs of its list to
 * the same local regular file (backing_one_writer: the kernel would
 * make them take turns), and the rest in the pool (or all of them here
 * when the pool is not running: at and after server exit).
 */
extern void glue_perform (struct glue_actions *a, uint32_t inline_runs);

/* Acknowledged data that may be gone although its runs were answered
 * (struct backend_lost): record n such ranges as failures with err
 * (see engine_record_lost), under one eng_lock acquisition.  An
 * asynchronous backend's backend_lost_fn (a remote's loop thread, when
 * a connection that answered them died before a FLUSH covered them).
 */
extern backend_lost_fn glue_record_lost;

/* Wait for w (EINTR-safe); returns w->err. */
extern int glue_wait (struct waiter *w);

/* The timer thread (loop.c).  Start after the fork, with the engine it
 * ticks (borrowed until timer_stop) and how often to rewrite the live
 * report (0: never); stop and join at exit.  Returns 0 or -1 after
 * nbdkit_error.
 */
extern int timer_start (struct engine *e, uint64_t live_stats_interval_ns);
extern void timer_stop (void);

/* A connection opened (+1) or closed (-1): the timer thread rewrites
 * statsfile= every stats-interval= while any is open.  eng_lock held.
 */
extern void timer_stats_conns_locked (int delta);

#endif /* NBDPLUG_GLUE_H */
