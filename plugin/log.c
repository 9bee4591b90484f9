/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* log.c: rate-limited error messages.  See log.h. */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "log.h"
#include "plugin.h"

/* May a message go out now?  *suppressed as ratelimit_allow_every. */
static bool
allow (struct ratelimit *rl, pthread_mutex_t *lock, uint64_t interval_ns,
       uint64_t *suppressed)
{
  bool ok;

  if (lock)
    pthread_mutex_lock (lock);
  ok = ratelimit_allow_every (rl, now_ns (), interval_ns, suppressed);
  if (lock)
    pthread_mutex_unlock (lock);
  return ok;
}

bool
log_error_every (struct ratelimit *rl, pthread_mutex_t *lock,
                 uint64_t interval_ns, const char *fmt, ...)
{
  int err = errno;
  uint64_t suppressed;
  char *msg = NULL;
  va_list ap;
  int r;

  if (!allow (rl, lock, interval_ns, &suppressed)) {
    errno = err;
    return false;
  }
  errno = err;                  /* For the %m of fmt. */
  va_start (ap, fmt);
  r = vasprintf (&msg, fmt, ap);
  va_end (ap);
  if (r == -1)
    /* Still say that something failed, and how. */
    nbdkit_error ("%s", fmt);
  else if (suppressed > 0)
    nbdkit_error ("%s (and %" PRIu64 " more since the last message)",
                  msg, suppressed);
  else
    nbdkit_error ("%s", msg);
  free (msg);
  errno = err;
  return true;
}
