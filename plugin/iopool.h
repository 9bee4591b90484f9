/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* iopool.h: threads that carry out blocking jobs (the runs and syncs of
 * local backing files) for threads that should not do them.
 *
 * The engine decides what to write and in which order; these threads
 * only perform the I/O, so that runs that do not depend on each other
 * are in flight at the same time (a slow backend pays its
 * per-operation latency in parallel, and page-cache copies use every
 * core).  The pool knows nothing of what a job does: it calls its fn.
 * It is global: started after nbdkit forked (.after_fork), shared by
 * all connections, stopped and joined at server exit (.cleanup) before
 * anything it could touch goes away.
 */
#ifndef NBDPLUG_IOPOOL_H
#define NBDPLUG_IOPOOL_H

#include <stdbool.h>

#include "list.h"

struct pool_job;
typedef void pool_job_fn (struct pool_job *job);

/* Embedded in the submitter's own structure; owned by the submitter,
 * borrowed by the pool from submit until fn is called (fn may free it).
 */
struct pool_job {
  struct list_node link;        /* Pool's, under its lock. */
  pool_job_fn *fn;
};

/* Which queue: a pool thread takes every URGENT job before a NORMAL
 * one (a sync: FLUSHes wait for it, and it blocks no write).
 */
enum pool_queue {
  POOL_NORMAL,
  POOL_URGENT,
};

/* Start n threads.  Returns 0, or -1 after nbdkit_error. */
extern int iopool_start (unsigned n);

/* Queue job for a pool thread, which calls job->fn (job).  Returns
 * false if the pool is not running: the caller does it itself.  Any
 * thread.
 */
extern bool iopool_submit (struct pool_job *job, enum pool_queue q);

/* Stop and join the threads; jobs still queued are carried out first. */
extern void iopool_stop (void);

#endif /* NBDPLUG_IOPOOL_H */
