/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* remote-loop.c: a remote's loop thread: issuing commands to
 * connections, parking them, and the libev callbacks that drive it.
 * See remote.h and remote-int.h.
 */

#include <config.h>

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ev.h>
#include <libnbd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backend.h"
#include "cleanup.h"
#include "clock.h"
#include "engine.h"            /* eng_add_ns */
#include "minmax.h"
#include "remote.h"
#include "remote-int.h"
#include "threads.h"

/* ---- the loop thread: issuing ---- */

/* Commands in flight on one connection before the next is used:
 * nbdkit's default worker count, what one connection of such a server
 * serves at once.  Filling connections in turn instead of spreading
 * every command keeps light traffic on one: each connection costs the
 * server its own wake-ups (bench/remote.sh's remote-connections=
 * tuning runs measure it).
 */
#define CONN_FILL 16

/* May a command be sent on c? */
static bool
conn_usable (const struct rconn *c)
{
  return c->state == RCONN_READY && !c->broken;
}

/* The first usable connection with room below CONN_FILL, else the one
 * with the fewest commands in flight.
 */
static struct rconn *
pick_conn (struct remote *r)
{
  struct rconn *best = NULL;
  unsigned i;

  for (i = 0; i < r->info.nr_conns; ++i) {
    struct rconn *c = &r->conns[i];

    if (!conn_usable (c))
      continue;
    if (c->nr_inflight < CONN_FILL)
      return c;
    if (best == NULL || c->nr_inflight < best->nr_inflight)
      best = c;
  }
  return best;
}

/* A FLUSH goes to the connection that has been up the longest: it
 * covers what every connection up since then answered
 * (unflushed_cover).
 */
static struct rconn *
pick_flush_conn (struct remote *r)
{
  struct rconn *best = NULL;
  unsigned i;

  for (i = 0; i < r->info.nr_conns; ++i) {
    struct rconn *c = &r->conns[i];

    if (!conn_usable (c))
      continue;
    if (best == NULL || c->up_since < best->up_since)
      best = c;
  }
  return best;
}

static struct rconn *
conn_for (struct remote *r, const struct rcmd *cmd)
{
  return cmd->kind == RC_FLUSH ? pick_flush_conn (r) : pick_conn (r);
}

static void
park (struct remote *r, struct rcmd *cmd)
{
  if (cmd->deadline_ns == 0)
    cmd->deadline_ns = eng_add_ns (clock_now_ns (), r->cfg.retry.timeout_ns);
  list_add_tail (&r->parked, &cmd->link);
}

/* A worker's command got "not now" (the server's ENOMEM, libnbd's own
 * ENOMEM): park it and send it again after the engine's backoff, until
 * requeue-timeout.  Returns false when the time is up.
 */
static bool
retry_later (struct remote *r, struct rcmd *cmd)
{
  uint64_t now = clock_now_ns ();

  if (cmd->deadline_ns == 0)
    cmd->deadline_ns = eng_add_ns (now, r->cfg.retry.timeout_ns);
  if (now >= cmd->deadline_ns)
    return false;
  cmd->retry_at_ns = MIN (eng_add_ns (now, retry_delay (&r->cfg.retry,
                                                        cmd->attempts)),
                          cmd->deadline_ns);
  if (cmd->attempts < 64)
    cmd->attempts++;
  park (r, cmd);
  return true;
}

