/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* loop.c: the connection's loop thread: plug, unplug, dispatch, retry.
 *
 * Everything here runs in the loop thread of one connection, the only
 * thread that touches c->plug, c->bq, c->parked and the watchers.  It
 * takes c->lock only to take the submission queue and to retire
 * requests from the dirty list, and never holds it across I/O or a
 * libev call.
 *
 * The kernel's words: wakeup_cb is blk_add_rq_to_plug (plus the
 * request-count flush), unplug() is blk_flush_plug, dispatch_queue() is
 * the driver's queue_rq loop, not_now() is BLK_STS_RESOURCE followed by
 * blk_mq_delay_run_hw_queue, and shutdown_conn() is blk_finish_plug at
 * task exit.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
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
#include "iopool.h"
#include "minmax.h"
#include "plugin.h"

#define container_of(ptr, type, member) \
  ((type *) ((char *) (ptr) - offsetof (type, member)))

static void dispatch_all (struct conn *c, bool force);

/* See struct conn: idle unplugs of one request before passthrough. */
#define LONE_STREAK 2

void *
loop_thread (void *vc)
{
  struct conn *c = vc;

  ev_run (c->loop, 0);
  return NULL;
}

/* Wake the worker waiting for r, exactly once.  Context: loop thread. */
static void
post (struct conn *c, struct request *r, int err)
{
  struct waiter *w = r->waiter;

  if (w == NULL)
    return;
  conn_unpark (c, r);
  r->waiter = NULL;             /* The waiter's stack frame goes away. */
  w->err = err;
  sem_post (&w->done);
}

/* All pieces of r are done: retire it and wake its worker. */
static void
request_done (struct conn *c, struct request *r)
{
  conn_retire (c, r);
  post (c, r, r->err);
  request_free (r);
}

static void
piece_done (struct conn *c, struct plug_req *p, int err, uint64_t now)
{
  struct request *r = p->opaque;
  uint64_t held = now > p->arrival_ns ? now - p->arrival_ns : 0;

  STATS_ADD (c->stats.held_total_ns, held);
  stats_max (&c->stats.held_max_ns, held);
  if (err && !r->err)
    r->err = err;
  if (--r->pending == 0)
    request_done (c, r);
}

/* Complete every member of a run, then free the run.  Batch failures
 * complete every member with the same error (cache filter pattern).
 */
static void
complete_run (struct conn *c, struct plug_run *run, int err)
{
  uint64_t now = now_ns ();
  size_t i;

  for (i = 0; i < run->n; ++i)
    piece_done (c, run->reqs[i], err, now);
  free (run);
}

/* Writeback: a run stays held after a failure, but anybody waiting for
 * one of its requests (FUA, fast zero, memory) gets the error now: a
 * worker must never wait for a backend that may not come back.  The
 * data is the loop's own copy, so it can stay held without them.
 */
static void
post_members (struct conn *c, struct plug_run *run, int err)
{
  size_t i;

  for (i = 0; i < run->n; ++i) {
    struct request *r = run->reqs[i]->opaque;

    r->failed = true;
    post (c, r, err);
  }
}

static size_t
bq_live (const struct bqueue *q)
{
  return q->jobs.len;
}

static void
bq_push (struct conn *c, struct plug_run *run, uint64_t batch)
{
  struct bqueue *q = &c->bq[run->backing];
  struct job *j = calloc (1, sizeof *j);

  if (j == NULL || job_vector_append (&q->jobs, j) == -1) {
    /* Cannot even queue it: fail it (nothing was written). */
    nbdkit_error ("file=%s: queue: %m", backings[run->backing].name);
    free (j);
    complete_run (c, run, EIO);
    return;
  }
  j->c = c;
  j->run = run;
  j->batch = batch;
  if (q->state == BQ_FAILED)
    post_members (c, run, q->err);
}

/* Take job i out of its queue (it is finished), keeping the order. */
static void
bq_remove (struct bqueue *q, size_t i)
{
  memmove (&q->jobs.ptr[i], &q->jobs.ptr[i+1],
           (q->jobs.len - i - 1) * sizeof q->jobs.ptr[0]);
  q->jobs.len--;
}

static size_t
bq_index (const struct bqueue *q, const struct job *j)
{
  size_t i;

  for (i = 0; i < q->jobs.len; ++i)
    if (q->jobs.ptr[i] == j)
      return i;
  abort ();
}

