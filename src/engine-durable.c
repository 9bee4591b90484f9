/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine-durable.c: durability.  THE RECORD (spans of lost data), the
 * rounds of syncs (SYNCS BELONG TO THE ENGINE), finishing a mutation,
 * and the FLUSH and read barriers that wait for their horizons.
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

static void
round_done (struct engine *e, uint64_t now, struct eng_actions *out);

static bool
spans_touch (const struct span *a, uint64_t start, uint64_t end)
{
  return a->start <= end && start <= a->end;
}

/* Grow a to cover sp: its bytes and its sequence numbers. */
static void
span_absorb (struct span *a, const struct span *sp)
{
  a->start = MIN (a->start, sp->start);
  a->end = MAX (a->end, sp->end);
  a->seq_lo = MIN (a->seq_lo, sp->seq_lo);
  a->seq_hi = MAX (a->seq_hi, sp->seq_hi);
}

/* One span covering every span of v (and nothing else is kept). */
static void
span_hull (span_vector *v)
{
  struct span h = v->ptr[0];
  size_t i;

  for (i = 1; i < v->len; ++i)
    span_absorb (&h, &v->ptr[i]);
  h.extent = SPAN_WIDENED;
  v->ptr[0] = h;
  v->len = 1;
}

/* Add sp to v, merged with the last span if that touches it and has
 * the same sequence numbers and errno: each span heals as a whole, so
 * spans of different mutations stay apart.  Its storage was reserved
 * when the engine was made (SPAN_CAP): past that, v becomes its hull.
 * Returns true if it did.
 */
static bool
span_add (span_vector *v, struct span sp)
{
  struct span *last = v->len ? &v->ptr[v->len - 1] : NULL;

  if (v->len == 1 && last->extent == SPAN_WIDENED) {
    /* Past the cap already: the hull grows in place, O(1), instead of
     * filling the vector to be folded again.
     */
    span_absorb (last, &sp);
    return false;
  }
  if (last && spans_touch (last, sp.start, sp.end) &&
      last->seq_lo == sp.seq_lo && last->seq_hi == sp.seq_hi &&
      last->err == sp.err && last->extent == sp.extent) {
    last->start = MIN (last->start, sp.start);
    last->end = MAX (last->end, sp.end);
    return false;
  }
  assert (v->len < SPAN_CAP && v->cap >= SPAN_CAP);
  v->ptr[v->len++] = sp;
  if (v->len < SPAN_CAP)
    return false;
  span_hull (v);
  return true;
}

static int
span_cmp_start (const void *a, const void *b)
{
  const struct span *x = a, *y = b;

  return x->start < y->start ? -1 : x->start > y->start;
}

/* Sort v by start and merge the spans that touch, whatever their
 * sequence numbers (a heal set's rule, heal_add).
 */
static void
heal_coalesce (span_vector *v)
{
  size_t i, n = 0;

  qsort (v->ptr, v->len, sizeof v->ptr[0], span_cmp_start);
  for (i = 0; i < v->len; ++i) {
    struct span *last = n ? &v->ptr[n - 1] : NULL;

    if (last && spans_touch (last, v->ptr[i].start, v->ptr[i].end))
      span_absorb (last, &v->ptr[i]);
    else
      v->ptr[n++] = v->ptr[i];
  }
  v->len = n;
}

/* Add sp, a rewrite over a recorded loss, to a heal set.  When the
 * set is full, spans that touch are first merged whatever their
 * sequence numbers (heal_coalesce): the union of rewrites is exactly the
 * bytes they wrote, and it heals with its oldest member's number
 * (seq_lo, sync_healed), which each member is at least, so it heals no
 * loss that one of them could not; a loss newer than some members and
 * older than others then stays until a later rewrite (over-reported,
 * never under: counted as widened).  So a range rewritten in many small
 * writes, as a kernel writes pages, keeps healing; only SPAN_CAP
 * disjoint rewrites widen the set to a hull, which heals nothing.
 * Returns true if precision was lost.
 */
