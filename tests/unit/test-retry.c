/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* test-retry: backoff, deadline and transient errors. */

#include <config.h>

#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>

#include "retry.h"
#include "tap.h"

#define ARRAY_SIZE(a) (sizeof (a) / sizeof ((a)[0]))

#define MS UINT64_C (1000000)

static void
test_delay (void)
{
  static const struct {
    uint64_t delay, max;
    unsigned attempt;
    uint64_t expect;
  } cases[] = {
    /* The kernel's 3 ms, doubling up to a 100 ms cap. */
    { 3 * MS, 100 * MS, 0, 3 * MS },
    { 3 * MS, 100 * MS, 1, 6 * MS },
    { 3 * MS, 100 * MS, 2, 12 * MS },
    { 3 * MS, 100 * MS, 3, 24 * MS },
    { 3 * MS, 100 * MS, 4, 48 * MS },
    { 3 * MS, 100 * MS, 5, 96 * MS },
    { 3 * MS, 100 * MS, 6, 100 * MS },
    { 3 * MS, 100 * MS, 7, 100 * MS },
    { 3 * MS, 100 * MS, 1000, 100 * MS },
    { 3 * MS, 100 * MS, ~0U, 100 * MS },
    /* Cap exactly reached. */
    { 1, 8, 3, 8 },
    { 1, 8, 4, 8 },
    /* Cap below the first delay: the first delay wins. */
    { 10 * MS, 1 * MS, 0, 10 * MS },
    { 10 * MS, 1 * MS, 5, 10 * MS },
    { 10 * MS, 0, 3, 10 * MS },
    /* A zero delay is never returned. */
    { 0, 0, 0, 1 },
    { 0, 0, 50, 1 },
    { 0, 16, 0, 1 },
    { 0, 16, 2, 4 },
    { 0, 16, 9, 16 },
    /* Doubling must not overflow. */
    { UINT64_MAX / 2 + 1, UINT64_MAX, 1, UINT64_MAX },
    { UINT64_MAX / 2 + 1, UINT64_MAX, 70, UINT64_MAX },
    { UINT64_MAX / 3, UINT64_MAX, 1, UINT64_MAX / 3 * 2 },
    { 1, UINT64_MAX, 63, UINT64_C (1) << 63 },
    { 1, UINT64_MAX, 64, UINT64_MAX },
    { 1, UINT64_MAX, ~0U, UINT64_MAX },
  };
  size_t i;

  for (i = 0; i < ARRAY_SIZE (cases); ++i) {
    struct retry_policy p = {
      .delay_ns = cases[i].delay, .max_delay_ns = cases[i].max,
      .timeout_ns = 1000 * MS,
    };
    uint64_t d = retry_delay (&p, cases[i].attempt);

    ok (d == cases[i].expect,
        "retry_delay (delay %" PRIu64 ", max %" PRIu64 ", attempt %u)"
        " = %" PRIu64 " (got %" PRIu64 ")",
        cases[i].delay, cases[i].max, cases[i].attempt,
        cases[i].expect, d);
  }

  /* Monotonic, never 0, never above the cap, for many attempts. */
  {
    struct retry_policy p = {
      .delay_ns = 7, .max_delay_ns = 1000, .timeout_ns = 1,
    };
    uint64_t prev = 0, d;
    unsigned a;
    bool good = true;

    for (a = 0; a < 200; ++a) {
      d = retry_delay (&p, a);
      if (d == 0 || d < prev || d > 1000)
        good = false;
      prev = d;
    }
    ok (good && prev == 1000, "retry_delay is monotonic, > 0 and capped");
  }
}

