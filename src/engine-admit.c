/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine-admit.c: admission and plugging: NO OVERLAP IN PLUGS, the
 * unplug (blk_flush_plug), the memory bound and its waiting writers.
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

/* Is data admitted at or before max_seq and overlapping p held in a
 * plug?  (Newer held data never makes a read wait: it could starve.)
 */
bool
held_before (const struct engine *e, const struct plug_piece *p,
             uint64_t max_seq)
{
  const struct eng_conn *c;

  list_for_each (c, &e->conns, link)
    if (plug_overlaps_seq (&c->plug, p->backing, p->offset, p->count,
                           max_seq))
      return true;
  return false;
}

/* NO OVERLAP IN PLUGS: unplug every plug that holds data overlapping p,
 * before p is held or read.  False if one of them still holds it: its
 * unplug ran out of memory (tried again: conn_unplug).  An unplug that
 * works empties the plug.
 */
bool
unplug_overlapping (struct engine *e, const struct plug_piece *p,
                    enum plug_reason reason, uint64_t now,
                    struct eng_actions *out)
{
  struct eng_conn *c;
  bool cleared = true;

  list_for_each (c, &e->conns, link)
    if (plug_conflicts (&c->plug, p)) {
      conn_unplug (e, c, reason, now, out);
      if (!plug_is_empty (&c->plug))
        cleared = false;
    }
  return cleared;
}

/* Unplug whatever overlaps op's pieces, so that op may be held.  False
 * if some of it is still held: an unplug ran out of memory (it is
 * tried again, conn_unplug).  Then op must not be taken in, nor
 * answered, yet: held beside the older data, it could be written
 * before it.
 */
static bool
make_room (struct engine *e, const struct eng_op *op, uint64_t now,
           struct eng_actions *out)
{
  size_t i;

  for (i = 0; i < op->nr_pieces; ++i)
    if (!unplug_overlapping (e, &op->pieces[i], PLUG_UNPLUG_OVERLAP, now,
                             out))
      return false;
  return true;
}

/* -D plug.inject_unplug_nomem=N: does this unplug fail as if out of
 * memory?
 */
static bool
unplug_injected_nomem (struct engine *e)
{
  unsigned n = e->cfg.inject_unplug_nomem;

  return n > 0 && ++e->unplugs_tried % n == 0;
}

/* blk_flush_plug: detach everything c holds, sort, merge, queue the
 * runs in their files' queues (one batch), dispatch.
 */
void
conn_unplug (struct engine *e, struct eng_conn *c, enum plug_reason reason,
             uint64_t now, struct eng_actions *out)
{
  plug_run_vector runs = empty_vector;
  size_t i, j, nreqs = c->plug.reqs.len;
  uint64_t bytes = c->plug.bytes, batch;

  if (plug_is_empty (&c->plug))
    return;
  if (unplug_injected_nomem (e) || plug_take_runs (&c->plug, &runs) == -1) {
    /* No memory to merge: everything stays held and is tried again a
     * little later (the kernel's blk_delay_queue for the same reason).
     */
    plug_run_vector_reset (&runs);
    c->unplug_retry_ns = eng_add_ns (now, e->cfg.retry.delay_ns);
    deadline_earlier (e);
    eng_log (e, 1, "connection %" PRIu64 ": unplug %s: out of memory, "
             "retrying later", c->id, plug_reason_name (reason));
    return;
  }
  c->unplug_retry_ns = 0;
  STATS_ADD (c->stats->unplugs[reason], 1);
  stats_max (&c->stats->largest_requests, nreqs);
  stats_max (&c->stats->largest_bytes, bytes);
  if (e->cfg.debug_unplug)
    eng_log (e, 1, "connection %" PRIu64 ": unplug %s: %zu requests %"
             PRIu64 " bytes -> %zu runs",
             c->id, plug_reason_name (reason), nreqs, bytes, runs.len);

  batch = e->next_batch++;
  for (i = 0; i < runs.len; ++i) {
    struct plug_run *pr = runs.ptr[i];
    struct eng_run *r = run_of (pr);
    size_t k;

    r->run = pr;
    run_made (e, r);
    r->conn = c;
    r->batch = batch;
    r->min_seq = UINT64_MAX;
    for (k = 0; k < pr->n; ++k) {
      const struct plug_piece *p = pr->reqs[k];

      r->min_seq = MIN (r->min_seq, p->seq);
      stats_hist_add_serial (&c->stats->latency[STATS_L_HELD],
                             now > p->arrival_ns ? now - p->arrival_ns : 0);
    }
    r->flush_fua = false;         /* mark_flush_fua decides. */
    queue_append (e, r);
  }
  /* runs is sorted by file, then offset: one segment per file, whose
   * runs wait for what they must before the file's queue runs.
   */
  for (i = 0; i < runs.len; i = j) {
    uint32_t b = runs.ptr[i]->backing;

    for (j = i + 1; j < runs.len && runs.ptr[j]->backing == b; ++j)
      ;
    count_blockers (e, &e->files[b], batch, &runs.ptr[i], j - i);
    queue_dispatch (e, b, now, false, out);
  }
  plug_run_vector_reset (&runs);
}

/* Hold op's pieces in c's plug.  The plug has room (reserved), and
 * nothing overlapping them is held (make_room).
 */
static void
plug_pieces (struct engine *e, struct eng_conn *c, struct eng_op *op,
             uint64_t now, struct eng_actions *out)
{
  size_t i;

  if (plug_is_empty (&c->plug))
    deadline_earlier (e);       /* idle= and max-delay= start. */
  for (i = 0; i < op->nr_pieces; ++i) {
    struct plug_piece *p = &op->pieces[i];
    int r;

    r = plug_add (&c->plug, p);
    assert (r == 0);            /* Reserved by the caller. */
    (void) r;
    p->seq = op->seq;
  }
}