static bool
heal_add (span_vector *v, struct span sp)
{
  size_t before = v->len;

  if (before + 1 == SPAN_CAP && v->ptr[0].extent == SPAN_EXACT) {
    heal_coalesce (v);
    if (v->len < before) {
      span_add (v, sp);         /* Room now: cannot widen. */
      return true;
    }
  }
  return span_add (v, sp);
}

/* Take [start, end) out of every span of v older than seq (seq_hi <
 * seq): a newer mutation there succeeded.  A span cut in two needs one
 * more entry; at SPAN_CAP it stays whole (over-reports, never under):
 * returns true then.
 */
static bool
span_cut (span_vector *v, uint64_t start, uint64_t end, uint64_t seq)
{
  bool whole = false;
  size_t i = 0;

  while (i < v->len) {
    struct span *sp = &v->ptr[i];

    if (sp->end <= start || end <= sp->start || sp->seq_hi >= seq)
      i++;
    else if (start <= sp->start && sp->end <= end)
      *sp = v->ptr[--v->len];   /* Healed whole; look at the moved one. */
    else if (sp->start < start && end < sp->end) {
      if (v->len + 1 < SPAN_CAP) {      /* span_add's room stays. */
        struct span right = *sp;

        right.start = end;
        sp->end = start;
        v->ptr[v->len++] = right;
      }
      else
        whole = true;
      i++;
    }
    else {
      if (sp->start < start)
        sp->end = start;
      else
        sp->start = end;
      i++;
    }
  }
  return whole;
}

/* Acknowledged data of file b is lost: sp, with the errno a FLUSH
 * that covers it answers.
 */
void
record_add (struct engine *e, uint32_t b, struct span sp)
{
  struct eng_file *f = &e->files[b];
  size_t before = f->lost.len;
  char buf[32];

  if (span_add (&f->lost, sp)) {
    e->widened++;
    eng_log (e, 0, "file=%s: more than %d ranges of lost data: recorded "
             "as one, [%" PRIu64 ", %" PRIu64 "): FLUSHes fail until it "
             "is all written again", file_name (e, b, buf, sizeof buf),
             SPAN_CAP, f->lost.ptr[0].start, f->lost.ptr[0].end);
  }
  e->nr_lost_spans = e->nr_lost_spans - before + f->lost.len;
}

/* A mutation with sequence number seq succeeded over [start, end) of
 * file b: what it overwrote is no longer lost.
 */
static void
record_heal (struct engine *e, uint32_t b, uint64_t start, uint64_t end,
             uint64_t seq)
{
  struct eng_file *f = &e->files[b];
  size_t before = f->lost.len;

  if (before == 0)
    return;
  if (span_cut (&f->lost, start, end, seq))
    e->widened++;
  e->nr_lost_spans = e->nr_lost_spans - before + f->lost.len;
}

/* What a FLUSH with this horizon answers: the errno of a recorded loss
 * of a mutation it covers, or 0.
 */
static int
record_check (const struct engine *e, uint64_t horizon)
{
  uint32_t b;
  size_t i;

  if (e->nr_lost_spans == 0)
    return 0;
  for (b = 0; b < e->cfg.nr_backings; ++b)
    for (i = 0; i < e->files[b].lost.len; ++i)
      if (e->files[b].lost.ptr[i].seq_lo <= horizon)
        return e->files[b].lost.ptr[i].err;
  return 0;
}

/* What a FUA mutation answers once synced: the errno of a recorded loss
 * over one of its pieces, as old as it or older, or 0.
 */
static int
record_check_op (const struct engine *e, const struct eng_op *op)
{
  size_t i, k;

  if (e->nr_lost_spans == 0)
    return 0;
  for (i = 0; i < op->nr_pieces; ++i) {
    const struct plug_piece *p = &op->pieces[i];
    const span_vector *v = &e->files[p->backing].lost;

    for (k = 0; k < v->len; ++k)
      if (v->ptr[k].seq_lo <= op->seq &&
          v->ptr[k].start < p->offset + p->count &&
          p->offset < v->ptr[k].end)
        return v->ptr[k].err;
  }
  return 0;
}

