/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* remote.h: a backing file that is an NBD export on a server, reached
 * with libnbd (file=nbd://..., nbd+unix://..., nbds://...).
 *
 * One struct remote per URI, shared by every client connection: a few
 * libnbd handles (one, or up to remote-connections= when the server
 * advertises multi-conn) and one thread running a libev loop that
 * drives them with libnbd's asynchronous API: an ev_io per handle on
 * nbd_aio_get_fd() in the direction nbd_aio_get_direction() asks for,
 * nbd_aio_notify_read/write when it is ready.  Only that thread calls
 * nbd_* on the handles once it runs; other threads queue commands
 * under the remote's mutex and wake it with ev_async_send (ev(3),
 * THREAD LOCKING EXAMPLE), so that many commands are in flight at once
 * without a thread per command.
 *
 * It is a backend (backend.h, remote_backend): runs (merged writes,
 * zeroes, trims) are asynchronous: its issue queues one, the loop
 * splits it at the server's maximum payload into one or more NBD
 * commands, and when the last of them is answered hands the run back
 * through its done callback, first error first.  The
 * libnbd completion callbacks only record results: no nbd_* call on the
 * handle from inside one.  "Not now" is the engine's business: a
 * server's ENOMEM, libnbd's own ENOMEM/EAGAIN, and a connection that is
 * down are returned as the run's result (ENOMEM or EAGAIN), so that the
 * engine requeues the run and retries it after its delay; commands that
 * died with a connection are reported as EAGAIN too (writes are
 * idempotent) and so are written again once it is back.
 *
 * Reads, flushes, cache and block status come from nbdkit worker
 * threads that wait for the answer (struct remote_wait): they are
 * queued the same way; when no connection is up they wait for one, for
 * at most requeue-timeout=, and a command that died with its connection
 * is sent again.
 *
 * What a connection answered (writes and zeroes, without FUA) is kept as
 * ranges until a FLUSH covers it; a connection that dies before hands
 * them to the caller as lost (remote_config.lost: the server may have
 * died too and come back from its last synced state), and a FLUSH
 * requested before that fails with EIO.
 *
 * A connection that breaks is reconnected in the loop with the engine's
 * capped exponential backoff (retry_delay() from src/retry.h,
 * requeue-delay= up to requeue-max-delay=).  A server that came back with
 * an export that differs from struct remote_info in a way the plug
 * relies on (export_differs in remote-conn.c) is not used, and is probed
 * slowly by one connection (DIFFERS_RETRY_NS).  A connection that
 * cannot be opened while another to the same server works is tried
 * again rarely (SPARE_RETRY_NS): the server is served on the others.
 *
 * Before the loop thread starts (.get_ready) and after it stopped
 * (.cleanup), the same operations run synchronously in the calling
 * thread with libnbd's blocking calls.
 */
#ifndef NBDPLUG_REMOTE_H
#define NBDPLUG_REMOTE_H

#include <semaphore.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "retry.h"
#include "stats.h"

/* Most handles per remote (remote-connections= upper bound). */
#define REMOTE_MAX_CONNS 16

/* A merged write whose members lie in at most this many pieces of
 * memory is sent as one NBD command per piece; in more, it is gathered
 * into one buffer first (a second copy of its data).
 */
#define REMOTE_RUN_SEGS 4

struct remote;

/* What the server advertised at the first connection.  Read-only once
 * remote_open returned; a reconnect to an export that breaks it is
 * refused.
 */
struct remote_info {
  uint64_t size;
  bool readonly;
  bool can_flush;
  bool can_fua;
  bool can_trim;
  bool can_zero;
  bool can_fast_zero;
  bool can_multi_conn;
  bool can_cache;
  bool can_extents;             /* base:allocation was negotiated. */
  uint32_t min_block;           /* 1 if not advertised. */
  uint32_t pref_block;          /* 0 if not advertised. */
  uint32_t max_payload;         /* Largest read/write we send: the
                                 * server's maximum (32 MiB if none), a
                                 * multiple of min_block. */
  unsigned nr_conns;            /* Handles in use. */
};

