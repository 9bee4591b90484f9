/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* backing.h: one backing file as the plumbing sees it: its backend
 * (backend.h: a local file, file.h, or an NBD export, remote.h,
 * maybe wrapped by the fault injector, backend-inject.h) and what the
 * plumbing learns about it.
 *
 * The backing files are global: I/O pool threads and nbdkit workers
 * write local files, workers read them.  A remote backing is never
 * written by those threads: glue.c issues its runs to its remote's
 * loop.  In-flight slots (max-inflight=, remote-queue-depth=) are
 * counted by the engine, which owns every dispatch decision.
 */
#ifndef NBDPLUG_BACKING_H
#define NBDPLUG_BACKING_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "backend-inject.h"
#include "remote.h"

struct backing {
  /* Read-only after plugin_get_ready. */
  const char *name;             /* Owned by nbdkit (config string) or
                                 * nbdkit_realpath result: freed at unload. */
  struct backend *be;           /* Owned. */
  struct remote *remote;        /* The NBD export inside be, or NULL for
                                 * a local file. */
  uint32_t min_block;           /* Requests must be multiples of this
                                 * (a remote's minimum block size; 1). */
  uint64_t size;
  bool readonly;                /* Could only be opened O_RDONLY. */

  /* Atomic: how long its runs take to write (a moving average, ns),
   * measured by the threads that issue them (glue.c).
   */
  uint64_t run_ns;
};

/* What backing_open needs besides the name. */
struct backing_params {
  bool lock;                    /* Lock a local file (not lock=no). */
  struct remote_config remote;  /* For an NBD URI. */
  struct inject_params inject;  /* Debug flags: the injector wraps a
                                 * local file when one is set. */
};

/* Runs of a file that take at most this long on average may be issued
 * by a thread that is about to wait anyway (the timer thread) rather
 * than handed to the I/O pool: half the default idle=, so that the
 * timers it serves are late by no more than that.  (A 1 MiB run to
 * tmpfs takes 100-300 us on a busy machine.)
 */
#define BACKING_FAST_RUN_NS 500000

/* A run of b took ns to write: fold it into b->run_ns. */
extern void backing_note_run (struct backing *b, uint64_t ns);

/* Does b write its runs fast enough (a local file whose runs take at
 * most BACKING_FAST_RUN_NS on average)?
 */
extern bool backing_fast (const struct backing *b);

/* Open the file, or connect to the NBD URI (remote_is_uri) and learn
 * what the server advertises (file_open, remote_open).  Returns 0, or
 * -1 after nbdkit_error naming the file or URI.
 */
extern int backing_open (struct backing *b, const char *name,
                         const struct backing_params *p)
  __attribute__ ((__nonnull__ (1, 2, 3)));
extern void backing_close (struct backing *b);

/* Does the kernel let only one run of b proceed at a time?  True for a
 * local regular file: a buffered write (generic_file_write_iter, which
 * tmpfs uses, and ext4's, xfs's and btrfs's own) and fallocate, so
 * every write, zero and trim run, take the inode's i_rwsem exclusively:
 * threads writing one file only take turns (the losers spin in
 * rwsem_spin_on_owner, then sleep).  False for a block device
 * (blkdev_write_iter takes no inode lock), for a remote (its runs
 * overlap on the wire), and under -D plug.backend_delay_us, whose
 * sleep stands for a backend whose operations overlap.
 */
static inline bool
backing_one_writer (const struct backing *b)
{
  return b->be->ops->one_writer (b->be);
}

/* Worker-side operations (no slots: reads never sit in a plug).  On a
 * remote they are one round trip each (aio, waiting for the answer).
 * 0, or -1 with errno.
 */
static inline int
backing_pread (struct backing *b, void *buf, uint64_t count,
               uint64_t offset)
{
  return b->be->ops->pread (b->be, buf, count, offset);
}

static inline int
backing_sync (struct backing *b)
{
  return b->be->ops->sync (b->be);
}

static inline int
backing_cache (struct backing *b, uint64_t count, uint64_t offset)
{
  return b->be->ops->cache (b->be, count, offset);
}

/* Is [offset, offset+count) data or a hole?  Sets *len to the length of
 * the leading extent of one kind and *hole.  Returns 0 or -1 with errno.
 */
static inline int
backing_extent (struct backing *b, uint64_t offset, uint64_t count,
                uint64_t *len, bool *hole)
{
  return b->be->ops->extent (b->be, offset, count, len, hole);
}

/* Is [offset, offset+count) of b aligned to what b accepts (a remote's
 * minimum block size)?  If not: nbdkit_error naming the file and the
 * operation, errno EINVAL, false.
 */
extern bool backing_aligned (const struct backing *b, const char *what,
                             uint64_t offset, uint64_t count);

#endif /* NBDPLUG_BACKING_H */
