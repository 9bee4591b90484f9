/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine-model: the engine against a model of the disk, in random
 * scenarios (engine-model.h).  Each scenario picks a configuration (1-3 files, 1-8
 * connections, the direct path or not, max-requests, max-merge,
 * max-iov, max-inflight, how often runs fail with EIO or EAGAIN) and
 * then a few thousand random steps: writes, zeroes and trims of one to
 * three pieces (FUA, fast zero, may-trim), FLUSHes, reads, closes,
 * completions with those errors, and time passing.  The model records,
 * per 512-byte sector, the sequence number of the mutation last written
 * there, and checks:
 *  - QUEUE ORDER: a run never overwrites a sector already written by a
 *    newer mutation, and is never issued over an overlapping run in
 *    flight (the harness's order_violations);
 *  - a FLUSH is answered only when every mutation answered before it
 *    came (acknowledged, in writeback mode) has finished;
 *  - NEVER DROPPED: every admitted piece is written, or its op carries
 *    an error;
 *  - THE RECORD: every FLUSH fails iff its horizon reaches a loss the
 *    model knows of and no newer write over it succeeded since: an
 *    acknowledged piece whose run failed for good, or a piece written
 *    since the last successful sync of its file when a sync fails
 *    (syncs fail too, at the seed's rate), unless its mutation was
 *    answered with an error (a client that waited was never told it
 *    was written), before that sync or after; a FUA mutation fails iff its
 *    run failed or such a loss lies in its range.  Past the engine's
 *    cap (eng_counts.widened) it may over-report, never under;
 *  - in the end, once every run completed: each sector holds the newest
 *    mutation whose piece was written, every FLUSH and CLOSE was
 *    answered, and nothing is held, queued or in flight.
 * A quarter of the seeds run in hold mode, where nothing is answered
 * before it is written.  test-engine-model draws every choice from
 * fixed seeds; the fuzz target (tests/fuzz/fuzz-engine.c) draws them
 * from its input bytes and also checks what engine-model.h lists under
 * "Fuzz mode".
 */

#include <config.h>

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine-harness.h"
#include "engine-model.h"

#define MAX_FILES 3
#define MAX_CONNS 8
#define MAX_PIECES 3
#define SECTOR 512
#define NR_SECTORS 96
#define MAX_OPS 8192

/* One op of the model: freed when its seed is over. */
struct mop {
  struct eng_op op;
  struct plug_piece piece[MAX_PIECES];
  struct result res;
  bool written[MAX_PIECES];     /* The piece's run completed with 0. */
  unsigned long submitted_after; /* nr_answers when it was submitted. */
  bool flush_checked;           /* FLUSH, FUA: its answer was checked. */
  size_t idx;                   /* Its place in ops[]. */
};

/* The state of one seed. */
static struct mop *ops[MAX_OPS];
static size_t nr_ops;
static uint64_t disk[MAX_FILES][NR_SECTORS];    /* Seq last written. */

/* THE RECORD as the model sees it, per sector: the sequence numbers of
 * the losses there that nothing healed yet.  A write heals once a sync
 * that covered it succeeded, the losses older than it (a loss recorded
 * after it was written, of a newer mutation, stays).
 */
#define MAX_SEQS 64
struct seq_set {
  unsigned n;
  uint64_t seq[MAX_SEQS];
};
static struct seq_set lost[MAX_FILES][NR_SECTORS];
/* Per sector, the pieces written since the file's sync in flight began
 * (wr_cur) and before it (wr_prev: what that sync covers, since the one
 * before began): a failing sync loses them all.  Of those, the ones
 * written over a loss (heal_cur, heal_prev) are rewrites: a sync that
 * succeeds heals with the newest it covered (by QUEUE ORDER the pieces
 * of a sector are written in sequence order), and a failing one makes
 * them all heal nothing.
 */
static struct seq_set wr_cur[MAX_FILES][NR_SECTORS];
static struct seq_set wr_prev[MAX_FILES][NR_SECTORS];
static struct seq_set heal_cur[MAX_FILES][NR_SECTORS];
static struct seq_set heal_prev[MAX_FILES][NR_SECTORS];
static bool exact;              /* The engine never widened its spans. */
static bool mode_writeback;
static unsigned nr_files;
static uint64_t rng;
bool model_verbose;
#define verbose model_verbose

/* Fuzz mode (engine-model.h): the choices come from input[] while it
 * lasts, then from rng; the extra checks are on.
 */
static bool fuzz;
static const uint8_t *input;
static size_t input_len, input_pos;
static bool input_spent;

/* The connection that submitted each op (NULL: none, or the exit), and
 * (fuzz mode) whether that connection was freed since.
 */
static struct eng_conn *owner[MAX_OPS];
static bool owner_gone[MAX_OPS];

/* What went wrong in this seed (0: nothing), and the first message. */
static unsigned failures;
static char first_failure[256];

static void __attribute__ ((format (printf, 1, 2)))
fail (const char *fs, ...)
{
  va_list ap;

  if (failures++ == 0) {
    va_start (ap, fs);
    vsnprintf (first_failure, sizeof first_failure, fs, ap);
    va_end (ap);
  }
}

/* xorshift64: deterministic per seed, on every machine. */
static uint64_t
xorshift (void)
{
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* The next input byte; once they ran out, input_spent and rng's. */
static uint64_t
input_byte (void)
{
  if (input_pos < input_len)
    return input[input_pos++];
  input_spent = true;
  return xorshift () & 0xff;
}

/* A choice among n (0 for n == 0).  In fuzz mode a choice among one
 * takes no byte, so that every byte of the input decides something.
 */
static unsigned
rnd (unsigned n)
{
  uint64_t v;

  if (!fuzz)
    return n ? (unsigned) (xorshift () % n) : 0;
  if (n <= 1)
    return 0;
  v = input_byte ();
  if (n > 256)
    v = v << 8 | input_byte ();
  return (unsigned) (v % n);
}

static bool
pieces_overlap (const struct plug_piece *a, const struct plug_piece *b)
{
  return a->backing == b->backing &&
    a->offset < b->offset + b->count && b->offset < a->offset + a->count;
}

/* A random range of whole sectors, sometimes long, inside the file. */
static void
random_range (struct plug_piece *p)
{
  unsigned start = rnd (NR_SECTORS - 1);
  unsigned len = 1 + rnd (rnd (4) == 0 ? 32 : 6);

  if (start + len > NR_SECTORS)
    len = NR_SECTORS - start;
  p->backing = rnd (nr_files);
  p->offset = (uint64_t) start * SECTOR;
  p->count = (uint64_t) len * SECTOR;
}

static struct mop *
new_op (enum eng_kind kind, uint32_t flags)
{
  struct mop *q = calloc (1, sizeof *q);
  size_t n, i, j;

  if (q == NULL || nr_ops == MAX_OPS)
    abort ();
  q->idx = nr_ops;
  ops[nr_ops++] = q;
  q->op.kind = kind;
  q->op.flags = flags;
  q->op.waiter = &q->res;
  if (kind == ENG_FLUSH || kind == ENG_CLOSE || kind == ENG_SHUTDOWN)
    return q;

  /* Pieces of one op never overlap (layout.c maps an export range to
   * distinct ranges of the files).
   */
  n = kind == ENG_READ || rnd (4) != 0 ? 1 : 1 + rnd (MAX_PIECES);
  for (i = 0; i < n; ++i) {
    struct plug_piece *p = &q->piece[i];

    random_range (p);
    for (j = 0; j < i; ++j)
      if (pieces_overlap (p, &q->piece[j]))
        break;
    if (j < i)
      break;
    p->op = kind <= ENG_TRIM ? (enum plug_op) kind : PLUG_OP_WRITE;
    p->buf = kind == ENG_WRITE ? data : NULL;
    if (flags & ENG_F_FAST)
      p->flags = PLUG_F_FAST;
    if (kind == ENG_WRITE && !(flags & ENG_F_FUA))
      q->op.bytes += p->count;
  }
  q->op.nr_pieces = i;
  q->op.pieces = q->piece;
  q->op.offset = q->piece[0].offset;
  q->op.count = q->piece[0].count;
  return q;
}

static bool
is_mutation (const struct mop *q)
{
  return q->op.kind == ENG_WRITE || q->op.kind == ENG_ZERO ||
    q->op.kind == ENG_TRIM;
}

/* Add seq to l; a set full to the model's bound makes it inexact. */
static void
seq_add (struct seq_set *l, uint64_t seq)
{
  if (l->n == MAX_SEQS) {
    exact = false;
    return;
  }
  l->seq[l->n++] = seq;
}

static void
note_lost (uint32_t b, uint64_t sector, uint64_t seq)
{
  seq_add (&lost[b][sector], seq);
}

/* A piece newer than every loss before seq was synced over sector. */
static void
heal (uint32_t b, uint64_t sector, uint64_t seq)
{
  struct seq_set *l = &lost[b][sector];
  unsigned i = 0;

  while (i < l->n)
    if (l->seq[i] < seq)
      l->seq[i] = l->seq[--l->n];
    else
      i++;
}

static void
seq_remove (struct seq_set *l, uint64_t seq)
{
  unsigned i = 0;

  while (i < l->n)
    if (l->seq[i] == seq)
      l->seq[i] = l->seq[--l->n];
    else
      i++;
}

/* A mutation answered with an error: its own losses go (it was never
 * acknowledged), and so do its pieces written, which a failing sync
 * then does not lose and a FLUSH need not wait a sync for.  (Those
 * written over a loss still heal it: the disk holds them there.)
 */
static void
forget (uint32_t b, uint64_t sector, uint64_t seq)
{
  seq_remove (&lost[b][sector], seq);
  seq_remove (&wr_cur[b][sector], seq);
  seq_remove (&wr_prev[b][sector], seq);
}

static bool
lost_upto (uint32_t b, uint64_t sector, uint64_t horizon)
{
  const struct seq_set *l = &lost[b][sector];
  unsigned i;

  for (i = 0; i < l->n; ++i)
    if (l->seq[i] <= horizon)
      return true;
  return false;
}

/* The oldest and the newest of l (0, 0: empty). */
static uint64_t
seq_min (const struct seq_set *l)
{
  uint64_t m = 0;
  unsigned i;

  for (i = 0; i < l->n; ++i)
    if (m == 0 || l->seq[i] < m)
      m = l->seq[i];
  return m;
}

static uint64_t
seq_max (const struct seq_set *l)
{
  uint64_t m = 0;
  unsigned i;

  for (i = 0; i < l->n; ++i)
    if (l->seq[i] > m)
      m = l->seq[i];
  return m;
}

/* The model's answer for a FLUSH with this horizon, or a FUA mutation
 * q (then horizon is its seq and only its pieces count): lost or not.
 */
static bool
model_lost (const struct mop *q, uint64_t horizon)
{
  size_t b, k;
  uint64_t sct;

  if (q == NULL) {
    for (b = 0; b < nr_files; ++b)
      for (sct = 0; sct < NR_SECTORS; ++sct)
        if (lost_upto (b, sct, horizon))
          return true;
    return false;
  }
  for (k = 0; k < q->op.nr_pieces; ++k) {
    const struct plug_piece *p = &q->piece[k];

    for (sct = p->offset / SECTOR; sct < (p->offset + p->count) / SECTOR;
         ++sct)
      if (lost_upto (p->backing, sct, horizon))
        return true;
  }
  return false;
}

/* A FLUSH, or the exit (fuzz mode): answered for what came before it
 * on every file, not for pieces of its own.
 */
static bool
covers_all (const struct mop *q)
{
  return q->op.kind == ENG_FLUSH || q->op.kind == ENG_SHUTDOWN;
}

static const char *
what_answered (const struct mop *q)
{
  return q->op.kind == ENG_FLUSH ? "FLUSH" :
    q->op.kind == ENG_SHUTDOWN ? "exit" : "FUA mutation";
}

/* The newest mutation q answers for: a FLUSH's horizon, everything for
 * the exit (engine-durable.c sync_answer), a FUA mutation's own seq.
 */
static uint64_t
answers_upto (const struct mop *q)
{
  return q->op.kind == ENG_FLUSH ? q->op.horizon :
    q->op.kind == ENG_SHUTDOWN ? UINT64_MAX : q->op.seq;
}

/* SYNCS BELONG TO THE ENGINE: when a FLUSH (writeback: it covers every
 * mutation up to its horizon), the exit or a FUA mutation is answered,
 * no piece it covers may wait for a sync still: written since the
 * file's last sync began, or covered only by the one in flight.
 */
static void
check_synced (const struct mop *q)
{
  size_t b, k;
  uint64_t sct, upto = answers_upto (q);

  for (b = 0; b < nr_files; ++b)
    for (sct = 0; sct < NR_SECTORS; ++sct) {
      uint64_t w = seq_min (&wr_cur[b][sct]), w2 = seq_min (&wr_prev[b][sct]);

      if (w == 0 || (w2 != 0 && w2 < w))
        w = w2;
      if (w == 0 || w > upto)
        continue;
      for (k = 0; k < q->op.nr_pieces; ++k)
        if (q->piece[k].backing == b &&
            q->piece[k].offset / SECTOR <= sct &&
            sct < (q->piece[k].offset + q->piece[k].count) / SECTOR)
          break;
      if (covers_all (q) || k < q->op.nr_pieces) {
        fail ("a %s was answered before a sync covered mutation %" PRIu64
              " (file %zu sector %" PRIu64 ")", what_answered (q), w, b, sct);
        return;
      }
    }
}

/* THE RECORD: the answer of a FLUSH (or FUA mutation) just answered. */
static void
check_answer (const struct mop *q)
{
  struct eng_counts n;
  bool want, got = q->res.err != 0;

  /* (A FUA mutation whose run failed is answered at once.  The exit
   * waits for every mutation, in both modes.)
   */
  if (q->op.kind == ENG_SHUTDOWN ||
      (q->op.kind == ENG_FLUSH ? mode_writeback : q->res.err == 0))
    check_synced (q);

  if (covers_all (q))
    want = model_lost (NULL, answers_upto (q));
  else
    want = q->op.err != 0 || model_lost (q, q->op.seq);
  engine_counts (e, &n);
  if (n.widened > 0)
    exact = false;
  if (want && !got)
    fail ("a %s (%s %" PRIu64 ") succeeded over a recorded loss",
          what_answered (q), covers_all (q) ? "horizon" : "seq",
          answers_upto (q));
  else if (!want && got && exact)
    fail ("a %s (%s %" PRIu64 ") failed with %s, with no loss to report",
          what_answered (q), covers_all (q) ? "horizon" : "seq",
          answers_upto (q), strerror (q->res.err));
}

/* NBD: a FLUSH covers every write answered before it came; with
 * writeback, every mutation up to its horizon.  Every FLUSH answered
 * since the last look must find them finished, and answer what the
 * record says.
 */
static int
by_answer (const void *a, const void *b)
{
  unsigned long x = (*(struct mop *const *) a)->res.answer_no;
  unsigned long y = (*(struct mop *const *) b)->res.answer_no;

  return x < y ? -1 : x > y;
}

/* A mutation answered with an error (FUA, or any in hold mode or on
 * the direct path: its client waited) was never acknowledged: the
 * engine forgets its own losses then (record_forget_op), those a
 * failed sync recorded before its last piece failed included, and so
 * does the model, before it looks at the answers given after it.
 */
static void
forget_op (const struct mop *q)
{
  size_t k;
  uint64_t sct;

  for (k = 0; k < q->op.nr_pieces; ++k)
    for (sct = q->piece[k].offset / SECTOR;
         sct < (q->piece[k].offset + q->piece[k].count) / SECTOR; ++sct)
      forget (q->piece[k].backing, sct, q->op.seq);
}

static void
check_flushes (void)
{
  static struct mop *due[MAX_OPS];
  size_t i, j, n = 0;

  /* In the order they were answered: each answer saw the record as the
   * ones before it left it.
   */
  for (i = 0; i < nr_ops; ++i) {
    struct mop *f = ops[i];

    if (!f->res.answered || f->flush_checked)
      continue;
    /* A FUA mutation answered after its sync.  A fast zero's ENOTSUP
     * is its own answer, so a FUA fast zero's answer is not checked;
     * but one answered with an error forgets its losses all the same,
     * as does any mutation whose client waited (hold mode, the direct
     * path) answered with an error.
     */
    /* (A writer told "written" when let in after waiting for memory
     * is neither FUA nor answered with an error: not one of these.)
     */
    if (covers_all (f) ||
        (is_mutation (f) && f->op.seq != 0 &&
         ((f->op.flags & ENG_F_FUA) || f->res.err != 0))) {
      f->flush_checked = true;
      due[n++] = f;
    }
  }
  qsort (due, n, sizeof due[0], by_answer);
  for (i = 0; i < n; ++i) {
    struct mop *f = due[i];

    if (!(f->op.flags & ENG_F_FAST) &&
        (covers_all (f) || (f->op.flags & ENG_F_FUA)))
      check_answer (f);
    if (f->op.kind == ENG_SHUTDOWN) {
      for (j = 0; j < nr_ops; ++j)
        if (is_mutation (ops[j]) && ops[j]->op.seq != 0 &&
            ops[j]->op.state != OP_FINISHED)
          fail ("the exit was answered before mutation %" PRIu64
                " finished", ops[j]->op.seq);
      continue;
    }
    if (f->op.kind != ENG_FLUSH) {
      if (f->res.err != 0)
        forget_op (f);
      continue;
    }
    for (j = 0; j < nr_ops; ++j) {
      const struct mop *q = ops[j];

      if (is_mutation (q) && q->res.answer_no > 0 &&
          q->res.answer_no <= f->submitted_after &&
          q->op.state != OP_FINISHED)
        fail ("a FLUSH was answered before mutation %" PRIu64 ", "
              "answered before it came, finished", q->op.seq);
    }
  }
}

static void
submit_op (struct eng_conn *c, struct mop *q, bool try_direct)
{
  struct eng_actions a;

  q->submitted_after = nr_answers;
  eng_actions_init (&a);
  if (!(try_direct && engine_try_direct (e, c, &q->op, now, &a))) {
    perform (&a);
    if (engine_submit (e, c, &q->op, now, &a) == -1) {
      q->res.answered = q->res.released = true;
      q->res.err = errno;
    }
    /* Acknowledged at once: answered now, as far as a FLUSH can tell. */
    if (q->op.acked)
      q->res.answer_no = ++nr_answers;
  }
  perform (&a);
  if (verbose) {
    printf ("# op %zu: kind %d flags %u", q->idx, (int) q->op.kind,
            (unsigned) q->op.flags);
    if (q->op.nr_pieces > 0)
      printf (" file %" PRIu32 " [%" PRIu64 ", +%" PRIu64 ")%s",
              q->piece[0].backing, q->piece[0].offset, q->piece[0].count,
              q->op.nr_pieces > 1 ? " ..." : "");
    printf (": seq %" PRIu64 "%s%s\n", q->op.seq,
            q->op.acked ? ", acknowledged" : "",
            q->res.answered ? ", answered" : "");
  }
  check_flushes ();
}

/* Complete in-flight run i with err; a run written updates the disk,
 * which must hold nothing newer than its members.
 */
static void
complete_run (size_t i, int err)
{
  const struct plug_run *r = inflight[i]->run;
  size_t k;
  uint64_t s;

  if (verbose)
    printf ("# complete file %" PRIu32 " [%" PRIu64 ", +%" PRIu64 ") "
            "with %d\n", r->backing, r->offset, r->count, err);
  if (err == 0) {
    for (k = 0; k < r->n; ++k) {
      struct plug_piece *p = r->reqs[k];
      struct mop *q = (struct mop *) ((struct eng_op *) p->opaque);

      for (s = p->offset / SECTOR; s < (p->offset + p->count) / SECTOR;
           ++s) {
        if (disk[p->backing][s] > q->op.seq)
          fail ("file %" PRIu32 " sector %" PRIu64 ": mutation %" PRIu64
                " written over the newer %" PRIu64,
                p->backing, s, q->op.seq, disk[p->backing][s]);
        disk[p->backing][s] = q->op.seq;
        seq_add (&wr_cur[p->backing][s], q->op.seq);
        if (lost[p->backing][s].n > 0)
          seq_add (&heal_cur[p->backing][s], q->op.seq);
      }
      q->written[p - q->piece] = true;
    }
  }
  else if (err == EIO && r->n == 1 && !(r->flags & PLUG_F_FAST)) {
    /* Fails for good (a merged run is split and retried instead): an
     * acknowledged piece is lost.
     */
    struct plug_piece *p = r->reqs[0];
    struct mop *q = (struct mop *) ((struct eng_op *) p->opaque);

    if (q->op.state == OP_ACKED)
      for (s = p->offset / SECTOR; s < (p->offset + p->count) / SECTOR; ++s)
        note_lost (p->backing, s, q->op.seq);
  }
  complete (i, err);
  check_flushes ();
}

/* The engine issued a sync of file b: what was written so far is what
 * it covers.
 */
static void
model_sync_issued (uint32_t b)
{
  uint64_t sct;

  for (sct = 0; sct < NR_SECTORS; ++sct) {
    if (wr_prev[b][sct].n != 0)
      fail ("file %" PRIu32 ": a sync issued while one is in flight", b);
    wr_prev[b][sct] = wr_cur[b][sct];
    wr_cur[b][sct].n = 0;
    heal_prev[b][sct] = heal_cur[b][sct];
    heal_cur[b][sct].n = 0;
  }
}

/* Complete in-flight sync i with err: a failure loses what it covered
 * and what was written since; a success heals with what it covered.
 */
static void
complete_model_sync (size_t i, int err)
{
  uint32_t b = syncs_inflight[i]->backing;
  uint64_t sct;

  if (verbose)
    printf ("# sync file %" PRIu32 " with %d\n", b, err);
  for (sct = 0; sct < NR_SECTORS; ++sct) {
    const struct seq_set *sets[2] = { &wr_prev[b][sct], &wr_cur[b][sct] };
    unsigned k, j;

    if (err)
      for (k = 0; k < 2; ++k)
        for (j = 0; j < sets[k]->n; ++j)
          note_lost (b, sct, sets[k]->seq[j]);
    if (!err && heal_prev[b][sct].n)
      heal (b, sct, seq_max (&heal_prev[b][sct]));
    if (err)
      heal_cur[b][sct].n = 0;
    wr_prev[b][sct].n = 0;
    heal_prev[b][sct].n = 0;
  }
  complete_sync (i, err);
  check_flushes ();
}

static void
advance (uint64_t ns)
{
  tick (ns);
  check_flushes ();
}

/* ---- fuzz mode's checks (engine-model.h) ---- */

/* The op's place in ops[]: a struct mop begins with its eng_op. */
static size_t
op_index (const struct eng_op *op)
{
  const struct mop *q = (const struct mop *) op;

  if (q->idx < nr_ops && ops[q->idx] == q)
    return q->idx;
  fail ("the engine handed back an op the test never made");
  return SIZE_MAX;
}

static void
fuzz_run_issued (struct eng_run *r)
{
  size_t k, i;

  for (k = 0; k < r->run->n; ++k) {
    i = op_index (r->run->reqs[k]->opaque);
    if (i == SIZE_MAX)
      continue;
    if (ops[i]->res.released)
      fail ("a run issued with a piece of op %zu, already released", i);
    if (owner_gone[i])
      fail ("a run issued for op %zu of a freed connection", i);
  }
}

static void
fuzz_op_answered (struct eng_op *op)
{
  size_t i = op_index (op);

  if (i == SIZE_MAX)
    return;
  if (ops[i]->res.answered)
    fail ("op %zu (kind %d) answered twice", i, (int) op->kind);
  if (op->acked)
    fail ("op %zu, acknowledged at submit, answered again", i);
  if (owner_gone[i])
    fail ("op %zu of a freed connection answered", i);
}

/* Every acknowledged mutation is on the disk or still the engine's:
 * one released with no error was written, every piece of it.
 */
static void
fuzz_op_released (struct eng_op *op)
{
  size_t i = op_index (op), k;
  const struct mop *q;

  if (i == SIZE_MAX)
    return;
  q = ops[i];
  if (q->res.released)
    fail ("op %zu (kind %d) released twice", i, (int) op->kind);
  if (owner_gone[i])
    fail ("op %zu of a freed connection released", i);
  if (is_mutation (q) && op->seq != 0 && op->err == 0 &&
      !(op->flags & ENG_F_FAST))
    for (k = 0; k < op->nr_pieces; ++k)
      if (!q->written[k])
        fail ("mutation %" PRIu64 " released with no error, its piece "
              "%zu never written", op->seq, k);
}

/* After every step: the engine counts in flight what the harness holds,
 * and as unfinished the mutations admitted, not released and not only
 * waiting for a sync.
 */
static void
fuzz_check_step (void)
{
  struct eng_counts n;
  uint64_t unfinished = 0;
  size_t i;

  engine_counts (e, &n);
  if (n.inflight != nr_inflight)
    fail ("the engine counts %" PRIu64 " runs in flight, the harness "
          "holds %zu", n.inflight, nr_inflight);
  for (i = 0; i < nr_ops; ++i)
    if (is_mutation (ops[i]) && ops[i]->op.seq != 0 &&
        !ops[i]->res.released && ops[i]->op.state != OP_SYNC_WAIT)
      unfinished++;
  if (n.unfinished != unfinished)
    fail ("the engine counts %" PRIu64 " unfinished mutations, the model "
          "%" PRIu64, n.unfinished, unfinished);
}

/* Free connection c, whose CLOSE was answered.  In fuzz mode every op
 * it submitted must be released by now, and nothing of it may come
 * back afterwards (the hooks above look at owner_gone).
 */
static void
free_conn (struct eng_conn *c)
{
  size_t i;

  for (i = 0; fuzz && i < nr_ops; ++i)
    if (owner[i] == c && !owner_gone[i]) {
      if (!ops[i]->res.released)
        fail ("connection freed before its op %zu (kind %d, state %d) "
              "was released", i, (int) ops[i]->op.kind,
              (int) ops[i]->op.state);
      owner_gone[i] = true;
    }
  engine_conn_free (e, c);
}

/* Has every op of connection c been answered (so that it may close)? */
static bool
conn_answered (const struct eng_conn *c)
{
  size_t i;

  for (i = 0; i < nr_ops; ++i)
    if (owner[i] == c && !ops[i]->res.answered && !ops[i]->op.acked)
      return false;
  return true;
}

/* Complete runs without errors (and let time pass when none is in
 * flight) until q is answered.  Returns false if it never is.
 */
static bool
drain_until_answered (const struct mop *q)
{
  unsigned guard;

  for (guard = 0; guard < 100000 && !q->res.answered; ++guard) {
    if (nr_inflight > 0)
      complete_run (rnd (nr_inflight), 0);
    else if (nr_syncs_inflight > 0)
      complete_model_sync (rnd (nr_syncs_inflight), 0);
    else
      advance (200 * MS);
  }
  return q->res.answered;
}

/* The same until every op of c was answered. */
static bool
drain_conn (const struct eng_conn *c)
{
  unsigned guard;

  for (guard = 0; guard < 100000 && !conn_answered (c); ++guard) {
    if (nr_inflight > 0)
      complete_run (rnd (nr_inflight), 0);
    else if (nr_syncs_inflight > 0)
      complete_model_sync (rnd (nr_syncs_inflight), 0);
    else
      advance (200 * MS);
  }
  return conn_answered (c);
}

/* The end: each sector holds the newest written mutation, and every
 * admitted piece was written or its op carries an error.
 */
static void
check_disk (void)
{
  static uint64_t want[MAX_FILES][NR_SECTORS];
  size_t i, k;
  uint64_t s;

  memset (want, 0, sizeof want);
  for (i = 0; i < nr_ops; ++i) {
    const struct mop *q = ops[i];

    if (!is_mutation (q) || q->op.seq == 0)
      continue;
    for (k = 0; k < q->op.nr_pieces; ++k) {
      const struct plug_piece *p = &q->piece[k];

      if (!q->written[k]) {
        if (q->op.err == 0 && !(q->op.flags & ENG_F_FAST))
          fail ("mutation %" PRIu64 " piece %zu was dropped: never "
                "written, and no error", q->op.seq, k);
        continue;
      }
      for (s = p->offset / SECTOR; s < (p->offset + p->count) / SECTOR; ++s)
        if (q->op.seq > want[p->backing][s])
          want[p->backing][s] = q->op.seq;
    }
  }
  for (k = 0; k < nr_files; ++k)
    for (s = 0; s < NR_SECTORS; ++s)
      if (want[k][s] != disk[k][s])
        fail ("file %zu sector %" PRIu64 " holds mutation %" PRIu64
              ", the newest written is %" PRIu64,
              k, s, disk[k][s], want[k][s]);
  for (i = 0; i < nr_ops; ++i)
    if ((ops[i]->op.kind == ENG_FLUSH || ops[i]->op.kind == ENG_CLOSE) &&
        !ops[i]->res.answered)
      fail ("a %s was never answered",
            ops[i]->op.kind == ENG_FLUSH ? "FLUSH" : "CLOSE");
}

/* The configuration of a seed. */
struct model_config {
  struct eng_config cfg;
  unsigned nr_conns;
  unsigned pct_eio, pct_eagain;         /* Of completions. */
  unsigned pct_sync_eio;                /* Of syncs. */
};

static void
pick_config (struct model_config *m)
{
  struct eng_config *cfg = &m->cfg;
  unsigned r1, r2;

  memset (m, 0, sizeof *m);
  nr_files = 1 + rnd (MAX_FILES);
  m->nr_conns = 1 + rnd (MAX_CONNS);
  m->pct_eio = rnd (3) == 0 ? 0 : 1 + rnd (8);
  m->pct_eagain = rnd (2) ? 0 : 1 + rnd (15);
  m->pct_sync_eio = rnd (3) == 0 ? 0 : 1 + rnd (20);
  cfg->mode = rnd (4) == 0 ? ENG_HOLD : ENG_WRITEBACK;
  cfg->nr_backings = nr_files;
  cfg->idle_ns = rnd (3) == 0 ? 0 : (1 + rnd (20)) * MS;
  cfg->max_delay_ns = (5 + rnd (100)) * MS;
  /* One choice per statement: the order of the operands' calls is the
   * compiler's, and an input must mean the same scenario under gcc and
   * clang (the fuzzer's crash inputs are replayed by make check).
   */
  r2 = rnd (3);
  r1 = rnd (40);
  cfg->lim.max_requests = 1 + r2 * r1;
  cfg->lim.max_bytes = 1ULL << 30;
  r2 = rnd (3);
  r1 = rnd (4);
  cfg->lim.max_merge = (r2 == 0 ? 2 : 64) * SECTOR * (1 + r1);
  cfg->lim.max_iov = 1 + rnd (8);
  cfg->max_inflight = 1 + (rnd (2) ? rnd (3) : rnd (16));
  cfg->direct = rnd (2);
  cfg->retry.delay_ns = 3 * MS;
  cfg->retry.max_delay_ns = 50 * MS;
  /* Never give up: every piece must then be written in the end. */
  cfg->retry.timeout_ns = 100000 * MS;
}

/* Fuzz mode: the exit was submitted; no connection closes or opens. */
static bool exiting;

/* Fuzz mode: c is served by n worker threads now. */
static void
set_workers (struct eng_conn *c, unsigned n)
{
  struct eng_actions a;

  eng_actions_init (&a);
  engine_conn_set_workers (e, c, n, now, &a);
  perform (&a);
  check_flushes ();
}

/* One random step on connection conns[ci]. */
static void
random_step (const struct model_config *m, struct eng_conn **conns,
             struct mop **closing, unsigned ci)
{
  unsigned what = rnd (100);
  struct mop *q;

  if (closing[ci] != NULL) {
    if (!closing[ci]->res.answered) {
      what = 60;                /* Let the close make progress. */
      goto complete;
    }
    free_conn (conns[ci]);
    conns[ci] = conn ();
    closing[ci] = NULL;
  }
  if (what < 45) {
    unsigned k = rnd (10);
    enum eng_kind kind = k < 6 ? ENG_WRITE : k < 8 ? ENG_ZERO : ENG_TRIM;
    uint32_t flags = rnd (12) == 0 ? ENG_F_FUA : 0;

    if (kind == ENG_ZERO && rnd (2))
      flags |= ENG_F_MAY_TRIM;
    if (kind == ENG_ZERO && rnd (15) == 0)
      flags |= ENG_F_FAST;
    q = new_op (kind, flags);
    owner[nr_ops - 1] = conns[ci];
    submit_op (conns[ci], q, m->cfg.direct && rnd (2));
    return;
  }
  if (what < 53) {
    q = new_op (what < 50 ? ENG_FLUSH : ENG_READ, 0);
    owner[nr_ops - 1] = conns[ci];
    submit_op (conns[ci], q, false);
    return;
  }
  if (what < 54 && m->nr_conns > 1 && !exiting && conn_answered (conns[ci])) {
    closing[ci] = new_op (ENG_CLOSE, 0);
    owner[nr_ops - 1] = conns[ci];
    submit_op (conns[ci], closing[ci], false);
    return;
  }
 complete:
  if (what < 90 && nr_syncs_inflight > 0 && rnd (4) == 0) {
    int err = rnd (100) < m->pct_sync_eio ? EIO : 0;

    complete_model_sync (rnd (nr_syncs_inflight), err);
    return;
  }
  if (what < 90) {
    unsigned burst = 1 + rnd (4);

    while (burst-- > 0 && nr_inflight > 0) {
      size_t i = rnd (nr_inflight);
      unsigned x = rnd (100);
      int err = x < m->pct_eio ? EIO :
        x < m->pct_eio + m->pct_eagain ? EAGAIN : 0;

      /* Merged runs fail more often: their split is the delicate part. */
      if (m->pct_eio > 0 && inflight[i]->run->n > 1 && rnd (4) == 0)
        err = EIO;
      /* The other "not now" (engine.h, NEVER DROPPED). */
      if (fuzz && err == EAGAIN && rnd (2))
        err = ENOMEM;
      complete_run (i, err);
    }
    return;
  }
  if (fuzz && rnd (8) == 0) {
    set_workers (conns[ci], rnd (4));
    return;
  }
  advance ((uint64_t) rnd (30) * MS);
}

/* Fuzz mode, in some inputs: the server exits while the connections
 * are busy, and a few more steps race it.  It must be answered once
 * every admitted mutation finished and the files were synced.
 */
static void
exit_now (const struct model_config *m, struct eng_conn **conns,
          struct mop **closing)
{
  struct mop *x = new_op (ENG_SHUTDOWN, 0);
  unsigned k;

  exiting = true;
  submit_op (NULL, x, false);
  for (k = rnd (64); k > 0; --k)
    random_step (m, conns, closing, rnd (m->nr_conns));
  if (!drain_until_answered (x))
    fail ("the exit was never answered");
}

/* Run one scenario; returns true if the model found nothing wrong.
 * Fuzz mode takes steps until the input ran out (at most `steps`).
 */
static bool
run_model (unsigned steps, char *msg, size_t msg_len)
{
  struct model_config m;
  struct eng_conn *conns[MAX_CONNS];
  struct mop *closing[MAX_CONNS] = { NULL };
  struct eng_counts n;
  unsigned i, st;
  struct mop *last;

  failures = 0;
  first_failure[0] = '\0';
  memset (disk, 0, sizeof disk);
  memset (lost, 0, sizeof lost);
  memset (wr_cur, 0, sizeof wr_cur);
  memset (wr_prev, 0, sizeof wr_prev);
  memset (heal_cur, 0, sizeof heal_cur);
  memset (heal_prev, 0, sizeof heal_prev);
  exact = true;
  exiting = false;
  hold_syncs = true;
  sync_issued = model_sync_issued;
  run_issued = fuzz ? fuzz_run_issued : NULL;
  op_answered = fuzz ? fuzz_op_answered : NULL;
  op_released = fuzz ? fuzz_op_released : NULL;
  memset (owner, 0, sizeof owner);
  memset (owner_gone, 0, sizeof owner_gone);
  pick_config (&m);
  mode_writeback = m.cfg.mode == ENG_WRITEBACK;
  nr_inflight = 0;
  nr_syncs_inflight = 0;
  order_violations = 0;
  deadline_misses = 0;
  e = engine_new (&m.cfg);
  if (e == NULL)
    abort ();
  for (i = 0; i < m.nr_conns; ++i)
    conns[i] = conn ();

  /* Room for the end: a CLOSE per connection twice, the last FLUSH,
   * and in fuzz mode the exit and the steps that race it.
   */
  for (st = 0; st < steps &&
       nr_ops < MAX_OPS - 2 * MAX_CONNS - 1 - (fuzz ? 80 : 0) &&
       !(fuzz && input_spent); ++st) {
    random_step (&m, conns, closing, rnd (m.nr_conns));
    if (fuzz)
      fuzz_check_step ();
  }

  /* Drain without errors: the pending closes, then one FLUSH. */
  for (i = 0; i < m.nr_conns; ++i)
    if (closing[i] != NULL) {
      if (drain_until_answered (closing[i])) {
        free_conn (conns[i]);
        conns[i] = conn ();
      }
      closing[i] = NULL;
    }
  if (fuzz && rnd (3) == 0)
    exit_now (&m, conns, closing);
  last = new_op (ENG_FLUSH, 0);
  submit_op (conns[0], last, false);
  drain_until_answered (last);
  /* Hold mode's FLUSH covers only what was answered: the rest goes out
   * on the timers.
   */
  for (i = 0; i < 100000; ++i) {
    engine_counts (e, &n);
    if (!(n.held || n.queued || n.inflight || n.unfinished))
      break;
    if (nr_inflight > 0)
      complete_run (rnd (nr_inflight), 0);
    else if (nr_syncs_inflight > 0)
      complete_model_sync (rnd (nr_syncs_inflight), 0);
    else
      advance (200 * MS);
  }
  if (n.held || n.queued || n.inflight || n.unfinished)
    fail ("in the end: held %" PRIu64 ", queued %" PRIu64
          ", in flight %" PRIu64 ", unfinished %" PRIu64,
          n.held, n.queued, n.inflight, n.unfinished);
  check_disk ();
  if (order_violations > 0)
    fail ("%u runs issued over an overlapping run in flight",
          order_violations);
  if (deadline_misses > 0)
    fail ("after %u engine calls a deadline came nearer unannounced",
          deadline_misses);

  for (i = 0; i < m.nr_conns; ++i) {
    struct mop *c;

    /* nbdkit closes a connection once none of its requests waits for
     * an answer: a FUA mutation may still wait for a sync here.
     */
    if (!drain_conn (conns[i]))
      fail ("a connection's requests were never all answered");
    c = new_op (ENG_CLOSE, 0);
    submit_op (conns[i], c, false);
    if (!drain_until_answered (c))
      fail ("the last CLOSE was never answered");
    free_conn (conns[i]);
  }
  engine_free (e);
  e = NULL;

  snprintf (msg, msg_len, "%s, %u files, %u conns, direct %d, "
            "max-requests %u, max-inflight %u, max-merge %" PRIu64 ", "
            "max-iov %u, %u%% EIO, %u%% EAGAIN, %u%% sync EIO, %zu ops%s%s%s",
            m.cfg.mode == ENG_HOLD ? "hold" : "writeback",
            nr_files, m.nr_conns, m.cfg.direct,
            (unsigned) m.cfg.lim.max_requests, m.cfg.max_inflight,
            m.cfg.lim.max_merge, (unsigned) m.cfg.lim.max_iov, m.pct_eio,
            m.pct_eagain, m.pct_sync_eio, nr_ops,
            exact ? "" : ", widened", failures ? ": " : "", first_failure);
  while (nr_ops > 0)
    free (ops[--nr_ops]);
  return failures == 0;
}

bool
model_run_seed (unsigned seed, unsigned steps, char *msg, size_t msg_len)
{
  char what[512];
  bool good;

  fuzz = false;
  rng = 0x9E3779B97F4A7C15ULL ^ (seed * 0x100000001B3ULL);
  good = run_model (steps, what, sizeof what);
  snprintf (msg, msg_len, "seed %u: %s", seed, what);
  return good;
}

/* FNV-1a of the input: the generator's seed once the bytes ran out. */
static uint64_t
input_hash (const uint8_t *buf, size_t len)
{
  uint64_t h = 0xcbf29ce484222325ULL;
  size_t i;

  for (i = 0; i < len; ++i)
    h = (h ^ buf[i]) * 0x100000001B3ULL;
  return h ? h : 1;             /* xorshift stays at 0 from 0. */
}

bool
model_run_input (const uint8_t *buf, size_t len, char *msg, size_t msg_len)
{
  bool good;

  fuzz = true;
  input = buf;
  input_len = len;
  input_pos = 0;
  input_spent = false;
  rng = input_hash (buf, len);
  good = run_model (MAX_OPS, msg, msg_len);
  input = NULL;
  fuzz = false;
  return good;
}
