/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine-int.h: what the engine's rooms share (private to src/engine*.c).
 *
 * engine.c         the entry points: engine_submit, engine_complete,
 *                  engine_tick and the accessors.
 * engine-admit.c   admission and plugging.
 * engine-queue.c   the per-file dispatch queues.
 * engine-durable.c THE RECORD, syncs, FLUSH and read horizons.
 * engine-direct.c  the direct path.
 * engine-pace.c    hold mode's pacing.
 * engine-life.c    connections, close, exit, waiting ops, deadlines.
 * engine-state.c   the state machines' tables and their log.
 */
#ifndef NBDPLUG_ENGINE_INT_H
#define NBDPLUG_ENGINE_INT_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "list.h"
#include "ratelimit.h"
#include "vector.h"

/* Acknowledged-but-unfinished mutations allowed per connection, as a
 * multiple of max-requests: zeros and trims carry no data, so max-bytes
 * alone would not bound them.
 */
#define ACKED_PER_MAX_REQUEST 4

/* How far back a connection remembers where its requests went, for the
 * direct path: a request near none of the last NR_RECENT could not merge.
 */
#define NR_RECENT 16

/* A range of a backing file and the sequence numbers of the mutations
 * that last wrote it, [seq_lo, seq_hi]: an entry of a file's record of
 * lost data, or of its set of ranges written since a sync.
 */
enum span_extent {
  SPAN_EXACT,                   /* What its mutations wrote. */
  SPAN_WIDENED,                 /* The hull of spans past SPAN_CAP: more
                                 * than they wrote. */
};

struct span {
  uint64_t start, end;          /* Bytes [start, end) of the file. */
  uint64_t seq_lo, seq_hi;
  int err;                      /* The record: what a FLUSH answers. */
  enum span_extent extent;
};
DEFINE_VECTOR_TYPE (span_vector, struct span)

/* Entries a file's record (or one of its written sets) keeps before it
 * widens them to one: bounded memory, at the price of over-reporting
 * (the record) or of recording more as lost when a sync fails (the
 * written sets), never of under-reporting.
 */
#define SPAN_CAP 256

/* A plug goes out at 1/ENG_PLUG_SHARE of max-bytes, the memory bound
 * of a connection's copies (the role of the kernel's
 * BLK_PLUG_FLUSH_SIZE): one batch is written while the next one fills,
 * and both fit in max-bytes.  A plug that went out at max-bytes itself
 * would leave the next writer waiting for memory until its batch was
 * written.
 */
#define ENG_PLUG_SHARE 2

/* A file's sync (engine_sync_done).  One at a time per file: a sync
 * covers what was written before it began, so a FLUSH that finds one
 * running after its writes finished needs the next one (the kernel's
 * blk-flush keeps one flush in flight per queue and merges the flushes
 * that wait meanwhile into the next).
 */
enum sync_state {
  SYNC_NEVER,                   /* Not synced since the engine was made:
                                 * the first round syncs it, written or
                                 * not (it may hold what another process
                                 * wrote before us). */
  SYNC_IDLE,
  SYNC_INFLIGHT,                /* Its eng_sync was given to the caller. */
};

/* A backing file's dispatch queue (the blk-mq hardware queue). */
enum file_state {
  FILE_RUNNING,                 /* Dispatch whenever a slot is free. */
  FILE_DELAYED,                 /* "Not now" with nothing in flight: run
                                 * again at delay_until. */
  FILE_STALLED,                 /* "Not now" with runs in flight: run
                                 * again when one of them completes. */
};

struct eng_file {
  list_head queue;              /* Unfinished runs, creation order, by
                                 * qlink. */
  struct itree index;           /* The same runs, by offset. */
  uint64_t nr_blocked;          /* Runs in RUN_BLOCKED: none, and a
                                 * finishing run has nobody to release. */
  list_head ready;              /* RUN_READY runs, in the order they go
                                 * out, by ready_link. */
  unsigned inflight;
  unsigned max_inflight;
  enum eng_direct_rule direct_rule;
  uint64_t nr_queued;
  enum file_state state;
  uint64_t delay_until;
  struct retry_state retry;     /* Backoff of the queue. */
  struct ratelimit log;         /* Error lines about its runs. */
  struct {                      /* For the statistics (any caller's
                                 * snapshot, under its lock). */
    uint64_t not_now, errors, runs, bytes, syncs;
  } counts;

