/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine-harness: the plumbing that the engine's unit tests play (see
 * engine-harness.h).
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
#include "minmax.h"

char data[1 << 20];
struct engine *e;
struct eng_run *inflight[MAX_INFLIGHT];
size_t nr_inflight;
uint64_t now = 1000 * MS;

bool hold_syncs;
struct eng_sync *syncs_inflight[MAX_SYNCS];
size_t nr_syncs_inflight;
unsigned long nr_syncs;
void (*sync_issued) (uint32_t backing);
void (*run_issued) (struct eng_run *r);
void (*op_answered) (struct eng_op *op);
void (*op_released) (struct eng_op *op);

unsigned order_violations;
unsigned deadline_misses;
unsigned long nr_answers;

/* The one timer the plumbing keeps (plugin/loop.c): set for the
 * engine's next deadline when it fires, or when the engine says a
 * deadline came nearer (engine_deadline_may_be_earlier).
 */
static uint64_t armed = UINT64_MAX;
static bool timer_fired;

/* After an engine call: would that timer fire in time? */
static void
check_timer (void)
{
  uint64_t d;

  if (e == NULL)
    return;
  d = engine_next_deadline (e);
  if (engine_deadline_may_be_earlier (e) || timer_fired)
    armed = timer_fired ? d : MIN (armed, d);
  timer_fired = false;
  if (d < armed)
    deadline_misses++;
}

static bool
overlaps_inflight (const struct eng_run *r)
{
  size_t i;

  for (i = 0; i < nr_inflight; ++i) {
    const struct plug_run *o = inflight[i]->run;

    if (o->backing == r->run->backing &&
        o->offset < r->run->offset + r->run->count &&
        r->run->offset < o->offset + o->count)
      return true;
  }
  return false;
}

void
perform (struct eng_actions *a)
{
  struct eng_run *r;
  struct eng_op *op, *next;
  struct eng_sync *s, *snext;
  list_head done = LIST_HEAD_INIT (done);

  list_for_each (r, &a->issue, issue_link) {
    if (run_issued)
      run_issued (r);
    if (overlaps_inflight (r))
      order_violations++;
    if (nr_inflight < MAX_INFLIGHT)
      inflight[nr_inflight++] = r;
  }
  list_for_each_safe (s, snext, &a->sync, link) {
    list_del (&s->link);
    nr_syncs++;
    if (sync_issued)
      sync_issued (s->backing);
    if (hold_syncs && nr_syncs_inflight < MAX_SYNCS)
      syncs_inflight[nr_syncs_inflight++] = s;
    else
      list_add_head (&done, &s->link);
  }
  list_for_each (op, &a->reply, reply_link) {
    struct result *res = op->waiter;

    if (op_answered)
      op_answered (op);
    res->answered = true;
    res->err = op->err;
    res->answer_no = ++nr_answers;
  }
  list_for_each_safe (op, next, &a->release, release_link) {
    if (op_released)
      op_released (op);
    ((struct result *) op->waiter)->released = true;
  }
  eng_actions_init (a);
  check_timer ();
  while ((s = list_pop (&done, struct eng_sync, link)) != NULL) {
    struct eng_actions b;

    eng_actions_init (&b);
    engine_sync_done (e, s, 0, now, &b);
    perform (&b);
  }
}

void
complete_sync (size_t i, int err)
{
  struct eng_actions a;
  struct eng_sync *s = syncs_inflight[i];

  syncs_inflight[i] = syncs_inflight[--nr_syncs_inflight];
  eng_actions_init (&a);
  engine_sync_done (e, s, err, now, &a);
  perform (&a);
}

/* Longer than idle= but where a test needs the other order. */
uint64_t make_max_delay_ns = 60000 * MS;

unsigned make_max_requests = 256;
bool make_direct = false;
uint64_t make_direct_size = 0;
void (*make_state_log) (void *opaque, const char *msg) = NULL;

