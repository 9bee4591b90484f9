/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* arena.h: writeback copies of a stream, placed by offset (pure: no
 * locks, no syscalls; the caller serialises arena_place and
 * arena_fini on one arena, arena_put may run in any thread).
 *
 * An NBD server takes one buffer per write command (libnbd has no
 * vectored write), so a merged run whose members' copies lie apart in
 * memory would have to be gathered into one buffer: a second copy of
 * every byte.  An arena places the copies of a connection's stream in
 * a chunk at the position of their offset (data + offset - base), so
 * that requests adjacent on the disk are adjacent in memory, whatever
 * order nbdkit's threads bring them in, and a merged run of them is
 * already one buffer.
 *
 * A chunk covers ARENA_CHUNK bytes of offsets from its base.  A write
 * is placed in the current chunk when it lies inside the chunk's range
 * and none of its grains (ARENA_GRAIN bytes) is taken already (a
 * rewrite of a range still held keeps its own copy elsewhere), or else
 * in the chunk before it likewise (a stream's stragglers).  A write
 * past the current chunk's end, near the arena's last write (a
 * stream moving on), starts a new chunk based a little before it
 * (ARENA_SLACK, for the stream's stragglers).  Anything else (random
 * writes, a stream going backwards, a write too large) is not placed:
 * the caller copies it elsewhere.
 *
 * Memory: at most max_chunks chunks per arena, each freed only when the
 * arena is gone and no copy in it is alive; a chunk whose copies are
 * all released is reused (its pages stay mapped: no page faults).
 */
#ifndef NBDPLUG_ARENA_H
#define NBDPLUG_ARENA_H

#include <stddef.h>
#include <stdint.h>

#define ARENA_CHUNK ((size_t) 2 << 20)
#define ARENA_GRAIN 512
#define ARENA_SLACK (ARENA_CHUNK / 8)
/* Writes of at least this size are not placed. */
#define ARENA_MAX_WRITE (ARENA_CHUNK / 2)

struct arena_chunk {
  uint32_t refs;                /* Atomic: one per copy placed and not
                                 * put, plus one while its arena owns
                                 * it.  The last put frees it. */
  uint64_t base;                /* The offset at data[0]. */
  uint64_t taken[ARENA_CHUNK / ARENA_GRAIN / 64];       /* Grains. */
  char *data;
};

#define ARENA_MAX_CHUNKS 8

struct arena {
  unsigned max_chunks;          /* At most ARENA_MAX_CHUNKS. */
  unsigned nr_chunks;
  struct arena_chunk *chunks[ARENA_MAX_CHUNKS]; /* Owned (one ref). */
  struct arena_chunk *cur;      /* Where a stream is placed now. */
  struct arena_chunk *prev;     /* The one before: its stragglers. */
  uint64_t last_end;            /* End of the last write seen. */
  uint64_t placed, refused;     /* Counts, for tests. */
};

extern void arena_init (struct arena *a, unsigned max_chunks)
  __attribute__ ((__nonnull__ (1)));

/* Where to copy [offset, offset+count) of a write, or NULL: copy it
 * elsewhere (also on ENOMEM).  On success *chunk takes a reference that
 * arena_put gives back once the copy is no longer needed.
 */
extern void *arena_place (struct arena *a, uint64_t offset, size_t count,
                          struct arena_chunk **chunk)
  __attribute__ ((__nonnull__ (1, 4)));

/* The copy placed in c is no longer needed (any thread). */
extern void arena_put (struct arena_chunk *c)
  __attribute__ ((__nonnull__ (1)));

/* The arena is gone: its chunks are freed once their copies are put. */
extern void arena_fini (struct arena *a)
  __attribute__ ((__nonnull__ (1)));

#endif /* NBDPLUG_ARENA_H */
