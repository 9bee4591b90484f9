/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* stats.h: counters of what clients asked and what backends did (pure).
 *
 * One struct plug_stats per connection plus one global total.  Client
 * counters are bumped by nbdkit's worker threads and backend counters by
 * whichever thread completes a run, so every increment is atomic (relaxed:
 * they are statistics, not synchronisation).  Totals are merged at
 * connection close, when no other thread touches that connection.
 */
#ifndef NBDPLUG_STATS_H
#define NBDPLUG_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plug.h"

enum stats_client {
  STATS_C_READ, STATS_C_WRITE, STATS_C_ZERO, STATS_C_TRIM,
  STATS_C_FLUSH, STATS_C_FUA, STATS_C_CACHE, STATS_C_EXTENTS,
};
#define STATS_NR_CLIENT 8

enum stats_backend {
  STATS_B_READ, STATS_B_WRITE, STATS_B_ZERO, STATS_B_TRIM, STATS_B_SYNC,
};
#define STATS_NR_BACKEND 5

struct stats_counter {
  uint64_t ops;
  uint64_t bytes;
};

/* A latency histogram with log2 buckets in microseconds: bucket 0 holds
 * durations under 1 us, bucket i (1 <= i < STATS_HIST_BUCKETS - 1) those
 * in [2^(i-1), 2^i) us, and the last one everything from 2^(N-2) us
 * (about 18 minutes) up.  Power-of-two buckets, as blktrace's btt and
 * bcc's biolatency use: a fixed size, an index from one bit scan, and
 * a percentile known to within a factor of two.
 */
#define STATS_HIST_BUCKETS 32

struct stats_hist {
  uint64_t count;
  uint64_t sum_us;
  uint64_t bucket[STATS_HIST_BUCKETS];
};

enum stats_latency {
  STATS_L_WRITE,                /* A client's write, from nbdkit's call to
                                 * our answer (successes only). */
  STATS_L_FLUSH,                /* A client's FLUSH, the same. */
  STATS_L_HELD,                 /* A request's time in a plug, from its
                                 * arrival to the unplug that took it. */
  STATS_L_BACKEND,              /* A run's time in the backend, from its
                                 * dispatch to its completion (whatever
                                 * the result). */
};
#define STATS_NR_LATENCY 4

struct plug_stats {
  uint64_t connections;
  struct stats_counter client[STATS_NR_CLIENT];
  struct stats_counter backend[STATS_NR_BACKEND];
  uint64_t unplugs[PLUG_NR_REASONS];
  uint64_t direct;              /* Requests that could not merge and were
                                 * written without entering the plug. */
  uint64_t bytes_copied;        /* Client data copied inside the plug:
                                 * writeback's copy of a write, and the
                                 * gathering of a merged run into one
                                 * buffer for an NBD server. */
  uint64_t pooled;              /* Hand-offs of local runs to the I/O
                                 * pool (io-threads=), not issued by the
                                 * thread that made them; a retried run
                                 * counts each time. */
  uint64_t pieces;              /* Pieces made for client requests
                                 * (mutations, and the barriers of reads
                                 * and block status): at most one per
                                 * backing file each (layout_map_files),
                                 * whatever the request's length. */
  uint64_t max_pieces;          /* Most pieces of one request. */
  uint64_t largest_requests;    /* Most requests taken in one unplug. */
  uint64_t largest_bytes;       /* Most bytes taken in one unplug. */
  uint64_t held_total_ns;       /* Sum over requests of time held. */
  uint64_t held_max_ns;
  uint64_t eagain;              /* "Not now" answers from backends. */
  uint64_t timer_fired;         /* Retry timer expirations. */
  uint64_t restarted;           /* Delayed queues restarted early by the
                                 * completion of another in-flight run
                                 * (blk-mq's SCHED_RESTART). */
  uint64_t gave_up;             /* Runs failed after requeue-timeout. */
  uint64_t errors;              /* Backend operations that failed. */
  uint64_t no_slot;             /* Dispatches that found every in-flight
                                 * slot of a file taken (max-inflight=):
                                 * the queue waited for a completion. */
  uint64_t synced_answers;      /* FLUSH and FUA requests (and the exit)
                                 * answered after a round of syncs: over
                                 * backend "sync" ops, how many requests
                                 * one sync served (group commit). */
  uint64_t lost;                /* Acknowledged writes (writeback) that
                                 * failed for good: each was logged and
                                 * made the next FLUSH fail. */
  struct stats_hist latency[STATS_NR_LATENCY];
};

#define STATS_ADD(field, n) \
  __atomic_fetch_add (&(field), (n), __ATOMIC_RELAXED)

