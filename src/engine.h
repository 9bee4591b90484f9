/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine.h: the export's state machine (pure: no threads, no clock, no
 * syscalls, no nbdkit, libev or libnbd).
 *
 * One struct engine serves one export and every connection to it.  Each
 * connection (struct eng_conn) has its own plug, the kernel's per-task
 * struct blk_plug; every backing file has one dispatch queue shared by
 * all connections, the kernel's one request queue per device, where the
 * runs of every plug wait for their turn and for a free in-flight slot.
 * Because the queues, the index of what is held and in flight, and the
 * sequence numbers are export-wide, every connection sees every other
 * connection's acknowledged writes, and a FLUSH on any connection covers
 * what any connection had acknowledged before it: NBD's multi-conn rule.
 *
 * Events go in (a request submitted, a run completed with a result, time
 * passed, a connection closing), actions come out in a struct
 * eng_actions: runs to issue, requests to answer, requests to release.
 * The caller holds one lock around every call, performs the actions
 * after dropping it, and arms one timer at engine_next_deadline().
 *
 * Ordering rules, each a named invariant that the unit tests check:
 *
 *  - SEQUENCE.  Every mutation (write, zero, trim) gets a sequence number
 *    when it is admitted, which is when it is acknowledged in writeback
 *    mode.  A FLUSH records the highest number admitted before it (its
 *    horizon) and is answered once every mutation up to the horizon has
 *    finished (written, or failed for good): never later writes.
 *  - NO OVERLAP IN PLUGS.  A mutation that overlaps data held in any
 *    plug (its own or another connection's) first unplugs that plug.  So
 *    of two overlapping mutations, the older one is always in a run
 *    created earlier.
 *  - QUEUE ORDER.  A run is issued only when no unfinished run created
 *    earlier for the same file overlaps it.  With the rule above,
 *    overlapping data reaches the file in sequence order, whichever
 *    connections it came from.  Kept by counting
 *    (eng_run.nr_blockers, engine-queue.c "QUEUE ORDER, kept by
 *    counting") over an index of the unfinished runs by offset, so that
 *    each event looks only at what overlaps it.
 *  - NEVER DROPPED.  "Not now" (EAGAIN, ENOMEM, EBUSY from the backend,
 *    or no free in-flight slot) leaves a run queued in its place; the
 *    file's queue is delayed (blk_delay_queue) or waits for a completion.
 *    A run fails for good only on a real error, or after requeue-timeout
 *    of "not now".
 *  - ERRORS BELONG TO RUNS.  A failed run fails only its own requests;
 *    other runs of the same file go on.  A client that waits for a
 *    mutation (hold mode, FUA, the direct path) gets its error.
 *  - THE RECORD.  An acknowledged mutation that failed for good is
 *    released (memory stays bounded) and its range, with its sequence
 *    number and errno, enters its file's record of lost data; so do the
 *    ranges a failed sync covered, and those a remote connection that
 *    died had answered (engine_record_lost).  Every FLUSH, on any
 *    connection, opened before or after, whose horizon reaches an entry
 *    fails with its errno; an entry leaves the record only when a newer
 *    mutation over its range succeeded and a sync covered it.  A
 *    mutation answered with an error (FUA, hold mode, the direct path)
 *    is not in it, not even its pieces a failed sync covered, before
 *    its last piece failed or after.  NBD: a successful FLUSH means
 *    every write answered before it is on stable storage.
 *  - SYNCS BELONG TO THE ENGINE.  A FLUSH (and a FUA mutation, and the
 *    exit) is answered only after a sync of every file written since
 *    its last sync began, issued after what it covers finished; the
 *    FLUSHes that wait while a sync runs share the next one.
 *
 * Ownership: the caller allocates every struct eng_op (and its pieces
 * and data) and frees it when the engine puts it on a release list; the
 * engine never frees an op and never touches one after releasing it.
 * Runs (struct eng_run) belong to the engine; the caller may read a run
 * it was told to issue until it hands it back with engine_complete().
 * Connections belong to the engine and are freed by engine_conn_free().
 */
#ifndef NBDPLUG_ENGINE_H
#define NBDPLUG_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "itree.h"
#include "list.h"
#include "plug.h"
#include "retry.h"
#include "stats.h"

enum eng_mode {
  ENG_WRITEBACK,                /* Acknowledge a write once it is held. */
  ENG_HOLD,                     /* Answer a write once it is written. */
};

enum eng_kind {
  ENG_WRITE = PLUG_OP_WRITE,
  ENG_ZERO = PLUG_OP_ZERO,
  ENG_TRIM = PLUG_OP_TRIM,
  ENG_FLUSH,                    /* Answered once everything up to its
                                 * horizon is written and synced. */
  ENG_READ,                     /* A barrier before reading (or extents):
                                 * answered when no older unfinished
                                 * mutation overlaps its pieces. */
  ENG_CLOSE,                    /* The connection's last request: answered
                                 * when everything it admitted finished. */
  ENG_SHUTDOWN,                 /* Server exit: answered when every
                                 * connection's mutations finished and
                                 * the files are synced. */
};

/* Op flags. */
#define ENG_F_FUA      1        /* NBD_CMD_FLAG_FUA: answer once written. */
#define ENG_F_FAST     2        /* NBD_CMD_FLAG_FAST_ZERO. */
#define ENG_F_MAY_TRIM 4        /* Zero: may punch a hole. */

/* The configuration; copied by engine_new. */
struct eng_config {
  enum eng_mode mode;
  uint32_t nr_backings;
  uint64_t idle_ns;             /* Unplug when no request came for this
                                 * long; 0: at once. */
  uint64_t max_delay_ns;        /* Unplug when the oldest is this old. */
  struct plug_limits lim;       /* max_requests, max_bytes, max_merge,
                                 * max_iov.  max_bytes is the memory
                                 * bound of a connection's copies; its
                                 * plug unplugs at half of it
                                 * (engine-int.h, ENG_PLUG_SHARE), so
                                 * that one batch is written while the
                                 * next one fills. */
  unsigned max_inflight;        /* Runs in flight per backing file. */
  bool direct;                  /* Write what cannot merge at once. */
  uint64_t direct_size;          /* With direct: a request this large is
                                 * an efficient I/O by itself and is
                                 * written at once too (no copy).  0:
                                 * only by the nearness rule. */
  struct retry_policy retry;
  uint32_t seed;                /* Of the indexes' shapes (src/itree.h):
                                 * the plugin's is random, so that no
                                 * client can pick offsets that make
                                 * them paths; a test's is fixed. */

  /* Called with the caller's lock held, so it must be cheap (the engine
   * rate-limits errors to one line per file per second).  level 0 is an
   * error, 1 a debug message.  May be NULL.
   */
  void (*log) (void *opaque, int level, const char *msg);
  void *log_opaque;
  bool debug_unplug;            /* Log every unplug at level 1. */
  /* Told of every change of state of an op, a run, a file's queue, a
   * connection's pace, a connection or the engine, as "op 17: NEW ->
   * ACKED" (machine, the object's number, from, to), with log_opaque
   * and the caller's lock held.  NULL: not told (the engine then pays
   * one test per change).
   */
  void (*state_log) (void *opaque, const char *msg);
  unsigned inject_unplug_nomem; /* N > 0: every Nth unplug fails as if
                                 * out of memory (a testing aid). */
  const char *const *names;     /* Borrowed: [nr_backings] file names for
                                 * messages, or NULL. */
};

/* Engine-private state of an op, its one truth: whether its client
 * waits, was told, or is answered follows from it.  Every change goes
 * through one function that checks it against the legal transitions
 * (eng_op_transition_legal):
 *
 *   NEW -> ACKED -> FINISHED                 writeback write
 *   NEW -> WAIT_MEMORY -> ACKED -> FINISHED  ... past the memory bound
 *   NEW -> ADMITTED -> ANSWERED -> FINISHED  hold mode, direct, FUA
 *   NEW -> ADMITTED -> SYNC_WAIT -> ...      FUA, once written
 *   NEW -> WAITING -> SYNC_WAIT -> ...       FLUSH, exit
 *   NEW -> WAITING -> ANSWERED -> ...        read, close
 *   NEW, WAIT_MEMORY -> ANSWERED -> ...      answered at once, refused
 */
enum eng_op_state {
  OP_NEW,                       /* Submitted, not yet placed; the client
                                 * waits (except a writeback write,
                                 * which leaves NEW for ACKED at once). */
  OP_WAIT_MEMORY,               /* Writeback, past max-bytes: waits to be
                                 * admitted (the client waits). */
  OP_ACKED,                     /* Admitted (a sequence number, pieces
                                 * held in a plug or in runs), and its
                                 * client was told "written" before it
                                 * finished: a later failure enters THE
                                 * RECORD. */
  OP_ADMITTED,                  /* Admitted; its client waits for the
                                 * result (hold mode, FUA, the direct
                                 * path, a fast zero). */
  OP_WAITING,                   /* FLUSH/READ/CLOSE/SHUTDOWN: parked until
                                 * its condition holds. */
  OP_SYNC_WAIT,                 /* FLUSH, FUA mutation, SHUTDOWN: what it
                                 * covers is written; waits for the
                                 * files' syncs (sync_round). */
  OP_ANSWERED,                  /* On a reply list; the engine is about
                                 * to release it. */
  OP_FINISHED,                  /* Released: the caller frees it. */
};
#define ENG_OP_NR_STATES (OP_FINISHED + 1)

/* May an op go from state `from` to state `to`? */
extern bool eng_op_transition_legal (enum eng_op_state from,
                                     enum eng_op_state to);

/* The name of an op state ("NEW", "ACKED", ...), as the state log says
 * it.
 */
extern const char *eng_op_state_name (enum eng_op_state s);

struct eng_conn;

struct eng_op {
  /* Set by the caller before engine_submit; read-only afterwards. */
  enum eng_kind kind;
  uint32_t flags;               /* ENG_F_*. */
  uint64_t offset, count;       /* Export range (for messages). */
  uint64_t bytes;               /* Bytes of data the caller copied for
                                 * this op (writeback writes): counted
                                 * against max-bytes until released. */
  size_t nr_pieces;
  struct plug_piece *pieces;    /* Borrowed: [nr_pieces], one per backing
                                 * file piece, with backing, offset,
                                 * count, op, flags and (writes) buf set.
                                 * The engine sets seq, arrival_ns and
                                 * opaque. */
  void *waiter;                 /* The caller's, for answering. */

  /* Results, valid once the op is on a reply list (or acknowledged). */
  int err;                      /* 0 or an errno for the client. */
  bool acked;                   /* Set by engine_submit for the caller:
                                 * the client may be answered with
                                 * success right now and the op will
                                 * never be on a reply list.  The engine
                                 * never reads it (its state says so:
                                 * OP_ACKED). */

  /* Engine only. */
  enum eng_op_state state;
  uint64_t id;                  /* For the state log: submission order. */
  struct eng_conn *conn;
  uint64_t seq;                 /* Mutations: admission order. */
  uint64_t horizon;             /* FLUSH/READ: highest seq before it. */
  uint64_t deadline_ns;         /* OP_WAIT_MEMORY: give up then. */
  uint64_t sync_round;          /* OP_SYNC_WAIT: answered when this round
                                 * of syncs is done. */
  size_t pending;               /* Pieces not finished. */
  struct list_node unf;         /* Unfinished mutations, by seq. */
  struct stats_flush_mark flush_mark;   /* FLUSH, SHUTDOWN: its window of
                                         * the unflushed (stats.h). */
  struct list_node wait;        /* A waiting list. */
  struct list_node reply_link, release_link;    /* Action lists. */
};

enum eng_run_state {
  RUN_NEW,                      /* Made by an unplug or a split, not yet
                                 * queued. */
  RUN_BLOCKED,                  /* Queued behind nr_blockers older
                                 * unfinished runs of its file that
                                 * overlap it. */
  RUN_READY,                    /* Queued, free to go: on its file's
                                 * ready list, waiting for a slot. */
  RUN_INFLIGHT,                 /* Given to the caller to issue. */
  RUN_DONE,                     /* Finished (or replaced by its pieces):
                                 * about to be freed. */
};

/* A run: one backend I/O, made of the pieces of one connection's plug
 * that merged (or one piece on the direct path).
 */
struct eng_run {
  struct plug_run *run;         /* What to do: op, flags, backing, offset,
                                 * count, members (with their bufs). */
  /* Engine only. */
  enum eng_run_state state;
  uint64_t id;                  /* For the state log: creation order. */
  struct eng_conn *conn;        /* Whose plug it came from. */
  uint64_t batch;               /* Runs of one batch never overlap. */
  uint64_t min_seq;             /* Oldest member. */
  size_t nr_blockers;           /* QUEUE ORDER: RUN_BLOCKED, the older
                                 * unfinished runs of its file that
                                 * overlap it; 0 otherwise. */
  struct itree_node node;       /* Its file's index of unfinished runs. */
  struct list_node ready_link;  /* RUN_READY: its file's ready list. */
  uint64_t issued_ns;           /* Last issued (hold mode's pacing). */
  struct list_node qlink;       /* Its file's queue. */
  /* Set by the engine, read by the issuer: made by a FLUSH's unplugs,
   * the only run of its file among them (over every connection's plug,
   * since the FLUSH unplugs them all).  The FLUSH syncs the file
   * once it is written, so a backend with FUA may write it durably
   * instead, and skip a sync that then has nothing left to cover (the
   * kernel's blk-flush drops the post-flush of a FUA-capable device and
   * sets FUA on the data).  Two or more runs of one file stay plain:
   * one sync covers them all, where FUA could cost one sync each.
   */
  bool flush_fua;
  struct list_node issue_link;  /* Action list; the issuer may reuse it
                                 * for its own queue once the run is off
                                 * the action list. */
};

/* A sync of one backing file (fdatasync, or NBD_CMD_FLUSH to a remote):
 * issued by the caller like a run, handed back with engine_sync_done.
 * It covers every run of the file that completed before it was issued.
 * Belongs to the engine (one per file); the caller reads `backing`.
 */
struct eng_sync {
  uint32_t backing;
  struct list_node link;        /* Action list; the issuer may reuse it
                                 * once the sync is off that list. */
};

/* What the caller must do after dropping its lock: issue every run in
 * `issue` (and hand each back with engine_complete), every sync in
 * `sync` (engine_sync_done), answer every op in `reply` with op->err,
 * and free every op in `release` (an op may be on both; answer first).
 * The heads point into the struct itself: it is initialised in place
 * (eng_actions_init) and never copied.  An op answered before it
 * finished (a writer let in after waiting for memory) may be released
 * by a later call, whose actions another thread may carry out first:
 * read what an answer needs (op->waiter, op->err) from the reply list
 * before dropping the lock.
 */
struct eng_actions {
  list_head issue;              /* struct eng_run, by issue_link. */
  list_head sync;               /* struct eng_sync, by link. */
  list_head reply;              /* struct eng_op, by reply_link. */
  list_head release;            /* struct eng_op, by release_link. */
};

extern void eng_actions_init (struct eng_actions *a)
  __attribute__ ((__nonnull__ (1)));

struct engine;

/* Create an engine.  Returns NULL with errno (EINVAL for a zero limit
 * or no backing file, ENOMEM).
 */
extern struct engine *engine_new (const struct eng_config *cfg)
  __attribute__ ((__nonnull__ (1)));

/* Free an engine with no connections left (asserted).  Runs still
 * queued are freed; nothing is issued.
 */
extern void engine_free (struct engine *e);

/* Backing file b takes at most n runs in flight (n > 0), instead of
 * cfg.max_inflight: a remote export's queue depth, for instance.
 * Context: before the first connection.
 */
extern void engine_set_max_inflight (struct engine *e, uint32_t b,
                                     unsigned n)
  __attribute__ ((__nonnull__ (1)));

/* Which requests of a backing file the direct path may take
 * (engine_try_direct), where cfg.direct allows it.
 */
enum eng_direct_rule {
  ENG_DIRECT_UNMERGED,          /* What cannot merge at once, and what is
                                 * at least cfg.direct_size: a file that
                                 * writes a request in about the time a
                                 * copy takes (a local file). */
  ENG_DIRECT_LARGE,             /* Only what is at least cfg.direct_size:
                                 * a file whose every operation costs far
                                 * more than a copy (a remote server's
                                 * round trip), where acknowledging from
                                 * the plug and writing with the file's
                                 * parallelism pays even for a request
                                 * that merges with nothing. */
};

/* Backing file b's direct rule (default ENG_DIRECT_UNMERGED).
 * Context: before the first connection.
 */
extern void engine_set_direct_rule (struct engine *e, uint32_t b,
                                    enum eng_direct_rule rule)
  __attribute__ ((__nonnull__ (1)));

/* A new connection; its statistics are counted into *stats (borrowed:
 * must outlive the connection).  Returns NULL with errno (ENOMEM, or
 * ESHUTDOWN after engine_submit of ENG_SHUTDOWN).
 */
extern struct eng_conn *engine_conn_open (struct engine *e,
                                          struct plug_stats *stats)
  __attribute__ ((__nonnull__ (1, 2)));

/* The number the engine's messages about c give it ("connection ID:
 * unplug ..."); 0 until set.  Context: before c's first op.
 */
extern void engine_conn_set_id (struct eng_conn *c, uint64_t id)
  __attribute__ ((__nonnull__ (1)));

/* The statistics of the connection whose plug made r, for the issuer
 * to count in (atomically: STATS_ADD).  Valid until r is completed.
 */
extern struct plug_stats *engine_run_stats (const struct eng_run *r)
  __attribute__ ((__nonnull__ (1)));

/* Free a connection whose ENG_CLOSE op was answered (asserted: it owns
 * nothing unfinished any more).
 */
extern void engine_conn_free (struct engine *e, struct eng_conn *c)
  __attribute__ ((__nonnull__ (1, 2)));

/* How many worker threads serve c (learnt by the caller, which sees
 * each thread that calls it).  When every one of them waits for an
 * answer and nothing of c is in a queue, nobody is left to bring the
 * request that would unplug c: c unplugs now (the kernel flushes a
 * task's plug when it sleeps).
 */
extern void engine_conn_set_workers (struct engine *e, struct eng_conn *c,
                                     unsigned n, uint64_t now,
                                     struct eng_actions *out)
  __attribute__ ((__nonnull__ (1, 2, 5)));

/* The direct path: may op (a write, zero or trim whose data the caller
 * has not copied) be written at once, without entering the plug?  It
 * may when it continues none of c's recent requests (so it could not
 * merge) and every file of its pieces has the rule ENG_DIRECT_UNMERGED,
 * or it is at least cfg.direct_size; and it overlaps nothing unfinished,
 * and its files have free slots.
 * If so, returns true: op is admitted, its runs are on out->issue and
 * the client waits for the answer (the data stays the caller's until
 * then).  Otherwise returns false and nothing changed but c's memory
 * of recent requests.
 */
extern bool engine_try_direct (struct engine *e, struct eng_conn *c,
                               struct eng_op *op, uint64_t now,
                               struct eng_actions *out)
  __attribute__ ((__nonnull__ (1, 2, 3, 5)));

/* Submit op on connection c at time now.  Afterwards op->acked says
 * whether the client may be answered with success at once; otherwise
 * the answer comes on a reply list (possibly out's, right now).
 * Returns 0, or -1 with errno (ENOMEM; ESHUTDOWN for a mutation on a
 * closing connection or after ENG_SHUTDOWN; EINVAL for no pieces) when
 * op could not even be accepted: nothing was acknowledged, and the
 * caller answers the error and frees op.  Either way the caller
 * performs out: a refused op may have unplugged other connections'
 * acknowledged data before it was refused (make_room), and those runs
 * are on out.  c may be NULL only for ENG_SHUTDOWN (the server's exit
 * is nobody's connection).
 *
 * Writes in writeback mode must carry the caller's own copy of the
 * data (op->bytes says how much); in hold mode, and for a FUA write,
 * the data may be borrowed: the client waits.
 */
extern int engine_submit (struct engine *e, struct eng_conn *c,
                          struct eng_op *op, uint64_t now,
                          struct eng_actions *out)
  __attribute__ ((__nonnull__ (1, 3, 5)));

/* Run r, issued before, completed with err (0 or an errno) at now. */
extern void engine_complete (struct engine *e, struct eng_run *r, int err,
                             uint64_t now, struct eng_actions *out)
  __attribute__ ((__nonnull__ (1, 2, 5)));

/* Acknowledged data in [offset, offset + count) of backing file b, last
 * written by mutations with sequence numbers in [seq_lo, seq_hi], may
 * be gone although its runs were answered: a remote connection that
 * answered them died before a FLUSH covered them (the server may have
 * restarted from its last synced state).  Recorded as a failure with
 * err: every FLUSH whose horizon reaches seq_lo fails until a mutation
 * newer than seq_hi over the range succeeds.
 */
extern void engine_record_lost (struct engine *e, uint32_t b,
                                uint64_t offset, uint64_t count,
                                uint64_t seq_lo, uint64_t seq_hi, int err)
  __attribute__ ((__nonnull__ (1)));

/* Sync s, issued before, completed with err (0 or an errno) at now.
 * A failed sync records as lost what the file's runs wrote since its
 * last successful sync (THE RECORD).
 */
extern void engine_sync_done (struct engine *e, struct eng_sync *s, int err,
                              uint64_t now, struct eng_actions *out)
  __attribute__ ((__nonnull__ (1, 2, 5)));

/* Time passed: fire every timer due at now (idle, max-delay, delayed
 * queues, memory waits, close deadlines).
 */
extern void engine_tick (struct engine *e, uint64_t now,
                         struct eng_actions *out)
  __attribute__ ((__nonnull__ (1, 3)));

/* When must engine_tick be called next?  UINT64_MAX: no timer. */
extern uint64_t engine_next_deadline (const struct engine *e)
  __attribute__ ((__nonnull__ (1)));

/* May engine_next_deadline have become earlier since the last call of
 * this function?  (It clears the mark.)  Deadlines appear, or come
 * nearer, only at a few events: a plug's first request, an unplug that
 * ran out of memory, a writer waiting for memory, a close, the exit, a
 * file delayed after "not now", a run queued in a delayed file.  Most
 * calls move deadlines later, or not at all: a timer armed for the old
 * deadline fires early, finds nothing due, and is set again.  So a
 * caller that keeps one timer need not compute the deadline after
 * every call, only when this says so and after the timer fired.
 */
extern bool engine_deadline_may_be_earlier (struct engine *e)
  __attribute__ ((__nonnull__ (1)));

/* Is nothing held, queued or in flight anywhere?  Then a read needs no
 * barrier.
 */
extern bool engine_quiet (const struct engine *e)
  __attribute__ ((__nonnull__ (1)));

/* The live statistics, copied under the caller's lock (the figures
 * are kept as they change: the copy walks no list of requests):
 * unflushed, held, queued, inflight and copied_bytes of *r, and for
 * each backing file the engine's fields of files[b] (state, inflight,
 * queued, not_now, errors, runs, bytes, syncs; files may be NULL).
 */
extern void engine_snapshot (const struct engine *e, struct stats_report *r,
                             struct stats_file_live *files)
  __attribute__ ((__nonnull__ (1, 2)));

/* The engine's fields of a connection's live statistics (held, runs,
 * unfinished, waiting, copied_bytes).
 */
extern void engine_conn_snapshot (const struct eng_conn *c,
                                  struct stats_conn_live *s)
  __attribute__ ((__nonnull__ (1, 2)));

/* Counters for tests and statistics. */
struct eng_counts {
  uint64_t held;                /* Pieces in plugs. */
  uint64_t queued;              /* Runs queued, not in flight. */
  uint64_t inflight;            /* Runs in flight. */
  uint64_t unfinished;          /* Admitted mutations not finished. */
  uint64_t bytes;               /* Copied bytes not released, all
                                 * connections. */
  uint64_t lost;                /* Acknowledged writes that failed for
                                 * good (since engine_new). */
  uint64_t order_checks;        /* Steps taken to keep QUEUE ORDER (since
                                 * engine_new): index nodes looked at,
                                 * ranges compared.  Its cost, which a
                                 * test can bound. */
  uint64_t widened;             /* Times THE RECORD or a file's set of
                                 * ranges written since a sync reached
                                 * its cap and kept a wider range (it
                                 * may over-report from then on). */
};
extern void engine_counts (const struct engine *e, struct eng_counts *n)
  __attribute__ ((__nonnull__ (1, 2)));

/* Saturating a + b for timestamps: a duration of 2^64 ns never wraps. */
static inline uint64_t
eng_add_ns (uint64_t a, uint64_t b)
{
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

#endif /* NBDPLUG_ENGINE_H */
