/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine-pace.c: hold mode's pacing of a connection's plug (enum
 * conn_pace).
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

/* Hold mode: timer unplugs of a single request in a row, with nobody
 * else waiting, before the connection stops waiting for idle=.
 */
#define LONE_STREAK 2

/* PACE_PLUG -> PACE_BUSY: a parked unplug found the client took more
 * than BUSY_RATIO times the backend's time to bring its next batch, or
 * a timer (idle=, or max-delay= where that is the shorter) had to
 * unplug with nothing of the connection in flight, BUSY_STREAK times in
 * a row.  PACE_BUSY -> PACE_PLUG: the
 * completions of the connection's last run found at least PLUG_GATHER
 * requests held meanwhile on average over the last BUSY_STREAK (2) that
 * found any, and together as many as the connection has workers.  With
 * one run in flight at a time, two batches in a row are the client's
 * whole queue: it alternates large and small (15, 1, 15, 1 of 16), so
 * an average and not a streak of large ones; and a queue shorter than
 * the workers never fires the parked trigger, so holding would only
 * wait for idle=.
 */
#define BUSY_RATIO 4
#define PLUG_GATHER 4
#define BUSY_STREAK 2

/* PACE_BUSY, its streaks started again. */
static void
pace_become_busy (struct engine *e, struct eng_conn *c)
{
  pace_set (e, c, PACE_BUSY);
  c->last_gathered = 0;
  c->pace_streak = 0;
}

/* Hold mode: c unplugs because every worker of it waits (check_parked)
 * while it is PACE_PLUG: the whole client queue waited for the
 * backend, then the backend waited for the whole client queue.
 */
void
pace_parked (struct engine *e, struct eng_conn *c, uint64_t now)
{
  uint64_t client_ns;

  if (e->cfg.mode != ENG_HOLD || c->pace != PACE_PLUG || c->drained_ns == 0)
    return;
  client_ns = now - c->drained_ns;
  c->pace_streak = client_ns / BUSY_RATIO > c->last_svc_ns ?
    c->pace_streak + 1 : 0;
  if (c->pace_streak >= BUSY_STREAK)
    pace_become_busy (e, c);
}

/* Hold mode: a timer (idle= or max-delay=) unplugs c.  With nothing of
 * c in flight, its client brought all it had and then waited for us:
 * its queue is shorter than its worker threads, so the parked trigger
 * never fires and every batch would wait for the timer.  See enum
 * conn_pace.
 */
static void
pace_idle (struct engine *e, struct eng_conn *c)
{
  c->pace_streak = c->nr_runs == 0 ? c->pace_streak + 1 : 0;
  if (c->pace_streak >= BUSY_STREAK)
    pace_become_busy (e, c);
}

/* Hold mode: a timer (idle= or max-delay=) is about to unplug c.  A
 * lone held request, with nothing else of the client waiting, LONE_STREAK
 * times in a row: the client has one request in flight
 * (PACE_PASSTHROUGH).
 */
void
pace_timer (struct engine *e, struct eng_conn *c)
{
  if (e->cfg.mode != ENG_HOLD)
    return;
  c->lone_streak = c->plug.reqs.len == 1 && c->nr_waiting <= 1 ?
    c->lone_streak + 1 : 0;
  if (c->lone_streak >= LONE_STREAK)
    pace_set (e, c, PACE_PASSTHROUGH);
  else if (c->pace == PACE_PLUG)
    pace_idle (e, c);
}

/* Hold mode: a request of c's client came while another one waits:
 * the client has concurrency again.
 */
void
pace_concurrent (struct engine *e, struct eng_conn *c)
{
  if (c->pace == PACE_PASSTHROUGH && c->nr_waiting > 1)
    pace_set (e, c, PACE_PLUG);
}

/* Hold mode: c's last run finished at now.  See enum conn_pace. */
void
pace_drained (struct engine *e, struct eng_conn *c, uint64_t now,
              struct eng_actions *out)
{
  size_t gathered = c->plug.reqs.len;

  c->drained_ns = now;
  if (c->pace != PACE_BUSY || gathered == 0)
    return;
  if (c->pace_streak + 1 < BUSY_STREAK)
    c->pace_streak++;           /* Drains seen, up to BUSY_STREAK. */
  else if (gathered + c->last_gathered >= BUSY_STREAK * PLUG_GATHER &&
           gathered + c->last_gathered >= c->nr_workers) {
    /* From the next request on the parked trigger paces the plug; what
     * is held now goes out with the backend idle, as it would there.
     */
    pace_set (e, c, PACE_PLUG);
    c->pace_streak = 0;
    gathered = 0;
  }
  c->last_gathered = gathered;
  conn_unplug (e, c, PLUG_UNPLUG_QUIET, now, out);
}
