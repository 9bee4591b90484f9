/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* test-itree: src/itree against a plain array of the same intervals:
 * random inserts, removes and queries, the tree's shape rules after
 * each step, and the cost of a query in a large tree.
 */

#include <config.h>

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itree.h"
#include "tap.h"

#define MAX_NODES 100000

static struct itree_node nodes[MAX_NODES];
static bool in_tree[MAX_NODES];
static uint64_t rng = 88172645463325252ULL;

static unsigned
rnd (unsigned n)
{
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (unsigned) (rng % n);
}

/* The shape rules of the subtree at t, whose keys lie after lo and
 * before hi (NULL: unbounded); returns its size, or -1 if broken.
 */
static long
check_subtree (const struct itree_node *t, const struct itree_node *lo,
               const struct itree_node *hi, unsigned depth, unsigned *maxd)
{
  long l, r;
  uint64_t m;

  if (t == NULL)
    return 0;
  if (depth > *maxd)
    *maxd = depth;
  if (lo && !(lo->start < t->start ||
              (lo->start == t->start && lo->id < t->id)))
    return -1;
  if (hi && !(t->start < hi->start ||
              (t->start == hi->start && t->id < hi->id)))
    return -1;
  if ((t->left && t->left->prio > t->prio) ||
      (t->right && t->right->prio > t->prio))
    return -1;
  m = t->end;
  if (t->left && t->left->max_end > m)
    m = t->left->max_end;
  if (t->right && t->right->max_end > m)
    m = t->right->max_end;
  if (t->max_end != m)
    return -1;
  l = check_subtree (t->left, lo, t, depth + 1, maxd);
  r = check_subtree (t->right, t, hi, depth + 1, maxd);
  if (l < 0 || r < 0)
    return -1;
  return l + r + 1;
}

struct found {
  size_t n;
  size_t idx[MAX_NODES];
  size_t stop_after;            /* 0: never stop. */
};

static bool
collect (struct itree_node *node, void *opaque)
{
  struct found *f = opaque;

  f->idx[f->n++] = (size_t) (node - nodes);
  return f->stop_after > 0 && f->n == f->stop_after;
}

/* Does the tree's answer for [s, e) equal the array's (the same nodes,
 * in order of start)?
 */
static bool
query_matches (const struct itree *t, uint64_t s, uint64_t e, size_t nr)
{
  static struct found got;
  size_t i, k = 0;
  uint64_t visits = 0, last_start = 0;

  got.n = 0;
  got.stop_after = 0;
  itree_overlapping (t, s, e, collect, &got, &visits);
  for (i = 0; i < got.n; ++i) {
    const struct itree_node *x = &nodes[got.idx[i]];

    if (!in_tree[got.idx[i]] || x->start >= e || x->end <= s ||
        x->start < last_start)
      return false;
    last_start = x->start;
  }
  for (i = 0; i < nr; ++i)
    if (in_tree[i] && nodes[i].start < e && nodes[i].end > s)
      k++;
  return k == got.n;
}

static void
test_random (void)
{
  struct itree t;
  unsigned step, maxd = 0;
  const size_t nr = 2000;
  size_t n = 0;
  bool shape_ok = true, queries_ok = true;
  long size;

  itree_init (&t, 1);
  for (step = 0; step < 200000; ++step) {
    size_t i = rnd (nr);
    unsigned what = rnd (10);

    if (what < 6) {
      if (in_tree[i])
        itree_remove (&t, &nodes[i]), in_tree[i] = false, n--;
      else {
        /* Short and long intervals, many with the same start. */
        nodes[i].start = rnd (4) == 0 ? 4096 : rnd (1 << 16);
        nodes[i].end = nodes[i].start + 1 + rnd (rnd (8) == 0 ? 8192 : 64);
        itree_insert (&t, &nodes[i]);
        in_tree[i] = true;
        n++;
      }
    }
    else {
      uint64_t s = rnd (1 << 16), e = s + 1 + rnd (rnd (4) == 0 ? 4096 : 16);

      if (!query_matches (&t, s, e, nr))
        queries_ok = false;
    }
    if (step % 97 == 0) {
      size = check_subtree (t.root, NULL, NULL, 1, &maxd);
      if (size != (long) n || t.n != n)
        shape_ok = false;
    }
  }
  ok (queries_ok, "200000 random steps: every query found what the array "
      "has, in order of start");
  ok (shape_ok, "order, heap and max_end hold (%zu nodes at the end, "
      "depth at most %u)", n, maxd);
  ok (maxd <= 40, "the depth stayed at most 40 for %zu nodes", nr);
  while (t.root != NULL) {
    size_t i = (size_t) (t.root - nodes);

    itree_remove (&t, t.root);
    in_tree[i] = false;
  }
  ok (t.n == 0, "removing the roots empties it");
}

