/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* shim-pwritev.so: an LD_PRELOAD shim for the tests that makes writes
 * to one range of one file fail, as a disk that is full (or broken)
 * there would.
 *
 * pwrite, pwrite64, pwritev, pwritev64, pwritev2, pwritev64v2, fallocate
 * and fallocate64 fail with SHIM_ERRNO (default ENOSPC), without doing
 * anything, when
 *   - the file descriptor is the file SHIM_PATH (compared through
 *     readlink of /proc/self/fd/N with SHIM_PATH's realpath), and
 *   - the range [offset, offset+count) intersects [SHIM_FAIL_LO,
 *     SHIM_FAIL_HI) (decimal bytes; default: the whole file), and
 *   - the file SHIM_CONTROL, re-read at every call, says "fail" (its
 *     first line; anything else, e.g. "ok", lets the calls through; no
 *     SHIM_CONTROL at all means always fail).
 * Everything else goes to the real function.  Each failure counts one
 * in SHIM_COUNT (a file of one decimal number, rewritten) if set.
 *
 * SHIM_SHORT=N (decimal bytes, N > 0) turns the failures into short
 * writes: a pwrite or pwritev call that would fail writes at most its
 * first N bytes (to the real function) and returns what that wrote, as
 * a signal or a nearly full filesystem may make the kernel do; each
 * call so shortened (asked for more than N bytes) counts one in
 * SHIM_COUNT.  fallocate is not touched in this mode.
 *
 * SHIM_ZERO=1 turns them into writes of nothing instead: a pwrite or
 * pwritev call that would fail writes nothing and returns 0, which the
 * kernel does for no regular file but which a device driver may; each
 * such call counts one in SHIM_COUNT.  fallocate is not touched in this
 * mode either.
 *
 * Usage: LD_PRELOAD=.../shim-pwritev.so SHIM_PATH=disk.img
 *        SHIM_FAIL_LO=0 SHIM_FAIL_HI=1048576 SHIM_CONTROL=ctl nbdkit ...
 *        LD_PRELOAD=.../shim-pwritev.so SHIM_PATH=disk.img
 *        SHIM_SHORT=1000 nbdkit ...
 *        LD_PRELOAD=.../shim-pwritev.so SHIM_PATH=disk.img
 *        SHIM_ZERO=1 SHIM_FAIL_LO=0 SHIM_FAIL_HI=65536 nbdkit ...
 */

#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "shim-common.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct shim_target target;       /* SHIM_PATH */
static uint64_t fail_lo, fail_hi = UINT64_MAX;
static const char *control, *count_file;
static int fail_errno = ENOSPC;
static uint64_t short_max;              /* SHIM_SHORT; 0: fail instead. */
static bool write_nothing;              /* SHIM_ZERO=1. */
static pthread_mutex_t count_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long failures;

static void
init (void)
{
  const char *s;

  shim_target_init (&target, "SHIM_PATH");
  if ((s = getenv ("SHIM_FAIL_LO")) != NULL)
    fail_lo = strtoull (s, NULL, 10);
  if ((s = getenv ("SHIM_FAIL_HI")) != NULL)
    fail_hi = strtoull (s, NULL, 10);
  if ((s = getenv ("SHIM_ERRNO")) != NULL)
    fail_errno = atoi (s);
  if ((s = getenv ("SHIM_SHORT")) != NULL)
    short_max = strtoull (s, NULL, 10);
  if ((s = getenv ("SHIM_ZERO")) != NULL)
    write_nothing = strcmp (s, "1") == 0;
  control = getenv ("SHIM_CONTROL");
  count_file = getenv ("SHIM_COUNT");
}

static void *
real (const char *name)
{
  return shim_real ("shim-pwritev", name);
}

/* Does the control file say "fail"? */
static bool
failing_now (void)
{
  char word[16];

  if (control == NULL)
    return true;
  return shim_read_word (control, word, sizeof word) &&
    strncmp (word, "fail", 4) == 0;
}

static void
count_failure (void)
{
  pthread_mutex_lock (&count_lock);
  shim_write_number (count_file, ++failures);
  pthread_mutex_unlock (&count_lock);
}

/* Does the call touch the failing range of the target now?  (init ran.) */
static bool
in_failing_range (int fd, uint64_t offset, uint64_t count)
{
  if (count == 0 || offset >= fail_hi || offset + count <= fail_lo)
    return false;
  return shim_is_target (&target, fd) && failing_now ();
}

/* Must this call fail?  Sets errno if so.  (Not in SHIM_SHORT or
 * SHIM_ZERO mode, where a write is cut short instead and fallocate is
 * left alone.)
 */
static bool
must_fail (int fd, uint64_t offset, uint64_t count)
{
  pthread_once (&once, init);
  if (short_max > 0 || write_nothing ||
      !in_failing_range (fd, offset, count))
    return false;
  count_failure ();
  errno = fail_errno;
  return true;
}

/* How many of the count bytes a write may write: count, fewer
 * (SHIM_SHORT, SHIM_ZERO), or -1 with errno set when it must fail.
 */
static int64_t
write_gate (int fd, uint64_t offset, uint64_t count)
{
  pthread_once (&once, init);
  if (write_nothing) {
    if (!in_failing_range (fd, offset, count))
      return count;
    count_failure ();
    return 0;
  }
  if (short_max == 0)
    return must_fail (fd, offset, count) ? -1 : (int64_t) count;
  if (count <= short_max || !in_failing_range (fd, offset, count))
    return count;
  count_failure ();
  return short_max;
}

/* The first n bytes of iov[0..iovcnt) into out[]; returns the number
 * of elements of out used.
 */
static int
iov_prefix (const struct iovec *iov, int iovcnt, uint64_t n,
            struct iovec *out)
{
  int i;

  for (i = 0; i < iovcnt && n > 0; ++i) {
    out[i] = iov[i];
    if (out[i].iov_len > n)
      out[i].iov_len = n;
    n -= out[i].iov_len;
  }
  return i;
}

static uint64_t
iov_bytes (const struct iovec *iov, int iovcnt)
{
  uint64_t n = 0;
  int i;

  for (i = 0; i < iovcnt; ++i)
    n += iov[i].iov_len;
  return n;
}

/* write_gate for a vector write: -1 if it must fail; else 0, with
 * *iov and *iovcnt cut (into part) to what it may write.
 */
static int
write_gate_iov (int fd, uint64_t offset, const struct iovec **iov,
                int *iovcnt, struct iovec *part)
{
  uint64_t n = iov_bytes (*iov, *iovcnt);
  int64_t m = write_gate (fd, offset, n);

  if (m == -1)
    return -1;
  if ((uint64_t) m < n && *iovcnt <= IOV_MAX) {
    *iovcnt = iov_prefix (*iov, *iovcnt, m, part);
    *iov = part;
  }
  return 0;
}

ssize_t
pwrite (int fd, const void *buf, size_t count, off_t offset)
{
  int64_t n = write_gate (fd, offset, count);

  if (n == -1)
    return -1;
  return ((ssize_t (*) (int, const void *, size_t, off_t))
          real ("pwrite")) (fd, buf, n, offset);
}

ssize_t
pwrite64 (int fd, const void *buf, size_t count, off64_t offset)
{
  int64_t n = write_gate (fd, offset, count);

  if (n == -1)
    return -1;
  return ((ssize_t (*) (int, const void *, size_t, off64_t))
          real ("pwrite64")) (fd, buf, n, offset);
}

ssize_t
pwritev (int fd, const struct iovec *iov, int iovcnt, off_t offset)
{
  struct iovec part[IOV_MAX];

  if (write_gate_iov (fd, offset, &iov, &iovcnt, part) == -1)
    return -1;
  return ((ssize_t (*) (int, const struct iovec *, int, off_t))
          real ("pwritev")) (fd, iov, iovcnt, offset);
}

ssize_t
pwritev64 (int fd, const struct iovec *iov, int iovcnt, off64_t offset)
{
  struct iovec part[IOV_MAX];

  if (write_gate_iov (fd, offset, &iov, &iovcnt, part) == -1)
    return -1;
  return ((ssize_t (*) (int, const struct iovec *, int, off64_t))
          real ("pwritev64")) (fd, iov, iovcnt, offset);
}

ssize_t
pwritev2 (int fd, const struct iovec *iov, int iovcnt, off_t offset,
          int flags)
{
  struct iovec part[IOV_MAX];

  if (offset != -1 &&
      write_gate_iov (fd, offset, &iov, &iovcnt, part) == -1)
    return -1;
  return ((ssize_t (*) (int, const struct iovec *, int, off_t, int))
          real ("pwritev2")) (fd, iov, iovcnt, offset, flags);
}

ssize_t
pwritev64v2 (int fd, const struct iovec *iov, int iovcnt, off64_t offset,
             int flags)
{
  struct iovec part[IOV_MAX];

  if (offset != -1 &&
      write_gate_iov (fd, offset, &iov, &iovcnt, part) == -1)
    return -1;
  return ((ssize_t (*) (int, const struct iovec *, int, off64_t, int))
          real ("pwritev64v2")) (fd, iov, iovcnt, offset, flags);
}

int
fallocate (int fd, int mode, off_t offset, off_t len)
{
  if (must_fail (fd, offset, len))
    return -1;
  return ((int (*) (int, int, off_t, off_t))
          real ("fallocate")) (fd, mode, offset, len);
}

int
fallocate64 (int fd, int mode, off64_t offset, off64_t len)
{
  if (must_fail (fd, offset, len))
    return -1;
  return ((int (*) (int, int, off64_t, off64_t))
          real ("fallocate64")) (fd, mode, offset, len);
}
