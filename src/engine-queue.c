/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine-queue.c: the per-file dispatch queues: QUEUE ORDER kept by
 * counting, dispatch, "not now" (delay, stall, give up) and the split
 * of a failed merged run.
 */

#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine-int.h"
#include "minmax.h"

/* QUEUE ORDER, kept by counting: a run counts, when it is queued, the
 * older unfinished runs of its file that overlap it (nr_blockers), and
 * a run that finishes lets go of the newer runs it overlaps.  A run
 * with no blockers goes on its file's ready list, so dispatch never
 * rescans.  Each file keeps its unfinished runs in an index by offset
 * (src/itree.h), so each event looks only at the runs that overlap
 * the one it is about:
 *  - a new run looks up the runs that overlap it; those of older
 *    batches are its blockers (batches are numbered in creation order
 *    and a batch's runs never overlap each other);
 *  - a finishing run looks up the runs that overlap it; those of newer
 *    batches were all counting it (none of them can have gone out
 *    while it was unfinished, and a direct run overlaps nothing).
 * The index's steps are counted in order_checks.
 *
 * The ready list goes out in the order runs became free, a retried run
 * first: like blk-mq's dispatch list, where a requeued request goes to
 * the head.  Runs that are free at once are the common case and keep
 * their creation order.
 */

static void
ready_remove (struct eng_file *f, struct eng_run *r);

static void
ready_append (struct engine *e, struct eng_file *f, struct eng_run *r)
{
  assert (r->state == RUN_BLOCKED && r->nr_blockers == 0);
  f->nr_blocked--;
  run_set_state (e, r, RUN_READY);
  list_add_tail (&f->ready, &r->ready_link);
}

/* A run back from the backend ("not now", or a piece of a failed run)
 * goes out again first.
 */
static void
ready_push (struct engine *e, struct eng_file *f, struct eng_run *r)
{
  run_set_state (e, r, RUN_READY);
  r->nr_blockers = 0;
  list_add_head (&f->ready, &r->ready_link);
}

static void
ready_remove (struct eng_file *f, struct eng_run *r)
{
  assert (r->state == RUN_READY);
  list_unlink (&r->ready_link);
}

/* q (blocked) now waits for n older runs; at 0 it is free to go. */
static void
set_blockers (struct engine *e, struct eng_file *f, struct eng_run *q,
              size_t n)
{
  assert (q->state == RUN_BLOCKED);
  q->nr_blockers = n;
  if (n == 0)
    ready_append (e, f, q);
}

/* A walk of a file's index on behalf of run r. */
struct order_walk {
  struct eng_file *f;
  struct eng_run *r;
  list_head *pieces;            /* split_run: r's pieces, by qlink. */
  struct engine *e;
};

static bool
count_one_older (struct itree_node *node, void *opaque)
{
  struct order_walk *w = opaque;

  if (run_of_node (node)->batch < w->r->batch)
    w->r->nr_blockers++;
  return false;
}

static bool
release_one_newer (struct itree_node *node, void *opaque)
{
  struct order_walk *w = opaque;
  struct eng_run *q = run_of_node (node);

  if (q->batch > w->r->batch) {
    assert (q->state == RUN_BLOCKED && q->nr_blockers > 0);
    set_blockers (w->e, w->f, q, q->nr_blockers - 1);
  }
  return false;
}

/* Walk the runs of f that overlap r, calling fn for each. */
static void
walk_overlapping (struct engine *e, struct eng_file *f, struct eng_run *r,
                  itree_fn fn, struct order_walk *w)
{
  w->f = f;
  w->r = r;
  w->e = e;
  itree_overlapping (&f->index, r->node.start, r->node.end, fn, w,
                     &e->order_checks);
}

/* r finishes: every newer run that overlapped it has one blocker
 * less.  Called only with runs blocked (run_dequeue).
 */
void
release_blocked (struct engine *e, struct eng_file *f, struct eng_run *r)
{
  struct order_walk w = { .pieces = NULL };

  walk_overlapping (e, f, r, release_one_newer, &w);
}

/* The n runs v[] of one unplug (batch), just queued to file f, count
 * the older runs of f that overlap them; those with none are ready, in
 * offset order.  A file whose oldest run is of this batch has nothing
 * older: no walk.
 */
void
count_blockers (struct engine *e, struct eng_file *f, uint64_t batch,
                struct plug_run *const *v, size_t n)
{
  struct order_walk w = { .pieces = NULL };
  bool older = list_first (&f->queue, struct eng_run, qlink)->batch < batch;
  size_t i;

  for (i = 0; i < n; ++i) {
    struct eng_run *q = run_of (v[i]);

    if (older)
      walk_overlapping (e, f, q, count_one_older, &w);
    set_blockers (e, f, q, q->nr_blockers);
  }
}

static void
run_issue (struct engine *e, struct eng_file *f, struct eng_run *r,
           uint64_t now, struct eng_actions *out)
{
  ready_remove (f, r);
  run_start (e, f, r, now, out);
}

/* queue_dispatch with something queued. */
void
queue_run (struct engine *e, uint32_t b, uint64_t now, bool force,
           struct eng_actions *out)
{
  struct eng_file *f = &e->files[b];
  struct eng_run *r;

