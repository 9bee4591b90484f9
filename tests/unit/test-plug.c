/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* test-plug: merging, sorting, conflicts and limits of the plug, then a
 * randomized model test: random writes, zeros, trims and flushes go
 * through plug_add/plug_take_runs and are "applied" to a byte array,
 * which must always match a flat reference updated in arrival order.
 */

#include <config.h>

#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plug.h"
#include "tap.h"

#define ARRAY_SIZE(a) (sizeof (a) / sizeof ((a)[0]))

/* Generous limits, so that only the limits a case sets matter. */
/* Free every run in *runs and empty it (the engine frees each run as
 * it completes; a test frees them all at once).
 */
static void
plug_runs_free (plug_run_vector *runs)
{
  size_t i;

  for (i = 0; i < runs->len; ++i)
    plug_run_free (runs->ptr[i]);
  plug_run_vector_reset (runs);
}

static const struct plug_limits big_limits = {
  .max_requests = 1000, .max_bytes = UINT64_C (1) << 40,
  .max_merge = UINT64_C (1) << 40, .max_iov = 1024,
};

static char
op_char (enum plug_op op)
{
  switch (op) {
  case PLUG_OP_WRITE: return 'W';
  case PLUG_OP_ZERO: return 'Z';
  case PLUG_OP_TRIM: return 'T';
  }
  abort ();
}

/* Describe runs as "backing:<op><flags>@offset+count x n" separated by
 * spaces, e.g. "0:W0@0+300x3 1:Z1@512+512x1", checking on the way that
 * each run agrees with its members.  Returns a malloc'd string.
 */
static char *
describe_runs (const plug_run_vector *runs)
{
  char *s = NULL;
  size_t len = 0, i, j;
  FILE *fp = open_memstream (&s, &len);

  assert (fp != NULL);
  for (i = 0; i < runs->len; ++i) {
    const struct plug_run *run = runs->ptr[i];
    uint64_t sum = 0;
    bool members_ok = run->n >= 1 && run->reqs[0]->offset == run->offset;

    for (j = 0; j < run->n; ++j) {
      const struct plug_piece *r = run->reqs[j];

      sum += r->count;
      if (r->op != run->op || r->flags != run->flags ||
          r->backing != run->backing)
        members_ok = false;
      if (j > 0 && run->reqs[j-1]->offset + run->reqs[j-1]->count !=
          r->offset)
        members_ok = false;
    }
    if (sum != run->count)
      members_ok = false;
    fprintf (fp, "%s%" PRIu32 ":%c%" PRIu32 "@%" PRIu64 "+%" PRIu64 "x%zu%s",
             i ? " " : "", run->backing, op_char (run->op), run->flags,
             run->offset, run->count, run->n,
             members_ok ? "" : "(BAD MEMBERS)");
  }
  assert (fclose (fp) == 0);
  return s;
}

/* Table of fixed cases: requests in arrival order, and the runs that
 * unplugging must give.
 */
struct fixed_req {
  char op;                      /* 'W', 'Z', 'T'; 0 ends the list. */
  uint32_t flags, backing;
  uint64_t offset, count;
};