  /* DURABILITY. */
  span_vector lost;             /* THE RECORD: acknowledged data that
                                 * failed for good and was not written
                                 * again since.  Overlaps allowed. */
  span_vector written;          /* Written since the last sync began. */
  span_vector syncing;          /* Written before the sync in flight
                                 * began: what it covers. */
  span_vector heals;            /* Of written, the writes over a range
                                 * then lost: they heal it once synced. */
  span_vector heals_syncing;    /* Of syncing, the same. */
  enum sync_state sync_state;
  struct eng_sync sync;         /* The action, while SYNC_INFLIGHT. */
};

enum conn_state {
  CONN_OPEN,
  CONN_CLOSING,                 /* ENG_CLOSE submitted. */
};

/* Hold mode: how a connection paces its plug.  In hold mode every
 * held request parks a worker and its client, so holding pays only
 * where the backend is the bottleneck: what arrives while a run is
 * written is what merging gains.
 */
enum conn_pace {
  PACE_PLUG,                    /* Wait for idle= (or another trigger). */
  PACE_PASSTHROUGH,             /* The client has one request in flight:
                                 * waiting could never merge anything, it
                                 * only adds latency.  Unplug at once. */
  PACE_BUSY,                    /* The backend answers long before the
                                 * client comes back: unplug at once when
                                 * nothing of the connection is in flight,
                                 * else when that finishes (requests merge
                                 * only while the backend is busy, like
                                 * the kernel's queue of a busy device). */
};

struct eng_conn {
  struct engine *e;
  uint64_t id;                  /* engine_conn_set_id: for messages. */
  struct list_node link;        /* e->conns. */
  struct plug_stats *stats;     /* Borrowed from the caller. */
  enum conn_state state;
  enum conn_pace pace;
  unsigned lone_streak;
  unsigned pace_streak;         /* Toward the other of PLUG and BUSY. */
  size_t last_gathered;         /* PACE_BUSY: held at the last drain
                                 * that found any. */
  uint64_t last_svc_ns;         /* Issue to completion of the last run. */
  uint64_t drained_ns;          /* When nr_runs last dropped to 0. */

  struct plug plug;
  uint64_t last_activity_ns;
  uint64_t unplug_retry_ns;     /* After an unplug ran out of memory. */

  uint64_t bytes;               /* Copied bytes not released. */
  uint64_t nr_told_ok;          /* Acknowledged, unfinished. */
  uint64_t nr_unfinished;       /* Admitted mutations not finished. */
  uint64_t nr_runs;             /* Runs queued or in flight. */
  unsigned nr_workers;
  unsigned nr_waiting;          /* Ops whose client waits for an answer. */
  list_head mem_wait;           /* OP_WAIT_MEMORY, FIFO, by wait. */
  struct eng_op *close_op;

  int last_err;                 /* Last failure, for refused writers. */

  uint64_t recent_start[NR_RECENT], recent_end[NR_RECENT];
  unsigned recent_pos;
};

/* The state machines (see "the state machines" below). */
enum eng_machine {
  ENG_M_OP, ENG_M_RUN, ENG_M_FILE, ENG_M_PACE, ENG_M_CONN, ENG_M_ENGINE,
  ENG_NR_MACHINES
};
#define ENG_MAX_STATES 8

enum engine_state {
  ENGINE_RUNNING,
  ENGINE_SHUTTING_DOWN,         /* ENG_SHUTDOWN submitted. */
};

struct engine {
  struct eng_config cfg;
  enum engine_state state;
  struct eng_file *files;       /* Owned: [nr_backings]. */
  list_head conns;              /* struct eng_conn, by link. */
  uint64_t next_seq;            /* Sequence numbers start at 1. */
  uint64_t next_batch;
  list_head unfinished;         /* Unfinished mutations, by unf. */
  list_head flush_wait;         /* By horizon, by wait. */
  list_head read_wait;          /* By wait. */
  struct eng_op *shutdown_op;
  uint64_t bytes;
  uint64_t lost;
  uint64_t order_checks;        /* See struct eng_counts. */
  uint64_t widened;             /* See struct eng_counts. */
  size_t run_prefix;
  /* What every connection's plug is made with: cfg.lim, but unplugging
   * at max_bytes / ENG_PLUG_SHARE.  cfg.lim.max_bytes stays the memory
   * bound of a connection's copies (over_memory).
   */
  struct plug_limits plug_lim;
  uint64_t nr_lost_spans;       /* Entries in every file's record. */
  uint64_t sync_round;          /* Rounds of syncs begun. */
  unsigned sync_pending;        /* Syncs of the last round not done; 0:
                                 * no round in flight. */
  list_head sync_wait;          /* OP_SYNC_WAIT, by sync_round, by wait. */
  bool deadline_earlier;        /* See engine_deadline_may_be_earlier. */
  uint64_t unplugs_tried;       /* For cfg.inject_unplug_nomem. */
  struct stats_unflushed unflushed;     /* See stats.h. */
  uint64_t next_op_id, next_run_id;     /* For the state log. */
  /* Of the waiters check_waiters looks for on every connection:
   * writers on the connections' mem_wait lists, and connections with
   * a close_op.  None (the common case): it need not walk them.
   */
  uint64_t nr_mem_waiting;
  unsigned nr_closing;
  /* Each machine's table of legal transitions (engine-state.c) when
   * nobody listens to the state log, and none when somebody does
   * (eng_state_init): see eng_state_change.
   */
  uint32_t quiet_legal[ENG_NR_MACHINES][ENG_MAX_STATES];
};

