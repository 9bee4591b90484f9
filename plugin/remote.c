/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* remote.c: NBD exports as backing files.  See remote.h.
 *
 * Threads.  Once remote_start ran, only r's loop thread calls nbd_* on
 * r's handles and touches the fields marked "loop thread".  Other
 * threads append to r->queue and call ev_async_send, both under
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

#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ev.h>
#include <libnbd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backend.h"
#include "cleanup.h"
#include "clock.h"
#include "engine.h"            /* eng_add_ns */
#include "minmax.h"
#include "ratelimit.h"
#include "remote.h"
#include "threads.h"

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
  struct rcmd *next;            /* queue, parked or done list. */
  struct rcmd *cprev, *cnext;   /* Its handle's in-flight list. */
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
  struct rcmd *inflight;        /* rcmds issued here, unanswered. */
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
  struct rcmd *queue, **queue_tail;

  /* The blocking path (no loop thread): one command at a time. */
  pthread_mutex_t sync_lock;

  /* Read-only while the thread runs. */
  struct ev_loop *loop;
  pthread_t thread;

  /* Loop thread. */
  ev_async kick;
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
  struct rcmd *parked, **parked_tail;
  struct rcmd *done, **done_tail;
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

static const struct backend_ops remote_ops;

static struct remote *
remote_of (struct backend *be)
{
  return (struct remote *) be;
}

struct backend *
remote_backend (struct remote *r)
{
  return &r->be;
}

static void settle (struct remote *r);
static void open_failed (struct remote *r, struct rconn *c, const char *why);
static void note_answered (struct remote *r, struct rconn *c,
                           const struct rcmd *cmd);

static const char *const uri_schemes[] = {
  "nbd://", "nbds://", "nbd+unix://", "nbds+unix://",
  "nbd+vsock://", "nbds+vsock://",
};
#define NR_URI_SCHEMES (sizeof uri_schemes / sizeof uri_schemes[0])

bool
remote_is_uri (const char *name)
{
  size_t i;

  for (i = 0; i < NR_URI_SCHEMES; ++i)
    if (strncmp (name, uri_schemes[i], strlen (uri_schemes[i])) == 0)
      return true;
  return false;
}

const char *
remote_uri_schemes (void)
{
  static char text[128];
  size_t i, len = 0;

  if (text[0] == '\0')
    for (i = 0; i < NR_URI_SCHEMES; ++i)
      len += snprintf (text + len, sizeof text - len, "%s%s",
                       i == 0 ? "" : ", ", uri_schemes[i]);
  return text;
}

const struct remote_info *
remote_info (const struct remote *r)
{
  return &r->info;
}

/* ---- handles ---- */

static struct nbd_handle *
new_handle (void)
{
  struct nbd_handle *h = nbd_create ();

  if (h == NULL)
    return NULL;
  /* Block status needs the context before the handshake; a server
   * without it simply does not agree to it (can_extents false).
   */
  if (nbd_add_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1 ||
      /* The URI is the administrator's (the command line), so it may
       * name local files such as ?tls-psk-file=.
       */
      nbd_set_uri_allow_local_file (h, true) == -1) {
    nbd_close (h);
    return NULL;
  }
  return h;
}

/* What the server advertises on h (connected) into *i, all but
 * nr_conns.  Returns -1 after nbdkit_error if the size is unknown.
 */
static int
read_info (const char *uri, struct nbd_handle *h, struct remote_info *i)
{
  int64_t size = nbd_get_size (h), v;

  if (size == -1) {
    nbdkit_error ("file=%s: nbd_get_size: %s", uri, nbd_get_error ());
    return -1;
  }
  i->size = size;
  i->readonly = nbd_is_read_only (h) == 1;
  i->can_flush = nbd_can_flush (h) == 1;
  i->can_fua = nbd_can_fua (h) == 1;
  i->can_trim = nbd_can_trim (h) == 1;
  i->can_zero = nbd_can_zero (h) == 1;
  i->can_fast_zero = nbd_can_fast_zero (h) == 1;
  i->can_multi_conn = nbd_can_multi_conn (h) == 1;
  i->can_cache = nbd_can_cache (h) == 1;
  i->can_extents =
    nbd_can_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
  v = nbd_get_block_size (h, LIBNBD_SIZE_MINIMUM);
  i->min_block = v > 0 ? v : 1;
  v = nbd_get_block_size (h, LIBNBD_SIZE_PREFERRED);
  i->pref_block = v > 0 ? v : 0;
  v = nbd_get_block_size (h, LIBNBD_SIZE_MAXIMUM);
  if (v <= 0 || v > DEFAULT_MAX_PAYLOAD)
    v = DEFAULT_MAX_PAYLOAD;
  /* Never split below the minimum: whole multiples of it. */
  v = v / i->min_block * i->min_block;
  i->max_payload = v > 0 ? v : i->min_block;
  return 0;
}

static void __attribute__ ((__format__ (__printf__, 4, 5)))
append (char *buf, size_t len, size_t *off, const char *fmt, ...)
{
  va_list ap;
  int n;

  if (*off + 2 >= len)
    return;
  if (*off > 0) {
    strcpy (buf + *off, ", ");
    *off += 2;
  }
  va_start (ap, fmt);
  n = vsnprintf (buf + *off, len - *off, fmt, ap);
  va_end (ap);
  if (n > 0)
    *off = MIN (*off + n, len - 1);
}

/* Does the export on h (connected) break what the plug learnt at start
 * and relies on for as long as nbdkit runs: the size; writes allowed;
 * a FLUSH on one connection covering the writes of all (multi-conn,
 * where more than one is used); the commands and flags it sends (FUA,
 * trim, zero, fast zero, cache, block status); the sizes it aligns and
 * splits to?  Gaining a feature is harmless (it goes unused), except
 * flush: a server that now caches writes would never be flushed.
 * Returns true and says what changed in why (len bytes).
 */
static bool
export_differs (const struct remote *r, struct nbd_handle *h,
                char *why, size_t len)
{
  const struct remote_info *was = &r->info;
  struct remote_info now;
  size_t off = 0;

  why[0] = '\0';
  if (read_info (r->uri, h, &now) == -1) {
    append (why, len, &off, "size unknown");
    return true;
  }
  if (now.size != was->size)
    append (why, len, &off, "size %" PRIu64 ", not %" PRIu64,
            now.size, was->size);
  if (!was->readonly) {
    if (now.readonly)
      append (why, len, &off, "read-only");
    if (now.can_flush != was->can_flush)
      append (why, len, &off, now.can_flush ? "flush" : "no flush");
    if (was->can_fua && !now.can_fua)
      append (why, len, &off, "no FUA");
    if (was->can_trim && !now.can_trim)
      append (why, len, &off, "no trim");
    if (was->can_zero && !now.can_zero)
      append (why, len, &off, "no zero");
    if (was->can_fast_zero && !now.can_fast_zero)
      append (why, len, &off, "no fast zero");
  }
  if (was->nr_conns > 1 && !now.can_multi_conn)
    append (why, len, &off, "no multi-conn");
  if (was->can_cache && !now.can_cache)
    append (why, len, &off, "no cache");
  if (was->can_extents && !now.can_extents)
    append (why, len, &off, "no block status");
  if (was->min_block % now.min_block != 0)
    append (why, len, &off, "minimum block size %" PRIu32 ", not %" PRIu32,
            now.min_block, was->min_block);
  if (now.max_payload < was->max_payload)
    append (why, len, &off, "maximum block size %" PRIu32 ", not %" PRIu32,
            now.max_payload, was->max_payload);
  return off > 0;
}

/* ---- connecting at start ---- */

enum attempt_state {
  ATTEMPT_CONNECTING,           /* Handshake under way. */
  ATTEMPT_READY,                /* Connected: h is ready for commands. */
  ATTEMPT_FAILED,               /* h is closed; why says why. */
};

/* One connection attempt of connect_together. */
struct attempt {
  struct nbd_handle *h;
  enum attempt_state state;
  char why[256];
};

static void
attempt_fail (struct attempt *a, const char *why)
{
  snprintf (a->why, sizeof a->why, "%s", why);
  nbd_close (a->h);
  a->h = NULL;
  a->state = ATTEMPT_FAILED;
}

/* After a notify: ready, dead, or still handshaking. */
static void
attempt_check (struct attempt *a)
{
  if (nbd_aio_is_ready (a->h))
    a->state = ATTEMPT_READY;
  else if (nbd_aio_is_dead (a->h) || nbd_aio_is_closed (a->h))
    attempt_fail (a, "the server closed the connection");
}

/* Start n connections to uri and drive their handshakes together with
 * poll(2) until each is ready or failed: those still handshaking after
 * timeout_ns (connect-timeout=) fail with "timed out".  libnbd's
 * nbd_connect_uri has no timeout: a SYN to an address that drops
 * packets would wait for the kernel's retries.  (Resolving a host name
 * is not bounded: libnbd calls getaddrinfo before the first poll.)
 */
static void
connect_together (const struct remote_config *rcfg, const char *uri,
                  struct attempt *a, unsigned n)
{
  uint64_t deadline = eng_add_ns (clock_now_ns (), rcfg->connect_timeout_ns);
  struct pollfd fds[REMOTE_MAX_CONNS];
  unsigned idx[REMOTE_MAX_CONNS];
  unsigned i, k;

