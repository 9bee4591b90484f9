/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* file.c: the local file backend: a regular file or a block device.
 * See file.h.
 */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#ifdef HAVE_LINUX_FS_H
#include <linux/fs.h>
#endif
#ifdef HAVE_LINUX_FALLOC_H
#include <linux/falloc.h>
#endif

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backend.h"
#include "file.h"
#include "minmax.h"

struct file {
  struct backend be;            /* First: the backend is the file. */
  const char *name;             /* Borrowed from the caller (for
                                 * messages). */
  int fd;
  bool is_block;                /* Block device (BLKZEROOUT etc.). */
  uint32_t sector;              /* Block device: logical block size. */

  /* Atomic: learnt at run time, only ever cleared, and only by
   * ENOTSUP/EOPNOTSUPP (EINVAL may be about one request's range).
   */
  bool can_punch;               /* fallocate PUNCH_HOLE works. */
  bool can_zero_range;          /* fallocate ZERO_RANGE works. */
};

static const struct backend_ops file_ops;

static struct file *
file_of (struct backend *be)
{
  return (struct file *) be;
}

/* One process may write a backing file: in writeback mode two plugs
 * over one file in two processes are two caches, and each would
 * overwrite the other's acknowledged writes.  Take a write lock on the
 * whole file, or refuse it if another process holds a lock on it.  An
 * open file description (OFD) lock, not a process-associated one, so
 * that it stays across nbdkit's fork into the background; it goes with
 * the last descriptor of the open file, at the latest when the process
 * exits.  qemu's image locks are OFD locks on a few bytes of the file,
 * so a qemu that has the file open conflicts too.
 */
static int
lock_for_writing (int fd, const char *name)
{
  struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };

  if (fcntl (fd, F_OFD_SETLK, &fl) == 0)
    return 0;
  if (errno != EAGAIN && errno != EACCES) {
    nbdkit_error ("file=%s: cannot lock it (%m), so a second process "
                  "serving it could not be refused; add lock=no to "
                  "serve it without the lock", name);
    return -1;
  }
  nbdkit_error ("file=%s: already in use: another process holds a lock "
                "on it (another nbdkit plug serving it, or qemu), or "
                "file= names it twice.  Serve a file from one process "
                "(nbdkit nbd can proxy it to a second address), or add "
                "lock=no (unsafe in writeback mode: two caches)", name);
  return -1;
}

struct backend *
file_open (const char *name, bool lock)
{
  struct stat st;
  struct file *f;
  int fd;
  bool ro = false;

  f = calloc (1, sizeof *f);
  if (f == NULL) {
    nbdkit_error ("calloc: %m");
    return NULL;
  }
  fd = open (name, O_RDWR | O_CLOEXEC);
  if (fd == -1 && (errno == EACCES || errno == EROFS || errno == EPERM)) {
    int rw_errno = errno;

    fd = open (name, O_RDONLY | O_CLOEXEC);
    ro = true;
    if (fd >= 0) {
      /* One read-only file makes the whole export read-only
       * (plugin_can_write): a client sees only that writes fail.
       */
      errno = rw_errno;
      nbdkit_debug ("file=%s: cannot open it read-write (%m): opened "
                    "read-only, so the whole export is read-only", name);
    }
  }
  if (fd == -1) {
    nbdkit_error ("file=%s: open: %m", name);
    free (f);
    return NULL;
  }
  if (!ro && lock && lock_for_writing (fd, name) == -1)
    goto err;
  if (fstat (fd, &st) == -1) {
    nbdkit_error ("file=%s: fstat: %m", name);
    goto err;
  }
  if (S_ISBLK (st.st_mode)) {
    off_t end = lseek (fd, 0, SEEK_END);

    if (end == -1) {
      nbdkit_error ("file=%s: lseek: %m", name);
      goto err;
    }
    f->be.size = end;
    f->is_block = true;
    f->sector = 512;
#ifdef BLKSSZGET
    {
      int ss;

      if (ioctl (fd, BLKSSZGET, &ss) == 0 && ss > 0)
        f->sector = ss;
    }
#endif
  }
  else if (S_ISREG (st.st_mode))
    f->be.size = st.st_size;
  else {
    nbdkit_error ("file=%s: not a regular file or block device%s", name,
                  S_ISDIR (st.st_mode) ? " (it is a directory)" : "");
    goto err;
  }

  f->be.ops = &file_ops;
  f->be.readonly = ro;
  f->be.min_block = 1;
  f->name = name;
  f->fd = fd;
  f->can_punch = true;
  f->can_zero_range = true;
  return &f->be;

 err:
  close (fd);
  free (f);
  return NULL;
}