/* Finish job j of queue q: complete its run's requests with err. */
static void
job_finish (struct conn *c, struct bqueue *q, struct job *j, int err)
{
  bq_remove (q, bq_index (q, j));
  complete_run (c, j->run, err);
  free (j);
}

static void
log_run (const char *what, const struct plug_run *run, int err)
{
  errno = err;
  nbdkit_error ("file=%s: %s %s of %" PRIu64 " bytes at offset %" PRIu64
                ": %m", backings[run->backing].name, what,
                run->op == PLUG_OP_WRITE ? "write" :
                run->op == PLUG_OP_ZERO ? "zero" : "trim",
                run->count, run->offset);
}

/* Retry-timeout passed with the backend still saying "not now". */
static void
give_up (struct conn *c, uint32_t b, uint64_t now)
{
  struct bqueue *q = &c->bq[b];
  size_t i;

  STATS_ADD (c->stats.gave_up, 1);
  for (i = 0; i < q->jobs.len; ++i)
    if (!q->jobs.ptr[i]->inflight)
      log_run ("giving up after retry-timeout:", q->jobs.ptr[i]->run, EAGAIN);

  if (cfg.mode == MODE_HOLD) {
    /* Nothing was acknowledged: fail the requests with EIO (never EAGAIN:
     * nbdkit would send it as NBD_EINVAL).  Jobs in flight finish by
     * themselves.
     */
    for (i = 0; i < q->jobs.len; )
      if (q->jobs.ptr[i]->inflight)
        i++;
      else
        job_finish (c, q, q->jobs.ptr[i], EIO);
    q->state = BQ_OK;
    retry_reset (&q->retry);
    return;
  }
  /* Writeback: the data was acknowledged, so it stays held, is retried
   * slowly, and the next FLUSH reports EIO.
   */
  q->state = BQ_FAILED;
  q->err = EIO;
  q->next_ns = now + cfg.retry.max_delay_ns;
  c->deferred_err = EIO;
  for (i = 0; i < q->jobs.len; ++i)
    post_members (c, q->jobs.ptr[i]->run, EIO);
}

/* The backend said "not now" (EAGAIN, ENOMEM, no free slot).  Several
 * jobs of one wave may say so: only the first one counts as an attempt.
 */
static void
not_now (struct conn *c, uint32_t b, uint64_t now)
{
  struct bqueue *q = &c->bq[b];
  uint64_t delay;

  STATS_ADD (c->stats.eagain, 1);
  if (q->state == BQ_DELAYED)
    return;
  if (q->state == BQ_FAILED) {
    q->next_ns = now + cfg.retry.max_delay_ns;
    return;
  }
  if (retry_failed (&cfg.retry, &q->retry, now, &delay)) {
    q->state = BQ_DELAYED;
    q->next_ns = now + delay;
  }
  else
    give_up (c, b, now);
}

/* A real error on job j of queue b. */
static void
hard_error (struct conn *c, uint32_t b, struct job *j, int err, uint64_t now)
{
  struct bqueue *q = &c->bq[b];

  STATS_ADD (c->stats.errors, 1);
  log_run ("cannot", j->run, err);
  if (cfg.mode == MODE_HOLD) {
    job_finish (c, q, j, err);
    return;
  }
  if (q->state != BQ_FAILED) {
    size_t i;

    q->state = BQ_FAILED;
    for (i = 0; i < q->jobs.len; ++i)
      post_members (c, q->jobs.ptr[i]->run, err);
  }
  q->err = err;
  q->next_ns = now + cfg.retry.max_delay_ns;
  c->deferred_err = err;
}

static void
count_backend (struct conn *c, const struct plug_run *run)
{
  stats_count (&c->stats.backend[stats_backend_of (run->op)], run->count);
}

/* Must job i wait for an older unfinished run that overlaps it?  Jobs
 * are in unplug order and one unplug's runs never overlap, so only the
 * jobs of older batches, which all come first, need a look.
 */
static bool
blocked_by_older (const struct bqueue *q, size_t i)
{
  const struct plug_run *run = q->jobs.ptr[i]->run;
  size_t k;

  for (k = 0; k < i && q->jobs.ptr[k]->batch != q->jobs.ptr[i]->batch; ++k) {
    const struct plug_run *o = q->jobs.ptr[k]->run;

    if (o->offset < run->offset + run->count &&
        run->offset < o->offset + o->count)
      return true;
  }
  return false;
}

