/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* log.h: error messages that may repeat without end (a backend that
 * fails every write, a stats-file= whose directory is gone), at most
 * one per interval each, saying how many were dropped before it.
 *
 * The decision is src/ratelimit.h's; this is the plugin's one way to
 * act on it, so that every such message reads the same:
 *   "MESSAGE (and N more since the last message)".
 */
#ifndef NBDPLUG_LOG_H
#define NBDPLUG_LOG_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "ratelimit.h"

/* nbdkit_error the message of fmt (which may use %m: errno is that of
 * the caller) if rl allows one at this time, at most one per
 * interval_ns, with the count of those dropped since the last one.
 * lock, if not NULL, protects rl (taken only for the decision, not
 * for the message); NULL: the caller protects rl.  errno is kept.
 * Returns true if the message went out.
 */
extern bool log_error_every (struct ratelimit *rl, pthread_mutex_t *lock,
                             uint64_t interval_ns, const char *fmt, ...)
  __attribute__ ((format (printf, 4, 5)));

/* The same, at most one a second (RATELIMIT_INTERVAL_NS). */
#define log_error_limited(rl, lock, ...) \
  log_error_every ((rl), (lock), RATELIMIT_INTERVAL_NS, __VA_ARGS__)

#endif /* NBDPLUG_LOG_H */
