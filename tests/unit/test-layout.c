/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* test-layout: concat and stripe mapping, errors, and random ranges
 * checked byte by byte against a naive reference.
 */

#include <config.h>

#undef NDEBUG
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "tap.h"

#define ARRAY_SIZE(a) (sizeof (a) / sizeof ((a)[0]))

/* A small deterministic PRNG (xorshift64*), so failures reproduce. */
static uint64_t rng_state;

static uint64_t
rnd (void)
{
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * UINT64_C (2685821657736338717);
}

static uint64_t
rnd_below (uint64_t n)
{
  return rnd () % n;
}

/* The naive reference: where does export byte `off` live?  Walks the
 * files (concat) or the stripe units (stripe) one by one, so it shares
 * no arithmetic with layout.c beyond the definition in layout.h.
 */
static void
naive_map (const uint64_t *sizes, size_t nr, uint64_t stripe, uint64_t off,
           uint32_t *backing, uint64_t *file_off)
{
  size_t i;

  if (stripe == 0) {
    for (i = 0; i < nr; ++i) {
      if (off < sizes[i]) {
        *backing = i;
        *file_off = off;
        return;
      }
      off -= sizes[i];
    }
    abort ();
  }
  else {
    /* Stripe unit k lives in file k % nr at (k / nr) * stripe. */
    uint64_t unit = off / stripe;

    *backing = unit % nr;
    *file_off = (unit / nr) * stripe + off % stripe;
  }
}

/* Map [offset, offset+count) with the iterator and compare every byte
 * with naive_map.  Also checks buf_offset continuity, that pieces are
 * non-empty and maximal (two consecutive pieces are never in the same
 * file at consecutive offsets, within a stripe unit), and the sum.
 * Returns the number of pieces, or -1 on any mismatch (with a reason
 * in *why).
 */
static long
check_range (const struct layout *l, const uint64_t *sizes,
             uint64_t offset, uint64_t count, const char **why)
{
  struct layout_iter it;
  struct layout_piece p, prev = { 0 };
  uint64_t expect_buf = 0, j;
  long n = 0;

  if (layout_iter_init (&it, l, offset, count) == -1) {
    *why = "iter_init failed";
    return -1;
  }
  while (layout_iter_next (&it, &p)) {
    if (p.count == 0) {
      *why = "empty piece";
      return -1;
    }
    if (p.buf_offset != expect_buf) {
      *why = "buf_offset not continuous";
      return -1;
    }
    if (p.backing >= l->nr || p.offset + p.count > sizes[p.backing]) {
      *why = "piece outside its file";
      return -1;
    }
    if (n > 0 && prev.backing == p.backing &&
        prev.offset + prev.count == p.offset &&
        (l->stripe == 0 || p.offset % l->stripe != 0)) {
      *why = "piece not maximal";
      return -1;
    }
    for (j = 0; j < p.count; ++j) {
      uint32_t b;
      uint64_t fo;

      naive_map (sizes, l->nr, l->stripe, offset + p.buf_offset + j,
                 &b, &fo);
      if (b != p.backing || fo != p.offset + j) {
        *why = "byte mapped differently from the reference";
        return -1;
      }
    }
    /* The inverse of the mapping, as the product uses it: the slices
     * layout_seg_next lists for the piece, in file order, map back to
     * its bytes one by one.
     */
    {
      struct layout_seg_iter seg;
      uint64_t off, len, fo = p.offset, k;

      layout_seg_init (&seg, l, offset, &p);
      while (layout_seg_next (&seg, &off, &len))
        for (k = 0; k < len; ++k, ++fo) {
          uint32_t b;
          uint64_t nfo;

          naive_map (sizes, l->nr, l->stripe, offset + off + k, &b, &nfo);
          if (b != p.backing || nfo != fo) {
            *why = "layout_seg_next is not the inverse";
            return -1;
          }
        }
      if (fo != p.offset + p.count) {
        *why = "layout_seg_next does not list the whole piece";
        return -1;
      }
    }
    expect_buf += p.count;
    prev = p;
    n++;
  }
  if (expect_buf != count) {
    *why = "pieces do not add up to count";
    return -1;
  }
  if (layout_nr_pieces (l, offset, count) != (size_t) n) {
    *why = "layout_nr_pieces disagrees with the iterator";
    return -1;
  }
  return n;
}