/* The walk stops where fn says. */
static void
test_stop (void)
{
  static struct found got;
  struct itree t;
  uint64_t visits = 0;
  size_t i;
  bool stopped;

  itree_init (&t, 1);
  for (i = 0; i < 10; ++i) {
    nodes[i].start = i * 10;
    nodes[i].end = i * 10 + 15;
    itree_insert (&t, &nodes[i]);
  }
  got.n = 0;
  got.stop_after = 2;
  stopped = itree_overlapping (&t, 0, 1000, collect, &got, &visits);
  ok (stopped && got.n == 2 && got.idx[0] == 0 && got.idx[1] == 1,
      "a walk stopped by fn after 2 reports the first two");
  got.n = 0;
  got.stop_after = 0;
  stopped = itree_overlapping (&t, 25, 26, collect, &got, &visits);
  ok (!stopped && got.n == 1 && got.idx[0] == 2,
      "[25, 26) overlaps [20, 35) only: ends are exclusive (%zu found)",
      got.n);
  got.n = 0;
  stopped = itree_overlapping (&t, 5, 5, collect, &got, &visits);
  ok (!stopped && got.n == 0, "an empty range overlaps nothing");
  for (i = 0; i < 10; ++i)
    itree_remove (&t, &nodes[i]);
}

/* The cost of a query follows what overlaps, not the size: 100000
 * disjoint intervals, a query that overlaps 3 of them.
 */
static void
test_cost (void)
{
  static struct found got;
  struct itree t;
  uint64_t visits = 0, worst = 0;
  size_t i, q;

  itree_init (&t, 1);
  for (i = 0; i < MAX_NODES; ++i) {
    nodes[i].start = (uint64_t) i * 8;
    nodes[i].end = (uint64_t) i * 8 + 4;
    itree_insert (&t, &nodes[i]);
  }
  for (q = 0; q < 1000; ++q) {
    uint64_t s = (uint64_t) rnd (MAX_NODES - 3) * 8 + 2;

    visits = 0;
    got.n = 0;
    got.stop_after = 0;
    itree_overlapping (&t, s, s + 18, collect, &got, &visits);
    if (got.n != 3)
      break;
    if (visits > worst)
      worst = visits;
  }
  ok (q == 1000, "1000 queries found their 3 intervals each");
  ok (worst <= 200, "in %zu intervals a query looked at %" PRIu64
      " nodes at most (bound 200)", (size_t) MAX_NODES, worst);
  for (i = 0; i < MAX_NODES; ++i)
    itree_remove (&t, &nodes[i]);
  ok (t.n == 0 && t.root == NULL, "and all of them go");
}

/* Depth of the deepest node. */
static unsigned
depth_of (const struct itree_node *t)
{
  unsigned l, r;

  if (t == NULL)
    return 0;
  l = depth_of (t->left);
  r = depth_of (t->right);
  return 1 + (l > r ? l : r);
}

static uint32_t *prio_of;

static int
by_prio_desc (const void *a, const void *b)
{
  uint32_t x = prio_of[*(const size_t *) a], y = prio_of[*(const size_t *) b];

  return x > y ? -1 : x < y;
}

/* Keys picked against a known seed: the i-th insert gets the i-th
 * number of the generator, so giving it the key of that number's rank
 * makes the tree a path.  The same keys against another seed make a
 * tree of the usual depth: the owner's secret seed is the defence.
 */
static void
test_known_seed (void)
{
  enum { N = 2000 };
  static uint32_t prio[N];
  static size_t order[N];
  static uint64_t key[N];
  const uint32_t known = 12345;
  uint32_t x = known;
  unsigned depth[2];
  size_t i;
  int k;

  for (i = 0; i < N; ++i) {
    x ^= x << 13;               /* itree.c's generator. */
    x ^= x >> 17;
    x ^= x << 5;
    prio[i] = x;
    order[i] = i;
  }
  prio_of = prio;
  qsort (order, N, sizeof order[0], by_prio_desc);
  for (i = 0; i < N; ++i)
    key[order[i]] = i;
  for (k = 0; k < 2; ++k) {
    struct itree t;

    itree_init (&t, k == 0 ? known : known + 1);
    for (i = 0; i < N; ++i) {
      nodes[i].start = key[i] * 8;
      nodes[i].end = key[i] * 8 + 4;
      itree_insert (&t, &nodes[i]);
    }
    depth[k] = depth_of (t.root);
    for (i = 0; i < N; ++i)
      itree_remove (&t, &nodes[i]);
  }
  ok (depth[0] == N, "keys picked against the tree's seed make a path "
      "(depth %u of %u)", depth[0], (unsigned) N);
  ok (depth[1] <= 40, "against another seed, a tree of depth %u "
      "(at most 40)", depth[1]);
}

int
main (void)
{
  test_random ();
  test_stop ();
  test_cost ();
  test_known_seed ();
  return done_testing ();
}