static const struct {
  const char *name;
  uint64_t max_merge;           /* 0: no limit. */
  size_t max_iov;               /* 0: no limit. */
  struct fixed_req reqs[12];
  const char *expect;
} fixed_cases[] = {
  { "adjacent writes merge into one run", 0, 0,
    { { 'W', 0, 0, 0, 100 }, { 'W', 0, 0, 100, 100 },
      { 'W', 0, 0, 200, 100 } },
    "0:W0@0+300x3" },
  { "adjacent writes arriving backwards merge", 0, 0,
    { { 'W', 0, 0, 200, 100 }, { 'W', 0, 0, 100, 100 },
      { 'W', 0, 0, 0, 100 } },
    "0:W0@0+300x3" },
  { "adjacent writes arriving shuffled merge", 0, 0,
    { { 'W', 0, 0, 1000, 1 }, { 'W', 0, 0, 0, 1000 },
      { 'W', 0, 0, 1002, 7 }, { 'W', 0, 0, 1001, 1 } },
    "0:W0@0+1009x4" },
  { "a 1-byte gap does not merge", 0, 0,
    { { 'W', 0, 0, 0, 100 }, { 'W', 0, 0, 101, 100 } },
    "0:W0@0+100x1 0:W0@101+100x1" },
  { "write then zero do not merge", 0, 0,
    { { 'W', 0, 0, 0, 100 }, { 'Z', 0, 0, 100, 100 } },
    "0:W0@0+100x1 0:Z0@100+100x1" },
  { "zero then write do not merge", 0, 0,
    { { 'Z', 0, 0, 0, 100 }, { 'W', 0, 0, 100, 100 } },
    "0:Z0@0+100x1 0:W0@100+100x1" },
  { "trim then zero do not merge", 0, 0,
    { { 'T', 0, 0, 0, 512 }, { 'Z', 0, 0, 512, 512 } },
    "0:T0@0+512x1 0:Z0@512+512x1" },
  { "a zero between writes splits them", 0, 0,
    { { 'W', 0, 0, 0, 100 }, { 'W', 0, 0, 200, 100 },
      { 'Z', 0, 0, 100, 100 } },
    "0:W0@0+100x1 0:Z0@100+100x1 0:W0@200+100x1" },
  { "zeros merge", 0, 0,
    { { 'Z', 0, 0, 512, 512 }, { 'Z', 0, 0, 0, 512 } },
    "0:Z0@0+1024x2" },
  { "trims merge", 0, 0,
    { { 'T', 0, 0, 0, 4096 }, { 'T', 0, 0, 4096, 4096 } },
    "0:T0@0+8192x2" },
  { "zeros with different flags do not merge", 0, 0,
    { { 'Z', 0, 0, 0, 512 }, { 'Z', PLUG_F_MAY_TRIM, 0, 512, 512 } },
    "0:Z0@0+512x1 0:Z1@512+512x1" },
  { "fast and slow zeros do not merge", 0, 0,
    { { 'Z', PLUG_F_MAY_TRIM, 0, 0, 512 },
      { 'Z', PLUG_F_MAY_TRIM|PLUG_F_FAST, 0, 512, 512 } },
    "0:Z1@0+512x1 0:Z3@512+512x1" },
  { "zeros with the same flags merge", 0, 0,
    { { 'Z', PLUG_F_MAY_TRIM, 0, 0, 512 },
      { 'Z', PLUG_F_MAY_TRIM, 0, 512, 512 } },
    "0:Z1@0+1024x2" },
  { "different backings do not merge (end meets start)", 0, 0,
    { { 'W', 0, 0, 0, 100 }, { 'W', 0, 1, 100, 100 } },
    "0:W0@0+100x1 1:W0@100+100x1" },
  { "different backings, same offsets", 0, 0,
    { { 'W', 0, 1, 0, 100 }, { 'W', 0, 0, 0, 100 } },
    "0:W0@0+100x1 1:W0@0+100x1" },
  { "sorted by backing then offset", 0, 0,
    { { 'W', 0, 2, 500, 10 }, { 'W', 0, 0, 300, 10 },
      { 'T', 0, 1, 0, 10 }, { 'W', 0, 0, 0, 10 }, { 'Z', 0, 2, 0, 10 },
      { 'W', 0, 1, 20, 10 } },
    "0:W0@0+10x1 0:W0@300+10x1 1:T0@0+10x1 1:W0@20+10x1 "
    "2:Z0@0+10x1 2:W0@500+10x1" },
  { "max_merge splits runs", 1000, 0,
    { { 'W', 0, 0, 0, 300 }, { 'W', 0, 0, 300, 300 },
      { 'W', 0, 0, 600, 300 }, { 'W', 0, 0, 900, 300 },
      { 'W', 0, 0, 1200, 300 }, { 'W', 0, 0, 1500, 300 },
      { 'W', 0, 0, 1800, 300 } },
    "0:W0@0+900x3 0:W0@900+900x3 0:W0@1800+300x1" },
  { "max_merge is inclusive", 1000, 0,
    { { 'W', 0, 0, 0, 250 }, { 'W', 0, 0, 250, 250 },
      { 'W', 0, 0, 500, 250 }, { 'W', 0, 0, 750, 250 },
      { 'W', 0, 0, 1000, 1 } },
    "0:W0@0+1000x4 0:W0@1000+1x1" },
  { "max_merge splits zeros too", 1000, 0,
    { { 'Z', 0, 0, 0, 600 }, { 'Z', 0, 0, 600, 600 } },
    "0:Z0@0+600x1 0:Z0@600+600x1" },
  { "max_iov splits write runs", 0, 2,
    { { 'W', 0, 0, 0, 100 }, { 'W', 0, 0, 100, 100 },
      { 'W', 0, 0, 200, 100 }, { 'W', 0, 0, 300, 100 },
      { 'W', 0, 0, 400, 100 } },
    "0:W0@0+200x2 0:W0@200+200x2 0:W0@400+100x1" },
  /* max_iov is the most members of a *write* run (IOV_MAX): a zero or
   * trim run is one command without a buffer.
   */
  { "max_iov does not split zero runs", 0, 2,
    { { 'Z', 0, 0, 0, 100 }, { 'Z', 0, 0, 100, 100 },
      { 'Z', 0, 0, 200, 100 } },
    "0:Z0@0+300x3" },
  { "max_iov 1 never merges writes", 0, 1,
    { { 'W', 0, 0, 0, 100 }, { 'W', 0, 0, 100, 100 } },
    "0:W0@0+100x1 0:W0@100+100x1" },
  { "a request bigger than max_merge is its own run", 1000, 0,
    { { 'W', 0, 0, 0, 100 }, { 'W', 0, 0, 100, 5000 },
      { 'W', 0, 0, 5100, 100 }, { 'W', 0, 0, 5200, 100 } },
    "0:W0@0+100x1 0:W0@100+5000x1 0:W0@5100+200x2" },
  { "a zero bigger than max_merge is its own run", 1000, 0,
    { { 'Z', 0, 0, 0, 1 << 20 } },
    "0:Z0@0+1048576x1" },
};

static struct plug_piece *
make_req (char op, uint32_t flags, uint32_t backing, uint64_t offset,
          uint64_t count)
{
  struct plug_piece *r = calloc (1, sizeof *r);

  assert (r != NULL);
  r->op = op == 'W' ? PLUG_OP_WRITE : op == 'Z' ? PLUG_OP_ZERO :
    PLUG_OP_TRIM;
  r->flags = flags;
  r->backing = backing;
  r->offset = offset;
  r->count = count;
  return r;
}

