/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* iopool.h: the threads that issue runs to the backing files.
 *
 * A connection's loop thread decides what to write and in which order;
 * these threads only perform the I/O, so that runs that do not depend
 * on each other are in flight at the same time (a slow backend pays its
 * per-operation latency in parallel, and page-cache copies use every
 * core).  The pool is global: created at the first connection (after
 * nbdkit forked), shared by all connections, stopped at unload.
 *
 * A job goes loop -> pool (iopool_submit) -> its connection's done list
 * (under c->lock, then ev_async_send): the only ev_* call a pool thread
 * makes.
 */
#ifndef NBDPLUG_IOPOOL_H
#define NBDPLUG_IOPOOL_H

#include <stdbool.h>
#include <stdint.h>

#include "plug.h"

struct conn;

struct job {
  /* Set by the loop thread before submission, read-only in flight. */
  struct conn *c;
  struct plug_run *run;         /* Owned by the job. */
  uint64_t batch;               /* Unplug number: runs taken in one unplug
                                 * never overlap each other. */
  /* Written by the pool thread, read by the loop after completion. */
  int err;
  /* Loop thread only, except next (pool queue, then done list). */
  bool inflight;
  struct job *next;
};

/* Start the pool with n threads if it is not running.  Returns 0, or -1
 * after nbdkit_error.  Context: .open (after the fork).
 */
extern int iopool_start (unsigned n);

/* Queue a job.  Context: a loop thread. */
extern void iopool_submit (struct job *j);

/* Stop and join the threads (nothing may be in flight).  Context:
 * .unload.
 */
extern void iopool_stop (void);

#endif /* NBDPLUG_IOPOOL_H */
