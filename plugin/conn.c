/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* conn.c: connection lifecycle and the worker-thread side.
 *
 * Worker threads (nbdkit's) only: build a request, take c->lock,
 * append it to the submission queue and the dirty list, drop the lock,
 * ev_async_send, and wait on their own semaphore if they must.  All
 * plugging decisions happen in the loop thread (loop.c).
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ev.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backing.h"
#include "cleanup.h"
#include "conn.h"
#include "layout.h"
#include "minmax.h"
#include "plugin.h"

/* Acknowledged-but-not-completed requests allowed per connection in
 * writeback mode, beyond which a submitter waits: zeros and trims carry
 * no data, so max-bytes alone would not bound them.
 */
#define ASYNC_PER_MAX_REQUEST 4

static uint64_t next_conn_id;

/* Tells a worker thread's exit to its connection: see worker_exit. */
static pthread_key_t worker_key;

static pthread_mutex_t conns_lock = PTHREAD_MUTEX_INITIALIZER;
static struct conn *conns;              /* Protected by conns_lock. */
static size_t nr_conns;                 /* Protected by conns_lock. */

static int submit (struct conn *c, struct request *r, bool wait);
static int sync_backings (struct conn *c, const bool *which);
static struct request *request_new (enum req_kind kind, enum plug_op op,
                                    uint64_t offset, uint64_t count);

static void
conns_register (struct conn *c)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&conns_lock);
  c->reg_next = conns;
  conns = c;
  nr_conns++;
}

/* Leave the registry.  Blocks while conns_drain_all is draining. */
static void
conns_unregister (struct conn *c)
{
  struct conn **pp;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&conns_lock);

  for (pp = &conns; *pp; pp = &(*pp)->reg_next)
    if (*pp == c) {
      *pp = c->reg_next;
      break;
    }
}

static void
conns_closed (void)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&conns_lock);
  nr_conns--;
}

size_t
conns_open (void)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&conns_lock);
  return nr_conns;
}

/* Unplug connection c and wait until its queues settled.  Caller holds
 * conns_lock, which keeps c from being freed.
 */
static int
drain_locked (struct conn *c)
{
  struct request *r = request_new (REQ_DRAIN, PLUG_OP_WRITE, 0, 0);

  if (r == NULL)
    return -1;
  return submit (c, r, true);
}

/* NBD_FLAG_CAN_MULTI_CONN: "the effects of NBD_CMD_FLUSH and
 * NBD_CMD_FLAG_FUA MUST be visible across all connections when the
 * server sends its reply".  We advertise it only in hold mode, where
 * every replied write already reached the files; still, the flush or
 * FUA of one connection drains every other connection's plug first, so
 * that no plug anywhere holds older data when it replies.
 */
static int
drain_others (struct conn *self)
{
  struct conn *c;
  int ret = 0;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&conns_lock);

  for (c = conns; c != NULL; c = c->reg_next)
    if (c != self && drain_locked (c) == -1 && errno != ESHUTDOWN)
      ret = -1;
  return ret;
}

void
conns_drain_all (struct plug_stats *live)
{
  struct conn *c;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&conns_lock);

  /* Server exit: last attempt for whatever is delayed, no more waiting
   * for retry-timeout (issue: "nothing hangs").
   */
  for (c = conns; c != NULL; c = c->reg_next) {
    pthread_mutex_lock (&c->lock);
    c->stopping = true;
    pthread_mutex_unlock (&c->lock);
    if (drain_locked (c) == -1 || sync_backings (c, NULL) == -1)
      nbdkit_error ("server exit: connection %" PRIu64
                    ": could not write out held data: %m", c->id);
  }
  for (c = conns; c != NULL; c = c->reg_next)
    stats_merge (live, &c->stats);
}

