/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* iopool.h: threads that issue runs (and syncs) to the backing files.
 *
 * The engine decides what to write and in which order; these threads
 * only perform the I/O, so that runs that do not depend on each other
 * are in flight at the same time (a slow backend pays its
 * per-operation latency in parallel, and page-cache copies use every
 * core).  The pool is global: started after nbdkit forked (.after_fork),
 * shared by all connections, stopped and joined at server exit
 * (.cleanup) before anything it could touch goes away.
 */
#ifndef NBDPLUG_IOPOOL_H
#define NBDPLUG_IOPOOL_H

#include <stdbool.h>

#include "engine.h"

/* Start n threads.  Returns 0, or -1 after nbdkit_error. */
extern int iopool_start (unsigned n);

/* Queue run r (owned by the engine, in flight) for a pool thread.
 * Returns false if the pool is not running: the caller issues r itself.
 * Any thread.
 */
extern bool iopool_submit (struct eng_run *r);

/* Queue sync s (owned by the engine, in flight) for a pool thread, as
 * iopool_submit does a run: a thread that must not block (the timer,
 * a remote's loop) hands its syncs here.
 */
extern bool iopool_submit_sync (struct eng_sync *s);

/* Stop and join the threads; runs and syncs still queued are issued
 * first. */
extern void iopool_stop (void);

#endif /* NBDPLUG_IOPOOL_H */
