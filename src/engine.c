/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine.c: the export's state machine.  See engine.h for the rules.
 *
 * The kernel's words: conn_unplug() is blk_flush_plug, queue_dispatch()
 * is the driver's queue_rq loop over one hardware queue, a "not now"
 * completion is BLK_STS_RESOURCE followed by blk_mq_delay_run_hw_queue
 * (FILE_DELAYED) or by a restart from the next completion
 * (FILE_STALLED, blk-mq's SCHED_RESTART), and ENG_CLOSE is
 * blk_finish_plug at task exit.
 */

#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "minmax.h"
#include "ratelimit.h"

/* Acknowledged-but-unfinished mutations allowed per connection, as a
 * multiple of max-requests: zeros and trims carry no data, so max-bytes
 * alone would not bound them.
 */
#define ACKED_PER_MAX_REQUEST 4

/* How far back a connection remembers where its requests went, for the
 * direct path: a request near none of the last NR_RECENT could not merge.
 */
#define NR_RECENT 16

/* Hold mode: timer unplugs of a single request in a row, with nobody
 * else waiting, before the connection stops waiting for idle=.
 */
#define LONE_STREAK 2

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

/* PACE_PLUG -> PACE_BUSY: a parked unplug found the client took more
 * than BUSY_RATIO times the backend's time to bring its next batch, or
 * a timer (idle=, or max-delay= where that is the shorter) had to
 * unplug with nothing of the connection in flight, BUSY_STREAK times in
 * a row.  PACE_BUSY -> PACE_PLUG: the
 * completions of the connection's last run found at least PLUG_GATHER
 * requests held meanwhile on average over the last BUSY_STREAK (2) that
 * found any, and together as many as the connection has workers.  With
 * one run in flight at a time, two batches in a row are the client's
 * whole queue: it alternates large and small (15, 1, 15, 1 of 16), so
 * an average and not a streak of large ones; and a queue shorter than
 * the workers never fires the parked trigger, so holding would only
 * wait for idle=.
 */
#define BUSY_RATIO 4
#define PLUG_GATHER 4
#define BUSY_STREAK 2

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
  uint64_t mem_bound;           /* Copied bytes per connection. */
  uint64_t nr_lost_spans;       /* Entries in every file's record. */
  uint64_t sync_round;          /* Rounds of syncs begun. */
  unsigned sync_pending;        /* Syncs of the last round not done; 0:
                                 * no round in flight. */
  list_head sync_wait;          /* OP_SYNC_WAIT, by sync_round, by wait. */
  bool deadline_earlier;        /* See engine_deadline_may_be_earlier. */
  uint64_t unplugs_tried;       /* For cfg.inject_unplug_nomem. */
  struct stats_unflushed unflushed;     /* See stats.h. */
};

/* A deadline appeared, or came nearer: engine_next_deadline may be
 * earlier than when the caller last asked.
 */
static void
deadline_earlier (struct engine *e)
{
  e->deadline_earlier = true;
}

static void conn_unplug (struct engine *e, struct eng_conn *c,
                         enum plug_reason reason, uint64_t now,
                         struct eng_actions *out);
static void queue_dispatch (struct engine *e, uint32_t b, uint64_t now,
                            bool force, struct eng_actions *out);
static void check_waiters (struct engine *e, uint64_t now,
                           struct eng_actions *out);
static void release_blocked (struct engine *e, struct eng_file *f,
                             struct eng_run *r);
static void ready_remove (struct eng_file *f, struct eng_run *r);

/* ---- small helpers ---- */

static void __attribute__ ((__format__ (__printf__, 3, 4)))
eng_log (struct engine *e, int level, const char *fs, ...)
{
  char msg[512];
  va_list ap;

  if (e->cfg.log == NULL)
    return;
  va_start (ap, fs);
  vsnprintf (msg, sizeof msg, fs, ap);
  va_end (ap);
  e->cfg.log (e->cfg.log_opaque, level, msg);
}

static const char *
op_name (enum plug_op op)
{
  switch (op) {
  case PLUG_OP_WRITE: return "write";
  case PLUG_OP_ZERO: return "zero";
  case PLUG_OP_TRIM: return "trim";
  }
  return "?";
}

/* Backing file b's name for messages (buf: room if it has none). */
static const char *
file_name (const struct engine *e, uint32_t b, char *buf, size_t n)
{
  if (e->cfg.names)
    return e->cfg.names[b];
  snprintf (buf, n, "#%" PRIu32, b);
  return buf;
}

/* An error line about a run, at most one per file per second:
 * "file=NAME: write of N bytes at offset O: WHAT: ERROR".
 */
static void
log_run (struct engine *e, const struct eng_run *r, const char *what,
         int err, uint64_t now)
{
  struct eng_file *f = &e->files[r->run->backing];
  char name[32], more[64] = "";
  uint64_t suppressed;

  if (!ratelimit_allow (&f->log, now, &suppressed))
    return;
  if (suppressed > 0)
    snprintf (more, sizeof more, " (and %" PRIu64 " more since the last "
              "message)", suppressed);
  eng_log (e, 0, "file=%s: %s of %" PRIu64 " bytes at offset %" PRIu64
           ": %s: %s%s",
           file_name (e, r->run->backing, name, sizeof name),
           op_name (r->run->op), r->run->count, r->run->offset, what,
           strerror (err), more);
}

/* The first op waiting on l, or NULL. */
static struct eng_op *
wait_first (list_head *l)
{
  return list_first (l, struct eng_op, wait);
}

void
eng_actions_init (struct eng_actions *a)
{
  list_init (&a->issue);
  list_init (&a->sync);
  list_init (&a->reply);
  list_init (&a->release);
}

static void
act_issue (struct eng_actions *out, struct eng_run *r)
{
  list_add_tail (&out->issue, &r->issue_link);
}

/* Answer op's client with err (once). */
static void
op_answer (struct eng_op *op, int err, struct eng_actions *out)
{
  if (!op->reply_pending)
    return;
  op->reply_pending = false;
  if (op->conn)
    op->conn->nr_waiting--;
  op->err = err;
  list_add_tail (&out->reply, &op->reply_link);
}

