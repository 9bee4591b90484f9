/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* test-stats: merging, the JSON file and the one-line summary. */

#include <config.h>

#undef NDEBUG
#include <assert.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "stats.h"
#include "tap.h"

/* A TAP skip is a test point that the harness counts as skipped, not
 * passed: tap.h has no helper for it, so print it here and keep tap.h's
 * counter in step.
 */
static void
skip (const char *why)
{
  tap_n++;
  printf ("ok %u # SKIP %s\n", tap_n, why);
  fflush (stdout);
}

static void
fill (struct plug_stats *s, uint64_t base)
{
  size_t i;

  memset (s, 0, sizeof *s);
  s->connections = base + 1;
  for (i = 0; i < STATS_NR_CLIENT; ++i) {
    s->client[i].ops = base + 10 + i;
    s->client[i].bytes = base + 100 + i;
  }
  for (i = 0; i < STATS_NR_BACKEND; ++i) {
    s->backend[i].ops = base + 20 + i;
    s->backend[i].bytes = base + 200 + i;
  }
  for (i = 0; i < PLUG_NR_REASONS; ++i)
    s->unplugs[i] = base + 30 + i;
  s->largest_requests = base + 2;
  s->largest_bytes = base + 3;
  s->held_total_ns = base + 4;
  s->held_max_ns = base + 5;
  s->eagain = base + 6;
  s->timer_fired = base + 7;
  s->gave_up = base + 8;
  s->bytes_copied = base + 40;
  s->errors = base + 9;
}

static void
test_merge (void)
{
  struct plug_stats a, b;
  bool good = true;
  size_t i;

  fill (&a, 1000);
  fill (&b, 5);
  /* b has a bigger maximum in one field and a smaller one in the other. */
  b.largest_requests = 5000;
  b.held_max_ns = 7000;
  stats_merge (&a, &b);

  ok (a.connections == 1001 + 6, "connections summed");
  for (i = 0; i < STATS_NR_CLIENT; ++i)
    if (a.client[i].ops != 1010 + i + 15 + i ||
        a.client[i].bytes != 1100 + i + 105 + i)
      good = false;
  ok (good, "client counters summed");
  good = true;
  for (i = 0; i < STATS_NR_BACKEND; ++i)
    if (a.backend[i].ops != 1020 + i + 25 + i ||
        a.backend[i].bytes != 1200 + i + 205 + i)
      good = false;
  ok (good, "backend counters summed");
  good = true;
  for (i = 0; i < PLUG_NR_REASONS; ++i)
    if (a.unplugs[i] != 1030 + i + 35 + i)
      good = false;
  ok (good, "unplug reasons summed");
  ok (a.largest_requests == 5000, "largest_requests is a maximum (from)");
  ok (a.largest_bytes == 1003, "largest_bytes is a maximum (into)");
  ok (a.held_total_ns == 1004 + 9, "held_total_ns summed");
  ok (a.held_max_ns == 7000, "held_max_ns is a maximum");
  ok (a.eagain == 1006 + 11 && a.timer_fired == 1007 + 12 &&
      a.gave_up == 1008 + 13 && a.errors == 1009 + 14,
      "retry counters summed");
  ok (a.bytes_copied == 1040 + 45, "bytes_copied summed");

  /* Merging into zeros copies. */
  {
    struct plug_stats z;

    memset (&z, 0, sizeof z);
    fill (&b, 5);
    stats_merge (&z, &b);
    ok (memcmp (&z, &b, sizeof z) == 0, "merge into zeros is a copy");
  }
}

/* Is python3 usable to validate JSON?  Returns the path or NULL. */
static const char *
find_python (void)
{
  if (access ("/usr/bin/python3", X_OK) == 0)
    return "/usr/bin/python3";
  return NULL;
}

/* Feed json to a python script (json.load and asserts).  Returns the
 * exit status of python (0: parsed and checked).  quiet hides python's
 * traceback, for the case that is meant to fail.
 */
static int
python_check (const char *python, const char *json, const char *script,
              bool quiet)
{
  char cmd[4096];
  FILE *fp;
  int st;

  snprintf (cmd, sizeof cmd, "%s -c '%s'%s", python, script,
            quiet ? " 2>/dev/null" : "");
  fp = popen (cmd, "w");
  assert (fp != NULL);
  fputs (json, fp);
  st = pclose (fp);
  return WIFEXITED (st) ? WEXITSTATUS (st) : 255;
}