/* ---- the state machines (engine-state.c) ----
 *
 * Each machine (op, run, file queue, pace, connection, engine) changes
 * state in its one function below, which asserts that the change is in
 * the machine's table of legal transitions and tells cfg.state_log of
 * it ("run 5: READY -> INFLIGHT").  A change to the state it is in is
 * no change for the file queue, the pace, the connection and the
 * engine (their triggers may repeat: every dispatch runs a file's
 * queue); for an op or a run it is illegal.
 */

/* Fill e->quiet_legal (engine_new, once cfg is set). */
extern void eng_state_init (struct engine *e);

/* A change e->quiet_legal does not let through: asserted against the
 * machine's table, and told to cfg.state_log if set.
 */
extern void eng_state_slow (struct engine *e, enum eng_machine m,
                            uint64_t id, unsigned from, unsigned to);

/* A legal change that nobody listens to costs one test of
 * e->quiet_legal: every request makes half a dozen.  Any other one
 * (illegal, or logged) goes out of line.
 */
static inline void
eng_state_change (struct engine *e, enum eng_machine m, uint64_t id,
                  unsigned from, unsigned to)
{
  if (__builtin_expect (!(e->quiet_legal[m][from] & (1u << to)), 0))
    eng_state_slow (e, m, id, from, to);
}

static inline void
op_set_state (struct engine *e, struct eng_op *op, enum eng_op_state to)
{
  eng_state_change (e, ENG_M_OP, op->id, op->state, to);
  op->state = to;
}

static inline void
run_set_state (struct engine *e, struct eng_run *r, enum eng_run_state to)
{
  eng_state_change (e, ENG_M_RUN, r->id, r->state, to);
  r->state = to;
}

static inline void
file_set_state (struct engine *e, struct eng_file *f, enum file_state to)
{
  if (f->state == to)
    return;
  eng_state_change (e, ENG_M_FILE, (uint64_t) (f - e->files), f->state,
                    to);
  f->state = to;
}

static inline void
pace_set (struct engine *e, struct eng_conn *c, enum conn_pace to)
{
  if (c->pace == to)
    return;
  eng_state_change (e, ENG_M_PACE, c->id, c->pace, to);
  c->pace = to;
}

static inline void
conn_set_state (struct engine *e, struct eng_conn *c, enum conn_state to)
{
  if (c->state == to)
    return;
  eng_state_change (e, ENG_M_CONN, c->id, c->state, to);
  c->state = to;
}

static inline void
engine_set_state (struct engine *e, enum engine_state to)
{
  if (e->state == to)
    return;
  eng_state_change (e, ENG_M_ENGINE, 0, e->state, to);
  e->state = to;
}

/* An op's life begins (engine_submit, engine_try_direct): NEW, with a
 * number for the state log.  Not a transition: the caller may hand
 * the engine an op it used before.
 */
static inline void
op_begin (struct engine *e, struct eng_op *op)
{
  op->state = OP_NEW;
  op->id = ++e->next_op_id;
}

/* A run is made (an unplug, a piece of the direct path or of a split):
 * RUN_NEW, with a number.
 */
static inline void
run_made (struct engine *e, struct eng_run *r)
{
  r->state = RUN_NEW;
  r->id = ++e->next_run_id;
}

/* ---- small helpers, inline: on every request's path ---- */

/* A deadline appeared, or came nearer: engine_next_deadline may be
 * earlier than when the caller last asked.
 */
