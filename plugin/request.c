/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* request.c: requests, their pieces and their data, in blocks that
 * are recycled.  See request.h.
 */

#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backing.h"
#include "cleanup.h"
#include "glue.h"
#include "layout.h"
#include "request.h"

/* A recycled block has room for this many pieces: a request has one
 * per backing file it touches (layout_map_files), most often one, a
 * few across a concatenation boundary or over a stripe row.
 */
#define REQ_PIECES 4

/* Size classes of recycled blocks: k has 4 KiB << k (4 KiB .. 1 MiB:
 * larger writes take the direct path with every default of
 * direct-size=).  A block without data room (a read, a zero, a write
 * that borrows nbdkit's buffer) is not recycled: it is small enough for
 * malloc's thread cache, which costs less than the spare's thread key
 * and the cache's bookkeeping (callgrind: about 150 instructions less
 * per direct write).
 */
#define REQ_CLASSES 9
#define CLASS_ROOM(k) ((size_t) 4096 << (k))

/* The header and the pieces, rounded to a cache line so that the data
 * room starts on one (memcpy of the copy runs aligned).
 */
static size_t
header_size (size_t nr_pieces)
{
  size_t n = offsetof (struct request, pieces) +
    nr_pieces * sizeof (struct plug_piece);

  return (n + 63) & ~(size_t) 63;
}

/* Protected by eng_lock.  Stacks of pointers, not lists through the
 * blocks: a block released on another CPU is not touched (a cache miss
 * under the lock) until its new owner uses it.
 */
#define CACHE_SLOTS 1024
static struct request *cache[REQ_CLASSES][CACHE_SLOTS];
static size_t cache_len[REQ_CLASSES];

/* The bytes of every block kept for reuse, in the cache and as
 * threads' spares together: at most max-bytes= for the whole server.
 * A spare used or freed leaves it from any thread, without eng_lock,
 * hence atomic; it grows only under eng_lock (request_recycle_locked).
 * Not per thread: 300 connections have 4,800 worker threads.
 */
static size_t kept_bytes;
static size_t kept_max;                 /* max-bytes=, from request_init. */

/* The export's layout and backing files, borrowed from the entry
 * (request_init): read-only until .unload.
 */
static const struct layout *layout;
static struct backing *backings;

static void
kept_sub (size_t n)
{
  __atomic_sub_fetch (&kept_bytes, n, __ATOMIC_RELAXED);
}

/* The calling thread's spare block is the value of spare_key, whose
 * destructor frees it when the thread exits.  (Not a __thread
 * variable: a destructor writing one races, for ThreadSanitizer, with
 * the freeing of the thread's TLS.)
 */
static pthread_key_t spare_key;
static bool spare_key_made;

static int
class_of (size_t nr_pieces, size_t room)
{
  int k;

  if (nr_pieces > REQ_PIECES || room == 0)
    return -1;
  for (k = 0; k < REQ_CLASSES; ++k)
    if (CLASS_ROOM (k) >= room)
      return k;
  return -1;
}

/* The size of a recyclable block of class k. */
static size_t
class_size (int k)
{
  return header_size (REQ_PIECES) + CLASS_ROOM (k);
}

void *
request_room (struct request *r)
{
  return (char *) r + header_size (r->cls >= 0 ? REQ_PIECES :
                                   r->op.nr_pieces);
}

struct request *
request_alloc (size_t nr_pieces, size_t room)
{
  int cls = class_of (nr_pieces, room);
  struct request *r;
  size_t room_size;

  r = cls >= 0 && spare_key_made ? pthread_getspecific (spare_key) : NULL;
  if (r && r->cls == cls) {
    pthread_setspecific (spare_key, NULL);
    kept_sub (class_size (cls));
    /* Only the header: the pieces are all set by the caller. */
    memset (r, 0, offsetof (struct request, pieces));
    r->cls = cls;
    r->room = CLASS_ROOM (cls);
    return r;
  }
  room_size = cls >= 0 ? CLASS_ROOM (cls) : room;
  /* Not calloc: zeroing the data room (and faulting in every page of
   * it at once) is wasted on a copy that overwrites it.
   */
  r = malloc (header_size (cls >= 0 ? REQ_PIECES : nr_pieces) + room_size);
  if (r == NULL)
    return NULL;
  memset (r, 0, offsetof (struct request, pieces));
  r->cls = cls;
  r->room = room_size;
  /* For request_room of an unrecycled block. */
  r->op.nr_pieces = nr_pieces;
  return r;
}

/* Pieces of a request mapped on the stack; more files take malloc. */
#define STACK_PIECES 16

