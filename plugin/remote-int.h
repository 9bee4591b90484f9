/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* remote-int.h: what the rooms of a remote share (remote.c,
 * remote-conn.c, remote-cmd.c, remote-loop.c).  See remote.h.
 *
 * Threads.  Once remote_start ran, only r's loop thread calls nbd_* on
 * r's handles and touches the fields marked "loop thread".  Other
 * threads append to r->queue and kick the loop (evloop_kick), both under
 * r->lock, so that the loop cannot go away between their decision and
 * the send; the loop decides to exit under r->lock too, and after that
 * nothing is queued any more (remote_issue takes the blocking path).
 *
 * Commands.  struct rcmd is one request of the plugin: a run, a read,
 * a flush, a cache or a block status.  The loop issues it on one
 * handle as one or more NBD commands (split at the server's maximum
 * payload) that all point back at it; it is finished when the last of
 * them is answered or died with its connection.  An rcmd lives on
 * exactly one list at a time: r->queue (other threads to the loop), the
 * in-flight list of its handle, r->parked (waiting for a connection),
 * or r->done (answered, to be handed back after libnbd returned).
 */

#ifndef NBDPLUG_REMOTE_INT_H
#define NBDPLUG_REMOTE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <ev.h>
#include <libnbd.h>

#include "backend.h"
#include "evloop.h"
#include "list.h"
#include "ratelimit.h"
#include "remote.h"

/* The NBD spec's portable maximum payload when a server advertises
 * none ("a client ... SHOULD NOT send a request larger than 32 MiB").
 */
#define DEFAULT_MAX_PAYLOAD (32 * 1024 * 1024)
/* Zero, trim and cache carry no payload and are not limited by the
 * maximum block size (nbdkit's blocksize-policy filter checks only
 * their alignment), but their length is 32 bits on the wire.
 */
#define MAX_NO_PAYLOAD (UINT64_C (1) << 31)
/* Zeroes written where the server cannot zero: one shared buffer. */
#define ZERO_BUF_SIZE (1024 * 1024)
/* At start, a server that could not be connected to is tried again
 * after 100 ms, then after twice as long each time, up to every second
 * (nbdkit-nbd-plugin's retry= waits 1 s): refusals cost nothing, and
 * the plug is up at most a second after its server.
 */
#define START_RETRY_NS 100000000ULL
#define START_RETRY_MAX_NS 1000000000ULL
/* A server that came back with an export that differs from the one
 * learnt at start serves something else until somebody fixes it: a
 * lasting condition, not a blip that the reconnect backoff
 * (requeue-max-delay=, 100 ms by default, per connection) is made for.
 * One connection looks again this often (or every requeue-max-delay=, if
 * that is longer).
 */
#define DIFFERS_RETRY_NS 2000000000ULL
/* A connection that cannot be opened while another one to the same
 * server works: the server is up, and most likely allows fewer
 * connections than remote-connections= (nbdkit --filter=limit,
 * qemu-nbd --shared=N).  The export is served on those that work; the
 * others are tried again after 1 s, doubling up to a minute, so that a
 * slot the server frees again is used without knocking at it ten times
 * a second for as long as nbdkit runs.
 */
#define SPARE_RETRY_NS 1000000000ULL
#define SPARE_RETRY_MAX_NS 60000000000ULL
/* Runs handed back with one call of their done callback. */
#define DONE_BATCH 64
/* flushed_mark before any FLUSH succeeded. */
#define FLUSHED_NEVER UINT64_MAX
/* Ranges a connection keeps of what it answered and no FLUSH covered
 * yet (struct unflushed); one more widens them to their hull.
 */
#define UNFLUSHED_MAX 64

enum rcmd_kind {
  RC_RUN,                       /* A run of the engine (asynchronous). */
  RC_PREAD,                     /* The others: a worker waits. */
  RC_FLUSH,
  RC_CACHE,
  RC_EXTENTS,
};

struct rconn;

struct rcmd {
  struct list_node link;        /* On one list at a time: the queue, its
                                 * handle's in-flight list, parked or
                                 * done. */
  enum rcmd_kind kind;

