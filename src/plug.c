/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* plug.c: collect, sort and merge.  See plug.h for the rules. */

#include <config.h>

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "minmax.h"
#include "plug.h"

static const char *const reason_names[PLUG_NR_REASONS] = {
  [PLUG_UNPLUG_FLUSH] = "flush",
  [PLUG_UNPLUG_FUA] = "fua",
  [PLUG_UNPLUG_IDLE] = "idle",
  [PLUG_UNPLUG_MAX_REQUESTS] = "max-requests",
  [PLUG_UNPLUG_MAX_BYTES] = "max-bytes",
  [PLUG_UNPLUG_MAX_DELAY] = "max-delay",
  [PLUG_UNPLUG_READ] = "read",
  [PLUG_UNPLUG_OVERLAP] = "overlap",
  [PLUG_UNPLUG_CLOSE] = "close",
  [PLUG_UNPLUG_MEMORY] = "memory",
  [PLUG_UNPLUG_PARKED] = "parked",
  [PLUG_UNPLUG_QUIET] = "quiet",
};

const char *
plug_reason_name (enum plug_reason r)
{
  if ((unsigned) r >= PLUG_NR_REASONS)
    abort ();
  return reason_names[r];
}

int
plug_init (struct plug *p, const struct plug_limits *lim,
           uint32_t nr_backings)
{
  uint32_t b;

  memset (p, 0, sizeof *p);
  if (lim->max_requests == 0 || lim->max_bytes == 0 ||
      lim->max_merge == 0 || lim->max_iov == 0 || nr_backings == 0) {
    errno = EINVAL;
    return -1;
  }
  p->bounds = calloc (nr_backings, sizeof *p->bounds);
  if (p->bounds == NULL)
    return -1;
  if (lim->max_requests > PLUG_SCAN_MAX) {
    p->held = calloc (nr_backings, sizeof *p->held);
    if (p->held == NULL) {
      free (p->bounds);
      p->bounds = NULL;
      return -1;
    }
    for (b = 0; b < nr_backings; ++b)
      itree_init (&p->held[b], lim->seed + b);
  }
  p->lim = *lim;
  p->nr_backings = nr_backings;
  return 0;
}

void
plug_free (struct plug *p)
{
  plug_piece_vector_reset (&p->reqs);
  free (p->bounds);
  free (p->held);
  p->bounds = NULL;
  p->held = NULL;
}

static bool
ranges_overlap (uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
  return a < b + blen && b < a + alen;
}

static bool
seq_at_most (struct itree_node *node, void *opaque)
{
  const struct plug_piece *h = itree_entry (node, struct plug_piece, node);

  return h->seq <= *(const uint64_t *) opaque;
}

/* The plug's order, (backing, offset, seq): <0, 0 or >0 as a goes
 * before, with or after b.  Kept as requests come (place_last) and by
 * the unplug's sort (compare_reqs).
 */
static int
req_cmp (const struct plug_piece *a, const struct plug_piece *b)
{
  if (a->backing != b->backing)
    return a->backing < b->backing ? -1 : 1;
  if (a->offset != b->offset)
    return a->offset < b->offset ? -1 : 1;
  if (a->seq != b->seq)
    return a->seq < b->seq ? -1 : 1;
  return 0;
}

/* In a plug in order, the first held request of this backing file
 * that ends after offset, or the end: held requests never overlap
 * (plug_add), so within one file their ends rise with their offsets.
 */