/* A sequence of failures at given times against a policy. */
static void
test_failed (void)
{
  /* 3 ms doubling to 20 ms, give up after 50 ms. */
  const struct retry_policy p = {
    .delay_ns = 3 * MS, .max_delay_ns = 20 * MS, .timeout_ns = 50 * MS,
  };
  static const struct {
    uint64_t now;               /* Time of the failure. */
    bool retry;
    uint64_t delay;             /* If retry. */
  } steps[] = {
    { 1000 * MS, true, 3 * MS },        /* First failure: the clock starts. */
    { 1003 * MS, true, 6 * MS },
    { 1009 * MS, true, 12 * MS },
    { 1021 * MS, true, 20 * MS },       /* Capped. */
    { 1041 * MS, true, 9 * MS },        /* Clipped to the deadline 1050. */
    { 1050 * MS, false, 0 },            /* At the deadline: give up. */
    { 1051 * MS, false, 0 },            /* And after it. */
  };
  struct retry_state s = { 0 };
  size_t i;

  for (i = 0; i < ARRAY_SIZE (steps); ++i) {
    uint64_t d = 12345;
    bool r = retry_failed (&p, &s, steps[i].now, &d);

    if (steps[i].retry)
      ok (r && d == steps[i].delay,
          "failure %zu at %" PRIu64 " ms: retry after %" PRIu64
          " ms (got %d, %" PRIu64 " ns)",
          i, steps[i].now / MS, steps[i].delay / MS, r, d);
    else
      ok (!r, "failure %zu at %" PRIu64 " ms: give up", i,
          steps[i].now / MS);
  }
  ok (s.attempts == 5 && s.first_ns == 1000 * MS,
      "state counts the retries and keeps the first failure time");

  /* Reset forgets everything: the next failure starts a new deadline. */
  retry_reset (&s);
  ok (s.attempts == 0 && s.first_ns == 0, "retry_reset clears the state");
  {
    uint64_t d = 0;

    ok (retry_failed (&p, &s, 5000 * MS, &d) && d == 3 * MS,
        "after reset, the first delay again");
    ok (retry_failed (&p, &s, 5049 * MS, &d) && d == 1 * MS,
        "after reset, the deadline is counted from the new first failure");
    ok (!retry_failed (&p, &s, 5050 * MS, &d),
        "after reset, gives up at the new deadline");
  }

  /* A clock that goes backwards is not a reason to fail or wrap. */
  retry_reset (&s);
  {
    uint64_t d = 0;

    assert (retry_failed (&p, &s, 100 * MS, &d));
    ok (retry_failed (&p, &s, 90 * MS, &d) && d == 6 * MS,
        "clock going backwards counts as no time elapsed");
  }

  /* Timeout 0: never retry. */
  {
    const struct retry_policy p0 = {
      .delay_ns = 3 * MS, .max_delay_ns = 20 * MS, .timeout_ns = 0,
    };
    struct retry_state s0 = { 0 };
    uint64_t d = 0;

    ok (!retry_failed (&p0, &s0, 7, &d), "timeout 0 gives up at once");
  }

  /* The total of the delays never exceeds the timeout, and the last
   * retry lands exactly on the deadline when the clock follows the
   * delays.
   */
  {
    const struct retry_policy p1 = {
      .delay_ns = 1 * MS, .max_delay_ns = 7 * MS, .timeout_ns = 100 * MS,
    };
    struct retry_state s1 = { 0 };
    uint64_t now = 42, d, total = 0;
    unsigned n = 0;

    while (retry_failed (&p1, &s1, now, &d)) {
      assert (d > 0);
      total += d;
      now += d;
      n++;
      assert (n < 1000);
    }
    ok (total == 100 * MS && now == 42 + 100 * MS,
        "delays sum to exactly the timeout (%u retries, %" PRIu64 " ns)",
        n, total);
  }
}

static void
test_transient (void)
{
  static const struct {
    int err;
    const char *name;
    bool transient;
  } cases[] = {
    { EAGAIN, "EAGAIN", true },
    { EWOULDBLOCK, "EWOULDBLOCK", true },
    { ENOMEM, "ENOMEM", true },
    { EBUSY, "EBUSY", true },
    { EIO, "EIO", false },
    { ENOSPC, "ENOSPC", false },
    { EINVAL, "EINVAL", false },
    { EPERM, "EPERM", false },
    { ESHUTDOWN, "ESHUTDOWN", false },
    { ENOTSUP, "ENOTSUP", false },
    { 0, "0", false },
  };
  size_t i;

  for (i = 0; i < ARRAY_SIZE (cases); ++i)
    ok (retry_is_transient (cases[i].err) == cases[i].transient,
        "%s is %stransient", cases[i].name,
        cases[i].transient ? "" : "not ");
}

int
main (void)
{
  test_delay ();
  test_failed ();
  test_transient ();
  return done_testing ();
}