static void
test_errors (void)
{
  static const struct {
    const char *name;
    uint64_t sizes[4];
    size_t nr;
    uint64_t stripe;
    enum layout_error why;
    size_t bad;
  } cases[] = {
    { "no files", { 0 }, 0, 0, LAYOUT_NO_FILES, 0 },
    { "no files, striped", { 0 }, 0, 4096, LAYOUT_NO_FILES, 0 },
    { "empty first file", { 0, 512 }, 2, 0, LAYOUT_EMPTY_FILE, 0 },
    { "empty third file", { 512, 512, 0 }, 3, 0, LAYOUT_EMPTY_FILE, 2 },
    { "empty file, striped", { 4096, 0 }, 2, 4096, LAYOUT_EMPTY_FILE, 1 },
    { "stripe 100", { 4096 }, 1, 100, LAYOUT_STRIPE_BAD_SIZE, 0 },
    { "stripe 511", { 4096 }, 1, 511, LAYOUT_STRIPE_BAD_SIZE, 0 },
    { "stripe 513", { 4096 }, 1, 513, LAYOUT_STRIPE_BAD_SIZE, 0 },
    { "file not multiple of stripe", { 8192, 8192, 8192 + 512 }, 3, 4096,
      LAYOUT_STRIPE_NOT_MULTIPLE, 2 },
    { "first not multiple of stripe", { 1000, 8192 }, 2, 4096,
      LAYOUT_STRIPE_NOT_MULTIPLE, 0 },
    { "unequal sizes", { 8192, 8192, 4096 }, 3, 4096,
      LAYOUT_STRIPE_UNEQUAL, 2 },
    { "unequal sizes, second", { 4096, 8192 }, 2, 4096,
      LAYOUT_STRIPE_UNEQUAL, 1 },
    { "single file > INT64_MAX", { (uint64_t) INT64_MAX + 1 }, 1, 0,
      LAYOUT_TOO_LARGE, 0 },
    { "sum > INT64_MAX", { INT64_MAX / 2 + 1, INT64_MAX / 2 + 1 }, 2, 0,
      LAYOUT_TOO_LARGE, 1 },
    { "sum wraps uint64", { UINT64_MAX - 10, 100, 100 }, 3, 0,
      LAYOUT_TOO_LARGE, 0 },
    { "sum > INT64_MAX, third", { INT64_MAX / 4, INT64_MAX / 4,
                                  INT64_MAX / 4 * 3 }, 3, 0,
      LAYOUT_TOO_LARGE, 2 },
    { "striped sum > INT64_MAX",
      { UINT64_C (1) << 62, UINT64_C (1) << 62 }, 2, 4096,
      LAYOUT_TOO_LARGE, 1 },
  };
  size_t i;

  for (i = 0; i < ARRAY_SIZE (cases); ++i) {
    struct layout l;
    enum layout_error why = 99;
    size_t bad = 99;
    int r;

    errno = 0;
    r = layout_init (&l, cases[i].sizes, cases[i].nr, cases[i].stripe,
                     &why, &bad);
    ok (r == -1 && errno == EINVAL && why == cases[i].why &&
        bad == cases[i].bad,
        "layout_init refuses %s (r=%d errno=%d why=%d bad=%zu)",
        cases[i].name, r, errno, (int) why, bad);
    ok (l.sizes == NULL && l.starts == NULL,
        "layout_init allocates nothing when refusing %s", cases[i].name);
    ok (strlen (layout_strerror (why)) > 0, "layout_strerror (%d)",
        (int) why);
  }

  /* Exactly INT64_MAX is allowed. */
  {
    uint64_t sizes[2] = { INT64_MAX - 1000, 1000 };
    struct layout l;
    enum layout_error why;
    size_t bad;

    ok (layout_init (&l, sizes, 2, 0, &why, &bad) == 0 &&
        why == LAYOUT_OK && l.size == INT64_MAX,
        "total == INT64_MAX is accepted");
    layout_free (&l);
  }
}