static void
test_json (void)
{
  struct plug_stats s;
  const char *python;
  char *j;
  char needle[64];

  fill (&s, 0);
  s.unplugs[PLUG_UNPLUG_MAX_BYTES] = UINT64_MAX;
  j = stats_json (&s, "writeback");
  ok (j != NULL, "stats_json returns a string");
  assert (j != NULL);

  ok (strstr (j, "\"mode\": \"writeback\"") != NULL, "json has the mode");
  ok (strstr (j, "\"connections\": 1,") != NULL, "json has connections");
  ok (strstr (j, "\"max-bytes\": 18446744073709551615") != NULL,
      "json prints a uint64 counter in full");
  snprintf (needle, sizeof needle, "\"overlap\": %d",
            30 + PLUG_UNPLUG_OVERLAP);
  ok (strstr (j, needle) != NULL, "json has unplug reasons");
  ok (strstr (j, "\"gave_up\": 8") != NULL, "json has retry counters");
  ok (strstr (j, "\"bytes_copied\": 40,") != NULL, "json has bytes_copied");
  ok (j[0] == '{' && j[strlen (j) - 1] == '\n' && j[strlen (j) - 2] == '}',
      "json is one object");

  python = find_python ();
  if (python == NULL) {
    skip ("/usr/bin/python3 not found: JSON not parsed");
    skip ("/usr/bin/python3 not found: JSON values not checked");
  }
  else {
    char script[1024];

    ok (python_check (python, j,
                      "import json,sys; json.load(sys.stdin)", false) == 0,
        "json parses with %s", python);

    snprintf (script, sizeof script,
              "import json,sys; d = json.load(sys.stdin); "
              "assert d[\"mode\"] == \"writeback\"; "
              "assert d[\"client\"][\"fua\"][\"bytes\"] == 105; "
              "assert d[\"backend\"][\"sync\"][\"ops\"] == 24; "
              "assert d[\"unplugs\"][\"max-bytes\"] == 2**64-1; "
              "assert d[\"unplugs\"][\"memory\"] == %d; "
              "assert len(d[\"unplugs\"]) == %d; "
              "assert d[\"largest_plug\"][\"requests\"] == 2; "
              "assert d[\"held_ns\"][\"max\"] == 5; "
              "assert d[\"retry\"][\"errors\"] == 9",
              30 + PLUG_UNPLUG_MEMORY, PLUG_NR_REASONS);
    ok (python_check (python, j, script, false) == 0,
        "json values read back through python");
    /* And the bad case must fail, so that the check above means
     * something.
     */
    ok (python_check (python, "{ \"a\": 1, }",
                      "import json,sys; json.load(sys.stdin)", true) != 0,
        "python rejects broken JSON (the check can fail)");
  }
  free (j);

  /* All zeros. */
  memset (&s, 0, sizeof s);
  j = stats_json (&s, "hold");
  assert (j != NULL);
  ok (strstr (j, "\"mode\": \"hold\"") != NULL &&
      strstr (j, "\"flush\": 0") != NULL, "json of zeros");
  if (python == NULL)
    skip ("/usr/bin/python3 not found: JSON not parsed");
  else
    ok (python_check (python, j,
                      "import json,sys; json.load(sys.stdin)", false) == 0,
        "json of zeros parses");
  free (j);
}

static void
test_line (void)
{
  struct plug_stats s;
  char *l;
  size_t i;

  memset (&s, 0, sizeof s);
  s.client[STATS_C_WRITE].ops = 90;
  s.client[STATS_C_ZERO].ops = 6;
  s.client[STATS_C_TRIM].ops = 4;
  s.client[STATS_C_READ].ops = 1000;
  s.backend[STATS_B_WRITE].ops = 30;
  s.backend[STATS_B_ZERO].ops = 10;
  s.unplugs[PLUG_UNPLUG_FLUSH] = 3;
  s.unplugs[PLUG_UNPLUG_MAX_DELAY] = 17;
  s.eagain = 2;
  l = stats_line (&s);
  assert (l != NULL);
  ok (strstr (l, "writes+zeros+trims=100 ") != NULL,
      "line counts client writes, zeros and trims (%s)", l);
  ok (strstr (l, "backend=40 ") != NULL, "line counts backend writes");
  ok (strstr (l, "(2.50 per backend op)") != NULL, "line has the ratio");
  ok (strstr (l, " flush=3") != NULL && strstr (l, " max-delay=17") != NULL,
      "line names the non-zero reasons");
  for (i = 0; i < PLUG_NR_REASONS; ++i) {
    char needle[64];

    if (s.unplugs[i])
      continue;
    snprintf (needle, sizeof needle, " %s=", plug_reason_name (i));
    if (strstr (l, needle) != NULL)
      break;
  }
  ok (i == PLUG_NR_REASONS, "line omits the reasons that are zero");
  ok (strstr (l, "eagain=2") != NULL, "line has eagain");
  ok (strchr (l, '\n') == NULL, "line is one line");
  free (l);

  /* No backend op: no division by zero. */
  memset (&s, 0, sizeof s);
  l = stats_line (&s);
  assert (l != NULL);
  ok (strstr (l, "(0.00 per backend op)") != NULL &&
      strstr (l, "unplugs: largest=") != NULL,
      "line of zeros (%s)", l);
  free (l);
}