struct conn *
conn_open (void)
{
  struct conn *c;
  sigset_t all, old;
  int err;

  c = calloc (1, sizeof *c);
  if (c == NULL) {
    nbdkit_error ("calloc: %m");
    return NULL;
  }
  c->id = __atomic_add_fetch (&next_conn_id, 1, __ATOMIC_RELAXED);
  c->stats.connections = 1;
  pthread_mutex_init (&c->lock, NULL);
  c->queue_tail = &c->queue_head;
  c->pending_unplug = -1;
  for (size_t i = 0; i < sizeof c->recent_end / sizeof c->recent_end[0]; ++i)
    c->recent_start[i] = c->recent_end[i] = UINT64_MAX;
  if (iopool_start (cfg.io_threads) == -1)
    goto err_lock;
  if (plug_init (&c->plug, &cfg.lim, nr_backings) == -1) {
    nbdkit_error ("plug_init: %m");
    goto err_lock;
  }
  c->bq = calloc (nr_backings, sizeof *c->bq);
  if (c->bq == NULL) {
    nbdkit_error ("calloc: %m");
    goto err_plug;
  }

  /* Never the default loop: it installs a SIGCHLD handler and reaps
   * every child, which would break nbdkit --run (ev.pod).  NOSIGMASK:
   * libev must not change the signal mask of a threaded program; the
   * loop thread blocks all signals itself below.
   */
  c->loop = ev_loop_new (EVFLAG_AUTO | EVFLAG_NOSIGMASK);
  if (c->loop == NULL) {
    nbdkit_error ("ev_loop_new failed");
    goto err_bq;
  }
  ev_set_userdata (c->loop, c);
  ev_async_init (&c->wakeup, wakeup_cb);
  ev_async_start (c->loop, &c->wakeup);
  ev_init (&c->plug_timer, plug_timer_cb);
  ev_init (&c->retry_timer, retry_timer_cb);

  /* Signals go to nbdkit's threads, never to the loop thread. */
  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  err = pthread_create (&c->thread, NULL, loop_thread, c);
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (err != 0) {
    errno = err;
    nbdkit_error ("pthread_create: %m");
    goto err_loop;
  }
  conns_register (c);
  return c;

 err_loop:
  ev_loop_destroy (c->loop);
 err_bq:
  free (c->bq);
 err_plug:
  plug_free (&c->plug);
 err_lock:
  pthread_mutex_destroy (&c->lock);
  free (c);
  return NULL;
}

void
conn_close (struct conn *c)
{
  size_t b;
  char *line;

  conns_unregister (c);
  /* nbdkit joined this connection's worker threads before .close, so
   * their worker_exit has run; but with --threads=1 the connection
   * thread itself served the requests, and it outlives c.
   */
  if (pthread_getspecific (worker_key) == c)
    pthread_setspecific (worker_key, NULL);
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);
    c->closing = true;
  }
  ev_async_send (c->loop, &c->wakeup);
  pthread_join (c->thread, NULL);

  if (plug_debug_stats && (line = stats_line (&c->stats)) != NULL) {
    nbdkit_debug ("connection %" PRIu64 ": %s", c->id, line);
    free (line);
  }
  stats_publish (&c->stats);

  /* The loop thread has stopped its watchers and drained everything. */
  ev_loop_destroy (c->loop);
  for (b = 0; b < nr_backings; ++b)
    job_vector_reset (&c->bq[b].jobs);
  free (c->bq);
  plug_free (&c->plug);
  pthread_mutex_destroy (&c->lock);
  free (c);
  conns_closed ();
}

void
request_free (struct request *r)
{
  free (r->copy);
  free (r);
}

/* A request for the export range [offset, offset+count), with one
 * plug_req per backing-file piece.  Returns NULL after nbdkit_error.
 */
static struct request *
request_new (enum req_kind kind, enum plug_op op, uint64_t offset,
             uint64_t count)
{
  struct layout_iter it;
  struct layout_piece piece;
  struct request *r;
  size_t n = 0, i = 0;

  /* nbdkit checks bounds too, but the layout never trusts its caller. */
  if (layout_iter_init (&it, &layout, offset, count) == -1) {
    nbdkit_error ("request beyond the end of the export: offset %" PRIu64
                  " count %" PRIu64 " size %" PRIu64,
                  offset, count, layout.size);
    errno = EINVAL;
    return NULL;
  }
  if (kind == REQ_MUTATE)
    while (layout_iter_next (&it, &piece))
      n++;

  r = calloc (1, sizeof *r + n * sizeof r->pieces[0]);
  if (r == NULL) {
    nbdkit_error ("calloc: %m");
    return NULL;
  }
  r->kind = kind;
  r->op = op;
  r->offset = offset;
  r->count = count;
  r->arrival_ns = now_ns ();
  r->nr_pieces = n;

  layout_iter_init (&it, &layout, offset, count);
  while (i < n && layout_iter_next (&it, &piece)) {
    struct plug_req *p = &r->pieces[i++];

    p->op = op;
    p->backing = piece.backing;
    p->offset = piece.offset;
    p->count = piece.count;
    p->arrival_ns = r->arrival_ns;
    p->opaque = r;
    /* buf_offset is stashed in buf until the data pointer is known. */
    p->buf = (const void *) (uintptr_t) piece.buf_offset;
  }
  return r;
}

