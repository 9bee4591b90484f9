/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine-state.c: the tables of the engine's state machines, and the
 * state log (engine-int.h, "the state machines").  A transition missing
 * from a table is a bug of the engine: eng_state_change asserts.
 */

#include <config.h>

#include <assert.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "engine-int.h"

#define TO(s) (1u << (s))

/* ---- op (engine.h, enum eng_op_state) ---- */

static const char *const op_states[] = {
  [OP_NEW] = "NEW",
  [OP_WAIT_MEMORY] = "WAIT_MEMORY",
  [OP_ACKED] = "ACKED",
  [OP_ADMITTED] = "ADMITTED",
  [OP_WAITING] = "WAITING",
  [OP_SYNC_WAIT] = "SYNC_WAIT",
  [OP_ANSWERED] = "ANSWERED",
  [OP_FINISHED] = "FINISHED",
};

static const uint32_t op_legal[ENG_MAX_STATES] = {
  /* A writeback write is acknowledged, waits for memory, or (past
   * max-bytes with nothing to wait for) is admitted; a mutation whose
   * client waits is admitted; FLUSH, read, close and exit wait, or in
   * hold mode a FLUSH waits for a sync at once; a read with nothing to
   * wait for, or a refused fast zero, is answered at once.
   */
  [OP_NEW] = TO (OP_WAIT_MEMORY) | TO (OP_ACKED) | TO (OP_ADMITTED) |
             TO (OP_WAITING) | TO (OP_SYNC_WAIT) | TO (OP_ANSWERED),
  /* Let in (answered, then admitted), or refused. */
  [OP_WAIT_MEMORY] = TO (OP_ACKED) | TO (OP_ANSWERED),
  /* Nobody waits for it: released when its last piece finished. */
  [OP_ACKED] = TO (OP_FINISHED),
  /* FUA: written, then synced; otherwise answered with its result. */
  [OP_ADMITTED] = TO (OP_SYNC_WAIT) | TO (OP_ANSWERED),
  [OP_WAITING] = TO (OP_SYNC_WAIT) | TO (OP_ANSWERED),
  [OP_SYNC_WAIT] = TO (OP_ANSWERED),
  [OP_ANSWERED] = TO (OP_FINISHED),
  [OP_FINISHED] = 0,
};


bool
eng_op_transition_legal (enum eng_op_state from, enum eng_op_state to)
{
  if ((unsigned) from >= ENG_OP_NR_STATES || (unsigned) to >= ENG_OP_NR_STATES)
    return false;
  return op_legal[from] & TO (to);
}

const char *
eng_op_state_name (enum eng_op_state s)
{
  return (unsigned) s < ENG_OP_NR_STATES ? op_states[s] : "?";
}

/* ---- run (engine.h, enum eng_run_state) ---- */

static const char *const run_states[] = {
  [RUN_NEW] = "NEW",
  [RUN_BLOCKED] = "BLOCKED",
  [RUN_READY] = "READY",
  [RUN_INFLIGHT] = "INFLIGHT",
  [RUN_DONE] = "DONE",
};

static const uint32_t run_legal[ENG_MAX_STATES] = {
  /* Queued by an unplug or the direct path; a split's piece goes out
   * again first.
   */
  [RUN_NEW] = TO (RUN_BLOCKED) | TO (RUN_READY),
  /* Its blockers finished; the direct path issues what overlaps
   * nothing at once.
   */
  [RUN_BLOCKED] = TO (RUN_READY) | TO (RUN_INFLIGHT),
  [RUN_READY] = TO (RUN_INFLIGHT),
  /* "Not now" puts it back first; otherwise it is done (or split). */
  [RUN_INFLIGHT] = TO (RUN_READY) | TO (RUN_DONE),
  [RUN_DONE] = 0,
};


/* ---- file queue (engine-int.h, enum file_state) ---- */

static const char *const file_states[] = {
  [FILE_RUNNING] = "RUNNING",
  [FILE_DELAYED] = "DELAYED",
  [FILE_STALLED] = "STALLED",
};

