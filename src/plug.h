/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* plug.h: the per-connection plug (pure: no nbdkit, libnbd or libev).
 *
 * The kernel's struct blk_plug, for NBD.  A plug collects the requests
 * that change data (write, zero, trim) between two unplugs.  Unplugging
 * (plug_take_runs) detaches everything held, sorts it by backing file
 * then offset (the kernel sorts by queue when a plug holds requests for
 * several devices: should_sort), and merges neighbours of the same kind
 * into runs: one backend I/O each.
 *
 * Invariant: no two requests held in one plug overlap.  The owner asks
 * plug_conflicts() before plug_add() and unplugs first when the answer
 * is yes.  This one rule gives every ordering guarantee we need without
 * comparing sequence numbers: a later write to the same bytes can never
 * be merged or reordered before an earlier one, and no trim or zero
 * passes a later write.  Tests assert it.
 *
 * Requests are owned by the caller (the glue keeps them in its own
 * request objects); the plug only holds pointers to them.  A run points
 * at the requests it merged; runs are owned by whoever took them.
 *
 * Context: one plug belongs to one connection inside the engine
 * (engine.h), whose caller holds the engine's lock; no locking here.
 */
#ifndef NBDPLUG_PLUG_H
#define NBDPLUG_PLUG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "itree.h"
#include "vector.h"

enum plug_op {
  PLUG_OP_WRITE,
  PLUG_OP_ZERO,
  PLUG_OP_TRIM,
};
#define PLUG_NR_OPS 3

/* Request flags that change how a request may be merged. */
#define PLUG_F_MAY_TRIM 1       /* Zero: may punch a hole (NBD !NO_HOLE). */
#define PLUG_F_FAST 2           /* Zero: NBD FAST_ZERO, fail with ENOTSUP
                                 * rather than be slow. */

/* Why a plug was unplugged; counted per reason in the statistics. */
enum plug_reason {
  PLUG_UNPLUG_FLUSH,            /* NBD_CMD_FLUSH (blk_finish_plug). */
  PLUG_UNPLUG_FUA,              /* A request with NBD_CMD_FLAG_FUA. */
  PLUG_UNPLUG_IDLE,             /* No request for idle= time: the
                                 * submitter sleeps (sched_submit_work). */
  PLUG_UNPLUG_MAX_REQUESTS,     /* BLK_MAX_REQUEST_COUNT. */
  PLUG_UNPLUG_MAX_BYTES,        /* BLK_PLUG_FLUSH_SIZE. */
  PLUG_UNPLUG_MAX_DELAY,        /* The oldest held request got too old. */
  PLUG_UNPLUG_READ,             /* A read or extents overlapped held data. */
  PLUG_UNPLUG_OVERLAP,          /* A new request overlapped held data. */
  PLUG_UNPLUG_CLOSE,            /* Connection close or server shutdown. */
  PLUG_UNPLUG_MEMORY,           /* A writer waits for memory (max-bytes). */
  PLUG_UNPLUG_PARKED,           /* Every worker thread we know of waits in
                                 * the plug: nobody is left to bring the
                                 * request that would unplug it. */
  PLUG_UNPLUG_QUIET,            /* Nothing of the connection is queued or
                                 * in flight: holding cannot merge more
                                 * than what arrives meanwhile. */
};
#define PLUG_NR_REASONS 12

/* Name of a reason as used in statistics and debug messages. */
extern const char *plug_reason_name (enum plug_reason r);

/* A piece: the part of one request (the engine's struct eng_op) that
 * falls in one backing file.  What a plug holds, sorts and merges into
 * runs.
 */