/* A running maximum, safe against concurrent updates. */
static inline void
stats_max (uint64_t *field, uint64_t v)
{
  uint64_t cur = __atomic_load_n (field, __ATOMIC_RELAXED);

  while (v > cur &&
         !__atomic_compare_exchange_n (field, &cur, v, false,
                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED))
    ;
}

static inline void
stats_count (struct stats_counter *c, uint64_t bytes)
{
  STATS_ADD (c->ops, 1);
  STATS_ADD (c->bytes, bytes);
}

/* The backend counter of a plug operation. */
static inline enum stats_backend
stats_backend_of (enum plug_op op)
{
  switch (op) {
  case PLUG_OP_WRITE: return STATS_B_WRITE;
  case PLUG_OP_ZERO: return STATS_B_ZERO;
  case PLUG_OP_TRIM: return STATS_B_TRIM;
  }
  return STATS_B_WRITE;         /* Not reached. */
}

/* The bucket of a duration of us microseconds. */
static inline unsigned
stats_hist_bucket (uint64_t us)
{
  unsigned i = us == 0 ? 0 : 64 - __builtin_clzll (us);

  return i < STATS_HIST_BUCKETS ? i : STATS_HIST_BUCKETS - 1;
}

/* Count a duration of ns nanoseconds into h (atomic, any thread). */
static inline void
stats_hist_add (struct stats_hist *h, uint64_t ns)
{
  uint64_t us = ns / 1000;

  STATS_ADD (h->count, 1);
  STATS_ADD (h->sum_us, us);
  STATS_ADD (h->bucket[stats_hist_bucket (us)], 1);
}

/* The same, for a histogram that only one thread at a time counts into
 * (under a lock of the caller's) while others may read it: plain
 * loads and stores, atomic only so that a reader sees whole values.
 */
static inline void
stats_serial_add (uint64_t *field, uint64_t n)
{
  __atomic_store_n (field, __atomic_load_n (field, __ATOMIC_RELAXED) + n,
                    __ATOMIC_RELAXED);
}

static inline void
stats_hist_add_serial (struct stats_hist *h, uint64_t ns)
{
  uint64_t us = ns / 1000;

  stats_serial_add (&h->count, 1);
  stats_serial_add (&h->sum_us, us);
  stats_serial_add (&h->bucket[stats_hist_bucket (us)], 1);
}

/* The exclusive upper bound of bucket i in microseconds (UINT64_MAX for
 * the last, which is open).
 */
extern uint64_t stats_hist_upper_us (unsigned i);

/* The upper bound (stats_hist_upper_us) of the bucket that holds the
 * ceil(permille * count / 1000)-th smallest duration; 0 if h is empty.
 * So at least permille/1000 of the durations are below it.
 */
extern uint64_t stats_hist_percentile_us (const struct stats_hist *h,
                                          unsigned permille)
  __attribute__ ((__nonnull__ (1)));

/* into += from. */
extern void stats_hist_merge (struct stats_hist *into,
                              const struct stats_hist *from)
  __attribute__ ((__nonnull__ (1, 2)));

/* Copy *from, which other threads may be counting into (STATS_ADD),
 * with an atomic load of each field: a snapshot of counters that are
 * each exact, though not all of the same instant.
 */
extern void stats_snapshot (struct plug_stats *to,
                            const struct plug_stats *from)
  __attribute__ ((__nonnull__ (1, 2)));

/* Client writes per backend write, the merge factor; -1 when the
 * backend wrote nothing.
 */
extern double stats_merge_factor (const struct plug_stats *s)
  __attribute__ ((__nonnull__ (1)));

/* ---- The unflushed window ----
 *
 * Mutations (writes, zeroes, trims, without FUA) that a client was told
 * succeeded and that no FLUSH covers yet: what a crash of the server,
 * or of a backing file's host, may lose.  NBD: a FLUSH covers "all
 * write requests for which a reply has already been sent"; the engine
 * makes a FLUSH on any connection cover what every connection had
 * acknowledged (its multi-conn rule).  So each acknowledgement counts
 * into the window open at that moment; a FLUSH, when it arrives,
 * closes that window (its mark) and opens the next; a FLUSH that
 * succeeds empties its own window and every older one; a FLUSH that
 * fails passes its window on to the next newer one (what it covered
 * is covered by nothing yet).  A FUA mutation is answered once synced,
 * so it never counts.  The marks live in the FLUSH requests (no
 * allocation), so there are as many windows as FLUSHes unanswered,
 * plus the open one.
 */
struct stats_window {
  uint64_t bytes;
  uint64_t requests;
  uint64_t oldest_ns;           /* When the oldest was acknowledged;
                                 * meaningless while requests is 0. */
};