  /* Set by the submitter; read-only afterwards. */
  struct backend_run *br;       /* RC_RUN: borrowed until its done. */
  enum plug_op op;              /* RC_RUN. */
  bool zero_by_write;           /* RC_RUN zero: the server has no zero. */
  uint32_t flags;               /* LIBNBD_CMD_FLAG_*. */
  uint64_t offset, count;
  char *buf;                    /* Write source, read destination
                                 * (unless nr_segs > 0). */
  void *bounce;                 /* Owned: a merged run's data, in one
                                 * piece (libnbd takes one buffer). */
  size_t nr_segs;               /* RC_RUN write whose members lie in a
                                 * few pieces of memory (arena.h): sent
                                 * as one command per piece, each from
                                 * segs[i].buf for the offsets from
                                 * segs[i].offset to the next one's. */
  struct rseg {
    uint64_t offset;
    char *buf;
  } segs[REMOTE_RUN_SEGS];
  struct remote_wait *wait;     /* Not RC_RUN. */
  struct remote_extent *ext;    /* RC_EXTENTS: the caller's array. */
  size_t max_ext;
  int *nr_ext_out;              /* RC_EXTENTS: where the count goes. */

  /* Loop thread (or the blocking path). */
  struct rconn *conn;
  unsigned pending;             /* NBD commands not answered. */
  int err;                      /* First error the server answered. */
  unsigned nr_errors;           /* Commands the server failed. */
  bool died;                    /* A command died with its connection. */
  size_t nr_ext;
  uint64_t ext_covered;
  uint64_t deadline_ns;         /* Parked: give up then. */
  uint64_t retry_at_ns;         /* Parked after "not now": send again
                                 * then (0: when a connection is up). */
  unsigned attempts;            /* "Not now" answers so far. */
  uint64_t flush_mark;          /* RC_FLUSH: r->mutations when issued. */
  uint64_t flush_epoch;         /* RC_FLUSH: r->flush_epoch when issued. */
  uint64_t seq_lo, seq_hi;      /* RC_RUN: its members' sequence numbers
                                 * (set by the submitter). */
  uint64_t losses_seen;         /* RC_FLUSH: r->losses when requested. */
};

/* Data a connection answered and no FLUSH has covered yet: if the
 * connection dies, the server may have died with it and come back from
 * its last synced state without it (see record_lost).  Neighbours
 * answered between the same two FLUSHes are merged.
 */
struct unflushed {
  uint32_t backing;
  uint64_t offset, end;
  uint64_t seq_lo, seq_hi;      /* The mutations that last wrote it. */
  uint64_t answer;              /* r->answers at its first answer. */
  uint64_t epoch;               /* r->flush_epoch at its last answer:
                                 * FLUSHes issued before it. */
};

enum rconn_state {
  RCONN_DOWN,                   /* No handle; next attempt at
                                 * next_attempt_ns. */
  RCONN_CONNECTING,             /* nbd_aio_connect_uri in progress. */
  RCONN_READY,                  /* Takes commands. */
};

struct rconn {
  struct remote *r;
  unsigned idx;
  struct nbd_handle *nbd;       /* Owned; NULL when DOWN. */
  enum rconn_state state;
  int fd;
  ev_io io;
  int events;                   /* What io watches; 0: stopped. */
  bool broken;                  /* An nbd_aio_* call found it dead. */
  list_head inflight;           /* rcmds issued here, unanswered (newest
                                 * first). */
  unsigned nr_inflight;
  unsigned attempts;            /* Failed connection attempts in a row
                                 * (the backoff's, or the spare one's). */
  uint64_t next_attempt_ns;
  uint64_t connect_deadline_ns;
  uint64_t up_since;            /* r->answers when it became READY. */
  struct unflushed unflushed[UNFLUSHED_MAX];
  unsigned nr_unflushed;
  bool widened;                 /* unflushed was widened to its hull
                                 * since it was last empty: one range
                                 * per epoch. */
};

enum remote_state {
  R_STOPPED,                    /* No loop thread: blocking path. */
  R_RUNNING,
  R_STOPPING,                   /* Asked to stop; still serving until
                                 * nothing is in flight. */
};

struct remote {
  struct backend be;            /* First: the remote is a backend. */
  char *uri;                    /* Owned. */
  struct remote_config cfg;
  struct remote_info info;
  char *zero_buf;               /* Owned, when the server has no zero. */
  size_t zero_buf_size;
  uint64_t max_no_payload;      /* MAX_NO_PAYLOAD aligned down. */
  struct rconn conns[REMOTE_MAX_CONNS];
  unsigned nr_ready;            /* Atomic: READY handles. */

  /* Protected by lock. */
  pthread_mutex_t lock;
  enum remote_state state;
  list_head queue;              /* struct rcmd, other threads to the
                                 * loop. */

  /* The blocking path (no loop thread): one command at a time. */
  pthread_mutex_t sync_lock;