/* The engine is done with op: the caller frees it. */
static void
op_release (struct eng_op *op, struct eng_actions *out)
{
  assert (!op->reply_pending);
  op->state = OP_FINISHED;
  list_add_tail (&out->release, &op->release_link);
}

static struct eng_run *
run_of (struct plug_run *pr)
{
  return plug_run_prefix (pr);
}

/* ---- engine and connections ---- */

struct engine *
engine_new (const struct eng_config *cfg)
{
  struct engine *e;
  uint32_t b;

  if (cfg->nr_backings == 0 || cfg->max_inflight == 0 ||
      cfg->lim.max_requests == 0 || cfg->lim.max_bytes == 0 ||
      cfg->lim.max_merge == 0 || cfg->lim.max_iov == 0 ||
      cfg->max_delay_ns == 0 || cfg->retry.delay_ns == 0) {
    errno = EINVAL;
    return NULL;
  }
  e = calloc (1, sizeof *e);
  if (e == NULL)
    return NULL;
  e->files = calloc (cfg->nr_backings, sizeof *e->files);
  if (e->files == NULL) {
    free (e);
    return NULL;
  }
  e->cfg = *cfg;
  list_init (&e->conns);
  list_init (&e->unfinished);
  list_init (&e->flush_wait);
  list_init (&e->read_wait);
  list_init (&e->sync_wait);
  if (e->cfg.retry.max_delay_ns < e->cfg.retry.delay_ns)
    e->cfg.retry.max_delay_ns = e->cfg.retry.delay_ns;
  /* The run header lives in front of each merged run (plug.h). */
  e->run_prefix = (sizeof (struct eng_run) + _Alignof (max_align_t) - 1) /
    _Alignof (max_align_t) * _Alignof (max_align_t);
  e->cfg.lim.run_prefix = e->run_prefix;
  e->cfg.lim.seed = cfg->seed ^ 0x9e3779b9u;
  /* The memory bound stays cfg->lim.max_bytes (over_memory); the plug
   * goes out at half of it (BLK_PLUG_FLUSH_SIZE's role).
   */
  e->mem_bound = cfg->lim.max_bytes;
  e->cfg.lim.max_bytes = MAX (cfg->lim.max_bytes / 2, (uint64_t) 1);
  for (b = 0; b < cfg->nr_backings; ++b) {
    struct eng_file *f = &e->files[b];

    list_init (&f->queue);
    list_init (&f->ready);
    f->max_inflight = cfg->max_inflight;
    f->direct_rule = ENG_DIRECT_UNMERGED;
    itree_init (&f->index, cfg->seed + b);
    /* THE RECORD must take a loss whenever one happens, memory or
     * not: its room is taken now (span_add never allocates).
     */
    if (span_vector_reserve (&f->lost, SPAN_CAP) == -1 ||
        span_vector_reserve (&f->written, SPAN_CAP) == -1 ||
        span_vector_reserve (&f->syncing, SPAN_CAP) == -1 ||
        span_vector_reserve (&f->heals, SPAN_CAP) == -1 ||
        span_vector_reserve (&f->heals_syncing, SPAN_CAP) == -1) {
      engine_free (e);
      return NULL;
    }
  }
  e->next_seq = 1;
  e->next_batch = 1;
  return e;
}

void
engine_set_max_inflight (struct engine *e, uint32_t b, unsigned n)
{
  assert (b < e->cfg.nr_backings && n > 0);
  e->files[b].max_inflight = n;
}

void
engine_set_direct_rule (struct engine *e, uint32_t b,
                        enum eng_direct_rule rule)
{
  assert (b < e->cfg.nr_backings);
  e->files[b].direct_rule = rule;
}

static void
run_free (struct eng_run *r)
{
  plug_run_free (r->run);
}

void
engine_free (struct engine *e)
{
  uint32_t b;

  if (e == NULL)
    return;
  assert (list_empty (&e->conns));
  for (b = 0; b < e->cfg.nr_backings; ++b) {
    struct eng_file *f = &e->files[b];
    struct eng_run *r;

    /* engine_new may fail before the file's lists are made. */
    if (f->queue.next != NULL)
      while ((r = list_pop (&f->queue, struct eng_run, qlink)) != NULL)
        run_free (r);
    span_vector_reset (&f->lost);
    span_vector_reset (&f->written);
    span_vector_reset (&f->syncing);
    span_vector_reset (&f->heals);
    span_vector_reset (&f->heals_syncing);
  }
  free (e->files);
  free (e);
}

/* The timer thread unplugs for every connection, where nbdkit's own
 * prefix names no connection: the messages name it themselves.
 */
void
engine_conn_set_id (struct eng_conn *c, uint64_t id)
{
  c->id = id;
}

struct eng_conn *
engine_conn_open (struct engine *e, struct plug_stats *stats)
{
  struct eng_conn *c;
  size_t i;

  if (e->state != ENGINE_RUNNING) {
    errno = ESHUTDOWN;
    return NULL;
  }
  c = calloc (1, sizeof *c);
  if (c == NULL)
    return NULL;
  if (plug_init (&c->plug, &e->cfg.lim, e->cfg.nr_backings) == -1) {
    free (c);
    return NULL;
  }
  c->e = e;
  c->stats = stats;
  for (i = 0; i < NR_RECENT; ++i) {
    c->recent_start[i] = UINT64_MAX;    /* Empty: near nothing. */
    c->recent_end[i] = 0;
  }
  list_init (&c->mem_wait);
  list_add_head (&e->conns, &c->link);
  return c;
}

struct plug_stats *
engine_run_stats (const struct eng_run *r)
{
  return r->conn->stats;
}

void
engine_conn_free (struct engine *e, struct eng_conn *c)
{
  assert (c->nr_unfinished == 0 && c->nr_runs == 0 &&
          list_empty (&c->mem_wait) && plug_is_empty (&c->plug));
  (void) e;
  list_del (&c->link);
  plug_free (&c->plug);
  free (c);
}

/* ---- the unfinished list ---- */

/* The oldest unfinished mutation, or NULL. */
static const struct eng_op *
unf_oldest (const struct engine *e)
{
  return list_first (&e->unfinished, struct eng_op, unf);
}

