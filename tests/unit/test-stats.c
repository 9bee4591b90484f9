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

int
main (void)
{
  test_merge ();
  test_json ();
  test_line ();
  return done_testing ();
}
