/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* remote-cmd.c: a remote's command model: commands and their
 * splitting into NBD commands, FLUSH bookkeeping, what no FLUSH
 * covered yet, the blocking path, and finishing commands.
 * See remote.h and remote-int.h.
 */

#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
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
#include "cleanup.h"
#include "minmax.h"
#include "remote.h"
#include "remote-int.h"

/* ---- commands ---- */

struct rcmd *
cmd_new (enum rcmd_kind kind)
{
  struct rcmd *cmd = calloc (1, sizeof *cmd);

  if (cmd)
    cmd->kind = kind;
  return cmd;
}

void
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
uint64_t
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
uint64_t
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
int64_t
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
bool
connected (struct nbd_handle *h)
{
  return nbd_aio_is_ready (h) == 1 || nbd_aio_is_processing (h) == 1;
}

/* ---- FLUSH bookkeeping (any thread) ---- */

/* Nothing was answered since a FLUSH that succeeded was issued: a
 * FLUSH now has nothing to cover (a striped or concatenated export
 * flushes every server at each FLUSH, most of them often clean).
 */
bool
flush_is_clean (const struct remote *r)
{
  uint64_t mark = __atomic_load_n (&r->flushed_mark, __ATOMIC_SEQ_CST);

  return mark != FLUSHED_NEVER &&
    __atomic_load_n (&r->mutations, __ATOMIC_SEQ_CST) == mark;
}

/* Run cmd was answered with err: count it unless it is durable already
 * (written with FUA, all of it answered with success).
 */
void
note_mutation (struct remote *r, const struct rcmd *cmd, int err)
{
  if (err != 0 || !(cmd->flags & LIBNBD_CMD_FLAG_FUA))
    __atomic_add_fetch (&r->mutations, 1, __ATOMIC_SEQ_CST);
}

/* A FLUSH issued when mutations was mark succeeded.  Marks only grow:
 * a later FLUSH may have been answered first.
 */
void
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
void
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
void
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
bool
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
int
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
  list_del (&cmd->link);
  c->nr_inflight--;
}

void
done_push (struct remote *r, struct rcmd *cmd)
{
  list_add_tail (&r->done, &cmd->link);
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
void
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
int
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

const char *
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

void
wait_fail (struct remote_wait *w, int err)
{
  int zero = 0;

  __atomic_compare_exchange_n (&w->err, &zero, err, false,
                               __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

/* Answer a waiting worker; cmd is freed. */
void
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

void
batch_flush (struct remote *r)
{
  if (r->nr_batch > 0)
    r->batch_runs[0]->done (r->batch_runs, r->nr_batch);
  r->nr_batch = 0;
}

/* Hand br back with err, in a batch of runs with the same callback. */
void
batch_add (struct remote *r, struct backend_run *br, int err)
{
  if (r->nr_batch == DONE_BATCH ||
      (r->nr_batch > 0 && r->batch_runs[0]->done != br->done))
    batch_flush (r);
  br->err = err;
  r->batch_runs[r->nr_batch++] = br;
}
