/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* backend.h: what a backing file is to the plumbing: an ops table.
 *
 * A backend writes the engine's runs (merged writes, zeroes, trims) and
 * answers the workers' reads, syncs, cache hints and extent queries.
 * Three implement it: the local file (file.c), the NBD export (remote.c)
 * and the fault injector (backend-inject.c) around either.  A backend
 * knows nothing of the engine, its lock or the threads that call it:
 * what it needs is given to its open function, and a run carries the
 * callback its result goes to.
 *
 * A synchronous backend (the local file) writes a run in the calling
 * thread and returns its result.  An asynchronous one (an NBD export:
 * struct backend's `async`) queues it and returns BACKEND_PENDING; its
 * own thread later sets each run's err and calls its done callback,
 * several runs at once where it has them (one lock acquisition for the
 * caller).  A thread that must not block issues only to asynchronous
 * backends; the I/O pool (iopool.h) issues to the others.
 */
#ifndef NBDPLUG_BACKEND_H
#define NBDPLUG_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plug.h"
#include "stats.h"

/* issue's "the result comes later through the run's done callback". */
#define BACKEND_PENDING (-1)

/* struct backend_run's flags. */
#define BACKEND_RUN_FUA 1u      /* Write it durably (NBD's FUA): set only
                                 * for a backend that has can_fua. */

struct backend_run;

/* Results of n runs, each in its err (0 or an errno; EAGAIN and ENOMEM
 * are "not now").  Called by an asynchronous backend's thread, once per
 * run, with runs that share this callback; the runs are the caller's
 * again from here on.
 */
typedef void backend_done_fn (struct backend_run *const *runs, size_t n);

/* One run handed to a backend: owned by the caller, borrowed by the
 * backend from issue until its done callback (or issue's return, when
 * that is not BACKEND_PENDING).
 */
struct backend_run {
  const struct plug_run *run;   /* Borrowed: op, flags, offset, count,
                                 * members (with their bufs). */
  uint32_t flags;               /* BACKEND_RUN_*. */
  struct plug_stats *stats;     /* Borrowed: where the backend counts
                                 * what it did beyond one operation
                                 * (commands, copies, refusals). */
  backend_done_fn *done;        /* Asynchronous backends only. */
  int err;                      /* Set by the backend before done. */
};

/* Acknowledged data that may be gone although its runs were answered:
 * [offset, offset+count) of backing file `backing` (the run's index),
 * last written by the mutations numbered seq_lo to seq_hi.
 */
struct backend_lost {
  uint32_t backing;
  uint64_t offset, count;
  uint64_t seq_lo, seq_hi;
};

/* An asynchronous backend's report of such ranges (with the error the
 * FLUSHes that should have covered them get).  Its own thread.
 */
typedef void backend_lost_fn (const struct backend_lost *lost, size_t n,
                              int err);

struct backend;

struct backend_ops {
  const char *name;

  /* Issue br: returns 0 or an errno (ENOTSUP: a fast zero that cannot
   * be fast; EAGAIN/ENOMEM: not now), or BACKEND_PENDING from an
   * asynchronous backend, which then reports through br->done.
   */
  int (*issue) (struct backend *be, struct backend_run *br);

  /* Blocking operations of a worker: 0, or -1 with errno. */
  int (*pread) (struct backend *be, void *buf, uint64_t count,
                uint64_t offset);
  int (*sync) (struct backend *be);     /* Covers every run answered. */
  int (*cache) (struct backend *be, uint64_t count, uint64_t offset);
  /* Is [offset, offset+count) data or a hole?  Sets *len to the length
   * of the leading extent of one kind and *hole.
   */
  int (*extent) (struct backend *be, uint64_t offset, uint64_t count,
                 uint64_t *len, bool *hole);

  /* Does the kernel let only one run proceed at a time (backing.h,
   * backing_one_writer)?
   */
  bool (*one_writer) (const struct backend *be);

  /* Release everything (context: .unload). */
  void (*close) (struct backend *be);
};

/* The head of every backend's own structure.  Read-only once open. */
struct backend {
  const struct backend_ops *ops;
  bool async;                   /* issue may return BACKEND_PENDING. */
  bool can_fua;                 /* Honours BACKEND_RUN_FUA. */
  bool readonly;                /* Cannot be written (a file opened
                                 * read-only, a read-only export). */
  uint64_t size;
  uint32_t min_block;           /* Requests must be multiples of this. */
};

#endif /* NBDPLUG_BACKEND_H */