/* Fixed cases on a concatenation of files of 100, 1, 50 and 1000 bytes
 * (exports bytes [0,100) [100,101) [101,151) [151,1151)).
 */
static void
test_concat_fixed (void)
{
  static const uint64_t sizes[] = { 100, 1, 50, 1000 };
  static const struct {
    uint64_t offset, count;
    size_t n;                   /* Expected number of pieces. */
    struct { uint32_t backing; uint64_t offset, count; } p[4];
  } cases[] = {
    /* Within the first file. */
    { 0, 1, 1, { { 0, 0, 1 } } },
    { 0, 100, 1, { { 0, 0, 100 } } },
    /* Last byte of a file, first byte of the next. */
    { 99, 1, 1, { { 0, 99, 1 } } },
    { 100, 1, 1, { { 1, 0, 1 } } },
    { 101, 1, 1, { { 2, 0, 1 } } },
    { 150, 1, 1, { { 2, 49, 1 } } },
    { 151, 1, 1, { { 3, 0, 1 } } },
    { 1150, 1, 1, { { 3, 999, 1 } } },
    /* Crossing one boundary. */
    { 99, 2, 2, { { 0, 99, 1 }, { 1, 0, 1 } } },
    { 140, 20, 2, { { 2, 39, 11 }, { 3, 0, 9 } } },
    /* Crossing two. */
    { 99, 3, 3, { { 0, 99, 1 }, { 1, 0, 1 }, { 2, 0, 1 } } },
    /* Crossing all. */
    { 0, 1151, 4, { { 0, 0, 100 }, { 1, 0, 1 }, { 2, 0, 50 },
                    { 3, 0, 1000 } } },
    { 50, 1000, 4, { { 0, 50, 50 }, { 1, 0, 1 }, { 2, 0, 50 },
                     { 3, 0, 899 } } },
  };
  struct layout l;
  enum layout_error why;
  size_t bad, i, j;

  assert (layout_init (&l, sizes, ARRAY_SIZE (sizes), 0, &why, &bad) == 0);
  ok (l.size == 1151 && l.nr == 4 && l.stripe == 0, "concat size 1151");

  for (i = 0; i < ARRAY_SIZE (cases); ++i) {
    struct layout_iter it;
    struct layout_piece p;
    bool good = true;
    uint64_t buf = 0;

    assert (layout_iter_init (&it, &l, cases[i].offset, cases[i].count) == 0);
    for (j = 0; layout_iter_next (&it, &p); ++j) {
      /* An empty piece would make the iterator loop forever. */
      if (p.count == 0 || j > 64) {
        good = false;
        break;
      }
      if (j >= cases[i].n ||
          p.backing != cases[i].p[j].backing ||
          p.offset != cases[i].p[j].offset ||
          p.count != cases[i].p[j].count ||
          p.buf_offset != buf)
        good = false;
      buf += p.count;
    }
    ok (good && j == cases[i].n &&
        layout_nr_pieces (&l, cases[i].offset, cases[i].count) == j,
        "concat [%" PRIu64 ", +%" PRIu64 ") gives %zu expected pieces",
        cases[i].offset, cases[i].count, cases[i].n);

    /* The iterator's first piece alone is the range's first piece. */
    memset (&p, 0xff, sizeof p);
    ok (layout_iter_init (&it, &l, cases[i].offset, cases[i].count) == 0 &&
        layout_iter_next (&it, &p) == 1 &&
        p.backing == cases[i].p[0].backing &&
        p.offset == cases[i].p[0].offset &&
        p.count == cases[i].p[0].count && p.buf_offset == 0,
        "concat: the first piece at %" PRIu64, cases[i].offset);
  }
  layout_free (&l);
}