  assert (n <= REMOTE_MAX_CONNS);
  for (i = 0; i < n; ++i) {
    a[i].state = ATTEMPT_CONNECTING;
    a[i].why[0] = '\0';
    a[i].h = new_handle ();
    if (a[i].h == NULL)
      attempt_fail (&a[i], nbd_get_error ());
    else if (nbd_aio_connect_uri (a[i].h, uri) == -1)
      attempt_fail (&a[i], nbd_get_error ());
    else
      attempt_check (&a[i]);
  }
  for (;;) {
    uint64_t now = clock_now_ns ();
    int ms, r;

    for (i = k = 0; i < n; ++i) {
      unsigned dir;

      if (a[i].state != ATTEMPT_CONNECTING)
        continue;
      if (now >= deadline) {
        char why[128];

        snprintf (why, sizeof why, "timed out after connect-timeout=%s",
                  rcfg->connect_timeout_text);
        attempt_fail (&a[i], why);
        continue;
      }
      dir = nbd_aio_get_direction (a[i].h);
      fds[k].fd = nbd_aio_get_fd (a[i].h);
      fds[k].events = ((dir & LIBNBD_AIO_DIRECTION_READ) ? POLLIN : 0) |
        ((dir & LIBNBD_AIO_DIRECTION_WRITE) ? POLLOUT : 0);
      fds[k].revents = 0;
      idx[k++] = i;
    }
    if (k == 0)
      return;
    /* Round up: never spin on a sub-millisecond remainder. */
    ms = (int) MIN ((deadline - now + 999999) / 1000000, (uint64_t) INT_MAX);
    r = poll (fds, k, ms);
    if (r == -1 && errno != EINTR) {
      for (i = 0; i < k; ++i)
        attempt_fail (&a[idx[i]], strerror (errno));
      return;
    }
    for (i = 0; i < k && r > 0; ++i) {
      struct attempt *at = &a[idx[i]];
      unsigned dir = nbd_aio_get_direction (at->h);
      int rv = 0;

      if (fds[i].revents == 0)
        continue;
      /* An error or hangup is reported to whichever side libnbd waits
       * on: it reads SO_ERROR or gets EOF and says why.
       */
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) &&
          (dir & LIBNBD_AIO_DIRECTION_READ))
        rv = nbd_aio_notify_read (at->h);
      else if (dir & LIBNBD_AIO_DIRECTION_WRITE)
        rv = nbd_aio_notify_write (at->h);
      if (rv == -1)
        attempt_fail (at, nbd_get_error ());
      else
        attempt_check (at);
    }
  }
}

/* The first connection to uri, tried until connect-retry= ran out.
 * Returns the ready handle, or NULL after nbdkit_error.
 */
static struct nbd_handle *
connect_first (const struct remote_config *rcfg, const char *uri)
{
  uint64_t start = clock_now_ns ();
  uint64_t give_up = eng_add_ns (start, rcfg->connect_retry_ns);
  unsigned attempts = 0;
  struct attempt a;

  for (;;) {
    uint64_t delay, now;

    connect_together (rcfg, uri, &a, 1);
    attempts++;
    if (a.state == ATTEMPT_READY)
      break;
    now = clock_now_ns ();
    delay = START_RETRY_NS << (attempts < 8 ? attempts - 1 : 7);
    delay = MIN (delay, START_RETRY_MAX_NS);
    if (rcfg->connect_retry_ns == 0 || eng_add_ns (now, delay) >= give_up) {
      if (attempts == 1)
        nbdkit_error ("file=%s: cannot connect to the NBD server: %s",
                      uri, a.why);
      else
        nbdkit_error ("file=%s: cannot connect to the NBD server: %s "
                      "(gave up after %u attempts in %.1f s, "
                      "connect-retry=%s)", uri, a.why, attempts,
                      (now - start) / 1e9, rcfg->connect_retry_text);
      return NULL;
    }
    nbdkit_debug ("file=%s: connection attempt %u failed: %s; trying "
                  "again in %.1f s", uri, attempts, a.why, delay / 1e9);
    {
      struct timespec ts = {
        .tv_sec = delay / 1000000000, .tv_nsec = delay % 1000000000
      };

      while (nanosleep (&ts, &ts) == -1 && errno == EINTR)
        ;
    }
  }
  if (attempts > 1)
    nbdkit_debug ("file=%s: connected at attempt %u, after %.1f s",
                  uri, attempts, (clock_now_ns () - start) / 1e9);
  return a.h;
}

struct remote *
remote_open (const char *uri, const struct remote_config *rcfg)
{
  struct remote *r;
  struct nbd_handle *h;
  struct attempt more[REMOTE_MAX_CONNS - 1];
  unsigned i, n;
  char why[256];

  r = calloc (1, sizeof *r);
  if (r == NULL || (r->uri = strdup (uri)) == NULL) {
    nbdkit_error ("file=%s: calloc: %m", uri);
    free (r);
    return NULL;
  }
  r->cfg = *rcfg;
  pthread_mutex_init (&r->lock, NULL);
  pthread_mutex_init (&r->sync_lock, NULL);
  r->queue_tail = &r->queue;
  r->parked_tail = &r->parked;
  r->done_tail = &r->done;
  r->flushed_mark = FLUSHED_NEVER;
  for (i = 0; i < REMOTE_MAX_CONNS; ++i) {
    r->conns[i].r = r;
    r->conns[i].idx = i;
    r->conns[i].fd = -1;
    r->conns[i].state = RCONN_DOWN;
  }

  h = connect_first (rcfg, uri);
  if (h == NULL)
    goto err;
  if (read_info (uri, h, &r->info) == -1) {
    nbd_close (h);
    goto err;
  }
  r->max_no_payload = MAX_NO_PAYLOAD / r->info.min_block * r->info.min_block;
  r->conns[0].nbd = h;
  r->conns[0].fd = nbd_aio_get_fd (h);
  r->conns[0].state = RCONN_READY;
  r->nr_ready = 1;

  /* More than one handle only where the server promises that a FLUSH
   * on one covers the writes answered on all (NBD multi-conn).
   */
  n = r->info.can_multi_conn ? MAX (rcfg->max_conns, 1u) : 1;
  n = MIN (n, (unsigned) REMOTE_MAX_CONNS);
  r->info.nr_conns = n;
  /* The others at once: a slow server costs one handshake time, not
   * n - 1 of them.  Those that fail are tried again by the loop.
   */
  connect_together (rcfg, uri, more, n - 1);
  for (i = 1; i < n; ++i) {
    struct rconn *c = &r->conns[i];
    struct attempt *a = &more[i - 1];

    if (a->state != ATTEMPT_READY) {
      open_failed (r, c, a->why);
      continue;
    }
    if (export_differs (r, a->h, why, sizeof why)) {
      open_failed (r, c, why);
      nbd_close (a->h);
      continue;
    }
    c->nbd = a->h;
    c->fd = nbd_aio_get_fd (a->h);
    c->state = RCONN_READY;
    r->nr_ready++;
  }

  if (!r->info.can_zero && !r->info.readonly) {
    r->zero_buf_size = MIN ((size_t) r->info.max_payload,
                            (size_t) ZERO_BUF_SIZE);
    if (r->zero_buf_size % r->info.min_block != 0)
      r->zero_buf_size = r->info.max_payload;
    r->zero_buf = calloc (1, r->zero_buf_size);
    if (r->zero_buf == NULL) {
      nbdkit_error ("file=%s: calloc: %m", uri);
      goto err;
    }
  }
  nbdkit_debug ("file=%s: size %" PRIu64 "%s, %u connection%s, block size "
                "%" PRIu32 "/%" PRIu32 "/%" PRIu32 ", flush %d fua %d "
                "trim %d zero %d fast-zero %d multi-conn %d cache %d "
                "extents %d",
                uri, r->info.size, r->info.readonly ? " read-only" : "",
                n, n == 1 ? "" : "s", r->info.min_block,
                r->info.pref_block, r->info.max_payload,
                r->info.can_flush, r->info.can_fua, r->info.can_trim,
                r->info.can_zero, r->info.can_fast_zero,
                r->info.can_multi_conn, r->info.can_cache,
                r->info.can_extents);
  r->be.ops = &remote_ops;
  r->be.async = true;
  r->be.can_fua = r->info.can_fua;
  r->be.readonly = r->info.readonly;
  r->be.size = r->info.size;
  r->be.min_block = r->info.min_block;
  return r;

 err:
  remote_close (r);
  return NULL;
}

void
remote_close (struct remote *r)
{
  unsigned i;

  if (r == NULL)
    return;
  assert (r->state == R_STOPPED);
  for (i = 0; i < REMOTE_MAX_CONNS; ++i) {
    struct nbd_handle *h = r->conns[i].nbd;

    if (h == NULL)
      continue;
    /* NBD_CMD_DISC: the polite goodbye, once nothing is in flight. */
    if (nbd_aio_is_ready (h) && nbd_aio_in_flight (h) == 0)
      nbd_shutdown (h, 0);
    nbd_close (h);
    r->conns[i].nbd = NULL;
  }
  pthread_mutex_destroy (&r->lock);
  pthread_mutex_destroy (&r->sync_lock);
  free (r->zero_buf);
  free (r->uri);
  free (r);
}

/* ---- commands ---- */

static struct rcmd *
cmd_new (enum rcmd_kind kind)
{
  struct rcmd *cmd = calloc (1, sizeof *cmd);

  if (cmd)
    cmd->kind = kind;
  return cmd;
}

static void
cmd_free (struct rcmd *cmd)
{
  free (cmd->bounce);
  free (cmd);
}