static void
file_close (struct backend *be)
{
  struct file *f = file_of (be);

  close (f->fd);
  free (f);
}

/* pwritev until everything is written: a short write is not an error. */
static int
write_iov (int fd, struct iovec *iov, int iovcnt, uint64_t offset)
{
  while (iovcnt > 0) {
    /* One buffer (the direct path, a run that did not merge): pwrite
     * spares the kernel copying and checking an iovec.
     */
    ssize_t r = iovcnt == 1 ?
      pwrite (fd, iov->iov_base, iov->iov_len, offset) :
      pwritev (fd, iov, iovcnt, offset);

    if (r == -1) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    /* Nothing written although something was asked: no regular file
     * does that, but a driver at the end of its device may, and a
     * retry would get the same 0 forever.  ENOSPC: no room for the
     * data there (NBD_ENOSPC for the client), and not transient, so
     * the engine does not retry it either.
     */
    if (r == 0) {
      errno = ENOSPC;
      return -1;
    }
    offset += r;
    while (iovcnt > 0 && (size_t) r >= iov->iov_len) {
      r -= iov->iov_len;
      iov++;
      iovcnt--;
    }
    if (iovcnt > 0) {
      iov->iov_base = (char *) iov->iov_base + r;
      iov->iov_len -= r;
    }
  }
  return 0;
}

/* Runs of up to this many members take their iovec from the stack. */
#define STACK_IOV 64

static int
write_run (struct file *f, const struct plug_run *run)
{
  struct iovec stack_iov[STACK_IOV], *iov = stack_iov;
  size_t i;
  int r, err;

  /* This allocation is one of the plug's real "not now" sources: with
   * no memory for the iovec the run is requeued, not failed (ENOMEM is
   * transient, see retry_is_transient).
   */
  if (run->n > STACK_IOV && (iov = malloc (run->n * sizeof *iov)) == NULL)
    return -1;
  for (i = 0; i < run->n; ++i) {
    iov[i].iov_base = (void *) run->reqs[i]->buf;
    iov[i].iov_len = run->reqs[i]->count;
  }
  r = write_iov (f->fd, iov, run->n, run->offset);
  err = errno;
  if (iov != stack_iov)
    free (iov);
  errno = err;
  return r;
}

/* Write zeroes the slow way (no fallocate): a shared zero buffer. */
static int
write_zeroes (struct file *f, uint64_t offset, uint64_t count)
{
  static const char zero[65536];

  while (count > 0) {
    struct iovec iov = { (void *) zero, MIN (count, sizeof zero) };
    if (write_iov (f->fd, &iov, 1, offset) == -1)
      return -1;
    offset += iov.iov_len;
    count -= iov.iov_len;
  }
  return 0;
}

/* The file (its filesystem or driver) cannot do this mode at all.
 * EINVAL is not one of these: it may be about this request's offset or
 * alignment, and must not turn the mode off for every later request.
 */
static bool
not_supported (int err)
{
  return err == EOPNOTSUPP || err == ENOTSUP || err == ENOSYS ||
    err == ENODEV;
}

/* fallocate mode, or -1 with errno: EOPNOTSUPP if the file cannot do it
 * (now or ever), so that the caller falls back to another way.
 */
static int
try_fallocate (struct file *f, bool *flag, int mode,
               uint64_t offset, uint64_t count)
{
  if (!__atomic_load_n (flag, __ATOMIC_RELAXED)) {
    errno = EOPNOTSUPP;
    return -1;
  }
  if (fallocate (f->fd, mode, offset, count) == 0)
    return 0;
  if (not_supported (errno))
    __atomic_store_n (flag, false, __ATOMIC_RELAXED);
  if (not_supported (errno) || errno == EINVAL)
    errno = EOPNOTSUPP;
  return -1;
}

#ifdef BLKZEROOUT
/* BLKZEROOUT takes only whole logical blocks: zero the aligned middle
 * with it and write zeroes to the unaligned edges.
 */
static int
zero_block_device (struct file *f, uint64_t offset, uint64_t count)
{
  uint64_t ss = f->sector, start, end;
  uint64_t range[2];

  start = (offset + ss - 1) / ss * ss;
  end = (offset + count) / ss * ss;
  if (end <= start)
    return write_zeroes (f, offset, count);
  if (start > offset && write_zeroes (f, offset, start - offset) == -1)
    return -1;
  range[0] = start;
  range[1] = end - start;
  if (ioctl (f->fd, BLKZEROOUT, range) == -1) {
    if (!not_supported (errno) && errno != EINVAL)
      return -1;
    if (write_zeroes (f, start, end - start) == -1)
      return -1;
  }
  if (offset + count > end &&
      write_zeroes (f, end, offset + count - end) == -1)
    return -1;
  return 0;
}
#endif

