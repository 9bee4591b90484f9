/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine.c: the export's state machine, its entry points.  See engine.h
 * for the rules, engine-int.h for the rooms the work is done in.
 *
 * The kernel's words: conn_unplug() is blk_flush_plug, queue_dispatch()
 * is the driver's queue_rq loop over one hardware queue, a "not now"
 * completion is BLK_STS_RESOURCE followed by blk_mq_delay_run_hw_queue
 * (FILE_DELAYED) or by a restart from the next completion
 * (FILE_STALLED, blk-mq's SCHED_RESTART), and ENG_CLOSE is
 * blk_finish_plug at task exit.
 */

#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine-int.h"
#include "minmax.h"
#include "ratelimit.h"

void
engine_free (struct engine *e);

void __attribute__ ((__format__ (__printf__, 3, 4)))
eng_log (struct engine *e, int level, const char *fs, ...)
{
  char msg[512];
  va_list ap;

  if (e->cfg.log == NULL)
    return;
  va_start (ap, fs);
  vsnprintf (msg, sizeof msg, fs, ap);
  va_end (ap);
  e->cfg.log (e->cfg.log_opaque, level, msg);
}

static const char *
op_name (enum plug_op op)
{
  switch (op) {
  case PLUG_OP_WRITE: return "write";
  case PLUG_OP_ZERO: return "zero";
  case PLUG_OP_TRIM: return "trim";
  }
  return "?";
}

/* Backing file b's name for messages (buf: room if it has none). */
const char *
file_name (const struct engine *e, uint32_t b, char *buf, size_t n)
{
  if (e->cfg.names)
    return e->cfg.names[b];
  snprintf (buf, n, "#%" PRIu32, b);
  return buf;
}

/* An error line about a run, at most one per file per second:
 * "file=NAME: write of N bytes at offset O: WHAT: ERROR".
 */
void
log_run (struct engine *e, const struct eng_run *r, const char *what,
         int err, uint64_t now)
{
  struct eng_file *f = &e->files[r->run->backing];
  char name[32], more[RATELIMIT_MORE_LEN];
  uint64_t suppressed;

  if (!ratelimit_allow (&f->log, now, &suppressed))
    return;
  eng_log (e, 0, "file=%s: %s of %" PRIu64 " bytes at offset %" PRIu64
           ": %s: %s%s",
           file_name (e, r->run->backing, name, sizeof name),
           op_name (r->run->op), r->run->count, r->run->offset, what,
           strerror (err), ratelimit_more (more, sizeof more, suppressed));
}

void
eng_actions_init (struct eng_actions *a)
{
  list_init (&a->issue);
  list_init (&a->sync);
  list_init (&a->reply);
  list_init (&a->release);
}

struct engine *
engine_new (const struct eng_config *cfg)
{
  struct engine *e;
  uint32_t b;

  if (cfg->nr_backings == 0 || cfg->max_inflight == 0 ||
      cfg->lim.max_requests == 0 || cfg->lim.max_bytes == 0 ||
      cfg->lim.max_merge == 0 || cfg->lim.max_iov == 0 ||
      cfg->max_delay_ns == 0 || cfg->retry.delay_ns == 0) {
    errno = EINVAL;
    return NULL;
  }
  e = calloc (1, sizeof *e);
  if (e == NULL)
    return NULL;
  e->files = calloc (cfg->nr_backings, sizeof *e->files);
  if (e->files == NULL) {
    free (e);
    return NULL;
  }
  e->cfg = *cfg;
  eng_state_init (e);
  list_init (&e->conns);
  list_init (&e->unfinished);
  list_init (&e->flush_wait);
  list_init (&e->read_wait);
  list_init (&e->sync_wait);
  if (e->cfg.retry.max_delay_ns < e->cfg.retry.delay_ns)
    e->cfg.retry.max_delay_ns = e->cfg.retry.delay_ns;
  /* The run header lives in front of each merged run (plug.h). */
  e->run_prefix = (sizeof (struct eng_run) + _Alignof (max_align_t) - 1) /
    _Alignof (max_align_t) * _Alignof (max_align_t);
  e->plug_lim = cfg->lim;
  e->plug_lim.run_prefix = e->run_prefix;
  e->plug_lim.seed = cfg->seed ^ 0x9e3779b9u;
  e->plug_lim.max_bytes = MAX (cfg->lim.max_bytes / ENG_PLUG_SHARE,
                               (uint64_t) 1);
  for (b = 0; b < cfg->nr_backings; ++b) {
    struct eng_file *f = &e->files[b];

    list_init (&f->queue);
    list_init (&f->ready);
    f->max_inflight = cfg->max_inflight;
    f->direct_rule = ENG_DIRECT_UNMERGED;
    itree_init (&f->index, cfg->seed + b);
    /* THE RECORD must take a loss whenever one happens, memory or
     * not: its room is taken now (span_add never allocates).
     */
    if (span_vector_reserve (&f->lost, SPAN_CAP) == -1 ||
        span_vector_reserve (&f->written, SPAN_CAP) == -1 ||
        span_vector_reserve (&f->syncing, SPAN_CAP) == -1 ||
        span_vector_reserve (&f->heals, SPAN_CAP) == -1 ||
        span_vector_reserve (&f->heals_syncing, SPAN_CAP) == -1) {
      engine_free (e);
      return NULL;
    }
  }
  e->next_seq = 1;
  e->next_batch = 1;
  return e;
}

void
engine_set_max_inflight (struct engine *e, uint32_t b, unsigned n)
{
  assert (b < e->cfg.nr_backings && n > 0);
  e->files[b].max_inflight = n;
}

void
engine_set_direct_rule (struct engine *e, uint32_t b,
                        enum eng_direct_rule rule)
{
  assert (b < e->cfg.nr_backings);
  e->files[b].direct_rule = rule;
}

void
engine_free (struct engine *e)
{
  uint32_t b;

  if (e == NULL)
    return;
  assert (list_empty (&e->conns));
  for (b = 0; b < e->cfg.nr_backings; ++b) {
    struct eng_file *f = &e->files[b];
    struct eng_run *r;

    /* engine_new may fail before the file's lists are made. */
    if (f->queue.next != NULL)
      while ((r = list_pop (&f->queue, struct eng_run, qlink)) != NULL)
        run_free (r);
    span_vector_reset (&f->lost);
    span_vector_reset (&f->written);
    span_vector_reset (&f->syncing);
    span_vector_reset (&f->heals);
    span_vector_reset (&f->heals_syncing);
  }
  free (e->files);
  free (e);
}

struct plug_stats *
engine_run_stats (const struct eng_run *r)
{
  return r->conn->stats;
}

int
engine_submit (struct engine *e, struct eng_conn *c, struct eng_op *op,
               uint64_t now, struct eng_actions *out)
{
  op_begin (e, op);
  op->acked = false;
  op->err = 0;
  op->conn = c;
  /* The op's links are set when it goes on a list: the engine never
   * asks whether an op is on one (its state says where it is).
   */

  switch (op->kind) {
  case ENG_WRITE:
  case ENG_ZERO:
  case ENG_TRIM:
    if (e->state != ENGINE_RUNNING || c->state != CONN_OPEN) {
      errno = ESHUTDOWN;
      return -1;
    }
    return submit_mutation (e, c, op, now, out);
  case ENG_FLUSH:
    submit_flush (e, c, op, now, out);
    return 0;
  case ENG_READ:
    if (!pieces_valid (e, op)) {
      errno = EINVAL;
      return -1;
    }
    submit_read (e, c, op, now, out);
    return 0;
  case ENG_CLOSE:
    submit_close (e, c, op, now, out);
    return 0;
  case ENG_SHUTDOWN:
    submit_shutdown (e, c, op, now, out);
    return 0;
  }
  abort ();
}

void
engine_complete (struct engine *e, struct eng_run *r, int err, uint64_t now,
                 struct eng_actions *out)
{
  uint32_t b = r->run->backing;
  struct eng_file *f = &e->files[b];
  struct eng_conn *c = r->conn;
  bool fast = r->run->flags & PLUG_F_FAST;

  assert (r->state == RUN_INFLIGHT);
  assert (f->inflight > 0);
  f->inflight--;
  c->last_svc_ns = now > r->issued_ns ? now - r->issued_ns : 0;
  stats_hist_add_serial (&c->stats->latency[STATS_L_BACKEND],
                         c->last_svc_ns);

  if (err == 0) {
    stats_count (&r->conn->stats->backend[stats_backend_of (r->run->op)],
                 r->run->count);
    f->counts.runs++;
    f->counts.bytes += r->run->count;
    if (f->state != FILE_RUNNING) {
      /* blk-mq restarts a queue that got BLK_STS_RESOURCE when one of
       * its requests completes: the delay is only for an idle queue.
       */
      STATS_ADD (r->conn->stats->restarted, 1);
      file_set_state (e, f, FILE_RUNNING);
    }
    retry_reset (&f->retry);
    run_finish (e, r, 0, now, out);
  }
  else if (retry_is_transient (err) && !fast)
    not_now (e, f, r, now, out);
  else {
    /* The backend answered: a stalled queue may run again. */
    if (f->state == FILE_STALLED)
      file_set_state (e, f, FILE_RUNNING);
    if (fast && (err == ENOTSUP || retry_is_transient (err)))
      err = ENOTSUP;            /* "Cannot be fast": an answer. */
    else {
      STATS_ADD (r->conn->stats->errors, 1);
      f->counts.errors++;
      if (r->run->n > 1 && split_run (e, f, r) == 0) {
        queue_dispatch (e, b, now, false, out);
        check_waiters (e, now, out);
        return;
      }
      log_run (e, r, "failed", err, now);
    }
    run_finish (e, r, err, now, out);
  }
  /* A stretch of "not now" ends when its file has nothing left, given
   * up or failed: the next refusal gets a requeue-timeout of its own.
   */
  if (f->inflight == 0 && f->nr_queued == 0)
    retry_reset (&f->retry);
  queue_dispatch (e, b, now, false, out);
  if (e->cfg.mode == ENG_HOLD && c->nr_runs == 0)
    pace_drained (e, c, now, out);
  check_waiters (e, now, out);
}

void
engine_tick (struct engine *e, uint64_t now, struct eng_actions *out)
{
  struct eng_conn *c;
  uint32_t b;

  list_for_each (c, &e->conns, link)
    conn_tick (e, c, now, out);
  for (b = 0; b < e->cfg.nr_backings; ++b)
    queue_tick (e, b, now, out);
  check_waiters (e, now, out);
}

bool
engine_deadline_may_be_earlier (struct engine *e)
{
  bool r = e->deadline_earlier;

  e->deadline_earlier = false;
  return r;
}

uint64_t
engine_next_deadline (const struct engine *e)
{
  const struct eng_conn *c;
  uint64_t d = UINT64_MAX;
  uint32_t b;

  list_for_each (c, &e->conns, link) {
    const struct eng_op *w = list_first (&c->mem_wait, struct eng_op, wait);

    d = MIN (d, plug_deadline (e, c));
    if (w)
      d = MIN (d, w->deadline_ns);
  }
  for (b = 0; b < e->cfg.nr_backings; ++b)
    if (e->files[b].state == FILE_DELAYED && e->files[b].nr_queued > 0)
      d = MIN (d, e->files[b].delay_until);
  return d;
}

bool
engine_quiet (const struct engine *e)
{
  return list_empty (&e->unfinished);
}

void
engine_counts (const struct engine *e, struct eng_counts *n)
{
  const struct eng_conn *c;
  const struct eng_op *op;
  uint32_t b;

  memset (n, 0, sizeof *n);
  list_for_each (c, &e->conns, link)
    n->held += c->plug.reqs.len;
  for (b = 0; b < e->cfg.nr_backings; ++b) {
    n->queued += e->files[b].nr_queued;
    n->inflight += e->files[b].inflight;
  }
  list_for_each (op, &e->unfinished, unf)
    n->unfinished++;
  n->bytes = e->bytes;
  n->lost = e->lost;
  n->order_checks = e->order_checks;
  n->widened = e->widened;
}

static const char *
file_state_name (enum file_state s)
{
  switch (s) {
  case FILE_RUNNING: return "running";
  case FILE_DELAYED: return "delayed";
  case FILE_STALLED: return "stalled";
  }
  return "?";
}

void
engine_snapshot (const struct engine *e, struct stats_report *r,
                 struct stats_file_live *files)
{
  const struct eng_conn *c;
  uint32_t b;

  stats_unflushed_total (&e->unflushed, &r->unflushed);
  r->held = r->queued = r->inflight = 0;
  list_for_each (c, &e->conns, link)
    r->held += c->plug.reqs.len;
  for (b = 0; b < e->cfg.nr_backings; ++b) {
    const struct eng_file *f = &e->files[b];

    r->queued += f->nr_queued;
    r->inflight += f->inflight;
    if (files == NULL)
      continue;
    files[b].state = file_state_name (f->state);
    files[b].inflight = f->inflight;
    files[b].queued = f->nr_queued;
    files[b].not_now = f->counts.not_now;
    files[b].errors = f->counts.errors;
    files[b].runs = f->counts.runs;
    files[b].bytes = f->counts.bytes;
    files[b].syncs = f->counts.syncs;
  }
  r->copied_bytes = e->bytes;
}

void
engine_conn_snapshot (const struct eng_conn *c, struct stats_conn_live *s)
{
  s->held = c->plug.reqs.len;
  s->runs = c->nr_runs;
  s->unfinished = c->nr_unfinished;
  s->waiting = c->nr_waiting;
  s->copied_bytes = c->bytes;
}