/* Point each piece at its slice of the request's data. */
static void
request_set_data (struct request *r, const char *data)
{
  size_t i;

  for (i = 0; i < r->nr_pieces; ++i)
    r->pieces[i].buf = data + (uintptr_t) r->pieces[i].buf;
}

static bool
overlaps (uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
  return a < b + blen && b < a + alen;
}

static void
dirty_insert_locked (struct conn *c, struct request *r)
{
  r->dprev = NULL;
  r->dnext = c->dirty;
  if (c->dirty)
    c->dirty->dprev = r;
  c->dirty = r;
}

static bool
dirty_overlaps_locked (struct conn *c, uint64_t offset, uint64_t count)
{
  const struct request *d;

  for (d = c->dirty; d != NULL; d = d->dnext)
    if (overlaps (d->offset, d->count, offset, count))
      return true;
  return false;
}

void
conn_retire (struct conn *c, struct request *r)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);

  if (r->kind == REQ_MUTATE) {
    if (r->dprev)
      r->dprev->dnext = r->dnext;
    else
      c->dirty = r->dnext;
    if (r->dnext)
      r->dnext->dprev = r->dprev;
    r->dprev = r->dnext = NULL;
  }
  c->held_bytes -= r->charged;
  if (r->async)
    c->nr_async--;
}

/* Each nbdkit worker thread serves one connection.  When it exits (the
 * client went away, or the server is stopping) it must stop counting as
 * a worker that could bring the next request, or a request parked in
 * hold mode would wait for idle= although nobody is left: the key's
 * destructor takes it off the list and wakes the loop.
 */
static void
worker_exit (void *vc)
{
  struct conn *c = vc;
  pthread_t self = pthread_self ();
  size_t i;

  pthread_mutex_lock (&c->lock);
  for (i = 0; i < c->nr_workers; ++i)
    if (pthread_equal (c->workers[i], self)) {
      c->workers[i] = c->workers[--c->nr_workers];
      break;
    }
  pthread_mutex_unlock (&c->lock);
  ev_async_send (c->loop, &c->wakeup);
}

int
conn_init_worker_key (void)
{
  int err = pthread_key_create (&worker_key, worker_exit);

  if (err != 0) {
    errno = err;
    nbdkit_error ("pthread_key_create: %m");
    return -1;
  }
  return 0;
}

/* Note the calling worker thread (see struct conn). */
static void
note_worker_locked (struct conn *c)
{
  pthread_t self = pthread_self ();
  size_t i;

  for (i = 0; i < c->nr_workers; ++i)
    if (pthread_equal (c->workers[i], self))
      return;
  if (c->nr_workers < sizeof c->workers / sizeof c->workers[0]) {
    c->workers[c->nr_workers++] = self;
    pthread_setspecific (worker_key, c);
  }
}

void
conn_job_done (struct conn *c, struct job *j)
{
  pthread_mutex_lock (&c->lock);
  j->next = c->done;
  c->done = j;
  pthread_mutex_unlock (&c->lock);
  ev_async_send (c->loop, &c->wakeup);
}

void
conn_unpark (struct conn *c, struct request *r)
{
  if (!r->parked)
    return;
  r->parked = false;
  pthread_mutex_lock (&c->lock);
  c->nr_parked--;
  pthread_mutex_unlock (&c->lock);
}

/* Hand r to the loop.  If `wait`, or if writeback memory is at its
 * bound, block until the loop completes it.  r belongs to the loop
 * from here on.  Returns 0, or -1 with errno set (the loop's error).
 */