/* Histogram buckets: table-driven, with the edges of each bucket. */
static void
test_hist_buckets (void)
{
  static const struct { uint64_t us; unsigned bucket; } cases[] = {
    { 0, 0 }, { 1, 1 }, { 2, 2 }, { 3, 2 }, { 4, 3 }, { 7, 3 }, { 8, 4 },
    { 1023, 10 }, { 1024, 11 }, { 1000000, 20 },
    { (UINT64_C (1) << 30) - 1, 30 }, { UINT64_C (1) << 30, 31 },
    { UINT64_MAX, STATS_HIST_BUCKETS - 1 },
  };
  size_t i;
  unsigned b;
  bool good = true;

  for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    b = stats_hist_bucket (cases[i].us);
    ok (b == cases[i].bucket, "%" PRIu64 " us -> bucket %u (got %u)",
        cases[i].us, cases[i].bucket, b);
  }
  /* Every duration lies below its bucket's upper bound and at or above
   * the one before.
   */
  for (i = 0; i < 62; ++i) {
    uint64_t us = (UINT64_C (1) << i) + i;

    b = stats_hist_bucket (us);
    if (us >= stats_hist_upper_us (b) ||
        (b > 0 && us < stats_hist_upper_us (b - 1)))
      good = false;
  }
  ok (good, "each duration lies inside its bucket's bounds");
  ok (stats_hist_upper_us (0) == 1 && stats_hist_upper_us (10) == 1024 &&
      stats_hist_upper_us (STATS_HIST_BUCKETS - 1) == UINT64_MAX,
      "upper bounds: 1 us, 2^i us, open at the last");
}

static void
test_hist_add_percentile (void)
{
  struct stats_hist h = { 0 }, g = { 0 };
  unsigned i;

  ok (stats_hist_percentile_us (&h, 500) == 0, "empty: percentile 0");
  /* 90 durations of 5 us (bucket [4, 8)), 10 of 3 ms ([2048, 4096)). */
  for (i = 0; i < 90; ++i)
    stats_hist_add (&h, 5000);
  for (i = 0; i < 10; ++i)
    stats_hist_add (&h, 3000000);
  ok (h.count == 100 && h.sum_us == 90 * 5 + 10 * 3000,
      "count 100, sum in us (%" PRIu64 ", %" PRIu64 ")", h.count, h.sum_us);
  ok (h.bucket[3] == 90 && h.bucket[12] == 10,
      "buckets 3 and 12 hold them (%" PRIu64 ", %" PRIu64 ")",
      h.bucket[3], h.bucket[12]);
  ok (stats_hist_percentile_us (&h, 500) == 8, "p50 below 8 us (%" PRIu64
      ")", stats_hist_percentile_us (&h, 500));
  ok (stats_hist_percentile_us (&h, 900) == 8, "p90: the 90th, below 8 us");
  ok (stats_hist_percentile_us (&h, 910) == 4096,
      "p91: the 91st, below 4096 us (%" PRIu64 ")",
      stats_hist_percentile_us (&h, 910));
  ok (stats_hist_percentile_us (&h, 0) == 8, "p0: the first");
  ok (stats_hist_percentile_us (&h, 1000) == 4096, "p100: the last");
  /* Under 1 us, and the serial variant counts the same. */
  stats_hist_add_serial (&g, 999);
  stats_hist_add_serial (&g, 5000);
  ok (g.count == 2 && g.bucket[0] == 1 && g.bucket[3] == 1 && g.sum_us == 5,
      "999 ns -> bucket 0; serial add counts like the atomic one");
  stats_hist_merge (&g, &h);
  ok (g.count == 102 && g.bucket[3] == 91 && g.bucket[12] == 10 &&
      g.sum_us == h.sum_us + 5, "merge sums counts, sums and buckets");
}

static uint64_t
unflushed_bytes (const struct stats_unflushed *u, uint64_t *reqs,
                 uint64_t *oldest)
{
  struct stats_window w;

  stats_unflushed_total (u, &w);
  *reqs = w.requests;
  *oldest = w.oldest_ns;
  return w.bytes;
}

/* The unflushed window against a model: each acknowledgement is a
 * record (bytes, time, covered), a FLUSH snapshots the records before
 * it, a FLUSH that succeeds marks those covered.  Random interleavings
 * of acks, FLUSH arrivals and answers (in any order, ok or failed).
 */
