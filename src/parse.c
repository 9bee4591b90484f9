/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* parse.c: see parse.h. */

#include <config.h>

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "parse.h"

static int
unit_scale (const char *unit, uint64_t *scale)
{
  if (strcmp (unit, "") == 0 || strcmp (unit, "s") == 0)
    *scale = 1000000000;
  else if (strcmp (unit, "ms") == 0)
    *scale = 1000000;
  else if (strcmp (unit, "us") == 0)
    *scale = 1000;
  else if (strcmp (unit, "ns") == 0)
    *scale = 1;
  else
    return -1;
  return 0;
}

int
parse_duration (const char *str, uint64_t *ns)
{
  const char *p = str;
  uint64_t whole = 0, frac = 0, frac_div = 1, scale, r;
  int digits = 0;

  while (isdigit ((unsigned char) *p)) {
    if (whole > (UINT64_MAX - 9) / 10) {
      errno = ERANGE;
      return -1;
    }
    whole = whole * 10 + (*p++ - '0');
    digits++;
  }
  if (*p == '.') {
    p++;
    while (isdigit ((unsigned char) *p)) {
      /* Digits past nanosecond precision of any unit are dropped. */
      if (frac_div < 1000000000) {
        frac = frac * 10 + (*p - '0');
        frac_div *= 10;
      }
      p++;
      digits++;
    }
  }
  if (digits == 0 || unit_scale (p, &scale) == -1) {
    errno = EINVAL;
    return -1;
  }
  if (whole > UINT64_MAX / scale) {
    errno = ERANGE;
    return -1;
  }
  r = whole * scale;
  /* frac < frac_div <= 10^9 and scale <= 10^9: no overflow in 64 bits. */
  r += frac * scale / frac_div;
  if (r < whole * scale) {
    errno = ERANGE;
    return -1;
  }
  *ns = r;
  return 0;
}