static int
submit (struct conn *c, struct request *r, bool wait)
{
  struct waiter w;
  bool closing, foreign = false;

  w.err = 0;
  if (sem_init (&w.done, 0, 0) == -1) {
    nbdkit_error ("sem_init: %m");
    request_free (r);
    return -1;
  }
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);
    closing = c->closing;
    if (!closing) {
      /* "At the bound the submitter waits for an unplug, it is never
       * refused": a writeback request that would pass max-bytes (or the
       * async count bound) becomes a waiting one.
       */
      if (!wait && r->kind == REQ_MUTATE &&
          (c->held_bytes + r->charged > cfg.lim.max_bytes ||
           c->nr_async >= ASYNC_PER_MAX_REQUEST * cfg.lim.max_requests))
        wait = true;
      /* A drain comes from another connection's thread (or the main
       * thread at exit): it is not one of this connection's workers.
       */
      foreign = r->kind == REQ_DRAIN;
      if (!foreign)
        note_worker_locked (c);
      if (wait) {
        r->waiter = &w;
        if (!foreign) {
          r->parked = true;
          c->nr_parked++;
        }
      }
      else if (r->kind == REQ_MUTATE) {
        r->async = true;
        c->nr_async++;
      }
      c->held_bytes += r->charged;
      if (r->kind == REQ_MUTATE)
        dirty_insert_locked (c, r);
      r->next = NULL;
      *c->queue_tail = r;
      c->queue_tail = &r->next;
    }
  }
  if (closing) {
    sem_destroy (&w.done);
    request_free (r);
    errno = ESHUTDOWN;
    nbdkit_error ("connection is closing");
    return -1;
  }
  ev_async_send (c->loop, &c->wakeup);
  if (!wait) {
    sem_destroy (&w.done);
    return 0;
  }
  while (sem_wait (&w.done) == -1 && errno == EINTR)
    ;
  sem_destroy (&w.done);
  if (w.err) {
    errno = w.err;
    return -1;
  }
  return 0;
}

/* fdatasync the backing files marked in `which` (all if NULL). */
static int
sync_backings (struct conn *c, const bool *which)
{
  size_t b;

  for (b = 0; b < nr_backings; ++b) {
    if (which && !which[b])
      continue;
    stats_count (&c->stats.backend[STATS_B_SYNC], 0);
    if (backing_sync (&backings[b]) == -1) {
      nbdkit_error ("file=%s: fdatasync: %m", backings[b].name);
      return -1;
    }
  }
  return 0;
}

/* The direct path.  The kernel does not plug what cannot merge either:
 * a request that neither continues a recent write nor overlaps held
 * data is written by the worker itself, with nbdkit's buffer, the way
 * a plain file plugin would, instead of being copied, handed to the
 * loop and to an I/O thread and back.  Sequential streams still enter
 * the plug from their second request on.
 *
 * Ordering is safe: overlapping held (acknowledged) data sends a
 * request through the plug; a direct request is not acknowledged until
 * it is written, so nothing later can depend on it before then.
 */
#define NR_RECENT (sizeof ((struct conn *) 0)->recent_end / sizeof (uint64_t))

/* Decide under c->lock, and remember where r ends either way. */
static bool
want_direct (struct conn *c, const struct request *r)
{
  bool streaming = false;
  uint64_t window;
  size_t i;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);

  /* "Near" rather than adjacent: a stream's requests arrive shuffled
   * across nbdkit's threads, so a request's neighbour has often not
   * arrived yet.  Near is a window of NR_RECENT requests of this size
   * (what a client queue of that depth spans), capped at max-merge: a
   * random request is rarely that close to one of the last few.
   */
  window = MIN ((uint64_t) NR_RECENT * r->count, cfg.lim.max_merge);
  for (i = 0; i < NR_RECENT && !streaming; ++i)
    streaming = c->recent_end[i] != UINT64_MAX &&
      r->offset <= c->recent_end[i] + window &&
      c->recent_start[i] <= r->offset + r->count + window;
  c->recent_start[c->recent_pos % NR_RECENT] = r->offset;
  c->recent_end[c->recent_pos++ % NR_RECENT] = r->offset + r->count;
  return !streaming && !c->closing &&
    !dirty_overlaps_locked (c, r->offset, r->count);
}

