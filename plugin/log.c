/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* log.c: rate-limited error messages.  See log.h. */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
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

/* The message of fmt, its %m being err: in buf (len bytes) if it
 * fits, else malloc'd in *heap, else (no memory: a backend may be
 * failing for lack of it) as much as fits in buf.
 */
static const char *
format (char *buf, size_t len, char **heap, int err,
        const char *fmt, va_list ap)
{
  va_list ap2;
  int n;

  va_copy (ap2, ap);
  errno = err;
  n = vsnprintf (buf, len, fmt, ap);
  errno = err;
  if (n >= 0 && (size_t) n >= len) {
    if (vasprintf (heap, fmt, ap2) == -1)
      *heap = NULL;             /* Undefined after a failure. */
  }
  va_end (ap2);
  return *heap ? *heap : buf;
}

bool
log_error_every (struct ratelimit *rl, pthread_mutex_t *lock,
                 uint64_t interval_ns, const char *fmt, ...)
{
  int err = errno;
  uint64_t suppressed;
  char buf[512], more[RATELIMIT_MORE_LEN], *heap = NULL;
  const char *msg;
  va_list ap;

  if (!allow (rl, lock, interval_ns, &suppressed)) {
    errno = err;
    return false;
  }
  va_start (ap, fmt);
  msg = format (buf, sizeof buf, &heap, err, fmt, ap);
  va_end (ap);
  nbdkit_error ("%s%s", msg, ratelimit_more (more, sizeof more, suppressed));
  free (heap);
  errno = err;
  return true;
}