/* Issue what queue b can issue now, oldest first: every queued run not
 * blocked by an older overlapping one, as far as the file's in-flight
 * slots allow, taken with one acquisition of the file's lock.  No free
 * slot while none of ours is in flight (other connections use them all)
 * is "not now", like a blk-mq driver without a free tag; with ours in
 * flight, their completion dispatches again.
 */
static void
dispatch_queue (struct conn *c, uint32_t b, uint64_t now)
{
  struct bqueue *q = &c->bq[b];
  struct backing *bk = &backings[b];
  CLEANUP_FREE struct job **ready = NULL;
  size_t i, n = 0;
  unsigned got;

  ready = malloc (q->jobs.len * sizeof *ready);
  if (ready == NULL) {
    not_now (c, b, now);        /* ENOMEM: a real "not now". */
    return;
  }
  for (i = 0; i < q->jobs.len; ++i)
    if (!q->jobs.ptr[i]->inflight && !blocked_by_older (q, i))
      ready[n++] = q->jobs.ptr[i];
  if (n == 0)
    return;
  got = backing_reserve (bk, MIN (n, (size_t) UINT_MAX));
  if (got == 0) {
    if (q->nr_inflight == 0)
      not_now (c, b, now);
    return;
  }
  for (i = 0; i < got; ++i) {
    ready[i]->inflight = true;
    q->nr_inflight++;
    c->inflight++;
    iopool_submit (ready[i]);
  }
}

/* A pool thread finished job j.  Context: loop thread. */
static void
job_done (struct conn *c, struct job *j, uint64_t now)
{
  uint32_t b = j->run->backing;
  struct bqueue *q = &c->bq[b];
  int err = j->err;

  j->inflight = false;
  q->nr_inflight--;
  c->inflight--;
  backing_release (&backings[b], 1);

  if (err == 0) {
    count_backend (c, j->run);
    if (q->state == BQ_FAILED)
      nbdkit_debug ("file=%s: recovered after an error", backings[b].name);
    /* Progress: the backend takes I/O again, so a delayed queue runs
     * now rather than at its timer (blk-mq restarts a queue that got
     * BLK_STS_RESOURCE when one of its requests completes; the delayed
     * run is only for a queue with nothing in flight).
     */
    if (q->state == BQ_DELAYED)
      STATS_ADD (c->stats.restarted, 1);
    q->state = BQ_OK;
    retry_reset (&q->retry);
    job_finish (c, q, j, 0);
  }
  else if (err == ENOTSUP && (j->run->flags & PLUG_F_FAST))
    job_finish (c, q, j, ENOTSUP);
  else if (c->last_attempt) {
    log_run ("last attempt failed, dropping", j->run, err);
    job_finish (c, q, j, ESHUTDOWN);
  }
  else if (retry_is_transient (err))
    not_now (c, b, now);        /* j stays queued, in its place. */
  else
    hard_error (c, b, j, err, now);
}

/* Is every queue either empty or failed?  Sets *failed if one failed. */
static bool
queues_settled (struct conn *c, bool *failed)
{
  size_t b;

  *failed = false;
  for (b = 0; b < nr_backings; ++b) {
    if (c->bq[b].state == BQ_FAILED)
      *failed = true;
    else if (bq_live (&c->bq[b]) > 0)
      return false;
  }
  return true;
}

/* May a read of r's range go ahead?  Returns 1 yes, 0 not yet, -1 if
 * the bytes it needs are held after a failure (sets *err).
 */
static int
barrier_ready (struct conn *c, const struct request *r, int *err)
{
  const struct request *d;
  int ret = 1;

  pthread_mutex_lock (&c->lock);
  for (d = c->dirty; d != NULL; d = d->dnext) {
    if (d->arrival_ns > r->arrival_ns)
      continue;                 /* Arrived after the read: not ours. */
    if (d->offset < r->offset + r->count && r->offset < d->offset + d->count) {
      if (d->failed) {
        *err = EIO;
        ret = -1;
      }
      else {
        ret = 0;
        break;
      }
    }
  }
  pthread_mutex_unlock (&c->lock);
  return ret;
}