/* Write r's pieces from data (NULL for zero and trim).  Returns 0, 1 if
 * the backend said "not now" (the caller uses the plug, which retries),
 * or -1 with errno for a real error.
 */
static int
do_direct (struct conn *c, struct request *r, const char *data)
{
  /* A run of one member, on the stack. */
  union {
    struct plug_run run;
    char space[sizeof (struct plug_run) + sizeof (struct plug_req *)];
  } one;
  struct plug_run *run = &one.run;
  size_t i;

  for (i = 0; i < r->nr_pieces; ++i) {
    struct plug_req *p = &r->pieces[i];
    struct backing *bk = &backings[p->backing];
    int ret, err;

    if (backing_reserve (bk, 1) == 0)
      return 1;                 /* No free slot: the plug waits for one. */
    run->op = p->op;
    run->flags = p->flags;
    run->backing = p->backing;
    run->offset = p->offset;
    run->count = p->count;
    run->n = 1;
    run->reqs[0] = p;
    if (data)
      p->buf = data + (uintptr_t) p->buf;
    ret = backing_issue_run (bk, run);
    err = errno;
    backing_release (bk, 1);
    if (data)                   /* Back to an offset: the plug may retry. */
      p->buf = (const void *) ((const char *) p->buf - data);
    if (ret == -1) {
      if (retry_is_transient (err)) {
        STATS_ADD (c->stats.eagain, 1);
        return 1;               /* Pieces written so far are rewritten:
                                 * same data, nobody saw a reply. */
      }
      if (!(err == ENOTSUP && (p->flags & PLUG_F_FAST)))
        STATS_ADD (c->stats.errors, 1);
      errno = err;
      return -1;
    }
    stats_count (&c->stats.backend[stats_backend_of (p->op)], p->count);
  }
  return 0;
}

/* Submit a mutation.  A FUA one waits, then syncs the files it touched:
 * NBD "MUST NOT send its reply ... until ... persisted".  data: the
 * client's buffer for a write, NULL otherwise.
 */
static int
submit_mutation (struct conn *c, struct request *r, const void *data,
                 const char *what)
{
  CLEANUP_FREE bool *touched = NULL;
  size_t i;
  int ret;

  if (r->fua) {
    /* r belongs to the loop after submit: note the files first. */
    touched = calloc (nr_backings, sizeof *touched);
    if (touched == NULL) {
      nbdkit_error ("calloc: %m");
      request_free (r);
      return -1;
    }
    for (i = 0; i < r->nr_pieces; ++i)
      touched[r->pieces[i].backing] = true;
  }
  ret = 1;
  if (cfg.direct && want_direct (c, r)) {
    ret = do_direct (c, r, data);
    if (ret == 0) {
      STATS_ADD (c->stats.direct, 1);
      request_free (r);
    }
  }
  if (ret == 1) {
    /* Plug it.  In writeback mode the data must be our own copy:
     * nbdkit reuses its buffer once we return.
     */
    if (data && cfg.mode == MODE_WRITEBACK) {
      r->copy = malloc (r->count);
      if (r->copy == NULL) {
        nbdkit_error ("malloc: %m");
        request_free (r);
        return -1;
      }
      memcpy (r->copy, data, r->count);
      r->charged = r->count;
      data = r->copy;
    }
    if (data)
      request_set_data (r, data);
    ret = submit (c, r, cfg.mode == MODE_HOLD || r->fua || r->fast);
  }
  else if (ret == -1)
    request_free (r);
  if (ret == -1) {
    /* A fast zero that cannot be fast is an answer, not a failure. */
    if (errno != ENOTSUP)
      nbdkit_error ("%s: %m", what);
    return -1;
  }
  if (touched) {
    if (cfg.mode == MODE_HOLD && drain_others (c) == -1) {
      nbdkit_error ("%s: draining other connections: %m", what);
      return -1;
    }
    return sync_backings (c, touched);
  }
  return 0;
}

