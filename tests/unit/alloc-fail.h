/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* alloc-fail.h: included before a source of src/ that test-engine-nomem
 * compiles in (nomem-engine.c, nomem-plug.c): once alloc_budget
 * allocations (malloc, calloc, realloc) of those sources succeeded,
 * each further one fails with ENOMEM.  A negative budget: no limit.
 */
#ifndef NBDPLUG_ALLOC_FAIL_H
#define NBDPLUG_ALLOC_FAIL_H

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

extern long alloc_budget;       /* Set by the test. */
extern unsigned long alloc_failed;      /* Allocations refused so far. */

/* May one more allocation succeed? */
static inline bool
alloc_allowed (void)
{
  if (alloc_budget < 0)
    return true;
  if (alloc_budget > 0) {
    alloc_budget--;
    return true;
  }
  alloc_failed++;
  errno = ENOMEM;
  return false;
}

static inline void *
nomem_malloc (size_t n)
{
  return alloc_allowed () ? malloc (n) : NULL;
}

static inline void *
nomem_calloc (size_t n, size_t size)
{
  return alloc_allowed () ? calloc (n, size) : NULL;
}

static inline void *
nomem_realloc (void *p, size_t n)
{
  return alloc_allowed () ? realloc (p, n) : NULL;
}

#define malloc(n) nomem_malloc (n)
#define calloc(n, size) nomem_calloc ((n), (size))
#define realloc(p, n) nomem_realloc ((p), (n))

#endif /* NBDPLUG_ALLOC_FAIL_H */