/* Fixed cases on 3 striped files of 4 units of 512 bytes. */
static void
test_stripe_fixed (void)
{
  static const uint64_t sizes[] = { 2048, 2048, 2048 };
  static const struct {
    uint64_t offset, count;
    size_t n;
    struct { uint32_t backing; uint64_t offset, count; } p[5];
  } cases[] = {
    { 0, 512, 1, { { 0, 0, 512 } } },
    { 511, 1, 1, { { 0, 511, 1 } } },
    { 512, 1, 1, { { 1, 0, 1 } } },
    { 1024, 1, 1, { { 2, 0, 1 } } },
    /* Unit 3 wraps to file 0, second unit. */
    { 1536, 1, 1, { { 0, 512, 1 } } },
    { 511, 2, 2, { { 0, 511, 1 }, { 1, 0, 1 } } },
    { 1000, 600, 3, { { 1, 488, 24 }, { 2, 0, 512 }, { 0, 512, 64 } } },
    { 0, 2560, 5, { { 0, 0, 512 }, { 1, 0, 512 }, { 2, 0, 512 },
                    { 0, 512, 512 }, { 1, 512, 512 } } },
    /* Last byte of the export: unit 11 = file 2, unit 3 of it. */
    { 6143, 1, 1, { { 2, 2047, 1 } } },
    { 5630, 513, 2, { { 1, 2046, 2 }, { 2, 1536, 511 } } },
  };
  struct layout l;
  enum layout_error why;
  size_t bad, i, j;

  assert (layout_init (&l, sizes, 3, 512, &why, &bad) == 0);
  ok (l.size == 6144 && l.starts == NULL, "stripe size 6144");

  for (i = 0; i < ARRAY_SIZE (cases); ++i) {
    struct layout_iter it;
    struct layout_piece p;
    bool good = true;
    uint64_t buf = 0;

    assert (layout_iter_init (&it, &l, cases[i].offset, cases[i].count) == 0);
    for (j = 0; layout_iter_next (&it, &p); ++j) {
      /* An empty piece would make the iterator loop forever. */
      if (p.count == 0 || j > 64) {
        good = false;
        break;
      }
      if (j >= cases[i].n ||
          p.backing != cases[i].p[j].backing ||
          p.offset != cases[i].p[j].offset ||
          p.count != cases[i].p[j].count ||
          p.buf_offset != buf)
        good = false;
      buf += p.count;
    }
    ok (good && j == cases[i].n &&
        layout_nr_pieces (&l, cases[i].offset, cases[i].count) == j,
        "stripe [%" PRIu64 ", +%" PRIu64 ") gives %zu expected pieces",
        cases[i].offset, cases[i].count, cases[i].n);
  }
  layout_free (&l);
}

/* Zero-length and out-of-range requests, on both kinds of layout. */
static void
test_bounds (void)
{
  static const uint64_t csizes[] = { 100, 200 };
  static const uint64_t ssizes[] = { 1024, 1024 };
  static const struct {
    uint64_t offset, count;
    bool iter_ok;               /* layout_iter_init accepts. */
  } cases[] = {
    /* Independent of the export size. */
    { 0, 0, true },
    { 5, 0, true },
    { UINT64_MAX, 0, false },           /* offset past the end */
    { UINT64_MAX, 1, false },
    { 1, UINT64_MAX, false },           /* offset+count wraps */
    { UINT64_MAX - 1, 3, false },
    { 0, UINT64_MAX, false },
  };
  struct layout ls[2];
  const char *names[2] = { "concat", "stripe" };
  enum layout_error why;
  size_t bad, i, k;

  assert (layout_init (&ls[0], csizes, 2, 0, &why, &bad) == 0);
  assert (layout_init (&ls[1], ssizes, 2, 512, &why, &bad) == 0);

  for (k = 0; k < 2; ++k) {
    const struct layout *l = &ls[k];
    uint64_t size = l->size;
    struct {
      uint64_t offset, count;
      bool iter_ok;
    } sized[] = {
      /* Relative to the export size. */
      { size, 0, true },                /* empty range at the end */
      { size + 1, 0, false },
      { size, 1, false },               /* first byte past the end */
      { size - 1, 1, true },            /* last byte */
      { size - 1, 2, false },           /* crosses the end */
      { 0, size, true },                /* everything */
      { 0, size + 1, false },
      { 1, size, false },
    };
    struct layout_iter it;
    struct layout_piece p;

    for (i = 0; i < ARRAY_SIZE (cases) + ARRAY_SIZE (sized); ++i) {
      uint64_t off, cnt;
      bool iter_ok;
      int r;

      if (i < ARRAY_SIZE (cases)) {
        off = cases[i].offset;
        cnt = cases[i].count;
        iter_ok = cases[i].iter_ok;
      }
      else {
        off = sized[i - ARRAY_SIZE (cases)].offset;
        cnt = sized[i - ARRAY_SIZE (cases)].count;
        iter_ok = sized[i - ARRAY_SIZE (cases)].iter_ok;
      }

      errno = 0;
      r = layout_iter_init (&it, l, off, cnt);
      ok (iter_ok ? r == 0 : (r == -1 && errno == EINVAL),
          "%s: iter_init [%" PRIu64 ", +%" PRIu64 ") %s",
          names[k], off, cnt, iter_ok ? "accepted" : "EINVAL");
      if (r == 0 && cnt == 0)
        ok (layout_iter_next (&it, &p) == 0 &&
            layout_iter_next (&it, &p) == 0,
            "%s: count 0 at %" PRIu64 " yields no piece", names[k], off);
    }
  }
  layout_free (&ls[0]);
  layout_free (&ls[1]);
}

