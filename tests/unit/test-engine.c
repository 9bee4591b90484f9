/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* test-engine: the engine (src/engine.h) in scripted cases, each
 * played with engine-harness's fake clock and completions.
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

static void
test_flush_horizon (void)
{
  struct eng_conn *c;
  struct req *w[8], *f;
  size_t i;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  c = conn ();
  for (i = 0; i < 4; ++i)
    w[i] = submit (c, mkreq (ENG_WRITE, 0, i * 65536, 4096, 0));
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  for (i = 4; i < 8; ++i)
    w[i] = submit (c, mkreq (ENG_WRITE, 0, 1000000 + i * 65536, 4096, 0));
  ok (w[0]->op.acked && w[7]->op.acked, "writeback acknowledges at once");
  ok (!f->res.answered && nr_inflight == 4,
      "FLUSH waits; its 4 writes are in flight, later ones held");
  complete_all (0);
  ok (f->res.answered && f->res.err == 0,
      "FLUSH answered at its horizon while later writes are unfinished");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A FLUSH's unplug marks the only run of a file (flush_fua: the issuer
 * may write it with FUA instead of syncing after it); a file with two
 * runs, and runs of any other unplug, stay plain.
 */
static void
test_flush_fua (void)
{
  struct eng_conn *c;
  struct req *f;
  bool fua[3] = { false, false, false };
  unsigned runs[3] = { 0, 0, 0 };
  size_t i;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 3);
  c = conn ();
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  submit (c, mkreq (ENG_WRITE, 0, 4096, 4096, 0));     /* Merges. */
  submit (c, mkreq (ENG_WRITE, 1, 0, 4096, 0));
  submit (c, mkreq (ENG_WRITE, 1, 1 << 20, 4096, 0));   /* Its own run. */
  submit (c, mkreq (ENG_ZERO, 2, 8192, 4096, 0));
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  for (i = 0; i < nr_inflight; ++i) {
    uint32_t b = inflight[i]->run->backing;

    runs[b]++;
    fua[b] |= inflight[i]->flush_fua;
  }
  ok (runs[0] == 1 && runs[1] == 2 && runs[2] == 1,
      "the FLUSH unplugs 1, 2 and 1 runs of the three files");
  ok (fua[0] && fua[2], "a file's only run in the FLUSH's batch is marked");
  ok (!fua[1], "a file with two runs in it is not");
  complete_all (0);
  ok (f->res.answered && f->res.err == 0, "the FLUSH is answered");
  submit (c, mkreq (ENG_WRITE, 0, 65536, 4096, 0));
  tick (10001 * MS);
  ok (nr_inflight == 1 && !inflight[0]->flush_fua,
      "the run of an idle unplug is not marked");
  complete_all (0);
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A FLUSH unplugs every connection's plug: a file's runs from two
 * plugs are two writes before one sync, so neither is marked; a file
 * that only one plug wrote keeps the mark.
 */
static void
test_flush_fua_two_conns (void)
{
  struct eng_conn *a, *b;
  struct req *f;
  bool fua[2] = { false, false };
  unsigned runs[2] = { 0, 0 };
  size_t i;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 2);
  a = conn ();
  b = conn ();
  submit (a, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  submit (b, mkreq (ENG_WRITE, 0, 1 << 20, 4096, 0));
  submit (b, mkreq (ENG_WRITE, 1, 0, 4096, 0));
  f = submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  for (i = 0; i < nr_inflight; ++i) {
    uint32_t k = inflight[i]->run->backing;

    runs[k]++;
    fua[k] |= inflight[i]->flush_fua;
  }
  ok (runs[0] == 2 && runs[1] == 1,
      "the FLUSH unplugs both plugs: 2 runs of file 0 (one each), 1 of file 1");
  ok (!fua[0], "file 0's runs from two plugs are not marked");
  ok (fua[1], "file 1's only run is marked");
  complete_all (0);
  ok (f->res.answered && f->res.err == 0, "the FLUSH is answered");
  close_conn (a, 0);
  close_conn (b, 0);
  engine_free (e);
  free_all ();
}

