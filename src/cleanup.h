/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* cleanup.h: scope-bound cleanup helpers (GCC/Clang cleanup attribute).
 *
 * CLEANUP_FREE frees a heap pointer when it leaves scope.
 * ACQUIRE_LOCK_FOR_CURRENT_SCOPE holds a pthread mutex until the end of
 * the enclosing block, so no early return can leak a held lock.
 */
#ifndef NBDPLUG_CLEANUP_H
#define NBDPLUG_CLEANUP_H

#include <pthread.h>
#include <stdlib.h>

static inline void
cleanup_free (void *ptr)
{
  free (*(void **) ptr);
}
#define CLEANUP_FREE __attribute__ ((cleanup (cleanup_free)))

static inline void
cleanup_unlock (pthread_mutex_t **ptr)
{
  pthread_mutex_unlock (*ptr);
}
#define CLEANUP_CONCAT2(a, b) a ## b
#define CLEANUP_CONCAT(a, b) CLEANUP_CONCAT2 (a, b)
#define ACQUIRE_LOCK_FOR_CURRENT_SCOPE(mutex)                           \
  pthread_mutex_t *CLEANUP_CONCAT (_lock, __LINE__)                     \
  __attribute__ ((cleanup (cleanup_unlock), unused)) = (mutex);         \
  pthread_mutex_lock (CLEANUP_CONCAT (_lock, __LINE__))

#endif /* NBDPLUG_CLEANUP_H */
