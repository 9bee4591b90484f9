/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* backing.h: one backing file: a regular file or block device, or an
 * NBD export on a server (file=nbd://..., remote.h).
 *
 * The backing files are global: I/O pool threads and nbdkit workers
 * write local files, workers read them.  pread/pwrite on one fd are
 * safe from many threads.  A remote backing is never written by those
 * threads: glue.c queues its runs to its remote's loop.  In-flight
 * slots (max-inflight=, remote-queue-depth=) are counted by the
 * engine, which owns every dispatch decision.
 */
#ifndef NBDPLUG_BACKING_H
#define NBDPLUG_BACKING_H

#include <stdbool.h>
#include <stdint.h>

#include "plug.h"

struct remote;

struct backing {
  /* Read-only after plugin_get_ready. */
  const char *name;             /* Owned by nbdkit (config string) or
                                 * nbdkit_realpath result: freed at unload. */
  struct remote *remote;        /* Owned: an NBD export, or NULL for a
                                 * local file. */
  uint32_t min_block;           /* Requests must be multiples of this
                                 * (a remote's minimum block size; 1). */
  int fd;
  uint64_t size;
  bool is_block;                /* Block device (BLKZEROOUT etc.). */
  bool readonly;                /* Could only be opened O_RDONLY. */
  uint32_t sector;              /* Block device: logical block size. */

  /* Atomic, per file: learnt at run time, only ever cleared, and only
   * by ENOTSUP/EOPNOTSUPP (EINVAL may be about one request's range).
   */
  bool can_punch;               /* fallocate PUNCH_HOLE works. */
  bool can_zero_range;          /* fallocate ZERO_RANGE works. */

  /* Atomic: how long its runs take to write (a moving average, ns),
   * measured by the threads that issue them (glue.c).
   */
  uint64_t run_ns;
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

/* Open the file (O_RDWR, or O_RDONLY if it cannot be written) and find
 * its size; or connect to the NBD URI (remote_is_uri) and learn what
 * the server advertises.  A local file opened read-write is locked
 * against other processes (refused if one holds a lock on it) unless
 * lock=no.  Returns 0, or -1 after nbdkit_error naming the file or
 * URI.
 */
extern int backing_open (struct backing *b, const char *name);
extern void backing_close (struct backing *b);

/* Issue one run, after -D plug.backend_delay_us and
 * -D plug.inject_eagain have had their say.  Returns 0, or -1 with
 * errno (EAGAIN/ENOMEM: not now; ENOTSUP: a fast zero that cannot be
 * fast; other: real error).  Context: an I/O pool thread, or a worker
 * that unplugged or took the direct path.
 */
extern int backing_issue_run (struct backing *b, const struct plug_run *run);

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
extern bool backing_one_writer (const struct backing *b);

/* Worker-side operations (no slots: reads never sit in a plug).  On a
 * remote they are one round trip each (aio, waiting for the answer).
 */
extern int backing_pread (struct backing *b, void *buf, uint64_t count,
                          uint64_t offset);
extern int backing_sync (struct backing *b);
extern int backing_cache (struct backing *b, uint64_t count,
                          uint64_t offset);

/* Is [offset, offset+count) data or a hole?  Sets *len to the length of
 * the leading extent of one kind and *hole.  Returns 0 or -1 with errno.
 */
extern int backing_extent (struct backing *b, uint64_t offset,
                           uint64_t count, uint64_t *len, bool *hole);

/* Is [offset, offset+count) of b aligned to what b accepts (a remote's
 * minimum block size)?  If not: nbdkit_error naming the file and the
 * operation, errno EINVAL, false.
 */
extern bool backing_aligned (const struct backing *b, const char *what,
                             uint64_t offset, uint64_t count);

#endif /* NBDPLUG_BACKING_H */