static void
test_unflushed_model (void)
{
  enum { NACK = 4000, NFL = 64 };
  static uint64_t ack_bytes[NACK], ack_ns[NACK];
  static bool covered[NACK];
  struct stats_flush_mark marks[NFL];
  size_t flush_upto[NFL];       /* Acks before the FLUSH arrived. */
  bool pending[NFL];
  struct stats_unflushed u = { 0 };
  size_t nack = 0, nfl = 0, i, k, step, bad = 0;
  uint64_t seed = 12345, now = 1000;

  for (step = 0; step < 20000 && nack < NACK; ++step) {
    uint64_t r, bytes, reqs, oldest, mb = 0, mr = 0, mo = UINT64_MAX;

    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    r = seed >> 33;
    now += 1 + r % 7;
    if (r % 10 < 6) {                   /* An acknowledgement. */
      ack_bytes[nack] = 512 * (1 + r % 9);
      ack_ns[nack] = now;
      covered[nack] = false;
      stats_unflushed_ack (&u, ack_bytes[nack], now);
      nack++;
    }
    else if (r % 10 < 8 && nfl < NFL) { /* A FLUSH arrives. */
      stats_unflushed_flush_begin (&u, &marks[nfl]);
      flush_upto[nfl] = nack;
      pending[nfl] = true;
      nfl++;
    }
    else {                              /* A pending FLUSH is answered. */
      bool okay = (r >> 8) % 3 != 0;

      for (k = 0; k < nfl; ++k) {
        size_t f = (k + (r >> 12)) % nfl;

        if (!pending[f])
          continue;
        pending[f] = false;
        stats_unflushed_flush_end (&u, &marks[f], okay);
        if (okay)
          for (i = 0; i < flush_upto[f]; ++i)
            covered[i] = true;
        break;
      }
    }
    for (i = 0; i < nack; ++i)
      if (!covered[i]) {
        mb += ack_bytes[i];
        mr++;
        if (ack_ns[i] < mo)
          mo = ack_ns[i];
      }
    bytes = unflushed_bytes (&u, &reqs, &oldest);
    if (bytes != mb || reqs != mr || (mr > 0 && oldest != mo)) {
      if (bad++ == 0)
        printf ("# step %zu: bytes %" PRIu64 " (model %" PRIu64 "), requests %"
              PRIu64 " (%" PRIu64 "), oldest %" PRIu64 " (%" PRIu64 ")\n",
              step, bytes, mb, reqs, mr, oldest, mo);
    }
    /* The FLUSH marks can be reused once answered: keep a few slots. */
    if (nfl == NFL) {
      bool all = true;

      for (k = 0; k < nfl; ++k)
        all = all && !pending[k];
      if (all)
        nfl = 0;
    }
  }
  ok (bad == 0, "the window equals the model at every one of %zu steps "
      "(%zu acknowledgements; %zu mismatches)", step, nack, bad);
}

/* The table cases the shell test cannot make happen on demand. */
static void
test_unflushed_cases (void)
{
  struct stats_unflushed u = { 0 };
  struct stats_flush_mark a, b;
  uint64_t reqs, oldest;

  stats_unflushed_ack (&u, 100, 10);
  stats_unflushed_flush_begin (&u, &a);
  stats_unflushed_ack (&u, 20, 20);
  stats_unflushed_flush_begin (&u, &b);
  stats_unflushed_ack (&u, 3, 30);
  ok (unflushed_bytes (&u, &reqs, &oldest) == 123 && reqs == 3 &&
      oldest == 10, "three windows: 123 bytes, oldest at 10");
  stats_unflushed_flush_end (&u, &b, true);
  ok (unflushed_bytes (&u, &reqs, &oldest) == 3 && reqs == 1 &&
      oldest == 30, "the newer FLUSH answered first covers the older "
      "window too");
  stats_unflushed_flush_end (&u, &a, false);
  ok (unflushed_bytes (&u, &reqs, &oldest) == 3,
      "the older one answered later, even failed, changes nothing");

  stats_unflushed_flush_begin (&u, &a);
  stats_unflushed_ack (&u, 40, 40);
  stats_unflushed_flush_begin (&u, &b);
  stats_unflushed_flush_end (&u, &a, false);
  ok (unflushed_bytes (&u, &reqs, &oldest) == 43 && oldest == 30,
      "a failed FLUSH covers nothing (43 bytes, oldest at 30)");
  stats_unflushed_flush_end (&u, &b, true);
  ok (unflushed_bytes (&u, &reqs, &oldest) == 0 && reqs == 0 &&
      u.head == NULL, "the next FLUSH covers what the failed one left");
}

int
main (void)
{
  test_merge ();
  test_json ();
  test_line ();
  test_hist_buckets ();
  test_hist_add_percentile ();
  test_unflushed_cases ();
  test_unflushed_model ();
  return done_testing ();
}