static int
zero_run (struct file *f, const struct plug_run *run)
{
  bool fast = run->flags & PLUG_F_FAST;

  /* NBD: a zero may punch a hole unless NO_HOLE was set, as long as it
   * reads back as zeroes.
   */
  if ((run->flags & PLUG_F_MAY_TRIM) &&
      try_fallocate (f, &f->can_punch,
                     FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                     run->offset, run->count) == 0)
    return 0;
  if (try_fallocate (f, &f->can_zero_range,
                     FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
                     run->offset, run->count) == 0)
    return 0;
  if (errno != EOPNOTSUPP)
    return -1;
#ifdef BLKZEROOUT
  if (f->is_block && !fast)
    return zero_block_device (f, run->offset, run->count);
#endif
  /* Fast zero: "MUST fail quickly with NBD_ENOTSUP unless the request
   * can be serviced in less time than a corresponding NBD_CMD_WRITE".
   */
  if (fast) {
    errno = ENOTSUP;
    return -1;
  }
  return write_zeroes (f, run->offset, run->count);
}

static int
trim_run (struct file *f, const struct plug_run *run)
{
  /* A trim is advisory (the client must not assume anything about the
   * bytes afterwards): if the file cannot punch holes, do nothing.
   */
  if (try_fallocate (f, &f->can_punch,
                     FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                     run->offset, run->count) == 0 || errno == EOPNOTSUPP)
    return 0;
  return -1;
}

static int
file_issue (struct backend *be, struct backend_run *br)
{
  struct file *f = file_of (be);
  const struct plug_run *run = br->run;
  int r;

  switch (run->op) {
  case PLUG_OP_WRITE: r = write_run (f, run); break;
  case PLUG_OP_ZERO: r = zero_run (f, run); break;
  case PLUG_OP_TRIM: r = trim_run (f, run); break;
  default: abort ();
  }
  return r == 0 ? 0 : errno;
}

/* The kernel makes a regular file's runs take turns: a buffered write
 * (generic_file_write_iter, which tmpfs uses, and ext4's, xfs's and
 * btrfs's own) and fallocate take the inode's i_rwsem exclusively.  A
 * block device's do not (blkdev_write_iter takes no inode lock).
 */
static bool
file_one_writer (const struct backend *be)
{
  return !((const struct file *) be)->is_block;
}

static int
file_pread (struct backend *be, void *buf, uint64_t count, uint64_t offset)
{
  struct file *f = file_of (be);
  char *p = buf;

  while (count > 0) {
    ssize_t r = pread (f->fd, p, count, offset);

    if (r == -1) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    if (r == 0) {
      /* The file shrank under us: a real error, never silent zeroes. */
      errno = EIO;
      return -1;
    }
    p += r;
    offset += r;
    count -= r;
  }
  return 0;
}

static int
file_sync (struct backend *be)
{
  struct file *f = file_of (be);

  if (f->be.readonly)
    return 0;
  return fdatasync (f->fd);
}

static int
file_cache (struct backend *be, uint64_t count, uint64_t offset)
{
  struct file *f = file_of (be);
  int r = posix_fadvise (f->fd, offset, count, POSIX_FADV_WILLNEED);

  if (r != 0) {
    errno = r;
    return -1;
  }
  return 0;
}

static int
file_extent (struct backend *be, uint64_t offset, uint64_t count,
             uint64_t *len, bool *hole)
{
  struct file *f = file_of (be);
  off_t data, next;

  if (f->is_block) {
    *hole = false;
    *len = count;
    return 0;
  }
  data = lseek (f->fd, offset, SEEK_DATA);
  if (data == -1) {
    if (errno == ENXIO) {       /* Only a hole up to the end. */
      *hole = true;
      *len = count;
      return 0;
    }
    if (errno == EINVAL || errno == EOPNOTSUPP) {
      *hole = false;            /* No SEEK_DATA: all data. */
      *len = count;
      return 0;
    }
    return -1;
  }
  if ((uint64_t) data > offset) {
    *hole = true;
    *len = MIN ((uint64_t) data - offset, count);
    return 0;
  }
  next = lseek (f->fd, offset, SEEK_HOLE);
  if (next == -1)
    return -1;
  *hole = false;
  *len = MIN ((uint64_t) next - offset, count);
  if (*len == 0)
    *len = count;
  return 0;
}

static const struct backend_ops file_ops = {
  .name = "file",
  .issue = file_issue,
  .pread = file_pread,
  .sync = file_sync,
  .cache = file_cache,
  .extent = file_extent,
  .one_writer = file_one_writer,
  .close = file_close,
};