struct engine *
make (enum eng_mode mode, unsigned max_inflight, uint64_t max_bytes,
      uint32_t files)
{
  struct eng_config cfg = {
    .mode = mode,
    .nr_backings = files,
    .idle_ns = 10000 * MS,
    .max_delay_ns = make_max_delay_ns,
    .lim = { .max_requests = make_max_requests, .max_bytes = max_bytes,
             .max_merge = 1 << 20, .max_iov = 1024 },
    .max_inflight = max_inflight,
    .direct = make_direct,
    .direct_size = make_direct_size,
    .state_log = make_state_log,
    .retry = { .delay_ns = 3 * MS, .max_delay_ns = 100 * MS,
               .timeout_ns = 1000 * MS },
  };

  nr_inflight = 0;
  nr_syncs_inflight = 0;
  armed = UINT64_MAX;
  timer_fired = false;
  return engine_new (&cfg);
}

struct plug_stats stats;

/* Every request made, freed when its test is over (a released op's
 * result is still read after the engine let it go).
 */
static struct req *all[1 << 16];
static size_t nr_all;

void
free_all (void)
{
  while (nr_all > 0)
    free (all[--nr_all]);
}

/* A request on file `file` at [off, off+len). */
struct req *
mkreq (enum eng_kind kind, uint32_t file, uint64_t off, uint64_t len,
       uint32_t flags)
{
  struct req *q = calloc (1, sizeof *q);

  if (q == NULL || nr_all == sizeof all / sizeof all[0])
    abort ();
  all[nr_all++] = q;

  q->op.kind = kind;
  q->op.flags = flags;
  q->op.offset = off;
  q->op.count = len;
  q->op.waiter = &q->res;
  if (len > 0) {
    q->op.nr_pieces = 1;
    q->op.pieces = q->piece;
    q->piece[0].op = kind <= ENG_TRIM ? (enum plug_op) kind : PLUG_OP_WRITE;
    q->piece[0].backing = file;
    q->piece[0].offset = off;
    q->piece[0].count = len;
    q->piece[0].buf = kind == ENG_WRITE ? data : NULL;
    if (kind == ENG_WRITE && !(flags & ENG_F_FUA))
      q->op.bytes = len;
    if (flags & ENG_F_FAST)
      q->piece[0].flags = PLUG_F_FAST;
  }
  return q;
}

struct req *
submit (struct eng_conn *c, struct req *q)
{
  struct eng_actions a;

  eng_actions_init (&a);
  if (engine_submit (e, c, &q->op, now, &a) == -1) {
    q->res.answered = q->res.released = true;
    q->res.err = errno;
  }
  perform (&a);
  return q;
}

/* Complete in-flight run i with err. */
void
complete (size_t i, int err)
{
  struct eng_actions a;
  struct eng_run *r = inflight[i];

  inflight[i] = inflight[--nr_inflight];
  eng_actions_init (&a);
  engine_complete (e, r, err, now, &a);
  perform (&a);
}

void
complete_all (int err)
{
  while (nr_inflight > 0)
    complete (0, err);
}

/* Complete the in-flight run of file b at offset off with err. */
void
complete_at (uint32_t b, uint64_t off, int err)
{
  size_t i;

  for (i = 0; i < nr_inflight; ++i)
    if (inflight[i]->run->backing == b && inflight[i]->run->offset == off) {
      complete (i, err);
      return;
    }
  printf ("Bail out! no run of file %" PRIu32 " at %" PRIu64 " in flight\n",
          b, off);
  exit (1);
}

void
tick (uint64_t advance)
{
  struct eng_actions a;

  now += advance;
  eng_actions_init (&a);
  engine_tick (e, now, &a);
  timer_fired = true;
  perform (&a);
}

struct eng_conn *
conn (void)
{
  return engine_conn_open (e, &stats);
}

void
close_conn (struct eng_conn *c, int completion)
{
  struct req *q = submit (c, mkreq (ENG_CLOSE, 0, 0, 0, 0));
  int guard = 0;

  while (!q->res.answered && guard++ < 1000) {
    complete_all (completion);
    tick (500 * MS);
  }
  engine_conn_free (e, c);
}
