/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* remote.c: the public face of a remote: URI schemes, what it
 * advertised, submission from any thread, and the backend ops.
 * See remote.h and remote-int.h.
 */

#include <config.h>

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libnbd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backend.h"
#include "minmax.h"
#include "remote.h"
#include "remote-int.h"

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

struct backend *
remote_backend (struct remote *r)
{
  return &r->be;
}

const struct remote_info *
remote_info (const struct remote *r)
{
  return &r->info;
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
    list_add_tail (&r->queue, &cmd->link);
    evloop_kick (&r->ev);
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

const struct backend_ops remote_ops = {
  .name = "nbd",
  .issue = remote_issue,
  .pread = remote_pread,
  .sync = remote_sync,
  .cache = remote_cache,
  .extent = remote_extent,
  .one_writer = remote_one_writer,
  .close = remote_close_backend,
};