static size_t
first_ending_after (const struct plug *p, uint32_t backing, uint64_t offset)
{
  size_t lo = 0, hi = p->reqs.len;

  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const struct plug_piece *h = p->reqs.ptr[mid];

    if (h->backing < backing ||
        (h->backing == backing && h->offset + h->count <= offset))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

bool
plug_overlaps_seq (const struct plug *p, uint32_t backing,
                   uint64_t offset, uint64_t count, uint64_t max_seq)
{
  size_t i;

  assert (backing < p->nr_backings);
  if (count == 0)
    return false;
  /* Empty bounds (lo == hi) never overlap; nor does a request beyond
   * them, the common sequential case: no walk.
   */
  if (!ranges_overlap (p->bounds[backing].lo,
                       p->bounds[backing].hi - p->bounds[backing].lo,
                       offset, count))
    return false;
  if (p->held != NULL)
    return itree_overlapping (&p->held[backing], offset, offset + count,
                              seq_at_most, &max_seq, NULL);
  if (p->order == PLUG_IN_ORDER) {
    for (i = first_ending_after (p, backing, offset); i < p->reqs.len; ++i) {
      const struct plug_piece *h = p->reqs.ptr[i];

      if (h->backing != backing || h->offset >= offset + count)
        return false;
      if (h->seq <= max_seq)
        return true;
    }
    return false;
  }
  for (i = 0; i < p->reqs.len; ++i) {
    const struct plug_piece *h = p->reqs.ptr[i];

    if (h->backing == backing && h->seq <= max_seq &&
        ranges_overlap (h->offset, h->count, offset, count))
      return true;
  }
  return false;
}

/* r was just appended: move it back to its place while the plug is in
 * order, or give the order up if its place is too far back.
 */
static void
place_last (struct plug *p, struct plug_piece *r)
{
  size_t n = p->reqs.len - 1, at = n;

  if (p->order != PLUG_IN_ORDER)
    return;
  while (at > 0 && n - at < PLUG_SORT_SLACK &&
         req_cmp (r, p->reqs.ptr[at - 1]) < 0)
    at--;
  if (at > 0 && req_cmp (r, p->reqs.ptr[at - 1]) < 0) {
    p->order = PLUG_ARRIVAL;
    return;
  }
  memmove (&p->reqs.ptr[at + 1], &p->reqs.ptr[at],
           (n - at) * sizeof p->reqs.ptr[0]);
  p->reqs.ptr[at] = r;
}

int
plug_add (struct plug *p, struct plug_piece *r)
{
  assert (r->backing < p->nr_backings);
  assert (r->count > 0);
  assert (!plug_conflicts (p, r));

  if (plug_piece_vector_append (&p->reqs, r) == -1)
    return -1;

  if (p->reqs.len == 1) {
    p->oldest_ns = r->arrival_ns;
    p->multiple_backings = false;
  }
  else if (r->backing != p->reqs.ptr[0]->backing)
    p->multiple_backings = true;
  r->seq = p->next_seq++;
  place_last (p, r);

  if (p->bounds[r->backing].lo == p->bounds[r->backing].hi) {
    p->bounds[r->backing].lo = r->offset;
    p->bounds[r->backing].hi = r->offset + r->count;
  }
  else {
    p->bounds[r->backing].lo = MIN (p->bounds[r->backing].lo, r->offset);
    p->bounds[r->backing].hi = MAX (p->bounds[r->backing].hi,
                                    r->offset + r->count);
  }
  if (p->held != NULL) {
    r->node.start = r->offset;
    r->node.end = r->offset + r->count;
    itree_insert (&p->held[r->backing], &r->node);
  }
  if (r->op == PLUG_OP_WRITE)
    p->bytes += r->count;
  return 0;
}

bool
plug_full (const struct plug *p, enum plug_reason *reason)
{
  if (p->reqs.len >= p->lim.max_requests) {
    *reason = PLUG_UNPLUG_MAX_REQUESTS;
    return true;
  }
  if (p->bytes >= p->lim.max_bytes) {
    *reason = PLUG_UNPLUG_MAX_BYTES;
    return true;
  }
  return false;
}

static int
compare_reqs (const void *av, const void *bv)
{
  return req_cmp (*(struct plug_piece *const *) av,
                  *(struct plug_piece *const *) bv);
}

void
plug_sort (struct plug_piece **reqs, size_t n)
{
  if (n > 1)
    qsort (reqs, n, sizeof *reqs, compare_reqs);
}

/* Can b extend the run that currently ends with a? */
static bool
can_merge (const struct plug_piece *a, const struct plug_piece *b,
           uint64_t run_count, size_t run_n, const struct plug_limits *lim)
{
  if (a->backing != b->backing || a->op != b->op || a->flags != b->flags)
    return false;
  if (a->offset + a->count != b->offset)
    return false;
  if (run_count + b->count > lim->max_merge)
    return false;
  if (b->op == PLUG_OP_WRITE && run_n >= lim->max_iov)
    return false;
  return true;
}

static struct plug_run *
make_run (struct plug_piece *const *reqs, size_t n, size_t prefix)
{
  struct plug_run *run = plug_run_alloc (prefix, n);
  size_t i;

  if (run == NULL)
    return NULL;
  run->op = reqs[0]->op;
  run->flags = reqs[0]->flags;
  run->backing = reqs[0]->backing;
  run->offset = reqs[0]->offset;
  for (i = 0; i < n; ++i) {
    run->reqs[i] = reqs[i];
    run->count += reqs[i]->count;
  }
  return run;
}

int
plug_merge (struct plug_piece *const *reqs, size_t n,
            const struct plug_limits *lim, plug_run_vector *runs)
{
  size_t start = 0, i, before = runs->len;
  uint64_t run_count;

  while (start < n) {
    struct plug_run *run;

    run_count = reqs[start]->count;
    for (i = start + 1; i < n; ++i) {
      if (!can_merge (reqs[i-1], reqs[i], run_count, i - start, lim))
        break;
      run_count += reqs[i]->count;
    }
    run = make_run (&reqs[start], i - start, lim->run_prefix);
    if (run == NULL || plug_run_vector_append (runs, run) == -1) {
      int err = errno;
      plug_run_free (run);
      while (runs->len > before)
        plug_run_free (runs->ptr[--runs->len]);
      errno = err;
      return -1;
    }
    start = i;
  }
  return 0;
}

int
plug_take_runs (struct plug *p, plug_run_vector *runs)
{
  uint32_t b;

  if (p->reqs.len == 0)
    return 0;
  /* Sorting in place is safe even if merging then fails: the plug is
   * in order from then on, and seq keeps the arrival order recoverable.
   */
  if (p->order != PLUG_IN_ORDER) {
    plug_sort (p->reqs.ptr, p->reqs.len);
    p->order = PLUG_IN_ORDER;
  }
  if (plug_merge (p->reqs.ptr, p->reqs.len, &p->lim, runs) == -1)
    return -1;

  /* Detach: the plug is empty from here on, so a flush that re-enters
   * (the kernel's recursive flush_plug stall) finds nothing to do.
   */
  p->reqs.len = 0;
  p->bytes = 0;
  p->oldest_ns = 0;
  p->multiple_backings = false;
  for (b = 0; b < p->nr_backings; ++b) {
    p->bounds[b].lo = p->bounds[b].hi = 0;
    if (p->held != NULL)
      itree_clear (&p->held[b]); /* The nodes went with their requests. */
  }
  return 0;
}
