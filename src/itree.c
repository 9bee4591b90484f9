/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* itree.c: see itree.h.  Insert and remove are the treap's split and
 * merge, recursive: the depth is O(log n) with high probability (about
 * 3 log2 n at worst in practice), a few dozen frames for a million
 * nodes.
 */

#include <config.h>

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "itree.h"
#include "minmax.h"

void
itree_init (struct itree *t, uint32_t seed)
{
  t->root = NULL;
  t->n = 0;
  t->next_id = 0;
  /* xorshift's state is never 0. */
  t->rng = seed != 0 ? seed : 2463534242u;
}

void
itree_clear (struct itree *t)
{
  t->root = NULL;
  t->n = 0;
}

static uint32_t
next_prio (struct itree *t)
{
  uint32_t x = t->rng;

  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  t->rng = x;
  return x;
}

/* Does a come before b in the tree's order? */
static bool
before (const struct itree_node *a, const struct itree_node *b)
{
  return a->start < b->start || (a->start == b->start && a->id < b->id);
}

/* node's max_end from its own end and its children's. */
static void
update (struct itree_node *node)
{
  uint64_t m = node->end;

  if (node->left)
    m = MAX (m, node->left->max_end);
  if (node->right)
    m = MAX (m, node->right->max_end);
  node->max_end = m;
}

/* Split t into the nodes before key (*l) and the others (*r). */
static void
split (struct itree_node *t, const struct itree_node *key,
       struct itree_node **l, struct itree_node **r)
{
  if (t == NULL) {
    *l = *r = NULL;
    return;
  }
  if (before (t, key)) {
    split (t->right, key, &t->right, r);
    *l = t;
  }
  else {
    split (t->left, key, l, &t->left);
    *r = t;
  }
  update (t);
}

/* Join a and b, every node of a before every node of b. */
static struct itree_node *
merge (struct itree_node *a, struct itree_node *b)
{
  if (a == NULL)
    return b;
  if (b == NULL)
    return a;
  if (a->prio >= b->prio) {
    a->right = merge (a->right, b);
    update (a);
    return a;
  }
  b->left = merge (a, b->left);
  update (b);
  return b;
}

static struct itree_node *
insert (struct itree_node *t, struct itree_node *node)
{
  if (t == NULL)
    return node;
  if (node->prio > t->prio) {
    split (t, node, &node->left, &node->right);
    update (node);
    return node;
  }
  if (before (node, t))
    t->left = insert (t->left, node);
  else
    t->right = insert (t->right, node);
  update (t);
  return t;
}

void
itree_insert (struct itree *t, struct itree_node *node)
{
  assert (node->start < node->end);
  node->id = t->next_id++;
  node->prio = next_prio (t);
  node->left = node->right = NULL;
  node->max_end = node->end;
  t->root = insert (t->root, node);
  t->n++;
}

static struct itree_node *
remove_from (struct itree_node *t, struct itree_node *node)
{
  assert (t != NULL);           /* node is in the tree. */
  if (t == node)
    return merge (t->left, t->right);
  if (before (node, t))
    t->left = remove_from (t->left, node);
  else
    t->right = remove_from (t->right, node);
  update (t);
  return t;
}

void
itree_remove (struct itree *t, struct itree_node *node)
{
  assert (t->n > 0);
  t->root = remove_from (t->root, node);
  node->left = node->right = NULL;
  t->n--;
}

static bool
walk (struct itree_node *t, uint64_t start, uint64_t end, itree_fn fn,
      void *opaque, uint64_t *visits)
{
  if (t == NULL)
    return false;
  ++*visits;
  if (t->max_end <= start)
    return false;               /* Everything here ends before start. */
  if (walk (t->left, start, end, fn, opaque, visits))
    return true;
  if (t->start >= end)
    return false;               /* It and everything to its right start
                                 * at or after end. */
  if (t->end > start && fn (t, opaque))
    return true;
  return walk (t->right, start, end, fn, opaque, visits);
}

bool
itree_overlapping (const struct itree *t, uint64_t start, uint64_t end,
                   itree_fn fn, void *opaque, uint64_t *visits)
{
  uint64_t n = 0;
  bool stopped;

  if (start >= end)
    return false;
  stopped = walk (t->root, start, end, fn, opaque, &n);
  if (visits != NULL)
    *visits += n;
  return stopped;
}