static void
test_fixed (void)
{
  size_t i, j;

  for (i = 0; i < ARRAY_SIZE (fixed_cases); ++i) {
    struct plug_limits lim = big_limits;
    struct plug p;
    struct plug_piece *reqs[12];
    plug_run_vector runs = empty_vector;
    size_t n;
    bool multi = false;
    char *got;

    if (fixed_cases[i].max_merge)
      lim.max_merge = fixed_cases[i].max_merge;
    if (fixed_cases[i].max_iov)
      lim.max_iov = fixed_cases[i].max_iov;
    assert (plug_init (&p, &lim, 3) == 0);

    for (n = 0; n < 12 && fixed_cases[i].reqs[n].op; ++n) {
      const struct fixed_req *f = &fixed_cases[i].reqs[n];

      reqs[n] = make_req (f->op, f->flags, f->backing, f->offset, f->count);
      /* No case holds overlapping requests: a conflict here is a bug of
       * plug_overlaps (reported, and the request is left out).
       */
      if (!ok (!plug_conflicts (&p, reqs[n]),
               "%s: request %zu does not conflict", fixed_cases[i].name, n))
        continue;
      assert (plug_add (&p, reqs[n]) == 0);
      if (f->backing != fixed_cases[i].reqs[0].backing)
        multi = true;
    }
    ok (p.multiple_backings == multi, "%s: multiple_backings is %s",
        fixed_cases[i].name, multi ? "set" : "clear");
    assert (plug_take_runs (&p, &runs) == 0);
    got = describe_runs (&runs);
    ok (strcmp (got, fixed_cases[i].expect) == 0, "%s: %s (expected %s)",
        fixed_cases[i].name, got, fixed_cases[i].expect);
    free (got);
    plug_runs_free (&runs);
    plug_free (&p);
    for (j = 0; j < n; ++j)
      free (reqs[j]);
  }
}

/* plug_conflicts against a plug holding [100,200) and [300,400) of
 * backing 0 and [0,50) of backing 1.
 */
static void
test_conflicts (void)
{
  static const struct {
    uint32_t backing;
    uint64_t offset, count;
    bool conflicts;
    const char *name;
  } cases[] = {
    { 0, 150, 10, true, "inside" },
    { 0, 100, 100, true, "the same range" },
    { 0, 0, 1000, true, "covering everything" },
    { 0, 50, 51, true, "1-byte overlap at the start" },
    { 0, 199, 1, true, "1-byte overlap at the end" },
    { 0, 199, 102, true, "spanning the gap, 1 byte each side" },
    { 0, 0, 100, false, "adjacent before" },
    { 0, 200, 100, false, "the whole gap, adjacent both sides" },
    { 0, 250, 10, false, "inside the gap" },
    { 0, 400, 100, false, "adjacent after the last" },
    { 0, 1000, 1, false, "far beyond" },
    { 0, 150, 0, false, "count 0" },
    { 1, 100, 100, false, "another backing, same range" },
    { 1, 49, 1, true, "another backing, its last byte" },
    { 1, 50, 1000, false, "another backing, adjacent" },
    { 2, 0, 1000, false, "an empty backing" },
  };
  struct plug p;
  struct plug_piece *held[3];
  plug_run_vector runs = empty_vector;
  size_t i;

  assert (plug_init (&p, &big_limits, 3) == 0);
  held[0] = make_req ('W', 0, 0, 300, 100);
  held[1] = make_req ('Z', 0, 1, 0, 50);
  held[2] = make_req ('T', 0, 0, 100, 100);
  for (i = 0; i < 3; ++i)
    assert (plug_add (&p, held[i]) == 0);

  for (i = 0; i < ARRAY_SIZE (cases); ++i) {
    struct plug_piece q = {
      .op = PLUG_OP_WRITE, .backing = cases[i].backing,
      .offset = cases[i].offset, .count = cases[i].count,
    };

    ok (plug_overlaps (&p, cases[i].backing, cases[i].offset,
                       cases[i].count) == cases[i].conflicts &&
        (cases[i].count == 0 || plug_conflicts (&p, &q) == cases[i].conflicts),
        "conflicts: %s [%" PRIu64 ", +%" PRIu64 ") on %" PRIu32 ": %s",
        cases[i].name, cases[i].offset, cases[i].count, cases[i].backing,
        cases[i].conflicts ? "yes" : "no");
  }

  /* After taking the runs, nothing conflicts any more: the bounds are
   * reset as well as the list.
   */
  assert (plug_take_runs (&p, &runs) == 0);
  ok (plug_is_empty (&p) && p.bytes == 0 && !p.multiple_backings &&
      p.oldest_ns == 0, "take_runs empties the plug");
  ok (runs.len == 3, "take_runs gave 3 runs");
  for (i = 0; i < ARRAY_SIZE (cases); ++i)
    if (plug_overlaps (&p, cases[i].backing, cases[i].offset,
                       cases[i].count))
      break;
  ok (i == ARRAY_SIZE (cases), "after take_runs, nothing conflicts");
  for (i = 0; i < 3; ++i)
    ok (p.bounds[i].lo == p.bounds[i].hi,
        "after take_runs, bounds of backing %zu are empty", i);

  /* A request that conflicted before can now be added, and the bounds
   * start again from it alone.
   */
  {
    struct plug_piece *r = make_req ('W', 0, 0, 150, 10);
    struct plug_piece *far = make_req ('W', 0, 0, 300, 10);

    ok (!plug_conflicts (&p, r) && plug_add (&p, r) == 0,
        "a request that conflicted before take is accepted after");
    ok (!plug_conflicts (&p, far),
        "old bounds are forgotten: [300,310) does not conflict");
    ok (p.bounds[0].lo == 150 && p.bounds[0].hi == 160,
        "bounds restart from the first request");
    plug_runs_free (&runs);
    assert (plug_take_runs (&p, &runs) == 0);
    free (r);
    free (far);
  }

  /* Taking from an empty plug gives nothing and succeeds. */
  plug_runs_free (&runs);
  ok (plug_take_runs (&p, &runs) == 0 && runs.len == 0,
      "take_runs of an empty plug gives no run");
  plug_runs_free (&runs);
  plug_free (&p);
  for (i = 0; i < 3; ++i)
    free (held[i]);
}