  if (f->state == FILE_DELAYED && !force && now < f->delay_until)
    return;
  if (f->state == FILE_STALLED && !force)
    return;
  file_set_state (e, f, FILE_RUNNING);
  while ((r = list_first (&f->ready, struct eng_run, ready_link)) != NULL) {
    if (f->inflight >= f->max_inflight) {
      /* A driver out of tags: the next completion dispatches again. */
      STATS_ADD (r->conn->stats->no_slot, 1);
      break;
    }
    run_issue (e, f, r, now, out);
  }
}

void
dispatch_all (struct engine *e, uint64_t now, bool force,
              struct eng_actions *out)
{
  uint32_t b;

  for (b = 0; b < e->cfg.nr_backings; ++b)
    queue_dispatch (e, b, now, force, out);
}

/* q waited for the failed run w->r, which is about to be replaced by
 * its pieces (w->pieces): it waits for those that overlap it instead.
 */
static bool
rewait_one_newer (struct itree_node *node, void *opaque)
{
  struct order_walk *w = opaque;
  struct eng_run *q = run_of_node (node);
  const struct eng_run *n;
  size_t k = 0;

  if (q->batch <= w->r->batch)
    return false;
  assert (q->state == RUN_BLOCKED && q->nr_blockers > 0);
  list_for_each (n, w->pieces, qlink) {
    w->e->order_checks++;
    k += n->run->offset < q->node.end &&
      q->node.start < n->run->offset + n->run->count;
  }
  set_blockers (w->e, w->f, q, q->nr_blockers - 1 + k);
  return false;
}

/* A merged run failed with a real error: put its members back in its
 * place as runs of their own (same batch, so the order rules hold), so
 * that the failure stays with the range that failed and its neighbours
 * are written.  Returns -1 if there is no memory for it.
 */
int
split_run (struct engine *e, struct eng_file *f, struct eng_run *r)
{
  list_head made = LIST_HEAD_INIT (made);
  struct list_node *before = r->qlink.prev, *node;
  struct eng_run *n;
  struct order_walk w = { .pieces = &made };
  size_t i;

  for (i = r->run->n; i-- > 0; ) {
    struct plug_piece *p = r->run->reqs[i];

    n = single_run (e, p);
    if (n == NULL) {
      while ((n = list_pop (&made, struct eng_run, qlink)) != NULL)
        run_free (n);
      return -1;
    }
    n->conn = r->conn;
    n->batch = r->batch;
    n->min_seq = p->seq;
    list_add_head (&made, &n->qlink);
  }
  if (f->nr_blocked > 0)
    walk_overlapping (e, f, r, rewait_one_newer, &w);
  itree_remove (&f->index, &r->node);
  /* Replace r by the pieces, in offset order, where r stood. */
  while ((n = list_pop (&made, struct eng_run, qlink)) != NULL) {
    list_add_before (&r->qlink, &n->qlink);
    index_add (f, n);
    f->nr_queued++;
    r->conn->nr_runs++;
  }
  node = r->qlink.prev;
  list_del (&r->qlink);
  /* r was in flight, so no older run overlapped it, nor its pieces: they
   * go out again first, in offset order.
   */
  for (; node != before; node = node->prev)
    ready_push (e, f, list_entry (node, struct eng_run, qlink));
  r->conn->nr_runs--;
  run_set_state (e, r, RUN_DONE);
  run_free (r);
  return 0;
}

/* "Not now" on run r of file f. */
void
not_now (struct engine *e, struct eng_file *f, struct eng_run *r,
         uint64_t now, struct eng_actions *out)
{
  uint64_t deadline, delay;

  STATS_ADD (r->conn->stats->eagain, 1);
  f->counts.not_now++;
  if (f->retry.since_ns == 0)
    f->retry.since_ns = now ? now : 1;
  deadline = eng_add_ns (f->retry.since_ns, e->cfg.retry.timeout_ns);
  if (now >= deadline) {
    STATS_ADD (r->conn->stats->gave_up, 1);
    log_run (e, r, "giving up after requeue-timeout", EAGAIN, now);
    run_finish (e, r, EIO, now, out);
    /* The file has said "not now" for requeue-timeout: each queued run
     * gets one more attempt at once, and gives up too if it is refused
     * (so a close or exit ends within requeue-timeout plus one attempt
     * per run).  With nothing left in flight, a stalled queue would
     * otherwise wait for ever.
     */
    if (f->inflight == 0)
      file_set_state (e, f, FILE_RUNNING);
    return;
  }
  ready_push (e, f, r);
  f->nr_queued++;
  if (f->inflight > 0) {
    file_set_state (e, f, FILE_STALLED);
    return;
  }
  /* blk_delay_queue, with a capped backoff; the last retry lands on the
   * deadline, so that the file gets its whole requeue-timeout, never more.
   */
  delay = retry_delay (&e->cfg.retry, f->retry.attempts);
  if (f->retry.attempts < 64)
    f->retry.attempts++;
  file_set_state (e, f, FILE_DELAYED);
  f->delay_until = MIN (eng_add_ns (now, delay), deadline);
  deadline_earlier (e);
}

/* Time passed for file b: a delayed queue runs again at delay_until
 * (blk_mq_delay_run_hw_queue's timer).
 */
void
queue_tick (struct engine *e, uint32_t b, uint64_t now,
            struct eng_actions *out)
{
  struct eng_file *f = &e->files[b];

  if (f->state == FILE_DELAYED && f->nr_queued > 0 &&
      now >= f->delay_until) {
    STATS_ADD (list_first (&f->queue, struct eng_run, qlink)->conn->stats->
               timer_fired, 1);
    queue_dispatch (e, b, now, false, out);
  }
}
