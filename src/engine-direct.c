/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine-direct.c: the direct path (and fast zero): a request issued
 * at once as runs of its own, without entering a plug.
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

/* Fast zero: "MUST fail quickly with NBD_ENOTSUP unless the request can
 * be serviced in less time than a corresponding NBD_CMD_WRITE".  It
 * never waits in a plug or a queue: issued at once, or refused.
 */
bool
can_issue_now (struct engine *e, const struct eng_op *op)
{
  size_t i;

  for (i = 0; i < op->nr_pieces; ++i) {
    const struct plug_piece *p = &op->pieces[i];
    const struct eng_file *f = &e->files[p->backing];

    if (f->state != FILE_RUNNING ||
        f->inflight + op->nr_pieces > f->max_inflight ||
        held_anywhere (e, p) ||
        queue_overlaps (e, p->backing, p->offset, p->count, UINT64_MAX))
      return false;
  }
  return true;
}

/* Admit op and issue each piece as a run of its own. */
int
issue_alone (struct engine *e, struct eng_conn *c, struct eng_op *op,
             uint64_t now, struct eng_actions *out)
{
  list_head made = LIST_HEAD_INIT (made);
  struct eng_run *r;
  struct eng_file *f;
  size_t i;

  /* Make every run first: the only failure point comes before any
   * state changes.  They wait on made, by issue_link, in piece order.
   */
  for (i = op->nr_pieces; i-- > 0; ) {
    r = single_run (e, &op->pieces[i]);
    if (r == NULL) {
      while ((r = list_pop (&made, struct eng_run, issue_link)) != NULL)
        run_free (r);
      return -1;
    }
    list_add_head (&made, &r->issue_link);
  }

  take_in (e, c, op, OP_ADMITTED, now);
  while ((r = list_pop (&made, struct eng_run, issue_link)) != NULL) {
    r->run->reqs[0]->seq = op->seq;
    r->conn = c;
    r->batch = e->next_batch++;
    r->min_seq = op->seq;
    queue_append (e, r);
    /* can_issue_now: nothing unfinished overlaps it, and its file has
     * a slot: straight in flight, never on the ready list.
     */
    f = &e->files[r->run->backing];
    assert (r->state == RUN_BLOCKED && r->nr_blockers == 0);
    f->nr_blocked--;
    run_start (e, f, r, now, out);
  }
  return 0;
}

/* Was [offset, offset+count) near one of c's recent requests?  Records
 * it either way.  "Near" rather than adjacent: a stream's requests
 * arrive shuffled across nbdkit's threads, so a neighbour often has not
 * arrived yet.  Near is a window of NR_RECENT requests of this size
 * (what a client queue of that depth spans), capped at max-merge.
 */
static bool
near_recent (struct engine *e, struct eng_conn *c, uint64_t offset,
             uint64_t count)
{
  uint64_t window = MIN ((uint64_t) NR_RECENT * count, e->cfg.lim.max_merge);
  /* Near [s, e) when e + window >= offset and s <= offset + count +
   * window, both saturating: the bounds are computed once.  Newest
   * first, where a stream finds its neighbour at once; random writes,
   * the direct path's case, look at every slot.  Empty slots are [MAX,
   * 0), which hi < MAX keeps from ever being near.
   */
  uint64_t lo = offset > window ? offset - window : 0;
  uint64_t hi = MIN (eng_add_ns (offset + count, window), UINT64_MAX - 1);
  bool near = false;
  unsigned i;

  for (i = 1; i <= NR_RECENT; ++i) {
    unsigned k = (c->recent_pos - i) % NR_RECENT;

    if (c->recent_end[k] >= lo && c->recent_start[k] <= hi) {
      near = true;
      break;
    }
  }
  c->recent_start[c->recent_pos % NR_RECENT] = offset;
  c->recent_end[c->recent_pos++ % NR_RECENT] = offset + count;
  return near;
}

/* Does every file of op's (valid) pieces let the direct path take what
 * cannot merge?
 */
static bool
unmerged_direct (const struct engine *e, const struct eng_op *op)
{
  size_t i;

  for (i = 0; i < op->nr_pieces; ++i)
    if (e->files[op->pieces[i].backing].direct_rule != ENG_DIRECT_UNMERGED)
      return false;
  return true;
}

bool
engine_try_direct (struct engine *e, struct eng_conn *c, struct eng_op *op,
                   uint64_t now, struct eng_actions *out)
{
  bool near, large;

  assert (op->kind == ENG_WRITE || op->kind == ENG_ZERO ||
          op->kind == ENG_TRIM);
  near = near_recent (e, c, op->offset, op->count);
  large = e->cfg.direct_size > 0 && op->count >= e->cfg.direct_size;
  if (!e->cfg.direct || (near && !large) || (op->flags & ENG_F_FAST) ||
      e->state != ENGINE_RUNNING || c->state != CONN_OPEN ||
      !list_empty (&c->mem_wait) || !pieces_valid (e, op) ||
      (!large && !unmerged_direct (e, op)))
    return false;
  prepare_pieces (c, op, now);
  if (!can_issue_now (e, op))
    return false;
  op_begin (e, op);
  c->nr_waiting++;
  if (issue_alone (e, c, op, now, out) == -1) {
    c->nr_waiting--;
    return false;
  }
  STATS_ADD (c->stats->direct, 1);
  return true;
}