/* plug_full at its limits. */
static void
test_full (void)
{
  struct plug_limits lim = big_limits;
  struct plug p;
  struct plug_piece *r[8];
  plug_run_vector runs = empty_vector;
  enum plug_reason why;
  size_t i;
  bool good;

  /* max_requests = 3. */
  lim.max_requests = 3;
  assert (plug_init (&p, &lim, 1) == 0);
  ok (!plug_full (&p, &why), "empty plug is not full");
  good = true;
  for (i = 0; i < 3; ++i) {
    r[i] = make_req ('T', 0, 0, i * 10, 5);
    assert (plug_add (&p, r[i]) == 0);
    if (i < 2 && plug_full (&p, &why))
      good = false;
  }
  ok (good, "2 requests of 3: not full");
  why = PLUG_UNPLUG_FLUSH;
  ok (plug_full (&p, &why) && why == PLUG_UNPLUG_MAX_REQUESTS,
      "3 requests of 3: full, max-requests");
  assert (plug_take_runs (&p, &runs) == 0);
  ok (!plug_full (&p, &why), "not full after take_runs");
  plug_runs_free (&runs);
  plug_free (&p);
  for (i = 0; i < 3; ++i)
    free (r[i]);

  /* max_bytes = 1000 counts write bytes only. */
  lim = big_limits;
  lim.max_bytes = 1000;
  assert (plug_init (&p, &lim, 2) == 0);
  r[0] = make_req ('Z', 0, 0, 0, 1 << 20);
  r[1] = make_req ('T', 0, 1, 0, 1 << 20);
  r[2] = make_req ('W', 0, 0, 1 << 20, 600);
  r[3] = make_req ('W', 0, 1, 1 << 20, 399);
  r[4] = make_req ('W', 0, 1, (1 << 20) + 399, 1);
  for (i = 0; i < 2; ++i)
    assert (plug_add (&p, r[i]) == 0);
  ok (!plug_full (&p, &why) && p.bytes == 0,
      "2 MiB of zero and trim: not full, 0 write bytes");
  assert (plug_add (&p, r[2]) == 0);
  assert (plug_add (&p, r[3]) == 0);
  ok (!plug_full (&p, &why) && p.bytes == 999, "999 write bytes: not full");
  assert (plug_add (&p, r[4]) == 0);
  why = PLUG_UNPLUG_FLUSH;
  ok (plug_full (&p, &why) && why == PLUG_UNPLUG_MAX_BYTES &&
      p.bytes == 1000, "1000 write bytes: full, max-bytes");
  assert (plug_take_runs (&p, &runs) == 0);
  ok (!plug_full (&p, &why) && p.bytes == 0, "not full after take_runs");
  plug_runs_free (&runs);
  plug_free (&p);
  for (i = 0; i < 5; ++i)
    free (r[i]);
}

static void
test_misc (void)
{
  static const struct {
    const char *name;
    uint64_t max_requests, max_bytes, max_merge;
    size_t max_iov;
    uint32_t nr;
  } bad[] = {
    { "max_requests 0", 0, 1, 1, 1, 1 },
    { "max_bytes 0", 1, 0, 1, 1, 1 },
    { "max_merge 0", 1, 1, 0, 1, 1 },
    { "max_iov 0", 1, 1, 1, 0, 1 },
    { "no backing", 1, 1, 1, 1, 0 },
  };
  struct plug p;
  size_t i, j;

  for (i = 0; i < ARRAY_SIZE (bad); ++i) {
    struct plug_limits lim = {
      .max_requests = bad[i].max_requests, .max_bytes = bad[i].max_bytes,
      .max_merge = bad[i].max_merge, .max_iov = bad[i].max_iov,
    };

    errno = 0;
    ok (plug_init (&p, &lim, bad[i].nr) == -1 && errno == EINVAL &&
        p.bounds == NULL, "plug_init refuses %s", bad[i].name);
  }

  /* Reason names: all present and distinct. */
  {
    bool good = true;

    for (i = 0; i < PLUG_NR_REASONS; ++i) {
      const char *n = plug_reason_name (i);

      if (n == NULL || *n == '\0')
        good = false;
      for (j = 0; good && j < i; ++j)
        if (strcmp (n, plug_reason_name (j)) == 0)
          good = false;
    }
    ok (good, "%d reason names, all distinct", PLUG_NR_REASONS);
  }

  /* seq is arrival order, oldest_ns the first arrival. */
  {
    struct plug_piece *r[3];
    plug_run_vector runs = empty_vector;

    assert (plug_init (&p, &big_limits, 1) == 0);
    for (i = 0; i < 3; ++i) {
      r[i] = make_req ('W', 0, 0, 100 - i * 10, 10);
      r[i]->arrival_ns = 1000 + i;
      assert (plug_add (&p, r[i]) == 0);
    }
    ok (r[0]->seq < r[1]->seq && r[1]->seq < r[2]->seq,
        "seq follows arrival order");
    ok (p.oldest_ns == 1000, "oldest_ns is the first arrival");
    assert (plug_take_runs (&p, &runs) == 0);
    ok (runs.len == 1 && runs.ptr[0]->n == 3 &&
        runs.ptr[0]->reqs[0] == r[2] && runs.ptr[0]->reqs[1] == r[1] &&
        runs.ptr[0]->reqs[2] == r[0],
        "the run's members are the requests, in offset order");
    plug_runs_free (&runs);
    plug_free (&p);
    for (i = 0; i < 3; ++i)
      free (r[i]);
  }

  /* plug_sort orders by (backing, offset, seq). */
  {
    struct plug_piece a = { .backing = 1, .offset = 0, .seq = 0 };
    struct plug_piece b = { .backing = 0, .offset = 9, .seq = 1 };
    struct plug_piece c = { .backing = 0, .offset = 9, .seq = 0 };
    struct plug_piece d = { .backing = 0, .offset = 2, .seq = 7 };
    struct plug_piece *v[] = { &a, &b, &c, &d };

    plug_sort (v, 4);
    ok (v[0] == &d && v[1] == &c && v[2] == &b && v[3] == &a,
        "plug_sort orders by backing, offset, seq");
  }

  /* plug_merge of nothing. */
  {
    plug_run_vector runs = empty_vector;

    ok (plug_merge (NULL, 0, &big_limits, &runs) == 0 && runs.len == 0,
        "plug_merge of no request gives no run");
  }
}

