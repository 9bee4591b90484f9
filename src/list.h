/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* list.h: the one intrusive list of the project.
 *
 * A list is a circular, doubly linked ring through a head node that
 * holds no element: an empty list is a head pointing at itself, so
 * insertion and removal never test for NULL, and a node knows whether
 * it is on a list (list_linked) without a separate flag.  An element
 * embeds one struct list_node per list it can be on and is found from
 * the node with list_entry.  Queues (FIFO action lists) and ordered
 * lists (sorted by an insertion walk) are the same structure.
 *
 * Nothing here allocates or locks: the owner of the head says which
 * lock guards it (see each head's comment).
 */

#ifndef NBDPLUG_LIST_H
#define NBDPLUG_LIST_H

#include <stdbool.h>
#include <stddef.h>

struct list_node {
  struct list_node *prev, *next;
};

/* A head is a node; the separate name says which role a field plays. */
typedef struct list_node list_head;

#define LIST_HEAD_INIT(h) { &(h), &(h) }

static inline void
list_init (struct list_node *n)
{
  n->prev = n->next = n;
}

static inline bool
list_empty (const list_head *h)
{
  return h->next == h;
}

/* A node initialised with list_init and removed with list_del is
 * unlinked; one on a list is linked.
 */
static inline bool
list_linked (const struct list_node *n)
{
  return n->next != n;
}

/* Insert N between A and B (neighbours). */
static inline void
list_insert_between (struct list_node *n,
                     struct list_node *a, struct list_node *b)
{
  n->prev = a;
  n->next = b;
  a->next = n;
  b->prev = n;
}

static inline void
list_add_tail (list_head *h, struct list_node *n)
{
  list_insert_between (n, h->prev, h);
}

static inline void
list_add_head (list_head *h, struct list_node *n)
{
  list_insert_between (n, h, h->next);
}

/* Insert N just before POS (POS may be the head: then at the tail). */
static inline void
list_add_before (struct list_node *pos, struct list_node *n)
{
  list_insert_between (n, pos->prev, pos);
}

/* Take N off its list and leave its own links stale: for a node that
 * is tested by no list_linked and only ever added to a list again.
 */
static inline void
list_unlink (struct list_node *n)
{
  n->prev->next = n->next;
  n->next->prev = n->prev;
}

/* Unlink N and leave it unlinked (list_linked is false afterwards). */
static inline void
list_del (struct list_node *n)
{
  list_unlink (n);
  list_init (n);
}

/* Move every node of FROM to the tail of TO; FROM ends empty. */
static inline void
list_splice_tail (list_head *to, list_head *from)
{
  if (list_empty (from))
    return;
  from->next->prev = to->prev;
  to->prev->next = from->next;
  from->prev->next = to;
  to->prev = from->prev;
  list_init (from);
}

#define list_entry(node, type, member) \
  ((type *) ((char *) (node) - offsetof (type, member)))

/* The first or last element, or NULL on an empty list. */
#define list_first(h, type, member) \
  (list_empty (h) ? NULL : list_entry ((h)->next, type, member))
#define list_last(h, type, member) \
  (list_empty (h) ? NULL : list_entry ((h)->prev, type, member))

/* The element after or before E on the list headed by H, or NULL. */
#define list_next(h, e, member) \
  ((e)->member.next == (h) ? NULL : \
   list_entry ((e)->member.next, __typeof__ (*(e)), member))
#define list_prev(h, e, member) \
  ((e)->member.prev == (h) ? NULL : \
   list_entry ((e)->member.prev, __typeof__ (*(e)), member))

/* The node of element e, or the head: e ran off the end of the walk
 * (e is then the head's would-be container and must not be used).
 */
#define list_entry_is_head(e, h, member) (&(e)->member == (h))

/* Walk the elements; the body may unlink the current one (the next is
 * read first), not others.  The walk compares nodes with the head and
 * never tests for NULL: a test per step fewer on every walk.
 */
#define list_for_each_safe(e, tmp, h, member)                           \
  for ((e) = list_entry ((h)->next, __typeof__ (*(e)), member),        \
         (tmp) = list_entry ((e)->member.next, __typeof__ (*(e)), member); \
       !list_entry_is_head ((e), (h), member);                          \
       (e) = (tmp),                                                     \
         (tmp) = list_entry ((e)->member.next, __typeof__ (*(e)), member))

#define list_for_each(e, h, member)                                     \
  for ((e) = list_entry ((h)->next, __typeof__ (*(e)), member);        \
       !list_entry_is_head ((e), (h), member);                          \
       (e) = list_entry ((e)->member.next, __typeof__ (*(e)), member))

/* Pop the first element, or NULL. */
#define list_pop(h, type, member) \
  (list_empty (h) ? NULL : \
   list_entry (list_del_ret ((h)->next), type, member))

static inline struct list_node *
list_del_ret (struct list_node *n)
{
  list_del (n);
  return n;
}

#endif /* NBDPLUG_LIST_H */