  /* The loop and its thread (ev.loop: read-only while the thread
   * runs; ev.kick: under lock, see above).
   */
  struct evloop ev;

  /* Loop thread. */
  ev_timer timer;
  bool stopping;
  uint64_t stop_deadline_ns;
  bool outage_logged;           /* "lost" was logged for this outage. */
  bool differs;                 /* The last handshake found an export
                                 * that differs: probing. */
  uint64_t probe_at_ns;         /* While differs: no connection attempt
                                 * before then. */
  struct ratelimit differs_log;
  bool short_logged;            /* "cannot be opened while others are
                                 * up" was logged; until all are up. */
  struct ratelimit short_log;
  list_head parked;             /* struct rcmd waiting for a connection
                                 * or a retry time. */
  list_head done;               /* struct rcmd answered, to hand back. */
  struct backend_run *batch_runs[DONE_BATCH];
  size_t nr_batch;
  uint64_t answers;             /* Runs answered and tracked (struct
                                 * unflushed), in the order the loop saw
                                 * their answers. */
  uint64_t flush_epoch;         /* FLUSHes issued. */

  /* Atomic: written by the loop thread (or the blocking path, one
   * command at a time), read by workers (remote_start_flush).
   *
   * A FLUSH covers what the server answered before it (NBD spec), so
   * one is needed only if a run was answered since the last FLUSH that
   * succeeded was issued: mutations counts runs answered (whatever the
   * result) except those written with FUA, which are durable once
   * answered; flushed_mark is mutations when that FLUSH was issued
   * (FLUSHED_NEVER at first: the first FLUSH is always sent, it may
   * cover what an earlier client left in the server's cache).
   */
  uint64_t mutations;
  uint64_t flushed_mark;
  /* Atomic, written by the loop thread: connections that died with
   * data no FLUSH covered (record_lost).  A FLUSH requested before one
   * of them fails: it cannot cover what was lost.
   */
  uint64_t losses;

  /* Atomic, written by the loop thread, read by remote_stats. */
  uint64_t conns_lost;          /* READY connections that broke. */
  uint64_t reconnects;          /* Connections the loop made READY. */
  uint64_t outage_since_ns;     /* When the last one up broke; 0: some
                                 * connection is up. */
  uint64_t outage_ns;           /* Outages that ended, summed. */
};

extern const struct backend_ops remote_ops;

static inline struct remote *
remote_of (struct backend *be)
{
  return (struct remote *) be;
}

/* remote-conn.c: the connection policy (loop thread). */
extern void watch (struct remote *r, struct rconn *c);
extern uint64_t attempt_at (const struct remote *r, const struct rconn *c);
extern void start_connect (struct remote *r, struct rconn *c);
extern bool rconn_ready (struct remote *r, struct rconn *c);
extern void rconn_lost (struct remote *r, struct rconn *c, const char *why);

/* remote-cmd.c: the command model. */
extern struct rcmd *cmd_new (enum rcmd_kind kind);
extern void cmd_free (struct rcmd *cmd);
extern const char *kind_name (enum rcmd_kind kind);
extern uint64_t chunk_limit (const struct remote *r, const struct rcmd *cmd);
extern uint64_t seg_len (const struct rcmd *cmd, uint64_t off, uint64_t len);
extern int64_t issue_one (struct remote *r, struct nbd_handle *h,
                          struct rcmd *cmd, uint64_t off, uint64_t len,
                          const nbd_completion_callback *cb);
extern bool connected (struct nbd_handle *h);
extern int done_cb (void *user_data, int *error);
extern bool flush_is_clean (const struct remote *r);
extern void note_mutation (struct remote *r, const struct rcmd *cmd, int err);
extern void note_flushed (struct remote *r, uint64_t mark);
extern void unflushed_cover (struct remote *r, const struct rconn *fc,
                             uint64_t epoch);
extern void record_lost (struct remote *r, struct rconn *c,
                         const char *event);
extern bool flush_saw_loss (struct remote *r, const struct rcmd *cmd);
extern int run_blocking (struct remote *r, struct rcmd *cmd);
extern void cmd_finished (struct remote *r, struct rcmd *cmd);
extern void done_push (struct remote *r, struct rcmd *cmd);
extern void wait_fail (struct remote_wait *w, int err);
extern void sync_done (struct rcmd *cmd, int err);
extern void batch_add (struct remote *r, struct backend_run *br, int err);
extern void batch_flush (struct remote *r);

#endif /* NBDPLUG_REMOTE_INT_H */