static void
test_order_across_connections (void)
{
  struct eng_conn *a, *b;
  struct req *f;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  a = conn ();
  b = conn ();
  submit (a, mkreq (ENG_WRITE, 0, 0, 4096, 0));        /* Held by A. */
  submit (b, mkreq (ENG_WRITE, 0, 0, 4096, 0));        /* Unplugs A. */
  ok (nr_inflight == 1 && inflight[0]->conn != NULL,
      "an overlapping write on B unplugs A's older data first");
  f = submit (b, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (nr_inflight == 1,
      "B's newer overlapping run waits for A's run to complete");
  complete (0, 0);
  ok (nr_inflight == 1, "then B's run is issued");
  complete (0, 0);
  ok (f->res.answered && f->res.err == 0,
      "B's FLUSH covers A's write too");
  close_conn (a, 0);
  close_conn (b, 0);
  engine_free (e);
  free_all ();
}

static void
test_close_slot_contention (void)
{
  struct eng_conn *a, *b;
  struct eng_counts n;
  struct req *cl;

  e = make (ENG_WRITEBACK, 1, 4 << 20, 1);
  a = conn ();
  b = conn ();
  submit (a, mkreq (ENG_WRITE, 0, 0, 65536, 0));
  submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (nr_inflight == 1, "A's run takes the only slot");
  submit (b, mkreq (ENG_WRITE, 0, 2 << 20, 65536, 0));
  submit (b, mkreq (ENG_WRITE, 0, 3 << 20, 65536, 0));
  cl = submit (b, mkreq (ENG_CLOSE, 0, 0, 0, 0));
  tick (900 * MS);
  ok (!cl->res.answered, "B's close waits for a slot, nothing dropped");
  complete (0, 0);                      /* Progress: A's run. */
  ok (nr_inflight == 1, "B's first run gets the slot when A's completes");
  tick (900 * MS);                      /* Past requeue-timeout since the
                                         * close, but the backend moves. */
  complete (0, 0);
  ok (nr_inflight == 1, "B's second run is still there, and issued");
  tick (900 * MS);
  complete (0, 0);
  engine_counts (e, &n);
  ok (cl->res.answered && n.lost == 0,
      "B's close answered once its data is written; nothing lost");
  engine_conn_free (e, b);
  close_conn (a, 0);
  engine_free (e);
  free_all ();
}

static void
test_close_stuck_backend (void)
{
  struct eng_conn *a, *b;
  struct eng_counts n;
  struct req *cl;

  e = make (ENG_WRITEBACK, 1, 4 << 20, 1);
  a = conn ();
  b = conn ();
  submit (a, mkreq (ENG_WRITE, 0, 0, 65536, 0));
  submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  submit (b, mkreq (ENG_WRITE, 0, 2 << 20, 65536, 0));
  cl = submit (b, mkreq (ENG_CLOSE, 0, 0, 0, 0));
  tick (1100 * MS);                     /* No completion for requeue-timeout. */
  tick (100000 * MS);
  engine_counts (e, &n);
  ok (!cl->res.answered && n.lost == 0 && n.queued == 1,
      "a close behind a slow backend (nothing completes, nothing is "
      "refused) waits, however long: nothing is given up");
  complete_all (0);                     /* A's run: B's goes out. */
  complete_all (0);
  engine_counts (e, &n);
  ok (cl->res.answered && cl->res.err == 0 && n.lost == 0,
      "the close is answered once B's data is written");
  engine_conn_free (e, b);
  close_conn (a, 0);
  engine_free (e);
  free_all ();
}

static void
test_eagain_at_close (void)
{
  struct eng_conn *c;
  struct eng_counts n;
  struct req *cl;
  int i;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  c = conn ();
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  cl = submit (c, mkreq (ENG_CLOSE, 0, 0, 0, 0));
  for (i = 0; i < 5; ++i) {
    ok (nr_inflight == 1, "attempt %d issued", i);
    complete (0, EAGAIN);
    ok (nr_inflight == 0 && engine_next_deadline (e) < UINT64_MAX,
        "EAGAIN delays the queue on a timer");
    tick (engine_next_deadline (e) - now);
  }
  complete (0, 0);
  engine_counts (e, &n);
  ok (cl->res.answered && n.lost == 0 && n.bytes == 0,
      "close answered after the retries; nothing lost");
  engine_conn_free (e, c);
  engine_free (e);
  free_all ();
}

/* requeue-timeout= is the file's: a run gives up when its file has said
 * "not now" for that long, since its last success, whoever it said it
 * to.  Hold mode, max-inflight=2: B gets EAGAIN while A is in flight
 * (the queue waits for a completion); past requeue-timeout A gets EAGAIN
 * too and gives up, and B, with nothing left in flight to restart its
 * queue, must be issued at once and give up at its next refusal.
 */
static void
test_give_up_restarts_stalled (void)
{
  struct eng_conn *c;
  struct req *a, *b, *d;

  e = make (ENG_HOLD, 2, 1 << 20, 1);
  c = conn ();
  a = submit (c, mkreq (ENG_WRITE, 0, 0, 4096, ENG_F_FUA));
  b = submit (c, mkreq (ENG_WRITE, 0, 8192, 4096, ENG_F_FUA));
  ok (nr_inflight == 2, "A and B are in flight");
  complete_at (0, 8192, EAGAIN);
  now += 2000 * MS;
  complete_at (0, 0, EAGAIN);
  ok (a->res.answered && a->res.err == EIO && nr_inflight == 1,
      "past requeue-timeout A gives up (%s), and B is issued again at once",
      strerror (a->res.err));
  complete_all (EAGAIN);
  ok (b->res.answered && b->res.err == EIO,
      "B gives up at its next refusal (%s)", strerror (b->res.err));
  d = submit (c, mkreq (ENG_WRITE, 0, 16384, 4096, ENG_F_FUA));
  complete_all (0);
  ok (d->res.answered && d->res.err == 0,
      "the backend recovered: a new write is written");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A backend that refuses everything, one slot: N FUA writes are all
 * answered (with EIO) about requeue-timeout after the first refusal, not
 * N times requeue-timeout, as they were when each run had its own clock.
 */
static void
test_give_up_many_queued (void)
{
  enum { N = 20 };
  struct eng_conn *c;
  struct req *w[N];
  uint64_t start = now;
  unsigned i, answered = 0, guard = 0;

  e = make (ENG_HOLD, 1, 1 << 20, 1);
  c = conn ();
  for (i = 0; i < N; ++i)
    w[i] = submit (c, mkreq (ENG_WRITE, 0, i * 8192ULL, 4096, ENG_F_FUA));
  while (answered < N && guard++ < 100000) {
    if (nr_inflight > 0)
      complete_all (EAGAIN);
    else
      tick (engine_next_deadline (e) - now);
    for (answered = 0, i = 0; i < N; ++i)
      answered += w[i]->res.answered && w[i]->res.err == EIO;
  }
  ok (answered == N, "all %u writes are refused with EIO", (unsigned) N);
  ok (now - start <= 2000 * MS, "within %" PRIu64 " ms of the first "
      "refusal (requeue-timeout 1000 ms; at most 2000)",
      (uint64_t) ((now - start) / MS));
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* Complete what is in flight and let the engine's timers fire until
 * q is answered (or nothing is left to do).
 */
static void
drain_until_answered (struct req *q)
{
  int guard;

  for (guard = 0; guard < 100; ++guard) {
    uint64_t d;

    complete_all (0);
    if (q->res.answered)
      return;
    d = engine_next_deadline (e);
    if (d == UINT64_MAX)
      return;
    tick (d > now ? d - now : 0);
  }
}

/* Deadlines that appear while something else is armed: the harness
 * keeps one timer as the plumbing does (engine-harness.c, check_timer)
 * and counts each engine call after which the engine's next deadline
 * is earlier than that timer, unannounced.
 */
static void
test_deadlines_announced (void)
{
  struct eng_conn *c;
  struct req *w, *x;
  unsigned before = deadline_misses;

  /* The exit's deadline (requeue-timeout, 1 s) with a plug's idle= (10 s)
   * armed and a run in flight that never completes.
   */
  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  c = conn ();
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  submit (c, mkreq (ENG_WRITE, 0, 8192, 4096, ENG_F_FUA));
  submit (c, mkreq (ENG_WRITE, 0, 65536, 4096, 0));
  x = submit (NULL, mkreq (ENG_SHUTDOWN, 0, 0, 0, 0));
  ok (!x->res.answered && deadline_misses == before,
      "the exit's deadline is announced");
  complete_all (0);
  ok (x->res.answered, "the exit is answered");
  engine_conn_free (e, c);
  engine_free (e);
  free_all ();

  /* A close behind a file that refuses everything: the run is given
   * up once the file said "not now" for requeue-timeout, the close is
   * answered, and no timer is left behind.
   */
  {
    struct eng_conn *a;
    struct req *cl;
    uint64_t t0, close_at;

    before = deadline_misses;
    e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
    a = conn ();
    submit (a, mkreq (ENG_WRITE, 0, 0, 4096, ENG_F_FUA));
    t0 = now;
    close_at = t0 + 1000 * MS;          /* requeue-timeout of the close. */
    cl = submit (a, mkreq (ENG_CLOSE, 0, 0, 0, 0));
    tick (50 * MS);
    /* Refused again and again: the delays grow to 100 ms. */
    while (!cl->res.answered && now < close_at + 1000 * MS) {
      uint64_t d;

      complete_all (EAGAIN);
      d = engine_next_deadline (e);
      if (d == UINT64_MAX)
        break;
      tick (d - now);
    }
    ok (cl->res.answered && now >= close_at && nr_inflight == 0 &&
        engine_next_deadline (e) == UINT64_MAX,
        "refused for requeue-timeout, the run is given up and the close "
        "answered; no timer is left");
    engine_conn_free (e, a);
    c = conn ();
    w = submit (c, mkreq (ENG_WRITE, 0, 65536, 4096, 0));
    x = submit (c, mkreq (ENG_READ, 0, 65536, 4096, 0));
    ok (w->op.acked && !x->res.answered && nr_inflight == 1 &&
        deadline_misses == before,
        "after the give-up the file runs again: a read unplugs a write, "
        "which goes out at once (%u)", deadline_misses - before);
    drain_until_answered (x);
    ok (x->res.answered && x->res.err == 0, "the read is answered once "
        "the write is done");
    close_conn (c, 0);
    engine_free (e);
    free_all ();
  }
}

/* Would the direct path take a 4 KiB write at off?  Whatever it
 * decides, the write is then done: the direct path remembers every
 * request it was asked about.
 */
static bool
goes_direct (struct eng_conn *c, uint64_t off)
{
  struct req *q = mkreq (ENG_WRITE, 0, off, 4096, 0);
  struct eng_actions a;
  bool direct;

  eng_actions_init (&a);
  direct = engine_try_direct (e, c, &q->op, now, &a);
  perform (&a);
  if (!direct)
    submit (c, q);
  complete_all (0);
  return direct;
}

/* The direct path takes what could not merge: a request near none of
 * the connection's last 16 (within 16 requests of its size, capped at
 * max-merge) goes straight to its file.
 */
static void
test_direct_near_recent (void)
{
  struct eng_conn *c;
  const uint64_t K = 4096, window = 16 * K;
  struct eng_counts n;
  unsigned i, direct;

  make_direct = true;
  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  make_direct = false;
  c = conn ();
  const uint64_t G = 1 << 30;

  ok (goes_direct (c, 0), "a connection's first write, at 0, goes direct "
      "(an empty slot is near nothing)");
  ok (!goes_direct (c, K), "the next block is near it: plugged");
  /* Each probe in a region of its own, a GiB from any other. */
  ok (goes_direct (c, G), "a write far from all goes direct");
  ok (!goes_direct (c, G + K + window), "a write the window after a "
      "recent one's end is near");
  ok (goes_direct (c, 2 * G), "a write far from all goes direct");
  ok (goes_direct (c, 2 * G + K + window + 1), "one byte further goes "
      "direct");
  ok (goes_direct (c, 3 * G), "a write far from all goes direct");
  ok (!goes_direct (c, 3 * G - window - K), "a write ending the window "
      "before a recent one is near");
  ok (goes_direct (c, 4 * G), "a write far from all goes direct");
  ok (goes_direct (c, 4 * G - window - K - 1), "one byte further goes "
      "direct");
  for (i = 0, direct = 0; i < 16; ++i)
    direct += goes_direct (c, (i + 8) * G);
  ok (direct == 16, "16 writes a GiB apart all go direct (%u)", direct);
  ok (goes_direct (c, 3 * K), "the first writes are forgotten after 16 "
      "more: near them is direct again");
  ok (!goes_direct (c, 9 * G + K), "the 16th last write is still "
      "remembered");
  ok (goes_direct (c, 8 * G + K), "the 17th last is not");
  close_conn (c, 0);
  engine_counts (e, &n);
  ok (n.bytes == 0, "copied bytes counted back to 0 (%" PRIu64 "): a "
      "direct write's count as the plugged ones'", n.bytes);
  engine_free (e);
  free_all ();
}

static struct req *mkreq_across (enum eng_kind kind, uint64_t len,
                                 uint32_t flags);

/* Would the direct path take q (not yet submitted)?  Then it is
 * completed, else submitted to the plug.
 */
static bool
takes_direct (struct eng_conn *c, struct req *q)
{
  struct eng_actions a;
  bool direct;

  eng_actions_init (&a);
  direct = engine_try_direct (e, c, &q->op, now, &a);
  perform (&a);
  if (!direct)
    submit (c, q);
  return direct;
}

/* A file whose rule is ENG_DIRECT_LARGE (an NBD server, in writeback
 * mode) gets only direct-size= requests on the direct path: a request
 * that merges with nothing is acknowledged from the plug like the
 * rest.  Its neighbour file keeps the nearness rule.
 */
static void
test_direct_rule_large (void)
{
  const uint64_t G = 1 << 30;
  struct eng_conn *c;
  struct req *q;
  struct eng_counts n;

  memset (&stats, 0, sizeof stats);
  make_direct = true;
  make_direct_size = 65536;
  e = make (ENG_WRITEBACK, 64, 4 << 20, 2);
  make_direct = false;
  make_direct_size = 0;
  engine_set_direct_rule (e, 1, ENG_DIRECT_LARGE);
  c = conn ();

  ok (takes_direct (c, mkreq (ENG_WRITE, 0, 0, 4096, 0)),
      "a first write to the local-like file goes direct");
  q = mkreq (ENG_WRITE, 1, G, 4096, 0);
  q->op.offset = 2 * G;         /* Far from every recent request. */
  ok (!takes_direct (c, q) && q->op.acked,
      "a write far from all to the large-only file is plugged and "
      "acknowledged");
  engine_counts (e, &n);
  ok (n.held == 1 && nr_inflight == 1, "it is held (%" PRIu64 "), the "
      "direct one in flight (%zu)", n.held, nr_inflight);
  q = mkreq (ENG_WRITE, 1, 3 * G, 65536, 0);
  q->op.offset = 5 * G;
  ok (takes_direct (c, q), "a direct-size= write to the large-only file "
      "goes direct");
  q = mkreq_across (ENG_WRITE, 4096, 0);
  q->op.offset = 7 * G;
  ok (!takes_direct (c, q), "a small write over both files is plugged: "
      "one of them takes only large requests");
  ok (stats.direct == 2, "the two direct ones are counted (%" PRIu64 ")",
      stats.direct);
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* Pieces the layout never makes are refused, not taken in: an empty
 * one, and one whose end passes 2^64.
 */
static void
test_bad_pieces_refused (void)
{
  struct eng_conn *c;
  struct eng_actions a;
  struct req *q;
  struct eng_counts n;
  static const struct { uint64_t off, len; uint32_t flags; const char *what; }
  bad[] = {
    { 1024, 0, 0, "an empty write" },
    { 1024, 0, ENG_F_FAST, "an empty fast zero" },
    { UINT64_MAX - 4095, 4096, 0, "a write ending at 2^64" },
    { UINT64_MAX - 1023, 4096, 0, "a write past 2^64" },
  };
  size_t i;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  c = conn ();
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, ENG_F_FUA));
  for (i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
    enum eng_kind kind = bad[i].flags & ENG_F_FAST ? ENG_ZERO : ENG_WRITE;

    q = mkreq (kind, 0, bad[i].off, 4096, bad[i].flags);
    q->piece[0].count = bad[i].len;
    eng_actions_init (&a);
    ok (!engine_try_direct (e, c, &q->op, now, &a),
        "the direct path refuses %s", bad[i].what);
    perform (&a);
    submit (c, q);
    ok (q->res.answered && q->res.err == EINVAL && !q->op.acked,
        "submit refuses %s with EINVAL (%s)", bad[i].what,
        strerror (q->res.err));
  }
  q = mkreq (ENG_READ, 0, UINT64_MAX - 1023, 4096, 0);
  submit (c, q);
  ok (q->res.answered && q->res.err == EINVAL,
      "a read past 2^64 is refused with EINVAL (%s)", strerror (q->res.err));
  q = mkreq (ENG_READ, 5, 0, 4096, 0);
  submit (c, q);
  ok (q->res.answered && q->res.err == EINVAL,
      "a read of a file that does not exist too (%s)",
      strerror (q->res.err));
  complete_all (0);
  engine_counts (e, &n);
  ok (n.held == 0 && n.queued == 0 && n.unfinished == 0,
      "nothing of them was taken in");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* Two adjacent writes at [0, 8K) on file 0, then a FLUSH that sends
 * them out (merged into one run); returns the FLUSH.
 */
/* An op over two files (the pieces of a concatenated layout): len
 * bytes at 65536 of file 0 (4096 for a zero, whose op count stays
 * len) and len bytes at 0 of file 1.
 */
static struct req *
mkreq_across (enum eng_kind kind, uint64_t len, uint32_t flags)
{
  struct req *q = mkreq (kind, 0, kind == ENG_ZERO ? 4096 : 65536, len,
                         flags);

  if (kind == ENG_WRITE)
    q->op.count = q->op.bytes = 2 * len;
  q->op.nr_pieces = 2;
  q->piece[1] = q->piece[0];
  q->piece[1].backing = 1;
  q->piece[1].offset = 0;
  return q;
}

/* Write [off, off+len) of file b again on c, successfully, and FLUSH:
 * returns the FLUSH, answered.
 */
static struct req *
rewrite_and_flush (struct eng_conn *c, uint32_t b, uint64_t off,
                   uint64_t len)
{
  struct req *f;

  submit (c, mkreq (ENG_WRITE, b, off, len, 0));
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (0);
  return f;
}

static struct req *
flush_two_adjacent (struct eng_conn *c)
{
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  submit (c, mkreq (ENG_WRITE, 0, 4096, 4096, 0));
  return submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
}

static void
test_failing_neighbour (void)
{
  struct eng_conn *c;
  struct eng_counts n;
  struct req *f;
  size_t i;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  c = conn ();
  f = flush_two_adjacent (c);
  ok (nr_inflight == 1 && inflight[0]->run->n == 2,
      "two adjacent writes merge into one run");
  complete (0, ENOSPC);
  ok (nr_inflight == 2, "the failed run is retried member by member");
  for (i = 0; i < nr_inflight; )
    if (inflight[i]->run->offset == 0)
      complete (i, ENOSPC);
    else
      i++;
  complete_all (0);
  engine_counts (e, &n);
  ok (f->res.answered && f->res.err == ENOSPC && n.lost == 1,
      "only the failing range is lost; the FLUSH reports it");
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (f->res.answered && f->res.err == ENOSPC,
      "the next FLUSH fails too: the record is the truth about the disk, "
      "not a message delivered once");
  f = rewrite_and_flush (c, 0, 4096, 4096);
  ok (f->res.answered && f->res.err == ENOSPC,
      "a rewrite of the neighbour that was written heals nothing");
  f = rewrite_and_flush (c, 0, 0, 4096);
  ok (f->res.answered && f->res.err == 0,
      "a rewrite of the lost range that succeeded heals it: the FLUSH "
      "after it succeeds");
  engine_counts (e, &n);
  ok (n.bytes == 0, "failed data released");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

static void
test_deferred_to_new_connection (void)
{
  struct eng_conn *a, *b;
  struct req *f;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  a = conn ();
  submit (a, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  close_conn (a, EIO);
  b = conn ();
  f = submit (b, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (f->res.answered && f->res.err == EIO,
      "a connection opened after an unreported loss: its FLUSH fails");
  f = submit (b, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (f->res.err == EIO, "... and every FLUSH after it");
  f = rewrite_and_flush (b, 0, 0, 4096);
  ok (f->res.answered && f->res.err == 0, "until the range is rewritten");
  close_conn (b, 0);
  engine_free (e);
  free_all ();
}

static void
test_memory_bound_every_run_fails (void)
{
  struct eng_conn *c;
  struct eng_counts n;
  uint64_t max = 0;
  int i, waited = 0;

  e = make (ENG_WRITEBACK, 64, 16384, 1);
  c = conn ();
  for (i = 0; i < 400; ++i) {
    struct req *q = submit (c, mkreq (ENG_WRITE, 0, (uint64_t) i * 8192,
                                      4096, 0));

    if (!q->op.acked)
      waited++;
    engine_counts (e, &n);
    if (n.bytes > max)
      max = n.bytes;
    if (i % 8 == 7) {
      /* Every run fails; waiting writers are let in as memory frees. */
      int guard = 0;

      do {
        complete_all (EIO);
        tick (1 * MS);
        engine_counts (e, &n);
        if (n.bytes > max)
          max = n.bytes;
      } while (nr_inflight > 0 && guard++ < 100);
    }
  }
  ok (max <= 16384 + 4096, "copies stay under max-bytes (%llu)",
      (unsigned long long) max);
  ok (waited > 0, "writers past the bound wait instead of being acked");
  close_conn (c, EIO);
  engine_free (e);
  free_all ();
}

static void
test_fast_zero (void)
{
  struct eng_conn *c;
  struct req *z, *q;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 2);
  c = conn ();
  q = mkreq_across (ENG_ZERO, 8192, ENG_F_FAST);
  z = submit (c, q);
  ok (z->res.answered && z->res.err == ENOTSUP && nr_inflight == 0,
      "a fast zero across files is refused before anything is issued");
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));        /* Held. */
  z = submit (c, mkreq (ENG_ZERO, 0, 0, 4096, ENG_F_FAST));
  ok (z->res.answered && z->res.err == ENOTSUP,
      "a fast zero over unfinished data does not wait");
  z = submit (c, mkreq (ENG_ZERO, 1, 1 << 20, 4096, ENG_F_FAST));
  ok (!z->res.answered && nr_inflight == 1, "a free one is issued at once");
  complete_all (0);
  ok (z->res.answered && z->res.err == 0, "and answered when done");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

static void
test_hold_and_timers (void)
{
  struct eng_conn *c;
  struct req *w;
  struct eng_actions a;

  e = make (ENG_HOLD, 64, 4 << 20, 1);
  ok (engine_next_deadline (e) == UINT64_MAX, "no timer when idle");
  c = conn ();
  w = submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  ok (!w->op.acked && !w->res.answered, "hold mode does not acknowledge");
  ok (engine_next_deadline (e) == now + 10000 * MS, "idle= deadline armed");
  eng_actions_init (&a);
  engine_conn_set_workers (e, c, 1, now, &a);
  perform (&a);
  ok (nr_inflight == 1, "every worker waits: parked unplug");
  complete_all (0);
  ok (w->res.answered && w->res.err == 0, "answered once written");
  ok (eng_add_ns (UINT64_MAX - 5, 10) == UINT64_MAX,
      "deadlines saturate instead of wrapping");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

static uint64_t wave_off;       /* Where next_write writes. */

/* A hold-mode engine with one connection of `workers` threads. */
static struct eng_conn *
hold_conn (unsigned workers)
{
  struct eng_actions a;
  struct eng_conn *c;

  e = make (ENG_HOLD, 64, 4 << 20, 1);
  memset (&stats, 0, sizeof stats);
  c = conn ();
  eng_actions_init (&a);
  engine_conn_set_workers (e, c, workers, now, &a);
  perform (&a);
  wave_off = 0;
  return c;
}

/* The client's next 4 KiB of a sequential stream. */
static struct req *
next_write (struct eng_conn *c)
{
  struct req *q = submit (c, mkreq (ENG_WRITE, 0, wave_off, 4096, 0));

  wave_off += 4096;
  return q;
}

/* One wave of a hold-mode client with `workers` threads: they all
 * bring a 4 KiB write, client_us apart, then the backend takes svc_us
 * for whatever was issued.  Returns the number of runs issued before
 * the last write of the wave arrived.
 */
static size_t
wave (struct eng_conn *c, unsigned workers, uint64_t client_us,
      uint64_t svc_us)
{
  size_t early = 0;
  unsigned i;

  for (i = 0; i < workers; ++i) {
    now += client_us * 1000;
    if (i == workers - 1)
      early = nr_inflight;
    next_write (c);
  }
  while (nr_inflight > 0) {
    now += svc_us * 1000;
    complete_all (0);
  }
  return early;
}

static void
test_hold_pacing (void)
{
  struct eng_conn *c;
  struct req *w[8];
  size_t i, early = 0;
  uint64_t quiet;

  c = hold_conn (8);

  /* A backend far faster than the client: the parked unplug is how
   * every wave starts, until it has seen that twice.
   */
  for (i = 0; i < 3; ++i)
    early += wave (c, 8, 50, 10);
  ok (early == 0 && stats.unplugs[PLUG_UNPLUG_PARKED] == 3,
      "a fast backend: the first waves wait until every worker parked");
  w[0] = next_write (c);
  ok (nr_inflight == 1 && inflight[0]->run->n == 1 &&
      stats.unplugs[PLUG_UNPLUG_QUIET] == 1,
      "then a write with nothing in flight is issued at once");
  for (i = 1; i < 4; ++i) {
    w[i] = next_write (c);
  }
  ok (nr_inflight == 1 && !w[1]->res.answered,
      "writes arriving while it is written are held");
  complete (0, 0);
  ok (w[0]->res.answered && nr_inflight == 1 && inflight[0]->run->n == 3,
      "and go out as one run when it finishes");
  complete_all (0);
  ok (w[3]->res.answered && w[3]->res.err == 0, "answered once written");

  /* The backend slows down: what gathers while it writes shows that
   * holding pays again, 5 on average with the 3 before.
   */
  next_write (c);
  for (i = 0; i < 7; ++i) {
    w[i] = next_write (c);
  }
  now += 1000 * MS;
  complete (0, 0);
  ok (nr_inflight == 1 && inflight[0]->run->n == 7,
      "slow backend: the 7 held writes go out together");
  now += 1000 * MS;
  complete_all (0);
  ok (w[6]->res.answered, "and are answered");
  quiet = stats.unplugs[PLUG_UNPLUG_QUIET];
  w[0] = next_write (c);
  ok (nr_inflight == 0 && !w[0]->res.answered,
      "back to waiting: a lone write is held");
  early = wave (c, 7, 50, 1000 * 1000);
  ok (early == 0 && stats.unplugs[PLUG_UNPLUG_QUIET] == quiet &&
      w[0]->res.answered, "until every worker parked");

  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A client queue shorter than the connection's worker threads: the
 * parked trigger never fires, and waiting for a timer twice with the
 * backend idle is enough to stop waiting.  The timer is idle=, or
 * max-delay= where that is the shorter.
 */
static void
test_hold_short_queue (bool aged)
{
  enum plug_reason timer = aged ? PLUG_UNPLUG_MAX_DELAY : PLUG_UNPLUG_IDLE;
  const char *name = aged ? "max-delay" : "idle";
  struct eng_conn *c;
  struct req *w = NULL;
  unsigned i, k;

  make_max_delay_ns = aged ? 5000 * MS : 60000 * MS;
  c = hold_conn (16);
  for (i = 0; i < 2; ++i) {
    for (k = 0; k < 4; ++k) {
      w = next_write (c);
    }
    ok (nr_inflight == 0, "short queue, wave %u: held", i + 1);
    tick (10000 * MS);
    ok (nr_inflight == 1 && inflight[0]->run->n == 4 &&
        stats.unplugs[timer] == i + 1,
        "until %s (the four merged)", name);
    complete_all (0);
    ok (w->res.answered, "answered");
  }
  w = next_write (c);
  ok (nr_inflight == 1 && stats.unplugs[PLUG_UNPLUG_QUIET] == 1,
      "then a write is issued at once when nothing is in flight");
  complete_all (0);
  ok (w->res.answered, "answered");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
  make_max_delay_ns = 60000 * MS;
}

/* A backend that slows down under a client whose queue fills the
 * connection's workers: with one run in flight at a time the queue
 * splits into batches that alternate large and small.  Their average
 * is what shows holding pays again.
 */
static void
test_hold_alternating (void)
{
  struct eng_conn *c;
  struct req *w = NULL;
  size_t i, k;

  c = hold_conn (8);
  for (i = 0; i < 3; ++i)
    wave (c, 8, 50, 10);
  next_write (c);
  ok (nr_inflight == 1 && stats.unplugs[PLUG_UNPLUG_QUIET] == 1,
      "alternating: a fast backend, a lone write is issued at once");
  for (k = 0; k < 7; ++k)
    next_write (c);
  now += 1000 * MS;
  complete (0, 0);
  ok (nr_inflight == 1 && inflight[0]->run->n == 7,
      "batch 1: the 7 held go out when the run finishes");
  w = next_write (c);
  now += 1000 * MS;
  complete (0, 0);
  ok (nr_inflight == 1 && inflight[0]->run->n == 1,
      "batch 2: 1, 4 on average over the last two: it goes out too");
  now += 1000 * MS;
  complete_all (0);
  ok (w->res.answered, "answered");
  w = next_write (c);
  ok (nr_inflight == 0 && !w->res.answered,
      "back to waiting: a lone write is held");
  wave (c, 7, 50, 1000 * 1000);
  ok (w->res.answered, "until every worker parked");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* SEQUENCE with two runs in flight: a FLUSH waits until the write at
 * its horizon has finished, not only until it was issued, whichever of
 * the two finishes first.
 */
static void
test_flush_waits_for_horizon_write (void)
{
  struct eng_conn *c;
  struct req *f;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  c = conn ();
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  submit (c, mkreq (ENG_WRITE, 0, 1 << 20, 4096, 0));
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (nr_inflight == 2 && !f->res.answered,
      "FLUSH: both writes issued as two runs, the FLUSH waits");
  complete_at (0, 0, 0);
  ok (!f->res.answered,
      "the older finished: the FLUSH waits for the one at its horizon");
  complete_at (0, 1 << 20, 0);
  ok (f->res.answered && f->res.err == 0, "answered once both finished");

  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  submit (c, mkreq (ENG_WRITE, 0, 1 << 20, 4096, 0));
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (nr_inflight == 2 && !f->res.answered, "again, two runs in flight");
  complete_at (0, 1 << 20, 0);
  ok (!f->res.answered,
      "the newer finished first: the FLUSH waits for the older");
  complete_at (0, 0, 0);
  ok (f->res.answered && f->res.err == 0, "answered once both finished");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A FUA write in writeback mode is not acknowledged at submit: it is
 * answered once its own run finished, not before, and not when another
 * FUA write's run finished.
 */
static void
test_fua_write_answered_when_written (void)
{
  struct eng_conn *c;
  struct req *w[2];

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  c = conn ();
  w[0] = submit (c, mkreq (ENG_WRITE, 0, 0, 4096, ENG_F_FUA));
  w[1] = submit (c, mkreq (ENG_WRITE, 0, 1 << 20, 4096, ENG_F_FUA));
  ok (!w[0]->op.acked && !w[1]->op.acked &&
      !w[0]->res.answered && !w[1]->res.answered,
      "FUA writes are not acknowledged at submit");
  ok (nr_inflight == 2, "each goes out at once as a run of its own");
  complete_at (0, 1 << 20, 0);
  ok (w[1]->res.answered && w[1]->res.err == 0 && !w[0]->res.answered,
      "the second is answered when its run finished, the first still "
      "waits");
  complete_at (0, 0, EIO);
  ok (w[0]->res.answered && w[0]->res.err == EIO,
      "the first gets its run's error");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* THE RECORD, multi-conn: an acknowledged write of A that fails for
 * good is reported by every FLUSH of A and of B (B may rely on a FLUSH
 * covering A's write) until a write over its range succeeds.
 */
static void
test_deferred_every_connection (void)
{
  struct eng_conn *a, *b;
  struct req *f;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  a = conn ();
  b = conn ();
  submit (a, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  f = submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (EIO);
  ok (f->res.answered && f->res.err == EIO, "A's FLUSH reports the loss");
  f = submit (b, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (f->res.answered && f->res.err == EIO,
      "B's next FLUSH reports it too");
  f = submit (b, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (f->res.answered && f->res.err == EIO, "and again");
  f = submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (f->res.answered && f->res.err == EIO, "and A's again");
  f = rewrite_and_flush (b, 0, 0, 4096);
  ok (f->res.answered && f->res.err == 0, "B rewrites it: B's FLUSH "
      "succeeds");
  f = submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (0);
  ok (f->res.answered && f->res.err == 0, "and A's");
  close_conn (a, 0);
  close_conn (b, 0);
  engine_free (e);
  free_all ();
}

/* A connection opened after a write failed for good sees the loss as
 * every other one does: the record is the export's, not a message per
 * connection.
 */
static void
test_deferred_new_connection_keeps_own (void)
{
  struct eng_conn *a, *c;
  struct req *f;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  a = conn ();
  submit (a, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  tick (10001 * MS);                    /* idle= unplugs it. */
  ok (nr_inflight == 1, "the write goes out on idle=");
  complete_all (EIO);
  c = conn ();
  f = submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (f->res.answered && f->res.err == EIO, "A's FLUSH reports the loss");
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (f->res.answered && f->res.err == EIO,
      "the connection opened after the loss reports it too");
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (f->res.answered && f->res.err == EIO, "... and again");
  f = rewrite_and_flush (a, 0, 0, 4096);
  ok (f->res.answered && f->res.err == 0, "healed by A's rewrite");
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (0);
  ok (f->res.answered && f->res.err == 0, "for C too");
  close_conn (a, 0);
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A write over two files (the pieces of a concatenated layout): one
 * piece failing for good loses the write, whichever piece finishes
 * last, and the first failure is the one reported.
 */
static void
test_write_across_files_one_piece_fails (void)
{
  static const struct {
    uint32_t first;                     /* File whose run finishes first. */
    int err[2];                         /* Result of file 0's, file 1's. */
    int want;
  } cases[] = {
    { 0, { EIO, 0 }, EIO },             /* Failure, then success. */
    { 1, { EIO, 0 }, EIO },             /* Success, then failure. */
    { 0, { EIO, ENOSPC }, EIO },        /* Two failures: the first. */
  };
  size_t i;

  for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    struct eng_conn *c;
    struct eng_counts n;
    struct req *q, *f;
    uint32_t first = cases[i].first;

    e = make (ENG_WRITEBACK, 64, 4 << 20, 2);
    memset (&stats, 0, sizeof stats);
    c = conn ();
    q = mkreq_across (ENG_WRITE, 4096, 0);
    q = submit (c, q);
    f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
    ok (q->op.acked && nr_inflight == 2,
        "case %zu: acknowledged, one run per file in flight", i);
    complete_at (first, first == 0 ? 65536 : 0, cases[i].err[first]);
    ok (!f->res.answered, "case %zu: the FLUSH waits for the other piece",
        i);
    complete_at (1 - first, first == 0 ? 0 : 65536, cases[i].err[1 - first]);
    engine_counts (e, &n);
    ok (f->res.answered && f->res.err == cases[i].want && n.lost == 1 &&
        stats.lost == 1 && n.bytes == 0,
        "case %zu: the write is lost (%llu) and the FLUSH reports %s",
        i, (unsigned long long) n.lost, strerror (cases[i].want));
    f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
    ok (f->res.answered && f->res.err == cases[i].want,
        "case %zu: every FLUSH", i);
    q = mkreq_across (ENG_WRITE, 4096, 0);
    submit (c, q);
    f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
    complete_all (0);
    ok (f->res.answered && f->res.err == 0,
        "case %zu: until the write is done again", i);
    close_conn (c, 0);
    engine_free (e);
    free_all ();
  }
}

/* A writer that waited for memory is answered "written" when it is let
 * in, before its data is written: its failure after that is a loss that
 * the next FLUSH reports, and it counts toward, then leaves, the
 * connection's acknowledged-but-unfinished requests.
 */
static void
test_admitted_waiter_fails (void)
{
  struct eng_conn *c;
  struct eng_counts n;
  struct req *big, *w, *f;

  e = make (ENG_WRITEBACK, 64, 16384, 1);
  c = conn ();
  big = submit (c, mkreq (ENG_WRITE, 0, 0, 16384, 0));
  w = submit (c, mkreq (ENG_WRITE, 0, 1 << 20, 4096, 0));
  ok (big->op.acked && nr_inflight == 1,
      "a write of max-bytes is acknowledged and goes out");
  ok (!w->op.acked && !w->res.answered, "the next one waits for memory");
  complete_all (0);
  ok (w->res.answered && w->res.err == 0 && !w->res.released &&
      nr_inflight == 0,
      "let in when the memory came back: answered, held");
  tick (10001 * MS);
  ok (nr_inflight == 1, "it goes out on idle=");
  complete_all (EIO);
  engine_counts (e, &n);
  ok (w->res.released && n.lost == 1 && n.bytes == 0,
      "it failed for good after its answer: a loss");
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (f->res.answered && f->res.err == EIO, "the next FLUSH reports it");
  w = submit (c, mkreq (ENG_WRITE, 0, 2 << 20, 4096, 0));
  ok (w->op.acked, "a new write is acknowledged at once");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A close whose deadline passes gives up the connection's queued runs
 * only: its run in flight stays in flight, its completion is taken as
 * usual, and the close is answered after it.
 */
static void
test_close_waits_for_slot (void)
{
  struct eng_conn *c;
  struct eng_counts n;
  struct req *w[2], *cl;

  e = make (ENG_WRITEBACK, 1, 4 << 20, 1);
  memset (&stats, 0, sizeof stats);
  c = conn ();
  w[0] = submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  w[1] = submit (c, mkreq (ENG_WRITE, 0, 1 << 20, 4096, 0));
  cl = submit (c, mkreq (ENG_CLOSE, 0, 0, 0, 0));
  ok (nr_inflight == 1 && inflight[0]->run->offset == 0,
      "the close unplugs two runs: the first takes the only slot");
  tick (1100 * MS);                     /* No completion for requeue-timeout. */
  engine_counts (e, &n);
  if (!ok (!w[1]->res.released && n.lost == 0 && stats.gave_up == 0 &&
           !cl->res.answered && n.inflight == 1 && n.unfinished == 2,
           "past requeue-timeout of a slow run in flight, the run queued "
           "for its slot is kept: it was never refused"))
    return;
  complete (0, 0);
  ok (nr_inflight == 1 && inflight[0]->run->offset == 1 << 20,
      "the slot freed, the queued run goes out");
  complete (0, 0);
  engine_counts (e, &n);
  ok (cl->res.answered && cl->res.err == 0 && w[0]->res.released &&
      w[1]->res.released && n.lost == 0 && n.inflight == 0 && n.bytes == 0,
      "both written, and the close answered");
  engine_conn_free (e, c);
  engine_free (e);
  free_all ();
}

/* Zeros carry no data, so max-bytes does not bound them: the count of
 * acknowledged unfinished requests does, and the rest wait for memory.
 */
static void
test_acked_count_bound (void)
{
  struct eng_conn *c;
  unsigned i, acked = 0, waiting = 0;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  c = conn ();
  for (i = 0; i < 2000; ++i) {
    struct req *q = submit (c, mkreq (ENG_ZERO, 0, i * 2, 1, 0));

    if (q->op.acked)
      acked++;
    else if (!q->res.answered)
      waiting++;
  }
  ok (acked <= 4 * 256 && acked + waiting == 2000,
      "a backend that completes nothing: %u acknowledged (at most 4 per "
      "max-requests), %u wait", acked, waiting);
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* QUEUE ORDER costs each event a walk of the index over what overlaps
 * it: ROUNDS rewrites of N gapped blocks, each round one batch, the
 * later rounds queued behind the first while it is in flight, then
 * completed one by one in a scrambled order.  (A rescan of the queue
 * per queued run cost 8184592 steps here, a pass over the blocked runs
 * per completion 125394.)
 */
static void
test_queue_order_cost (void)
{
  enum { N = 200, ROUNDS = 3 };
  const uint64_t runs = N * ROUNDS;
  struct eng_conn *c;
  struct req *flush[ROUNDS];
  struct eng_counts n;
  unsigned round, i, answered = 0, guard = 0, before = order_violations;

  e = make (ENG_WRITEBACK, MAX_INFLIGHT, 64 << 20, 1);
  c = conn ();
  for (round = 0; round < ROUNDS; ++round) {
    for (i = 0; i < N; ++i)
      submit (c, mkreq (ENG_WRITE, 0, i * 8192, 4096, 0));
    flush[round] = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  }
  ok (nr_inflight == N,
      "the first round is in flight (%zu runs), the later ones wait",
      nr_inflight);
  while (nr_inflight > 0 && guard++ < 10 * runs)
    complete (nr_inflight / 2, 0);
  for (round = 0; round < ROUNDS; ++round)
    answered += flush[round]->res.answered && flush[round]->res.err == 0;
  ok (answered == ROUNDS, "every FLUSH succeeds (%u of %u)",
      answered, ROUNDS);
  ok (order_violations == before,
      "no run was issued over an overlapping run in flight (%u)",
      order_violations - before);
  engine_counts (e, &n);
  ok (n.order_checks <= 64 * runs,
      "queue order made %" PRIu64 " steps for %" PRIu64
      " runs (at most %" PRIu64 ")", n.order_checks, runs, 64 * runs);
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A merged run fails and is split into its pieces: a newer run that
 * waited for it now waits for the piece it overlaps, and only for that.
 */
static void
test_split_keeps_order (void)
{
  struct eng_conn *c;
  struct req *f1, *f2;
  unsigned before = order_violations;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  c = conn ();
  f1 = flush_two_adjacent (c);
  ok (nr_inflight == 1 && inflight[0]->run->count == 8192,
      "two adjacent writes go out as one run");
  submit (c, mkreq (ENG_WRITE, 0, 4096, 4096, 0));
  f2 = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (nr_inflight == 1, "a newer write over the second waits for the run");
  complete (0, EIO);
  ok (nr_inflight == 2 && order_violations == before,
      "the failed run is retried as its two pieces, the newer write "
      "still waits (%zu in flight)", nr_inflight);
  complete_at (0, 0, 0);
  ok (nr_inflight == 1 && inflight[0]->run->offset == 4096 &&
      order_violations == before,
      "the piece it does not overlap does not release it");
  complete_at (0, 4096, EIO);
  ok (nr_inflight == 1 && inflight[0]->run->offset == 4096 &&
      order_violations == before,
      "the piece it overlaps does: the newer write is issued");
  complete_all (0);
  ok (f1->res.answered && f1->res.err == EIO,
      "the first FLUSH reports the piece that failed (%s)",
      strerror (f1->res.err));
  ok (f2->res.answered, "the second FLUSH is answered");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* Large batches cost QUEUE ORDER about what overlaps, not the square
 * of their size: connection A's N gapped writes go out in one batch,
 * one run at a time (max-inflight=1); connection C's M gapped writes
 * elsewhere are queued behind them in one batch; everything drains.
 * Queueing each run costs a walk of the index (at most 16 steps on
 * average), where comparing every new run with every older one cost
 * N * M; draining costs nothing, since none of them waits.
 */
static void
test_queue_order_large_batches (void)
{
  enum { N = 2000, M = 2000 };
  struct eng_conn *a, *c;
  struct req *fa, *fc;
  struct eng_counts n;
  unsigned i, guard = 0, before = order_violations;
  uint64_t checks;

  make_max_requests = 4096;
  e = make (ENG_WRITEBACK, 1, 64 << 20, 1);
  make_max_requests = 256;
  a = conn ();
  c = conn ();
  for (i = 0; i < N; ++i)
    submit (a, mkreq (ENG_WRITE, 0, i * 8192, 4096, 0));
  fa = submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  engine_counts (e, &n);
  checks = n.order_checks;
  ok (nr_inflight == 1 && n.queued == N - 1,
      "A's %u runs are queued, one is in flight", N);
  for (i = 0; i < M; ++i)
    submit (c, mkreq (ENG_WRITE, 0, (2 * N + i) * 8192ULL, 4096, 0));
  fc = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  engine_counts (e, &n);
  ok (n.queued == N + M - 1 && n.order_checks - checks <= 16 * (N + M),
      "queueing C's %u runs behind them took %" PRIu64 " steps "
      "(at most %u)", M, n.order_checks - checks, 16 * (N + M));
  checks = n.order_checks;
  while (nr_inflight > 0 && guard++ < 2 * (N + M))
    complete (0, 0);
  engine_counts (e, &n);
  ok (fa->res.answered && fc->res.answered && n.queued == 0,
      "both FLUSHes are answered");
  ok (n.order_checks - checks <= N + M,
      "draining %u runs took %" PRIu64 " steps (at most %u)",
      N + M, n.order_checks - checks, N + M);
  ok (order_violations == before, "in queue order");
  close_conn (a, 0);
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* N runs each blocked by one older run: connection A's N gapped writes
 * go out one at a time (max-inflight=1), and its N rewrites of the same
 * blocks are queued behind them, each waiting for one.  Each completion
 * releases one run, found in the index; a pass over the blocked runs
 * per completion cost N^2/2 (8000000 steps here).
 */
static void
test_queue_order_chain (void)
{
  enum { N = 4000 };
  struct eng_conn *a;
  struct req *f1, *f2;
  struct eng_counts n;
  unsigned i, guard = 0, before = order_violations;

  make_max_requests = 2 * N;
  e = make (ENG_WRITEBACK, 1, 64 << 20, 1);
  make_max_requests = 256;
  a = conn ();
  for (i = 0; i < N; ++i)
    submit (a, mkreq (ENG_WRITE, 0, i * 8192ULL, 4096, 0));
  f1 = submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  for (i = 0; i < N; ++i)
    submit (a, mkreq (ENG_WRITE, 0, i * 8192ULL, 4096, 0));
  f2 = submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  engine_counts (e, &n);
  ok (nr_inflight == 1 && n.queued == 2 * N - 1,
      "%u runs and their %u rewrites are queued, one is in flight", N, N);
  while (nr_inflight > 0 && guard++ < 4 * N)
    complete (0, 0);
  engine_counts (e, &n);
  ok (f1->res.answered && f2->res.answered && n.queued == 0 &&
      order_violations == before,
      "both FLUSHes are answered, in queue order");
  ok (n.order_checks <= 64 * 2 * N,
      "queueing and draining the chain took %" PRIu64 " steps "
      "(at most %u)", n.order_checks, 64 * 2 * N);
  close_conn (a, 0);
  engine_free (e);
  free_all ();
}

/* THE RECORD is exact: a loss healed by a newer write that succeeded is
 * no longer reported, and a loss newer than a FLUSH's horizon is not
 * that FLUSH's.  Failures at sequence numbers 1 and 3, a success at 2
 * over 1's range: a FLUSH with horizon 2 succeeds, one with horizon 3
 * fails.
 */
static void
test_record_exact (void)
{
  struct eng_conn *c;
  struct req *f;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  c = conn ();
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));               /* seq 1 */
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (EIO);
  ok (f->res.answered && f->res.err == EIO, "seq 1 failed: its FLUSH "
      "fails");
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));               /* seq 2 */
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));              /* horizon 2 */
  submit (c, mkreq (ENG_WRITE, 0, 1 << 20, 4096, 0));         /* seq 3 */
  tick (10001 * MS);                    /* idle= unplugs seq 3. */
  ok (nr_inflight == 2 && !f->res.answered, "seq 2 and seq 3 in flight");
  complete_at (0, 1 << 20, EIO);
  complete_at (0, 0, 0);
  ok (f->res.answered && f->res.err == 0,
      "seq 2 healed seq 1's range, seq 3 is past the horizon: the FLUSH "
      "succeeds");
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));              /* horizon 3 */
  ok (f->res.answered && f->res.err == EIO, "a FLUSH that covers seq 3 "
      "fails");
  /* A rewrite of part of the lost range heals that part only. */
  f = rewrite_and_flush (c, 0, 1 << 20, 512);
  ok (f->res.answered && f->res.err == EIO,
      "a rewrite of part of the lost range leaves the rest lost");
  f = rewrite_and_flush (c, 0, (1 << 20) + 512, 4096 - 512);
  ok (f->res.answered && f->res.err == 0, "the rest rewritten: healed");
  /* A remote connection that died had answered writes up to seq_hi:
   * only a newer mutation heals that.
   */
  {
    struct eng_actions a;
    struct req *w = submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));

    eng_actions_init (&a);
    engine_record_lost (e, 0, 0, 4096, w->op.seq, w->op.seq, ENOTCONN);
    perform (&a);
    f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
    complete_all (0);
    ok (f->res.answered && f->res.err == ENOTCONN,
        "a loss recorded up to a sequence number is not healed by "
        "the write with that number succeeding");
    f = rewrite_and_flush (c, 0, 0, 4096);
    ok (f->res.answered && f->res.err == 0, "a newer one heals it");
  }
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* SYNCS BELONG TO THE ENGINE: a FLUSH is answered after a sync that
 * began once its writes were written; FLUSHes that wait while a sync
 * runs share the next one (blk-flush).  Four connections, one write
 * and one FLUSH each: two syncs.
 */
static void
test_sync_group_commit (void)
{
  struct eng_conn *c[4];
  struct req *f[4], *g;
  int i;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  memset (&stats, 0, sizeof stats);
  hold_syncs = true;
  nr_syncs = 0;
  for (i = 0; i < 4; ++i)
    c[i] = conn ();
  submit (c[0], mkreq (ENG_WRITE, 0, 0, 4096, 0));
  f[0] = submit (c[0], mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (0);
  ok (nr_syncs == 1 && nr_syncs_inflight == 1 && !f[0]->res.answered,
      "the first FLUSH's write is written: its sync is issued, the FLUSH "
      "waits for it");
  for (i = 1; i < 4; ++i) {
    submit (c[i], mkreq (ENG_WRITE, 0, (uint64_t) i << 20, 4096, 0));
    f[i] = submit (c[i], mkreq (ENG_FLUSH, 0, 0, 0, 0));
  }
  complete_all (0);
  ok (nr_syncs == 1 && !f[1]->res.answered && !f[3]->res.answered,
      "three more FLUSHes whose writes are written wait: the sync in "
      "flight began before their writes were written");
  complete_sync (0, 0);
  ok (f[0]->res.answered && f[0]->res.err == 0 && !f[1]->res.answered,
      "the first sync answers the first FLUSH only");
  ok (nr_syncs == 2 && nr_syncs_inflight == 1,
      "one more sync for the three others");
  g = submit (c[0], mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (!g->res.answered && nr_syncs == 2,
      "a FLUSH with nothing new written shares the sync in flight");
  complete_sync (0, 0);
  ok (f[1]->res.answered && f[2]->res.answered && f[3]->res.answered &&
      g->res.answered && f[3]->res.err == 0 && g->res.err == 0,
      "it answers all four");
  ok (stats.backend[STATS_B_SYNC].ops == 2 && stats.synced_answers == 5,
      "statistics: 2 syncs, 5 FLUSHes answered after them");
  g = submit (c[1], mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (g->res.answered && g->res.err == 0 && nr_syncs == 2,
      "nothing written since the last sync: a FLUSH needs none");
  hold_syncs = false;
  for (i = 0; i < 4; ++i)
    close_conn (c[i], 0);
  engine_free (e);
  free_all ();
}

/* A failed sync: what it covered is lost, on every connection, until
 * rewritten.  Two connections' FLUSHes waiting for the same sync that
 * fails both fail (Linux reports the error to one fdatasync only: the
 * engine tells both).
 */
static void
test_sync_failure (void)
{
  struct eng_conn *a, *b, *c;
  struct req *fa, *fb, *f;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  hold_syncs = true;
  nr_syncs = 0;
  a = conn ();
  b = conn ();
  submit (a, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  submit (b, mkreq (ENG_WRITE, 0, 65536, 4096, 0));
  fa = submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  fb = submit (b, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (0);
  ok (nr_syncs == 1 && !fa->res.answered && !fb->res.answered,
      "both FLUSHes wait for one sync");
  complete_sync (0, EIO);
  ok (fa->res.answered && fa->res.err == EIO && fb->res.answered &&
      fb->res.err == EIO, "the sync fails: both FLUSHes fail");
  f = submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (f->res.answered && f->res.err == EIO && nr_syncs == 1,
      "the next FLUSH fails too, with nothing left to sync");
  c = conn ();
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (f->res.answered && f->res.err == EIO,
      "so does a FLUSH on a connection opened afterwards");
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (0);
  complete_sync (0, 0);
  ok (f->res.answered && f->res.err == EIO,
      "one range rewritten and synced, the other still lost");
  submit (b, mkreq (ENG_WRITE, 0, 65536, 4096, 0));
  f = submit (b, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (0);
  complete_sync (0, 0);
  ok (f->res.answered && f->res.err == 0,
      "both rewritten and synced: the FLUSH succeeds");
  /* A write that completes while a sync is in flight is lost too when
   * that sync fails: Linux may have reported its page's error to this
   * sync, and the next one would then succeed.
   */
  submit (a, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  fa = submit (a, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (0);
  submit (b, mkreq (ENG_WRITE, 0, 1 << 20, 4096, 0));
  fb = submit (b, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (0);
  ok (nr_syncs_inflight == 1 && !fa->res.answered && !fb->res.answered,
      "B's write completed while A's sync is in flight");
  complete_sync (0, EIO);
  ok (fa->res.answered && fa->res.err == EIO && !fb->res.answered &&
      nr_syncs_inflight == 1, "A's FLUSH fails; B's waits for the next "
      "sync");
  submit (a, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  tick (10001 * MS);                    /* idle= unplugs it. */
  complete_all (0);                     /* A's range healed. */
  complete_sync (0, 0);
  ok (fb->res.answered && fb->res.err == EIO,
      "which succeeds, but B's write is recorded lost: B's FLUSH fails");
  hold_syncs = false;
  close_conn (a, 0);
  close_conn (b, 0);
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A FUA write is answered once written and synced; hold mode's FLUSH
 * and the exit wait for a sync too.
 */
static void
test_sync_fua_hold_exit (void)
{
  struct eng_conn *c;
  struct req *w, *f, *x;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  hold_syncs = true;
  nr_syncs = 0;
  c = conn ();
  w = submit (c, mkreq (ENG_WRITE, 0, 0, 4096, ENG_F_FUA));
  complete_all (0);
  ok (!w->res.answered && nr_syncs_inflight == 1,
      "a FUA write, written, waits for its sync");
  complete_sync (0, 0);
  ok (w->res.answered && w->res.err == 0, "then it is answered");
  w = submit (c, mkreq (ENG_WRITE, 0, 0, 4096, ENG_F_FUA));
  complete_all (0);
  complete_sync (0, EIO);
  ok (w->res.answered && w->res.err == EIO,
      "a FUA write whose sync failed fails");
  close_conn (c, 0);
  engine_free (e);

  e = make (ENG_HOLD, 64, 4 << 20, 1);
  c = conn ();
  w = submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  tick (10001 * MS);
  complete_all (0);
  ok (w->res.answered && w->res.err == 0, "hold mode: a write answered "
      "once written");
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (!f->res.answered && nr_syncs_inflight == 1,
      "hold mode's FLUSH waits for a sync of what was answered");
  complete_sync (0, 0);
  ok (f->res.answered && f->res.err == 0, "then it is answered");
  w = submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  tick (10001 * MS);
  complete_all (0);
  x = submit (NULL, mkreq (ENG_SHUTDOWN, 0, 0, 0, 0));
  ok (!x->res.answered && nr_syncs_inflight == 1,
      "the exit waits for a sync of what was written");
  complete_sync (0, 0);
  ok (x->res.answered && x->res.err == 0, "then it is answered");
  hold_syncs = false;
  engine_conn_free (e, c);
  engine_free (e);
  free_all ();
}

/* THE RECORD is bounded: past SPAN_CAP ranges a file's record keeps
 * their hull (and says so): FLUSHes go on failing, never succeed over a
 * loss, until the hull is written again.
 */
static void
test_record_cap (void)
{
  struct eng_conn *c;
  struct eng_counts n;
  struct req *f;
  unsigned i;

  e = make (ENG_WRITEBACK, 64, 16 << 20, 1);
  c = conn ();
  for (i = 0; i < 300; ++i)
    submit (c, mkreq (ENG_WRITE, 0, (uint64_t) i * 8192, 4096, 0));
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  while (nr_inflight > 0)
    complete_all (EIO);
  engine_counts (e, &n);
  ok (f->res.answered && f->res.err == EIO && n.lost == 300 &&
      n.widened >= 1, "300 gapped losses: the record widened (%" PRIu64
      "), the FLUSH fails", n.widened);
  f = rewrite_and_flush (c, 0, 8192, 4096);
  ok (f->res.err == EIO, "a rewrite inside the hull heals part of it only");
  submit (c, mkreq (ENG_ZERO, 0, 0, 300 * 8192, 0));
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (0);
  ok (f->res.answered && f->res.err == 0,
      "the whole hull written again: the FLUSH succeeds");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A rewrite heals a loss once a sync covered it, not when it is
 * written: a FLUSH that covers the lost write and not its rewrite (sent
 * after the FLUSH), answered while the rewrite is written but not yet
 * synced, must fail (a power loss then keeps neither).
 */
static void
test_heal_after_sync (void)
{
  struct eng_conn *c;
  struct req *f;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  hold_syncs = true;
  c = conn ();
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_sync (0, 0);                 /* The first round: every file. */
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));                /* W1 */
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (EIO);
  ok (f->res.answered && f->res.err == EIO, "W1 lost: its FLUSH fails");
  submit (c, mkreq (ENG_WRITE, 0, 1 << 20, 4096, 0));
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));               /* F */
  complete_all (0);
  ok (!f->res.answered && nr_syncs_inflight == 1, "F waits for its sync");
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));                /* W2 */
  tick (10001 * MS);                    /* idle= unplugs W2. */
  complete_all (0);
  complete_sync (0, 0);
  ok (f->res.answered && f->res.err == EIO,
      "W2 rewrote W1's range during F's sync: F still fails (W2 is not "
      "synced, W1 is lost)");
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (!f->res.answered && nr_syncs_inflight == 1, "the next FLUSH syncs W2");
  complete_sync (0, 0);
  ok (f->res.answered && f->res.err == 0, "and succeeds: W2 healed W1");
  hold_syncs = false;
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A FUA write whose sync failed is answered with the error: it was not
 * acknowledged, so it is not in the record, but an acknowledged write
 * the same sync covered is.
 */
static void
test_fua_error_not_recorded (void)
{
  struct eng_conn *c;
  struct req *w, *f;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  hold_syncs = true;
  c = conn ();
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_sync (0, 0);
  w = submit (c, mkreq (ENG_WRITE, 0, 0, 4096, ENG_F_FUA));
  complete_all (0);
  complete_sync (0, EIO);
  ok (w->res.answered && w->res.err == EIO, "the FUA write fails");
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (f->res.answered && f->res.err == 0,
      "a FLUSH after it succeeds: nothing acknowledged was lost");
  submit (c, mkreq (ENG_WRITE, 0, 1 << 20, 4096, 0));
  tick (10001 * MS);
  complete_all (0);
  w = submit (c, mkreq (ENG_WRITE, 0, 0, 4096, ENG_F_FUA));
  complete_all (0);
  complete_sync (0, EIO);
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (w->res.err == EIO && f->res.answered && f->res.err == EIO,
      "with an acknowledged write in the same failed sync, the FLUSH "
      "fails");
  hold_syncs = false;
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* Complete file b's sync in flight with err. */
static void
complete_sync_of (uint32_t b, int err)
{
  size_t i;

  for (i = 0; i < nr_syncs_inflight; ++i)
    if (syncs_inflight[i]->backing == b) {
      complete_sync (i, err);
      return;
    }
  printf ("Bail out! no sync of file %" PRIu32 " in flight\n", b);
  exit (1);
}

/* A mutation whose client waits, answered with an error when its last
 * piece fails, was never acknowledged: the pieces of it that a failed
 * sync recorded as lost before that leave the record, as they do when
 * the error comes from its own sync (found by the engine's fuzzer:
 * tests/fuzz/corpus/engine/flush-eio-failed-piece-after-sync-eio).  In
 * both modes: a FUA write, and hold mode's plain write.
 */
static void
test_failed_piece_forgets_synced_loss (void)
{
  static const struct {
    enum eng_mode mode;
    uint32_t flags;
    const char *what;
  } cases[] = {
    { ENG_WRITEBACK, ENG_F_FUA, "writeback, FUA" },
    { ENG_HOLD, 0, "hold" },
    { ENG_HOLD, ENG_F_FUA, "hold, FUA" },
  };
  size_t i;

  for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    struct eng_conn *c;
    struct req *q, *f;

    e = make (cases[i].mode, 64, 4 << 20, 2);
    hold_syncs = true;
    c = conn ();
    /* The first round syncs both files: the sync of file 0 is the one
     * that fails while the write's first piece is written.
     */
    f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
    ok (nr_syncs_inflight == 2 && !f->res.answered,
        "%s: a FLUSH's round syncs both files", cases[i].what);
    q = submit (c, mkreq_across (ENG_WRITE, 4096, cases[i].flags));
    if (cases[i].mode == ENG_HOLD)
      tick (10001 * MS);                /* idle= unplugs it. */
    ok (nr_inflight == 2 && !q->op.acked,
        "%s: a write across both files waits for its answer",
        cases[i].what);
    complete_at (0, 65536, 0);
    complete_sync_of (0, EIO);
    complete_sync_of (1, 0);
    ok (f->res.answered && f->res.err == 0,
        "%s: the FLUSH before the write succeeds", cases[i].what);
    complete_at (1, 0, EIO);
    ok (q->res.answered && q->res.err == EIO,
        "%s: the write's other piece fails: it is answered EIO",
        cases[i].what);
    f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
    while (!f->res.answered && nr_syncs_inflight > 0)
      complete_sync (0, 0);
    ok (f->res.answered && f->res.err == 0,
        "%s: a FLUSH after it succeeds: nothing acknowledged was lost "
        "(%s)", cases[i].what, strerror (f->res.err));
    hold_syncs = false;
    close_conn (c, 0);
    engine_free (e);
    free_all ();
  }
}

/* The same write's piece written while a sync is in flight, the write
 * answered with an error, then that sync fails: the piece was never
 * acknowledged, so the failed sync does not record it either.
 */
static void
test_failed_write_not_recorded_by_later_sync (void)
{
  static const struct {
    enum eng_mode mode;
    uint32_t flags;
    const char *what;
  } cases[] = {
    { ENG_WRITEBACK, ENG_F_FUA, "writeback, FUA" },
    { ENG_HOLD, 0, "hold" },
  };
  size_t i;

  for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    struct eng_conn *c;
    struct req *q, *f;

    e = make (cases[i].mode, 64, 4 << 20, 2);
    hold_syncs = true;
    c = conn ();
    f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
    q = submit (c, mkreq_across (ENG_WRITE, 4096, cases[i].flags));
    if (cases[i].mode == ENG_HOLD)
      tick (10001 * MS);                /* idle= unplugs it. */
    complete_at (0, 65536, 0);
    complete_at (1, 0, EIO);
    ok (q->res.answered && q->res.err == EIO && nr_syncs_inflight == 2,
        "%s: a write answered EIO, one piece written during a sync",
        cases[i].what);
    complete_sync_of (0, EIO);
    complete_sync_of (1, 0);
    ok (f->res.answered && f->res.err == 0,
        "%s: that sync fails, the FLUSH before the write succeeds",
        cases[i].what);
    f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
    while (!f->res.answered && nr_syncs_inflight > 0)
      complete_sync (0, 0);
    ok (f->res.answered && f->res.err == 0,
        "%s: so does a FLUSH after the write: nothing acknowledged was "
        "lost (%s)", cases[i].what, strerror (f->res.err));
    hold_syncs = false;
    close_conn (c, 0);
    engine_free (e);
    free_all ();
  }
}

/* The "not now" clock measures one stretch of refusals: after a run was
 * given up and the file had nothing left, a later refusal starts a
 * requeue-timeout of its own.
 */
static void
test_retry_clock_restarts (void)
{
  struct eng_conn *c;
  struct eng_counts n;
  struct req *f;
  int guard = 0;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  c = conn ();
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  while (guard++ < 1000) {
    uint64_t d;

    complete_all (EAGAIN);
    d = engine_next_deadline (e);
    if (f->res.answered || d == UINT64_MAX)
      break;
    tick (d - now);
  }
  engine_counts (e, &n);
  ok (f->res.answered && f->res.err == EIO && n.lost == 1,
      "refused for requeue-timeout: the write is given up");
  tick (3000 * MS);
  submit (c, mkreq (ENG_WRITE, 0, 1 << 20, 4096, 0));
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (EAGAIN);
  engine_counts (e, &n);
  ok (n.lost == 1 && n.queued == 1,
      "3 s later, one refusal of a new write: it is kept for a retry");
  tick (engine_next_deadline (e) - now);
  complete_all (0);
  engine_counts (e, &n);
  ok (f->res.answered && n.lost == 1 && n.unfinished == 0,
      "and written at the retry");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A write that a failed sync recorded as lost heals nothing: the older
 * loss under it stays through the next successful sync.
 */
static void
test_lost_rewrite_heals_nothing (void)
{
  struct eng_conn *c;
  struct req *f;

  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  hold_syncs = true;
  c = conn ();
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_sync (0, 0);
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));                /* A */
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (0);
  ok (nr_syncs_inflight == 1, "A's sync in flight");
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));                /* B over A */
  tick (10001 * MS);
  complete_all (0);
  complete_sync (0, EIO);               /* Loses A, and B written since. */
  ok (f->res.answered && f->res.err == EIO, "the sync fails: A is lost");
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  ok (nr_syncs_inflight == 1, "the next FLUSH syncs B's file again");
  complete_sync (0, 0);
  ok (f->res.answered && f->res.err == EIO,
      "it succeeds, but B, recorded lost, heals nothing: A stays lost");
  f = rewrite_and_flush (c, 0, 0, 4096);
  complete_sync (0, 0);
  ok (f->res.answered && f->res.err == 0, "a rewrite synced heals both");
  hold_syncs = false;
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A rewrite heals among more writes than the written set keeps: the
 * rewrites of lost ranges are kept apart.
 */
static void
test_heal_among_many_writes (void)
{
  struct eng_conn *c;
  struct eng_counts n;
  struct req *f;
  unsigned i;

  e = make (ENG_WRITEBACK, 64, 16 << 20, 1);
  c = conn ();
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (EIO);
  ok (f->res.err == EIO, "a loss at 0");
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  for (i = 1; i <= 300; ++i)
    submit (c, mkreq (ENG_WRITE, 0, (uint64_t) i * 8192, 512, 0));
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (0);
  engine_counts (e, &n);
  ok (f->res.answered && f->res.err == 0 && n.widened >= 1,
      "the rewrite and 300 gapped writes (the written set widened): the "
      "FLUSH succeeds");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A loss rewritten in more pieces than the heal set keeps entries
 * (SPAN_CAP), as a kernel rewrites a range in 4 KiB pages, heals: the
 * rewrites of one range are one span however many mutations made it.
 * In order (contiguous, one run) and by four writers whose pages
 * interleave, then FLUSHed.  A rewrite that overlaps a loss newer than
 * some of the rewrites' members heals nothing of that newer loss.
 */
static void
test_heal_many_pieces (void)
{
  struct eng_conn *c;
  struct req *f;
  unsigned i, pass;

  for (pass = 0; pass < 2; ++pass) {
    e = make (ENG_WRITEBACK, 4096, 64 << 20, 1);
    c = conn ();
    submit (c, mkreq (ENG_WRITE, 0, 0, 4 << 20, 0));
    f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
    complete_all (EIO);
    ok (f->res.err == EIO, "4 MiB lost");
    for (i = 0; i < 1024; ++i) {
      /* Pass 1: four writers, each rewriting its quarter in order,
       * their pages interleaved (as several connections would).
       */
      unsigned page = pass == 0 ? i : (i % 4) * 256 + i / 4;

      submit (c, mkreq (ENG_WRITE, 0, (uint64_t) page * 4096, 4096, 0));
      if (pass == 1 && i % 64 == 63)
        tick (10001 * MS);              /* idle=: several runs. */
      complete_all (0);
    }
    f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
    complete_all (0);
    ok (f->res.answered && f->res.err == 0,
        pass == 0 ? "rewritten in 1024 pages in order: the FLUSH succeeds"
                  : "rewritten in 1024 pages by four interleaved writers: "
                    "the FLUSH succeeds");
    close_conn (c, 0);
    engine_free (e);
    free_all ();
  }

  /* A (seq 1, lost), then B rewrites [0, 4K) (heal candidate, seq 3),
   * C at [4K, 8K) lost after (seq 4, and its loss is recorded), then D
   * rewrites [4K, 8K)... only D heals C; B, older than C's loss, must
   * not heal it even when B and D touch.
   */
  e = make (ENG_WRITEBACK, 64, 4 << 20, 1);
  c = conn ();
  submit (c, mkreq (ENG_WRITE, 0, 0, 8192, 0));                 /* A */
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (EIO);
  ok (f->res.err == EIO, "A lost");
  submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));                 /* B */
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (0);
  ok (f->res.err == EIO, "B heals A's first half only: A's second half "
      "is still lost");
  submit (c, mkreq (ENG_WRITE, 0, 4096, 4096, 0));              /* C */
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (EIO);
  ok (f->res.err == EIO, "C lost too");
  submit (c, mkreq (ENG_WRITE, 0, 4096, 4096, 0));              /* D */
  f = submit (c, mkreq (ENG_FLUSH, 0, 0, 0, 0));
  complete_all (0);
  ok (f->res.answered && f->res.err == 0, "D heals C (and what was left "
      "of A there)");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

/* A stretch of "not now" that ends in a real error ends the clock too. */
static void
test_retry_clock_after_error (void)
{
  struct eng_conn *c;
  struct eng_counts n;
  struct req *w;

  e = make (ENG_HOLD, 64, 4 << 20, 1);
  c = conn ();
  w = submit (c, mkreq (ENG_WRITE, 0, 0, 4096, 0));
  tick (10001 * MS);
  complete_all (EAGAIN);
  tick (engine_next_deadline (e) - now);
  complete_all (EIO);
  ok (w->res.answered && w->res.err == EIO, "refused, then failed");
  tick (3000 * MS);
  w = submit (c, mkreq (ENG_WRITE, 0, 1 << 20, 4096, 0));
  tick (10001 * MS);
  complete_all (EAGAIN);
  engine_counts (e, &n);
  ok (!w->res.answered && n.queued == 1,
      "3 s later a refusal is kept for a retry, not given up");
  tick (engine_next_deadline (e) - now);
  complete_all (0);
  ok (w->res.answered && w->res.err == 0, "and written");
  close_conn (c, 0);
  engine_free (e);
  free_all ();
}

int
main (void)
{
  test_flush_horizon ();
  test_flush_fua ();
  test_flush_fua_two_conns ();
  test_flush_waits_for_horizon_write ();
  test_fua_write_answered_when_written ();
  test_order_across_connections ();
  test_close_slot_contention ();
  test_close_stuck_backend ();
  test_eagain_at_close ();
  test_give_up_restarts_stalled ();
  test_give_up_many_queued ();
  test_bad_pieces_refused ();
  test_failing_neighbour ();
  test_deferred_to_new_connection ();
  test_deferred_every_connection ();
  test_deferred_new_connection_keeps_own ();
  test_write_across_files_one_piece_fails ();
  test_admitted_waiter_fails ();
  test_close_waits_for_slot ();
  test_acked_count_bound ();
  test_memory_bound_every_run_fails ();
  test_fast_zero ();
  test_hold_and_timers ();
  test_hold_pacing ();
  test_hold_short_queue (false);
  test_hold_short_queue (true);
  test_hold_alternating ();
  test_queue_order_cost ();
  test_split_keeps_order ();
  test_queue_order_large_batches ();
  test_queue_order_chain ();
  test_direct_near_recent ();
  test_direct_rule_large ();
  test_deadlines_announced ();
  test_record_exact ();
  test_sync_group_commit ();
  test_sync_failure ();
  test_sync_fua_hold_exit ();
  test_record_cap ();
  test_heal_after_sync ();
  test_fua_error_not_recorded ();
  test_failed_piece_forgets_synced_loss ();
  test_failed_write_not_recorded_by_later_sync ();
  test_retry_clock_restarts ();
  test_lost_rewrite_heals_nothing ();
  test_heal_among_many_writes ();
  test_heal_many_pieces ();
  test_retry_clock_after_error ();
  ok (order_violations == 0, "no test saw a run issued over an "
      "overlapping run in flight (%u)", order_violations);
  ok (deadline_misses == 0, "no deadline came nearer unannounced: a timer "
      "set as engine_deadline_may_be_earlier says never sleeps past one "
      "(%u)", deadline_misses);
  return done_testing ();
}