static inline void
deadline_earlier (struct engine *e)
{
  e->deadline_earlier = true;
}

/* The first op waiting on l, or NULL. */
static inline struct eng_op *
wait_first (list_head *l)
{
  return list_first (l, struct eng_op, wait);
}

static inline void
act_issue (struct eng_actions *out, struct eng_run *r)
{
  list_add_tail (&out->issue, &r->issue_link);
}

/* Put op on the reply list with err: its client waited (counted in
 * nr_waiting when it was submitted) and is answered now.
 */
static inline void
op_reply (struct eng_op *op, int err, struct eng_actions *out)
{
  if (op->conn)
    op->conn->nr_waiting--;
  op->err = err;
  list_add_tail (&out->reply, &op->reply_link);
}

/* Answer op's waiting client with err: ANSWERED (the transition says
 * the client waited).
 */
static inline void
op_answer (struct engine *e, struct eng_op *op, int err,
           struct eng_actions *out)
{
  op_set_state (e, op, OP_ANSWERED);
  op_reply (op, err, out);
}

/* The engine is done with op (answered, or acknowledged before it
 * finished): the caller frees it.
 */
static inline void
op_release (struct engine *e, struct eng_op *op, struct eng_actions *out)
{
  op_set_state (e, op, OP_FINISHED);
  list_add_tail (&out->release, &op->release_link);
}

static inline struct eng_run *
run_of (struct plug_run *pr)
{
  return plug_run_prefix (pr);
}

static inline void
run_free (struct eng_run *r)
{
  plug_run_free (r->run);
}

/* The oldest unfinished mutation, or NULL. */
static inline const struct eng_op *
unf_oldest (const struct engine *e)
{
  return list_first (&e->unfinished, struct eng_op, unf);
}

/* The run whose index node is node. */
static inline struct eng_run *
run_of_node (struct itree_node *node)
{
  return itree_entry (node, struct eng_run, node);
}

static inline bool
held_anywhere (const struct engine *e, const struct plug_piece *p)
{
  const struct eng_conn *c;

  list_for_each (c, &e->conns, link)
    if (plug_conflicts (&c->plug, p))
      return true;
  return false;
}

/* Are op's pieces ranges the plug and the indexes can hold: at least
 * one (a read may have none), each of a file that exists, not empty,
 * and ending before 2^64?
 * (nbdkit refuses empty requests and the layout keeps offsets within
 * the files; the engine does not rely on either.)
 */
static inline bool
pieces_valid (const struct engine *e, const struct eng_op *op)
{
  size_t i;

  if (op->nr_pieces == 0 && op->kind != ENG_READ)
    return false;
  for (i = 0; i < op->nr_pieces; ++i) {
    const struct plug_piece *p = &op->pieces[i];

    if (p->backing >= e->cfg.nr_backings || p->count == 0 ||
        p->count > UINT64_MAX - p->offset)
      return false;
  }
  return true;
}

static inline void
prepare_pieces (struct eng_conn *c, struct eng_op *op, uint64_t now)
{
  size_t i;

  op->conn = c;
  op->pending = op->nr_pieces;
  for (i = 0; i < op->nr_pieces; ++i) {
    op->pieces[i].opaque = op;
    op->pieces[i].arrival_ns = now;
  }
}

/* op is admitted: its sequence number, and the counts that op_finish
 * takes it off again (unfinished, copied bytes).  Plugged (admit) or
 * issued alone (issue_alone), the same.
 */
static inline void
take_in (struct engine *e, struct eng_conn *c, struct eng_op *op,
         enum eng_op_state to, uint64_t now)
{
  op_set_state (e, op, to);
  op->seq = e->next_seq++;
  list_add_tail (&e->unfinished, &op->unf);
  c->nr_unfinished++;
  c->bytes += op->bytes;
  e->bytes += op->bytes;
  c->last_activity_ns = now;
}

/* Runs are never empty and end before 2^64 (pieces_valid). */
static inline void
index_add (struct eng_file *f, struct eng_run *r)
{
  r->node.start = r->run->offset;
  r->node.end = r->run->offset + r->run->count;
  itree_insert (&f->index, &r->node);
}

/* Run r takes the queue's tail and the index, RUN_BLOCKED by nothing
 * yet: the caller counts its blockers (conn_unplug) or knows there are
 * none (the direct path), and then calls set_blockers.
 */