struct plug_piece {
  enum plug_op op;
  uint32_t flags;               /* PLUG_F_*. */
  uint32_t backing;             /* Index of the backing file. */
  uint64_t offset;              /* Offset in the backing file. */
  uint64_t count;               /* Bytes, > 0. */
  uint64_t seq;                 /* Arrival order; set by plug_add(). */
  uint64_t arrival_ns;          /* Caller's clock, for max-delay/stats. */
  const void *buf;              /* PLUG_OP_WRITE: count bytes.  Borrowed
                                 * from the owner of the request. */
  void *opaque;                 /* The owner's request; for completions. */
  struct itree_node node;       /* The plug's, while held: its index. */
};

DEFINE_VECTOR_TYPE (plug_piece_vector, struct plug_piece *)

/* A run: requests of one backing file and one kind that are contiguous
 * and sorted by offset, issued as one backend I/O.
 */
struct plug_run {
  enum plug_op op;
  uint32_t flags;
  uint32_t backing;
  uint64_t offset;
  uint64_t count;               /* Sum of the members' counts. */
  size_t n;                     /* Number of members. */
  size_t prefix;                /* lim->run_prefix when it was made. */
  struct plug_piece *reqs[];    /* Borrowed: members, in offset order. */
};

/* The owner's header in front of a run (plug_limits.run_prefix). */
static inline void *
plug_run_prefix (struct plug_run *run)
{
  return (char *) run - run->prefix;
}

/* A run of n members behind an owner's prefix of `prefix` bytes, the
 * prefix and the run's header zeroed, the member pointers left to the
 * caller, or NULL on ENOMEM.  Not calloc: glibc's calloc bypasses the
 * thread cache that malloc takes from, and a run is made (and freed)
 * for every direct write.
 */
static inline struct plug_run *
plug_run_alloc (size_t prefix, size_t n)
{
  size_t header = prefix + sizeof (struct plug_run);
  char *mem = malloc (header + n * sizeof (struct plug_piece *));
  struct plug_run *run;

  if (mem == NULL)
    return NULL;
  memset (mem, 0, header);
  run = (struct plug_run *) (mem + prefix);
  run->prefix = prefix;
  run->n = n;
  return run;
}

/* Free one run (and its prefix). */
static inline void
plug_run_free (struct plug_run *run)
{
  if (run)
    free (plug_run_prefix (run));
}

DEFINE_VECTOR_TYPE (plug_run_vector, struct plug_run *)

struct plug_limits {
  uint64_t max_requests;        /* Unplug at this many requests. */
  uint64_t max_bytes;           /* Unplug at this many write bytes. */
  uint64_t max_merge;           /* Largest run, in bytes. */
  size_t max_iov;               /* Most members of a write run (IOV_MAX). */
  uint32_t seed;                /* Of the index's shape (src/itree.h). */
  size_t run_prefix;            /* Bytes the owner wants before each run
                                 * in the same allocation (its own run
                                 * header, so that making runs has one
                                 * allocation failure point); a multiple
                                 * of _Alignof (max_align_t).  0: none. */
};

/* How the held requests lie in plug.reqs.  A sequential writer's
 * requests arrive nearly in offset order (nbdkit's worker threads
 * shuffle them only a little), and each is put in its place as it
 * comes: the unplug then has nothing to sort, and a request landing
 * inside the held range (in a gap the shuffle left) is looked up by
 * binary search.  A request whose place is more than PLUG_SORT_SLACK
 * back (random writes) turns the plug to arrival order until it is
 * next emptied: the unplug sorts, a lookup scans (or asks the index).
 */
enum plug_order {
  PLUG_IN_ORDER = 0,            /* Sorted by (backing, offset). */
  PLUG_ARRIVAL,                 /* Appended as they came. */
};

#define PLUG_SORT_SLACK 32

