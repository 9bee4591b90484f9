/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* conn.h: one client connection: its plug, its loop thread, and the
 * queue between nbdkit's worker threads and that loop.
 *
 * The path of a write (writeback mode): a worker builds a struct
 * request; if it cannot merge (near no recent request, overlapping
 * nothing held) the worker writes it itself (the direct path, conn.c).
 * Otherwise it copies the data, appends the request to the submission
 * queue under c->lock, records its range in the dirty list (same
 * critical section), kicks the loop with ev_async_send and returns.
 * The loop thread drains the queue into the plug (wakeup_cb), unplugs
 * on a trigger, hands runs to the I/O pool (iopool.h) in an order that
 * keeps overlapping data in sequence, and completes requests as their
 * runs come back.
 *
 * Who may touch what is written next to every field.  Worker threads
 * only: lock, queue, dirty list, kick, wait on their waiter.  No other
 * ev_* call from a worker.
 *
 * Error storage (writeback mode): a run that cannot be written after a
 * real error, or after retry-timeout of "not now", stays held in its
 * backing file's queue (struct bqueue, state BQ_FAILED); deferred_err
 * remembers that it happened.  The next FLUSH reports EIO when either
 * is set, and only a FLUSH after the data really reached the file can
 * succeed.  This is the one place a deferred error lives.
 */
#ifndef NBDPLUG_CONN_H
#define NBDPLUG_CONN_H

#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stdint.h>

#include <ev.h>

#include "iopool.h"
#include "plug.h"
#include "retry.h"
#include "stats.h"
#include "vector.h"

enum req_kind {
  REQ_MUTATE,                   /* write, zero or trim: enters the plug */
  REQ_FLUSH,                    /* unplug, wait for the queues to drain */
  REQ_DRAIN,                    /* the same for another connection's
                                 * FLUSH/FUA (multi-conn) or server exit:
                                 * never consumes our deferred error */
  REQ_BARRIER,                  /* a read/extents overlapping dirty data */
};

/* A worker that waits for its request: lives on the worker's stack. */
struct waiter {
  sem_t done;
  int err;
};

struct request {
  /* Set by the worker before submission; read-only afterwards. */
  enum req_kind kind;
  enum plug_op op;
  bool fua;                     /* NBD_CMD_FLAG_FUA. */
  bool fast;                    /* NBD_CMD_FLAG_FAST_ZERO. */
  uint64_t offset;              /* Export range. */
  uint64_t count;
  uint64_t arrival_ns;
  uint64_t charged;             /* Bytes counted in c->held_bytes. */
  void *copy;                   /* Owned: the data copy (writeback), or
                                 * NULL when buf is nbdkit's (hold). */

  /* Protected by c->lock until the loop takes the queue, then loop
   * thread only.
   */
  struct request *next;         /* Submission queue / parked list. */
  struct waiter *waiter;        /* Borrowed from the waiting worker; NULL
                                 * once posted or if nobody waits. */
  bool async;                   /* Acknowledged at submission (counted
                                 * in c->nr_async). */
  bool parked;                  /* Its waiter counts in c->nr_parked. */

  /* Protected by c->lock: the dirty list readers check. */
  struct request *dprev, *dnext;

  /* Loop thread only. */
  size_t pending;               /* Pieces not yet completed. */
  int err;                      /* First error of any piece. */
  bool failed;                  /* A piece is held after a failure. */
  size_t nr_pieces;
  struct plug_req pieces[];     /* One per backing-file piece. */
};

/* The blk-mq hctx dispatch list, per connection and backing file. */
enum bq_state {
  BQ_OK,
  BQ_DELAYED,                   /* "Not now": retry at next_ns. */
  BQ_FAILED,                    /* Writeback: held after an error; retry
                                 * at next_ns and at every FLUSH. */
};

DEFINE_VECTOR_TYPE (job_vector, struct job *)

/* The runs of one backing file taken out of the plug and not yet
 * completed, oldest first, each wrapped in a job (iopool.h).  Several
 * may be in flight; a run is issued only when no unfinished run of an
 * older unplug overlaps it, so overlapping data reaches the file in the
 * order it was acknowledged.
 */
struct bqueue {
  job_vector jobs;              /* Owned jobs, oldest first. */
  unsigned nr_inflight;
  enum bq_state state;
  struct retry_state retry;
  uint64_t next_ns;             /* When a delayed/failed queue reruns. */
  int err;                      /* Last error (BQ_FAILED). */
};

struct conn {
  /* Protected by conns_lock (conn.c): the registry of open connections
   * that .cleanup drains, because nbdkit 1.32 may run .cleanup and
   * .unload while a connection thread has not reached .close yet.
   */
  struct conn *reg_next;

  /* Read-only after conn_open. */
  struct ev_loop *loop;
  pthread_t thread;
  uint64_t id;                  /* For log messages. */