static inline void
queue_append (struct engine *e, struct eng_run *r)
{
  struct eng_file *f = &e->files[r->run->backing];

  run_set_state (e, r, RUN_BLOCKED);
  f->nr_blocked++;
  r->nr_blockers = 0;
  list_init (&r->ready_link);
  list_add_tail (&f->queue, &r->qlink);
  index_add (f, r);
  f->nr_queued++;
  /* A delayed file's timer runs only while something is queued: its
   * queue emptied by a close's or the exit's deadline (fail_queued),
   * the delay's timer comes back with this run.  (A split's pieces
   * never land in a delayed file: a run completes only in a file that
   * dispatched, which makes it FILE_RUNNING.)
   */
  if (f->state == FILE_DELAYED && f->nr_queued == 1)
    deadline_earlier (e);
  r->conn->nr_runs++;
}

static inline void
run_start (struct engine *e, struct eng_file *f, struct eng_run *r,
           uint64_t now, struct eng_actions *out)
{
  run_set_state (e, r, RUN_INFLIGHT);
  r->issued_ns = now;
  f->nr_queued--;
  f->inflight++;
  act_issue (out, r);
}

static inline bool
holds_seq_at_most (struct itree_node *node, void *opaque)
{
  return run_of_node (node)->min_seq <= *(const uint64_t *) opaque;
}

/* Does any unfinished run of file b overlap [offset, offset+count)?
 * With max_seq != UINT64_MAX, only runs holding a mutation at least as
 * old as that.
 */
static inline bool
queue_overlaps (const struct engine *e, uint32_t b, uint64_t offset,
                uint64_t count, uint64_t max_seq)
{
  /* Not QUEUE ORDER's steps: not counted. */
  return itree_overlapping (&e->files[b].index, offset, offset + count,
                            holds_seq_at_most, &max_seq, NULL);
}

static inline bool
flush_ready (const struct engine *e, const struct eng_op *op)
{
  const struct eng_op *oldest = unf_oldest (e);

  return oldest == NULL || oldest->seq > op->horizon;
}

/* A run of one piece (the direct path, a fast zero, a failed merged run
 * split up), with the engine's header in front as plug_merge makes
 * them.  Returns NULL on ENOMEM.
 */
static inline struct eng_run *
single_run (struct engine *e, struct plug_piece *p)
{
  struct plug_run *pr = plug_run_alloc (e->run_prefix, 1);
  struct eng_run *r;

  if (pr == NULL)
    return NULL;
  pr->op = p->op;
  pr->flags = p->flags;
  pr->backing = p->backing;
  pr->offset = p->offset;
  pr->count = p->count;
  pr->reqs[0] = p;
  r = run_of (pr);
  r->run = pr;
  run_made (e, r);
  return r;
}

/* Mutation op (without FUA) is acknowledged with success at now: it is
 * unflushed until a FLUSH that arrives later succeeds (stats.h, "The
 * unflushed window").
 */
static inline void
note_acked (struct engine *e, const struct eng_op *op, uint64_t now)
{
  stats_unflushed_ack (&e->unflushed, op->count, now);
}

/* ---- engine.c ---- */

extern void __attribute__ ((__format__ (__printf__, 3, 4)))
eng_log (struct engine *e, int level, const char *fs, ...);
extern const char *
file_name (const struct engine *e, uint32_t b, char *buf, size_t n);
extern void
log_run (struct engine *e, const struct eng_run *r, const char *what,
         int err, uint64_t now);

/* ---- engine-life.c ---- */

extern void
submit_close (struct engine *e, struct eng_conn *c, struct eng_op *op,
              uint64_t now, struct eng_actions *out);
extern void
submit_shutdown (struct engine *e, struct eng_conn *c, struct eng_op *op,
                 uint64_t now, struct eng_actions *out);
extern void
answer_waiters (struct engine *e, uint64_t now, struct eng_actions *out);

/* Answer the waiting ops whose condition holds now (FLUSH, read,
 * writers waiting for memory, close, exit).  Every event asks; on most
 * nothing waits at all.
 */
static inline void
check_waiters (struct engine *e, uint64_t now, struct eng_actions *out)
{
  if (list_empty (&e->flush_wait) && list_empty (&e->read_wait) &&
      e->nr_mem_waiting == 0 && e->nr_closing == 0 &&
      e->shutdown_op == NULL)
    return;
  answer_waiters (e, now, out);
}
extern uint64_t
plug_deadline (const struct engine *e, const struct eng_conn *c);
extern void
conn_tick (struct engine *e, struct eng_conn *c, uint64_t now,
           struct eng_actions *out);