struct plug {
  struct plug_limits lim;
  uint32_t nr_backings;
  plug_piece_vector reqs;       /* Held requests, in `order`. */
  enum plug_order order;
  uint64_t bytes;               /* Write bytes held. */
  uint64_t oldest_ns;           /* arrival_ns of the first held request. */
  uint64_t next_seq;
  bool multiple_backings;       /* should_sort: more than one file held. */
  /* Per backing file, the smallest range [lo, hi) covering every held
   * request, so that a request beyond it (the common sequential case) is
   * known not to conflict without a scan.  Owned: [nr_backings].
   */
  struct { uint64_t lo, hi; } *bounds;
  /* A plug of more than PLUG_SCAN_MAX requests keeps, per backing
   * file, the held requests by offset, so that a request inside the
   * bounds costs O(log n), not a scan of the plug (with
   * max-requests=1048576 the scans were quadratic).  A smaller one
   * scans: keeping the index cost more than the scan at the default
   * 256.  Owned: [nr_backings] or NULL; the nodes are the requests'.
   */
  struct itree *held;
};

#define PLUG_SCAN_MAX 512

/* Initialise an empty plug.  Returns 0, or -1 with errno (ENOMEM,
 * EINVAL for a zero limit).
 */
extern int plug_init (struct plug *p, const struct plug_limits *lim,
                      uint32_t nr_backings)
  __attribute__ ((__nonnull__ (1, 2)));

/* Free the plug's own storage (not the requests it may still hold). */
extern void plug_free (struct plug *p)
  __attribute__ ((__nonnull__ (1)));

static inline bool
plug_is_empty (const struct plug *p)
{
  return p->reqs.len == 0;
}

/* Does [offset, offset+count) of this backing file overlap any held
 * request whose seq is at most max_seq (the owner's numbering, which
 * it may set after plug_add)?
 */
extern bool plug_overlaps_seq (const struct plug *p, uint32_t backing,
                               uint64_t offset, uint64_t count,
                               uint64_t max_seq)
  __attribute__ ((__nonnull__ (1)));

/* ... any held request? */
static inline bool
plug_overlaps (const struct plug *p, uint32_t backing,
               uint64_t offset, uint64_t count)
{
  return plug_overlaps_seq (p, backing, offset, count, UINT64_MAX);
}

/* Would adding r break the no-overlap invariant? */
static inline bool
plug_conflicts (const struct plug *p, const struct plug_piece *r)
{
  return plug_overlaps (p, r->backing, r->offset, r->count);
}

/* Hold r.  The caller must have checked plug_conflicts() (asserted).
 * Sets r->seq.  Returns 0, or -1 with errno ENOMEM (r is not held).
 */
extern int plug_add (struct plug *p, struct plug_piece *r)
  __attribute__ ((__nonnull__ (1, 2)));

/* Should the plug be unplugged now because of its own limits?
 * Returns true and sets *reason (MAX_REQUESTS or MAX_BYTES).
 */
extern bool plug_full (const struct plug *p, enum plug_reason *reason)
  __attribute__ ((__nonnull__ (1, 2)));

/* Unplug: detach every held request, sort by (backing, offset), merge
 * into runs and append them to *runs in dispatch order (backing file,
 * then offset).  The plug is empty afterwards.  Each run is allocated
 * here and owned by the caller (free() it).  Returns 0, or -1 with
 * errno ENOMEM, in which case the plug still holds everything and *runs
 * is unchanged.
 */
extern int plug_take_runs (struct plug *p, plug_run_vector *runs)
  __attribute__ ((__nonnull__ (1, 2)));

/* Sort an array of requests by (backing, offset, seq): exposed for tests. */
extern void plug_sort (struct plug_piece **reqs, size_t n);

/* Merge sorted, non-overlapping requests into runs (appended to *runs)
 * of at most lim->max_merge bytes and lim->max_iov members.  A single
 * request larger than max_merge is a run of its own.  Returns 0, or -1
 * with errno ENOMEM (runs appended so far are freed and removed).
 */
extern int plug_merge (struct plug_piece *const *reqs, size_t n,
                       const struct plug_limits *lim, plug_run_vector *runs)
  __attribute__ ((__nonnull__ (3, 4)));

#endif /* NBDPLUG_PLUG_H */