/* Complete the parked FLUSH and BARRIER requests that can go now. */
static void
check_parked (struct conn *c)
{
  struct request **pp = &c->parked;

  while (*pp) {
    struct request *r = *pp;
    bool failed;
    int err = 0, ready;

    if (r->kind == REQ_FLUSH || r->kind == REQ_DRAIN) {
      /* Anything that arrived before the flush must have left the plug
       * (it may not have, if merging ran out of memory).
       */
      ready = queues_settled (c, &failed) &&
        (plug_is_empty (&c->plug) || c->plug.oldest_ns > r->arrival_ns);
      if (ready && r->kind == REQ_FLUSH) {
        err = failed || c->deferred_err ? EIO : 0;
        c->deferred_err = failed ? EIO : 0;
      }
    }
    else {
      ready = barrier_ready (c, r, &err);
      if (ready == -1)
        ready = 1;
      else
        err = 0;
    }
    if (!ready) {
      pp = &r->next;
      continue;
    }
    *pp = r->next;
    post (c, r, err);
    request_free (r);
  }
}

/* Re-arm the retry timer for the earliest delayed or failed queue. */
static void
arm_retry_timer (struct conn *c, uint64_t now)
{
  uint64_t next = UINT64_MAX;
  size_t b;

  for (b = 0; b < nr_backings; ++b)
    if (c->bq[b].state != BQ_OK && bq_live (&c->bq[b]) > 0)
      next = MIN (next, c->bq[b].next_ns);
  ev_timer_stop (c->loop, &c->retry_timer);
  if (next == UINT64_MAX)
    return;
  ev_timer_set (&c->retry_timer,
                next > now ? (next - now) / 1e9 : 0., 0.);
  ev_timer_start (c->loop, &c->retry_timer);
}

/* Issue every queue that is due.  force: also those still delayed (a
 * FLUSH retries failed data at once; close makes a last attempt).
 */
static void
dispatch_all (struct conn *c, bool force)
{
  uint64_t now = now_ns ();
  size_t b;

  for (b = 0; b < nr_backings; ++b) {
    struct bqueue *q = &c->bq[b];

    if (bq_live (q) == 0)
      continue;
    if (q->state != BQ_OK && !force && now < q->next_ns)
      continue;
    /* A delayed queue that is due starts a new attempt: its next "not
     * now" counts again (a failed one stays failed until a success).
     */
    if (q->state == BQ_DELAYED)
      q->state = BQ_OK;
    dispatch_queue (c, b, now);
  }
  check_parked (c);
  arm_retry_timer (c, now);
}

/* blk_flush_plug: detach everything held, sort, merge, queue, issue. */
static void
unplug (struct conn *c, enum plug_reason reason)
{
  plug_run_vector runs = empty_vector;
  size_t i, nreqs = c->plug.reqs.len;
  uint64_t bytes = c->plug.bytes;

  if (plug_is_empty (&c->plug))
    return;
  if (plug_take_runs (&c->plug, &runs) == -1) {
    /* No memory to merge: everything stays held; the plug timer comes
     * back (max-delay) and tries again.
     */
    nbdkit_debug ("unplug %s: %m: retrying later", plug_reason_name (reason));
    return;
  }
  STATS_ADD (c->stats.unplugs[reason], 1);
  stats_max (&c->stats.largest_requests, nreqs);
  stats_max (&c->stats.largest_bytes, bytes);
  if (plug_debug_unplug)
    nbdkit_debug ("connection %" PRIu64 ": unplug %s: %zu requests "
                  "%" PRIu64 " bytes -> %zu runs", c->id,
                  plug_reason_name (reason), nreqs, bytes, runs.len);
  for (i = 0; i < runs.len; ++i)
    bq_push (c, runs.ptr[i], c->next_batch);
  c->next_batch++;
  plug_run_vector_reset (&runs);
  dispatch_all (c, false);
}

/* Remember to unplug at the end of this wakeup; the first reason noted
 * is the one counted.
 */
static void
note_unplug (struct conn *c, enum plug_reason reason)
{
  if (c->pending_unplug == -1)
    c->pending_unplug = reason;
}