/* ---- THE RECORD: spans of lost data ---- */

static bool
spans_touch (const struct span *a, uint64_t start, uint64_t end)
{
  return a->start <= end && start <= a->end;
}

/* One span covering every span of v (and nothing else is kept). */
static void
span_hull (span_vector *v)
{
  struct span h = v->ptr[0];
  size_t i;

  for (i = 1; i < v->len; ++i) {
    h.start = MIN (h.start, v->ptr[i].start);
    h.end = MAX (h.end, v->ptr[i].end);
    h.seq_lo = MIN (h.seq_lo, v->ptr[i].seq_lo);
    h.seq_hi = MAX (h.seq_hi, v->ptr[i].seq_hi);
  }
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
    last->start = MIN (last->start, sp.start);
    last->end = MAX (last->end, sp.end);
    last->seq_lo = MIN (last->seq_lo, sp.seq_lo);
    last->seq_hi = MAX (last->seq_hi, sp.seq_hi);
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
static void
record_lost (struct engine *e, uint32_t b, struct span sp)
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
    const struct plug_req *p = &op->pieces[i];
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

/* ---- SYNCS BELONG TO THE ENGINE: rounds of syncs ---- */

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
  op_answer (op, err, out);
  op_release (op, out);
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
static void
wait_sync (struct engine *e, struct eng_op *op, uint64_t now,
           struct eng_actions *out)
{
  uint64_t need = round_needed (e);

  if (need == 0) {
    sync_answer (e, op, out);
    return;
  }
  op->state = OP_SYNC_WAIT;
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
      record_lost (e, b, sp);
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
 * the rewrite, newer, is on the disk in its place.  A widened span
 * heals nothing (it names more than was written).
 */
static void
sync_healed (struct engine *e, uint32_t b)
{
  const span_vector *v = &e->files[b].heals_syncing;
  size_t i;

  for (i = 0; i < v->len && e->files[b].lost.len > 0; ++i)
    if (v->ptr[i].extent == SPAN_EXACT)
      record_heal (e, b, v->ptr[i].start, v->ptr[i].end, v->ptr[i].seq_hi);
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

  record_lost (e, b, sp);
}

/* ---- finishing ---- */

/* Mutation op (without FUA) is acknowledged with success at now: it is
 * unflushed until a FLUSH that arrives later succeeds (stats.h, "The
 * unflushed window").
 */
static void
note_acked (struct engine *e, const struct eng_op *op, uint64_t now)
{
  stats_unflushed_ack (&e->unflushed, op->count, now);
}

/* Every piece of mutation op finished. */
static void
op_finish (struct engine *e, struct eng_op *op, uint64_t now,
           struct eng_actions *out)
{
  struct eng_conn *c = op->conn, *o;

  list_del (&op->unf);
  c->nr_unfinished--;
  c->bytes -= op->bytes;
  e->bytes -= op->bytes;
  if (op->told_ok) {
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
  if ((op->flags & ENG_F_FUA) && op->reply_pending && op->err == 0) {
    /* NBD: FUA "MUST NOT send its reply ... until ... persisted". */
    wait_sync (e, op, now, out);
    return;
  }
  if (op->reply_pending && op->err == 0)
    note_acked (e, op, now);
  op_answer (op, op->err, out);
  op_release (op, out);
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
    const struct plug_req *p = r->run->reqs[i];
    struct span sp = {
      .start = p->offset, .end = p->offset + p->count,
      .seq_lo = p->seq, .seq_hi = p->seq, .extent = SPAN_EXACT,
    };

    if (span_add (&f->written, sp))
      e->widened++;
    if (f->lost.len > 0 && overlaps_lost (f, sp.start, sp.end) &&
        span_add (&f->heals, sp))
      e->widened++;
  }
}

/* Run r is done with err (0: written).  Its members finish. */
static void
run_finish (struct engine *e, struct eng_run *r, int err, uint64_t now,
            struct eng_actions *out)
{
  struct eng_file *f = &e->files[r->run->backing];
  size_t i;

  if (r->state == RUN_BLOCKED)
    f->nr_blocked--;
  release_blocked (e, f, r);
  itree_remove (&f->index, &r->node);
  if (r->state == RUN_READY)
    ready_remove (f, r);
  list_del (&r->qlink);
  if (r->state != RUN_INFLIGHT)
    f->nr_queued--;
  r->conn->nr_runs--;
  if (err == 0)
    note_written (e, r);

  for (i = 0; i < r->run->n; ++i) {
    struct plug_req *p = r->run->reqs[i];
    struct eng_op *op = p->opaque;
    uint64_t held = now > p->arrival_ns ? now - p->arrival_ns : 0;

    STATS_ADD (op->conn->stats->held_total_ns, held);
    stats_max (&op->conn->stats->held_max_ns, held);
    if (err && op->err == 0)
      op->err = err;
    if (err && op->told_ok) {
      struct span sp = {
        .start = p->offset, .end = p->offset + p->count,
        .seq_lo = p->seq, .seq_hi = p->seq, .err = err,
      };

      record_lost (e, p->backing, sp);
    }
    assert (op->pending > 0);
    if (--op->pending == 0)
      op_finish (e, op, now, out);
  }
  run_free (r);
}

/* ---- queues ---- */

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
static struct eng_run *
run_of_node (struct itree_node *node)
{
  return itree_entry (node, struct eng_run, node);
}

static void
ready_append (struct eng_file *f, struct eng_run *r)
{
  assert (r->state == RUN_BLOCKED && r->nr_blockers == 0);
  f->nr_blocked--;
  r->state = RUN_READY;
  list_add_tail (&f->ready, &r->ready_link);
}

/* A run back from the backend ("not now", or a piece of a failed run)
 * goes out again first.
 */
static void
ready_push (struct eng_file *f, struct eng_run *r)
{
  r->state = RUN_READY;
  r->nr_blockers = 0;
  list_add_head (&f->ready, &r->ready_link);
}

static void
ready_remove (struct eng_file *f, struct eng_run *r)
{
  assert (r->state == RUN_READY);
  (void) f;
  list_del (&r->ready_link);
}

/* q (blocked) now waits for n older runs; at 0 it is free to go. */
static void
set_blockers (struct eng_file *f, struct eng_run *q, size_t n)
{
  assert (q->state == RUN_BLOCKED);
  q->nr_blockers = n;
  if (n == 0)
    ready_append (f, q);
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
    set_blockers (w->f, q, q->nr_blockers - 1);
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
 * less.  With no run blocked (the direct path's case), nobody.
 */
static void
release_blocked (struct engine *e, struct eng_file *f, struct eng_run *r)
{
  struct order_walk w = { .pieces = NULL };

  if (f->nr_blocked > 0)
    walk_overlapping (e, f, r, release_one_newer, &w);
}

/* The n runs v[] of one unplug (batch), just queued to file f, count
 * the older runs of f that overlap them; those with none are ready, in
 * offset order.  A file whose oldest run is of this batch has nothing
 * older: no walk.
 */
static void
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
    set_blockers (f, q, q->nr_blockers);
  }
}

/* Runs are never empty and end before 2^64 (pieces_valid). */
static void
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
static void
queue_append (struct engine *e, struct eng_run *r)
{
  struct eng_file *f = &e->files[r->run->backing];

  r->state = RUN_BLOCKED;
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

static void
run_start (struct eng_file *f, struct eng_run *r, uint64_t now,
           struct eng_actions *out)
{
  r->state = RUN_INFLIGHT;
  r->issued_ns = now;
  f->nr_queued--;
  f->inflight++;
  act_issue (out, r);
}

static void
run_issue (struct eng_file *f, struct eng_run *r, uint64_t now,
           struct eng_actions *out)
{
  ready_remove (f, r);
  run_start (f, r, now, out);
}

/* Issue file b's ready runs, in order, as far as its slots allow.
 * force: also a delayed or stalled queue (a FLUSH does not make its
 * client wait for a backoff; close and exit do not either).
 */
static void
queue_dispatch (struct engine *e, uint32_t b, uint64_t now, bool force,
                struct eng_actions *out)
{
  struct eng_file *f = &e->files[b];
  struct eng_run *r;

  if (f->nr_queued == 0)
    return;
  if (f->state == FILE_DELAYED && !force && now < f->delay_until)
    return;
  if (f->state == FILE_STALLED && !force)
    return;
  f->state = FILE_RUNNING;
  while ((r = list_first (&f->ready, struct eng_run, ready_link)) != NULL) {
    if (f->inflight >= f->max_inflight) {
      /* A driver out of tags: the next completion dispatches again. */
      STATS_ADD (r->conn->stats->no_slot, 1);
      break;
    }
    run_issue (f, r, now, out);
  }
}

static void
dispatch_all (struct engine *e, uint64_t now, bool force,
              struct eng_actions *out)
{
  uint32_t b;

  for (b = 0; b < e->cfg.nr_backings; ++b)
    queue_dispatch (e, b, now, force, out);
}

static bool
holds_seq_at_most (struct itree_node *node, void *opaque)
{
  return run_of_node (node)->min_seq <= *(const uint64_t *) opaque;
}

/* Does any unfinished run of file b overlap [offset, offset+count)?
 * With max_seq != UINT64_MAX, only runs holding a mutation at least as
 * old as that.
 */
static bool
queue_overlaps (const struct engine *e, uint32_t b, uint64_t offset,
                uint64_t count, uint64_t max_seq)
{
  /* Not QUEUE ORDER's steps: not counted. */
  return itree_overlapping (&e->files[b].index, offset, offset + count,
                            holds_seq_at_most, &max_seq, NULL);
}

static bool
held_anywhere (const struct engine *e, const struct plug_req *p)
{
  const struct eng_conn *c;

  list_for_each (c, &e->conns, link)
    if (plug_conflicts (&c->plug, p))
      return true;
  return false;
}

/* Is data admitted at or before max_seq and overlapping p held in a
 * plug?  (Newer held data never makes a read wait: it could starve.)
 */
static bool
held_before (const struct engine *e, const struct plug_req *p,
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
static bool
unplug_overlapping (struct engine *e, const struct plug_req *p,
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

/* ---- plugging ---- */

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
static void
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
    r->conn = c;
    r->batch = batch;
    r->min_seq = UINT64_MAX;
    for (k = 0; k < pr->n; ++k) {
      const struct plug_req *p = pr->reqs[k];

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
    struct plug_req *p = &op->pieces[i];
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
static void
check_parked (struct engine *e, struct eng_conn *c, uint64_t now,
              struct eng_actions *out)
{
  if (!plug_is_empty (&c->plug) && c->nr_workers > 0 &&
      c->nr_waiting >= c->nr_workers && c->nr_runs == 0) {
    if (e->cfg.mode == ENG_HOLD && c->pace == PACE_PLUG &&
        c->drained_ns > 0) {
      /* The whole client queue waited for the backend, then the
       * backend waited for the whole client queue.
       */
      uint64_t client_ns = now - c->drained_ns;

      c->pace_streak = client_ns / BUSY_RATIO > c->last_svc_ns ?
        c->pace_streak + 1 : 0;
      if (c->pace_streak >= BUSY_STREAK) {
        c->pace = PACE_BUSY;
        c->last_gathered = 0;
        c->pace_streak = 0;
      }
    }
    conn_unplug (e, c, PLUG_UNPLUG_PARKED, now, out);
  }
}

/* op is admitted: its sequence number, and the counts that op_finish
 * takes it off again (unfinished, copied bytes).  Plugged (admit) or
 * issued alone (issue_alone), the same.
 */
static void
take_in (struct engine *e, struct eng_conn *c, struct eng_op *op,
         uint64_t now)
{
  op->state = OP_ADMITTED;
  op->seq = e->next_seq++;
  list_add_tail (&e->unfinished, &op->unf);
  c->nr_unfinished++;
  c->bytes += op->bytes;
  e->bytes += op->bytes;
  c->last_activity_ns = now;
}

/* Give op a sequence number and hold it (make_room made room). */
static void
admit (struct engine *e, struct eng_conn *c, struct eng_op *op, uint64_t now,
       struct eng_actions *out)
{
  enum plug_reason reason;

  take_in (e, c, op, now);
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

/* Hold mode: a timer (idle= or max-delay=) unplugs c.  With nothing of
 * c in flight, its client brought all it had and then waited for us:
 * its queue is shorter than its worker threads, so the parked trigger
 * never fires and every batch would wait for the timer.  See enum
 * conn_pace.
 */
static void
pace_idle (struct eng_conn *c)
{
  c->pace_streak = c->nr_runs == 0 ? c->pace_streak + 1 : 0;
  if (c->pace_streak >= BUSY_STREAK) {
    c->pace = PACE_BUSY;
    c->last_gathered = 0;
    c->pace_streak = 0;
  }
}

/* Hold mode: c's last run finished at now.  See enum conn_pace. */
static void
pace_drained (struct engine *e, struct eng_conn *c, uint64_t now,
              struct eng_actions *out)
{
  size_t gathered = c->plug.reqs.len;

  c->drained_ns = now;
  if (c->pace != PACE_BUSY || gathered == 0)
    return;
  if (c->pace_streak + 1 < BUSY_STREAK)
    c->pace_streak++;           /* Drains seen, up to BUSY_STREAK. */
  else if (gathered + c->last_gathered >= BUSY_STREAK * PLUG_GATHER &&
           gathered + c->last_gathered >= c->nr_workers) {
    /* From the next request on the parked trigger paces the plug; what
     * is held now goes out with the backend idle, as it would there.
     */
    c->pace = PACE_PLUG;
    c->pace_streak = 0;
    gathered = 0;
  }
  c->last_gathered = gathered;
  conn_unplug (e, c, PLUG_UNPLUG_QUIET, now, out);
}

static void
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

/* Is c at its memory bound (max-bytes, or the count of acknowledged
 * requests)?  One request is always let in, however large.
 */
static bool
over_memory (const struct engine *e, const struct eng_conn *c,
             const struct eng_op *op)
{
  if (c->nr_told_ok >= ACKED_PER_MAX_REQUEST * e->cfg.lim.max_requests)
    return true;
  return c->bytes > 0 && c->bytes + op->bytes > e->mem_bound;
}

/* Let in the writers waiting for memory that fit now, oldest first. */
static void
admit_waiters (struct engine *e, struct eng_conn *c, uint64_t now,
               struct eng_actions *out)
{
  struct eng_op *op;

  while ((op = wait_first (&c->mem_wait)) != NULL &&
         !over_memory (e, c, op)) {
    /* Tried again at the next release, or after the failed unplug's
     * retry (engine_tick).
     */
    if (plug_req_vector_reserve (&c->plug.reqs, op->nr_pieces) == -1 ||
        !make_room (e, op, now, out))
      return;
    list_del (&op->wait);
    op->told_ok = true;
    c->nr_told_ok++;
    note_acked (e, op, now);
    op_answer (op, 0, out);
    admit (e, c, op, now, out);
  }
}

static void
refuse_waiter (struct eng_conn *c, struct eng_op *op, struct eng_actions *out)
{
  list_del (&op->wait);
  op_answer (op, c->last_err ? c->last_err : ENOMEM, out);
  op_release (op, out);
}

/* Are op's pieces ranges the plug and the indexes can hold: at least
 * one (a read may have none), each of a file that exists, not empty,
 * and ending before 2^64?
 * (nbdkit refuses empty requests and the layout keeps offsets within
 * the files; the engine does not rely on either.)
 */
static bool
pieces_valid (const struct engine *e, const struct eng_op *op)
{
  size_t i;

  if (op->nr_pieces == 0 && op->kind != ENG_READ)
    return false;
  for (i = 0; i < op->nr_pieces; ++i) {
    const struct plug_req *p = &op->pieces[i];

    if (p->backing >= e->cfg.nr_backings || p->count == 0 ||
        p->count > UINT64_MAX - p->offset)
      return false;
  }
  return true;
}

/* Fast zero: "MUST fail quickly with NBD_ENOTSUP unless the request can
 * be serviced in less time than a corresponding NBD_CMD_WRITE".  It
 * never waits in a plug or a queue: issued at once, or refused.
 */
static bool
can_issue_now (struct engine *e, const struct eng_op *op)
{
  size_t i;

  for (i = 0; i < op->nr_pieces; ++i) {
    const struct plug_req *p = &op->pieces[i];
    const struct eng_file *f = &e->files[p->backing];

    if (f->state != FILE_RUNNING ||
        f->inflight + op->nr_pieces > f->max_inflight ||
        held_anywhere (e, p) ||
        queue_overlaps (e, p->backing, p->offset, p->count, UINT64_MAX))
      return false;
  }
  return true;
}

/* A run of one piece (the direct path, a fast zero, a failed merged run
 * split up), with the engine's header in front as plug_merge makes
 * them.  Returns NULL on ENOMEM.
 */
static struct eng_run *
single_run (const struct engine *e, struct plug_req *p)
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
  list_init (&r->issue_link);
  return r;
}

/* Admit op and issue each piece as a run of its own. */
static int
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

  take_in (e, c, op, now);
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
    run_start (f, r, now, out);
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
  large = e->cfg.direct_min > 0 && op->count >= e->cfg.direct_min;
  if (!e->cfg.direct || (near && !large) || (op->flags & ENG_F_FAST) ||
      e->state != ENGINE_RUNNING || c->state != CONN_OPEN ||
      !list_empty (&c->mem_wait) || !pieces_valid (e, op) ||
      (!large && !unmerged_direct (e, op)))
    return false;
  prepare_pieces (c, op, now);
  if (!can_issue_now (e, op))
    return false;
  op->reply_pending = true;
  c->nr_waiting++;
  if (issue_alone (e, c, op, now, out) == -1) {
    op->reply_pending = false;
    c->nr_waiting--;
    return false;
  }
  STATS_ADD (c->stats->direct, 1);
  return true;
}

/* ---- submission ---- */

static int
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
    op->reply_pending = true;
    c->nr_waiting++;
    /* Across files, a piece could be zeroed while another one cannot
     * be fast: "SHOULD NOT alter the contents ... when returning
     * NBD_ENOTSUP".  Only a fast zero inside one file is tried.
     */
    if (op->nr_pieces > 1 || !can_issue_now (e, op) ||
        issue_alone (e, c, op, now, out) == -1) {
      op_answer (op, ENOTSUP, out);
      op_release (op, out);
    }
    return 0;
  }
  if (wb && (!list_empty (&c->mem_wait) || over_memory (e, c, op))) {
    /* At the bound the writer waits for memory, bounded by
     * requeue-timeout; the plug goes out so that memory comes back.
     */
    op->state = OP_WAIT_MEMORY;
    op->reply_pending = true;
    c->nr_waiting++;
    op->deadline_ns = eng_add_ns (now, e->cfg.retry.timeout_ns);
    list_add_tail (&c->mem_wait, &op->wait);
    deadline_earlier (e);
    conn_unplug (e, c, PLUG_UNPLUG_MEMORY, now, out);
    check_parked (e, c, now, out);
    return 0;
  }
  if (plug_req_vector_reserve (&c->plug.reqs, op->nr_pieces) == -1)
    return -1;
  if (!make_room (e, op, now, out)) {
    errno = ENOMEM;             /* Refused before it is acknowledged. */
    return -1;
  }
  if (wb) {
    op->acked = true;
    op->told_ok = true;
    c->nr_told_ok++;
    note_acked (e, op, now);
  }
  else {
    op->reply_pending = true;
    c->nr_waiting++;
    if (c->pace == PACE_PASSTHROUGH && c->nr_waiting > 1)
      c->pace = PACE_PLUG;      /* The client has concurrency again. */
  }
  admit (e, c, op, now, out);
  check_parked (e, c, now, out);
  return 0;
}

static bool
flush_ready (const struct engine *e, const struct eng_op *op)
{
  const struct eng_op *oldest = unf_oldest (e);

  return oldest == NULL || oldest->seq > op->horizon;
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

static void
submit_flush (struct engine *e, struct eng_conn *c, struct eng_op *op,
              uint64_t now, struct eng_actions *out)
{
  struct eng_conn *o;
  uint64_t first_batch = e->next_batch;

  op->horizon = e->next_seq - 1;
  op->reply_pending = true;
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
  op->state = OP_WAITING;
  list_add_tail (&e->flush_wait, &op->wait);
  check_waiters (e, now, out);
}

/* Must read op wait?  Yes while a mutation admitted before it and
 * overlapping it is unfinished: queued or in flight, or still held (its
 * plug could not be unplugged for lack of memory).
 */
static bool
read_blocked (const struct engine *e, const struct eng_op *op)
{
  size_t i;

  for (i = 0; i < op->nr_pieces; ++i) {
    const struct plug_req *p = &op->pieces[i];

    if (queue_overlaps (e, p->backing, p->offset, p->count, op->horizon) ||
        held_before (e, p, op->horizon))
      return true;
  }
  return false;
}

static void
submit_read (struct engine *e, struct eng_conn *c, struct eng_op *op,
             uint64_t now, struct eng_actions *out)
{
  size_t i;

  op->conn = c;
  op->horizon = e->next_seq - 1;
  op->reply_pending = true;
  c->nr_waiting++;
  /* One that cannot go out keeps the read waiting (read_blocked). */
  for (i = 0; i < op->nr_pieces; ++i)
    (void) unplug_overlapping (e, &op->pieces[i], PLUG_UNPLUG_READ, now,
                               out);
  if (!read_blocked (e, op)) {
    op_answer (op, 0, out);
    op_release (op, out);
    return;
  }
  op->state = OP_WAITING;
  list_add_tail (&e->read_wait, &op->wait);
  check_parked (e, c, now, out);
}

static void
submit_close (struct engine *e, struct eng_conn *c, struct eng_op *op,
              uint64_t now, struct eng_actions *out)
{
  struct eng_op *w;

  c->state = CONN_CLOSING;
  op->reply_pending = true;
  c->nr_waiting++;
  op->state = OP_WAITING;
  c->close_op = op;
  /* No worker is left to wait for memory. */
  while ((w = list_pop (&c->mem_wait, struct eng_op, wait)) != NULL) {
    op_answer (w, ESHUTDOWN, out);
    op_release (w, out);
  }
  conn_unplug (e, c, PLUG_UNPLUG_CLOSE, now, out);
  dispatch_all (e, now, true, out);
  check_waiters (e, now, out);
}

static void
submit_shutdown (struct engine *e, struct eng_conn *c, struct eng_op *op,
                 uint64_t now, struct eng_actions *out)
{
  struct eng_conn *o;

  e->state = ENGINE_SHUTTING_DOWN;
  op->reply_pending = true;
  stats_unflushed_flush_begin (&e->unflushed, &op->flush_mark);
  if (c)
    c->nr_waiting++;
  op->state = OP_WAITING;
  e->shutdown_op = op;
  list_for_each (o, &e->conns, link)
    conn_unplug (e, o, PLUG_UNPLUG_CLOSE, now, out);
  dispatch_all (e, now, true, out);
  check_waiters (e, now, out);
}

int
engine_submit (struct engine *e, struct eng_conn *c, struct eng_op *op,
               uint64_t now, struct eng_actions *out)
{
  op->acked = false;
  op->told_ok = false;
  op->reply_pending = false;
  op->err = 0;
  op->conn = c;
  op->state = OP_NEW;
  /* The caller's op may come from calloc or a cache: its links are
   * made here, unlinked.
   */
  list_init (&op->unf);
  list_init (&op->wait);
  list_init (&op->reply_link);
  list_init (&op->release_link);

  switch (op->kind) {
  case ENG_WRITE:
  case ENG_ZERO:
  case ENG_TRIM:
    if (e->state != ENGINE_RUNNING || c->state != CONN_OPEN) {
      errno = ESHUTDOWN;
      return -1;
    }
    return submit_mutation (e, c, op, now, out);
  case ENG_FLUSH:
    submit_flush (e, c, op, now, out);
    return 0;
  case ENG_READ:
    if (!pieces_valid (e, op)) {
      errno = EINVAL;
      return -1;
    }
    submit_read (e, c, op, now, out);
    return 0;
  case ENG_CLOSE:
    submit_close (e, c, op, now, out);
    return 0;
  case ENG_SHUTDOWN:
    submit_shutdown (e, c, op, now, out);
    return 0;
  }
  abort ();
}

void
engine_conn_set_workers (struct engine *e, struct eng_conn *c, unsigned n,
                         uint64_t now, struct eng_actions *out)
{
  c->nr_workers = n;
  check_parked (e, c, now, out);
}

/* ---- completion ---- */

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
  set_blockers (w->f, q, q->nr_blockers - 1 + k);
  return false;
}

/* A merged run failed with a real error: put its members back in its
 * place as runs of their own (same batch, so the order rules hold), so
 * that the failure stays with the range that failed and its neighbours
 * are written.  Returns -1 if there is no memory for it.
 */
static int
split_run (struct engine *e, struct eng_file *f, struct eng_run *r)
{
  list_head made = LIST_HEAD_INIT (made);
  struct list_node *before = r->qlink.prev, *node;
  struct eng_run *n;
  struct order_walk w = { .pieces = &made };
  size_t i;

  for (i = r->run->n; i-- > 0; ) {
    struct plug_req *p = r->run->reqs[i];

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
    ready_push (f, list_entry (node, struct eng_run, qlink));
  r->conn->nr_runs--;
  run_free (r);
  return 0;
}

/* "Not now" on run r of file f. */
static void
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
      f->state = FILE_RUNNING;
    return;
  }
  ready_push (f, r);
  f->nr_queued++;
  if (f->inflight > 0) {
    f->state = FILE_STALLED;
    return;
  }
  /* blk_delay_queue, with a capped backoff; the last retry lands on the
   * deadline, so that the file gets its whole requeue-timeout, never more.
   */
  delay = retry_delay (&e->cfg.retry, f->retry.attempts);
  if (f->retry.attempts < 64)
    f->retry.attempts++;
  f->state = FILE_DELAYED;
  f->delay_until = MIN (eng_add_ns (now, delay), deadline);
  deadline_earlier (e);
}

void
engine_complete (struct engine *e, struct eng_run *r, int err, uint64_t now,
                 struct eng_actions *out)
{
  uint32_t b = r->run->backing;
  struct eng_file *f = &e->files[b];
  struct eng_conn *c = r->conn;
  bool fast = r->run->flags & PLUG_F_FAST;

  assert (r->state == RUN_INFLIGHT);
  assert (f->inflight > 0);
  f->inflight--;
  c->last_svc_ns = now > r->issued_ns ? now - r->issued_ns : 0;
  stats_hist_add_serial (&c->stats->latency[STATS_L_BACKEND],
                         c->last_svc_ns);

  if (err == 0) {
    stats_count (&r->conn->stats->backend[stats_backend_of (r->run->op)],
                 r->run->count);
    f->counts.runs++;
    f->counts.bytes += r->run->count;
    if (f->state != FILE_RUNNING) {
      /* blk-mq restarts a queue that got BLK_STS_RESOURCE when one of
       * its requests completes: the delay is only for an idle queue.
       */
      STATS_ADD (r->conn->stats->restarted, 1);
      f->state = FILE_RUNNING;
    }
    retry_reset (&f->retry);
    run_finish (e, r, 0, now, out);
  }
  else if (retry_is_transient (err) && !fast)
    not_now (e, f, r, now, out);
  else {
    /* The backend answered: a stalled queue may run again. */
    if (f->state == FILE_STALLED)
      f->state = FILE_RUNNING;
    if (fast && (err == ENOTSUP || retry_is_transient (err)))
      err = ENOTSUP;            /* "Cannot be fast": an answer. */
    else {
      STATS_ADD (r->conn->stats->errors, 1);
      f->counts.errors++;
      if (r->run->n > 1 && split_run (e, f, r) == 0) {
        queue_dispatch (e, b, now, false, out);
        check_waiters (e, now, out);
        return;
      }
      log_run (e, r, "failed", err, now);
    }
    run_finish (e, r, err, now, out);
  }
  /* A stretch of "not now" ends when its file has nothing left, given
   * up or failed: the next refusal gets a requeue-timeout of its own.
   */
  if (f->inflight == 0 && f->nr_queued == 0)
    retry_reset (&f->retry);
  queue_dispatch (e, b, now, false, out);
  if (e->cfg.mode == ENG_HOLD && c->nr_runs == 0)
    pace_drained (e, c, now, out);
  check_waiters (e, now, out);
}

/* ---- waiting ops ---- */

/* A close or the exit: the lines the rate limit held back about each
 * file's runs are counted in the log now, so that every loss at least
 * reaches it as a number.
 */
static void
log_suppressed (struct engine *e)
{
  uint32_t b;
  char buf[32];

  for (b = 0; b < e->cfg.nr_backings; ++b) {
    struct ratelimit *rl = &e->files[b].log;

    if (rl->suppressed == 0)
      continue;
    eng_log (e, 0, "file=%s: %" PRIu64 " more failure message%s about "
             "its runs suppressed since the last one", file_name (e, b,
             buf, sizeof buf), rl->suppressed,
             rl->suppressed == 1 ? "" : "s");
    rl->suppressed = 0;
  }
}

static bool
conn_settled (const struct eng_conn *c)
{
  return c->nr_unfinished == 0 && list_empty (&c->mem_wait);
}

static void
check_waiters (struct engine *e, uint64_t now, struct eng_actions *out)
{
  struct eng_op *op, *next;
  struct eng_conn *c, *cnext;

  while ((op = wait_first (&e->flush_wait)) != NULL && flush_ready (e, op)) {
    list_del (&op->wait);
    wait_sync (e, op, now, out);
  }
  list_for_each_safe (op, next, &e->read_wait, wait)
    if (!read_blocked (e, op)) {
      list_del (&op->wait);
      op_answer (op, 0, out);
      op_release (op, out);
    }
  list_for_each_safe (c, cnext, &e->conns, link) {
    admit_waiters (e, c, now, out);
    if (c->close_op && conn_settled (c)) {
      op = c->close_op;
      c->close_op = NULL;
      log_suppressed (e);
      op_answer (op, 0, out);
      op_release (op, out);
    }
  }
  if (e->shutdown_op && list_empty (&e->unfinished)) {
    op = e->shutdown_op;
    e->shutdown_op = NULL;
    log_suppressed (e);
    wait_sync (e, op, now, out);
  }
}

/* ---- time ---- */

/* When must c's plug go out at the latest?  UINT64_MAX: never. */
static uint64_t
plug_deadline (const struct engine *e, const struct eng_conn *c)
{
  uint64_t d;

  if (plug_is_empty (&c->plug))
    return UINT64_MAX;
  /* An unplug ran out of memory: whatever asked for it (a FLUSH, a
   * read, an overlapping write, a timer) still waits, so the plug goes
   * out as soon as it may try again, not at idle= or max-delay=.
   */
  if (c->unplug_retry_ns > 0)
    return c->unplug_retry_ns;
  d = eng_add_ns (c->plug.oldest_ns, e->cfg.max_delay_ns);
  if (e->cfg.idle_ns > 0)
    d = MIN (d, eng_add_ns (c->last_activity_ns, e->cfg.idle_ns));
  return d;
}

void
engine_tick (struct engine *e, uint64_t now, struct eng_actions *out)
{
  struct eng_conn *c;
  uint32_t b;

  list_for_each (c, &e->conns, link) {
    struct eng_op *op;

    if (!plug_is_empty (&c->plug) && now >= plug_deadline (e, c)) {
      bool aged = now >= eng_add_ns (c->plug.oldest_ns, e->cfg.max_delay_ns);

      /* Hold mode: a timer had to release a lone held request while
       * nothing else of the client waited: see enum conn_pace.
       */
      if (e->cfg.mode == ENG_HOLD) {
        c->lone_streak = c->plug.reqs.len == 1 && c->nr_waiting <= 1 ?
          c->lone_streak + 1 : 0;
        if (c->lone_streak >= LONE_STREAK)
          c->pace = PACE_PASSTHROUGH;
        else if (c->pace == PACE_PLUG)
          pace_idle (c);
      }
      conn_unplug (e, c, aged ? PLUG_UNPLUG_MAX_DELAY : PLUG_UNPLUG_IDLE,
                   now, out);
    }
    while ((op = wait_first (&c->mem_wait)) != NULL && now >= op->deadline_ns)
      refuse_waiter (c, op, out);
  }
  for (b = 0; b < e->cfg.nr_backings; ++b) {
    struct eng_file *f = &e->files[b];

    if (f->state == FILE_DELAYED && f->nr_queued > 0 &&
        now >= f->delay_until) {
      STATS_ADD (list_first (&f->queue, struct eng_run, qlink)->conn->stats->
                 timer_fired, 1);
      queue_dispatch (e, b, now, false, out);
    }
  }
  check_waiters (e, now, out);
}

bool
engine_deadline_may_be_earlier (struct engine *e)
{
  bool r = e->deadline_earlier;

  e->deadline_earlier = false;
  return r;
}

uint64_t
engine_next_deadline (const struct engine *e)
{
  const struct eng_conn *c;
  uint64_t d = UINT64_MAX;
  uint32_t b;

  list_for_each (c, &e->conns, link) {
    const struct eng_op *w = list_first (&c->mem_wait, struct eng_op, wait);

    d = MIN (d, plug_deadline (e, c));
    if (w)
      d = MIN (d, w->deadline_ns);
  }
  for (b = 0; b < e->cfg.nr_backings; ++b)
    if (e->files[b].state == FILE_DELAYED && e->files[b].nr_queued > 0)
      d = MIN (d, e->files[b].delay_until);
  return d;
}

bool
engine_quiet (const struct engine *e)
{
  return list_empty (&e->unfinished);
}

void
engine_counts (const struct engine *e, struct eng_counts *n)
{
  const struct eng_conn *c;
  const struct eng_op *op;
  uint32_t b;

  memset (n, 0, sizeof *n);
  list_for_each (c, &e->conns, link)
    n->held += c->plug.reqs.len;
  for (b = 0; b < e->cfg.nr_backings; ++b) {
    n->queued += e->files[b].nr_queued;
    n->inflight += e->files[b].inflight;
  }
  list_for_each (op, &e->unfinished, unf)
    n->unfinished++;
  n->bytes = e->bytes;
  n->lost = e->lost;
  n->order_checks = e->order_checks;
  n->widened = e->widened;
}


static const char *
file_state_name (enum file_state s)
{
  switch (s) {
  case FILE_RUNNING: return "running";
  case FILE_DELAYED: return "delayed";
  case FILE_STALLED: return "stalled";
  }
  return "?";
}

void
engine_snapshot (const struct engine *e, struct stats_report *r,
                 struct stats_file_live *files)
{
  const struct eng_conn *c;
  uint32_t b;

  stats_unflushed_total (&e->unflushed, &r->unflushed);
  r->held = r->queued = r->inflight = 0;
  list_for_each (c, &e->conns, link)
    r->held += c->plug.reqs.len;
  for (b = 0; b < e->cfg.nr_backings; ++b) {
    const struct eng_file *f = &e->files[b];

    r->queued += f->nr_queued;
    r->inflight += f->inflight;
    if (files == NULL)
      continue;
    files[b].state = file_state_name (f->state);
    files[b].inflight = f->inflight;
    files[b].queued = f->nr_queued;
    files[b].not_now = f->counts.not_now;
    files[b].errors = f->counts.errors;
    files[b].runs = f->counts.runs;
    files[b].bytes = f->counts.bytes;
    files[b].syncs = f->counts.syncs;
  }
  r->copied_bytes = e->bytes;
}

void
engine_conn_snapshot (const struct eng_conn *c, struct stats_conn_live *s)
{
  s->held = c->plug.reqs.len;
  s->runs = c->nr_runs;
  s->unfinished = c->nr_unfinished;
  s->waiting = c->nr_waiting;
  s->copied_bytes = c->bytes;
}
