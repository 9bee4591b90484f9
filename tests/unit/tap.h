/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* tap.h: the smallest TAP producer that automake's tap-driver needs.
 *
 *   ok (cond, "fmt", ...);   one test point
 *   done_testing ();         print the plan, return the exit status
 */
#ifndef NBDPLUG_TAP_H
#define NBDPLUG_TAP_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

static unsigned tap_n, tap_failed;

static inline bool __attribute__ ((format (printf, 2, 3), unused))
ok (bool cond, const char *fmt, ...)
{
  va_list ap;

  tap_n++;
  if (!cond)
    tap_failed++;
  printf ("%sok %u - ", cond ? "" : "not ", tap_n);
  va_start (ap, fmt);
  vprintf (fmt, ap);
  va_end (ap);
  printf ("\n");
  fflush (stdout);
  return cond;
}

static inline int __attribute__ ((unused))
done_testing (void)
{
  printf ("1..%u\n", tap_n);
  return tap_failed ? 1 : 0;
}

#endif /* NBDPLUG_TAP_H */