/* Take the exact spans of mutation seq out of v; returns how many. */
static size_t
span_forget (span_vector *v, uint64_t seq)
{
  size_t k, n = 0;

  for (k = 0; k < v->len; )
    if (v->ptr[k].extent == SPAN_EXACT && v->ptr[k].seq_lo == seq &&
        v->ptr[k].seq_hi == seq) {
      v->ptr[k] = v->ptr[--v->len];
      n++;
    }
    else
      k++;
  return n;
}

/* A mutation whose client waited (FUA, hold mode, the direct path) is
 * answered with an error: its data was not acknowledged, so no FLUSH
 * answers for it (NBD: a FLUSH covers writes "for which a reply has
 * already been sent" with success).  Its own spans, recorded when a
 * sync failed after it (or a piece of it) was written, leave the
 * record; what older writes lost there stays.  Its pieces written
 * leave the written sets too, so that a sync failing later does not
 * record them (the rewrites among them still heal: the disk holds them
 * over what they overwrote).  Called with every such answer: from its
 * sync (sync_answer), or when its last piece finished and one had
 * failed (op_finish).
 */
static void
record_forget_op (struct engine *e, const struct eng_op *op)
{
  size_t i;

  for (i = 0; i < op->nr_pieces; ++i) {
    struct eng_file *f = &e->files[op->pieces[i].backing];

    e->nr_lost_spans -= span_forget (&f->lost, op->seq);
    span_forget (&f->written, op->seq);
    span_forget (&f->syncing, op->seq);
  }
}

static bool
needs_sync (const struct eng_file *f)
{
  return f->written.len > 0 || f->sync_state == SYNC_NEVER;
}

/* Which round of syncs must a waiter whose writes all finished wait
 * for?  A file written since its last sync began needs a new one: the
 * next round (one round is in flight at a time, so the waiters that
 * come meanwhile share the next one: blk-flush's pending flushes).
 * With nothing written since, the round in flight covers everything,
 * and with none in flight nothing is left to sync: 0.
 */
static uint64_t
round_needed (const struct engine *e)
{
  uint32_t b;

  for (b = 0; b < e->cfg.nr_backings; ++b)
    if (needs_sync (&e->files[b]))
      return e->sync_round + 1;
  return e->sync_pending > 0 ? e->sync_round : 0;
}

/* What op answers once synced.  A FLUSH: whether its horizon reaches
 * a recorded loss; a FUA mutation: its own error, or a loss over its
 * own range; the exit: any loss not written again.
 */
static void
sync_answer (struct engine *e, struct eng_op *op, struct eng_actions *out)
{
  int err;

  switch (op->kind) {
  case ENG_FLUSH:
    err = record_check (e, op->horizon);
    stats_unflushed_flush_end (&e->unflushed, &op->flush_mark, err == 0);
    break;
  case ENG_SHUTDOWN:
    err = record_check (e, UINT64_MAX);
    stats_unflushed_flush_end (&e->unflushed, &op->flush_mark, err == 0);
    break;
  default:
    err = op->err ? op->err : record_check_op (e, op);
    if (err)
      record_forget_op (e, op);
    break;
  }
  op_answer (e, op, err, out);
  op_release (e, op, out);
}

static void round_done (struct engine *e, uint64_t now,
                        struct eng_actions *out);

/* Begin the next round: sync every file written since its last sync
 * began.  Its syncs are counted on the first waiter's connection.
 */
static void
start_round (struct engine *e, struct plug_stats *stats, uint64_t now,
             struct eng_actions *out)
{
  uint32_t b;

