/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* itree.h: intervals [start, end) indexed by start, for "which of them
 * overlap this range" in O(log n + what overlaps).
 *
 * A treap (a binary search tree by (start, id) that is also a heap by a
 * pseudo-random priority, so it stays balanced with high probability)
 * where each node also keeps the largest end in its subtree: a subtree
 * whose largest end is at or before a range's start holds nothing that
 * overlaps it, and a node that starts at or after the range's end has
 * only such nodes to its right.  The priorities come from the tree's
 * own generator, seeded by the owner: with the same seed the same calls
 * always make the same tree (a test can bound its cost), and with a
 * seed a client does not know it cannot pick offsets that make the
 * tree a path (n deep, each operation O(n)).
 *
 * Intrusive: a node lives inside its owner (an engine run), which
 * fills start and end before itree_insert and leaves them alone until
 * itree_remove.  The tree owns no memory.
 */
#ifndef NBDPLUG_ITREE_H
#define NBDPLUG_ITREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct itree_node {
  uint64_t start, end;          /* Set by the owner: [start, end). */
  /* The tree's. */
  uint64_t id;                  /* Breaks ties of start: insertion order. */
  uint64_t max_end;             /* Largest end in this subtree. */
  uint32_t prio;                /* Not below a child's. */
  struct itree_node *left, *right;
};

/* The owner of node, a struct type with the node as its member. */
#define itree_entry(node, type, member) \
  ((type *) ((char *) (node) - offsetof (type, member)))

struct itree {
  struct itree_node *root;
  size_t n;
  uint64_t next_id;
  uint32_t rng;                 /* xorshift32 state, never 0. */
};

/* An empty tree whose priorities come from seed. */
extern void itree_init (struct itree *t, uint32_t seed)
  __attribute__ ((__nonnull__ (1)));

/* Forget every node at once (their owners took them back); the
 * generator goes on.
 */
extern void itree_clear (struct itree *t)
  __attribute__ ((__nonnull__ (1)));

/* Add node (start < end), not in any tree. */
extern void itree_insert (struct itree *t, struct itree_node *node)
  __attribute__ ((__nonnull__ (1, 2)));

/* Take node, which is in t, out of it. */
extern void itree_remove (struct itree *t, struct itree_node *node)
  __attribute__ ((__nonnull__ (1, 2)));

/* Call fn(node, opaque) for each node of t that overlaps [start, end),
 * in order of start, until fn returns true.  fn must not insert or
 * remove nodes.  Returns true if fn stopped the walk.  Adds the nodes
 * looked at to *visits (the cost, for tests and statistics) unless
 * visits is NULL.
 */
typedef bool (*itree_fn) (struct itree_node *node, void *opaque);
extern bool itree_overlapping (const struct itree *t, uint64_t start,
                               uint64_t end, itree_fn fn, void *opaque,
                               uint64_t *visits)
  __attribute__ ((__nonnull__ (1, 4)));

#endif /* NBDPLUG_ITREE_H */
