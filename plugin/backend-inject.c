/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* backend-inject.c: see backend-inject.h. */

#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <time.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backend-inject.h"

struct inject {
  struct backend be;            /* First. */
  struct backend *inner;        /* Owned. */
  struct inject_params p;
};

static uint64_t counter;        /* Atomic: runs over every wrapper. */

static struct backend *
inner_of (const struct backend *be)
{
  return ((const struct inject *) be)->inner;
}

static int
inject_issue (struct backend *be, struct backend_run *br)
{
  const struct inject *in = (const struct inject *) be;
  int n = in->p.eagain_every, us = in->p.delay_us;

  if (us > 0)
    nanosleep (&(struct timespec) {
        .tv_sec = us / 1000000,
        .tv_nsec = us % 1000000 * 1000 }, NULL);
  if (n > 0 && __atomic_add_fetch (&counter, 1, __ATOMIC_RELAXED) % n == 0)
    return EAGAIN;
  return in->inner->ops->issue (in->inner, br);
}

static int
inject_pread (struct backend *be, void *buf, uint64_t count,
              uint64_t offset)
{
  struct backend *inner = inner_of (be);

  return inner->ops->pread (inner, buf, count, offset);
}

static int
inject_sync (struct backend *be)
{
  struct backend *inner = inner_of (be);

  return inner->ops->sync (inner);
}

static int
inject_cache (struct backend *be, uint64_t count, uint64_t offset)
{
  struct backend *inner = inner_of (be);

  return inner->ops->cache (inner, count, offset);
}

static int
inject_extent (struct backend *be, uint64_t offset, uint64_t count,
               uint64_t *len, bool *hole)
{
  struct backend *inner = inner_of (be);

  return inner->ops->extent (inner, offset, count, len, hole);
}

/* The sleep stands for a backend whose operations overlap: its runs
 * gain from being in flight together, whatever the one inside does.
 */
static bool
inject_one_writer (const struct backend *be)
{
  const struct inject *in = (const struct inject *) be;

  return in->p.delay_us == 0 && in->inner->ops->one_writer (in->inner);
}

static void
inject_close (struct backend *be)
{
  struct inject *in = (struct inject *) be;

  in->inner->ops->close (in->inner);
  free (in);
}

static const struct backend_ops inject_ops = {
  .name = "inject",
  .issue = inject_issue,
  .pread = inject_pread,
  .sync = inject_sync,
  .cache = inject_cache,
  .extent = inject_extent,
  .one_writer = inject_one_writer,
  .close = inject_close,
};

struct backend *
inject_open (struct backend *inner, const struct inject_params *p)
{
  struct inject *in = malloc (sizeof *in);

  if (in == NULL) {
    nbdkit_error ("malloc: %m");
    inner->ops->close (inner);
    return NULL;
  }
  in->be = *inner;
  in->be.ops = &inject_ops;
  in->inner = inner;
  in->p = *p;
  return &in->be;
}
