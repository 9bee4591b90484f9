/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* test-arena: writeback copies placed by offset (src/arena.h). */

#include <config.h>

#undef NDEBUG
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "arena.h"
#include "tap.h"

#define K 4096
#define NR 64

/* A stream of 4 KiB writes brought in shuffled (each group of 16 in
 * reverse, as nbdkit's threads may bring a queue of 16): adjacent
 * offsets land adjacent in memory, so a merged run is one buffer.
 */
static void
test_stream_contiguous (void)
{
  struct arena a;
  struct arena_chunk *ref[NR];
  char *p[NR];
  uint64_t base = 1 << 30;
  unsigned i, adjacent = 0;

  arena_init (&a, 4);
  p[0] = arena_place (&a, base, K, &ref[0]);
  ok (p[0] == NULL, "a first write near nothing is not placed");
  for (i = 0; i < NR; ++i) {
    unsigned j = (i & ~15u) + 15 - (i & 15);   /* Reversed in 16s. */

    if (j == 0)
      continue;
    p[j] = arena_place (&a, base + (uint64_t) j * K, K, &ref[j]);
  }
  for (i = 1; i + 1 < NR; ++i)
    adjacent += p[i] != NULL && p[i + 1] == p[i] + K;
  ok (adjacent == NR - 2, "writes adjacent on the disk are adjacent in "
      "memory (%u of %u)", adjacent, NR - 2);
  ok (a.nr_chunks == 1, "one chunk (%u)", a.nr_chunks);
  /* A rewrite of a range still held keeps its own copy. */
  ok (arena_place (&a, base + 5 * K, K, &ref[0]) == NULL,
      "a rewrite of a held range is not placed over it");
  ok (arena_place (&a, base + 5 * K + 512, 512, &ref[0]) == NULL,
      "nor is a write inside a held grain");
  for (i = 1; i < NR; ++i)
    if (p[i] != NULL)
      arena_put (ref[i]);
  arena_fini (&a);
}

/* A stream moving on starts a new chunk past the current one's end,
 * reuses chunks whose copies were all put (the same memory), and
 * places nothing once max_chunks chunks hold live copies.
 */
static void
test_chunks_reused_and_bounded (void)
{
  struct arena a;
  struct arena_chunk *c, *first = NULL;
  size_t per = ARENA_CHUNK / (64 * K), i, nr = 0;
  static struct arena_chunk *refs[4096];
  uint64_t off = 0;
  char *p, *first_data = NULL;
  bool moved = true;

  arena_init (&a, 2);
  ok (arena_place (&a, off, 64 * K, &c) == NULL, "a first write at 0 is "
      "near nothing");
  off += 64 * K;
  /* Three chunks' worth with nothing put: the third is refused. */
  for (i = 0; i < 3 * per; ++i, off += 64 * K) {
    p = arena_place (&a, off, 64 * K, &c);
    if (p == NULL)
      continue;
    if (first == NULL) {
      first = c;
      first_data = p;
    }
    refs[nr++] = c;
  }
  ok (a.nr_chunks == 2, "at most max_chunks chunks (%u)", a.nr_chunks);
  ok (nr > per && nr < 3 * per, "a stream past them is not placed "
      "(%zu of %zu placed)", nr, 3 * per);
  /* Put them all: the next chunk is a reused one. */
  for (i = 0; i < nr; ++i)
    arena_put (refs[i]);
  p = arena_place (&a, off, 64 * K, &c);
  ok (p != NULL && a.nr_chunks == 2, "with the copies put, the stream "
      "goes on in a reused chunk");
  moved = c == first || c == a.chunks[1];
  ok (moved, "the chunk is one of the arena's two");
  (void) first_data;
  arena_put (c);
  arena_fini (&a);
}

/* Random writes start no chunk; a large one is never placed; a chunk
 * that outlives its arena is freed by the last put (valgrind checks).
 */
static void
test_random_and_lifetime (void)
{
  struct arena a;
  struct arena_chunk *c, *keep;
  uint64_t off = 12345 * K;
  unsigned i, placed = 0;

  arena_init (&a, 4);
  for (i = 0; i < 100; ++i) {
    off = (off * 1103515245 + 12345) % (UINT64_C (1) << 40) & ~(uint64_t) (K - 1);
    if (arena_place (&a, off, K, &c) != NULL) {
      placed++;
      arena_put (c);
    }
  }
  ok (placed == 0 && a.nr_chunks == 0, "random writes are not placed (%u) "
      "and start no chunk (%u)", placed, a.nr_chunks);
  arena_place (&a, 0, K, &c);
  ok (arena_place (&a, K, K, &keep) != NULL, "a stream is placed");
  ok (arena_place (&a, 2 * K, ARENA_MAX_WRITE, &c) == NULL,
      "a write of ARENA_MAX_WRITE is not");
  arena_fini (&a);
  /* The copy outlives the arena. */
  arena_put (keep);
  ok (true, "the last put after arena_fini frees the chunk");
}

/* A stream that starts again elsewhere (a client wrapping around its
 * range, a second file) gets a chunk there too; a write just behind the
 * current chunk that fits no chunk is not placed.
 */
static void
test_stream_restarts (void)
{
  struct arena a;
  struct arena_chunk *c[8];
  uint64_t top = UINT64_C (1) << 30;
  char *p;

  arena_init (&a, 4);
  arena_place (&a, top, K, &c[0]);
  p = arena_place (&a, top + K, K, &c[0]);
  ok (p != NULL, "a stream at 1 GiB is placed");
  arena_place (&a, 0, K, &c[1]);
  ok (arena_place (&a, K, K, &c[1]) != NULL, "so is the same stream "
      "again from 0");
  ok (c[1] != c[0] && a.nr_chunks == 2, "in a chunk of its own");
  arena_place (&a, top - ARENA_CHUNK, K, &c[2]);
  ok (arena_place (&a, top + 2 * K, K, &c[2]) == p + K,
      "the first stream's next write lands next to its last one (in the "
      "chunk before)");
  arena_put (c[0]);
  arena_put (c[1]);
  arena_put (c[2]);
  arena_fini (&a);
}

int
main (void)
{
  test_stream_contiguous ();
  test_chunks_reused_and_bounded ();
  test_random_and_lifetime ();
  test_stream_restarts ();
  return done_testing ();
}