/* Random layouts and random ranges against naive_map. */
static void
test_random (void)
{
  static const uint64_t seeds[] = { 1, 42, 0xdeadbeef, 20240601 };
  static const size_t nrs[] = { 1, 2, 3, 5, 8 };
  size_t s, t;

  for (s = 0; s < ARRAY_SIZE (seeds); ++s) {
    for (t = 0; t < 2 * ARRAY_SIZE (nrs); ++t) {
      int stripe_kind = t & 1;
      uint64_t sizes[8];
      size_t nr, i;
      uint64_t stripe = 0;
      struct layout l;
      enum layout_error why;
      size_t bad;
      const char *reason = "";
      bool good = true;
      long pieces = 0, multi = 0;
      unsigned iter;

      rng_state = seeds[s] * 64 + t + 1;
      nr = nrs[t / 2];
      if (stripe_kind) {
        uint64_t units = 1 + rnd_below (4);

        stripe = 512 * (1 + rnd_below (2));
        for (i = 0; i < nr; ++i)
          sizes[i] = units * stripe;
      }
      else {
        /* Include 1-byte files, which make many boundaries. */
        for (i = 0; i < nr; ++i)
          sizes[i] = rnd_below (4) == 0 ? 1 : 1 + rnd_below (2000);
      }
      assert (layout_init (&l, sizes, nr, stripe, &why, &bad) == 0);

      /* Every single byte of the export, then random ranges. */
      for (i = 0; i < l.size && good; ++i)
        if (check_range (&l, sizes, i, 1, &reason) != 1)
          good = false;
      for (iter = 0; iter < 1000 && good; ++iter) {
        uint64_t off = rnd_below (l.size);
        uint64_t cnt = rnd_below (8) == 0
          ? l.size - off : rnd_below (l.size - off + 1);
        long n = check_range (&l, sizes, off, cnt, &reason);

        if (n == -1)
          good = false;
        pieces += n;
        if (n > 2)
          multi++;
      }
      ok (good, "random %s layout (seed %" PRIu64 ", %zu files, size %"
          PRIu64 "): %ld pieces, %ld ranges over >2 files match the "
          "reference%s%s",
          stripe ? "stripe" : "concat", seeds[s], nr, l.size, pieces, multi,
          good ? "" : ": ", reason);
      layout_free (&l);
    }
  }
}

/* layout_map_files over [offset, +count): at most one piece per file,
 * and the slices of every piece (layout_seg_next) map byte by byte as
 * naive_map says and cover the request exactly once;
 * layout_gather_piece puts each byte where its piece's slices say.
 * Returns the number of pieces, or -1 with a reason in *why.
 */
