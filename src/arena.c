/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* arena.c: writeback copies of a stream, placed by offset.  See
 * arena.h.
 */

#include <config.h>

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"

void
arena_init (struct arena *a, unsigned max_chunks)
{
  memset (a, 0, sizeof *a);
  a->last_end = UINT64_MAX;     /* Near nothing. */
  a->max_chunks = max_chunks < ARENA_MAX_CHUNKS ? max_chunks
    : ARENA_MAX_CHUNKS;
}

static void
chunk_free (struct arena_chunk *c)
{
  free (c->data);
  free (c);
}

void
arena_put (struct arena_chunk *c)
{
  if (__atomic_sub_fetch (&c->refs, 1, __ATOMIC_ACQ_REL) == 0)
    chunk_free (c);
}

/* Grains [first, last] of c: are they all free?  (mark: take them.) */
static bool
grains (struct arena_chunk *c, size_t first, size_t last, bool mark)
{
  size_t g;

  for (g = first; g <= last; ++g) {
    uint64_t bit = UINT64_C (1) << (g % 64);

    if (mark)
      c->taken[g / 64] |= bit;
    else if (c->taken[g / 64] & bit)
      return false;
  }
  return true;
}

/* Does [offset, offset+count) lie in c's range, on free grains? */
static bool
fits (struct arena_chunk *c, uint64_t offset, size_t count)
{
  size_t pos;

  if (c == NULL || offset < c->base ||
      offset + count > c->base + ARENA_CHUNK)
    return false;
  pos = offset - c->base;
  return grains (c, pos / ARENA_GRAIN, (pos + count - 1) / ARENA_GRAIN,
                 false);
}

/* A chunk of a with no copy alive (only the arena's reference), or a
 * new one if a may have more; NULL if none.  Its grains are all free.
 */
static struct arena_chunk *
free_chunk (struct arena *a)
{
  struct arena_chunk *c;
  unsigned i;

  for (i = 0; i < a->nr_chunks; ++i) {
    c = a->chunks[i];
    /* Only placing (the caller's, serialised) raises refs from 1. */
    if (c != a->cur && __atomic_load_n (&c->refs, __ATOMIC_ACQUIRE) == 1) {
      memset (c->taken, 0, sizeof c->taken);
      return c;
    }
  }
  if (a->nr_chunks >= a->max_chunks)
    return NULL;
  c = calloc (1, sizeof *c);
  if (c == NULL)
    return NULL;
  c->data = malloc (ARENA_CHUNK);
  if (c->data == NULL) {
    free (c);
    return NULL;
  }
  c->refs = 1;
  a->chunks[a->nr_chunks++] = c;
  return c;
}

/* Does [offset, offset+count) lie in c's range? */
static bool
inside (const struct arena_chunk *c, uint64_t offset, size_t count)
{
  return c != NULL && offset >= c->base &&
    offset + count <= c->base + ARENA_CHUNK;
}

void *
arena_place (struct arena *a, uint64_t offset, size_t count,
             struct arena_chunk **chunk)
{
  struct arena_chunk *c = a->cur;
  uint64_t last_end = a->last_end;
  size_t pos;

  a->last_end = offset + count;
  if (count == 0 || count >= ARENA_MAX_WRITE ||
      offset > UINT64_MAX - ARENA_CHUNK)
    goto refuse;
  /* The chunk before first: the slack of the current one overlaps its
   * end, and a straggler there belongs next to its neighbours.
   */
  if (fits (a->prev, offset, count))
    c = a->prev;
  else if (!inside (c, offset, count)) {
    /* Outside the current chunk: a new one for a stream (a write near
     * the last one), moving on past the chunk's end or starting
     * elsewhere; not for a straggler just behind the chunk (it would
     * take a chunk for one write), nor for a write far from the last.
     */
    bool near = offset + ARENA_SLACK >= last_end &&
      offset <= last_end + ARENA_SLACK;
    bool behind = c != NULL && offset < c->base &&
      offset + ARENA_CHUNK >= c->base;

    if (behind || !near || (c = free_chunk (a)) == NULL)
      goto refuse;
    c->base = offset >= ARENA_SLACK ? offset - ARENA_SLACK : 0;
    c->base &= ~(uint64_t) (ARENA_GRAIN - 1);
    a->prev = a->cur;
    a->cur = c;
  }
  else if (!fits (c, offset, count))
    goto refuse;
  pos = offset - c->base;
  grains (c, pos / ARENA_GRAIN, (pos + count - 1) / ARENA_GRAIN, true);
  __atomic_add_fetch (&c->refs, 1, __ATOMIC_RELAXED);
  *chunk = c;
  a->placed++;
  return c->data + pos;

 refuse:
  a->refused++;
  return NULL;
}

void
arena_fini (struct arena *a)
{
  unsigned i;

  for (i = 0; i < a->nr_chunks; ++i)
    arena_put (a->chunks[i]);
  a->nr_chunks = 0;
  a->cur = a->prev = NULL;
}