  assert (e->sync_pending == 0);
  e->sync_round++;
  for (b = 0; b < e->cfg.nr_backings; ++b) {
    struct eng_file *f = &e->files[b];
    span_vector t;

    if (!needs_sync (f))
      continue;
    assert (f->sync_state != SYNC_INFLIGHT && f->syncing.len == 0 &&
            f->heals_syncing.len == 0);
    t = f->syncing;
    f->syncing = f->written;
    f->written = t;
    t = f->heals_syncing;
    f->heals_syncing = f->heals;
    f->heals = t;
    f->sync_state = SYNC_INFLIGHT;
    f->sync.backing = b;
    list_add_tail (&out->sync, &f->sync.link);
    e->sync_pending++;
    f->counts.syncs++;
    if (stats)
      stats_count (&stats->backend[STATS_B_SYNC], 0);
  }
  if (e->sync_pending == 0)
    round_done (e, now, out);
}

/* Every sync of the round in flight is done: answer its waiters, and
 * begin the next round for those that need it.
 */
static void
round_done (struct engine *e, uint64_t now, struct eng_actions *out)
{
  struct eng_op *op;

  while ((op = wait_first (&e->sync_wait)) != NULL &&
         op->sync_round <= e->sync_round) {
    list_del (&op->wait);
    if (op->conn)
      STATS_ADD (op->conn->stats->synced_answers, 1);
    sync_answer (e, op, out);
  }
  if (op != NULL)
    start_round (e, op->conn ? op->conn->stats : NULL, now, out);
}

/* op's writes all finished (a FLUSH at its horizon, a FUA mutation
 * written, the exit): answer it once the files are synced.
 */
void
wait_sync (struct engine *e, struct eng_op *op, uint64_t now,
           struct eng_actions *out)
{
  uint64_t need = round_needed (e);

  if (need == 0) {
    sync_answer (e, op, out);
    return;
  }
  op_set_state (e, op, OP_SYNC_WAIT);
  op->sync_round = need;
  list_add_tail (&e->sync_wait, &op->wait);
  if (e->sync_pending == 0)
    start_round (e, op->conn ? op->conn->stats : NULL, now, out);
}

/* A sync failed: what it covered, and what was written since (Linux
 * reports a writeback error once per open file, so the next sync may
 * succeed over pages that were lost meanwhile), is lost.
 */
static void
sync_failed (struct engine *e, uint32_t b, int err, uint64_t now)
{
  struct eng_file *f = &e->files[b];
  const span_vector *sets[2] = { &f->syncing, &f->written };
  size_t i, k, n = 0;
  char buf[32];

  for (k = 0; k < 2; ++k)
    for (i = 0; i < sets[k]->len; ++i) {
      struct span sp = sets[k]->ptr[i];

      sp.err = err;
      record_add (e, b, sp);
      n++;
    }
  /* The rewrites it covered, and those written since, are lost too:
   * they heal nothing.
   */
  f->heals.len = 0;
  eng_log (e, 0, "file=%s: sync failed: %s: %zu range%s written since "
           "the last successful sync recorded as lost",
           file_name (e, b, buf, sizeof buf), strerror (err), n,
           n == 1 ? "" : "s");
}

/* A sync succeeded: what it covered is on stable storage, and the
 * rewrites among it heal the losses they overwrote.  Only then: a FLUSH
 * that covers a lost write, and not its rewrite, may succeed only if
 * the rewrite, newer, is on the disk in its place.  A span heals with
 * its oldest member's number (heal_add merges rewrites); a widened span
 * heals nothing (it names more than was written).
 */
static void
sync_healed (struct engine *e, uint32_t b)
{
  const span_vector *v = &e->files[b].heals_syncing;
  size_t i;

  for (i = 0; i < v->len && e->files[b].lost.len > 0; ++i)
    if (v->ptr[i].extent == SPAN_EXACT)
      record_heal (e, b, v->ptr[i].start, v->ptr[i].end, v->ptr[i].seq_lo);
}

void
engine_sync_done (struct engine *e, struct eng_sync *s, int err,
                  uint64_t now, struct eng_actions *out)
{
  struct eng_file *f = &e->files[s->backing];

  assert (f->sync_state == SYNC_INFLIGHT && e->sync_pending > 0);
  f->sync_state = SYNC_IDLE;
  if (err)
    sync_failed (e, s->backing, err, now);
  else
    sync_healed (e, s->backing);
  f->syncing.len = 0;
  f->heals_syncing.len = 0;
  if (--e->sync_pending == 0)
    round_done (e, now, out);
  check_waiters (e, now, out);
}