/* ---------------------------------------------------------------- */
/* The randomized model test. */

#define NR_BACKINGS 3
#define FILE_SIZE (64 * 1024)

static uint64_t rng_state;

static uint64_t
rnd (void)
{
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * UINT64_C (2685821657736338717);
}

static uint64_t
rnd_below (uint64_t n)
{
  return rnd () % n;
}

/* A request of the model: the plug_piece plus what the test owns. */
struct mreq {
  struct plug_piece r;
  uint8_t *data;                /* Write data (r.buf). */
  bool applied;
};

/* The byte arrays.  known == 0: trimmed, contents unspecified. */
struct image {
  uint8_t data[NR_BACKINGS][FILE_SIZE];
  uint8_t known[NR_BACKINGS][FILE_SIZE];
};

struct model {
  struct plug p;
  struct plug_limits lim;
  struct image ref;             /* Updated at plug_add, arrival order. */
  struct image app;             /* Updated when runs are applied. */
  struct mreq **held;           /* The model's own list of held requests. */
  size_t nr_held, held_cap;
  uint64_t held_bytes;          /* Write bytes held. */
  uint64_t next_end[NR_BACKINGS]; /* For sequential streams. */

  /* What happened, to prove the test exercised something. */
  unsigned long steps, unplugs, runs, merged_runs, max_run_n;
  unsigned long conflicts, full_reason[PLUG_NR_REASONS], flushes;
  unsigned long compares;

  /* The first failure, if any. */
  bool failed;
  char why[512];
};

static void __attribute__ ((format (printf, 2, 3)))
fail (struct model *m, const char *fmt, ...)
{
  va_list ap;

  if (m->failed)
    return;
  m->failed = true;
  va_start (ap, fmt);
  vsnprintf (m->why, sizeof m->why, fmt, ap);
  va_end (ap);
}

static void
image_write (struct image *im, const struct plug_piece *r, const void *buf)
{
  switch (r->op) {
  case PLUG_OP_WRITE:
    memcpy (&im->data[r->backing][r->offset], buf, r->count);
    memset (&im->known[r->backing][r->offset], 1, r->count);
    break;
  case PLUG_OP_ZERO:
    memset (&im->data[r->backing][r->offset], 0, r->count);
    memset (&im->known[r->backing][r->offset], 1, r->count);
    break;
  case PLUG_OP_TRIM:
    /* Leave the data: a trimmed range reads back as anything. */
    memset (&im->known[r->backing][r->offset], 0, r->count);
    break;
  }
}

/* Compare the applied image with the reference, skipping bytes the
 * reference does not know.  The known maps must be equal too: since
 * nothing overlapping is ever held together, the plug cannot reorder a
 * trim and a write of the same byte.
 */
static void
compare_images (struct model *m, const char *when)
{
  uint32_t b;
  size_t i;

  m->compares++;
  for (b = 0; b < NR_BACKINGS; ++b) {
    if (memcmp (m->ref.known[b], m->app.known[b], FILE_SIZE) != 0) {
      for (i = 0; m->ref.known[b][i] == m->app.known[b][i]; ++i)
        ;
      fail (m, "step %lu (%s): backing %" PRIu32 " byte %zu is %s in the "
            "reference but %s when applied", m->steps, when, b, i,
            m->ref.known[b][i] ? "known" : "trimmed",
            m->app.known[b][i] ? "known" : "trimmed");
      return;
    }
    if (memcmp (m->ref.data[b], m->app.data[b], FILE_SIZE) == 0)
      continue;
    for (i = 0; i < FILE_SIZE; ++i)
      if (m->ref.known[b][i] && m->ref.data[b][i] != m->app.data[b][i]) {
        fail (m, "step %lu (%s): backing %" PRIu32 " byte %zu is 0x%02x "
              "but 0x%02x in the reference", m->steps, when, b, i,
              m->app.data[b][i], m->ref.data[b][i]);
        return;
      }
  }
}

