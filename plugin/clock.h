/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* clock.h: the monotonic clock, for the rooms that take nothing from
 * plugin.h (the backends).
 */
#ifndef NBDPLUG_CLOCK_H
#define NBDPLUG_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds (as plugin.h's now_ns). */
static inline uint64_t
clock_now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

#endif /* NBDPLUG_CLOCK_H */
