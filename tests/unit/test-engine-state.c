/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* test-engine-state: the engine's state machines (src/engine-int.h,
 * "the state machines").  The op's table refuses what would break a
 * rule (an acknowledged write answered again, an op released before
 * its client was answered), and a write's op and run pass through the
 * states the state log (-D plug.state=1) reports.
 */

#include <config.h>

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* op_set_state, for the death test; before the harness, whose globals
 * e and now its parameters would shadow.
 */
#include "../../src/engine-int.h"
#include "engine-harness.h"
#include "tap.h"

#define MAX_LINES 256

static char lines[MAX_LINES][96];
static size_t nr_lines;

static void
record (void *opaque, const char *msg)
{
  (void) opaque;
  if (nr_lines < MAX_LINES)
    snprintf (lines[nr_lines++], sizeof lines[0], "%s", msg);
}

/* Do the lines that begin with prefix ("op 1:") say exactly want[],
 * in order?
 */
static bool
says (const char *prefix, const char *const *want, size_t n)
{
  size_t i, k = 0;

  for (i = 0; i < nr_lines; ++i) {
    if (strncmp (lines[i], prefix, strlen (prefix)) != 0)
      continue;
    if (k == n || strcmp (lines[i], want[k]) != 0) {
      printf ("# unexpected: %s\n", lines[i]);
      return false;
    }
    k++;
  }
  if (k != n)
    printf ("# missing: %s\n", want[k]);
  return k == n;
}

static void
test_op_table (void)
{
  static const struct { enum eng_op_state from, to; } legal[] = {
    { OP_NEW, OP_ACKED }, { OP_NEW, OP_WAIT_MEMORY },
    { OP_NEW, OP_ADMITTED }, { OP_NEW, OP_WAITING },
    { OP_NEW, OP_ANSWERED }, { OP_WAIT_MEMORY, OP_ACKED },
    { OP_ADMITTED, OP_SYNC_WAIT }, { OP_SYNC_WAIT, OP_ANSWERED },
    { OP_ACKED, OP_FINISHED }, { OP_ANSWERED, OP_FINISHED },
  };
  static const struct { enum eng_op_state from, to; const char *why; }
  illegal[] = {
    { OP_ACKED, OP_ANSWERED, "an acknowledged write is never answered "
      "again" },
    { OP_ACKED, OP_SYNC_WAIT, "an acknowledged write is not a FUA write "
      "whose client waits" },
    { OP_NEW, OP_FINISHED, "an op is answered before it is released" },
    { OP_ADMITTED, OP_FINISHED, "a client that waits is answered before "
      "its op is released" },
    { OP_WAITING, OP_FINISHED, "a waiting FLUSH is answered first" },
    { OP_FINISHED, OP_NEW, "a released op has no next state" },
    { OP_FINISHED, OP_ANSWERED, "a released op is never answered" },
    { OP_ANSWERED, OP_ACKED, "an answered op is never admitted" },
    { OP_ANSWERED, OP_ANSWERED, "an op is answered once" },
  };
  size_t i;

  for (i = 0; i < sizeof legal / sizeof legal[0]; ++i)
    ok (eng_op_transition_legal (legal[i].from, legal[i].to),
        "op %s -> %s is legal", eng_op_state_name (legal[i].from),
        eng_op_state_name (legal[i].to));
  for (i = 0; i < sizeof illegal / sizeof illegal[0]; ++i)
    ok (!eng_op_transition_legal (illegal[i].from, illegal[i].to),
        "op %s -> %s is refused: %s", eng_op_state_name (illegal[i].from),
        eng_op_state_name (illegal[i].to), illegal[i].why);
  ok (!eng_op_transition_legal (OP_NEW, (enum eng_op_state) 99) &&
      strcmp (eng_op_state_name ((enum eng_op_state) 99), "?") == 0,
      "a state out of range is refused");
}

/* Writeback: the write is acknowledged at once, held until idle=, then
 * its run is queued, issued and done, and the op released.
 */
