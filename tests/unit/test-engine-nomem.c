/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* test-engine-nomem: the engine when its own allocations fail.  The
 * engine and the plug are compiled in with alloc-fail.h (nomem-*.c), so
 * that a test can make every allocation of theirs fail for one call.
 * An unplug that cannot make its runs keeps everything held and tries
 * again later; what it must never do is let a newer write be held (or
 * answered) while an older overlapping one is still in a plug: the older
 * one would land over it.  A write that cannot make that room is
 * refused, before it is acknowledged, with ENOMEM.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine-harness.h"
#include "tap.h"

long alloc_budget = -1;
unsigned long alloc_failed;

/* From here on, let `budget` more allocations succeed, then fail (and
 * count the failures from 0); -1: no more failures.
 */
static void
fail_after (long budget)
{
  alloc_budget = budget;
  if (budget >= 0)
    alloc_failed = 0;
}

#define BLOCKS 64
#define BLOCK 4096

/* The op whose data each block of file 0 got last: runs that overlap
 * are never in flight together (QUEUE ORDER, checked by the harness),
 * so completion order is write order.
 */
static const struct eng_op *last_writer[BLOCKS];

static void
complete_recording (int err)
{
  while (nr_inflight > 0) {
    const struct plug_run *run = inflight[0]->run;
    size_t k;

    for (k = 0; err == 0 && k < run->n; ++k) {
      const struct plug_piece *p = run->reqs[k];
      uint64_t b;

      if (p->backing != 0)
        continue;
      for (b = p->offset / BLOCK; b < (p->offset + p->count) / BLOCK &&
             b < BLOCKS; ++b)
        last_writer[b] = p->opaque;
    }
    complete (0, err);
  }
}

static struct req *
write_at (struct eng_conn *c, uint64_t block)
{
  return submit (c, mkreq (ENG_WRITE, 0, block * BLOCK, BLOCK, 0));
}

/* Let the plug of c grow its vector of requests to 8 and empty it
 * again: a later write then needs no allocation to be held.
 */
static void
grow_plug (struct eng_conn *c)
{
  struct req *f;
  int i;

  for (i = 0; i < 8; ++i)
    write_at (c, 32 + i);
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_recording (0);
  if (!f->res.answered)
    printf ("Bail out! the FLUSH that empties the plug is not answered\n");
}

/* A write over held data whose unplug has no memory: the data is in
 * the writer's own plug, or (other) in another connection's.
 */
static void
test_over_held (bool other)
{
  const char *where = other ? "another connection's held data"
                            : "its own plug's held data";
  struct eng_conn *a, *b = NULL;
  struct req *older, *refused, *newer, *f;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  memset (last_writer, 0, sizeof last_writer);
  a = conn ();
  grow_plug (a);
  if (other) {
    b = conn ();
    grow_plug (b);
  }
  older = write_at (other ? b : a, 0);
  fail_after (0);
  refused = write_at (a, 0);
  fail_after (-1);
  ok (alloc_failed > 0 && refused->res.answered &&
      refused->res.err == ENOMEM && !refused->op.acked,
      "a write over %s, whose unplug has no memory, is refused with "
      "ENOMEM, not acknowledged (%s)", where, strerror (refused->res.err));
  newer = write_at (a, 0);
  f = submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_recording (0);
  ok (older->op.acked && newer->op.acked && f->res.answered &&
      f->res.err == 0, "with memory back, the next write is taken and a "
      "FLUSH answered (%s)", where);
  ok (last_writer[0] == &newer->op,
      "block 0 holds the newer write, not the older one (%s)", where);
  close_conn (a, 0);
  if (other)
    close_conn (b, 0);
  engine_free (e);
  free_all ();
}

/* A writer waiting for memory (max-bytes=) whose write overlaps another
 * connection's held data: let in when memory comes back, it must not be
 * answered (nor held) while that older data cannot go out.
 */
static void
test_memory_waiter (void)
{
  struct eng_conn *a, *b;
  struct req *older, *waiter, *f;
  unsigned i;

  /* max-bytes=16K: a plug goes out at 8K; one slot. */
  e = make (ENG_WRITEBACK, 1, 16 * 1024, 1);
  memset (last_writer, 0, sizeof last_writer);
  a = conn ();
  b = conn ();
  older = write_at (b, 0);
  /* a: two 8K plugs out, one in flight and one queued: 16K unfinished. */
  for (i = 0; i < 4; ++i)
    write_at (a, 8 + i);
  waiter = write_at (a, 0);
  ok (older->op.acked && !waiter->res.answered && nr_inflight == 1,
      "a's fifth write waits for memory, b's write is held");
  fail_after (0);
  complete_recording (0);
  fail_after (-1);
  ok (alloc_failed > 0 && !waiter->res.answered,
      "memory came back but b's plug cannot go out: the waiter is not "
      "answered");
  complete_recording (0);
  for (i = 0; i < 10 && !waiter->res.answered; ++i) {
    tick (10 * MS);
    complete_recording (0);
  }
  ok (waiter->res.answered && waiter->res.err == 0,
      "with memory back, the waiter is let in (%s)",
      strerror (waiter->res.err));
  f = submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  for (i = 0; i < 10 && !f->res.answered; ++i) {
    complete_recording (0);
    tick (10 * MS);
  }
  ok (f->res.answered && f->res.err == 0, "a FLUSH is answered");
  ok (last_writer[0] == &waiter->op,
      "block 0 holds the waiter's write, not b's older one");
  close_conn (a, 0);
  close_conn (b, 0);
  engine_free (e);
  free_all ();
}

/* An unplug that cannot make its runs keeps everything held and goes
 * out at its next chance; nothing it allocated is left behind (the
 * valgrind and ASan runs of this test see a leak).  Its first run and
 * its vector of runs are made, the second run is not.
 */
static void
test_failed_unplug_retried (void)
{
  struct eng_conn *c;
  struct req *w[4], *f;
  unsigned i, acked = 0;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  memset (last_writer, 0, sizeof last_writer);
  c = conn ();
  for (i = 0; i < 4; ++i)
    w[i] = write_at (c, 2 * i);
  fail_after (2);
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  fail_after (-1);
  ok (alloc_failed > 0 && !f->res.answered && nr_inflight == 0,
      "a FLUSH whose unplug has no memory waits, nothing is issued");
  for (i = 0; i < 100 && !f->res.answered; ++i) {
    tick (10 * MS);
    complete_recording (0);
  }
  for (i = 0; i < 4; ++i)
    acked += w[i]->op.acked && last_writer[2 * i] == &w[i]->op;
  ok (f->res.answered && f->res.err == 0 && acked == 4,
      "the unplug is tried again: the FLUSH is answered, all 4 writes "
      "written (%u)", acked);
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

int
main (void)
{
  test_over_held (false);
  test_over_held (true);
  test_memory_waiter ();
  test_failed_unplug_retried ();
  ok (order_violations == 0, "no run was issued over an overlapping run "
      "in flight (%u)", order_violations);
  ok (deadline_misses == 0, "no deadline came nearer unannounced (%u)",
      deadline_misses);
  return done_testing ();
}