/* Check one run and apply it to m->app. */
static void
apply_run (struct model *m, const struct plug_run *run)
{
  uint64_t sum = 0, off = run->offset;
  size_t j;

  if (run->n == 0) {
    fail (m, "step %lu: empty run", m->steps);
    return;
  }
  if (run->reqs[0]->offset != run->offset)
    fail (m, "step %lu: run offset %" PRIu64 " but first member at %"
          PRIu64, m->steps, run->offset, run->reqs[0]->offset);
  for (j = 0; j < run->n; ++j) {
    struct plug_piece *r = run->reqs[j];
    struct mreq *mr = r->opaque;

    if (r->op != run->op || r->flags != run->flags ||
        r->backing != run->backing)
      fail (m, "step %lu: member %zu of a run differs in op, flags or "
            "backing", m->steps, j);
    if (r->offset != off)
      fail (m, "step %lu: member %zu of a run at %" PRIu64 ", expected %"
            PRIu64 " (not contiguous or not sorted)", m->steps, j,
            r->offset, off);
    if (mr->applied)
      fail (m, "step %lu: request seq %" PRIu64 " dispatched twice",
            m->steps, r->seq);
    mr->applied = true;
    off = r->offset + r->count;
    sum += r->count;
  }
  if (sum != run->count)
    fail (m, "step %lu: run count %" PRIu64 " but members sum to %" PRIu64,
          m->steps, run->count, sum);
  if (run->count > m->lim.max_merge && run->n > 1)
    fail (m, "step %lu: run of %" PRIu64 " bytes and %zu members exceeds "
          "max_merge %" PRIu64, m->steps, run->count, run->n,
          m->lim.max_merge);
  if (run->op == PLUG_OP_WRITE && run->n > m->lim.max_iov)
    fail (m, "step %lu: write run of %zu members exceeds max_iov %zu",
          m->steps, run->n, m->lim.max_iov);
  if (m->failed)
    return;

  /* Apply: a write run is one backend write of the members' buffers
   * copied contiguously, as the glue's iovec would be.
   */
  for (j = 0, off = run->offset; j < run->n; ++j) {
    const struct plug_piece *r = run->reqs[j];
    struct plug_piece piece = *r;

    piece.offset = off;
    image_write (&m->app, &piece, r->buf);
    off += r->count;
  }

  m->runs++;
  if (run->n > 1)
    m->merged_runs++;
  if (run->n > m->max_run_n)
    m->max_run_n = run->n;
}

/* Could b have been merged into a? (greedy merging leaves no such
 * neighbours).
 */
static bool
mergeable (const struct model *m, const struct plug_run *a,
           const struct plug_run *b)
{
  return a->backing == b->backing && a->op == b->op &&
    a->flags == b->flags && a->offset + a->count == b->offset &&
    a->count + b->reqs[0]->count <= m->lim.max_merge &&
    (a->op != PLUG_OP_WRITE || a->n < m->lim.max_iov);
}

/* Unplug: take the runs, check their order, apply them, check the
 * images and free the requests.
 */
static void
unplug (struct model *m, const char *when)
{
  plug_run_vector runs = empty_vector;
  bool multi = false;
  size_t i, total = 0;

  for (i = 1; i < m->nr_held; ++i)
    if (m->held[i]->r.backing != m->held[0]->r.backing)
      multi = true;
  if (m->p.multiple_backings != multi)
    fail (m, "step %lu: multiple_backings is %d but the plug holds %s",
          m->steps, m->p.multiple_backings,
          multi ? "several backings" : "one backing");

  if (plug_take_runs (&m->p, &runs) == -1) {
    fail (m, "step %lu: plug_take_runs: %m", m->steps);
    return;
  }
  if (!plug_is_empty (&m->p) || m->p.bytes != 0 || m->p.multiple_backings)
    fail (m, "step %lu: the plug is not empty after take_runs", m->steps);

  for (i = 0; i < runs.len; ++i) {
    const struct plug_run *a = i ? runs.ptr[i-1] : NULL;
    const struct plug_run *b = runs.ptr[i];

    total += b->n;
    if (a && (a->backing > b->backing ||
              (a->backing == b->backing && a->offset + a->count > b->offset)))
      fail (m, "step %lu: run %zu (%" PRIu32 "@%" PRIu64 ") dispatched "
            "after run %zu (%" PRIu32 "@%" PRIu64 ")", m->steps, i,
            b->backing, b->offset, i - 1, a->backing, a->offset);
    if (a && mergeable (m, a, b))
      fail (m, "step %lu: runs %zu and %zu should have been merged",
            m->steps, i - 1, i);
    apply_run (m, b);
  }
  if (total != m->nr_held)
    fail (m, "step %lu: %zu requests held but %zu dispatched", m->steps,
          m->nr_held, total);

  for (i = 0; i < m->nr_held; ++i) {
    if (!m->held[i]->applied)
      fail (m, "step %lu: request seq %" PRIu64 " was never dispatched",
            m->steps, m->held[i]->r.seq);
    free (m->held[i]->data);
    free (m->held[i]);
  }
  m->nr_held = 0;
  m->held_bytes = 0;
  plug_runs_free (&runs);
  m->unplugs++;

  compare_images (m, when);
}

/* The naive conflict check: scan the model's own list. */
static bool
naive_conflicts (const struct model *m, const struct plug_piece *r)
{
  size_t i;

  for (i = 0; i < m->nr_held; ++i) {
    const struct plug_piece *h = &m->held[i]->r;

    if (h->backing == r->backing && h->offset < r->offset + r->count &&
        r->offset < h->offset + h->count)
      return true;
  }
  return false;
}

static struct mreq *
random_request (struct model *m)
{
  struct mreq *mr = calloc (1, sizeof *mr);
  struct plug_piece *r = &mr->r;
  uint64_t len;
  unsigned k = rnd_below (100);

  assert (mr != NULL);
  mr->r.opaque = mr;
  r->op = k < 70 ? PLUG_OP_WRITE : k < 88 ? PLUG_OP_ZERO : PLUG_OP_TRIM;
  if (r->op == PLUG_OP_ZERO)
    r->flags = rnd_below (3) == 0 ? 0 : PLUG_F_MAY_TRIM;
  r->backing = rnd_below (NR_BACKINGS);

  /* Lengths: mostly sector multiples, sometimes odd, sometimes big. */
  switch (rnd_below (4)) {
  case 0: len = 1 + rnd_below (64); break;
  case 1: len = 1 + rnd_below (4096); break;
  case 2: len = 512 * (1 + rnd_below (8)); break;
  default: len = 4096 * (1 + rnd_below (4)); break;
  }
  /* Mostly continue a sequential stream, the case merging is for, so
   * that the plug fills up to its limits; otherwise anywhere (which
   * makes overlaps and so conflicts).
   */
  if (rnd_below (5) != 0 && m->next_end[r->backing] < FILE_SIZE)
    r->offset = m->next_end[r->backing];
  else
    r->offset = rnd_below (FILE_SIZE);
  if (len > FILE_SIZE - r->offset)
    len = FILE_SIZE - r->offset;
  r->count = len;
  m->next_end[r->backing] = r->offset + r->count;
  if (rnd_below (50) == 0)
    m->next_end[r->backing] = rnd_below (FILE_SIZE);

  if (r->op == PLUG_OP_WRITE) {
    uint64_t i;

    mr->data = malloc (len);
    assert (mr->data != NULL);
    for (i = 0; i < len; ++i)
      mr->data[i] = rnd ();
    r->buf = mr->data;
  }
  return mr;
}