/* One piece per backing file (layout_map_files): a 4 GiB zero over
 * two striped files is two pieces, not one per stripe unit, so that
 * what the engine does for it under eng_lock (add, sort, merge, look
 * for overlaps) is bounded by the number of files, whatever the client
 * sent.
 */
/* request_new's body, inlined into request_new_write too: a write,
 * the common request, makes no call more for its pieces.
 */
static inline __attribute__ ((always_inline)) struct request *
request_make (enum eng_kind kind, uint64_t offset, uint64_t count,
              uint32_t flags, size_t room)
{
  struct layout_piece stack[STACK_PIECES], *lp = stack;
  struct layout_iter it;
  struct request *r;
  size_t n = 0, i;
  uint32_t pflags = 0;

  if (count > 0) {
    /* nbdkit checks bounds too, but the layout never trusts its caller. */
    if (layout_iter_init (&it, layout, offset, count) == -1) {
      nbdkit_error ("request beyond the end of the export: offset %" PRIu64
                    " count %" PRIu64 " size %" PRIu64,
                    offset, count, layout->size);
      errno = EINVAL;
      return NULL;
    }
    n = layout_nr_file_pieces (layout, offset, count);
  }
  /* The cap of the engine's work per request: one piece per file. */
  assert (n <= layout->nr);
  if (n > STACK_PIECES && (lp = malloc (n * sizeof *lp)) == NULL) {
    nbdkit_error ("malloc: %m");
    return NULL;
  }
  if (n > 0) {
    size_t mapped;
    int ret = layout_map_files (layout, offset, count, lp, &mapped);

    assert (ret == 0 && mapped == n);
    (void) ret;
  }
  r = request_alloc (n, room);
  if (r == NULL) {
    nbdkit_error ("calloc: %m");
    goto out;
  }
  r->op.kind = kind;
  r->op.flags = flags;
  r->op.offset = offset;
  r->op.count = count;
  r->op.nr_pieces = n;
  r->op.pieces = r->pieces;
  if (flags & ENG_F_MAY_TRIM)
    pflags |= PLUG_F_MAY_TRIM;
  if (flags & ENG_F_FAST)
    pflags |= PLUG_F_FAST;

  for (i = 0; i < n; ++i) {
    struct plug_piece *p = &r->pieces[i];

    /* Reads are checked by conn_pread; a barrier for block status may
     * be misaligned (that answer is "data" then).  A piece starts
     * where the request enters its file and ends where it leaves it,
     * and the stripe is a multiple of every file's block size
     * (check_stripe_alignment), so it is aligned when the request is.
     */
    if (kind <= ENG_TRIM &&
        !backing_aligned (&backings[lp[i].backing],
                          kind == ENG_WRITE ? "write" :
                          kind == ENG_ZERO ? "zero" : "trim",
                          lp[i].offset, lp[i].count)) {
      request_free (&r->op);
      r = NULL;
      goto out;
    }

    p->op = kind <= ENG_TRIM ? (enum plug_op) kind : PLUG_OP_WRITE;
    p->flags = pflags;
    p->backing = lp[i].backing;
    p->offset = lp[i].offset;
    p->count = lp[i].count;
    p->buf = NULL;
  }
 out:
  if (lp != stack)
    free (lp);
  return r;
}

struct request *
request_new (enum eng_kind kind, uint64_t offset, uint64_t count,
             uint32_t flags, size_t room)
{
  return request_make (kind, offset, count, flags, room);
}

/* Point each piece at its bytes in data (NULL for zero and trim).  The
 * pieces' bytes follow each other in data, in the pieces' order:
 * where the client put them when the pieces tile the request, and in
 * a gathered copy otherwise (request_copy_data).
 */
static void
request_set_data (struct request *r, const char *data)
{
  uint64_t off = 0;
  size_t i;

  for (i = 0; i < r->op.nr_pieces; ++i) {
    r->pieces[i].buf = data ? data + off : NULL;
    off += r->pieces[i].count;
  }
}

/* Copy data (as the client sent it) into r's room, piece after piece
 * (gathered from where the stripe put them when gather: see struct
 * request_place), and point the pieces at the copy.
 */
static void
request_copy_data (struct request *r, const char *data, bool gather)
{
  char *d;
  size_t i;

  r->copy = request_room (r);
  if (!gather)
    memcpy (r->copy, data, r->op.count);
  else
    for (i = 0, d = r->copy; i < r->op.nr_pieces; d += r->pieces[i++].count) {
      const struct layout_piece lp = {
        .backing = r->pieces[i].backing,
        .offset = r->pieces[i].offset,
        .count = r->pieces[i].count,
      };

      layout_gather_piece (layout, r->op.offset, &lp, data, d);
    }
  request_set_data (r, r->copy);
}

