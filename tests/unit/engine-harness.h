/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine-harness: the engine (src/engine.h) driven by a fake clock and
 * scripted completions.  A test plays the plumbing: it keeps the runs
 * the engine issues "in flight" until it completes them with the
 * result it chooses, records answers, and frees released ops.  Shared
 * by test-engine (scripted cases) and test-engine-model (random cases
 * checked against a model of the disk).
 */

#ifndef NBDPLUG_ENGINE_HARNESS_H
#define NBDPLUG_ENGINE_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

#define MS 1000000ULL
#define MAX_INFLIGHT 65536

/* What the test knows about one op (op->waiter points at it): lives in
 * a table, never freed before the engine released the op.
 */
struct result {
  bool answered;
  bool released;
  int err;
  unsigned long answer_no;      /* Its place among all answers (from 1). */
};

/* A request of test-engine: at most two pieces. */
struct req {
  struct eng_op op;
  struct plug_piece piece[2];
  struct result res;
};

extern char data[1 << 20];              /* What every write writes. */
extern struct engine *e;                /* The engine under test. */
extern struct eng_run *inflight[MAX_INFLIGHT];  /* Issued, not completed. */
extern size_t nr_inflight;
extern uint64_t now;                    /* The fake clock. */

/* Syncs the engine asked for.  Unless hold_syncs, each succeeds at once
 * (inside perform); otherwise it stays in syncs_inflight until the test
 * completes it.
 */
#define MAX_SYNCS 64
extern bool hold_syncs;
extern struct eng_sync *syncs_inflight[MAX_SYNCS];
extern size_t nr_syncs_inflight;
extern unsigned long nr_syncs;          /* Issued so far. */
extern void (*sync_issued) (uint32_t backing);  /* Told of each, or NULL. */

/* Complete in-flight sync i (the last one takes its place) with err. */
extern void complete_sync (size_t i, int err);

/* Told of each run issued, each op answered and each op released, in
 * perform, before the harness records it (NULL: not told).  The fuzz
 * mode of engine-model checks its invariants there.
 */
extern void (*run_issued) (struct eng_run *r);
extern void (*op_answered) (struct eng_op *op);
extern void (*op_released) (struct eng_op *op);

/* QUEUE ORDER as the harness sees it: runs issued while an overlapping
 * run of the same file was in flight (every test expects none).
 */
extern unsigned order_violations;

/* Engine calls after which the plumbing's one timer (engine-harness.c,
 * check_timer) was set later than the engine's next deadline: it would
 * have slept past it.  Every test expects none.
 */
extern unsigned deadline_misses;

/* Answers given so far (each op's answer_no is its place). */
extern unsigned long nr_answers;

/* max-delay= and max-requests= of the next engine made. */
extern uint64_t make_max_delay_ns;
extern unsigned make_max_requests;
extern bool make_direct;
extern uint64_t make_direct_size;       /* direct-size=, 0: off. */
/* The state log of the next engine made (NULL: none). */
extern void (*make_state_log) (void *opaque, const char *msg);

/* The statistics every connection counts into. */
extern struct plug_stats stats;

/* Carry out the actions: issued runs go in flight, answers and
 * releases are recorded in each op's struct result.
 */
extern void perform (struct eng_actions *a);

/* An engine with idle=10s, max-merge=1M, no direct path. */
extern struct engine *make (enum eng_mode mode, unsigned max_inflight,
                            uint64_t max_bytes, uint32_t files);

/* A request of one piece on file `file` at [off, off+len) (none if len
 * is 0), kept until free_all.
 */
extern struct req *mkreq (enum eng_kind kind, uint32_t file, uint64_t off,
                          uint64_t len, uint32_t flags);
extern void free_all (void);

extern struct req *submit (struct eng_conn *c, struct req *q);

/* Complete in-flight run i (the last one takes its place), all of them,
 * or the one of file b at offset off, with err.
 */
extern void complete (size_t i, int err);
extern void complete_all (int err);
extern void complete_at (uint32_t b, uint64_t off, int err);

/* Advance the clock and fire the engine's timers. */
extern void tick (uint64_t advance);

extern struct eng_conn *conn (void);

/* Close c, completing whatever is in flight with `completion` until its
 * CLOSE is answered, and free it.
 */
extern void close_conn (struct eng_conn *c, int completion);

#endif /* NBDPLUG_ENGINE_HARNESS_H */