static void
model_step (struct model *m)
{
  struct mreq *mr;
  bool conflicts, full, expect_full;
  enum plug_reason why = PLUG_NR_REASONS, expect_why = PLUG_NR_REASONS;

  m->steps++;
  if (rnd_below (100) < 3) {
    m->flushes++;
    unplug (m, "flush");
    return;
  }

  mr = random_request (m);
  conflicts = plug_conflicts (&m->p, &mr->r);
  if (conflicts != naive_conflicts (m, &mr->r))
    fail (m, "step %lu: plug_conflicts says %d for %" PRIu32 "@%" PRIu64
          "+%" PRIu64 ", the naive scan disagrees", m->steps, conflicts,
          mr->r.backing, mr->r.offset, mr->r.count);
  if (conflicts) {
    m->conflicts++;
    unplug (m, "overlap");
  }

  if (plug_add (&m->p, &mr->r) == -1) {
    fail (m, "step %lu: plug_add: %m", m->steps);
    free (mr->data);
    free (mr);
    return;
  }
  if (m->nr_held == m->held_cap) {
    /* Only if plug_full failed to fire at max_requests. */
    fail (m, "step %lu: %zu requests held", m->steps, m->nr_held);
    free (mr->data);
    free (mr);
    return;
  }
  m->held[m->nr_held++] = mr;
  if (mr->r.op == PLUG_OP_WRITE)
    m->held_bytes += mr->r.count;
  image_write (&m->ref, &mr->r, mr->r.buf);

  /* plug_full must say full exactly at the limits. */
  expect_full = true;
  if (m->nr_held >= m->lim.max_requests)
    expect_why = PLUG_UNPLUG_MAX_REQUESTS;
  else if (m->held_bytes >= m->lim.max_bytes)
    expect_why = PLUG_UNPLUG_MAX_BYTES;
  else
    expect_full = false;
  full = plug_full (&m->p, &why);
  if (full != expect_full || (full && why != expect_why))
    fail (m, "step %lu: plug_full = %d (%d) with %zu requests and %" PRIu64
          " write bytes held, limits %" PRIu64 "/%" PRIu64, m->steps, full,
          (int) why, m->nr_held, m->held_bytes, m->lim.max_requests,
          m->lim.max_bytes);
  if (full) {
    m->full_reason[why]++;
    unplug (m, plug_reason_name (why));
  }
}

static void
test_model (void)
{
  static const struct {
    uint64_t seed;
    unsigned steps;
    struct plug_limits lim;
  } runs[] = {
    { 1, 20000, { .max_requests = 32, .max_bytes = 48 * 1024,
                  .max_merge = 16 * 1024, .max_iov = 4 } },
    { 2, 20000, { .max_requests = 16, .max_bytes = 1 << 20,
                  .max_merge = 1 << 20, .max_iov = 1024 } },
    { 0xfeedface, 20000, { .max_requests = 1000, .max_bytes = 32 * 1024,
                           .max_merge = 4096, .max_iov = 2 } },
    { 20240601, 20000, { .max_requests = 24, .max_bytes = 32 * 1024,
                         .max_merge = 1, .max_iov = 1 } },
    { 77, 20000, { .max_requests = 8, .max_bytes = 8 * 1024,
                   .max_merge = 2048, .max_iov = 3 } },
  };
  size_t i, k;

  for (i = 0; i < ARRAY_SIZE (runs); ++i) {
    struct model *m = calloc (1, sizeof *m);

    assert (m != NULL);
    rng_state = runs[i].seed;
    m->lim = runs[i].lim;
    assert (plug_init (&m->p, &m->lim, NR_BACKINGS) == 0);
    /* The model can hold at most max_requests at once, plus one. */
    m->held_cap = m->lim.max_requests + 1;
    m->held = calloc (m->held_cap, sizeof *m->held);
    assert (m->held != NULL);
    /* Both images start as the same known random contents. */
    for (k = 0; k < sizeof m->ref.data; ++k)
      ((uint8_t *) m->ref.data)[k] = rnd ();
    memcpy (m->app.data, m->ref.data, sizeof m->ref.data);
    memset (m->ref.known, 1, sizeof m->ref.known);
    memset (m->app.known, 1, sizeof m->app.known);

    while (m->steps < runs[i].steps && !m->failed)
      model_step (m);
    unplug (m, "close");

    ok (!m->failed,
        "model seed %" PRIu64 " (max_requests %" PRIu64 ", max_bytes %"
        PRIu64 ", max_merge %" PRIu64 ", max_iov %zu): %lu steps, "
        "%lu unplugs, %lu images compared%s%s",
        runs[i].seed, m->lim.max_requests, m->lim.max_bytes,
        m->lim.max_merge, m->lim.max_iov, m->steps, m->unplugs,
        m->compares, m->failed ? ": " : "", m->why);
    /* The test must have exercised what it checks. */
    ok (m->conflicts > 0 && m->flushes > 0,
        "model seed %" PRIu64 ": %lu overlap unplugs, %lu flushes",
        runs[i].seed, m->conflicts, m->flushes);
    ok (m->full_reason[PLUG_UNPLUG_MAX_REQUESTS] +
        m->full_reason[PLUG_UNPLUG_MAX_BYTES] > 0,
        "model seed %" PRIu64 ": plug_full fired (max-requests %lu, "
        "max-bytes %lu)", runs[i].seed,
        m->full_reason[PLUG_UNPLUG_MAX_REQUESTS],
        m->full_reason[PLUG_UNPLUG_MAX_BYTES]);
    if (m->lim.max_merge > 1)
      ok (m->merged_runs > 0,
          "model seed %" PRIu64 ": %lu of %lu runs merged requests "
          "(largest %lu)", runs[i].seed, m->merged_runs, m->runs,
          m->max_run_n);
    else
      ok (m->merged_runs == 0,
          "model seed %" PRIu64 ": max_merge 1 never merges (%lu runs)",
          runs[i].seed, m->runs);

    plug_free (&m->p);
    free (m->held);
    free (m);
  }
}

