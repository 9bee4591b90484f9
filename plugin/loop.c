/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* loop.c: the timer thread: one libev loop that fires the engine's
 * deadlines (idle=, max-delay=, delayed queues, memory waits, close and
 * exit deadlines).  See glue.h.
 *
 * The loop and its watchers belong to this thread.  Other threads touch
 * only `armed` and `state` (under eng_lock) and kick it (evloop.h),
 * also under eng_lock, so that the loop cannot go away between their
 * decision and the send (ev(3), THREAD LOCKING EXAMPLE).
 * The loop is destroyed only after this thread is joined, and nothing
 * kicks it after timer_stop.
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <ev.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "evloop.h"
#include "glue.h"
#include "plugin.h"
#include "threads.h"

static struct evloop tl;                /* Its loop: read-only while the
                                         * thread runs. */

/* Protected by eng_lock. */
static uint64_t armed = UINT64_MAX;    /* Deadline the timer is set for. */
static enum { TIMER_STOPPED, TIMER_RUNNING, TIMER_STOPPING } state;
static size_t stats_conns;              /* Connections open: the stats
                                         * timer runs while there are. */

/* Set by timer_start before the thread runs; read-only after. */
static struct engine *eng;              /* Borrowed from the entry;
                                         * used under eng_lock. */
static uint64_t stats_interval_ns;      /* 0: no live reports. */

/* Loop thread only. */
static ev_timer timer;
static ev_timer stats_timer;            /* Every stats-interval=. */

/* Wake the loop if the engine's next deadline is before the timer's.
 * eng_lock held.
 */
static void
kick_if_earlier_locked (void)
{
  uint64_t d = engine_next_deadline (eng);

  if (d < armed) {
    armed = d;
    evloop_kick (&tl);
  }
}

void
glue_kick_timer_locked (void)
{
  /* Only an engine call that made a deadline appear or come nearer can
   * need the timer earlier; one that moved it later leaves it to fire
   * early and be set again (engine_deadline_may_be_earlier).  Most
   * calls, a direct write's two among them, skip the computation.
   */
  if (state != TIMER_RUNNING || !engine_deadline_may_be_earlier (eng))
    return;
  kick_if_earlier_locked ();
}

/* Set the timer for the engine's next deadline.  eng_lock held. */
static void
rearm_locked (void)
{
  uint64_t d = engine_next_deadline (eng), now;

  armed = d;
  ev_timer_stop (tl.loop, &timer);
  if (d == UINT64_MAX)
    return;
  ev_now_update (tl.loop);
  now = now_ns ();
  ev_timer_set (&timer, d > now ? (d - now) / 1e9 : 0., 0.);
  ev_timer_start (tl.loop, &timer);
}

/* Run the stats timer while connections are open (a server nobody
 * uses is not woken to rewrite the same figures).  eng_lock held.
 */
static void
stats_rearm_locked (void)
{
  bool want = stats_conns > 0 && stats_interval_ns > 0;

  if (want && !ev_is_active (&stats_timer)) {
    double t = stats_interval_ns / 1e9;

    ev_timer_set (&stats_timer, t, t);
    ev_timer_start (tl.loop, &stats_timer);
  }
  else if (!want && ev_is_active (&stats_timer))
    ev_timer_stop (tl.loop, &stats_timer);
}

void
timer_stats_conns_locked (int delta)
{
  bool was = stats_conns > 0;

  stats_conns += delta;
  if (state == TIMER_RUNNING && was != (stats_conns > 0))
    evloop_kick (&tl);
}

static void
kick_cb (struct ev_loop *l, ev_async *w, int revents)
{
  pthread_mutex_lock (&eng_lock);
  if (state == TIMER_STOPPING) {
    ev_timer_stop (tl.loop, &stats_timer);
    ev_timer_stop (tl.loop, &timer);
    ev_async_stop (tl.loop, &tl.kick);
    ev_break (tl.loop, EVBREAK_ALL);
  }
  else {
    rearm_locked ();
    stats_rearm_locked ();
  }
  pthread_mutex_unlock (&eng_lock);
}

/* Rewrite stats-file=.  Without eng_lock: the report takes it only for
 * its snapshot (conns_live); the file's writing delays this loop's
 * engine timer by as long as it takes, hence the advice of a local
 * file system in the man page.
 */
static void
stats_cb (struct ev_loop *l, ev_timer *w, int revents)
{
  stats_write_live ();
}

static void
timer_cb (struct ev_loop *l, ev_timer *w, int revents)
{
  struct glue_actions a;

  glue_begin (&a);
  pthread_mutex_lock (&eng_lock);
  engine_tick (eng, now_ns (), &a.eng);
  glue_end_locked (&a);
  rearm_locked ();
  pthread_mutex_unlock (&eng_lock);
  /* This thread waits next: it writes what its unplugs made for a
   * fast local file itself (the kernel's task flushes its own plug
   * when it sleeps), where a pool thread would be woken for it.
   */
  glue_perform (&a, GLUE_INLINE_FAST);
}

int
timer_start (struct engine *e, uint64_t live_stats_interval_ns)
{
  eng = e;
  stats_interval_ns = live_stats_interval_ns;
  if (evloop_new (&tl, THREAD_NAME_TIMER, kick_cb, NULL) == -1) {
    nbdkit_error ("ev_loop_new failed");
    return -1;
  }
  ev_init (&timer, timer_cb);
  ev_init (&stats_timer, stats_cb);
  if (evloop_start (&tl) == -1) {
    nbdkit_error ("pthread_create: %m");
    return -1;
  }
  pthread_mutex_lock (&eng_lock);
  state = TIMER_RUNNING;
  armed = UINT64_MAX;
  kick_if_earlier_locked ();
  if (stats_conns > 0)
    evloop_kick (&tl);
  pthread_mutex_unlock (&eng_lock);
  return 0;
}

void
timer_stop (void)
{
  pthread_mutex_lock (&eng_lock);
  if (state != TIMER_RUNNING) {
    pthread_mutex_unlock (&eng_lock);
    return;
  }
  state = TIMER_STOPPING;
  evloop_kick (&tl);
  pthread_mutex_unlock (&eng_lock);
  evloop_join (&tl);
  pthread_mutex_lock (&eng_lock);
  state = TIMER_STOPPED;
  pthread_mutex_unlock (&eng_lock);
}
