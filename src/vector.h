/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* vector.h: a growable array of one element type.
 *
 * DEFINE_VECTOR_TYPE (name, type) defines
 *   typedef struct { type *ptr; size_t len, cap; } name;
 *   int  name_append (name *v, type elem);   0, or -1 with errno (ENOMEM)
 *   int  name_reserve (name *v, size_t n);   room for n more elements
 *   void name_reset (name *v);               free the storage, empty
 * and `empty_vector` initialises any vector.
 *
 * Growth doubles the capacity so appends are amortised O(1).  The vector
 * owns its storage; it never owns what its elements point to.
 */
#ifndef NBDPLUG_VECTOR_H
#define NBDPLUG_VECTOR_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#define empty_vector { .ptr = NULL, .len = 0, .cap = 0 }

#define DEFINE_VECTOR_TYPE(name, type)                                  \
  typedef struct {                                                      \
    type *ptr;                                                          \
    size_t len;                                                         \
    size_t cap;                                                         \
  } name;                                                               \
                                                                        \
  static inline int __attribute__ ((__unused__))                        \
  name##_reserve (name *v, size_t n)                                    \
  {                                                                     \
    size_t newcap;                                                      \
    type *p;                                                            \
                                                                        \
    if (v->len + n <= v->cap)                                           \
      return 0;                                                         \
    newcap = v->cap ? v->cap : 8;                                       \
    while (newcap < v->len + n) {                                       \
      if (newcap > SIZE_MAX / 2 / sizeof (type)) {                      \
        errno = ENOMEM;                                                 \
        return -1;                                                      \
      }                                                                 \
      newcap *= 2;                                                      \
    }                                                                   \
    p = realloc (v->ptr, newcap * sizeof (type));                       \
    if (p == NULL)                                                      \
      return -1;                                                        \
    v->ptr = p;                                                         \
    v->cap = newcap;                                                    \
    return 0;                                                           \
  }                                                                     \
                                                                        \
  static inline int __attribute__ ((__unused__))                        \
  name##_append (name *v, type elem)                                    \
  {                                                                     \
    if (name##_reserve (v, 1) == -1)                                    \
      return -1;                                                        \
    v->ptr[v->len++] = elem;                                            \
    return 0;                                                           \
  }                                                                     \
                                                                        \
  static inline void __attribute__ ((__unused__))                       \
  name##_reset (name *v)                                                \
  {                                                                     \
    free (v->ptr);                                                      \
    v->ptr = NULL;                                                      \
    v->len = v->cap = 0;                                                \
  }

#endif /* NBDPLUG_VECTOR_H */
