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
  uint64_t largest_requests;    /* Most requests taken in one unplug. */
  uint64_t largest_bytes;       /* Most bytes taken in one unplug. */
  uint64_t held_total_ns;       /* Sum over requests of time held. */
  uint64_t held_max_ns;
  uint64_t eagain;              /* "Not now" answers from backends. */
  uint64_t timer_fired;         /* Retry timer expirations. */
  uint64_t restarted;           /* Delayed queues restarted early by the
                                 * completion of another in-flight run
                                 * (blk-mq's SCHED_RESTART). */
  uint64_t gave_up;             /* Runs failed after retry-timeout. */
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

/* into += from (sums; maxima for the largest/held_max fields). */
extern void stats_merge (struct plug_stats *into,
                         const struct plug_stats *from)
  __attribute__ ((__nonnull__ (1, 2)));

/* Format as JSON (the statsfile= format, documented in the man page).
 * Returns a malloc'd NUL-terminated string, or NULL with errno.
 */
extern char *stats_json (const struct plug_stats *s, const char *mode)
  __attribute__ ((__nonnull__ (1, 2)));

/* One-line summary for debug messages; same ownership as stats_json. */
extern char *stats_line (const struct plug_stats *s)
  __attribute__ ((__nonnull__ (1)));

#endif /* NBDPLUG_STATS_H */
