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

/* Hold mode: a timer (idle= or max-delay=) unplugs c.  With nothing of
 * c in flight, its client brought all it had and then waited for us:
 * its queue is shorter than its worker threads, so the parked trigger
 * never fires and every batch would wait for the timer.  See enum
 * conn_pace.
 */
void
pace_idle (struct eng_conn *c)
{
  c->pace_streak = c->nr_runs == 0 ? c->pace_streak + 1 : 0;
  if (c->pace_streak >= BUSY_STREAK) {
    pace_set (c->e, c, PACE_BUSY);
    c->last_gathered = 0;
    c->pace_streak = 0;
  }
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