int
conn_pwrite (struct conn *c, const void *buf, uint32_t count,
             uint64_t offset, bool fua)
{
  struct request *r;

  stats_count (&c->stats.client[STATS_C_WRITE], count);
  if (fua)
    stats_count (&c->stats.client[STATS_C_FUA], count);
  r = request_new (REQ_MUTATE, PLUG_OP_WRITE, offset, count);
  if (r == NULL)
    return -1;
  r->fua = fua;
  return submit_mutation (c, r, buf, "pwrite");
}

int
conn_zero (struct conn *c, uint32_t count, uint64_t offset,
           bool may_trim, bool fua, bool fast)
{
  struct request *r;
  size_t i;

  stats_count (&c->stats.client[STATS_C_ZERO], count);
  if (fua)
    stats_count (&c->stats.client[STATS_C_FUA], count);
  r = request_new (REQ_MUTATE, PLUG_OP_ZERO, offset, count);
  if (r == NULL)
    return -1;
  r->fua = fua;
  r->fast = fast;
  for (i = 0; i < r->nr_pieces; ++i) {
    r->pieces[i].buf = NULL;
    r->pieces[i].flags = (may_trim ? PLUG_F_MAY_TRIM : 0) |
      (fast ? PLUG_F_FAST : 0);
  }
  return submit_mutation (c, r, NULL, "zero");
}

int
conn_trim (struct conn *c, uint32_t count, uint64_t offset, bool fua)
{
  struct request *r;
  size_t i;

  stats_count (&c->stats.client[STATS_C_TRIM], count);
  if (fua)
    stats_count (&c->stats.client[STATS_C_FUA], count);
  r = request_new (REQ_MUTATE, PLUG_OP_TRIM, offset, count);
  if (r == NULL)
    return -1;
  r->fua = fua;
  for (i = 0; i < r->nr_pieces; ++i)
    r->pieces[i].buf = NULL;
  return submit_mutation (c, r, NULL, "trim");
}

int
conn_flush (struct conn *c)
{
  struct request *r;

  stats_count (&c->stats.client[STATS_C_FLUSH], 0);
  r = request_new (REQ_FLUSH, PLUG_OP_WRITE, 0, 0);
  if (r == NULL)
    return -1;
  /* NBD: "all write requests for which a reply has already been sent"
   * must be on permanent storage: first the loop writes out every plug
   * and queue of this connection, then we fdatasync every file (which
   * also covers writes other connections completed: multi-conn).
   */
  if (submit (c, r, true) == -1) {
    nbdkit_error ("flush: %m");
    return -1;
  }
  if (cfg.mode == MODE_HOLD && drain_others (c) == -1) {
    nbdkit_error ("flush: draining other connections: %m");
    return -1;
  }
  return sync_backings (c, NULL);
}

int
conn_barrier (struct conn *c, uint64_t offset, uint64_t count)
{
  struct request *r;
  bool dirty;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->lock);
    dirty = dirty_overlaps_locked (c, offset, count);
  }
  if (!dirty)
    return 0;
  r = request_new (REQ_BARRIER, PLUG_OP_WRITE, offset, count);
  if (r == NULL)
    return -1;
  if (submit (c, r, true) == -1) {
    nbdkit_error ("waiting for held writes before reading: %m");
    return -1;
  }
  return 0;
}

int
conn_pread (struct conn *c, void *buf, uint32_t count, uint64_t offset)
{
  struct layout_iter it;
  struct layout_piece p;

  stats_count (&c->stats.client[STATS_C_READ], count);
  if (layout_iter_init (&it, &layout, offset, count) == -1) {
    nbdkit_error ("pread beyond the end of the export: offset %" PRIu64
                  " count %" PRIu32, offset, count);
    return -1;
  }
  /* A read never returns stale data: wait for any held or in-flight
   * write of this connection that overlaps it.
   */
  if (conn_barrier (c, offset, count) == -1)
    return -1;
  while (layout_iter_next (&it, &p)) {
    stats_count (&c->stats.backend[STATS_B_READ], p.count);
    if (backing_pread (&backings[p.backing], (char *) buf + p.buf_offset,
                       p.count, p.offset) == -1) {
      nbdkit_error ("file=%s: pread: %m", backings[p.backing].name);
      return -1;
    }
  }
  return 0;
}