static void
test_writeback_write (void)
{
  static const char *const op[] = {
    "op 1: NEW -> ACKED", "op 1: ACKED -> FINISHED",
  };
  static const char *const run[] = {
    "run 1: NEW -> BLOCKED", "run 1: BLOCKED -> READY",
    "run 1: READY -> INFLIGHT", "run 1: INFLIGHT -> DONE",
  };
  struct eng_conn *c;
  struct req *w;

  nr_lines = 0;
  make_state_log = record;
  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  make_state_log = NULL;
  c = conn ();
  engine_conn_set_id (c, 7);
  w = submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  ok (w->op.acked && w->op.state == OP_ACKED,
      "a writeback write is ACKED at once");
  tick (10001 * MS);
  ok (nr_inflight == 1 && w->op.state == OP_ACKED,
      "idle= unplugs it: its run is in flight, the op still ACKED");
  complete_all (0);
  ok (w->res.released && !w->res.answered,
      "written: released, never on a reply list");
  ok (says ("op 1:", op, 2), "the op's log: NEW -> ACKED -> FINISHED");
  ok (says ("run 1:", run, 4),
      "the run's log: NEW -> BLOCKED -> READY -> INFLIGHT -> DONE");
  close_conn (c, 0);
  ok (says ("conn 7:", (const char *const[]) { "conn 7: OPEN -> CLOSING" },
            1), "the connection's log: OPEN -> CLOSING");
  engine_free (e);
  free_all ();
}

/* Hold mode: the client waits; its write is admitted, answered once
 * written, and released.
 */
static void
test_hold_write (void)
{
  static const char *const op[] = {
    "op 1: NEW -> ADMITTED", "op 1: ADMITTED -> ANSWERED",
    "op 1: ANSWERED -> FINISHED",
  };
  struct eng_conn *c;
  struct req *w;

  nr_lines = 0;
  make_state_log = record;
  e = make (ENG_HOLD, 64, 4 << 20, 1);
  make_state_log = NULL;
  c = conn ();
  w = submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  ok (!w->op.acked && w->op.state == OP_ADMITTED,
      "a hold-mode write is ADMITTED, its client waiting");
  tick (10001 * MS);
  complete_all (0);
  ok (w->res.answered && w->res.err == 0 && w->res.released,
      "written: answered and released");
  ok (says ("op 1:", op, 3),
      "the op's log: NEW -> ADMITTED -> ANSWERED -> FINISHED");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* In a child: an op in state from is moved to state to by the
 * engine's one function, on an engine whose state log is off (the
 * quick check).  How did the child end?
 */
static int
change_in_child (enum eng_op_state from, enum eng_op_state to)
{
  pid_t pid;
  int status;

  fflush (stdout);
  pid = fork ();
  if (pid == -1) {
    perror ("fork");
    exit (EXIT_FAILURE);
  }
  if (pid == 0) {
    struct eng_op op = { .kind = ENG_WRITE, .state = from };

    /* The assertion's message is expected: not on the TAP stream. */
    if (freopen ("/dev/null", "w", stderr) == NULL)
      _exit (2);
    e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
    op_set_state (e, &op, to);
    _exit (op.state == to ? 0 : 3);
  }
  if (waitpid (pid, &status, 0) == -1) {
    perror ("waitpid");
    exit (EXIT_FAILURE);
  }
  return status;
}

/* The engine itself refuses an illegal change (asserts), with the log
 * off as with it on.
 */
static void
test_illegal_aborts (void)
{
  int status;

#ifdef NDEBUG
  ok (true, "# SKIP built with NDEBUG: no assertions");
  return;
#endif
  status = change_in_child (OP_NEW, OP_ACKED);
  ok (WIFEXITED (status) && WEXITSTATUS (status) == 0,
      "the engine lets a write go NEW -> ACKED");
  status = change_in_child (OP_ACKED, OP_ANSWERED);
  ok (WIFSIGNALED (status) && WTERMSIG (status) == SIGABRT,
      "the engine aborts on ACKED -> ANSWERED (status %#x)", status);
  status = change_in_child (OP_FINISHED, OP_ANSWERED);
  ok (WIFSIGNALED (status) && WTERMSIG (status) == SIGABRT,
      "the engine aborts on FINISHED -> ANSWERED (status %#x)", status);
}

int
main (void)
{
  test_op_table ();
  test_illegal_aborts ();
  test_writeback_write ();
  test_hold_write ();
  return done_testing ();
}