struct remote_config {
  unsigned max_conns;           /* remote-connections= */
  struct retry_policy retry;    /* requeue-timeout= bounds the waits of
                                 * reads and flushes while the server is
                                 * unreachable; reconnects back off from
                                 * requeue-delay= to requeue-max-delay=. */
  uint64_t connect_timeout_ns;  /* connect-timeout=: one attempt (TCP
                                 * connect, TLS and NBD handshakes). */
  uint64_t connect_retry_ns;    /* connect-retry=: how long remote_open
                                 * keeps trying; 0: one attempt. */
  const char *connect_timeout_text;  /* Both as given, for messages. */
  const char *connect_retry_text;
  backend_lost_fn *lost;        /* Where answered data that a dead
                                 * connection may have lost is told. */
};

/* Is name an NBD URI (one of libnbd's schemes)?  Nothing else of the
 * URI is parsed here: libnbd does that.
 */
extern bool remote_is_uri (const char *name);

/* The schemes remote_is_uri accepts, as "nbd://, nbds://, ...", for
 * messages.  Built at the first call: call it from .config (one thread).
 */
extern const char *remote_uri_schemes (void);

/* Connect to uri, synchronously (context: .get_ready): the first
 * connection alone (it tells whether the server allows more), tried
 * again until connect-retry= ran out, each attempt bounded by
 * connect-timeout=; then the others at once, in parallel.  Returns NULL
 * after nbdkit_error naming the URI, libnbd's message and the attempts.
 */
extern struct remote *remote_open (const char *uri,
                                   const struct remote_config *rcfg);

/* Close the handles and free r (context: .unload, after remote_stop);
 * also the backend's close.
 */
extern void remote_close (struct remote *r);

/* r as a backend (backend.h): the same object, closed by its close. */
extern struct backend *remote_backend (struct remote *r)
  __attribute__ ((__nonnull__ (1)));

extern const struct remote_info *remote_info (const struct remote *r);

/* The server's fields of f (stats.h: connections up, lost, reconnects,
 * outage time up to now).  Any thread.
 */
extern void remote_stats (const struct remote *r, uint64_t now,
                          struct stats_file_live *f)
  __attribute__ ((__nonnull__ (1, 3)));

/* Start r's loop thread (context: .after_fork).  Returns 0 or -1 after
 * nbdkit_error.
 */
extern int remote_start (struct remote *r);

/* Stop and join r's loop thread, once the commands in flight are
 * answered (context: .cleanup, after everything was written out).
 */
extern void remote_stop (struct remote *r);

/* Requests whose thread waits for the answer.  Start several (on one or
 * several remotes), then wait for all of them:
 *
 *   struct remote_wait w;
 *   remote_wait_init (&w);
 *   remote_start_pread (r1, &w, buf1, n1, off1);
 *   remote_start_flush (r2, &w);
 *   if (remote_wait (&w) == -1) ... errno is the first error ...
 */
struct remote_wait {
  sem_t done;
  unsigned started;             /* Caller's thread only. */
  int err;                      /* First error (atomic). */
};

extern void remote_wait_init (struct remote_wait *w)
  __attribute__ ((__nonnull__ (1)));
/* Wait for every request started on w; returns 0, or -1 with errno set
 * to the first error.  Destroys w.
 */
extern int remote_wait (struct remote_wait *w)
  __attribute__ ((__nonnull__ (1)));

/* Read [offset, offset+count) of r into buf (split at max_payload). */
extern void remote_start_pread (struct remote *r, struct remote_wait *w,
                                void *buf, uint64_t count, uint64_t offset)
  __attribute__ ((__nonnull__ (1, 2, 3)));
/* NBD_CMD_FLUSH (nothing if the server has no flush or is read-only). */
extern void remote_start_flush (struct remote *r, struct remote_wait *w)
  __attribute__ ((__nonnull__ (1, 2)));
/* NBD_CMD_CACHE (nothing if the server has none: it is advisory). */
extern void remote_start_cache (struct remote *r, struct remote_wait *w,
                                uint64_t count, uint64_t offset)
  __attribute__ ((__nonnull__ (1, 2)));

/* Block status of [offset, offset+count): up to max extents, each with
 * NBD's base:allocation flags (1 hole, 2 zero), into ext[].  Returns
 * their number (>= 1; all data if the server has no base:allocation),
 * or -1 with errno.  Blocks.
 */
struct remote_extent {
  uint64_t length;
  uint32_t flags;
};
extern int remote_extents (struct remote *r, uint64_t offset, uint64_t count,
                           struct remote_extent *ext, size_t max)
  __attribute__ ((__nonnull__ (1, 4)));

#endif /* NBDPLUG_REMOTE_H */
