/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* ratelimit.h: at most one message per interval, counting the rest
 * (pure).
 *
 * A backend that fails every write must not fill the log: a failing
 * range logs one line per interval, saying how many similar messages it
 * suppressed since the last line.  The owner protects the struct.
 */
#ifndef NBDPLUG_RATELIMIT_H
#define NBDPLUG_RATELIMIT_H

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* One line per second. */
#define RATELIMIT_INTERVAL_NS 1000000000ULL

struct ratelimit {
  uint64_t last_ns;             /* When the last line went out; 0: never. */
  uint64_t suppressed;          /* Messages dropped since then. */
};

/* May a message go out at now, at most one per interval_ns?  If so,
 * *suppressed is how many were dropped before it (and the count starts
 * again); if not, it is counted.
 */
static inline bool
ratelimit_allow_every (struct ratelimit *rl, uint64_t now,
                       uint64_t interval_ns, uint64_t *suppressed)
{
  if (rl->last_ns != 0 && now - rl->last_ns < interval_ns) {
    rl->suppressed++;
    return false;
  }
  *suppressed = rl->suppressed;
  rl->suppressed = 0;
  rl->last_ns = now ? now : 1;
  return true;
}

/* The same, one per RATELIMIT_INTERVAL_NS. */
static inline bool
ratelimit_allow (struct ratelimit *rl, uint64_t now, uint64_t *suppressed)
{
  return ratelimit_allow_every (rl, now, RATELIMIT_INTERVAL_NS, suppressed);
}

/* The tail every rate-limited message ends with, so that they all read
 * the same: " (and N more since the last message)" into buf, or ""
 * when none was dropped.  Returns buf.
 */
#define RATELIMIT_MORE_LEN 64
static inline const char *
ratelimit_more (char *buf, size_t len, uint64_t suppressed)
{
  buf[0] = '\0';
  if (suppressed > 0)
    snprintf (buf, len, " (and %" PRIu64 " more since the last message)",
              suppressed);
  return buf;
}

#endif /* NBDPLUG_RATELIMIT_H */