struct stats_flush_mark {
  struct stats_window w;        /* Acknowledged after the previous mark
                                 * and before this FLUSH arrived. */
  struct stats_flush_mark *prev, *next;
  bool linked;                  /* Still counted (not yet answered, and
                                 * not covered by a newer FLUSH). */
};

struct stats_unflushed {
  struct stats_window open;     /* Acknowledged since the newest mark. */
  struct stats_flush_mark *head, *tail;         /* Oldest first. */
};

/* A mutation of bytes bytes was acknowledged at now. */
extern void stats_unflushed_ack (struct stats_unflushed *u, uint64_t bytes,
                                 uint64_t now)
  __attribute__ ((__nonnull__ (1)));

/* A FLUSH arrived: m (owned by the FLUSH request, not yet linked)
 * closes the open window.
 */
extern void stats_unflushed_flush_begin (struct stats_unflushed *u,
                                         struct stats_flush_mark *m)
  __attribute__ ((__nonnull__ (1, 2)));

/* The FLUSH of m was answered: ok, or with an error.  Afterwards m is
 * not referenced any more.
 */
extern void stats_unflushed_flush_end (struct stats_unflushed *u,
                                       struct stats_flush_mark *m, bool ok)
  __attribute__ ((__nonnull__ (1, 2)));

/* The whole window: bytes and requests summed, and the oldest. */
extern void stats_unflushed_total (const struct stats_unflushed *u,
                                   struct stats_window *out)
  __attribute__ ((__nonnull__ (1, 2)));

/* ---- The live report (stats-file= while connections are open) ---- */

/* A backing file, as the engine and its backend see it now. */
struct stats_file_live {
  const char *name;             /* Borrowed. */
  bool remote;                  /* An NBD server: the remote fields. */
  /* The engine's queue of the file. */
  const char *state;            /* "running", "stalled", "delayed". */
  uint64_t inflight;            /* Runs issued, not completed. */
  uint64_t queued;              /* Runs waiting for a slot or an older
                                 * overlapping run. */
  uint64_t not_now;             /* "Not now" answers (EAGAIN...). */
  uint64_t errors;              /* Runs that failed (before a split). */
  uint64_t runs, bytes;         /* Runs written (zeroed, trimmed). */
  uint64_t syncs;               /* Syncs issued. */
  /* An NBD server (remote): its connections. */
  uint64_t conns_up, conns;
  uint64_t conns_lost;          /* Connections that broke. */
  uint64_t reconnects;          /* Connections opened by the loop (after a
                                 * break, or late at start). */
  uint64_t outage_ns;           /* Time with no connection up, the
                                 * current outage included. */
  bool in_outage;
};

/* A connection still open. */
struct stats_conn_live {
  uint64_t id;
  uint64_t age_ns;              /* Since it opened. */
  uint64_t held;                /* Requests in its plug. */
  uint64_t runs;                /* Its runs queued or in flight. */
  uint64_t unfinished;          /* Mutations admitted, not finished. */
  uint64_t waiting;             /* Requests whose client waits. */
  uint64_t copied_bytes;        /* Copies of acknowledged data held. */
  struct plug_stats s;
};

struct stats_report {
  const char *mode;
  const char *written_at;       /* "interval", "close" or "exit". */
  uint64_t interval_ns;         /* stats-interval=; 0: none. */
  uint64_t uptime_ns;
  const struct plug_stats *closed;      /* The historical top level:
                                         * closed connections (at exit,
                                         * all of them). */
  const struct plug_stats *totals;      /* Closed and open. */
  struct stats_window unflushed;
  uint64_t unflushed_age_ns;    /* Of the oldest; 0 if none. */
  uint64_t held, queued, inflight, copied_bytes;
  size_t nr_conns;
  const struct stats_conn_live *conns;
  size_t nr_files;
  const struct stats_file_live *files;
};

/* Format r as JSON (the stats-file= format, documented in the man page):
 * the fields of stats_json (r->closed) and the live ones.  Returns a
 * malloc'd string, or NULL with errno.
 */
extern char *stats_report_json (const struct stats_report *r)
  __attribute__ ((__nonnull__ (1)));

/* into += from (sums; maxima for the max_pieces, largest and held_max
 * fields). */
extern void stats_merge (struct plug_stats *into,
                         const struct plug_stats *from)
  __attribute__ ((__nonnull__ (1, 2)));

/* Format as JSON (the stats-file= format, documented in the man page).
 * Returns a malloc'd NUL-terminated string, or NULL with errno.
 */
extern char *stats_json (const struct plug_stats *s, const char *mode)
  __attribute__ ((__nonnull__ (1, 2)));

/* One-line summary for debug messages; same ownership as stats_json. */
extern char *stats_line (const struct plug_stats *s)
  __attribute__ ((__nonnull__ (1)));

#endif /* NBDPLUG_STATS_H */