  /* Protected by lock. */
  pthread_mutex_t lock;
  struct request *queue_head, **queue_tail;
  struct request *dirty;        /* Mutations not yet completed. */
  uint64_t held_bytes;          /* Copied bytes not yet completed. */
  uint64_t nr_async;            /* Acknowledged, not yet completed. */
  bool closing;
  bool stopping;                /* Server exit: no more retry delays. */
  /* nbdkit does not tell a plugin how many worker threads serve a
   * connection (--threads); we learn it by noting every thread that
   * calls us.  When all of them are parked in the plug, no thread is
   * left to read the request that would unplug it: unplug at once (the
   * kernel flushes a task's plug when the task sleeps).
   */
  pthread_t workers[64];
  size_t nr_workers;
  size_t nr_parked;
  struct job *done;             /* Completed by the pool, not yet seen. */
  /* Where the last few writes, zeros and trims started and ended
   * (export offsets): a request that touches one of them on either side
   * is part of a stream (whose requests may arrive in any order across
   * nbdkit's threads) and is worth plugging; any other that overlaps
   * nothing held cannot merge and goes straight to the files (see
   * conn.c, direct path).
   */
  uint64_t recent_start[16], recent_end[16];
  unsigned recent_pos;

  /* Loop thread only. */
  ev_async wakeup;              /* Kicked by worker threads. */
  ev_timer plug_timer;          /* idle= and max-delay= deadlines. */
  ev_timer retry_timer;         /* Delayed backing-file queues. */
  struct plug plug;
  struct bqueue *bq;            /* Owned: [nr_backings]. */
  struct request *parked;       /* FLUSH and BARRIER waiting for queues. */
  unsigned inflight;            /* Jobs in the pool, all files. */
  uint64_t next_batch;          /* Unplug counter for struct job. */
  bool last_attempt;            /* Closing or server exit: what fails now
                                 * is dropped, not retried. */
  bool finishing;               /* Closing: stop once nothing is left. */
  int pending_unplug;           /* -1, or a reason to unplug at the end
                                 * of this wakeup (FUA, fast zero,
                                 * memory): once per batch, not once per
                                 * request. */
  uint64_t last_activity_ns;    /* Last request taken from the queue. */
  /* Hold mode, a client with one request in flight: waiting for idle=
   * can never merge anything (the next request comes only after our
   * reply), it only adds latency.  After LONE_STREAK timer unplugs of a
   * single request, each while no other request of the client waited
   * here, we unplug as soon as the queue is drained, until two or more
   * of its requests wait here at once again.
   */
  unsigned lone_streak;
  bool passthrough;
  int deferred_err;             /* See the comment at the top. */

  /* Atomic counters (any thread). */
  struct plug_stats stats;
};

/* Open a connection: plug, loop, loop thread.  Returns NULL after
 * nbdkit_error.  Context: nbdkit .open.
 */
extern struct conn *conn_open (void);

/* Drain and stop: unplug, last attempt for delayed runs, join the loop
 * thread, publish statistics, free.  Context: nbdkit .close (no worker
 * of this connection is inside the plugin any more).
 */
extern void conn_close (struct conn *c);

/* At server exit (.cleanup): write out every open connection's plug,
 * sync the files, and add the statistics of the connections still open
 * to *live.  It does not wait for them to close: nbdkit 1.32 does not
 * close them before the process exits (see plugin_cleanup).
 */
extern void conns_drain_all (struct plug_stats *live);

/* How many connections have not finished .close.  Any thread. */
extern size_t conns_open (void);

/* Worker side (nbdkit callbacks).  Return 0, or -1 with errno set after
 * nbdkit_error.
 */
extern int conn_pwrite (struct conn *c, const void *buf, uint32_t count,
                        uint64_t offset, bool fua);
extern int conn_zero (struct conn *c, uint32_t count, uint64_t offset,
                      bool may_trim, bool fua, bool fast);
extern int conn_trim (struct conn *c, uint32_t count, uint64_t offset,
                      bool fua);
extern int conn_flush (struct conn *c);
extern int conn_pread (struct conn *c, void *buf, uint32_t count,
                       uint64_t offset);
/* Wait until [offset, offset+count) has no held or in-flight mutation
 * (used before reads and extents).
 */
extern int conn_barrier (struct conn *c, uint64_t offset, uint64_t count);

/* Loop side (loop.c). */
extern void *loop_thread (void *vc);
extern void wakeup_cb (struct ev_loop *loop, ev_async *w, int revents);
extern void plug_timer_cb (struct ev_loop *loop, ev_timer *w, int revents);
extern void retry_timer_cb (struct ev_loop *loop, ev_timer *w, int revents);

/* The loop posts r's waiter: uncount it from c->nr_parked at once, so
 * the "all parked" test never sees a worker that is already awake.
 * Takes c->lock.
 */
extern void conn_unpark (struct conn *c, struct request *r);

/* Create the key that tells a worker thread's exit to its connection. */
extern int conn_init_worker_key (void);

/* A pool thread finished j: hand it back to its loop.  Takes c->lock. */
extern void conn_job_done (struct conn *c, struct job *j);

/* Shared helpers. */
extern void request_free (struct request *r);
/* Remove r from the dirty list and uncharge it.  Takes c->lock. */
extern void conn_retire (struct conn *c, struct request *r);

#endif /* NBDPLUG_CONN_H */
