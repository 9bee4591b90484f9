/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* request.h: a request as the engine takes it (struct eng_op), made
 * from what a client asked: the export range mapped to one piece per
 * backing file (layout.h), and, for a write, its data attached, copied
 * or borrowed; the whole in one block of memory, recycled.
 *
 * The data of a write comes here once: request_new_write makes the
 * one copy (or borrows nbdkit's buffer, where the client waits) and
 * hands back a request ready for the engine.  Only a write expected
 * to go direct that the engine then plugs comes back for its copy
 * (request_with_copy).
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
  struct plug_piece pieces[];   /* op.pieces points here. */
};

struct backing;
struct layout;

/* A request for [offset, offset+count) of the export, with one piece
 * per backing file it touches: kind and flags as the engine's; count
 * 0 (FLUSH, CLOSE, SHUTDOWN): no pieces.  room: bytes for a copy of the
 * data in the same block (0: none).  The pieces carry no data.
 * Returns NULL after nbdkit_error (a misaligned piece, no memory).
 */
extern struct request *request_new (enum eng_kind kind, uint64_t offset,
                                     uint64_t count, uint32_t flags,
                                     size_t room);

/* Where the data of a write goes (request_new_write). */
struct request_place {
  size_t room;                  /* Bytes of room for a copy in the
                                 * request's block (0: none). */
  bool gather;                  /* The write's bytes for each file are
                                 * scattered over the client's buffer
                                 * (layout_range_scattered: striped,
                                 * longer than one row of units): the
                                 * copy is gathered file by file, one
                                 * pwrite per file, and the pieces stay
                                 * one per file. */
  void *slot;                   /* An arena slot of the write's size
                                 * for the copy, or NULL. */
  struct arena_chunk *chunk;    /* slot's chunk: the request puts it
                                 * when freed. */
};

/* A write of data (nbdkit's buffer) to [offset, offset+count), its
 * pieces pointing at its bytes: copied into place->slot if given, else
 * into the block's room if place->room covers the write (a copy the
 * plug holds, or one gathered file by file), else borrowed from data.
 * r->copy says whether it was copied.  Returns NULL after nbdkit_error
 * (the caller still owns place->chunk).
 */
extern struct request *request_new_write (uint64_t offset, uint64_t count,
                                          uint32_t flags, const void *data,
                                          const struct request_place *place);

/* r, a write whose data is still data (nbdkit's buffer), moved into a
 * block with its copy; r is freed.  Returns the new block, or NULL
 * after nbdkit_error (r freed too).
 */
extern struct request *request_with_copy (struct request *r,
                                          const void *data);

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
 * blocks kept for reuse; the layout and the backing files
 * ([layout->nr]) are borrowed until request_fini.
 */
extern int request_init (uint64_t max_bytes, const struct layout *layout,
                         struct backing *backings);
extern void request_fini (void);

#endif /* NBDPLUG_REQUEST_H */