static void
issue (struct remote *r, struct rconn *c, struct rcmd *cmd)
{
  nbd_completion_callback cb = { .callback = done_cb, .user_data = cmd };
  uint64_t off = cmd->offset, left = cmd->count;
  uint64_t lim = chunk_limit (r, cmd);

  cmd->conn = c;
  cmd->err = 0;
  cmd->nr_errors = 0;
  cmd->died = false;
  cmd->retry_at_ns = 0;
  cmd->flush_mark = __atomic_load_n (&r->mutations, __ATOMIC_SEQ_CST);
  if (cmd->kind == RC_FLUSH)
    cmd->flush_epoch = r->flush_epoch++;
  cmd->nr_ext = 0;
  cmd->ext_covered = 0;
  list_add_head (&c->inflight, &cmd->link);
  c->nr_inflight++;

  if (cmd->kind == RC_FLUSH)
    left = 1;                   /* One command, no range. */
  if (cmd->kind == RC_EXTENTS)
    left = MIN (left, lim);
  /* One extra count while issuing: a command answered at once must not
   * finish cmd before its other pieces are issued.
   */
  cmd->pending = 1;
  while (left > 0) {
    uint64_t len = seg_len (cmd, off, MIN (left, lim));

    cmd->pending++;
    if (issue_one (r, c->nbd, cmd, off, len, &cb) == -1) {
      int err = nbd_get_errno ();

      cmd->pending--;
      if (!connected (c->nbd)) {
        cmd->died = true;
        c->broken = true;
      }
      else if (cmd->err == 0) {
        /* libnbd's own ENOMEM (or EAGAIN) is "not now" for a run. */
        cmd->err = err ? err : EIO;
        nbdkit_debug ("file=%s: %s", r->uri, nbd_get_error ());
      }
      break;
    }
    off += len;
    left -= len;
  }
  if (--cmd->pending == 0)
    cmd_finished (r, cmd);
}

static void
dispatch (struct remote *r, struct rcmd *cmd)
{
  struct rconn *c;

  if (cmd->kind == RC_FLUSH && flush_is_clean (r)) {
    cmd->err = 0;
    cmd->died = false;
    done_push (r, cmd);
    return;
  }
  c = conn_for (r, cmd);
  if (c) {
    issue (r, c, cmd);
    return;
  }
  /* No connection.  A run goes back to the engine, which requeues it
   * and retries it after its delay (bounded by requeue-timeout); a
   * waiting worker waits here for a connection, as long.
   */
  if (cmd->kind == RC_RUN) {
    cmd->died = true;
    done_push (r, cmd);
  }
  else if (r->stopping) {
    cmd->err = EIO;
    done_push (r, cmd);
  }
  else
    park (r, cmd);
}

/* Hand every finished command back: runs to the engine (one batch),
 * answers to waiting workers; a worker's command that died with its
 * connection is sent again.
 */
static void
finish_done (struct remote *r)
{
  struct rcmd *cmd;

  while ((cmd = list_pop (&r->done, struct rcmd, link)) != NULL) {

    if (cmd->kind == RC_RUN) {
      int err = cmd->err;

      /* First error wins; a piece that died with its connection is
       * "not now": the engine writes the run again (idempotent).
       */
      if (err == 0 && cmd->died)
        err = EAGAIN;
      /* The engine counts the run as one backend write: the server got
       * one per segment.
       */
      if (err == 0 && cmd->nr_segs > 1)
        STATS_ADD (cmd->br->stats->backend[STATS_B_WRITE].ops,
                   cmd->nr_segs - 1);
      /* The engine counts one "not now" for the run: the server gave
       * one per command it refused.
       */
      if (retry_is_transient (err) && cmd->nr_errors > 1)
        STATS_ADD (cmd->br->stats->eagain, cmd->nr_errors - 1);
      note_mutation (r, cmd, err);
      batch_add (r, cmd->br, err);
      cmd_free (cmd);
    }
    else if (cmd->kind == RC_FLUSH && cmd->err == 0 &&
             flush_saw_loss (r, cmd)) {
      /* Sent again, or answered by another connection: either way it
       * covers nothing the dead one answered before it.
       */
      nbdkit_error ("file=%s: flush: a connection died with writes "
                    "answered before this FLUSH and not covered by one "
                    "(see above): they may be gone", r->uri);
      sync_done (cmd, EIO);
    }
    else if (cmd->died && cmd->err == 0)
      dispatch (r, cmd);
    else if (retry_is_transient (cmd->err) && !r->stopping &&
             retry_later (r, cmd))
      ;
    else {
      if (cmd->err)
        nbdkit_error ("file=%s: %s: %s", r->uri, kind_name (cmd->kind),
                      strerror (cmd->err));
      else if (cmd->kind == RC_FLUSH)
        note_flushed (r, cmd->flush_mark);
      sync_done (cmd, cmd->err);
    }
  }
}