/* The kernel flushes a task's plug when the task sleeps: when every
 * worker of c waits for an answer and nothing of c is in a queue (whose
 * completion would wake one), nobody is left to bring the request that
 * would trigger an unplug.
 */
void
check_parked (struct engine *e, struct eng_conn *c, uint64_t now,
              struct eng_actions *out)
{
  if (!plug_is_empty (&c->plug) && c->nr_workers > 0 &&
      c->nr_waiting >= c->nr_workers && c->nr_runs == 0) {
    pace_parked (e, c, now);
    conn_unplug (e, c, PLUG_UNPLUG_PARKED, now, out);
  }
}

/* Give op a sequence number and hold it (make_room made room); to:
 * OP_ACKED or OP_ADMITTED, whether its client was told.
 */
static void
admit (struct engine *e, struct eng_conn *c, struct eng_op *op,
       enum eng_op_state to, uint64_t now, struct eng_actions *out)
{
  enum plug_reason reason;

  take_in (e, c, op, to, now);
  plug_pieces (e, c, op, now, out);

  if (op->flags & ENG_F_FUA)
    conn_unplug (e, c, PLUG_UNPLUG_FUA, now, out);
  else if (e->cfg.idle_ns == 0 || c->pace == PACE_PASSTHROUGH)
    conn_unplug (e, c, PLUG_UNPLUG_IDLE, now, out);
  else if (plug_full (&c->plug, &reason))
    conn_unplug (e, c, reason, now, out);
  else if (c->pace == PACE_BUSY && c->nr_runs == 0)
    conn_unplug (e, c, PLUG_UNPLUG_QUIET, now, out);
}

/* Is c at its memory bound (max-bytes, or the count of acknowledged
 * requests)?  One request is always let in, however large.
 */
static bool
over_memory (const struct engine *e, const struct eng_conn *c,
             const struct eng_op *op)
{
  if (c->nr_told_ok >= ACKED_PER_MAX_REQUEST * e->cfg.lim.max_requests)
    return true;
  return c->bytes > 0 && c->bytes + op->bytes > e->cfg.lim.max_bytes;
}

/* Let in the writers waiting for memory that fit now, oldest first. */
void
admit_waiters (struct engine *e, struct eng_conn *c, uint64_t now,
               struct eng_actions *out)
{
  struct eng_op *op;

  while ((op = wait_first (&c->mem_wait)) != NULL &&
         !over_memory (e, c, op)) {
    /* Tried again at the next release, or after the failed unplug's
     * retry (engine_tick).
     */
    if (plug_piece_vector_reserve (&c->plug.reqs, op->nr_pieces) == -1 ||
        !make_room (e, op, now, out))
      return;
    list_del (&op->wait);
    e->nr_mem_waiting--;
    c->nr_told_ok++;
    note_acked (e, op, now);
    /* Told "written" now, before it is: acknowledged. */
    op_reply (op, 0, out);
    admit (e, c, op, OP_ACKED, now, out);
  }
}

void
refuse_waiter (struct eng_conn *c, struct eng_op *op, struct eng_actions *out)
{
  list_del (&op->wait);
  c->e->nr_mem_waiting--;
  op_answer (c->e, op, c->last_err ? c->last_err : ENOMEM, out);
  op_release (c->e, op, out);
}

int
submit_mutation (struct engine *e, struct eng_conn *c, struct eng_op *op,
                 uint64_t now, struct eng_actions *out)
{
  bool wb = e->cfg.mode == ENG_WRITEBACK && !(op->flags & ENG_F_FUA);

  if (!pieces_valid (e, op)) {
    errno = EINVAL;
    return -1;
  }
  prepare_pieces (c, op, now);
  if (op->flags & ENG_F_FAST) {
    c->nr_waiting++;
    /* Across files, a piece could be zeroed while another one cannot
     * be fast: "SHOULD NOT alter the contents ... when returning
     * NBD_ENOTSUP".  Only a fast zero inside one file is tried.
     */
    if (op->nr_pieces > 1 || !can_issue_now (e, op) ||
        issue_alone (e, c, op, now, out) == -1) {
      op_answer (e, op, ENOTSUP, out);
      op_release (e, op, out);
    }
    return 0;
  }
  if (wb && (!list_empty (&c->mem_wait) || over_memory (e, c, op))) {
    /* At the bound the writer waits for memory, bounded by
     * requeue-timeout; the plug goes out so that memory comes back.
     */
    op_set_state (e, op, OP_WAIT_MEMORY);
    c->nr_waiting++;
    op->deadline_ns = eng_add_ns (now, e->cfg.retry.timeout_ns);
    list_add_tail (&c->mem_wait, &op->wait);
    e->nr_mem_waiting++;
    deadline_earlier (e);
    conn_unplug (e, c, PLUG_UNPLUG_MEMORY, now, out);
    check_parked (e, c, now, out);
    return 0;
  }
  if (plug_piece_vector_reserve (&c->plug.reqs, op->nr_pieces) == -1)
    return -1;
  if (!make_room (e, op, now, out)) {
    errno = ENOMEM;             /* Refused before it is acknowledged. */
    return -1;
  }
  if (wb) {
    op->acked = true;
    c->nr_told_ok++;
    note_acked (e, op, now);
  }
  else {
    c->nr_waiting++;
    pace_concurrent (e, c);
  }
  admit (e, c, op, wb ? OP_ACKED : OP_ADMITTED, now, out);
  check_parked (e, c, now, out);
  return 0;
}

void
engine_conn_set_workers (struct engine *e, struct eng_conn *c, unsigned n,
                         uint64_t now, struct eng_actions *out)
{
  c->nr_workers = n;
  check_parked (e, c, now, out);
}
