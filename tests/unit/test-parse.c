/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* test-parse: parse_duration, table driven. */

#include <config.h>

#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>

#include "parse.h"
#include "tap.h"

#define ARRAY_SIZE(a) (sizeof (a) / sizeof ((a)[0]))

static const struct {
  const char *str;
  int err;                      /* 0: parses to ns. */
  uint64_t ns;
} cases[] = {
  /* Good. */
  { "3ms", 0, 3000000 },
  { "0.5s", 0, 500000000 },
  { "250us", 0, 250000 },
  { "10ns", 0, 10 },
  { "2", 0, 2000000000 },
  { "1.5ms", 0, 1500000 },
  { "0", 0, 0 },
  { "0s", 0, 0 },
  { "0.0ns", 0, 0 },
  { "1s", 0, 1000000000 },
  { ".5", 0, 500000000 },
  { "5.", 0, 5000000000 },
  { "007ms", 0, 7000000 },
  { "0.000000001", 0, 1 },
  { "0.0000000019", 0, 1 },     /* Beyond ns precision: truncated. */
  { "1.25us", 0, 1250 },
  { "18446744073s", 0, UINT64_C (18446744073000000000) },
  { "18446744073.709551615", 0, UINT64_C (18446744073709551615) },
  { "18446744073709551ns", 0, UINT64_C (18446744073709551) },

  /* Syntax errors. */
  { "", EINVAL, 0 },
  { "ms", EINVAL, 0 },
  { "s", EINVAL, 0 },
  { ".", EINVAL, 0 },
  { ".ms", EINVAL, 0 },
  { "3 ms", EINVAL, 0 },
  { " 3ms", EINVAL, 0 },
  { "3ms ", EINVAL, 0 },
  { "\t3", EINVAL, 0 },
  { "3min", EINVAL, 0 },
  { "-1", EINVAL, 0 },
  { "+1", EINVAL, 0 },
  { "1e3", EINVAL, 0 },
  { "3m", EINVAL, 0 },
  { "3MS", EINVAL, 0 },
  { "3h", EINVAL, 0 },
  { "1.2.3", EINVAL, 0 },
  { "0x10", EINVAL, 0 },
  { "3mss", EINVAL, 0 },
  { "3sms", EINVAL, 0 },

  /* Too large: about 584 years is the most a uint64_t of ns holds. */
  { "18446744074s", ERANGE, 0 },
  { "18446744073.709551616", ERANGE, 0 },
  { "18446744074", ERANGE, 0 },
  { "18446744073710ms", ERANGE, 0 },
  { "99999999999999999999999999", ERANGE, 0 },
  { "99999999999999999999999999ns", ERANGE, 0 },
  { "1000000000000000000000s", ERANGE, 0 },
};

int
main (void)
{
  size_t i;

  for (i = 0; i < ARRAY_SIZE (cases); ++i) {
    uint64_t ns = UINT64_C (0x5555555555555555);
    int r;

    errno = 0;
    r = parse_duration (cases[i].str, &ns);
    if (cases[i].err == 0)
      ok (r == 0 && ns == cases[i].ns,
          "\"%s\" = %" PRIu64 " ns (got r=%d ns=%" PRIu64 ")",
          cases[i].str, cases[i].ns, r, ns);
    else
      ok (r == -1 && errno == cases[i].err &&
          ns == UINT64_C (0x5555555555555555),
          "\"%s\" fails with %s, *ns untouched (got r=%d errno=%d)",
          cases[i].str, cases[i].err == EINVAL ? "EINVAL" : "ERANGE",
          r, errno);
  }
  return done_testing ();
}