/* ---- engine-durable.c ---- */

extern void
run_finish (struct engine *e, struct eng_run *r, int err, uint64_t now,
            struct eng_actions *out);
extern void
record_add (struct engine *e, uint32_t b, struct span sp);
extern void
wait_sync (struct engine *e, struct eng_op *op, uint64_t now,
           struct eng_actions *out);
extern void
submit_flush (struct engine *e, struct eng_conn *c, struct eng_op *op,
              uint64_t now, struct eng_actions *out);
extern bool
read_blocked (const struct engine *e, const struct eng_op *op);
extern void
submit_read (struct engine *e, struct eng_conn *c, struct eng_op *op,
             uint64_t now, struct eng_actions *out);

/* ---- engine-queue.c ---- */

extern void
count_blockers (struct engine *e, struct eng_file *f, uint64_t batch,
                struct plug_run *const *v, size_t n);
extern void
queue_run (struct engine *e, uint32_t b, uint64_t now, bool force,
           struct eng_actions *out);
extern void
release_blocked (struct engine *e, struct eng_file *f, struct eng_run *r);

/* Issue file b's ready runs, in order, as far as its slots allow.
 * force: also a delayed or stalled queue (a FLUSH does not make its
 * client wait for a backoff; close and exit do not either).  Every
 * completion asks; most find nothing queued.
 */
static inline void
queue_dispatch (struct engine *e, uint32_t b, uint64_t now, bool force,
                struct eng_actions *out)
{
  if (e->files[b].nr_queued > 0)
    queue_run (e, b, now, force, out);
}

/* Run r, done, leaves its file's queue and index; the newer runs it
 * blocked have one blocker less (none are blocked on the direct
 * path's way: no walk).
 */
static inline void
run_dequeue (struct engine *e, struct eng_run *r)
{
  struct eng_file *f = &e->files[r->run->backing];

  if (r->state == RUN_BLOCKED)
    f->nr_blocked--;
  if (f->nr_blocked > 0)
    release_blocked (e, f, r);
  itree_remove (&f->index, &r->node);
  if (r->state == RUN_READY)
    list_unlink (&r->ready_link);
  list_unlink (&r->qlink);
  if (r->state != RUN_INFLIGHT)
    f->nr_queued--;
  r->conn->nr_runs--;
  run_set_state (e, r, RUN_DONE);
}
extern void
dispatch_all (struct engine *e, uint64_t now, bool force,
              struct eng_actions *out);
extern int
split_run (struct engine *e, struct eng_file *f, struct eng_run *r);
extern void
queue_tick (struct engine *e, uint32_t b, uint64_t now,
            struct eng_actions *out);
extern void
not_now (struct engine *e, struct eng_file *f, struct eng_run *r,
         uint64_t now, struct eng_actions *out);

/* ---- engine-admit.c ---- */

extern bool
held_before (const struct engine *e, const struct plug_piece *p,
             uint64_t max_seq);
extern bool
unplug_overlapping (struct engine *e, const struct plug_piece *p,
                    enum plug_reason reason, uint64_t now,
                    struct eng_actions *out);
extern void
conn_unplug (struct engine *e, struct eng_conn *c, enum plug_reason reason,
             uint64_t now, struct eng_actions *out);
extern void
check_parked (struct engine *e, struct eng_conn *c, uint64_t now,
              struct eng_actions *out);
extern void
admit_waiters (struct engine *e, struct eng_conn *c, uint64_t now,
               struct eng_actions *out);
extern void
refuse_waiter (struct eng_conn *c, struct eng_op *op, struct eng_actions *out);
extern int
submit_mutation (struct engine *e, struct eng_conn *c, struct eng_op *op,
                 uint64_t now, struct eng_actions *out);

/* ---- engine-direct.c ---- */

extern bool
can_issue_now (struct engine *e, const struct eng_op *op);
extern int
issue_alone (struct engine *e, struct eng_conn *c, struct eng_op *op,
             uint64_t now, struct eng_actions *out);

/* ---- engine-pace.c ---- */

extern void
pace_parked (struct engine *e, struct eng_conn *c, uint64_t now);
extern void
pace_timer (struct engine *e, struct eng_conn *c);
extern void
pace_concurrent (struct engine *e, struct eng_conn *c);
extern void
pace_drained (struct engine *e, struct eng_conn *c, uint64_t now,
              struct eng_actions *out);

#endif /* NBDPLUG_ENGINE_INT_H */
