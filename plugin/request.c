/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* request.c: request blocks, recycled.  See request.h. */

#include <config.h>

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "cleanup.h"
#include "glue.h"
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
    nr_pieces * sizeof (struct plug_req);

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
  struct eng_op *op, *next, **keep = &a->release;

  for (op = a->release; op != NULL; op = next) {
    struct request *r = (struct request *) op;

    next = op->release_next;
    if (r->cls >= 0 && r->chunk == NULL && cache_len[r->cls] < CACHE_SLOTS &&
        __atomic_load_n (&kept_bytes, __ATOMIC_RELAXED) +
        class_size (r->cls) <= kept_max) {
      __atomic_add_fetch (&kept_bytes, class_size (r->cls),
                          __ATOMIC_RELAXED);
      cache[r->cls][cache_len[r->cls]++] = r;
      continue;
    }
    *keep = op;
    keep = &op->release_next;
  }
  *keep = NULL;
  a->release_tail = keep;
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
request_init (uint64_t max_bytes)
{
  int err = pthread_key_create (&spare_key, spare_exit);

  if (err != 0) {
    errno = err;
    nbdkit_error ("pthread_key_create: %m");
    return -1;
  }
  spare_key_made = true;
  kept_max = max_bytes;
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
