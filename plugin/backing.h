/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* backing.h: one backing file (regular file or block device).
 *
 * The backing files are global: I/O pool threads and nbdkit workers
 * write them, workers read them.  pread/pwrite on one fd are safe from
 * many threads.  In-flight slots (max-inflight=) are counted by the
 * engine, which owns every dispatch decision.
 */
#ifndef NBDPLUG_BACKING_H
#define NBDPLUG_BACKING_H

#include <stdbool.h>
#include <stdint.h>

#include "plug.h"

struct backing {
  /* Read-only after plugin_get_ready. */
  const char *name;             /* Owned by nbdkit (config string) or
                                 * nbdkit_realpath result: freed at unload. */
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
};

/* Open the file (O_RDWR, or O_RDONLY if it cannot be written) and find
 * its size.  Opened read-write, the file is locked against other
 * processes (refused if one holds a lock on it) unless shared=yes.
 * Returns 0, or -1 after nbdkit_error naming the file.
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

/* Worker-side operations (no slots: reads never sit in a plug). */
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

#endif /* NBDPLUG_BACKING_H */
