/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine-life.c: connections open and close, the exit, the waiting
 * ops (FLUSH, read, close, exit) and the plugs' deadlines.
 */

#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine-int.h"
#include "minmax.h"

/* The timer thread unplugs for every connection, where nbdkit's own
 * prefix names no connection: the messages name it themselves.
 */
void
engine_conn_set_id (struct eng_conn *c, uint64_t id)
{
  c->id = id;
}

struct eng_conn *
engine_conn_open (struct engine *e, struct plug_stats *stats)
{
  struct eng_conn *c;
  size_t i;

  if (e->state != ENGINE_RUNNING) {
    errno = ESHUTDOWN;
    return NULL;
  }
  c = calloc (1, sizeof *c);
  if (c == NULL)
    return NULL;
  if (plug_init (&c->plug, &e->plug_lim, e->cfg.nr_backings) == -1) {
    free (c);
    return NULL;
  }
  c->e = e;
  c->stats = stats;
  for (i = 0; i < NR_RECENT; ++i) {
    c->recent_start[i] = UINT64_MAX;    /* Empty: near nothing. */
    c->recent_end[i] = 0;
  }
  list_init (&c->mem_wait);
  list_add_head (&e->conns, &c->link);
  return c;
}

void
engine_conn_free (struct engine *e, struct eng_conn *c)
{
  assert (c->nr_unfinished == 0 && c->nr_runs == 0 &&
          list_empty (&c->mem_wait) && plug_is_empty (&c->plug));
  list_del (&c->link);
  plug_free (&c->plug);
  free (c);
}

void
submit_close (struct engine *e, struct eng_conn *c, struct eng_op *op,
              uint64_t now, struct eng_actions *out)
{
  struct eng_op *w;

  conn_set_state (e, c, CONN_CLOSING);
  c->nr_waiting++;
  op_set_state (e, op, OP_WAITING);
  c->close_op = op;
  e->nr_closing++;
  /* No worker is left to wait for memory. */
  while ((w = list_pop (&c->mem_wait, struct eng_op, wait)) != NULL) {
    e->nr_mem_waiting--;
    op_answer (e, w, ESHUTDOWN, out);
    op_release (e, w, out);
  }
  conn_unplug (e, c, PLUG_UNPLUG_CLOSE, now, out);
  dispatch_all (e, now, true, out);
  check_waiters (e, now, out);
}

void
submit_shutdown (struct engine *e, struct eng_conn *c, struct eng_op *op,
                 uint64_t now, struct eng_actions *out)
{
  struct eng_conn *o;

  engine_set_state (e, ENGINE_SHUTTING_DOWN);
  stats_unflushed_flush_begin (&e->unflushed, &op->flush_mark);
  if (c)
    c->nr_waiting++;
  op_set_state (e, op, OP_WAITING);
  e->shutdown_op = op;
  list_for_each (o, &e->conns, link)
    conn_unplug (e, o, PLUG_UNPLUG_CLOSE, now, out);
  dispatch_all (e, now, true, out);
  check_waiters (e, now, out);
}

/* A close or the exit: the lines the rate limit held back about each
 * file's runs are counted in the log now, so that every loss at least
 * reaches it as a number.
 */
static void
log_suppressed (struct engine *e)
{
  uint32_t b;
  char buf[32];

  for (b = 0; b < e->cfg.nr_backings; ++b) {
    struct ratelimit *rl = &e->files[b].log;

    if (rl->suppressed == 0)
      continue;
    eng_log (e, 0, "file=%s: %" PRIu64 " more failure message%s about "
             "its runs suppressed since the last one", file_name (e, b,
             buf, sizeof buf), rl->suppressed,
             rl->suppressed == 1 ? "" : "s");
    rl->suppressed = 0;
  }
}

static bool
conn_settled (const struct eng_conn *c)
{
  return c->nr_unfinished == 0 && list_empty (&c->mem_wait);
}

/* The counts check_waiters trusts to skip the walk agree with the
 * lists (asserted whenever it walks them).
 */
static void
assert_wait_counts (const struct engine *e)
{
#ifndef NDEBUG
  const struct eng_conn *c;
  const struct eng_op *op;
  uint64_t nr_mem = 0;
  unsigned nr_closing = 0;

  list_for_each (c, &e->conns, link) {
    list_for_each (op, &c->mem_wait, wait)
      nr_mem++;
    nr_closing += c->close_op != NULL;
  }
  assert (nr_mem == e->nr_mem_waiting && nr_closing == e->nr_closing);
#else
  (void) e;
#endif
}

void
answer_waiters (struct engine *e, uint64_t now, struct eng_actions *out)
{
  struct eng_op *op, *next;
  struct eng_conn *c, *cnext;

  assert_wait_counts (e);

  while ((op = wait_first (&e->flush_wait)) != NULL && flush_ready (e, op)) {
    list_del (&op->wait);
    wait_sync (e, op, now, out);
  }
  list_for_each_safe (op, next, &e->read_wait, wait)
    if (!read_blocked (e, op)) {
      list_del (&op->wait);
      op_answer (e, op, 0, out);
      op_release (e, op, out);
    }
  list_for_each_safe (c, cnext, &e->conns, link) {
    if (!list_empty (&c->mem_wait))
      admit_waiters (e, c, now, out);
    if (c->close_op && conn_settled (c)) {
      op = c->close_op;
      c->close_op = NULL;
      e->nr_closing--;
      log_suppressed (e);
      op_answer (e, op, 0, out);
      op_release (e, op, out);
    }
  }
  if (e->shutdown_op && list_empty (&e->unfinished)) {
    op = e->shutdown_op;
    e->shutdown_op = NULL;
    log_suppressed (e);
    wait_sync (e, op, now, out);
  }
}

/* When must c's plug go out at the latest?  UINT64_MAX: never. */
uint64_t
plug_deadline (const struct engine *e, const struct eng_conn *c)
{
  uint64_t d;

  if (plug_is_empty (&c->plug))
    return UINT64_MAX;
  /* An unplug ran out of memory: whatever asked for it (a FLUSH, a
   * read, an overlapping write, a timer) still waits, so the plug goes
   * out as soon as it may try again, not at idle= or max-delay=.
   */
  if (c->unplug_retry_ns > 0)
    return c->unplug_retry_ns;
  d = eng_add_ns (c->plug.oldest_ns, e->cfg.max_delay_ns);
  if (e->cfg.idle_ns > 0)
    d = MIN (d, eng_add_ns (c->last_activity_ns, e->cfg.idle_ns));
  return d;
}

/* Time passed for c: its plug's deadline (idle=, max-delay=, or the
 * retry of an unplug that ran out of memory), and its writers' waits
 * for memory (requeue-timeout).
 */
void
conn_tick (struct engine *e, struct eng_conn *c, uint64_t now,
           struct eng_actions *out)
{
  struct eng_op *op;

  if (!plug_is_empty (&c->plug) && now >= plug_deadline (e, c)) {
    bool aged = now >= eng_add_ns (c->plug.oldest_ns, e->cfg.max_delay_ns);

    pace_timer (e, c);
    conn_unplug (e, c, aged ? PLUG_UNPLUG_MAX_DELAY : PLUG_UNPLUG_IDLE,
                 now, out);
  }
  while ((op = wait_first (&c->mem_wait)) != NULL && now >= op->deadline_ns)
    refuse_waiter (c, op, out);
}