static long
check_file_pieces (const struct layout *l, const uint64_t *sizes,
                   uint64_t offset, uint64_t count, const char **why)
{
  struct layout_piece pieces[8];
  unsigned char *seen, *src, *dst;
  uint64_t packed = 0, j;
  size_t n, i;
  long ret = -1;

  assert (l->nr <= 8);
  if (layout_map_files (l, offset, count, pieces, &n) == -1) {
    *why = "layout_map_files refused a range inside the export";
    return -1;
  }
  if (n > l->nr || n != layout_nr_file_pieces (l, offset, count)) {
    *why = "more pieces than files, or layout_nr_file_pieces disagrees";
    return -1;
  }
  seen = calloc (1, count + 1);
  src = malloc (count + 1);
  dst = malloc (count + 1);
  assert (seen && src && dst);
  for (j = 0; j < count; ++j)
    src[j] = rnd ();
  for (i = 0, j = 0; i < n; j += pieces[i++].count)
    layout_gather_piece (l, offset, &pieces[i], src, dst + j);

  for (i = 0; i < n; ++i) {
    const struct layout_piece *p = &pieces[i];
    struct layout_seg_iter it;
    uint64_t off, len, in_piece = 0;
    size_t k;

    for (k = 0; k < i; ++k)
      if (pieces[k].backing == p->backing) {
        *why = "two pieces in one file";
        goto out;
      }
    if (p->count == 0 || p->offset + p->count > sizes[p->backing] ||
        (i > 0 && p->buf_offset <= pieces[i - 1].buf_offset)) {
      *why = "piece empty, outside its file or out of order";
      goto out;
    }
    if (!layout_range_scattered (l, offset, count) &&
        p->buf_offset != packed) {
      *why = "not scattered, yet the pieces do not tile the request";
      goto out;
    }
    layout_seg_init (&it, l, offset, p);
    while (layout_seg_next (&it, &off, &len)) {
      if (in_piece == 0 && off != p->buf_offset) {
        *why = "first slice is not at the piece's buf_offset";
        goto out;
      }
      if (len == 0 || off + len > count) {
        *why = "slice empty or outside the request";
        goto out;
      }
      for (j = 0; j < len; ++j) {
        uint32_t b;
        uint64_t fo;

        naive_map (sizes, l->nr, l->stripe, offset + off + j, &b, &fo);
        if (b != p->backing || fo != p->offset + in_piece + j) {
          *why = "slice byte mapped differently from the reference";
          goto out;
        }
        if (seen[off + j]++) {
          *why = "a byte of the request is in two slices";
          goto out;
        }
        if (dst[packed + in_piece + j] != src[off + j]) {
          *why = "layout_gather_piece put a byte in the wrong place";
          goto out;
        }
      }
      in_piece += len;
    }
    if (in_piece != p->count) {
      *why = "slices do not add up to the piece";
      goto out;
    }
    packed += p->count;
  }
  for (j = 0; j < count; ++j)
    if (!seen[j]) {
      *why = "a byte of the request is in no piece";
      goto out;
    }
  ret = n;
 out:
  free (seen);
  free (src);
  free (dst);
  return ret;
}

/* Fixed per-file cases on 3 striped files of 4 units of 512 bytes (as
 * test_stripe_fixed), and the 4 GiB range of two 2 GiB files.
 */
