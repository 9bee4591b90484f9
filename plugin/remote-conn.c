/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* remote-conn.c: a remote's connection policy: handles, the export
 * checks, connecting at start, and (in the loop thread) losing,
 * reconnecting and probing connections.
 * See remote.h and remote-int.h.
 */

#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
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
#include "clock.h"
#include "engine.h"            /* eng_add_ns */
#include "minmax.h"
#include "log.h"
#include "ratelimit.h"
#include "remote.h"
#include "remote-int.h"

static void open_failed (struct remote *r, struct rconn *c, const char *why);

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
  list_init (&r->queue);
  list_init (&r->parked);
  list_init (&r->done);
  r->flushed_mark = FLUSHED_NEVER;
  for (i = 0; i < REMOTE_MAX_CONNS; ++i) {
    r->conns[i].r = r;
    r->conns[i].idx = i;
    r->conns[i].fd = -1;
    r->conns[i].state = RCONN_DOWN;
    list_init (&r->conns[i].inflight);
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

void
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
    ev_io_stop (r->ev.loop, &c->io);
  c->events = want;
  if (want) {
    ev_io_set (&c->io, c->fd, want);
    ev_io_start (r->ev.loop, &c->io);
  }
}

/* Connecting c failed (before it was ready): when to try again.  The
 * engine's backoff in an outage; the spare one while others work.
 * Context: the loop thread, or remote_open before it runs.
 */
static void
open_failed (struct remote *r, struct rconn *c, const char *why)
{
  unsigned up = __atomic_load_n (&r->nr_ready, __ATOMIC_SEQ_CST);
  uint64_t now = clock_now_ns (), delay;

  nbdkit_debug ("file=%s: connection %u: connecting failed: %s",
                r->uri, c->idx, why);
  if (up > 0 && !r->differs) {
    delay = SPARE_RETRY_NS << (c->attempts < 6 ? c->attempts : 6);
    delay = MIN (delay, SPARE_RETRY_MAX_NS);
    /* Never faster than in an outage (a long requeue-max-delay=). */
    delay = MAX (delay, reconnect_delay (r, c->attempts));
    /* The loop thread owns short_log: no lock. */
    if (!r->short_logged &&
        log_error_limited (&r->short_log, NULL,
                           "file=%s: connection %u of %u cannot be opened "
                           "while %u %s up (%s): going on with those; "
                           "trying again after %.0f s, then less and less "
                           "often (up to every %.0f s)",
                           r->uri, c->idx, r->info.nr_conns, up,
                           up == 1 ? "is" : "are", why,
                           SPARE_RETRY_NS / 1e9, SPARE_RETRY_MAX_NS / 1e9))
      r->short_logged = true;
  }
  else
    delay = reconnect_delay (r, c->attempts);
  c->next_attempt_ns = eng_add_ns (now, delay);
  if (c->attempts < 64)
    c->attempts++;
}

/* c's handle is dead, closed, failed to connect, or given up on. */
void
rconn_lost (struct remote *r, struct rconn *c, const char *why)
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
    ev_io_stop (r->ev.loop, &c->io);
  c->events = 0;
  /* Closing a dead handle retires what it still holds; whatever libnbd
   * did not answer is answered here, as died.
   */
  nbd_close (c->nbd);
  c->nbd = NULL;
  c->fd = -1;
  while ((cmd = list_first (&c->inflight, struct rcmd, link)) != NULL) {
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
uint64_t
attempt_at (const struct remote *r, const struct rconn *c)
{
  return r->differs ? MAX (c->next_attempt_ns, r->probe_at_ns)
    : c->next_attempt_ns;
}

void
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
bool
rconn_ready (struct remote *r, struct rconn *c)
{
  uint64_t now = clock_now_ns ();
  unsigned up;
  char why[256];

  if (export_differs (r, c->nbd, why, sizeof why)) {
    /* Every connection finds the same: one line a second at most. */
    log_error_limited (&r->differs_log, NULL,
                       "file=%s: the server came back with an export that "
                       "differs (%s): not using it; looking again every "
                       "%.1f s", r->uri, why, differs_delay (r) / 1e9);
    r->differs = true;
    r->probe_at_ns = eng_add_ns (now, differs_delay (r));
    rconn_lost (r, c, "the export differs");
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
