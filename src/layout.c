/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* layout.c: export offset -> (backing file, offset) mapping.  See layout.h. */

#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "minmax.h"

static int
refuse (enum layout_error *why, size_t *bad, enum layout_error w, size_t i)
{
  *why = w;
  *bad = i;
  errno = EINVAL;
  return -1;
}

int
layout_init (struct layout *l, const uint64_t *sizes, size_t nr,
             uint64_t stripe, enum layout_error *why, size_t *bad)
{
  uint64_t total = 0;
  size_t i;

  memset (l, 0, sizeof *l);
  *why = LAYOUT_OK;
  *bad = 0;
  if (nr == 0)
    return refuse (why, bad, LAYOUT_NO_FILES, 0);
  if (stripe > 0 && stripe % 512 != 0)
    return refuse (why, bad, LAYOUT_STRIPE_BAD_SIZE, 0);

  for (i = 0; i < nr; ++i) {
    if (sizes[i] == 0)
      return refuse (why, bad, LAYOUT_EMPTY_FILE, i);
    if (stripe > 0 && sizes[i] % stripe != 0)
      return refuse (why, bad, LAYOUT_STRIPE_NOT_MULTIPLE, i);
    if (stripe > 0 && sizes[i] != sizes[0])
      return refuse (why, bad, LAYOUT_STRIPE_UNEQUAL, i);
    /* NBD sizes are signed 64 bit in nbdkit (int64_t get_size). */
    if (sizes[i] > (uint64_t) INT64_MAX - total)
      return refuse (why, bad, LAYOUT_TOO_LARGE, i);
    total += sizes[i];
  }

  l->sizes = malloc (nr * sizeof *l->sizes);
  if (l->sizes == NULL)
    return -1;
  memcpy (l->sizes, sizes, nr * sizeof *l->sizes);
  if (stripe == 0) {
    l->starts = malloc (nr * sizeof *l->starts);
    if (l->starts == NULL) {
      free (l->sizes);
      l->sizes = NULL;
      return -1;
    }
    for (i = 0, total = 0; i < nr; ++i) {
      l->starts[i] = total;
      total += sizes[i];
    }
  }
  l->nr = nr;
  l->stripe = stripe;
  l->size = total;
  return 0;
}

void
layout_free (struct layout *l)
{
  free (l->sizes);
  free (l->starts);
  memset (l, 0, sizeof *l);
}

const char *
layout_strerror (enum layout_error why)
{
  switch (why) {
  case LAYOUT_OK: return "no error";
  case LAYOUT_NO_FILES: return "no backing file given (use file=PATH)";
  case LAYOUT_EMPTY_FILE: return "backing file is empty";
  case LAYOUT_TOO_LARGE: return "total size of the backing files is too large";
  case LAYOUT_STRIPE_NOT_MULTIPLE:
    return "backing file size is not a multiple of the stripe size";
  case LAYOUT_STRIPE_UNEQUAL:
    return "striped backing files must all have the same size";
  case LAYOUT_STRIPE_BAD_SIZE:
    return "stripe size must be a non-zero multiple of 512 bytes";
  }
  abort ();
}

/* Index of the file holding export byte `offset` (concat): binary search
 * for the last start <= offset.
 */