/* Send the parked commands now that a connection is up. */
static void
unpark (struct remote *r)
{
  list_head list = LIST_HEAD_INIT (list);
  struct rcmd *cmd;

  list_splice_tail (&list, &r->parked);
  while ((cmd = list_pop (&list, struct rcmd, link)) != NULL)
    dispatch (r, cmd);
}

static void
rearm (struct remote *r)
{
  uint64_t d = UINT64_MAX, now;
  struct rcmd *cmd;
  unsigned i;

  for (i = 0; i < r->info.nr_conns; ++i) {
    const struct rconn *c = &r->conns[i];

    if (c->state == RCONN_DOWN && !r->stopping)
      d = MIN (d, attempt_at (r, c));
    else if (c->state == RCONN_CONNECTING)
      d = MIN (d, c->connect_deadline_ns);
  }
  list_for_each (cmd, &r->parked, link) {
    d = MIN (d, cmd->deadline_ns);
    if (cmd->retry_at_ns)
      d = MIN (d, cmd->retry_at_ns);
  }
  if (r->stopping)
    d = MIN (d, r->stop_deadline_ns);
  ev_timer_stop (r->ev.loop, &r->timer);
  if (d == UINT64_MAX)
    return;
  ev_now_update (r->ev.loop);
  now = clock_now_ns ();
  ev_timer_set (&r->timer, d > now ? (d - now) / 1e9 : 0., 0.);
  ev_timer_start (r->ev.loop, &r->timer);
}

static bool
loop_idle (const struct remote *r)
{
  unsigned i;

  if (!list_empty (&r->parked) || !list_empty (&r->done) || r->nr_batch)
    return false;
  for (i = 0; i < r->info.nr_conns; ++i)
    if (r->conns[i].nr_inflight > 0)
      return false;
  return true;
}

/* After every event: notice connections that died or came up, hand
 * back what finished (which may issue more), then watch each handle in
 * the direction libnbd wants now.
 */
static void
settle (struct remote *r)
{
  bool again;
  unsigned i;

  do {
    again = false;
    for (i = 0; i < r->info.nr_conns; ++i) {
      struct rconn *c = &r->conns[i];

      if (c->state == RCONN_DOWN)
        continue;
      if (c->broken || nbd_aio_is_dead (c->nbd) ||
          nbd_aio_is_closed (c->nbd)) {
        rconn_lost (r, c, c->broken ? "a command could not be sent"
                   : "the server closed the connection");
        again = true;
      }
      else if (c->state == RCONN_CONNECTING && nbd_aio_is_ready (c->nbd)) {
        if (rconn_ready (r, c))
          unpark (r);
        again = true;
      }
    }
    if (!list_empty (&r->done)) {
      finish_done (r);
      again = true;
    }
  } while (again);
  batch_flush (r);

  for (i = 0; i < r->info.nr_conns; ++i)
    watch (r, &r->conns[i]);

  if (r->stopping && loop_idle (r)) {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&r->lock);

    /* Nothing is queued after this: remote_issue sees R_STOPPED. */
    if (list_empty (&r->queue)) {
      r->state = R_STOPPED;
      for (i = 0; i < r->info.nr_conns; ++i)
        if (r->conns[i].events) {
          ev_io_stop (r->ev.loop, &r->conns[i].io);
          r->conns[i].events = 0;
        }
      ev_timer_stop (r->ev.loop, &r->timer);
      ev_async_stop (r->ev.loop, &r->ev.kick);
      ev_break (r->ev.loop, EVBREAK_ALL);
      return;
    }
  }
  rearm (r);
}

static void
io_cb (struct ev_loop *loop, ev_io *w, int revents)
{
  struct rconn *c = w->data;
  unsigned dir;
  int rv = 0;

  if (c->nbd == NULL)
    return;
  dir = nbd_aio_get_direction (c->nbd);
  if ((revents & EV_READ) && (dir & LIBNBD_AIO_DIRECTION_READ))
    rv = nbd_aio_notify_read (c->nbd);
  else if ((revents & EV_WRITE) && (dir & LIBNBD_AIO_DIRECTION_WRITE))
    rv = nbd_aio_notify_write (c->nbd);
  if (rv == -1 && !nbd_aio_is_dead (c->nbd) && !nbd_aio_is_closed (c->nbd))
    nbdkit_debug ("file=%s: %s", c->r->uri, nbd_get_error ());
  settle (c->r);
}