void
engine_record_lost (struct engine *e, uint32_t b, uint64_t offset,
                    uint64_t count, uint64_t seq_lo, uint64_t seq_hi, int err)
{
  struct span sp = {
    .start = offset, .end = offset + count,
    .seq_lo = seq_lo, .seq_hi = seq_hi, .err = err,
  };

  record_add (e, b, sp);
}

/* Every piece of mutation op finished. */
static void
op_finish (struct engine *e, struct eng_op *op, uint64_t now,
           struct eng_actions *out)
{
  struct eng_conn *c = op->conn, *o;

  list_unlink (&op->unf);
  c->nr_unfinished--;
  c->bytes -= op->bytes;
  e->bytes -= op->bytes;
  if (op->state == OP_ACKED) {
    c->nr_told_ok--;
    if (op->err) {
      /* Nobody can be told now: its pieces are in THE RECORD
       * (run_finish), which every FLUSH that covers them reports.
       */
      e->lost++;
      STATS_ADD (c->stats->lost, 1);
      list_for_each (o, &e->conns, link)
        o->last_err = op->err;
    }
  }
  else if (op->err) {
    /* Answered with the error below, so never acknowledged: a failed
     * sync may have recorded its pieces written before the one that
     * failed, and no FLUSH answers for them (record_forget_op).
     */
    c->last_err = op->err;
    record_forget_op (e, op);
  }
  if ((op->flags & ENG_F_FUA) && op->state == OP_ADMITTED && op->err == 0) {
    /* NBD: FUA "MUST NOT send its reply ... until ... persisted". */
    wait_sync (e, op, now, out);
    return;
  }
  if (op->state == OP_ADMITTED) {
    /* Its client waited for it. */
    if (op->err == 0)
      note_acked (e, op, now);
    op_answer (e, op, op->err, out);
  }
  op_release (e, op, out);
}

/* Does [start, end) of file f overlap a recorded loss? */
static bool
overlaps_lost (const struct eng_file *f, uint64_t start, uint64_t end)
{
  size_t i;

  for (i = 0; i < f->lost.len; ++i)
    if (f->lost.ptr[i].start < end && start < f->lost.ptr[i].end)
      return true;
  return false;
}

/* Run r was written: its file needs a sync before a FLUSH may count on
 * it.  A member over a recorded loss is a rewrite: once a sync covered
 * it, what it overwrote is no longer lost (sync_healed).  Each member
 * counts with its own sequence number: a loss newer than a member
 * stays, and a sync that fails records each member as the mutation it
 * was.  The rewrites are kept apart from the written set, which a busy
 * client fills to its cap: a rewrite among thousands of writes heals
 * all the same.
 */
static void
note_written (struct engine *e, const struct eng_run *r)
{
  struct eng_file *f = &e->files[r->run->backing];
  size_t i;

  for (i = 0; i < r->run->n; ++i) {
    const struct plug_piece *p = r->run->reqs[i];
    struct span sp = {
      .start = p->offset, .end = p->offset + p->count,
      .seq_lo = p->seq, .seq_hi = p->seq, .extent = SPAN_EXACT,
    };

    if (span_add (&f->written, sp))
      e->widened++;
    if (f->lost.len > 0 && overlaps_lost (f, sp.start, sp.end) &&
        heal_add (&f->heals, sp))
      e->widened++;
  }
}

/* blk-flush's FUA shortcut: a file to which the FLUSH's unplugs (one
 * batch per connection, numbered from first_batch on, the newest runs
 * of its queue) made exactly one run may get that run written with FUA
 * instead of a sync after it.  Two or more runs, from one plug or
 * several, stay plain: one sync covers them all, where FUA could cost
 * the server one sync each.  The runs are queued or about to be issued
 * (out): nothing has read the mark yet.
 */