static const uint32_t file_legal[ENG_MAX_STATES] = {
  /* "Not now" with nothing in flight delays, with runs in flight
   * stalls.
   */
  [FILE_RUNNING] = TO (FILE_DELAYED) | TO (FILE_STALLED),
  /* Nothing is in flight while delayed: only a dispatch (the timer, a
   * FLUSH, a close) runs it again.
   */
  [FILE_DELAYED] = TO (FILE_RUNNING),
  /* A completion restarts it; the last run in flight said "not now"
   * too: delayed.
   */
  [FILE_STALLED] = TO (FILE_RUNNING) | TO (FILE_DELAYED),
};


/* ---- pace (engine-int.h, enum conn_pace) ---- */

static const char *const pace_states[] = {
  [PACE_PLUG] = "PLUG",
  [PACE_PASSTHROUGH] = "PASSTHROUGH",
  [PACE_BUSY] = "BUSY",
};

static const uint32_t pace_legal[ENG_MAX_STATES] = {
  [PACE_PLUG] = TO (PACE_BUSY) | TO (PACE_PASSTHROUGH),
  [PACE_PASSTHROUGH] = TO (PACE_PLUG),
  [PACE_BUSY] = TO (PACE_PLUG) | TO (PACE_PASSTHROUGH),
};


/* ---- connection and engine ---- */

static const char *const conn_states[] = {
  [CONN_OPEN] = "OPEN",
  [CONN_CLOSING] = "CLOSING",
};

static const uint32_t conn_legal[ENG_MAX_STATES] = {
  [CONN_OPEN] = TO (CONN_CLOSING),
  [CONN_CLOSING] = 0,
};


static const char *const engine_states[] = {
  [ENGINE_RUNNING] = "RUNNING",
  [ENGINE_SHUTTING_DOWN] = "SHUTTING_DOWN",
};

static const uint32_t engine_legal[ENG_MAX_STATES] = {
  [ENGINE_RUNNING] = TO (ENGINE_SHUTTING_DOWN),
  [ENGINE_SHUTTING_DOWN] = 0,
};


static const struct {
  const char *name;
  const char *const *states;
  const uint32_t *legal;
  unsigned nr_states;
} machines[] = {
  [ENG_M_OP] = { "op", op_states, op_legal, ENG_OP_NR_STATES },
  [ENG_M_RUN] = { "run", run_states, run_legal, RUN_DONE + 1 },
  [ENG_M_FILE] = { "file", file_states, file_legal, FILE_STALLED + 1 },
  [ENG_M_PACE] = { "pace", pace_states, pace_legal, PACE_BUSY + 1 },
  [ENG_M_CONN] = { "conn", conn_states, conn_legal, CONN_CLOSING + 1 },
  [ENG_M_ENGINE] = { "engine", engine_states, engine_legal,
                     ENGINE_SHUTTING_DOWN + 1 },
};

void
eng_state_init (struct engine *e)
{
  unsigned m, s;

  for (m = 0; m < ENG_NR_MACHINES; ++m) {
    assert (machines[m].nr_states <= ENG_MAX_STATES);
    for (s = 0; s < ENG_MAX_STATES; ++s)
      e->quiet_legal[m][s] = e->cfg.state_log == NULL &&
        s < machines[m].nr_states ? machines[m].legal[s] : 0;
  }
}

void
eng_state_slow (struct engine *e, enum eng_machine m, uint64_t id,
                unsigned from, unsigned to)
{
  char msg[96];

  assert (from < machines[m].nr_states && to < machines[m].nr_states &&
          (machines[m].legal[from] & TO (to)));
  if (e->cfg.state_log == NULL)
    return;
  snprintf (msg, sizeof msg, "%s %" PRIu64 ": %s -> %s",
            machines[m].name, id, machines[m].states[from],
            machines[m].states[to]);
  e->cfg.state_log (e->cfg.log_opaque, msg);
}