/* Hold the pieces of a write, zero or trim; unplug if it asks for it. */
static void
take_mutation (struct conn *c, struct request *r)
{
  enum plug_reason reason;
  size_t i;

  r->pending = r->nr_pieces;
  for (i = 0; i < r->nr_pieces; ++i) {
    struct plug_req *p = &r->pieces[i];

    if (plug_conflicts (&c->plug, p))
      unplug (c, PLUG_UNPLUG_OVERLAP);
    if (plug_add (&c->plug, p) == -1) {
      unplug (c, PLUG_UNPLUG_MAX_REQUESTS);
      if (plug_add (&c->plug, p) == -1) {
        nbdkit_error ("plug: %m");
        piece_done (c, p, EIO, now_ns ());
      }
    }
  }
  /* FUA, fast zero ("MUST fail quickly") and a writer waiting for
   * memory go out at the end of this wakeup, with whatever else the
   * batch brings: once per batch, not one unplug per request.
   */
  if (r->fua)
    note_unplug (c, PLUG_UNPLUG_FUA);
  else if (r->fast)
    note_unplug (c, PLUG_UNPLUG_FAST_ZERO);
  else if (r->waiter && cfg.mode == MODE_WRITEBACK)
    note_unplug (c, PLUG_UNPLUG_MEMORY);
  if (plug_full (&c->plug, &reason))
    unplug (c, reason);
}

/* Does the plug hold anything in the export range of r? */
static bool
plug_overlaps_range (struct conn *c, uint64_t offset, uint64_t count)
{
  struct layout_iter it;
  struct layout_piece p;

  if (layout_iter_init (&it, &layout, offset, count) == -1)
    return true;
  while (layout_iter_next (&it, &p))
    if (plug_overlaps (&c->plug, p.backing, p.offset, p.count))
      return true;
  return false;
}

static void
park (struct conn *c, struct request *r)
{
  r->next = c->parked;
  c->parked = r;
}

static void
take (struct conn *c, struct request *r)
{
  switch (r->kind) {
  case REQ_MUTATE:
    take_mutation (c, r);
    break;
  case REQ_FLUSH:
  case REQ_DRAIN:
    /* blk_finish_plug, then retry whatever is delayed or failed now:
     * the client asked for durability, don't make it wait a backoff.
     */
    unplug (c, PLUG_UNPLUG_FLUSH);
    park (c, r);
    dispatch_all (c, true);
    break;
  case REQ_BARRIER:
    if (plug_overlaps_range (c, r->offset, r->count))
      unplug (c, PLUG_UNPLUG_READ);
    park (c, r);
    check_parked (c);
    break;
  }
}

/* When must the plug go out at the latest?  UINT64_MAX: never. */
static uint64_t
plug_deadline (struct conn *c)
{
  uint64_t d = c->plug.oldest_ns + cfg.max_delay_ns;

  if (cfg.idle_ns > 0)
    d = MIN (d, c->last_activity_ns + cfg.idle_ns);
  return d;
}

static void
arm_plug_timer (struct conn *c)
{
  uint64_t now, d;

  ev_timer_stop (c->loop, &c->plug_timer);
  if (plug_is_empty (&c->plug))
    return;
  now = now_ns ();
  d = plug_deadline (c);
  ev_timer_set (&c->plug_timer, d > now ? (d - now) / 1e9 : 0., 0.);
  ev_timer_start (c->loop, &c->plug_timer);
}

/* Connection close or server exit: blk_finish_plug, then a last attempt
 * for whatever waits for a backend.  What fails in the last attempt is
 * logged and dropped (ESHUTDOWN to anybody waiting): NBD has no way to
 * report an error at close.  Closing: the loop stops once nothing is in
 * flight (pool threads hold pointers into this connection until then).
 */
static void
shutdown_conn (struct conn *c, bool closing)
{
  size_t b, i;

  c->last_attempt = true;
  c->finishing |= closing;
  unplug (c, PLUG_UNPLUG_CLOSE);
  dispatch_all (c, true);
  /* Queued jobs that could not even be issued (blocked, no slot). */
  for (b = 0; b < nr_backings; ++b) {
    struct bqueue *q = &c->bq[b];

    if (q->nr_inflight > 0)
      continue;                 /* Their completions issue the rest. */
    for (i = 0; i < q->jobs.len; ) {
      struct job *j = q->jobs.ptr[i];

      if (j->inflight) {
        i++;
        continue;
      }
      log_run ("shutting down, dropping", j->run, q->err ? q->err : EAGAIN);
      job_finish (c, q, j, ESHUTDOWN);
    }
  }
  check_parked (c);             /* Drains and flushes settle now. */
  if (!c->finishing || c->inflight > 0)
    return;

  while (c->parked) {
    struct request *r = c->parked;

    c->parked = r->next;
    post (c, r, ESHUTDOWN);
    request_free (r);
  }
  ev_timer_stop (c->loop, &c->plug_timer);
  ev_timer_stop (c->loop, &c->retry_timer);
  ev_async_stop (c->loop, &c->wakeup);
  ev_break (c->loop, EVBREAK_ALL);
}