/* The segment of cmd (nr_segs > 0) that holds off. */
static const struct rseg *
seg_of (const struct rcmd *cmd, uint64_t off)
{
  size_t i = cmd->nr_segs;

  while (i > 1 && cmd->segs[i - 1].offset > off)
    i--;
  return &cmd->segs[i - 1];
}

/* The data of cmd at off (NULL for a command without). */
static char *
buf_at (const struct rcmd *cmd, uint64_t off)
{
  const struct rseg *g;

  if (cmd->nr_segs == 0)
    return cmd->buf ? cmd->buf + (off - cmd->offset) : NULL;
  g = seg_of (cmd, off);
  return g->buf + (off - g->offset);
}

/* len, cut at the end of the segment that holds off: one NBD command
 * takes one buffer.
 */
static uint64_t
seg_len (const struct rcmd *cmd, uint64_t off, uint64_t len)
{
  const struct rseg *g;
  uint64_t end;

  if (cmd->nr_segs == 0)
    return len;
  g = seg_of (cmd, off);
  end = g + 1 < cmd->segs + cmd->nr_segs ? g[1].offset
    : cmd->offset + cmd->count;
  return MIN (len, end - off);
}

/* The longest NBD command this rcmd may be split into. */
static uint64_t
chunk_limit (const struct remote *r, const struct rcmd *cmd)
{
  if (cmd->kind == RC_RUN && cmd->zero_by_write)
    return r->zero_buf_size;
  if (cmd->kind == RC_PREAD ||
      (cmd->kind == RC_RUN && cmd->op == PLUG_OP_WRITE))
    return r->info.max_payload;
  return r->max_no_payload;
}