static void
mark_flush_fua (struct engine *e, uint64_t first_batch)
{
  uint32_t b;

  for (b = 0; b < e->cfg.nr_backings; ++b) {
    list_head *q = &e->files[b].queue;
    struct eng_run *last = list_last (q, struct eng_run, qlink), *prev;

    if (last == NULL || last->batch < first_batch)
      continue;
    prev = list_prev (q, last, qlink);
    if (prev == NULL || prev->batch < first_batch)
      last->flush_fua = true;
  }
}

void
submit_flush (struct engine *e, struct eng_conn *c, struct eng_op *op,
              uint64_t now, struct eng_actions *out)
{
  struct eng_conn *o;
  uint64_t first_batch = e->next_batch;

  op->horizon = e->next_seq - 1;
  c->nr_waiting++;
  stats_unflushed_flush_begin (&e->unflushed, &op->flush_mark);
  /* Hold mode: every answered write is already written, and NBD's FLUSH
   * covers only answered writes: syncing the files (the caller) is all
   * it needs.  It must not wait for other requests in flight.
   */
  if (e->cfg.mode == ENG_HOLD) {
    wait_sync (e, op, now, out);
    return;
  }
  /* blk_finish_plug on every plug: with multi-conn, a FLUSH covers what
   * any connection acknowledged.
   */
  list_for_each (o, &e->conns, link)
    conn_unplug (e, o, PLUG_UNPLUG_FLUSH, now, out);
  mark_flush_fua (e, first_batch);
  dispatch_all (e, now, true, out);
  op_set_state (e, op, OP_WAITING);
  list_add_tail (&e->flush_wait, &op->wait);
  check_waiters (e, now, out);
}

/* Must read op wait?  Yes while a mutation admitted before it and
 * overlapping it is unfinished: queued or in flight, or still held (its
 * plug could not be unplugged for lack of memory).
 */
bool
read_blocked (const struct engine *e, const struct eng_op *op)
{
  size_t i;

  for (i = 0; i < op->nr_pieces; ++i) {
    const struct plug_piece *p = &op->pieces[i];

    if (queue_overlaps (e, p->backing, p->offset, p->count, op->horizon) ||
        held_before (e, p, op->horizon))
      return true;
  }
  return false;
}

void
submit_read (struct engine *e, struct eng_conn *c, struct eng_op *op,
             uint64_t now, struct eng_actions *out)
{
  size_t i;

  op->conn = c;
  op->horizon = e->next_seq - 1;
  c->nr_waiting++;
  /* One that cannot go out keeps the read waiting (read_blocked). */
  for (i = 0; i < op->nr_pieces; ++i)
    (void) unplug_overlapping (e, &op->pieces[i], PLUG_UNPLUG_READ, now,
                               out);
  if (!read_blocked (e, op)) {
    op_answer (e, op, 0, out);
    op_release (e, op, out);
    return;
  }
  op_set_state (e, op, OP_WAITING);
  list_add_tail (&e->read_wait, &op->wait);
  check_parked (e, c, now, out);
}

/* Run r is done with err (0: written).  It leaves its queue, and its
 * members finish.
 */
void
run_finish (struct engine *e, struct eng_run *r, int err, uint64_t now,
            struct eng_actions *out)
{
  size_t i;

  run_dequeue (e, r);
  if (err == 0)
    note_written (e, r);

  for (i = 0; i < r->run->n; ++i) {
    struct plug_piece *p = r->run->reqs[i];
    struct eng_op *op = p->opaque;
    uint64_t held = now > p->arrival_ns ? now - p->arrival_ns : 0;

    STATS_ADD (op->conn->stats->held_total_ns, held);
    stats_max (&op->conn->stats->held_max_ns, held);
    if (err && op->err == 0)
      op->err = err;
    if (err && op->state == OP_ACKED) {
      struct span sp = {
        .start = p->offset, .end = p->offset + p->count,
        .seq_lo = p->seq, .seq_hi = p->seq, .err = err,
      };

      record_add (e, p->backing, sp);
    }
    assert (op->pending > 0);
    if (--op->pending == 0)
      op_finish (e, op, now, out);
  }
  run_free (r);
}