static void
test_file_pieces_fixed (void)
{
  static const uint64_t sizes[] = { 2048, 2048, 2048 };
  static const struct {
    uint64_t offset, count;
    size_t n;
    struct { uint32_t backing; uint64_t offset, count, buf_offset; } p[3];
  } cases[] = {
    { 0, 512, 1, { { 0, 0, 512, 0 } } },
    { 511, 2, 2, { { 0, 511, 1, 0 }, { 1, 0, 1, 1 } } },
    { 1000, 600, 3, { { 1, 488, 24, 0 }, { 2, 0, 512, 24 },
                      { 0, 512, 64, 536 } } },
    /* Units 0..4: file 0 holds units 0 and 3, file 1 units 1 and 4. */
    { 0, 2560, 3, { { 0, 0, 1024, 0 }, { 1, 0, 1024, 512 },
                    { 2, 0, 512, 1024 } } },
    /* Everything: each file whole. */
    { 0, 6144, 3, { { 0, 0, 2048, 0 }, { 1, 0, 2048, 512 },
                    { 2, 0, 2048, 1024 } } },
    /* From the middle of unit 2 (file 2) to the middle of unit 9
     * (file 0, its unit 3).
     */
    { 1100, 3800, 3, { { 2, 76, 1460, 0 }, { 0, 512, 1316, 436 },
                       { 1, 512, 1024, 948 } } },
  };
  struct layout l;
  enum layout_error why;
  size_t bad, i, j;

  assert (layout_init (&l, sizes, 3, 512, &why, &bad) == 0);
  for (i = 0; i < ARRAY_SIZE (cases); ++i) {
    struct layout_piece p[3];
    size_t n;
    bool good = layout_map_files (&l, cases[i].offset, cases[i].count,
                                  p, &n) == 0 && n == cases[i].n;

    for (j = 0; good && j < n; ++j)
      good = p[j].backing == cases[i].p[j].backing &&
        p[j].offset == cases[i].p[j].offset &&
        p[j].count == cases[i].p[j].count &&
        p[j].buf_offset == cases[i].p[j].buf_offset;
    ok (good, "stripe [%" PRIu64 ", +%" PRIu64 ") is %zu file pieces",
        cases[i].offset, cases[i].count, cases[i].n);
  }
  layout_free (&l);

  /* The 4 GiB zero of test-stripe-bounded.sh: 2 pieces, not 2^20. */
  {
    const uint64_t G2 = UINT64_C (2) << 30;
    const uint64_t big[2] = { G2, G2 };
    struct layout_piece p[2];
    size_t n;

    assert (layout_init (&l, big, 2, 4096, &why, &bad) == 0);
    ok (layout_map_files (&l, 0, 2 * G2 - 4096, p, &n) == 0 && n == 2 &&
        p[0].backing == 0 && p[0].offset == 0 && p[0].count == G2 &&
        p[1].backing == 1 && p[1].offset == 0 &&
        p[1].count == G2 - 4096 && p[1].buf_offset == 4096 &&
        layout_nr_pieces (&l, 0, 2 * G2 - 4096) == (G2 >> 11) - 1,
        "4 GiB - 4 KiB over two striped 2 GiB files: 2 pieces "
        "(2^20 - 1 stripe units)");
    ok (layout_map_files (&l, 4096, 2 * G2 - 4096, p, &n) == 0 &&
        n == 2 && p[0].backing == 1 && p[0].count == G2 &&
        p[1].backing == 0 && p[1].offset == 4096 &&
        p[1].count == G2 - 4096,
        "the same range from unit 1: file 1 first");
    layout_free (&l);
  }
}

/* Random layouts and ranges against naive_map, per file. */
static void
test_file_pieces_random (void)
{
  static const size_t nrs[] = { 1, 2, 3, 5, 8 };
  size_t t;

  for (t = 0; t < 2 * ARRAY_SIZE (nrs); ++t) {
    uint64_t sizes[8], stripe = 0;
    size_t nr = nrs[t / 2], i;
    struct layout l;
    enum layout_error why;
    size_t bad;
    const char *reason = "";
    bool good = true;
    long pieces = 0, scattered = 0;
    unsigned iter;

    rng_state = 0x5eed + t;
    if (t & 1) {
      uint64_t units = 2 + rnd_below (5);

      stripe = 512 * (1 + rnd_below (8));
      for (i = 0; i < nr; ++i)
        sizes[i] = units * stripe;
    }
    else
      for (i = 0; i < nr; ++i)
        sizes[i] = rnd_below (4) == 0 ? 1 : 1 + rnd_below (3000);
    assert (layout_init (&l, sizes, nr, stripe, &why, &bad) == 0);
    for (iter = 0; iter < 500 && good; ++iter) {
      uint64_t off = rnd_below (l.size);
      uint64_t cnt = rnd_below (4) == 0
        ? l.size - off : rnd_below (l.size - off + 1);
      long n = check_file_pieces (&l, sizes, off, cnt, &reason);

      if (n == -1)
        good = false;
      pieces += n;
      scattered += layout_range_scattered (&l, off, cnt);
    }
    ok (good, "file pieces, random %s layout (%zu files, size %" PRIu64
        "): %ld pieces, %ld scattered ranges, slices cover each range "
        "exactly%s%s", stripe ? "stripe" : "concat", nr, l.size, pieces,
        scattered, good ? "" : ": ", reason);
    layout_free (&l);
  }
}

int
main (void)
{
  test_errors ();
  test_concat_fixed ();
  test_stripe_fixed ();
  test_bounds ();
  test_random ();
  test_file_pieces_fixed ();
  test_file_pieces_random ();
  return done_testing ();
}