static int
extent_cb (void *user_data, const char *metacontext, uint64_t offset,
           uint32_t *entries, size_t nr_entries, int *error)
{
  struct rcmd *cmd = user_data;
  size_t i;

  if (strcmp (metacontext, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0)
    return 0;
  /* nr_entries counts integers: nr_entries / 2 pairs. */
  for (i = 0; i + 1 < nr_entries; i += 2) {
    uint64_t len = entries[i];

    if (cmd->nr_ext >= cmd->max_ext || cmd->ext_covered >= cmd->count)
      break;
    /* A server may describe more than was asked: clip. */
    len = MIN (len, cmd->count - cmd->ext_covered);
    if (len == 0)
      break;
    cmd->ext[cmd->nr_ext].length = len;
    cmd->ext[cmd->nr_ext].flags = entries[i + 1];
    cmd->nr_ext++;
    cmd->ext_covered += len;
  }
  return 0;
}

/* Issue one NBD command for [off, off+len) of cmd on h, asynchronously
 * (cb non-NULL) or with libnbd's blocking call.  Returns -1 on error
 * (libnbd's error is set).
 */
static int64_t
issue_one (struct remote *r, struct nbd_handle *h, struct rcmd *cmd,
           uint64_t off, uint64_t len, const nbd_completion_callback *cb)
{
  char *buf = buf_at (cmd, off);
  nbd_extent_callback ecb = { .callback = extent_cb, .user_data = cmd };
  uint32_t fua = cmd->flags & LIBNBD_CMD_FLAG_FUA;

  switch (cmd->kind) {
  case RC_PREAD:
    return cb ? nbd_aio_pread (h, buf, len, off, *cb, 0)
      : nbd_pread (h, buf, len, off, 0);
  case RC_FLUSH:
    return cb ? nbd_aio_flush (h, *cb, 0) : nbd_flush (h, 0);
  case RC_CACHE:
    return cb ? nbd_aio_cache (h, len, off, *cb, 0)
      : nbd_cache (h, len, off, 0);
  case RC_EXTENTS:
    return cb ? nbd_aio_block_status (h, len, off, ecb, *cb, 0)
      : nbd_block_status (h, len, off, ecb, 0);
  case RC_RUN:
    switch (cmd->op) {
    case PLUG_OP_WRITE:
      return cb ? nbd_aio_pwrite (h, buf, len, off, *cb, cmd->flags)
        : nbd_pwrite (h, buf, len, off, cmd->flags);
    case PLUG_OP_ZERO:
      if (cmd->zero_by_write)
        return cb ? nbd_aio_pwrite (h, r->zero_buf, len, off, *cb, fua)
          : nbd_pwrite (h, r->zero_buf, len, off, fua);
      return cb ? nbd_aio_zero (h, len, off, *cb, cmd->flags)
        : nbd_zero (h, len, off, cmd->flags);
    case PLUG_OP_TRIM:
      return cb ? nbd_aio_trim (h, len, off, *cb, fua)
        : nbd_trim (h, len, off, fua);
    }
  }
  abort ();
}

/* Is h still connected (commands can be issued)? */
static bool
connected (struct nbd_handle *h)
{
  return nbd_aio_is_ready (h) == 1 || nbd_aio_is_processing (h) == 1;
}

/* ---- FLUSH bookkeeping (any thread) ---- */

/* Nothing was answered since a FLUSH that succeeded was issued: a
 * FLUSH now has nothing to cover (a striped or concatenated export
 * flushes every server at each FLUSH, most of them often clean).
 */
static bool
flush_is_clean (const struct remote *r)
{
  uint64_t mark = __atomic_load_n (&r->flushed_mark, __ATOMIC_SEQ_CST);

  return mark != FLUSHED_NEVER &&
    __atomic_load_n (&r->mutations, __ATOMIC_SEQ_CST) == mark;
}

/* Run cmd was answered with err: count it unless it is durable already
 * (written with FUA, all of it answered with success).
 */
static void
note_mutation (struct remote *r, const struct rcmd *cmd, int err)
{
  if (err != 0 || !(cmd->flags & LIBNBD_CMD_FLAG_FUA))
    __atomic_add_fetch (&r->mutations, 1, __ATOMIC_SEQ_CST);
}

/* A FLUSH issued when mutations was mark succeeded.  Marks only grow:
 * a later FLUSH may have been answered first.
 */
static void
note_flushed (struct remote *r, uint64_t mark)
{
  uint64_t old = __atomic_load_n (&r->flushed_mark, __ATOMIC_SEQ_CST);

  while ((old == FLUSHED_NEVER || mark > old) &&
         !__atomic_compare_exchange_n (&r->flushed_mark, &old, mark, false,
                                       __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
    ;
}

/* ---- what no FLUSH covered yet (the loop thread) ----
 *
 * NBD: a FLUSH covers the writes the server "completed (replied to)"
 * before it was sent, and with multi-conn those of every connection.
 * Data a connection answered is not durable until such a FLUSH
 * succeeded.  If the connection dies before, the server may have died
 * with it and come back from what it had synced, without that data;
 * the client above was told it was written, and a FLUSH on the new
 * connection would succeed.  So every connection keeps the ranges it
 * answered until a FLUSH covers them, and if it dies they are recorded
 * as failed writes (engine_record_lost), which the FLUSHes report.
 * What is kept is bounded: neighbours answered between the same two
 * FLUSHes are one range, and past UNFLUSHED_MAX ranges they are
 * widened to their hull (more may be reported lost, never less).
 */

/* Does a run answered with success leave data that only a FLUSH makes
 * durable?  Not a trim (NBD: the contents are unspecified until written
 * again), not a command with FUA ("persisted" when answered), and
 * nothing on a server without flush (no volatile cache to lose).
 */
static bool
needs_flush (const struct remote *r, const struct rcmd *cmd)
{
  return r->info.can_flush && cmd->op != PLUG_OP_TRIM &&
    !(cmd->flags & LIBNBD_CMD_FLAG_FUA);
}

/* Do a and b overlap or meet? */
static bool
touches (const struct unflushed *a, const struct unflushed *b)
{
  return a->offset <= b->end && b->offset <= a->end;
}

/* a becomes the hull of a and b: covered only by a FLUSH that covers
 * both.
 */
static void
unflushed_merge (struct unflushed *a, const struct unflushed *b)
{
  assert (a->backing == b->backing);
  a->offset = MIN (a->offset, b->offset);
  a->end = MAX (a->end, b->end);
  a->seq_lo = MIN (a->seq_lo, b->seq_lo);
  a->seq_hi = MAX (a->seq_hi, b->seq_hi);
  a->answer = MIN (a->answer, b->answer);
  a->epoch = MAX (a->epoch, b->epoch);
}

static void
unflushed_remove (struct rconn *c, unsigned i)
{
  c->unflushed[i] = c->unflushed[--c->nr_unflushed];
  if (c->nr_unflushed == 0)
    c->widened = false;
}

/* c keeps UNFLUSHED_MAX ranges already: make them one, their hull;
 * until c keeps none, what is answered between two FLUSHes joins the
 * hull of its epoch.
 */
static void
unflushed_widen (struct remote *r, struct rconn *c)
{
  unsigned i;

  for (i = 1; i < c->nr_unflushed; ++i)
    unflushed_merge (&c->unflushed[0], &c->unflushed[i]);
  c->nr_unflushed = 1;
  if (!c->widened)
    nbdkit_debug ("file=%s: connection %u: more than %u ranges answered "
                  "and not yet flushed: kept as their hull [%" PRIu64
                  ", %" PRIu64 ") until a FLUSH covers it",
                  r->uri, c->idx, UNFLUSHED_MAX, c->unflushed[0].offset,
                  c->unflushed[0].end);
  c->widened = true;
}

/* Run cmd was answered on c with success and needs a FLUSH. */
static void
unflushed_add (struct remote *r, struct rconn *c, const struct rcmd *cmd)
{
  const struct unflushed u = {
    .backing = cmd->br->run->backing,
    .offset = cmd->offset,
    .end = cmd->offset + cmd->count,
    .seq_lo = cmd->seq_lo,
    .seq_hi = cmd->seq_hi,
    .answer = r->answers++,
    .epoch = r->flush_epoch,
  };
  unsigned i, j, last;

  /* A neighbour answered since the same FLUSH was issued: no FLUSH
   * covers one of them without the other.  Once widened, every range
   * of an epoch is one.
   */
  for (;;) {
    for (i = 0; i < c->nr_unflushed; ++i)
      if (c->unflushed[i].epoch == u.epoch &&
          (c->widened || touches (&c->unflushed[i], &u)))
        break;
    if (i < c->nr_unflushed)
      break;
    if (c->nr_unflushed < UNFLUSHED_MAX) {
      c->unflushed[c->nr_unflushed++] = u;
      return;
    }
    unflushed_widen (r, c);
  }
  unflushed_merge (&c->unflushed[i], &u);
  /* Grown, it may meet others now: fold them in. */
  for (j = 0; j < c->nr_unflushed; ) {
    if (j == i || c->unflushed[j].epoch != c->unflushed[i].epoch ||
        (!c->widened && !touches (&c->unflushed[i], &c->unflushed[j]))) {
      ++j;
      continue;
    }
    unflushed_merge (&c->unflushed[i], &c->unflushed[j]);
    last = --c->nr_unflushed;
    if (j != last) {
      c->unflushed[j] = c->unflushed[last];
      if (i == last)
        i = j;
    }
    j = 0;
  }
}

/* A FLUSH issued at epoch `epoch` succeeded on fc.  It covers what was
 * answered before it was issued (an earlier epoch), on any connection
 * (multi-conn), by the server fc has been talking to all along: what was
 * answered since fc came up.  What a server answered before it restarted
 * was answered before fc could connect to its successor, even if the
 * loop has not yet seen that connection die: it is left for the death
 * to record.
 */
static void
unflushed_cover (struct remote *r, const struct rconn *fc, uint64_t epoch)
{
  unsigned n, i;

  for (n = 0; n < r->info.nr_conns; ++n) {
    struct rconn *c = &r->conns[n];

    for (i = 0; i < c->nr_unflushed; ) {
      const struct unflushed *u = &c->unflushed[i];

      if (u->epoch <= epoch && u->answer >= fc->up_since)
        unflushed_remove (c, i);
      else
        ++i;
    }
  }
}

/* cmd was answered on c, all of it, with success.  Called as soon as
 * its last answer is read, before anything else the loop does: a
 * connection noticed dead later must find it.
 */
static void
note_answered (struct remote *r, struct rconn *c, const struct rcmd *cmd)
{
  if (cmd->kind == RC_RUN && needs_flush (r, cmd))
    unflushed_add (r, c, cmd);
  else if (cmd->kind == RC_FLUSH)
    unflushed_cover (r, c, cmd->flush_epoch);
}

/* What c answered and no FLUSH covered may be gone from the server
 * (event says why: c died, or the server's own sync failed).  Record
 * it as failed writes, and count the loss: a FLUSH requested before it
 * cannot cover it (flush_saw_loss).
 */
static void
record_lost (struct remote *r, struct rconn *c, const char *event)
{
  struct backend_lost lost[UNFLUSHED_MAX];
  uint64_t lo = UINT64_MAX, hi = 0;
  unsigned i, n = c->nr_unflushed;
  char wide[128] = "";

  if (n == 0)
    return;
  if (c->widened)
    snprintf (wide, sizeof wide, " (more than %u ranges: widened to the "
              "hull of what was answered between two FLUSHes)",
              UNFLUSHED_MAX);
  for (i = 0; i < n; ++i) {
    const struct unflushed *u = &c->unflushed[i];

    lost[i].backing = u->backing;
    lost[i].offset = u->offset;
    lost[i].count = u->end - u->offset;
    lost[i].seq_lo = u->seq_lo;
    lost[i].seq_hi = u->seq_hi;
    lo = MIN (lo, u->offset);
    hi = MAX (hi, u->end);
  }
  r->cfg.lost (lost, n, EIO);
  __atomic_add_fetch (&r->losses, 1, __ATOMIC_SEQ_CST);
  nbdkit_error ("file=%s: connection %u: %s, with writes the server had "
                "answered and no FLUSH had covered: %u range%s in [%"
                PRIu64 ", %" PRIu64 ")%s may be gone from it: recorded as "
                "failed writes, FLUSH fails with EIO until they are "
                "written again", r->uri, c->idx, event, n,
                n == 1 ? "" : "s", lo, hi, wide);
  for (i = 0; i < n; ++i)
    nbdkit_debug ("file=%s: connection %u: may be lost: [%" PRIu64 ", %"
                  PRIu64 "), mutations %" PRIu64 " to %" PRIu64,
                  r->uri, c->idx, lost[i].offset,
                  lost[i].offset + lost[i].count, lost[i].seq_lo,
                  lost[i].seq_hi);
  c->nr_unflushed = 0;
  c->widened = false;
}

/* A connection died with data no FLUSH covered since flush cmd was
 * requested: it cannot cover that data.
 */
static bool
flush_saw_loss (struct remote *r, const struct rcmd *cmd)
{
  return __atomic_load_n (&r->losses, __ATOMIC_SEQ_CST) != cmd->losses_seen;
}

/* ---- the blocking path (no loop thread) ---- */

static int
issue_blocking (struct remote *r, struct rcmd *cmd)
{
  struct nbd_handle *h = NULL;
  uint64_t off = cmd->offset, left = cmd->count;
  uint64_t lim = chunk_limit (r, cmd);
  unsigned i;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&r->sync_lock);

  for (i = 0; i < r->info.nr_conns && h == NULL; ++i)
    if (r->conns[i].state == RCONN_READY && connected (r->conns[i].nbd))
      h = r->conns[i].nbd;
  if (h == NULL) {
    nbdkit_error ("file=%s: not connected", r->uri);
    return EIO;
  }
  if (cmd->kind == RC_FLUSH)
    left = 1;                   /* One command, no range. */
  if (cmd->kind == RC_EXTENTS)
    left = MIN (left, lim);
  while (left > 0) {
    uint64_t len = seg_len (cmd, off, MIN (left, lim));

    if (issue_one (r, h, cmd, off, len, NULL) == -1) {
      int err = nbd_get_errno ();

      nbdkit_error ("file=%s: %s", r->uri, nbd_get_error ());
      return err ? err : EIO;
    }
    off += len;
    left -= len;
  }
  if (cmd->kind == RC_EXTENTS)
    *cmd->nr_ext_out = cmd->nr_ext;
  return 0;
}

/* cmd, carried out here and now (the loop is not running); it keeps
 * the FLUSH bookkeeping as finish_done does.
 */
static int
run_blocking (struct remote *r, struct rcmd *cmd)
{
  uint64_t mark = __atomic_load_n (&r->mutations, __ATOMIC_SEQ_CST);
  int err = issue_blocking (r, cmd);

  if (cmd->kind == RC_RUN && err == 0 && cmd->nr_segs > 1)
    STATS_ADD (cmd->br->stats->backend[STATS_B_WRITE].ops,
               cmd->nr_segs - 1);       /* As finish_done. */
  if (cmd->kind == RC_RUN)
    note_mutation (r, cmd, err);
  else if (cmd->kind == RC_FLUSH && err == 0)
    note_flushed (r, mark);
  return err;
}

/* ---- the loop thread: finishing ---- */

static void
conn_list_remove (struct rconn *c, struct rcmd *cmd)
{
  if (cmd->cprev)
    cmd->cprev->cnext = cmd->cnext;
  else
    c->inflight = cmd->cnext;
  if (cmd->cnext)
    cmd->cnext->cprev = cmd->cprev;
  cmd->cprev = cmd->cnext = NULL;
  c->nr_inflight--;
}

static void
done_push (struct remote *r, struct rcmd *cmd)
{
  cmd->next = NULL;
  *r->done_tail = cmd;
  r->done_tail = &cmd->next;
}

/* A write the server was asked to make durable (NBD's FUA) failed with
 * a real error: its own sync may be what failed, and a Linux server
 * reports a writeback error to one sync of the file only, so what it
 * answered unflushed on any connection may be gone although its next
 * FLUSH succeeds (the plugin assumes the same of its own files:
 * engine.c, sync_failed).  The write's own client is told the error.
 */
static void
fua_failed (struct remote *r, const struct rcmd *cmd)
{
  char event[128];
  unsigned i;

  snprintf (event, sizeof event, "a FUA write failed on the server (%s)",
            strerror (cmd->err));
  for (i = 0; i < r->info.nr_conns; ++i)
    record_lost (r, &r->conns[i], event);
}

/* Every NBD command of cmd was answered (or died). */
static void
cmd_finished (struct remote *r, struct rcmd *cmd)
{
  if (cmd->conn) {
    if (cmd->err == 0 && !cmd->died)
      note_answered (r, cmd->conn, cmd);
    else if (cmd->kind == RC_RUN && cmd->err != 0 && !cmd->died &&
             (cmd->flags & LIBNBD_CMD_FLAG_FUA) &&
             !retry_is_transient (cmd->err))
      fua_failed (r, cmd);
    conn_list_remove (cmd->conn, cmd);
    cmd->conn = NULL;
  }
  done_push (r, cmd);
}

/* libnbd's completion callback: record the result, nothing else (no
 * nbd_* call on the handle from here).  Called by libnbd inside
 * nbd_aio_notify_*, or when the connection dies.
 */
static int
done_cb (void *user_data, int *error)
{
  struct rcmd *cmd = user_data;

  if (*error) {
    /* ENOTCONN: the connection ended with the command in flight;
     * ESHUTDOWN: the server is going away and did not do it.  Both are
     * sent again on a connection that works.
     */
    if (*error == ENOTCONN || *error == ESHUTDOWN)
      cmd->died = true;
    else {
      if (cmd->err == 0)
        cmd->err = *error;
      cmd->nr_errors++;
    }
  }
  assert (cmd->pending > 0);
  if (--cmd->pending == 0)
    cmd_finished (cmd->conn->r, cmd);
  return 1;
}

static const char *
kind_name (enum rcmd_kind kind)
{
  switch (kind) {
  case RC_RUN: return "write";
  case RC_PREAD: return "read";
  case RC_FLUSH: return "flush";
  case RC_CACHE: return "cache";
  case RC_EXTENTS: return "block status";
  }
  return "?";
}

static void
wait_fail (struct remote_wait *w, int err)
{
  int zero = 0;

  __atomic_compare_exchange_n (&w->err, &zero, err, false,
                               __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

/* Answer a waiting worker; cmd is freed. */
static void
sync_done (struct rcmd *cmd, int err)
{
  struct remote_wait *w = cmd->wait;

  if (cmd->kind == RC_EXTENTS)
    *cmd->nr_ext_out = err ? 0 : cmd->nr_ext;
  if (err)
    wait_fail (w, err);
  cmd_free (cmd);
  sem_post (&w->done);          /* w may be gone after this. */
}

static void
batch_flush (struct remote *r)
{
  if (r->nr_batch > 0)
    r->batch_runs[0]->done (r->batch_runs, r->nr_batch);
  r->nr_batch = 0;
}

/* Hand br back with err, in a batch of runs with the same callback. */
static void
batch_add (struct remote *r, struct backend_run *br, int err)
{
  if (r->nr_batch == DONE_BATCH ||
      (r->nr_batch > 0 && r->batch_runs[0]->done != br->done))
    batch_flush (r);
  br->err = err;
  r->batch_runs[r->nr_batch++] = br;
}

/* ---- the loop thread: issuing ---- */

/* Commands in flight on one connection before the next is used:
 * nbdkit's default worker count, what one connection of such a server
 * serves at once.  Filling connections in turn instead of spreading
 * every command keeps light traffic on one: each connection costs the
 * server its own wake-ups.  Measured (bench/README.md, 2026-12-05),
 * 4 KiB random writes at queue depth 16 to a fast local nbdkit cost it
 * 36 us of CPU per write spread over four connections, 23 us on one.
 */
#define CONN_FILL 16

/* May a command be sent on c? */
static bool
conn_usable (const struct rconn *c)
{
  return c->state == RCONN_READY && !c->broken;
}

/* The first usable connection with room below CONN_FILL, else the one
 * with the fewest commands in flight.
 */
static struct rconn *
pick_conn (struct remote *r)
{
  struct rconn *best = NULL;
  unsigned i;

  for (i = 0; i < r->info.nr_conns; ++i) {
    struct rconn *c = &r->conns[i];

    if (!conn_usable (c))
      continue;
    if (c->nr_inflight < CONN_FILL)
      return c;
    if (best == NULL || c->nr_inflight < best->nr_inflight)
      best = c;
  }
  return best;
}

/* A FLUSH goes to the connection that has been up the longest: it
 * covers what every connection up since then answered
 * (unflushed_cover).
 */
static struct rconn *
pick_flush_conn (struct remote *r)
{
  struct rconn *best = NULL;
  unsigned i;

  for (i = 0; i < r->info.nr_conns; ++i) {
    struct rconn *c = &r->conns[i];

    if (!conn_usable (c))
      continue;
    if (best == NULL || c->up_since < best->up_since)
      best = c;
  }
  return best;
}

static struct rconn *
conn_for (struct remote *r, const struct rcmd *cmd)
{
  return cmd->kind == RC_FLUSH ? pick_flush_conn (r) : pick_conn (r);
}

static void
park (struct remote *r, struct rcmd *cmd)
{
  if (cmd->deadline_ns == 0)
    cmd->deadline_ns = eng_add_ns (clock_now_ns (), r->cfg.retry.timeout_ns);
  cmd->next = NULL;
  *r->parked_tail = cmd;
  r->parked_tail = &cmd->next;
}

/* A worker's command got "not now" (the server's ENOMEM, libnbd's own
 * ENOMEM): park it and send it again after the engine's backoff, until
 * requeue-timeout.  Returns false when the time is up.
 */
static bool
retry_later (struct remote *r, struct rcmd *cmd)
{
  uint64_t now = clock_now_ns ();

  if (cmd->deadline_ns == 0)
    cmd->deadline_ns = eng_add_ns (now, r->cfg.retry.timeout_ns);
  if (now >= cmd->deadline_ns)
    return false;
  cmd->retry_at_ns = MIN (eng_add_ns (now, retry_delay (&r->cfg.retry,
                                                        cmd->attempts)),
                          cmd->deadline_ns);
  if (cmd->attempts < 64)
    cmd->attempts++;
  park (r, cmd);
  return true;
}

static void
issue (struct remote *r, struct rconn *c, struct rcmd *cmd)
{
  nbd_completion_callback cb = { .callback = done_cb, .user_data = cmd };
  uint64_t off = cmd->offset, left = cmd->count;
  uint64_t lim = chunk_limit (r, cmd);

  cmd->conn = c;
  cmd->err = 0;
  cmd->nr_errors = 0;
  cmd->died = false;
  cmd->retry_at_ns = 0;
  cmd->flush_mark = __atomic_load_n (&r->mutations, __ATOMIC_SEQ_CST);
  if (cmd->kind == RC_FLUSH)
    cmd->flush_epoch = r->flush_epoch++;
  cmd->nr_ext = 0;
  cmd->ext_covered = 0;
  cmd->cprev = NULL;
  cmd->cnext = c->inflight;
  if (c->inflight)
    c->inflight->cprev = cmd;
  c->inflight = cmd;
  c->nr_inflight++;

  if (cmd->kind == RC_FLUSH)
    left = 1;                   /* One command, no range. */
  if (cmd->kind == RC_EXTENTS)
    left = MIN (left, lim);
  /* One extra count while issuing: a command answered at once must not
   * finish cmd before its other pieces are issued.
   */
  cmd->pending = 1;
  while (left > 0) {
    uint64_t len = seg_len (cmd, off, MIN (left, lim));

    cmd->pending++;
    if (issue_one (r, c->nbd, cmd, off, len, &cb) == -1) {
      int err = nbd_get_errno ();

      cmd->pending--;
      if (!connected (c->nbd)) {
        cmd->died = true;
        c->broken = true;
      }
      else if (cmd->err == 0) {
        /* libnbd's own ENOMEM (or EAGAIN) is "not now" for a run. */
        cmd->err = err ? err : EIO;
        nbdkit_debug ("file=%s: %s", r->uri, nbd_get_error ());
      }
      break;
    }
    off += len;
    left -= len;
  }
  if (--cmd->pending == 0)
    cmd_finished (r, cmd);
}

static void
dispatch (struct remote *r, struct rcmd *cmd)
{
  struct rconn *c;

  if (cmd->kind == RC_FLUSH && flush_is_clean (r)) {
    cmd->err = 0;
    cmd->died = false;
    done_push (r, cmd);
    return;
  }
  c = conn_for (r, cmd);
  if (c) {
    issue (r, c, cmd);
    return;
  }
  /* No connection.  A run goes back to the engine, which requeues it
   * and retries it after its delay (bounded by requeue-timeout); a
   * waiting worker waits here for a connection, as long.
   */
  if (cmd->kind == RC_RUN) {
    cmd->died = true;
    done_push (r, cmd);
  }
  else if (r->stopping) {
    cmd->err = EIO;
    done_push (r, cmd);
  }
  else
    park (r, cmd);
}

/* Hand every finished command back: runs to the engine (one batch),
 * answers to waiting workers; a worker's command that died with its
 * connection is sent again.
 */
static void
finish_done (struct remote *r)
{
  struct rcmd *cmd;

  while ((cmd = r->done) != NULL) {
    r->done = cmd->next;
    if (r->done == NULL)
      r->done_tail = &r->done;
    cmd->next = NULL;

    if (cmd->kind == RC_RUN) {
      int err = cmd->err;

      /* First error wins; a piece that died with its connection is
       * "not now": the engine writes the run again (idempotent).
       */
      if (err == 0 && cmd->died)
        err = EAGAIN;
      /* The engine counts the run as one backend write: the server got
       * one per segment.
       */
      if (err == 0 && cmd->nr_segs > 1)
        STATS_ADD (cmd->br->stats->backend[STATS_B_WRITE].ops,
                   cmd->nr_segs - 1);
      /* The engine counts one "not now" for the run: the server gave
       * one per command it refused.
       */
      if (retry_is_transient (err) && cmd->nr_errors > 1)
        STATS_ADD (cmd->br->stats->eagain, cmd->nr_errors - 1);
      note_mutation (r, cmd, err);
      batch_add (r, cmd->br, err);
      cmd_free (cmd);
    }
    else if (cmd->kind == RC_FLUSH && cmd->err == 0 &&
             flush_saw_loss (r, cmd)) {
      /* Sent again, or answered by another connection: either way it
       * covers nothing the dead one answered before it.
       */
      nbdkit_error ("file=%s: flush: a connection died with writes "
                    "answered before this FLUSH and not covered by one "
                    "(see above): they may be gone", r->uri);
      sync_done (cmd, EIO);
    }
    else if (cmd->died && cmd->err == 0)
      dispatch (r, cmd);
    else if (retry_is_transient (cmd->err) && !r->stopping &&
             retry_later (r, cmd))
      ;
    else {
      if (cmd->err)
        nbdkit_error ("file=%s: %s: %s", r->uri, kind_name (cmd->kind),
                      strerror (cmd->err));
      else if (cmd->kind == RC_FLUSH)
        note_flushed (r, cmd->flush_mark);
      sync_done (cmd, cmd->err);
    }
  }
}

/* ---- the loop thread: connections ---- */

/* The engine's own backoff (requeue-delay= up to requeue-max-delay=): the
 * runs that wait for the connection are retried at that pace, so the
 * connection is back at most one such delay after the server.
 */
static uint64_t
reconnect_delay (const struct remote *r, unsigned attempts)
{
  return retry_delay (&r->cfg.retry, attempts);
}

static void
watch (struct remote *r, struct rconn *c)
{
  int want = 0;

  if (c->nbd && c->fd >= 0 && c->state != RCONN_DOWN) {
    unsigned dir = nbd_aio_get_direction (c->nbd);

    if (dir & LIBNBD_AIO_DIRECTION_READ)
      want |= EV_READ;
    if (dir & LIBNBD_AIO_DIRECTION_WRITE)
      want |= EV_WRITE;
  }
  if (want == c->events)
    return;
  if (c->events)
    ev_io_stop (r->loop, &c->io);
  c->events = want;
  if (want) {
    ev_io_set (&c->io, c->fd, want);
    ev_io_start (r->loop, &c->io);
  }
}

/* " (and N more since the last message)" into buf, or "". */
static const char *
more_msg (char *buf, size_t len, uint64_t suppressed)
{
  buf[0] = '\0';
  if (suppressed)
    snprintf (buf, len, " (and %" PRIu64 " more since the last message)",
              suppressed);
  return buf;
}

/* Connecting c failed (before it was ready): when to try again.  The
 * engine's backoff in an outage; the spare one while others work.
 * Context: the loop thread, or remote_open before it runs.
 */
static void
open_failed (struct remote *r, struct rconn *c, const char *why)
{
  unsigned up = __atomic_load_n (&r->nr_ready, __ATOMIC_SEQ_CST);
  uint64_t now = clock_now_ns (), delay, suppressed;
  char more[64];

  nbdkit_debug ("file=%s: connection %u: connecting failed: %s",
                r->uri, c->idx, why);
  if (up > 0 && !r->differs) {
    delay = SPARE_RETRY_NS << (c->attempts < 6 ? c->attempts : 6);
    delay = MIN (delay, SPARE_RETRY_MAX_NS);
    /* Never faster than in an outage (a long requeue-max-delay=). */
    delay = MAX (delay, reconnect_delay (r, c->attempts));
    if (!r->short_logged &&
        ratelimit_allow (&r->short_log, now, &suppressed)) {
      nbdkit_error ("file=%s: connection %u of %u cannot be opened while "
                    "%u %s up (%s): going on with those; trying again "
                    "after %.0f s, then less and less often (up to every "
                    "%.0f s)%s",
                    r->uri, c->idx, r->info.nr_conns, up,
                    up == 1 ? "is" : "are", why, SPARE_RETRY_NS / 1e9,
                    SPARE_RETRY_MAX_NS / 1e9,
                    more_msg (more, sizeof more, suppressed));
      r->short_logged = true;
    }
  }
  else
    delay = reconnect_delay (r, c->attempts);
  c->next_attempt_ns = eng_add_ns (now, delay);
  if (c->attempts < 64)
    c->attempts++;
}

/* c's handle is dead, closed, failed to connect, or given up on. */
static void
conn_lost (struct remote *r, struct rconn *c, const char *why)
{
  enum rconn_state was = c->state;
  struct rcmd *cmd;

  if (c->state == RCONN_READY) {
    char event[256];

    /* First: a FLUSH that comes after the line below fails. */
    snprintf (event, sizeof event, "lost (%s; a server that restarted "
              "from what it had synced)", why);
    record_lost (r, c, event);
    __atomic_add_fetch (&r->conns_lost, 1, __ATOMIC_RELAXED);
    if (__atomic_sub_fetch (&r->nr_ready, 1, __ATOMIC_SEQ_CST) == 0)
      __atomic_store_n (&r->outage_since_ns, clock_now_ns (), __ATOMIC_RELAXED);
    if (!r->outage_logged && !r->stopping)
      nbdkit_error ("file=%s: connection lost (%s): reconnecting; writes "
                    "wait up to requeue-timeout", r->uri, why);
    r->outage_logged = true;
  }
  if (c->events)
    ev_io_stop (r->loop, &c->io);
  c->events = 0;
  /* Closing a dead handle retires what it still holds; whatever libnbd
   * did not answer is answered here, as died.
   */
  nbd_close (c->nbd);
  c->nbd = NULL;
  c->fd = -1;
  while ((cmd = c->inflight) != NULL) {
    cmd->died = true;
    cmd->pending = 0;
    cmd_finished (r, cmd);
  }
  c->state = RCONN_DOWN;
  c->broken = false;
  if (was == RCONN_CONNECTING)
    open_failed (r, c, why);
  else {
    c->next_attempt_ns = eng_add_ns (clock_now_ns (),
                                     reconnect_delay (r, c->attempts));
    if (c->attempts < 64)
      c->attempts++;
  }
}

/* While the export differs, the others wait for this one's answer. */
static uint64_t
differs_delay (const struct remote *r)
{
  return MAX (DIFFERS_RETRY_NS, r->cfg.retry.max_delay_ns);
}

/* When c, down, is to be tried next. */
static uint64_t
attempt_at (const struct remote *r, const struct rconn *c)
{
  return r->differs ? MAX (c->next_attempt_ns, r->probe_at_ns)
    : c->next_attempt_ns;
}

static void
start_connect (struct remote *r, struct rconn *c)
{
  struct nbd_handle *h = new_handle ();

  if (r->differs)
    r->probe_at_ns = eng_add_ns (clock_now_ns (), differs_delay (r));

  if (h == NULL || nbd_aio_connect_uri (h, r->uri) == -1) {
    open_failed (r, c, nbd_get_error ());
    nbd_close (h);
    return;
  }
  c->nbd = h;
  c->fd = nbd_aio_get_fd (h);
  c->state = RCONN_CONNECTING;
  c->connect_deadline_ns =
    eng_add_ns (clock_now_ns (), r->cfg.connect_timeout_ns);
}

/* A reconnect finished its handshake.  Returns false if the export is
 * not the one we had (export_differs): then it is given up on.
 */
static bool
conn_ready (struct remote *r, struct rconn *c)
{
  uint64_t now = clock_now_ns (), suppressed;
  unsigned up;
  char why[256], more[64];

  if (export_differs (r, c->nbd, why, sizeof why)) {
    /* Every connection finds the same: one line a second at most. */
    if (ratelimit_allow (&r->differs_log, now, &suppressed))
      nbdkit_error ("file=%s: the server came back with an export that "
                    "differs (%s): not using it; looking again every "
                    "%.1f s%s", r->uri, why, differs_delay (r) / 1e9,
                    more_msg (more, sizeof more, suppressed));
    r->differs = true;
    r->probe_at_ns = eng_add_ns (now, differs_delay (r));
    conn_lost (r, c, "the export differs");
    return false;
  }
  if (r->differs)
    nbdkit_debug ("file=%s: the export is the one at start again", r->uri);
  r->differs = false;
  c->state = RCONN_READY;
  c->attempts = 0;
  c->up_since = r->answers;
  up = __atomic_add_fetch (&r->nr_ready, 1, __ATOMIC_SEQ_CST);
  __atomic_add_fetch (&r->reconnects, 1, __ATOMIC_RELAXED);
  if (up == 1) {
    uint64_t since = __atomic_exchange_n (&r->outage_since_ns, 0,
                                          __ATOMIC_RELAXED);

    if (since != 0 && now > since)
      __atomic_add_fetch (&r->outage_ns, now - since, __ATOMIC_RELAXED);
    nbdkit_debug ("file=%s: reconnected", r->uri);
    r->outage_logged = false;
  }
  if (up == r->info.nr_conns)
    r->short_logged = false;
  return true;
}

/* Send the parked commands now that a connection is up. */
static void
unpark (struct remote *r)
{
  struct rcmd *list = r->parked, *cmd;

  r->parked = NULL;
  r->parked_tail = &r->parked;
  while ((cmd = list) != NULL) {
    list = cmd->next;
    cmd->next = NULL;
    dispatch (r, cmd);
  }
}

static void
rearm (struct remote *r)
{
  uint64_t d = UINT64_MAX, now;
  struct rcmd *cmd;
  unsigned i;

  for (i = 0; i < r->info.nr_conns; ++i) {
    const struct rconn *c = &r->conns[i];

    if (c->state == RCONN_DOWN && !r->stopping)
      d = MIN (d, attempt_at (r, c));
    else if (c->state == RCONN_CONNECTING)
      d = MIN (d, c->connect_deadline_ns);
  }
  for (cmd = r->parked; cmd != NULL; cmd = cmd->next) {
    d = MIN (d, cmd->deadline_ns);
    if (cmd->retry_at_ns)
      d = MIN (d, cmd->retry_at_ns);
  }
  if (r->stopping)
    d = MIN (d, r->stop_deadline_ns);
  ev_timer_stop (r->loop, &r->timer);
  if (d == UINT64_MAX)
    return;
  ev_now_update (r->loop);
  now = clock_now_ns ();
  ev_timer_set (&r->timer, d > now ? (d - now) / 1e9 : 0., 0.);
  ev_timer_start (r->loop, &r->timer);
}

static bool
loop_idle (const struct remote *r)
{
  unsigned i;

  if (r->parked || r->done || r->nr_batch)
    return false;
  for (i = 0; i < r->info.nr_conns; ++i)
    if (r->conns[i].nr_inflight > 0)
      return false;
  return true;
}

/* After every event: notice connections that died or came up, hand
 * back what finished (which may issue more), then watch each handle in
 * the direction libnbd wants now.
 */
static void
settle (struct remote *r)
{
  bool again;
  unsigned i;

  do {
    again = false;
    for (i = 0; i < r->info.nr_conns; ++i) {
      struct rconn *c = &r->conns[i];

      if (c->state == RCONN_DOWN)
        continue;
      if (c->broken || nbd_aio_is_dead (c->nbd) ||
          nbd_aio_is_closed (c->nbd)) {
        conn_lost (r, c, c->broken ? "a command could not be sent"
                   : "the server closed the connection");
        again = true;
      }
      else if (c->state == RCONN_CONNECTING && nbd_aio_is_ready (c->nbd)) {
        if (conn_ready (r, c))
          unpark (r);
        again = true;
      }
    }
    if (r->done) {
      finish_done (r);
      again = true;
    }
  } while (again);
  batch_flush (r);

  for (i = 0; i < r->info.nr_conns; ++i)
    watch (r, &r->conns[i]);

  if (r->stopping && loop_idle (r)) {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&r->lock);

    /* Nothing is queued after this: remote_issue sees R_STOPPED. */
    if (r->queue == NULL) {
      r->state = R_STOPPED;
      for (i = 0; i < r->info.nr_conns; ++i)
        if (r->conns[i].events) {
          ev_io_stop (r->loop, &r->conns[i].io);
          r->conns[i].events = 0;
        }
      ev_timer_stop (r->loop, &r->timer);
      ev_async_stop (r->loop, &r->kick);
      ev_break (r->loop, EVBREAK_ALL);
      return;
    }
  }
  rearm (r);
}

static void
io_cb (struct ev_loop *loop, ev_io *w, int revents)
{
  struct rconn *c = w->data;
  unsigned dir;
  int rv = 0;

  if (c->nbd == NULL)
    return;
  dir = nbd_aio_get_direction (c->nbd);
  if ((revents & EV_READ) && (dir & LIBNBD_AIO_DIRECTION_READ))
    rv = nbd_aio_notify_read (c->nbd);
  else if ((revents & EV_WRITE) && (dir & LIBNBD_AIO_DIRECTION_WRITE))
    rv = nbd_aio_notify_write (c->nbd);
  if (rv == -1 && !nbd_aio_is_dead (c->nbd) && !nbd_aio_is_closed (c->nbd))
    nbdkit_debug ("file=%s: %s", c->r->uri, nbd_get_error ());
  settle (c->r);
}

static void
timer_cb (struct ev_loop *loop, ev_timer *w, int revents)
{
  struct remote *r = w->data;
  uint64_t now = clock_now_ns ();
  struct rcmd **pp, *cmd;
  unsigned i;

  for (i = 0; i < r->info.nr_conns; ++i) {
    struct rconn *c = &r->conns[i];

    if (c->state == RCONN_DOWN && !r->stopping && now >= attempt_at (r, c))
      start_connect (r, c);
    else if (c->state == RCONN_CONNECTING && now >= c->connect_deadline_ns)
      conn_lost (r, c, "timed out");
    else if (r->stopping && now >= r->stop_deadline_ns &&
             c->state != RCONN_DOWN) {
      nbdkit_error ("file=%s: %u commands still unanswered at exit",
                    r->uri, c->nr_inflight);
      conn_lost (r, c, "exiting");
    }
  }
  /* Workers waiting for a connection, or to try again after "not
   * now", give up after requeue-timeout.
   */
  for (pp = &r->parked; (cmd = *pp) != NULL; ) {
    if (now >= cmd->deadline_ns) {
      *pp = cmd->next;
      if (cmd->retry_at_ns)
        nbdkit_error ("file=%s: %s: %s for requeue-timeout: giving up",
                      r->uri, kind_name (cmd->kind), strerror (cmd->err));
      else
        nbdkit_error ("file=%s: no connection to the server for "
                      "requeue-timeout: giving up", r->uri);
      cmd->err = EIO;
      done_push (r, cmd);
    }
    else if (cmd->retry_at_ns && now >= cmd->retry_at_ns &&
             conn_for (r, cmd) != NULL) {
      *pp = cmd->next;
      cmd->retry_at_ns = 0;
      cmd->next = NULL;
      issue (r, conn_for (r, cmd), cmd);
    }
    else
      pp = &cmd->next;
  }
  r->parked_tail = &r->parked;
  for (cmd = r->parked; cmd != NULL; cmd = cmd->next)
    r->parked_tail = &cmd->next;
  settle (r);
}

static void
kick_cb (struct ev_loop *loop, ev_async *w, int revents)
{
  struct remote *r = w->data;
  struct rcmd *list, *cmd;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&r->lock);
    list = r->queue;
    r->queue = NULL;
    r->queue_tail = &r->queue;
    if (r->state == R_STOPPING && !r->stopping) {
      r->stopping = true;
      r->stop_deadline_ns = eng_add_ns (clock_now_ns (), r->cfg.retry.timeout_ns);
    }
  }
  while ((cmd = list) != NULL) {
    list = cmd->next;
    cmd->next = NULL;
    dispatch (r, cmd);
  }
  if (r->stopping) {
    /* Nobody reconnects for a server that is exiting. */
    while ((cmd = r->parked) != NULL) {
      r->parked = cmd->next;
      cmd->err = EIO;
      done_push (r, cmd);
    }
    r->parked_tail = &r->parked;
  }
  settle (r);
}

static void *
loop_thread (void *vr)
{
  struct remote *r = vr;

  thread_setup (THREAD_NAME_REMOTE);
  ev_run (r->loop, 0);
  return NULL;
}

int
remote_start (struct remote *r)
{
  sigset_t all, old;
  unsigned i;
  int err;

  /* Not the default loop (it reaps children: nbdkit --run). */
  r->loop = ev_loop_new (EVFLAG_AUTO | EVFLAG_NOSIGMASK);
  if (r->loop == NULL) {
    nbdkit_error ("file=%s: ev_loop_new failed", r->uri);
    return -1;
  }
  ev_async_init (&r->kick, kick_cb);
  r->kick.data = r;
  ev_async_start (r->loop, &r->kick);
  ev_init (&r->timer, timer_cb);
  r->timer.data = r;
  for (i = 0; i < r->info.nr_conns; ++i) {
    struct rconn *c = &r->conns[i];

    ev_init (&c->io, io_cb);
    c->io.data = c;
    watch (r, c);
  }
  rearm (r);

  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  err = pthread_create (&r->thread, NULL, loop_thread, r);
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (err != 0) {
    errno = err;
    nbdkit_error ("file=%s: pthread_create: %m", r->uri);
    ev_loop_destroy (r->loop);
    r->loop = NULL;
    return -1;
  }
  pthread_mutex_lock (&r->lock);
  r->state = R_RUNNING;
  pthread_mutex_unlock (&r->lock);
  return 0;
}

void
remote_stop (struct remote *r)
{
  pthread_mutex_lock (&r->lock);
  if (r->state != R_RUNNING) {
    pthread_mutex_unlock (&r->lock);
    return;
  }
  r->state = R_STOPPING;
  ev_async_send (r->loop, &r->kick);
  pthread_mutex_unlock (&r->lock);
  pthread_join (r->thread, NULL);
  ev_loop_destroy (r->loop);
  r->loop = NULL;
  assert (r->state == R_STOPPED);
}

/* ---- submission (any thread) ---- */

/* Queue cmd for the loop.  Returns true if queued; false if the loop is
 * not running, and then cmd was carried out here (*err its result) and
 * freed.
 */
static bool
enqueue (struct remote *r, struct rcmd *cmd, int *err)
{
  pthread_mutex_lock (&r->lock);
  if (r->state != R_STOPPED) {
    cmd->next = NULL;
    *r->queue_tail = cmd;
    r->queue_tail = &cmd->next;
    ev_async_send (r->loop, &r->kick);
    pthread_mutex_unlock (&r->lock);
    return true;
  }
  pthread_mutex_unlock (&r->lock);
  *err = run_blocking (r, cmd);
  cmd_free (cmd);
  return false;
}

/* Write run's members as they lie in memory: one buffer when each
 * member's data follows the one before it (an arena's copies of a
 * stream, or a run of one), else at most max_segs buffers, each sent
 * as a command of its own.  False when they lie in more pieces: gather
 * them then.
 */
static bool
run_segments (struct rcmd *cmd, const struct plug_run *run, size_t max_segs)
{
  size_t i, n = 0;
  const char *end = NULL;
  uint64_t off = run->offset;

  for (i = 0; i < run->n; off += run->reqs[i]->count, ++i) {
    if (run->reqs[i]->buf == end) {
      end += run->reqs[i]->count;
      continue;
    }
    if (n == max_segs)
      return false;
    cmd->segs[n].offset = off;
    cmd->segs[n++].buf = (char *) run->reqs[i]->buf;
    end = (const char *) run->reqs[i]->buf + run->reqs[i]->count;
  }
  if (n == 1) {
    cmd->buf = cmd->segs[0].buf;
    n = 0;
  }
  cmd->nr_segs = n;
  return true;
}

/* backend_ops.issue: queue br for the loop (BACKEND_PENDING), or its
 * result at once: 0 (nothing to send: a trim the server cannot do,
 * which is advisory), ENOTSUP (a fast zero the server cannot do fast),
 * EAGAIN (no connection is up), ENOMEM, or the result of the blocking
 * path (the loop is not running).
 */
static int
remote_issue (struct backend *be, struct backend_run *br)
{
  struct remote *r = remote_of (be);
  const struct plug_run *run = br->run;
  struct rcmd *cmd;
  uint32_t flags = 0;
  size_t i;
  int err;

  /* The caller asks for FUA (a member's client waits for "persisted",
   * or the FLUSH that made it would flush the server after it) only
   * where the server has it (be.can_fua).
   */
  if (br->flags & BACKEND_RUN_FUA)
    flags |= LIBNBD_CMD_FLAG_FUA;
  switch (run->op) {
  case PLUG_OP_WRITE:
    break;
  case PLUG_OP_TRIM:
    /* Advisory: a server without trim keeps the data, as allowed. */
    if (!r->info.can_trim)
      return 0;
    break;
  case PLUG_OP_ZERO:
    if (run->flags & PLUG_F_FAST) {
      /* "MUST fail quickly with NBD_ENOTSUP" unless it is fast. */
      if (!r->info.can_fast_zero)
        return ENOTSUP;
      flags |= LIBNBD_CMD_FLAG_FAST_ZERO;
    }
    if (!(run->flags & PLUG_F_MAY_TRIM) && r->info.can_zero)
      flags |= LIBNBD_CMD_FLAG_NO_HOLE;
    break;
  }
  /* Down: "not now" at once, without a trip through the loop. */
  if (__atomic_load_n (&r->nr_ready, __ATOMIC_SEQ_CST) == 0)
    return EAGAIN;

  cmd = cmd_new (RC_RUN);
  if (cmd == NULL)
    return ENOMEM;
  cmd->br = br;
  cmd->op = run->op;
  cmd->flags = flags;
  cmd->offset = run->offset;
  cmd->count = run->count;
  cmd->zero_by_write = run->op == PLUG_OP_ZERO && !r->info.can_zero;
  cmd->seq_lo = UINT64_MAX;
  for (i = 0; i < run->n; ++i) {
    cmd->seq_lo = MIN (cmd->seq_lo, run->reqs[i]->seq);
    cmd->seq_hi = MAX (cmd->seq_hi, run->reqs[i]->seq);
  }
  /* A FUA write is one command: each FUA command costs the server a
   * sync of its own.
   */
  if (run->op == PLUG_OP_WRITE &&
      !run_segments (cmd, run, flags & LIBNBD_CMD_FLAG_FUA ? 1
                     : REMOTE_RUN_SEGS)) {
    char *p;

    /* libnbd sends one buffer per command: gather the members (this
     * thread, not the loop, pays the copy).  No memory is "not now".
     */
    p = cmd->bounce = malloc (run->count);
    if (p == NULL) {
      cmd_free (cmd);
      return ENOMEM;
    }
    for (i = 0; i < run->n; ++i) {
      memcpy (p, run->reqs[i]->buf, run->reqs[i]->count);
      p += run->reqs[i]->count;
    }
    STATS_ADD (br->stats->bytes_copied, run->count);
    cmd->buf = cmd->bounce;
  }
  return enqueue (r, cmd, &err) ? BACKEND_PENDING : err;
}

void
remote_wait_init (struct remote_wait *w)
{
  sem_init (&w->done, 0, 0);
  w->started = 0;
  w->err = 0;
}

int
remote_wait (struct remote_wait *w)
{
  unsigned i;
  int err;

  for (i = 0; i < w->started; ++i)
    while (sem_wait (&w->done) == -1 && errno == EINTR)
      ;
  sem_destroy (&w->done);
  err = __atomic_load_n (&w->err, __ATOMIC_SEQ_CST);
  if (err) {
    errno = err;
    return -1;
  }
  return 0;
}

static void
start_sync (struct remote *r, struct remote_wait *w, struct rcmd *cmd)
{
  int err = 0;

  cmd->wait = w;
  if (enqueue (r, cmd, &err))
    w->started++;
  else if (err)
    wait_fail (w, err);
}

void
remote_start_pread (struct remote *r, struct remote_wait *w, void *buf,
                    uint64_t count, uint64_t offset)
{
  struct rcmd *cmd = cmd_new (RC_PREAD);

  if (cmd == NULL) {
    wait_fail (w, ENOMEM);
    return;
  }
  cmd->buf = buf;
  cmd->offset = offset;
  cmd->count = count;
  start_sync (r, w, cmd);
}

void
remote_start_flush (struct remote *r, struct remote_wait *w)
{
  struct rcmd *cmd;

  /* A server without flush has no volatile cache to flush; one that
   * answered nothing since its last FLUSH, or only FUA writes, has
   * nothing in it to cover: no trip through the loop.  A run this FLUSH
   * covers was counted before the engine answered the FLUSH.
   */
  if (!r->info.can_flush || r->info.readonly || flush_is_clean (r))
    return;
  cmd = cmd_new (RC_FLUSH);
  if (cmd == NULL) {
    wait_fail (w, ENOMEM);
    return;
  }
  cmd->losses_seen = __atomic_load_n (&r->losses, __ATOMIC_SEQ_CST);
  start_sync (r, w, cmd);
}

void
remote_start_cache (struct remote *r, struct remote_wait *w,
                    uint64_t count, uint64_t offset)
{
  struct rcmd *cmd;

  if (!r->info.can_cache)       /* Advisory. */
    return;
  cmd = cmd_new (RC_CACHE);
  if (cmd == NULL) {
    wait_fail (w, ENOMEM);
    return;
  }
  cmd->offset = offset;
  cmd->count = count;
  start_sync (r, w, cmd);
}

int
remote_extents (struct remote *r, uint64_t offset, uint64_t count,
                struct remote_extent *ext, size_t max)
{
  struct remote_wait w;
  struct rcmd *cmd;
  int n = 0;

  /* Misaligned: "data" is always a true answer. */
  if (!r->info.can_extents || max == 0 ||
      offset % r->info.min_block != 0 || count % r->info.min_block != 0) {
    ext[0].length = count;
    ext[0].flags = 0;
    return 1;
  }
  cmd = cmd_new (RC_EXTENTS);
  if (cmd == NULL)
    return -1;
  cmd->offset = offset;
  cmd->count = MIN (count, r->max_no_payload);
  cmd->ext = ext;
  cmd->max_ext = max;
  cmd->nr_ext_out = &n;
  remote_wait_init (&w);
  start_sync (r, &w, cmd);
  if (remote_wait (&w) == -1)
    return -1;
  if (n == 0) {
    ext[0].length = MIN (count, r->max_no_payload);
    ext[0].flags = 0;
    n = 1;
  }
  return n;
}

void
remote_stats (const struct remote *r, uint64_t now, struct stats_file_live *f)
{
  uint64_t since = __atomic_load_n (&r->outage_since_ns, __ATOMIC_RELAXED);

  f->conns_up = __atomic_load_n (&r->nr_ready, __ATOMIC_SEQ_CST);
  f->conns = r->info.nr_conns;
  f->conns_lost = __atomic_load_n (&r->conns_lost, __ATOMIC_RELAXED);
  f->reconnects = __atomic_load_n (&r->reconnects, __ATOMIC_RELAXED);
  f->outage_ns = __atomic_load_n (&r->outage_ns, __ATOMIC_RELAXED);
  f->in_outage = since != 0;
  if (since != 0 && now > since)
    f->outage_ns += now - since;
  f->remote = true;
}

/* ---- the backend's blocking operations: one round trip each ---- */

static int
remote_pread (struct backend *be, void *buf, uint64_t count,
              uint64_t offset)
{
  struct remote_wait w;

  remote_wait_init (&w);
  remote_start_pread (remote_of (be), &w, buf, count, offset);
  return remote_wait (&w);
}

static int
remote_sync (struct backend *be)
{
  struct remote_wait w;

  if (be->readonly)
    return 0;
  remote_wait_init (&w);
  remote_start_flush (remote_of (be), &w);
  return remote_wait (&w);
}

static int
remote_cache (struct backend *be, uint64_t count, uint64_t offset)
{
  struct remote_wait w;

  remote_wait_init (&w);
  remote_start_cache (remote_of (be), &w, count, offset);
  return remote_wait (&w);
}

static int
remote_extent (struct backend *be, uint64_t offset, uint64_t count,
               uint64_t *len, bool *hole)
{
  struct remote_extent e;

  if (remote_extents (remote_of (be), offset, count, &e, 1) == -1)
    return -1;
  *hole = e.flags & LIBNBD_STATE_HOLE;
  *len = e.length;
  return 0;
}

/* Its runs overlap on the wire. */
static bool
remote_one_writer (const struct backend *be)
{
  return false;
}

static void
remote_close_backend (struct backend *be)
{
  remote_close (remote_of (be));
}

static const struct backend_ops remote_ops = {
  .name = "nbd",
  .issue = remote_issue,
  .pread = remote_pread,
  .sync = remote_sync,
  .cache = remote_cache,
  .extent = remote_extent,
  .one_writer = remote_one_writer,
  .close = remote_close_backend,
};
