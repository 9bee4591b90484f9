/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* request.h: the memory of a request (struct eng_op, its pieces and,
 * in writeback mode, the copy of its data) as one block, recycled.
 *
 * A writeback write is allocated by an nbdkit worker and freed by
 * whichever thread finished its run (usually an I/O pool thread): with
 * malloc, every 4 KiB copy took malloc's slow path (too large for its
 * per-thread cache, and freed by another thread), and a 64 KiB one
 * faulted fresh pages in each time (the arena trimmed them).  So a
 * released block goes to a cache instead, under eng_lock (the releasing
 * thread holds it anyway, in glue_end_locked), and a worker takes one
 * back in its own submission's lock acquisition, as its thread's
 * "spare" for its next request: no lock of its own, no malloc.
 *
 * Memory: the cache and the threads' spares together hold at most
 * max-bytes= of blocks, for all connections together (each worker
 * thread at most one spare); the last connection to close frees the
 * cache and trims malloc's arenas (request_trim).
 */
#ifndef NBDPLUG_REQUEST_H
#define NBDPLUG_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "engine.h"

struct request {
  struct eng_op op;             /* First: request_free takes an op. */
  void *copy;                   /* The writeback copy in the block's
                                 * room or in an arena chunk, or NULL. */
  struct arena_chunk *chunk;    /* The arena chunk of copy, or NULL: put
                                 * when the request is freed. */
  int cls;                      /* Size class, or -1: never recycled. */
  size_t room;                  /* Bytes of data room after the pieces. */
  struct plug_req pieces[];     /* op.pieces points here. */
};

/* A request with room for nr_pieces pieces and `room` bytes of data
 * (request_room), its header zeroed; the pieces and the room are left
 * for the caller to fill.  The calling thread's spare is used if it
 * has the right size.  Returns NULL with errno.
 */
extern struct request *request_alloc (size_t nr_pieces, size_t room);

/* Where the data room of r starts (room > 0). */
extern void *request_room (struct request *r);

/* Free r (any thread, no lock).  The copy goes with it. */
extern void request_free (struct eng_op *op);

/* eng_lock held: take the recyclable requests off a's release list
 * into the cache.
 */
extern void request_recycle_locked (struct eng_actions *a);

/* eng_lock held: if the calling thread has no spare, take one from
 * the cache for its next request, sized for nr_pieces pieces and
 * `room` bytes of data.
 */
extern void request_refill_locked (size_t nr_pieces, size_t room);

/* Free the cache and give malloc's free memory back to the kernel
 * (malloc_trim).  Context: the last connection's .close; not per
 * request (it walks every arena).
 */
extern void request_trim (void);

/* Set up and tear down (.get_ready / .unload): a thread's spare is
 * freed when the thread exits.  max_bytes (max-bytes=) bounds the
 * blocks kept for reuse.
 */
extern int request_init (uint64_t max_bytes);
extern void request_fini (void);

#endif /* NBDPLUG_REQUEST_H */