static size_t
concat_file (const struct layout *l, uint64_t offset)
{
  size_t lo = 0, hi = l->nr;

  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (l->starts[mid] <= offset)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

/* The first piece of a range inside the export (the callers check). */
static void
map_piece (const struct layout *l, uint64_t offset, uint64_t count,
           struct layout_piece *piece)
{
  piece->buf_offset = 0;
  if (l->stripe == 0) {
    size_t i = concat_file (l, offset);
    uint64_t in_file = offset - l->starts[i];

    piece->backing = i;
    piece->offset = in_file;
    piece->count = MIN (count, l->sizes[i] - in_file);
  }
  else {
    uint64_t unit = offset / l->stripe;
    uint64_t in_unit = offset % l->stripe;

    piece->backing = unit % l->nr;
    piece->offset = (unit / l->nr) * l->stripe + in_unit;
    piece->count = MIN (count, l->stripe - in_unit);
  }
}

int
layout_iter_init (struct layout_iter *it, const struct layout *l,
                  uint64_t offset, uint64_t count)
{
  if (offset > l->size || count > l->size - offset) {
    errno = EINVAL;
    return -1;
  }
  it->l = l;
  it->offset = offset;
  it->left = count;
  it->done = 0;
  return 0;
}

int
layout_iter_next (struct layout_iter *it, struct layout_piece *piece)
{
  if (it->left == 0)
    return 0;
  /* Inside the export: layout_iter_init checked the whole range. */
  map_piece (it->l, it->offset, it->left, piece);
  piece->buf_offset = it->done;
  it->offset += piece->count;
  it->left -= piece->count;
  it->done += piece->count;
  return 1;
}

size_t
layout_nr_pieces (const struct layout *l, uint64_t offset, uint64_t count)
{
  uint64_t last = offset + count - 1;

  if (count == 0)
    return 0;
  /* A piece ends at a file's end (concat) or a unit's end (stripe),
   * even where the next unit lands in the same file (nr == 1).
   */
  if (l->stripe == 0)
    return concat_file (l, last) - concat_file (l, offset) + 1;
  return last / l->stripe - offset / l->stripe + 1;
}

/* The striped case of layout_map_files: the units of [offset, end)
 * are u0 .. u1; file (u0 + j) % nr holds u0 + j, u0 + j + nr, ...,
 * consecutive units of that file, so its part runs from where the
 * range enters its first unit to where it leaves its last one.
 */
static size_t
stripe_map_files (const struct layout *l, uint64_t offset, uint64_t count,
                  struct layout_piece *pieces)
{
  const uint64_t stripe = l->stripe, nr = l->nr;
  const uint64_t end = offset + count;
  const uint64_t u0 = offset / stripe, u1 = (end - 1) / stripe;
  size_t n = 0;
  uint64_t j;

  for (j = 0; j < nr && u0 + j <= u1; ++j) {
    struct layout_piece *p = &pieces[n++];
    uint64_t first = u0 + j;
    uint64_t last = first + (u1 - first) / nr * nr;
    uint64_t start = first == u0 ? offset : first * stripe;
    uint64_t stop = last == u1 ? end : (last + 1) * stripe;

    p->backing = first % nr;
    p->offset = (first / nr) * stripe + start % stripe;
    p->count = (last / nr) * stripe + (stop - last * stripe) - p->offset;
    p->buf_offset = start - offset;
  }
  return n;
}

int
layout_map_files (const struct layout *l, uint64_t offset, uint64_t count,
                  struct layout_piece *pieces, size_t *n)
{
  struct layout_iter it;

  *n = 0;
  if (layout_iter_init (&it, l, offset, count) == -1)
    return -1;
  if (count == 0)
    return 0;
  if (l->stripe > 0) {
    *n = stripe_map_files (l, offset, count, pieces);
    return 0;
  }
  /* Concatenated: the iterator's pieces are already one per file. */
  while (layout_iter_next (&it, &pieces[*n]))
    ++*n;
  return 0;
}

size_t
layout_nr_file_pieces (const struct layout *l, uint64_t offset,
                       uint64_t count)
{
  size_t units = layout_nr_pieces (l, offset, count);

  return l->stripe > 0 ? MIN (units, l->nr) : units;
}

bool
layout_range_scattered (const struct layout *l, uint64_t offset,
                        uint64_t count)
{
  /* With one file, its units follow each other in the request too. */
  return l->stripe > 0 && l->nr > 1 &&
    layout_nr_pieces (l, offset, count) > l->nr;
}

void
layout_seg_init (struct layout_seg_iter *it, const struct layout *l,
                 uint64_t req_offset, const struct layout_piece *piece)
{
  it->l = l;
  it->req_offset = req_offset;
  it->backing = piece->backing;
  it->offset = piece->offset;
  it->left = piece->count;
}

/* Export offset of a byte of a backing file: the inverse of the
 * mapping.  Requires off < sizes[backing].
 */
static uint64_t
layout_export_offset (const struct layout *l, uint32_t backing, uint64_t off)
{
  if (l->stripe == 0)
    return l->starts[backing] + off;
  return ((off / l->stripe) * l->nr + backing) * l->stripe + off % l->stripe;
}

int
layout_seg_next (struct layout_seg_iter *it, uint64_t *buf_offset,
                 uint64_t *len)
{
  const struct layout *l = it->l;

  if (it->left == 0)
    return 0;
  *len = l->stripe > 0 ?
    MIN (it->left, l->stripe - it->offset % l->stripe) : it->left;
  *buf_offset = layout_export_offset (l, it->backing, it->offset) -
    it->req_offset;
  it->offset += *len;
  it->left -= *len;
  return 1;
}

void
layout_gather_piece (const struct layout *l, uint64_t req_offset,
                     const struct layout_piece *piece, const void *src,
                     void *dst)
{
  struct layout_seg_iter it;
  uint64_t off, len;
  char *d = dst;

  layout_seg_init (&it, l, req_offset, piece);
  while (layout_seg_next (&it, &off, &len)) {
    memcpy (d, (const char *) src + off, len);
    d += len;
  }
}
