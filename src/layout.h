/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* layout.h: where export bytes live among the backing files (pure).
 *
 * An export is made of nr backing files, either concatenated in order
 * (stripe == 0) or striped RAID-0 style in units of `stripe` bytes:
 * stripe unit k of the export lives in file k % nr at offset
 * (k / nr) * stripe.
 *
 * layout_map_files() turns an export range into at most one piece per
 * backing file (what a request is made of); the iterator gives one
 * piece per stripe unit (what reads and block status walk).  The owner
 * of a struct layout is the plugin's global state; it is read-only once
 * layout_init() succeeded, so any thread may call the mapping functions
 * without a lock.
 *
 * Invariants after layout_init(): nr >= 1, size > 0, and for stripe > 0
 * every file is the same multiple of stripe.
 */
#ifndef NBDPLUG_LAYOUT_H
#define NBDPLUG_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Why layout_init() refused a set of files (errno is EINVAL). */
enum layout_error {
  LAYOUT_OK = 0,
  LAYOUT_NO_FILES,              /* nr == 0 */
  LAYOUT_EMPTY_FILE,            /* sizes[bad] == 0 */
  LAYOUT_TOO_LARGE,             /* the sum overflows int64_t */
  LAYOUT_STRIPE_NOT_MULTIPLE,   /* sizes[bad] % stripe != 0 */
  LAYOUT_STRIPE_UNEQUAL,        /* sizes[bad] != sizes[0] */
  LAYOUT_STRIPE_BAD_SIZE,       /* stripe is not a multiple of 512 */
};

struct layout {
  size_t nr;                    /* Number of backing files. */
  uint64_t stripe;              /* 0: concatenate. */
  uint64_t size;                /* Export size in bytes. */
  uint64_t *sizes;              /* Owned: [nr] file sizes. */
  uint64_t *starts;             /* Owned: [nr] export offset of each file
                                 * (concat only, else NULL). */
};

/* One contiguous piece of an export range inside one backing file. */
struct layout_piece {
  uint32_t backing;             /* Index of the backing file. */
  uint64_t offset;              /* Offset in that file. */
  uint64_t count;               /* Bytes, > 0. */
  uint64_t buf_offset;          /* Offset of the piece in the request. */
};

/* Build a layout from the sizes of nr files.  Copies sizes.
 * Returns 0, or -1 with errno set (EINVAL: *why and *bad say what and
 * which file; ENOMEM).  Context: configuration, single threaded.
 */
extern int layout_init (struct layout *l, const uint64_t *sizes, size_t nr,
                        uint64_t stripe, enum layout_error *why, size_t *bad)
  __attribute__ ((__nonnull__ (1, 5, 6)));

extern void layout_free (struct layout *l);

/* A sentence describing why (for the plugin's nbdkit_error). */
extern const char *layout_strerror (enum layout_error why);

/* Iterate over all pieces of a range:
 *
 *   struct layout_iter it;
 *   struct layout_piece p;
 *   if (layout_iter_init (&it, l, off, count) == -1) ...;
 *   while (layout_iter_next (&it, &p)) ...;
 *
 * layout_iter_init() returns -1 with errno EINVAL when the range is
 * outside the export (count 0 is allowed and yields no piece).
 */
struct layout_iter {
  const struct layout *l;
  uint64_t offset;              /* Next export offset to map. */
  uint64_t left;                /* Bytes still to map. */
  uint64_t done;                /* Bytes already mapped. */
};

extern int layout_iter_init (struct layout_iter *it, const struct layout *l,
                             uint64_t offset, uint64_t count)
  __attribute__ ((__nonnull__ (1, 2)));
extern int layout_iter_next (struct layout_iter *it,
                             struct layout_piece *piece)
  __attribute__ ((__nonnull__ (1, 2)));

/* How many pieces layout_iter_next gives for a range that
 * layout_iter_init accepted, without mapping them: O(1) when striped,
 * O(log nr) when concatenated.
 */
extern size_t layout_nr_pieces (const struct layout *l, uint64_t offset,
                                uint64_t count)
  __attribute__ ((__nonnull__ (1)));

/* The range's part in each backing file it touches, at most l->nr
 * pieces: O(nr), whatever the length.  Striped, the stripe units of a
 * range that file f holds are units k, k + nr, k + 2 nr, ... of the
 * export, which are consecutive units of f (unit k is at (k / nr) *
 * stripe in file k % nr): their bytes form one contiguous range of f.
 * Concatenated, a file's part of a range is contiguous anyway.
 *
 * Fills pieces[0 .. *n) (room for l->nr), ordered by buf_offset, the
 * offset in the request of the piece's first byte.  Its other bytes
 * are not, in general, next to it in the request: layout_seg_next
 * lists the slices of the request that it joins, in file order.
 * Returns 0, or -1 with errno EINVAL if the range is not inside the
 * export (count 0 gives no piece).  Context: any thread.
 */
extern int layout_map_files (const struct layout *l, uint64_t offset,
                             uint64_t count, struct layout_piece *pieces,
                             size_t *n)
  __attribute__ ((__nonnull__ (1, 4, 5)));

/* How many pieces layout_map_files gives for a range that
 * layout_iter_init accepted, in O(1) (striped) or O(log nr).
 */
extern size_t layout_nr_file_pieces (const struct layout *l, uint64_t offset,
                                     uint64_t count)
  __attribute__ ((__nonnull__ (1)));

/* Does some piece of layout_map_files join slices of the request that
 * are not next to each other?  (Striped over more than one file, a
 * range longer than one row of units.)  If not, the pieces tile the
 * request in order: piece i starts where piece i-1 ends.
 */
extern bool layout_range_scattered (const struct layout *l, uint64_t offset,
                                   uint64_t count)
  __attribute__ ((__nonnull__ (1)));

/* The slices of the request [req_offset, ...) that a piece of
 * layout_map_files joins, in the order of the file:
 *
 *   struct layout_seg_iter it;
 *   uint64_t buf_offset, len;
 *   layout_seg_init (&it, l, req_offset, &piece);
 *   while (layout_seg_next (&it, &buf_offset, &len)) ...;
 *
 * One slice per stripe unit (one in all when concatenated).
 */
struct layout_seg_iter {
  const struct layout *l;
  uint64_t req_offset;          /* Export offset of the request. */
  uint32_t backing;
  uint64_t offset;              /* Next file offset. */
  uint64_t left;                /* Bytes of the piece still to list. */
};

extern void layout_seg_init (struct layout_seg_iter *it,
                             const struct layout *l, uint64_t req_offset,
                             const struct layout_piece *piece)
  __attribute__ ((__nonnull__ (1, 2, 4)));
extern int layout_seg_next (struct layout_seg_iter *it, uint64_t *buf_offset,
                            uint64_t *len)
  __attribute__ ((__nonnull__ (1, 2, 3)));

/* Copy a piece's bytes out of the request's data src (as the client
 * sent them, from export offset req_offset on) into dst, its slices
 * joined in file order: piece->count bytes, what the piece writes to
 * its file.
 */
extern void layout_gather_piece (const struct layout *l, uint64_t req_offset,
                                 const struct layout_piece *piece,
                                 const void *src, void *dst)
  __attribute__ ((__nonnull__ (1, 3, 4, 5)));

#endif /* NBDPLUG_LAYOUT_H */