void
wakeup_cb (struct ev_loop *loop, ev_async *w, int revents)
{
  struct conn *c = container_of (w, struct conn, wakeup);
  struct request *list, *next;
  struct job *done, *jnext;
  bool closing, stopping, all_parked, concurrent;
  uint64_t now;

  {
    pthread_mutex_lock (&c->lock);
    list = c->queue_head;               /* Sends coalesce: take all. */
    c->queue_head = NULL;
    c->queue_tail = &c->queue_head;
    done = c->done;
    c->done = NULL;
    closing = c->closing;
    stopping = c->stopping;
    pthread_mutex_unlock (&c->lock);
  }

  /* Completions first: they free slots and memory for what follows. */
  now = now_ns ();
  for (; done != NULL; done = jnext) {
    jnext = done->next;
    job_done (c, done, now);
  }

  if (list)
    c->last_activity_ns = now;
  for (; list != NULL; list = next) {
    next = list->next;
    take (c, list);
  }

  if (c->pending_unplug != -1) {
    enum plug_reason reason = c->pending_unplug;

    c->pending_unplug = -1;
    unplug (c, reason);
  }
  if (closing || stopping || c->finishing) {
    shutdown_conn (c, closing);
    return;
  }

  /* Read after taking the batch: unplugs while taking it woke workers.
   * Runs in flight will wake their workers when they complete (and
   * this is checked again then), so only with nothing in flight is
   * nobody left to bring the next request.
   */
  pthread_mutex_lock (&c->lock);
  all_parked = c->nr_parked > 0 && c->nr_parked >= c->nr_workers &&
    c->inflight == 0;
  concurrent = c->nr_parked > 1;
  pthread_mutex_unlock (&c->lock);
  if (concurrent && c->passthrough) {
    c->passthrough = false;     /* The client has concurrency again. */
    c->lone_streak = 0;
  }
  /* idle=0: unplug as soon as the submitters have nothing more for us
   * (early Redis: write everything just before the loop sleeps).
   */
  if (all_parked)
    unplug (c, PLUG_UNPLUG_PARKED);
  else if (cfg.idle_ns == 0 || c->passthrough)
    unplug (c, PLUG_UNPLUG_IDLE);
  /* Issue what completions unblocked, settle flushes and barriers. */
  dispatch_all (c, false);
  arm_plug_timer (c);
}

void
plug_timer_cb (struct ev_loop *loop, ev_timer *w, int revents)
{
  struct conn *c = container_of (w, struct conn, plug_timer);
  uint64_t now = now_ns ();

  if (!plug_is_empty (&c->plug)) {
    bool aged = now >= c->plug.oldest_ns + cfg.max_delay_ns;
    bool idle = cfg.idle_ns > 0 && now >= c->last_activity_ns + cfg.idle_ns;

    /* A timer had to release a lone held request while nothing else of
     * the client waited here: see struct conn.
     */
    if ((aged || idle) && cfg.mode == MODE_HOLD) {
      size_t parked;

      pthread_mutex_lock (&c->lock);
      parked = c->nr_parked;
      pthread_mutex_unlock (&c->lock);
      c->lone_streak = c->plug.reqs.len == 1 && parked <= 1 ?
        c->lone_streak + 1 : 0;
      c->passthrough = c->lone_streak >= LONE_STREAK;
    }
    if (aged)
      unplug (c, PLUG_UNPLUG_MAX_DELAY);
    else if (idle)
      unplug (c, PLUG_UNPLUG_IDLE);
  }
  arm_plug_timer (c);
}

void
retry_timer_cb (struct ev_loop *loop, ev_timer *w, int revents)
{
  struct conn *c = container_of (w, struct conn, retry_timer);

  STATS_ADD (c->stats.timer_fired, 1);
  dispatch_all (c, false);
}