static void
timer_cb (struct ev_loop *loop, ev_timer *w, int revents)
{
  struct remote *r = w->data;
  uint64_t now = clock_now_ns ();
  struct rcmd *cmd, *next;
  unsigned i;

  for (i = 0; i < r->info.nr_conns; ++i) {
    struct rconn *c = &r->conns[i];

    if (c->state == RCONN_DOWN && !r->stopping && now >= attempt_at (r, c))
      start_connect (r, c);
    else if (c->state == RCONN_CONNECTING && now >= c->connect_deadline_ns)
      rconn_lost (r, c, "timed out");
    else if (r->stopping && now >= r->stop_deadline_ns &&
             c->state != RCONN_DOWN) {
      nbdkit_error ("file=%s: %u commands still unanswered at exit",
                    r->uri, c->nr_inflight);
      rconn_lost (r, c, "exiting");
    }
  }
  /* Workers waiting for a connection, or to try again after "not
   * now", give up after requeue-timeout.
   */
  list_for_each_safe (cmd, next, &r->parked, link) {
    if (now >= cmd->deadline_ns) {
      list_del (&cmd->link);
      if (cmd->retry_at_ns)
        nbdkit_error ("file=%s: %s: %s for requeue-timeout: giving up",
                      r->uri, kind_name (cmd->kind), strerror (cmd->err));
      else
        nbdkit_error ("file=%s: no connection to the server for "
                      "requeue-timeout: giving up", r->uri);
      cmd->err = EIO;
      done_push (r, cmd);
    }
    else if (cmd->retry_at_ns && now >= cmd->retry_at_ns &&
             conn_for (r, cmd) != NULL) {
      list_del (&cmd->link);
      cmd->retry_at_ns = 0;
      issue (r, conn_for (r, cmd), cmd);
    }
  }
  settle (r);
}

static void
kick_cb (struct ev_loop *loop, ev_async *w, int revents)
{
  struct remote *r = w->data;
  list_head list = LIST_HEAD_INIT (list);
  struct rcmd *cmd;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&r->lock);
    list_splice_tail (&list, &r->queue);
    if (r->state == R_STOPPING && !r->stopping) {
      r->stopping = true;
      r->stop_deadline_ns = eng_add_ns (clock_now_ns (), r->cfg.retry.timeout_ns);
    }
  }
  while ((cmd = list_pop (&list, struct rcmd, link)) != NULL)
    dispatch (r, cmd);
  if (r->stopping) {
    /* Nobody reconnects for a server that is exiting. */
    while ((cmd = list_pop (&r->parked, struct rcmd, link)) != NULL) {
      cmd->err = EIO;
      done_push (r, cmd);
    }
  }
  settle (r);
}

int
remote_start (struct remote *r)
{
  unsigned i;

  if (evloop_new (&r->ev, THREAD_NAME_REMOTE, kick_cb, r) == -1) {
    nbdkit_error ("file=%s: ev_loop_new failed", r->uri);
    return -1;
  }
  ev_init (&r->timer, timer_cb);
  r->timer.data = r;
  for (i = 0; i < r->info.nr_conns; ++i) {
    struct rconn *c = &r->conns[i];

    ev_init (&c->io, io_cb);
    c->io.data = c;
    watch (r, c);
  }
  rearm (r);

  if (evloop_start (&r->ev) == -1) {
    nbdkit_error ("file=%s: pthread_create: %m", r->uri);
    return -1;
  }
  pthread_mutex_lock (&r->lock);
  r->state = R_RUNNING;
  pthread_mutex_unlock (&r->lock);
  return 0;
}

void
remote_stop (struct remote *r)
{
  pthread_mutex_lock (&r->lock);
  if (r->state != R_RUNNING) {
    pthread_mutex_unlock (&r->lock);
    return;
  }
  r->state = R_STOPPING;
  evloop_kick (&r->ev);
  pthread_mutex_unlock (&r->lock);
  evloop_join (&r->ev);
  assert (r->state == R_STOPPED);
}
