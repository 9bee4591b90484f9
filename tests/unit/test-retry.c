/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* test-retry: backoff, deadline and transient errors. */

#include <config.h>

#undef NDEBUG
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
test_reset (void)
{
  struct retry_state s = { .attempts = 5 };

  retry_reset (&s);
  ok (s.attempts == 0, "retry_reset forgets the delays");
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
  test_reset ();
  test_transient ();
  return done_testing ();
}
