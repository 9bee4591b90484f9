/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* model-test: random concurrent NBD operations checked against a flat
 * reference image.
 *
 * K connections (one libnbd handle and one thread each) issue N random
 * operations each at queue depth Q: pread, pwrite (some FUA), zero (with
 * and without NO_HOLE, some FAST_ZERO), trim and flush.  Every read is
 * compared with the reference.  At the end every connection flushes;
 * with --verify-all a fresh connection then reads the whole export back
 * (before the others close, so the flush alone must have done it), and
 * --dump/--mask write the reference so that a shell test can compare the
 * backing files directly once the server has gone.
 *
 * The rules that keep the reference well defined are the ones real
 * clients follow:
 *
 *  - Every byte has one owning connection.  Ownership is interleaved in
 *    chunks of --chunk bytes (default 260K: a multiple of 4K but not of
 *    64K, so chunk edges do not line up with stripes), and the chunks
 *    holding a --boundary are dealt out first so that the connections
 *    share the boundary-crossing work.  An operation never leaves its
 *    chunk.  Without multi-conn, connections are not coherent before a
 *    flush (writeback mode holds data per connection), so a connection
 *    never touches bytes it does not own.
 *
 *  - Within a connection, an operation that changes data never overlaps
 *    another operation in flight: the generator waits for the conflicting
 *    operation to complete first.  Reads may overlap reads.  Hence the
 *    reference can be updated when a write is issued, and a read is
 *    checked against the reference when it completes.
 *
 *  - After a trim the bytes are unspecified: known[] drops them until they
 *    are rewritten.  A zero reads back as zeros.
 *
 * The operation sequence of each connection depends only on --seed (and
 * on the export's size and flags), never on the order of completions, so
 * a failing seed can be rerun.
 *
 * --cross-reads (for a server that advertises multi-conn and promises
 * that a read on any connection sees every write acknowledged on any
 * connection): half of the reads target chunks of other connections.
 * Their owner keeps a seqlock-style generation per chunk: it increments
 * it before it updates the reference and issues the first mutation of
 * the chunk, and again when the last mutation in flight there completes
 * (odd: a mutation is in flight).  A cross read records the generation
 * at issue (odd: not checked), copies the expected bytes, re-reads the
 * generation (changed: not checked), and at completion is compared only
 * if the generation is still the same: then no mutation of that chunk
 * was in flight at any time during the read, and every earlier one had
 * been acknowledged before the read was sent.
 *
 * --flush-one-then-wait FILE: at the end, once every connection has
 * finished its operations (a barrier), each sends a tail of TAIL_WRITES
 * plain writes (no FUA, one at a time, in its own chunks), so that after
 * the last FLUSH of the random operations every connection has
 * acknowledged data (a server with long idle= and max-delay= still
 * holds it); after a second barrier connection 0 alone sends one FLUSH;
 * then the --dump/--mask files are written, FILE is created and
 * model-test waits, connections open, until it is killed.  A shell test
 * kills the server (kill -9) and compares the backing files with the
 * dump: the one FLUSH must have covered what every connection had
 * acknowledged.  The export is not read back (a read could write out
 * what the FLUSH missed).
 */

#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdbool.h>
#include <string.h>
#include <inttypes.h>
#include <limits.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <libnbd.h>

#define KiB 1024ULL
#define MiB (1024 * KiB)

/* Largest "large" operation: big enough to go past the plugin's merge
 * and max-bytes thresholds in a few operations, small enough that a run
 * stays a few seconds.
 */
#define MAX_LARGE (256 * KiB)
/* How many history entries to print for one mismatching byte. */
#define HISTORY_SHOWN 8
/* How many mismatches to describe in full (all of them are counted). */
#define REPORTS_SHOWN 10
/* --flush-one-then-wait: plain writes each connection sends after the
 * first barrier, so that every connection has acknowledged data that
 * no FLUSH but the last one covers.
 */
#define TAIL_WRITES 8

enum op_kind { OP_READ, OP_WRITE, OP_ZERO, OP_TRIM, OP_FLUSH, NR_KINDS };
static const char *kind_name[NR_KINDS] = {
  "read", "write", "zero", "trim", "flush"
};

enum op_state { ST_NEW, ST_INFLIGHT, ST_DONE, ST_FAILED };

/* One generated operation.  The history keeps all of them (indexed by
 * the per-connection operation number) for mismatch reports and for
 * --expect-errors.
 */
struct op {
  uint64_t offset;
  uint32_t count;
  uint8_t kind;                 /* enum op_kind */
  uint8_t state;                /* enum op_state */
  uint32_t flags;               /* LIBNBD_CMD_FLAG_* */
  uint64_t dseed;               /* Data pattern of a write. */
  int err;                      /* errno of a failed operation */
  bool cross;                   /* A read of another connection's chunk. */
  /* --bad-range: the event (a global count, atomic) when it was sent
   * and when its answer arrived; 0: not yet.  Written by the owner's
   * thread (sent_ev, then acked_ev with release after state and err),
   * read by any connection's FLUSH check.
   */
  uint64_t sent_ev, acked_ev;
};

/* What became of a cross read. */
enum cross_state {
  CROSS_NONE,                   /* Not a cross read. */
  CROSS_BUSY,                   /* A mutation was in flight at issue (or
                                 * began while copying): not checked. */
  CROSS_PENDING,                /* To be checked at completion. */
};

/* One operation in flight: the completion callback's argument. */
struct inflight {
  struct conn *c;
  uint64_t idx;                 /* Index into c->hist. */
  uint8_t *buf;                 /* Owned; freed at completion. */
  uint8_t *saved;               /* FAST_ZERO: reference before, to undo. */
  uint8_t *saved_known;
  /* Cross reads: the owner's reference at issue, and its generation. */
  uint8_t cross;                /* enum cross_state */
  bool self_corrupt;            /* --self-test flipped a byte of exp. */
  uint64_t gen;
  uint8_t *exp, *exp_known;
};

struct stats {
  uint64_t ops[NR_KINDS];
  uint64_t bytes[NR_KINDS];
  uint64_t fua, nohole, fastzero, fastzero_enotsup;
  uint64_t waits;               /* Issue stalled by an overlapping op. */
  uint64_t depth_sum;           /* Sum of ops in flight at each issue. */
  uint64_t mismatches;          /* Reads (or verify runs) that differed. */
  uint64_t mismatch_bytes;
  uint64_t errors;              /* Failed operations. */
  uint64_t cross_checked;       /* Cross reads compared. */
  uint64_t cross_busy;          /* ... not checked: busy at issue. */
  uint64_t cross_changed;       /* ... not checked: changed during it. */
  uint64_t flush_checked;       /* --bad-range: FLUSH answers checked, */
  uint64_t flush_must_fail;     /* ... of which the record decided: */
  uint64_t flush_must_succeed;
  uint64_t flush_wrong;         /* ... that were not the record's truth. */
};

struct conn {
  /* Read-only after setup. */
  unsigned id;
  struct nbd_handle *nbd;
  uint64_t *chunks;             /* Owned chunk indices. */
  size_t nr_chunks;
  uint64_t *bounds;             /* Boundaries strictly inside own chunks. */
  size_t nr_bounds;

  /* Connection thread only. */
  uint64_t rng;
  struct op *hist;              /* nr_ops + TAIL_WRITES entries. */
  uint64_t nr_gen;              /* Operations generated so far. */
  uint64_t nr_inflight;
  struct inflight **slots;      /* qd entries, NULL when free. */
  uint64_t last_good_flush;     /* History index, for --expect-errors. */
  uint64_t corrupt_after;       /* --self-test: corrupt at this write. */
  bool corrupted;
  bool corrupt_inflight;        /* ... a corrupted cross read in flight. */
  bool dead;                    /* Connection failed. */
  struct stats st;
};

/* Options. */
static const char **uris;
static size_t nr_uris;
static unsigned nr_conns = 4;
static unsigned qd = 16;
static uint64_t nr_ops = 1000;
static uint64_t seed = 1;
static uint64_t size;
static uint64_t chunk = 260 * KiB;
static uint64_t *boundaries;
static size_t nr_boundaries;
static uint64_t boundary_step;
static const char *dump_file, *mask_file, *init_file;
static bool verify_all, expect_errors, fua_all, self_test, verbose;
static bool cross_reads, no_final_flush;
/* --bad-range LO:HI: the server fails every backend write, zero and
 * trim that touches [bad_lo, bad_hi) (an LD_PRELOAD shim set by the
 * shell test); bad_hi 0: no such range.
 */
static uint64_t bad_lo, bad_hi;
static uint64_t events = 1;     /* Atomic: the next event number. */
static const char *flush_one_file;

/* Server capabilities (of the first connection). */
static bool can_fua, can_zero, can_trim, can_fast_zero, can_flush;

/* Reference image.  Each connection writes only the bytes it owns, so
 * the threads never write the same byte and need no lock.
 */
static uint8_t *ref;
static uint8_t *known;          /* 1: ref[] is the contents; 0: unspecified. */
static uint8_t *init_image;     /* Initial contents, for reports. */

static struct conn *conns;
static unsigned *chunk_owner;
static uint64_t nr_all_chunks;

/* --cross-reads: per chunk, the generation (atomic; odd while a
 * mutation is in flight) and the number of the owner's mutations in
 * flight (owner's thread only).
 */
static uint64_t *chunk_gen;
static unsigned *chunk_muts;

/* --flush-one-then-wait: every connection thread waits here once it
 * has finished its operations.
 */
static pthread_barrier_t end_barrier;

static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned reports;        /* Protected by report_lock. */

/* splitmix64: small, fast and good enough to drive a test. */
static uint64_t
mix64 (uint64_t z)
{
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t
rnd (uint64_t *state)
{
  *state += 0x9e3779b97f4a7c15ULL;
  return mix64 (*state);
}

/* Uniform in [0, n). */
static uint64_t
rnd_below (uint64_t *state, uint64_t n)
{
  return n ? rnd (state) % n : 0;
}

/* The data of a write is a function of its seed and of the export
 * offset, so a report can say which write a stray byte came from.
 */
static inline uint8_t
pattern_byte (uint64_t dseed, uint64_t o)
{
  return mix64 (dseed + (o >> 3) * 0x9e3779b97f4a7c15ULL) >> ((o & 7) * 8);
}

static void
fill_pattern (uint8_t *buf, uint64_t offset, uint32_t count, uint64_t dseed)
{
  uint64_t w = 0, wi = UINT64_MAX;
  uint32_t i;

  for (i = 0; i < count; ++i) {
    uint64_t o = offset + i;

    if ((o >> 3) != wi) {
      wi = o >> 3;
      w = mix64 (dseed + wi * 0x9e3779b97f4a7c15ULL);
    }
    buf[i] = w >> ((o & 7) * 8);
  }
}

static bool
ranges_overlap (uint64_t o1, uint64_t n1, uint64_t o2, uint64_t n2)
{
  return o1 < o2 + n2 && o2 < o1 + n1;
}

static uint64_t
chunk_end (uint64_t ci)
{
  uint64_t e = (ci + 1) * chunk;
  return e < size ? e : size;
}

static unsigned
owner_of (uint64_t offset)
{
  return chunk_owner[offset / chunk];
}

static void
flags_str (uint32_t flags, char *buf, size_t n)
{
  snprintf (buf, n, "%s%s%s",
            flags & LIBNBD_CMD_FLAG_FUA ? " fua" : "",
            flags & LIBNBD_CMD_FLAG_NO_HOLE ? " no-hole" : "",
            flags & LIBNBD_CMD_FLAG_FAST_ZERO ? " fast-zero" : "");
}

static const char *
state_name (uint8_t s)
{
  switch (s) {
  case ST_NEW: return "not issued";
  case ST_INFLIGHT: return "in flight";
  case ST_DONE: return "done";
  case ST_FAILED: return "FAILED";
  default: abort ();
  }
}

/* Print the last few operations of connection c (up to history index
 * upto, exclusive) that touched byte o, and which of them (if any) wrote
 * the bytes that were actually read.  Caller holds report_lock.
 */
static void
print_history (struct conn *c, uint64_t upto, uint64_t o,
               const uint8_t *got, size_t got_len)
{
  uint64_t i = upto;
  unsigned shown = 0;
  bool matched = false;
  size_t n = got_len < 16 ? got_len : 16;

  fprintf (stderr, "  history of byte %" PRIu64 " (conn %u, newest first):\n",
           o, c->id);
  while (i > 0) {
    const struct op *p = &c->hist[--i];
    char fl[64];

    if (p->kind == OP_FLUSH || !ranges_overlap (p->offset, p->count, o, 1))
      continue;
    if (shown < HISTORY_SHOWN) {
      flags_str (p->flags, fl, sizeof fl);
      fprintf (stderr, "    #%" PRIu64 " %s %" PRIu64 "+%" PRIu32 "%s [%s]",
               i, kind_name[p->kind], p->offset, p->count, fl,
               state_name (p->state));
      if (p->state == ST_FAILED)
        fprintf (stderr, " (%s)", strerror (p->err));
      if (p->kind == OP_WRITE) {
        size_t j, m = n;

        if (o + m > p->offset + p->count)
          m = p->offset + p->count - o;
        for (j = 0; j < m; ++j)
          if (pattern_byte (p->dseed, o + j) != got[j])
            break;
        if (j == m && !matched) {
          fprintf (stderr, "  <- the data read is this write's");
          matched = true;
        }
      }
      fputc ('\n', stderr);
    }
    shown++;
  }
  if (shown == 0)
    fprintf (stderr, "    (never touched by this connection)\n");
  else if (shown > HISTORY_SHOWN)
    fprintf (stderr, "    ... %u older\n", shown - HISTORY_SHOWN);
  if (!matched) {
    size_t j;

    for (j = 0; j < n && got[j] == 0; ++j)
      ;
    if (j == n)
      fprintf (stderr, "  the data read is zeros\n");
    else if (init_image && memcmp (got, &init_image[o], n) == 0)
      fprintf (stderr, "  the data read is the initial contents\n");
  }
}

/* Compare buf (count bytes read at offset) with the known bytes of an
 * expected image: exp[i] and exp_known[i] describe byte offset + i.
 * Returns the number of differing bytes; describes the first one.  what
 * names the read for the report.  upto bounds the history search in c,
 * the owner of the bytes.
 */
static uint64_t
check_expected (struct conn *c, uint64_t upto, const char *what,
                uint64_t offset, const uint8_t *buf, uint64_t count,
                const uint8_t *exp, const uint8_t *exp_known)
{
  uint64_t i, bad = 0, first = 0, last = 0;

  for (i = 0; i < count; ++i) {
    if (exp_known[i] && exp[i] != buf[i]) {
      if (bad++ == 0)
        first = i;
      last = i;
    }
  }
  if (bad == 0)
    return 0;

  pthread_mutex_lock (&report_lock);
  if (reports++ < REPORTS_SHOWN) {
    uint64_t o = offset + first;

    fprintf (stderr,
             "MISMATCH: %s %" PRIu64 "+%" PRIu64 ": at offset %" PRIu64
             " (0x%" PRIx64 ") expected 0x%02x got 0x%02x; %" PRIu64
             " bytes differ in [%" PRIu64 ", %" PRIu64 "]\n",
             what, offset, count, o, o, exp[first], buf[first], bad,
             o, offset + last);
    print_history (c, upto, o, &buf[first], count - first);
  }
  pthread_mutex_unlock (&report_lock);
  return bad;
}

/* check_expected against the reference itself. */
static uint64_t
check_range (struct conn *c, uint64_t upto, const char *what,
             uint64_t offset, const uint8_t *buf, uint64_t count)
{
  return check_expected (c, upto, what, offset, buf, count,
                         &ref[offset], &known[offset]);
}

/* --cross-reads: the owner's side of the generation of the chunk holding
 * offset.  mut_begin before the reference is updated for a mutation (and
 * before it is issued), mut_end once it completed (after any update of
 * the reference at completion).
 */
static void
mut_begin (uint64_t offset)
{
  uint64_t ci = offset / chunk;

  if (!cross_reads)
    return;
  if (chunk_muts[ci]++ == 0)
    /* Odd.  Acquire-release: the reference updates that follow cannot
     * move before it.
     */
    __atomic_add_fetch (&chunk_gen[ci], 1, __ATOMIC_ACQ_REL);
}

static void
mut_end (uint64_t offset)
{
  uint64_t ci = offset / chunk;

  if (!cross_reads)
    return;
  if (--chunk_muts[ci] == 0)
    /* Even.  Release: the reference updates before it are visible to a
     * reader that sees the new value.
     */
    __atomic_add_fetch (&chunk_gen[ci], 1, __ATOMIC_RELEASE);
}

/* Invalidate the cross reads of the chunk holding offset (an error made
 * some of it unspecified): parity is kept.
 */
static void
gen_bump (uint64_t offset)
{
  if (cross_reads)
    __atomic_add_fetch (&chunk_gen[offset / chunk], 2, __ATOMIC_ACQ_REL);
}

static bool
is_mutation (const struct op *p)
{
  return p->kind == OP_WRITE || p->kind == OP_ZERO || p->kind == OP_TRIM;
}

/* --expect-errors: a failed write, zero or trim leaves its range
 * unspecified.
 */
static void
forget_range (uint64_t offset, uint64_t count)
{
  memset (&known[offset], 0, count);
}

static uint64_t
next_event (void)
{
  return __atomic_fetch_add (&events, 1, __ATOMIC_SEQ_CST);
}

static bool
is_bad (const struct op *p)
{
  return bad_hi > 0 && is_mutation (p) &&
    ranges_overlap (p->offset, p->count, bad_lo, bad_hi - bad_lo);
}

/* --bad-range, THE RECORD as a client can know it: a FLUSH answered at
 * event done_ev, sent at fl->sent_ev, must fail if a mutation that
 * touched the bad range was acknowledged (answered with success) before
 * it was sent, and no mutation since wrote all of that range with
 * success (per byte: the last covered one to succeed there was bad);
 * it must succeed if no such byte exists and no mutation that touched
 * the bad range was in flight around it.  A mutation answered after the
 * FLUSH was sent, but sent before the FLUSH was answered, may or may not
 * be covered: the bytes it touches are left unchecked.  Each byte has
 * one owner, whose overlapping mutations are serial, so replaying each
 * connection's history in order gives each byte's state.  Only bytes
 * near the bad range can be lost: the zone, the hull of the bad
 * mutations sent so far.
 */
/* Every connection's operations sent before event done_ev, each
 * connection's in history order.
 */
struct sent_iter {
  unsigned k;
  uint64_t i, n, done_ev;
};

static const struct op *
sent_next (struct sent_iter *it)
{
  for (;;) {
    const struct op *p;
    uint64_t sent;

    if (it->i == it->n) {
      if (it->k == nr_conns)
        return NULL;
      it->n = __atomic_load_n (&conns[it->k++].nr_gen, __ATOMIC_ACQUIRE);
      it->i = 0;
      continue;
    }
    p = &conns[it->k - 1].hist[it->i++];
    sent = __atomic_load_n (&p->sent_ev, __ATOMIC_ACQUIRE);
    if (sent != 0 && sent <= it->done_ev)
      return p;
  }
}

static void
check_flush_answer (struct conn *c, const struct op *fl, uint64_t done_ev)
{
  uint64_t zlo = UINT64_MAX, zhi = 0, b;
  uint8_t *lost, *amb;
  bool must_fail = false, any_lost = false, amb_bad = false;
  struct sent_iter it = { .done_ev = done_ev };
  const struct op *p;

  while ((p = sent_next (&it)) != NULL)
    if (is_bad (p)) {
      zlo = p->offset < zlo ? p->offset : zlo;
      zhi = p->offset + p->count > zhi ? p->offset + p->count : zhi;
    }
  c->st.flush_checked++;
  if (zhi == 0) {
    c->st.flush_must_succeed++;
    if (fl->state == ST_FAILED) {
      c->st.flush_wrong++;
      fprintf (stderr, "THE RECORD: conn %u FLUSH failed (%s) with no "
               "write ever sent to the bad range\n", c->id,
               strerror (fl->err));
    }
    return;
  }
  lost = calloc (zhi - zlo, 1);
  amb = calloc (zhi - zlo, 1);
  if (lost == NULL || amb == NULL) {
    perror ("calloc");
    exit (EXIT_FAILURE);
  }
  it = (struct sent_iter) { .done_ev = done_ev };
  while ((p = sent_next (&it)) != NULL) {
    uint64_t acked = __atomic_load_n (&p->acked_ev, __ATOMIC_ACQUIRE);
    uint64_t lo, hi;
    bool ok;

    if (!is_mutation (p) ||
        !ranges_overlap (p->offset, p->count, zlo, zhi - zlo))
      continue;
    lo = p->offset > zlo ? p->offset : zlo;
    hi = p->offset + p->count < zhi ? p->offset + p->count : zhi;
    ok = acked != 0 && p->state == ST_DONE;
    if (acked != 0 && acked < fl->sent_ev) {
      /* Covered: a success decides, a failure told its client. */
      if (ok)
        memset (&lost[lo - zlo], is_bad (p), hi - lo);
    }
    else if (!(acked != 0 && !ok)) {
      memset (&amb[lo - zlo], 1, hi - lo);
      amb_bad |= is_bad (p);
    }
  }
  for (b = 0; b < zhi - zlo; ++b) {
    any_lost |= lost[b];
    must_fail |= lost[b] && !amb[b];
  }
  c->st.flush_must_fail += must_fail;
  c->st.flush_must_succeed += !any_lost && !amb_bad;
  if (must_fail && fl->state != ST_FAILED) {
    c->st.flush_wrong++;
    fprintf (stderr, "THE RECORD: conn %u FLUSH succeeded, but an "
             "acknowledged write to the bad range was lost and not written "
             "again\n", c->id);
  }
  else if (!any_lost && !amb_bad && fl->state == ST_FAILED) {
    c->st.flush_wrong++;
    fprintf (stderr, "THE RECORD: conn %u FLUSH failed (%s), but every "
             "acknowledged write to the bad range was written again\n",
             c->id, strerror (fl->err));
  }
  free (lost);
  free (amb);
}

/* libnbd completion callback.  Runs in this connection's thread inside
 * nbd_poll (we are the only user of the handle), so it may read the
 * reference but must not call nbd_* on the handle.
 */
static int
op_done (void *vp, int *error)
{
  struct inflight *f = vp;
  struct conn *c = f->c;
  struct op *p = &c->hist[f->idx];
  uint64_t i;

  p->state = *error ? ST_FAILED : ST_DONE;
  p->err = *error;
  if (bad_hi > 0) {
    /* The result first, then the event that publishes it. */
    uint64_t ev = next_event ();

    __atomic_store_n (&p->acked_ev, ev, __ATOMIC_RELEASE);
    if (p->kind == OP_FLUSH)
      check_flush_answer (c, p, ev);
  }
  if (*error) {
    if (p->kind == OP_ZERO && (p->flags & LIBNBD_CMD_FLAG_FAST_ZERO) &&
        *error == ENOTSUP) {
      /* Allowed: the server could not zero fast.  It SHOULD NOT have
       * changed the contents: put the reference back.
       */
      memcpy (&ref[p->offset], f->saved, p->count);
      memcpy (&known[p->offset], f->saved_known, p->count);
      c->st.fastzero_enotsup++;
      goto out;
    }
    c->st.errors++;
    if (!expect_errors || verbose) {
      char fl[64];

      flags_str (p->flags, fl, sizeof fl);
      pthread_mutex_lock (&report_lock);
      fprintf (stderr, "ERROR: conn %u op #%" PRIu64 " %s %" PRIu64
               "+%" PRIu32 "%s: %s\n",
               c->id, f->idx, kind_name[p->kind], p->offset, p->count, fl,
               strerror (*error));
      pthread_mutex_unlock (&report_lock);
    }
    switch (p->kind) {
    case OP_WRITE: case OP_ZERO: case OP_TRIM:
      forget_range (p->offset, p->count);
      break;
    case OP_FLUSH:
      /* Writes acknowledged before this flush may be lost.  Those issued
       * before the last good flush minus the queue depth were covered by
       * it; the rest become unspecified.
       */
      i = c->last_good_flush > qd ? c->last_good_flush - qd : 0;
      for (; i < f->idx; ++i) {
        const struct op *q = &c->hist[i];

        if (q->kind == OP_WRITE || q->kind == OP_ZERO || q->kind == OP_TRIM) {
          forget_range (q->offset, q->count);
          gen_bump (q->offset);
        }
      }
      break;
    default: ;
    }
    goto out;
  }

  if (f->self_corrupt)
    c->corrupt_inflight = false;
  if (p->kind == OP_READ && f->cross == CROSS_BUSY)
    c->st.cross_busy++;
  else if (p->kind == OP_READ && f->cross == CROSS_PENDING) {
    uint64_t ci = p->offset / chunk;
    struct conn *owner = &conns[chunk_owner[ci]];
    char what[96];

    /* The read's answer has arrived: if the generation is still the
     * one before the read was sent, no mutation of the chunk was in
     * flight at any time in between.
     */
    if (__atomic_load_n (&chunk_gen[ci], __ATOMIC_ACQUIRE) != f->gen)
      c->st.cross_changed++;
    else {
      c->st.cross_checked++;
      snprintf (what, sizeof what,
                "conn %u op #%" PRIu64 " cross read (chunk of conn %u)",
                c->id, f->idx, owner->id);
      i = check_expected (owner,
                          __atomic_load_n (&owner->nr_gen, __ATOMIC_ACQUIRE),
                          what, p->offset, f->buf, p->count,
                          f->exp, f->exp_known);
      if (i) {
        c->st.mismatches++;
        c->st.mismatch_bytes += i;
      }
      if (f->self_corrupt)
        c->corrupted = true;
    }
  }
  else if (p->kind == OP_READ) {
    char what[64];

    snprintf (what, sizeof what, "conn %u op #%" PRIu64 " read",
              c->id, f->idx);
    i = check_range (c, f->idx, what, p->offset, f->buf, p->count);
    if (i) {
      c->st.mismatches++;
      c->st.mismatch_bytes += i;
    }
  }
  else if (p->kind == OP_FLUSH && f->idx > c->last_good_flush)
    c->last_good_flush = f->idx;
  else if (p->kind == OP_ZERO && (p->flags & LIBNBD_CMD_FLAG_FAST_ZERO)) {
    memset (&ref[p->offset], 0, p->count);
    memset (&known[p->offset], 1, p->count);
  }

 out:
  if (is_mutation (p))
    mut_end (p->offset);
  for (i = 0; i < qd; ++i)
    if (c->slots[i] == f) {
      c->slots[i] = NULL;
      break;
    }
  c->nr_inflight--;
  free (f->buf);
  free (f->saved);
  free (f->saved_known);
  free (f->exp);
  free (f->exp_known);
  free (f);
  return 1;                     /* Auto-retire. */
}

/* Choose a length: mostly 4K-aligned, some 512-aligned, some arbitrary,
 * a few large.  *align receives the alignment the offset should keep.
 */
static uint32_t
gen_len (struct conn *c, uint64_t *align)
{
  uint64_t r = rnd_below (&c->rng, 100);

  if (r < 55) {
    *align = 4096;
    return 4096 * (1 + rnd_below (&c->rng, 16));
  }
  if (r < 80) {
    *align = 512;
    return 512 * (1 + rnd_below (&c->rng, 128));
  }
  if (r < 95) {
    *align = 1;
    return 1 + rnd_below (&c->rng, 64 * KiB);
  }
  *align = 4096;
  return 64 * KiB +
    4096 * rnd_below (&c->rng, (MAX_LARGE - 64 * KiB) / 4096 + 1);
}

/* Place [*off, *off+len) inside chunk [cs, ce), preferring alignment. */
static void
place_in_chunk (struct conn *c, uint64_t cs, uint64_t ce, uint64_t align,
                uint64_t *off, uint32_t *len)
{
  uint64_t lo, hi;

  if (*len > ce - cs)
    *len = ce - cs;
  lo = (cs + align - 1) / align * align;
  hi = (ce - *len) / align * align;
  if (lo > hi) {
    lo = cs;
    hi = ce - *len;
    align = 1;
  }
  *off = lo + rnd_below (&c->rng, (hi - lo) / align + 1) * align;
}

/* A range of length about *len crossing boundary b (strictly inside its
 * chunk), within that chunk.
 */
static void
range_across (struct conn *c, uint64_t b, uint64_t align,
              uint64_t *off, uint32_t *len)
{
  uint64_t ci = b / chunk, cs = ci * chunk, ce = chunk_end (ci);
  uint64_t k;

  if (*len < 2)
    *len = 2;
  if (*len > ce - cs)
    *len = ce - cs;
  /* k bytes before the boundary, len - k after. */
  if (align > 1 && b % align == 0 && *len / align >= 2)
    k = align * (1 + rnd_below (&c->rng, *len / align - 1));
  else
    k = 1 + rnd_below (&c->rng, *len - 1);
  *off = b < cs + k ? cs : b - k;
  if (*off + *len > ce)
    *off = ce - *len;
}

/* A range inside one of our chunks, sometimes crossing a boundary,
 * sometimes overlapping a recent operation (to read back held data and
 * to overwrite it partially).
 */
static void
gen_range (struct conn *c, uint64_t *off, uint32_t *len)
{
  uint64_t align, r = rnd_below (&c->rng, 100);
  uint64_t ci, cs, ce;

  *len = gen_len (c, &align);

  if (r < 10 && c->nr_bounds > 0) {
    range_across (c, c->bounds[rnd_below (&c->rng, c->nr_bounds)], align,
                  off, len);
    return;
  }

  if (r < 20 && c->nr_gen > 0) {
    /* Near one of the last 8 data operations (not a cross read: that
     * was in another connection's chunk).
     */
    uint64_t back = 1 + rnd_below (&c->rng, c->nr_gen < 8 ? c->nr_gen : 8);
    const struct op *p = &c->hist[c->nr_gen - back];

    if (p->kind != OP_FLUSH && !p->cross) {
      int64_t shift = 0;

      ci = p->offset / chunk;
      cs = ci * chunk;
      ce = chunk_end (ci);
      if (rnd_below (&c->rng, 2))
        *len = p->count;
      else
        shift = (int64_t) rnd_below (&c->rng, 2 * align + 1) - (int64_t) align;
      if (*len > ce - cs)
        *len = ce - cs;
      if (shift < 0 && (uint64_t) -shift > p->offset - cs)
        *off = cs;
      else
        *off = p->offset + shift;
      if (*off + *len > ce)
        *off = ce - *len;
      return;
    }
  }

  ci = c->chunks[rnd_below (&c->rng, c->nr_chunks)];
  place_in_chunk (c, ci * chunk, chunk_end (ci), align, off, len);
}

/* --cross-reads: a range inside a chunk of another connection (whose
 * chunks and boundaries are read-only after setup), sometimes crossing
 * one of its boundaries.
 */
static void
gen_cross_range (struct conn *c, uint64_t *off, uint32_t *len)
{
  uint64_t align, r = rnd_below (&c->rng, 100);
  const struct conn *o =
    &conns[(c->id + 1 + rnd_below (&c->rng, nr_conns - 1)) % nr_conns];
  uint64_t ci;

  *len = gen_len (c, &align);
  if (r < 10 && o->nr_bounds > 0) {
    range_across (c, o->bounds[rnd_below (&c->rng, o->nr_bounds)], align,
                  off, len);
    return;
  }
  ci = o->chunks[rnd_below (&c->rng, o->nr_chunks)];
  place_in_chunk (c, ci * chunk, chunk_end (ci), align, off, len);
}

/* Generate operation number c->nr_gen into the history.  Depends only on
 * the connection's random stream and its own earlier operations.
 */
static void
gen_op (struct conn *c)
{
  struct op *p = &c->hist[c->nr_gen];
  uint64_t r = rnd_below (&c->rng, 100);

  memset (p, 0, sizeof *p);
  if (r < 38)
    p->kind = OP_READ;
  else if (r < 72)
    p->kind = OP_WRITE;
  else if (r < 84)
    p->kind = OP_ZERO;
  else if (r < 92)
    p->kind = OP_TRIM;
  else if (r < 96)
    p->kind = OP_FLUSH;
  else
    p->kind = OP_READ;

  /* Draw all random numbers before looking at capabilities, so that a
   * server without trim sees the same offsets.
   */
  r = rnd (&c->rng);
  p->dseed = rnd (&c->rng) | 1;
  if (p->kind == OP_READ && cross_reads && nr_conns > 1 &&
      rnd_below (&c->rng, 2))
    p->cross = true;
  if (p->cross)
    gen_cross_range (c, &p->offset, &p->count);
  else if (p->kind != OP_FLUSH)
    gen_range (c, &p->offset, &p->count);

  if (p->kind == OP_TRIM && !can_trim)
    p->kind = OP_WRITE;
  if (p->kind == OP_ZERO && !can_zero)
    p->kind = OP_WRITE;
  if (p->kind == OP_FLUSH && !can_flush)
    p->kind = OP_READ, p->count = 0;
  if (p->kind == OP_READ && p->count == 0) {
    p->offset = c->chunks[0] * chunk;
    p->count = 4096 < chunk_end (c->chunks[0]) - p->offset
      ? 4096 : chunk_end (c->chunks[0]) - p->offset;
  }

  switch (p->kind) {
  case OP_WRITE:
    if (can_fua && r % 100 < 15)
      p->flags |= LIBNBD_CMD_FLAG_FUA;
    break;
  case OP_ZERO:
    if (r % 2)
      p->flags |= LIBNBD_CMD_FLAG_NO_HOLE;
    if (can_fua && (r >> 8) % 100 < 10)
      p->flags |= LIBNBD_CMD_FLAG_FUA;
    if (can_fast_zero && (r >> 16) % 100 < 8)
      p->flags |= LIBNBD_CMD_FLAG_FAST_ZERO;
    break;
  case OP_TRIM:
    if (can_fua && (r >> 8) % 100 < 10)
      p->flags |= LIBNBD_CMD_FLAG_FUA;
    break;
  case OP_READ: case OP_FLUSH:
    /* NBD says the server must accept FUA on any command. */
    if (fua_all && (r >> 24) % 100 < 10)
      p->flags |= LIBNBD_CMD_FLAG_FUA;
    break;
  default: abort ();
  }
  p->state = ST_NEW;
  /* Release: another connection's mismatch report may read the history
   * up to nr_gen.
   */
  __atomic_store_n (&c->nr_gen, c->nr_gen + 1, __ATOMIC_RELEASE);
}

/* Must a and b stay in order (one waits for the other)?  Yes if they
 * overlap and either changes data.  Flushes conflict with nothing here:
 * ordering them is the generator's business (see may_issue).
 */
static bool
ops_conflict (const struct op *a, const struct op *b)
{
  if (a->kind == OP_FLUSH || b->kind == OP_FLUSH)
    return false;
  if (a->kind == OP_READ && b->kind == OP_READ)
    return false;
  return ranges_overlap (a->offset, a->count, b->offset, b->count);
}

/* May history entry idx be issued now?  Not if it conflicts with an
 * operation in flight, nor with an earlier operation not yet issued
 * (operations may pass each other only where the order cannot matter,
 * so the history order of any two overlapping operations is also their
 * issue order).  A flush waits until everything before it is issued.
 */
static bool
may_issue (struct conn *c, uint64_t low, uint64_t idx)
{
  const struct op *p = &c->hist[idx];
  uint64_t i;

  for (i = low; i < idx; ++i) {
    const struct op *q = &c->hist[i];

    if (q->state != ST_NEW)
      continue;
    if (p->kind == OP_FLUSH || ops_conflict (p, q))
      return false;
  }
  for (i = 0; i < qd; ++i) {
    const struct inflight *f = c->slots[i];

    if (f && ops_conflict (p, &c->hist[f->idx]))
      return false;
  }
  return true;
}

static void
print_op (struct conn *c, uint64_t idx, const char *what)
{
  const struct op *p = &c->hist[idx];
  char fl[64];

  flags_str (p->flags, fl, sizeof fl);
  pthread_mutex_lock (&report_lock);
  fprintf (stderr, "conn %u #%" PRIu64 " %s %s %" PRIu64 "+%" PRIu32 "%s\n",
           c->id, idx, what, kind_name[p->kind], p->offset, p->count, fl);
  pthread_mutex_unlock (&report_lock);
}

/* Issue history entry idx and update the reference.  Returns 0, or -1 if
 * the connection failed.
 */
static int
issue (struct conn *c, uint64_t idx)
{
  struct op *p = &c->hist[idx];
  struct inflight *f;
  nbd_completion_callback cb;
  int64_t cookie = -1;
  unsigned i;

  f = calloc (1, sizeof *f);
  if (f == NULL) {
    perror ("calloc");
    exit (EXIT_FAILURE);
  }
  f->c = c;
  f->idx = idx;
  if (p->kind == OP_READ || p->kind == OP_WRITE) {
    f->buf = malloc (p->count);
    if (f->buf == NULL) {
      perror ("malloc");
      exit (EXIT_FAILURE);
    }
  }
  cb.callback = op_done;
  cb.user_data = f;
  cb.free = NULL;

  if (verbose)
    print_op (c, idx, "issue");

  c->st.ops[p->kind]++;
  c->st.depth_sum += c->nr_inflight;
  c->st.bytes[p->kind] += p->count;
  if (p->flags & LIBNBD_CMD_FLAG_FUA)
    c->st.fua++;

  /* Reference first: the completion may run inside the aio call. */
  if (is_mutation (p))
    mut_begin (p->offset);
  switch (p->kind) {
  case OP_READ:
    memset (f->buf, 0xa5, p->count);  /* Not zero: catch short reads. */
    if (p->cross) {
      uint64_t ci = p->offset / chunk;
      uint64_t g = __atomic_load_n (&chunk_gen[ci], __ATOMIC_ACQUIRE);

      f->cross = CROSS_BUSY;
      if (g & 1)
        break;                  /* The owner has a mutation in flight. */
      f->exp = malloc (p->count);
      f->exp_known = malloc (p->count);
      if (f->exp == NULL || f->exp_known == NULL) {
        perror ("malloc");
        exit (EXIT_FAILURE);
      }
      memcpy (f->exp, &ref[p->offset], p->count);
      memcpy (f->exp_known, &known[p->offset], p->count);
      __atomic_thread_fence (__ATOMIC_ACQUIRE);
      if (__atomic_load_n (&chunk_gen[ci], __ATOMIC_RELAXED) != g) {
        free (f->exp);
        free (f->exp_known);
        f->exp = f->exp_known = NULL;
        break;                  /* A mutation began while we copied. */
      }
      f->cross = CROSS_PENDING;
      f->gen = g;
      if (self_test && !c->corrupted && !c->corrupt_inflight &&
          idx >= c->corrupt_after) {
        uint32_t j;

        /* --self-test with --cross-reads: expect something else at the
         * first known byte of this cross read.  Retried on later cross
         * reads until one is actually compared.
         */
        for (j = 0; j < p->count; ++j)
          if (f->exp_known[j]) {
            f->exp[j] ^= 0x5a;
            f->self_corrupt = true;
            c->corrupt_inflight = true;
            break;
          }
      }
      break;
    }
    if (self_test && !cross_reads && !c->corrupted &&
        idx >= c->corrupt_after) {
      uint32_t j;

      /* Pretend the reference expects something else at the first known
       * byte of this read: it is in flight and nothing may overlap it,
       * so the read must report a mismatch.
       */
      for (j = 0; j < p->count; ++j)
        if (known[p->offset + j]) {
          ref[p->offset + j] ^= 0x5a;
          c->corrupted = true;
          break;
        }
    }
    break;
  case OP_WRITE:
    fill_pattern (f->buf, p->offset, p->count, p->dseed);
    memcpy (&ref[p->offset], f->buf, p->count);
    memset (&known[p->offset], 1, p->count);
    break;
  case OP_ZERO:
    if (p->flags & LIBNBD_CMD_FLAG_NO_HOLE)
      c->st.nohole++;
    if (p->flags & LIBNBD_CMD_FLAG_FAST_ZERO) {
      /* Outcome known only at completion (ENOTSUP leaves the data). */
      c->st.fastzero++;
      f->saved = malloc (p->count);
      f->saved_known = malloc (p->count);
      if (f->saved == NULL || f->saved_known == NULL) {
        perror ("malloc");
        exit (EXIT_FAILURE);
      }
      memcpy (f->saved, &ref[p->offset], p->count);
      memcpy (f->saved_known, &known[p->offset], p->count);
      memset (&known[p->offset], 0, p->count);
    }
    else {
      memset (&ref[p->offset], 0, p->count);
      memset (&known[p->offset], 1, p->count);
    }
    break;
  case OP_TRIM:
    memset (&known[p->offset], 0, p->count);
    break;
  case OP_FLUSH:
    break;
  default: abort ();
  }

  /* --bad-range: an acknowledged write there is lost (the server only
   * answers for it in its FLUSHes), so its bytes are unspecified.
   */
  if (is_bad (p))
    forget_range (p->offset, p->count);

  for (i = 0; i < qd; ++i)
    if (c->slots[i] == NULL) {
      c->slots[i] = f;
      break;
    }
  if (i == qd)
    abort ();
  c->nr_inflight++;
  p->state = ST_INFLIGHT;
  if (bad_hi > 0)
    __atomic_store_n (&p->sent_ev, next_event (), __ATOMIC_RELEASE);

  switch (p->kind) {
  case OP_READ:
    cookie = nbd_aio_pread (c->nbd, f->buf, p->count, p->offset, cb, p->flags);
    break;
  case OP_WRITE:
    cookie = nbd_aio_pwrite (c->nbd, f->buf, p->count, p->offset, cb,
                             p->flags);
    break;
  case OP_ZERO:
    cookie = nbd_aio_zero (c->nbd, p->count, p->offset, cb, p->flags);
    break;
  case OP_TRIM:
    cookie = nbd_aio_trim (c->nbd, p->count, p->offset, cb, p->flags);
    break;
  case OP_FLUSH:
    cookie = nbd_aio_flush (c->nbd, cb, p->flags);
    break;
  default: abort ();
  }
  if (cookie == -1) {
    /* Not issued, so the callback will not run: undo the slot. */
    fprintf (stderr, "conn %u op #%" PRIu64 " %s: %s\n",
             c->id, idx, kind_name[p->kind], nbd_get_error ());
    p->state = ST_FAILED;
    p->err = nbd_get_errno () ? : EIO;
    c->st.errors++;
    c->slots[i] = NULL;
    c->nr_inflight--;
    if (is_mutation (p))
      mut_end (p->offset);
    free (f->buf);
    free (f->saved);
    free (f->saved_known);
    free (f->exp);
    free (f->exp_known);
    free (f);
    return -1;
  }
  return 0;
}

/* --flush-one-then-wait: generate the next tail write (a plain write of
 * 4K to 64K, 4K-aligned, in one of our chunks) into the history.
 */
static void
gen_tail_write (struct conn *c)
{
  struct op *p = &c->hist[c->nr_gen];
  uint64_t ci;

  memset (p, 0, sizeof *p);
  p->kind = OP_WRITE;
  p->dseed = rnd (&c->rng) | 1;
  p->count = 4096 * (1 + rnd_below (&c->rng, 16));
  ci = c->chunks[rnd_below (&c->rng, c->nr_chunks)];
  place_in_chunk (c, ci * chunk, chunk_end (ci), 4096, &p->offset,
                  &p->count);
  p->state = ST_NEW;
  __atomic_store_n (&c->nr_gen, c->nr_gen + 1, __ATOMIC_RELEASE);
}

/* Issue the connection's operations, up to qd in flight.  Operations
 * are generated in order into a window of up to qd not yet issued ones;
 * any of them that conflicts with nothing earlier may go (like a real
 * client's queue), so the queue stays deep even when some operation has
 * to wait.
 */
static void *
conn_thread (void *vp)
{
  struct conn *c = vp;
  uint64_t low = 0;             /* Lowest history index not yet issued. */
  uint64_t i;

  while ((low < nr_ops && !c->dead) || c->nr_inflight > 0) {
    while (c->nr_gen < nr_ops && c->nr_gen - low < qd)
      gen_op (c);
    for (i = low; i < c->nr_gen && !c->dead && c->nr_inflight < qd; ++i) {
      if (c->hist[i].state != ST_NEW)
        continue;
      if (!may_issue (c, low, i)) {
        if (i == low)
          c->st.waits++;
        continue;
      }
      if (issue (c, i) == -1)
        c->dead = true;
    }
    while (low < c->nr_gen && c->hist[low].state != ST_NEW)
      low++;
    if (c->nr_inflight > 0 && nbd_poll (c->nbd, -1) == -1) {
      fprintf (stderr, "conn %u: poll: %s\n", c->id, nbd_get_error ());
      c->st.errors++;
      c->dead = true;
      break;
    }
  }

  if (flush_one_file) {
    unsigned t;

    /* Nobody flushes any more: the tail writes stay acknowledged and
     * not flushed.  One at a time, so none waits for another.
     */
    pthread_barrier_wait (&end_barrier);
    for (t = 0; t < TAIL_WRITES && !c->dead; ++t) {
      gen_tail_write (c);
      if (issue (c, c->nr_gen - 1) == -1)
        c->dead = true;
      while (!c->dead && c->nr_inflight > 0)
        if (nbd_poll (c->nbd, -1) == -1) {
          fprintf (stderr, "conn %u: poll: %s\n", c->id, nbd_get_error ());
          c->st.errors++;
          c->dead = true;
        }
    }
    /* Every connection has its answers; then connection 0 alone sends
     * the one FLUSH that must cover them all.
     */
    pthread_barrier_wait (&end_barrier);
    if (c->id == 0 && !no_final_flush) {
      if (c->dead) {
        fprintf (stderr, "conn 0: dead, cannot send the final flush\n");
        c->st.errors++;
      }
      else if (nbd_flush (c->nbd, 0) == -1) {
        fprintf (stderr, "conn 0: the one final flush: %s\n",
                 nbd_get_error ());
        c->st.errors++;
      }
    }
    return NULL;
  }

  /* Make everything durable and visible to a fresh connection. */
  if (!c->dead && can_flush && nbd_flush (c->nbd, 0) == -1) {
    fprintf (stderr, "conn %u: final flush: %s\n", c->id, nbd_get_error ());
    c->st.errors++;
  }
  return NULL;
}

/* Deal out the chunks: those holding a boundary first, round-robin, so
 * that every connection gets some boundary-crossing work; then the rest.
 */
static void
assign_chunks (void)
{
  uint64_t ci, cs;
  size_t i;
  unsigned next = 0;

  nr_all_chunks = (size + chunk - 1) / chunk;
  chunk_owner = malloc (nr_all_chunks * sizeof *chunk_owner);
  if (chunk_owner == NULL) {
    perror ("malloc");
    exit (EXIT_FAILURE);
  }
  for (ci = 0; ci < nr_all_chunks; ++ci)
    chunk_owner[ci] = UINT_MAX;
  for (i = 0; i < nr_boundaries; ++i) {
    uint64_t b = boundaries[i];

    if (b == 0 || b >= size || b % chunk == 0)
      continue;
    ci = b / chunk;
    if (chunk_owner[ci] == UINT_MAX)
      chunk_owner[ci] = next++ % nr_conns;
  }
  for (ci = 0; ci < nr_all_chunks; ++ci)
    if (chunk_owner[ci] == UINT_MAX)
      chunk_owner[ci] = next++ % nr_conns;

  for (ci = 0; ci < nr_all_chunks; ++ci) {
    struct conn *c = &conns[chunk_owner[ci]];

    c->chunks = realloc (c->chunks, (c->nr_chunks + 1) * sizeof *c->chunks);
    if (c->chunks == NULL) {
      perror ("realloc");
      exit (EXIT_FAILURE);
    }
    c->chunks[c->nr_chunks++] = ci;
  }

  /* Boundaries strictly inside a chunk (an op can cross them). */
  for (i = 0; i < nr_boundaries; ++i) {
    uint64_t b = boundaries[i];
    struct conn *c;

    if (b == 0 || b >= size)
      continue;
    ci = b / chunk;
    cs = ci * chunk;
    if (b == cs)
      continue;
    c = &conns[chunk_owner[ci]];
    c->bounds = realloc (c->bounds, (c->nr_bounds + 1) * sizeof *c->bounds);
    if (c->bounds == NULL) {
      perror ("realloc");
      exit (EXIT_FAILURE);
    }
    c->bounds[c->nr_bounds++] = b;
  }
}

static struct nbd_handle *
connect_to (const char *uri)
{
  struct nbd_handle *nbd = nbd_create ();

  if (nbd == NULL) {
    fprintf (stderr, "nbd_create: %s\n", nbd_get_error ());
    exit (EXIT_FAILURE);
  }
  if (fua_all) {
    /* Let FUA through on reads and flushes: the server must accept it. */
    int s = nbd_get_strict_mode (nbd);

    if (nbd_set_strict_mode (nbd, s & ~LIBNBD_STRICT_FLAGS) == -1) {
      fprintf (stderr, "nbd_set_strict_mode: %s\n", nbd_get_error ());
      exit (EXIT_FAILURE);
    }
  }
  if (nbd_connect_uri (nbd, uri) == -1) {
    fprintf (stderr, "%s: %s\n", uri, nbd_get_error ());
    exit (EXIT_FAILURE);
  }
  return nbd;
}

static int
cap (struct nbd_handle *nbd, int (*fn) (struct nbd_handle *))
{
  int r = fn (nbd);

  if (r == -1) {
    fprintf (stderr, "%s\n", nbd_get_error ());
    exit (EXIT_FAILURE);
  }
  return r;
}

/* Read the whole export on a fresh connection and compare the known
 * bytes.  Unknown bytes of the reference take the value read, so that
 * --dump is the image the backing files must hold.  Returns the number
 * of mismatching runs.
 */
static uint64_t
verify_export (struct stats *st)
{
  struct nbd_handle *nbd = connect_to (uris[0]);
  const uint64_t step = 4 * MiB;
  uint8_t *buf = malloc (step);
  uint64_t off, runs = 0;

  if (buf == NULL) {
    perror ("malloc");
    exit (EXIT_FAILURE);
  }
  for (off = 0; off < size; off += step) {
    uint64_t n = size - off < step ? size - off : step;
    uint64_t i = 0;
    int r, tries = 0;

    /* With --expect-errors the backend may fail reads now and then. */
    while ((r = nbd_pread (nbd, buf, n, off, 0)) == -1 &&
           expect_errors && ++tries < 10)
      ;
    if (r == -1) {
      fprintf (stderr, "verify: pread %" PRIu64 "+%" PRIu64 ": %s\n",
               off, n, nbd_get_error ());
      st->errors++;
      runs++;                   /* Not verified is not "ok". */
      continue;
    }
    /* Check per ownership chunk so that the history searched is the
     * owner's.
     */
    while (i < n) {
      uint64_t o = off + i;
      uint64_t e = (o / chunk + 1) * chunk;
      uint64_t len, bad;
      struct conn *c = &conns[owner_of (o)];

      if (e > off + n)
        e = off + n;
      len = e - o;
      bad = check_range (c, c->nr_gen, "verify", o, &buf[i], len);
      if (bad) {
        runs++;
        st->mismatch_bytes += bad;
      }
      for (uint64_t j = 0; j < len; ++j)
        if (!known[o + j])
          ref[o + j] = buf[i + j];
      i += len;
    }
  }
  free (buf);
  nbd_shutdown (nbd, 0);
  nbd_close (nbd);
  return runs;
}

static void
write_file (const char *file, const uint8_t *data, uint64_t n)
{
  FILE *fp = fopen (file, "w");

  if (fp == NULL || fwrite (data, 1, n, fp) != n || fclose (fp) != 0) {
    perror (file);
    exit (EXIT_FAILURE);
  }
}

static uint64_t
parse_size (const char *opt, const char *s)
{
  char *end;
  unsigned long long v;

  errno = 0;
  v = strtoull (s, &end, 0);
  if (errno || end == s)
    goto bad;
  switch (*end) {
  case '\0': break;
  case 'k': case 'K': v *= KiB; end++; break;
  case 'm': case 'M': v *= MiB; end++; break;
  case 'g': case 'G': v *= 1024 * MiB; end++; break;
  default: goto bad;
  }
  if (*end == 'i' || *end == 'b' || *end == 'B')
    end++;
  if (*end != '\0')
    goto bad;
  return v;

 bad:
  fprintf (stderr, "model-test: %s: cannot parse '%s'\n", opt, s);
  exit (2);
}

static void __attribute__ ((__noreturn__))
usage (FILE *fp, int code)
{
  fprintf (fp,
"Usage: model-test --uri URI [options]\n"
"Random concurrent NBD operations checked against a reference image.\n"
"\n"
"  --uri URI             NBD URI; repeat to spread connections over URIs\n"
"  --connections K       connections, each its own thread (default 4)\n"
"  --qd Q                queue depth per connection (default 16)\n"
"  --ops N               operations per connection (default 1000)\n"
"  --seed S              random seed (default 1)\n"
"  --size BYTES          use the first BYTES of the export (default: all)\n"
"  --chunk BYTES         ownership interleave (default 260K)\n"
"  --boundary OFF        bias some ops to cross OFF (repeatable)\n"
"  --boundary-step STEP  ... and every multiple of STEP (stripes)\n"
"  --init FILE           initial contents (default: zeros)\n"
"  --verify-all          at the end, read the whole export and compare\n"
"  --dump FILE           write the expected image (implies --verify-all;\n"
"                        unspecified bytes hold what the export returned)\n"
"  --mask FILE           one byte per export byte: 1 known, 0 unspecified\n"
"  --fua-all             also send FUA on some reads and flushes\n"
"  --expect-errors       failed ops are not fatal; their ranges become\n"
"                        unspecified\n"
"  --bad-range LO:HI     the server fails every write, zero and trim that\n"
"                        touches [LO, HI) (implies --expect-errors): each\n"
"                        FLUSH answer is checked against the record of\n"
"                        lost writes\n"
"  --self-test           corrupt the reference once: the run must fail\n"
"                        (with --cross-reads: a cross read's expected copy)\n"
"  --cross-reads         half of the reads target other connections' chunks\n"
"                        (needs a multi-conn server coherent across them);\n"
"                        checked when the owner had no mutation in flight\n"
"  --flush-one-then-wait FILE\n"
"                        at the end every connection writes a few plain\n"
"                        writes, then only connection 0 flushes, once; then\n"
"                        write --dump/--mask (without reading the export\n"
"                        back), create FILE and wait, connected, until killed\n"
"  --no-final-flush      with --flush-one-then-wait: not even that flush\n"
"                        (a negative control)\n"
"  -v, --verbose         trace every operation\n"
"Exit status: 0 no mismatch and no unexpected error, 1 otherwise,\n"
"2 usage error.\n");
  exit (code);
}

int
main (int argc, char *argv[])
{
  enum {
    OPT_URI = 256, OPT_CONNS, OPT_QD, OPT_OPS, OPT_SEED, OPT_SIZE, OPT_CHUNK,
    OPT_BOUNDARY, OPT_BOUNDARY_STEP, OPT_INIT, OPT_VERIFY_ALL, OPT_DUMP,
    OPT_MASK, OPT_FUA_ALL, OPT_EXPECT_ERRORS, OPT_BAD_RANGE, OPT_SELF_TEST,
    OPT_CROSS_READS, OPT_FLUSH_ONE, OPT_NO_FINAL_FLUSH,
  };
  static const struct option long_options[] = {
    { "uri", required_argument, NULL, OPT_URI },
    { "connections", required_argument, NULL, OPT_CONNS },
    { "qd", required_argument, NULL, OPT_QD },
    { "ops", required_argument, NULL, OPT_OPS },
    { "seed", required_argument, NULL, OPT_SEED },
    { "size", required_argument, NULL, OPT_SIZE },
    { "chunk", required_argument, NULL, OPT_CHUNK },
    { "boundary", required_argument, NULL, OPT_BOUNDARY },
    { "boundary-step", required_argument, NULL, OPT_BOUNDARY_STEP },
    { "init", required_argument, NULL, OPT_INIT },
    { "verify-all", no_argument, NULL, OPT_VERIFY_ALL },
    { "dump", required_argument, NULL, OPT_DUMP },
    { "mask", required_argument, NULL, OPT_MASK },
    { "fua-all", no_argument, NULL, OPT_FUA_ALL },
    { "expect-errors", no_argument, NULL, OPT_EXPECT_ERRORS },
    { "bad-range", required_argument, NULL, OPT_BAD_RANGE },
    { "self-test", no_argument, NULL, OPT_SELF_TEST },
    { "cross-reads", no_argument, NULL, OPT_CROSS_READS },
    { "flush-one-then-wait", required_argument, NULL, OPT_FLUSH_ONE },
    { "no-final-flush", no_argument, NULL, OPT_NO_FINAL_FLUSH },
    { "verbose", no_argument, NULL, 'v' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 }
  };
  struct nbd_handle *first;
  struct stats tot;
  struct timespec t0, t1;
  uint64_t export_size, verify_runs = 0;
  unsigned i, k;
  int opt;
  bool ok;

  while ((opt = getopt_long (argc, argv, "vh", long_options, NULL)) != -1) {
    switch (opt) {
    case OPT_URI:
      uris = realloc (uris, (nr_uris + 1) * sizeof *uris);
      if (uris == NULL) {
        perror ("realloc");
        exit (EXIT_FAILURE);
      }
      uris[nr_uris++] = optarg;
      break;
    case OPT_CONNS: nr_conns = parse_size ("--connections", optarg); break;
    case OPT_QD: qd = parse_size ("--qd", optarg); break;
    case OPT_OPS: nr_ops = parse_size ("--ops", optarg); break;
    case OPT_SEED: seed = parse_size ("--seed", optarg); break;
    case OPT_SIZE: size = parse_size ("--size", optarg); break;
    case OPT_CHUNK: chunk = parse_size ("--chunk", optarg); break;
    case OPT_BOUNDARY:
      boundaries = realloc (boundaries,
                            (nr_boundaries + 1) * sizeof *boundaries);
      if (boundaries == NULL) {
        perror ("realloc");
        exit (EXIT_FAILURE);
      }
      boundaries[nr_boundaries++] = parse_size ("--boundary", optarg);
      break;
    case OPT_BOUNDARY_STEP:
      boundary_step = parse_size ("--boundary-step", optarg);
      break;
    case OPT_INIT: init_file = optarg; break;
    case OPT_VERIFY_ALL: verify_all = true; break;
    case OPT_DUMP: dump_file = optarg; verify_all = true; break;
    case OPT_MASK: mask_file = optarg; break;
    case OPT_FUA_ALL: fua_all = true; break;
    case OPT_EXPECT_ERRORS: expect_errors = true; break;
    case OPT_BAD_RANGE:
      if (sscanf (optarg, "%" SCNu64 ":%" SCNu64, &bad_lo, &bad_hi) != 2 ||
          bad_lo >= bad_hi) {
        fprintf (stderr, "model-test: --bad-range %s: expected LO:HI with "
                 "LO < HI\n", optarg);
        exit (EXIT_FAILURE);
      }
      expect_errors = true;
      break;
    case OPT_SELF_TEST: self_test = true; verify_all = true; break;
    case OPT_CROSS_READS: cross_reads = true; break;
    case OPT_FLUSH_ONE: flush_one_file = optarg; break;
    case OPT_NO_FINAL_FLUSH: no_final_flush = true; break;
    case 'v': verbose = true; break;
    case 'h': usage (stdout, EXIT_SUCCESS);
    default: usage (stderr, 2);
    }
  }
  if (optind != argc || nr_uris == 0 || nr_conns == 0 || qd == 0 ||
      chunk < 4096 || (no_final_flush && !flush_one_file))
    usage (stderr, 2);
  /* Reading the export back could write out what the one FLUSH missed. */
  if (flush_one_file)
    verify_all = false;

  first = connect_to (uris[0]);
  export_size = nbd_get_size (first);
  if ((int64_t) export_size == -1) {
    fprintf (stderr, "nbd_get_size: %s\n", nbd_get_error ());
    exit (EXIT_FAILURE);
  }
  if (size == 0)
    size = export_size;
  if (size > export_size) {
    fprintf (stderr, "model-test: --size %" PRIu64 " > export size %"
             PRIu64 "\n", size, export_size);
    exit (2);
  }
  if (nbd_is_read_only (first) == 1) {
    fprintf (stderr, "model-test: export is read-only\n");
    exit (2);
  }
  can_fua = cap (first, nbd_can_fua);
  can_zero = cap (first, nbd_can_zero);
  can_trim = cap (first, nbd_can_trim);
  can_fast_zero = cap (first, nbd_can_fast_zero);
  can_flush = cap (first, nbd_can_flush);
  if (flush_one_file && !can_flush) {
    fprintf (stderr, "model-test: --flush-one-then-wait: the server "
             "cannot flush\n");
    exit (2);
  }
  if (cross_reads && cap (first, nbd_can_multi_conn) == 0)
    fprintf (stderr, "model-test: warning: --cross-reads, but the server "
             "does not advertise multi-conn\n");

  if (boundary_step) {
    uint64_t b;

    for (b = boundary_step; b < size; b += boundary_step) {
      boundaries = realloc (boundaries,
                            (nr_boundaries + 1) * sizeof *boundaries);
      if (boundaries == NULL) {
        perror ("realloc");
        exit (EXIT_FAILURE);
      }
      boundaries[nr_boundaries++] = b;
    }
  }

  ref = calloc (size, 1);
  known = malloc (size);
  if (ref == NULL || known == NULL) {
    perror ("malloc");
    exit (EXIT_FAILURE);
  }
  memset (known, 1, size);
  if (init_file) {
    FILE *fp = fopen (init_file, "r");

    if (fp == NULL) {
      perror (init_file);
      exit (EXIT_FAILURE);
    }
    if (fread (ref, 1, size, fp) == 0 && ferror (fp)) {
      perror (init_file);
      exit (EXIT_FAILURE);
    }
    fclose (fp);
    init_image = malloc (size);
    if (init_image == NULL) {
      perror ("malloc");
      exit (EXIT_FAILURE);
    }
    memcpy (init_image, ref, size);
  }

  conns = calloc (nr_conns, sizeof *conns);
  if (conns == NULL) {
    perror ("calloc");
    exit (EXIT_FAILURE);
  }
  assign_chunks ();
  chunk_gen = calloc (nr_all_chunks, sizeof *chunk_gen);
  chunk_muts = calloc (nr_all_chunks, sizeof *chunk_muts);
  if (chunk_gen == NULL || chunk_muts == NULL) {
    perror ("calloc");
    exit (EXIT_FAILURE);
  }
  if (flush_one_file) {
    int err = pthread_barrier_init (&end_barrier, NULL, nr_conns);

    if (err) {
      errno = err;
      perror ("pthread_barrier_init");
      exit (EXIT_FAILURE);
    }
  }
  for (k = 0; k < nr_conns; ++k) {
    struct conn *c = &conns[k];

    c->id = k;
    c->nbd = k == 0 ? first : connect_to (uris[k % nr_uris]);
    if (k > 0 && nbd_get_size (c->nbd) != (int64_t) export_size) {
      fprintf (stderr, "%s: export size differs\n", uris[k % nr_uris]);
      exit (EXIT_FAILURE);
    }
    c->rng = mix64 (seed * 0x100000001b3ULL + k);
    c->hist = calloc (nr_ops + TAIL_WRITES, sizeof *c->hist);
    c->slots = calloc (qd, sizeof *c->slots);
    if (c->hist == NULL || c->slots == NULL) {
      perror ("calloc");
      exit (EXIT_FAILURE);
    }
    c->corrupt_after = nr_ops / 2;
    if (c->nr_chunks == 0) {
      fprintf (stderr, "model-test: export too small for %u connections "
               "of --chunk %" PRIu64 "\n", nr_conns, chunk);
      exit (2);
    }
  }
  /* --self-test corrupts one connection only. */
  for (k = 1; k < nr_conns; ++k)
    conns[k].corrupted = true;

  clock_gettime (CLOCK_MONOTONIC, &t0);
  {
    pthread_t *threads = calloc (nr_conns, sizeof *threads);
    int err;

    if (threads == NULL) {
      perror ("calloc");
      exit (EXIT_FAILURE);
    }
    for (k = 0; k < nr_conns; ++k) {
      err = pthread_create (&threads[k], NULL, conn_thread, &conns[k]);
      if (err) {
        errno = err;
        perror ("pthread_create");
        exit (EXIT_FAILURE);
      }
    }
    for (k = 0; k < nr_conns; ++k)
      pthread_join (threads[k], NULL);
    free (threads);
  }
  memset (&tot, 0, sizeof tot);
  for (k = 0; k < nr_conns; ++k) {
    const struct stats *s = &conns[k].st;

    for (i = 0; i < NR_KINDS; ++i) {
      tot.ops[i] += s->ops[i];
      tot.bytes[i] += s->bytes[i];
    }
    tot.fua += s->fua;
    tot.nohole += s->nohole;
    tot.fastzero += s->fastzero;
    tot.fastzero_enotsup += s->fastzero_enotsup;
    tot.waits += s->waits;
    tot.depth_sum += s->depth_sum;
    tot.mismatches += s->mismatches;
    tot.mismatch_bytes += s->mismatch_bytes;
    tot.errors += s->errors;
    tot.flush_checked += s->flush_checked;
    tot.flush_wrong += s->flush_wrong;
    tot.flush_must_fail += s->flush_must_fail;
    tot.flush_must_succeed += s->flush_must_succeed;
    tot.cross_checked += s->cross_checked;
    tot.cross_busy += s->cross_busy;
    tot.cross_changed += s->cross_changed;
  }

  /* Verify while the connections are still open: their final flush
   * must have put everything in the backing store, so a server that
   * writes back only when a connection closes fails here.
   */
  if (verify_all)
    verify_runs = verify_export (&tot);
  if (!flush_one_file)
    for (k = 0; k < nr_conns; ++k) {
      nbd_shutdown (conns[k].nbd, 0);
      nbd_close (conns[k].nbd);
    }
  clock_gettime (CLOCK_MONOTONIC, &t1);

  if (dump_file)
    write_file (dump_file, ref, size);
  if (mask_file)
    write_file (mask_file, known, size);

  ok = tot.mismatches == 0 && verify_runs == 0 &&
    (expect_errors || tot.errors == 0) && tot.flush_wrong == 0;
  if (bad_hi > 0)
    printf ("model-test: the record: %" PRIu64 " FLUSH answers checked (%"
            PRIu64 " had to fail, %" PRIu64 " had to succeed), %" PRIu64
            " wrong\n", tot.flush_checked, tot.flush_must_fail,
            tot.flush_must_succeed, tot.flush_wrong);
  if (cross_reads)
    printf ("model-test: cross reads: checked=%" PRIu64 " skipped=%" PRIu64
            " (busy at issue %" PRIu64 ", changed during the read %" PRIu64
            ")\n",
            tot.cross_checked, tot.cross_busy + tot.cross_changed,
            tot.cross_busy, tot.cross_changed);
  printf ("model-test: seed=%" PRIu64 " conns=%u qd=%u size=%" PRIu64
          ": read=%" PRIu64 " write=%" PRIu64 " zero=%" PRIu64
          " trim=%" PRIu64 " flush=%" PRIu64
          " (fua=%" PRIu64 " no-hole=%" PRIu64 " fast-zero=%" PRIu64
          "/%" PRIu64 " enotsup) %.1f MiB written, waits=%" PRIu64
          " depth=%.1f"
          "; mismatches=%" PRIu64 " (%" PRIu64 " bytes) verify=%s"
          " errors=%" PRIu64 "%s; %.2fs: %s\n",
          seed, nr_conns, qd, size,
          tot.ops[OP_READ], tot.ops[OP_WRITE], tot.ops[OP_ZERO],
          tot.ops[OP_TRIM], tot.ops[OP_FLUSH],
          tot.fua, tot.nohole, tot.fastzero, tot.fastzero_enotsup,
          tot.bytes[OP_WRITE] / (double) MiB, tot.waits,
          tot.depth_sum / (nr_ops ? (double) nr_conns * nr_ops : 1.),
          tot.mismatches + verify_runs, tot.mismatch_bytes,
          !verify_all ? "skipped" : verify_runs ? "FAILED" : "ok",
          tot.errors, expect_errors ? " (expected)" : "",
          (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
          ok ? "PASS" : "FAIL");

  if (flush_one_file) {
    FILE *fp;

    fflush (stdout);
    if (!ok)
      return EXIT_FAILURE;
    /* The dump is written; the one FLUSH was answered.  Tell the shell
     * test, and keep the connections open until we are killed.
     */
    fp = fopen (flush_one_file, "w");
    if (fp == NULL || fclose (fp) != 0) {
      perror (flush_one_file);
      exit (EXIT_FAILURE);
    }
    for (;;)
      pause ();
  }
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