struct request *
request_new_write (uint64_t offset, uint64_t count, uint32_t flags,
                   const void *data, const struct request_place *place)
{
  struct request *r = request_make (ENG_WRITE, offset, count, flags,
                                    place->slot ? 0 : place->room);

  if (r == NULL)
    return NULL;
  if (place->slot) {
    /* Placed by offset, copied outside the lock: the slot is ours. */
    memcpy (place->slot, data, count);
    r->copy = place->slot;
    r->chunk = place->chunk;
    request_set_data (r, place->slot);
  }
  else if (r->room >= count)
    request_copy_data (r, data, place->gather);
  else
    request_set_data (r, data);
  return r;
}

/* A block with room for the copy: recycled like every other block,
 * where a buffer of its own would go back to malloc, which trims its
 * heap and faults the pages in again at the next one.
 */
struct request *
request_with_copy (struct request *r, const void *data)
{
  struct request *n = request_alloc (r->op.nr_pieces, r->op.count);

  if (n == NULL) {
    nbdkit_error ("malloc: %m");
    request_free (&r->op);
    return NULL;
  }
  n->op = r->op;
  n->op.pieces = n->pieces;
  memcpy (n->pieces, r->pieces, r->op.nr_pieces * sizeof *n->pieces);
  request_copy_data (n, data, layout_range_scattered (layout, r->op.offset,
                                                     r->op.count));
  request_free (&r->op);
  return n;
}

void
request_free (struct eng_op *op)
{
  struct request *r = (struct request *) op;

  if (r->chunk)
    arena_put (r->chunk);
  free (op);
}

void
request_recycle_locked (struct eng_actions *a)
{
  struct eng_op *op, *next;

  list_for_each_safe (op, next, &a->release, release_link) {
    struct request *r = (struct request *) op;

    if (r->cls >= 0 && r->chunk == NULL && cache_len[r->cls] < CACHE_SLOTS &&
        __atomic_load_n (&kept_bytes, __ATOMIC_RELAXED) +
        class_size (r->cls) <= kept_max) {
      __atomic_add_fetch (&kept_bytes, class_size (r->cls),
                          __ATOMIC_RELAXED);
      list_unlink (&op->release_link);
      cache[r->cls][cache_len[r->cls]++] = r;
    }
  }
}

void
request_refill_locked (size_t nr_pieces, size_t room)
{
  int k = class_of (nr_pieces, room);

  /* Without the key, a thread's spare would outlive the thread. */
  if (!spare_key_made || k < 0 || cache_len[k] == 0 ||
      pthread_getspecific (spare_key) != NULL)
    return;
  /* Still kept: a spare counts in kept_bytes until used or freed. */
  if (pthread_setspecific (spare_key, cache[k][cache_len[k] - 1]) != 0)
    return;
  cache_len[k]--;
}

static void
spare_exit (void *spare)
{
  kept_sub (class_size (((struct request *) spare)->cls));
  free (spare);
}

/* Free every cached block.  Returns the bytes freed. */
static size_t
cache_drain_locked (void)
{
  size_t freed = 0;
  int k;

  for (k = 0; k < REQ_CLASSES; ++k)
    while (cache_len[k] > 0) {
      free (cache[k][--cache_len[k]]);
      freed += class_size (k);
    }
  kept_sub (freed);
  return freed;
}

void
request_trim (void)
{
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&eng_lock);
    cache_drain_locked ();
  }
  /* glibc keeps what was freed in its arenas (one per thread that
   * allocated, up to 8 per CPU): nbdkit's per-thread request buffers and
   * our copies of hundreds of connections' worker threads stay in the
   * process's RSS until trimmed.  malloc_trim(0) returns the free pages
   * of every arena to the kernel.
   */
  malloc_trim (0);
}

int
request_init (uint64_t max_bytes, const struct layout *l, struct backing *b)
{
  int err = pthread_key_create (&spare_key, spare_exit);

  if (err != 0) {
    errno = err;
    nbdkit_error ("pthread_key_create: %m");
    return -1;
  }
  spare_key_made = true;
  kept_max = max_bytes;
  layout = l;
  backings = b;
  return 0;
}

void
request_fini (void)
{

  if (spare_key_made)
    pthread_key_delete (spare_key);
  spare_key_made = false;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&eng_lock);
  cache_drain_locked ();
}