/* A stream shuffled a little is held in offset order as it comes; one
 * request far out of place turns the plug to arrival order, and the
 * unplug sorts.  Every other 4 KiB block of file 0, reversed in groups
 * of 16 (each lands up to 15 places back, the first of a group at the
 * front of the plug).
 */
static void
test_order (void)
{
  struct plug_limits lim = big_limits;
  struct plug p;
  struct plug_piece *r[68];
  plug_run_vector runs = empty_vector;
  const uint64_t B = 4096;
  bool sorted = true;
  size_t i, n = 0;

  lim.max_requests = 256;               /* A plug that scans. */
  assert (plug_init (&p, &lim, 2) == 0);
  for (i = 0; i < 64; ++i) {
    uint64_t blk = (i / 16) * 16 + 15 - i % 16;

    r[n] = make_req ('W', 0, 0, 2 * blk * B, B);
    assert (!plug_conflicts (&p, r[n]) && plug_add (&p, r[n]) == 0);
    n++;
  }
  r[n] = make_req ('W', 0, 1, 0, B);    /* File 1 goes after file 0. */
  assert (!plug_conflicts (&p, r[n]) && plug_add (&p, r[n]) == 0);
  n++;
  r[n] = make_req ('W', 0, 0, 128 * B, B); /* One place back. */
  assert (!plug_conflicts (&p, r[n]) && plug_add (&p, r[n]) == 0);
  n++;
  ok (p.order == PLUG_IN_ORDER, "%zu writes shuffled by up to 15 places "
      "keep the plug in order", n);
  for (i = 1; i < p.reqs.len; ++i)
    if (p.reqs.ptr[i - 1]->backing > p.reqs.ptr[i]->backing ||
        (p.reqs.ptr[i - 1]->backing == p.reqs.ptr[i]->backing &&
         p.reqs.ptr[i - 1]->offset >= p.reqs.ptr[i]->offset))
      sorted = false;
  ok (sorted && p.reqs.len == n, "held by (file, offset)");
  ok (!plug_overlaps (&p, 0, 21 * B, B) && !plug_overlaps (&p, 0, 127 * B, B)
      && !plug_overlaps (&p, 1, B, 100 * B) && !plug_overlaps (&p, 0, 200 * B, B),
      "in order, gaps and the ranges beyond overlap nothing");
  ok (plug_overlaps (&p, 0, 0, 1) && plug_overlaps (&p, 0, 21 * B, B + 1) &&
      plug_overlaps (&p, 0, 127 * B, 2 * B) && plug_overlaps (&p, 1, 0, B) &&
      plug_overlaps (&p, 0, 128 * B + B - 1, 1),
      "in order, held bytes overlap");
  ok (!plug_overlaps_seq (&p, 0, 0, B, r[14]->seq) &&
      plug_overlaps_seq (&p, 0, 0, B, r[15]->seq),
      "in order, the seq bound is kept: block 0 came 16th");

  r[n] = make_req ('W', 0, 0, 21 * B, B); /* 54 places back. */
  assert (!plug_conflicts (&p, r[n]) && plug_add (&p, r[n]) == 0);
  n++;
  ok (p.order == PLUG_ARRIVAL, "one write %d places back turns the plug "
      "to arrival order", 54);
  ok (plug_overlaps (&p, 0, 21 * B, 1) && !plug_overlaps (&p, 0, 23 * B, B),
      "in arrival order, lookups still hold");
  assert (plug_take_runs (&p, &runs) == 0);
  for (i = 1; i < runs.len; ++i)
    if (runs.ptr[i - 1]->backing > runs.ptr[i]->backing ||
        (runs.ptr[i - 1]->backing == runs.ptr[i]->backing &&
         runs.ptr[i - 1]->offset >= runs.ptr[i]->offset))
      sorted = false;
  ok (sorted && runs.len == n - 2 && p.order == PLUG_IN_ORDER,
      "the unplug sorts: %zu runs in (file, offset) order (%zu), and the "
      "empty plug is in order again", runs.len, n - 2);
  plug_runs_free (&runs);
  plug_free (&p);
  for (i = 0; i < n; ++i)
    free (r[i]);
}

int
main (void)
{
  test_fixed ();
  test_conflicts ();
  test_full ();
  test_misc ();
  test_model ();
  test_order ();
  return done_testing ();
}
