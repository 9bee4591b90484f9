/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* backing.c: I/O on one backing file.  See backing.h. */

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
#include <time.h>
#include <unistd.h>

#ifdef HAVE_LINUX_FS_H
#include <linux/fs.h>
#endif
#ifdef HAVE_LINUX_FALLOC_H
#include <linux/falloc.h>
#endif

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <libnbd.h>

#include "backing.h"
#include "minmax.h"
#include "plugin.h"
#include "remote.h"

static int
remote_backing_open (struct backing *b, const char *uri)
{
  struct remote_config rc = {
    .max_conns = cfg.remote_connections,
    .retry = cfg.retry,
    .connect_timeout_ns = cfg.connect_timeout_ns,
    .connect_retry_ns = cfg.connect_retry_ns,
    .connect_timeout_text = cfg.connect_timeout_text,
    .connect_retry_text = cfg.connect_retry_text,
  };
  const struct remote_info *i;

  b->remote = remote_open (uri, &rc);
  if (b->remote == NULL)
    return -1;
  i = remote_info (b->remote);
  b->name = uri;
  b->size = i->size;
  b->readonly = i->readonly;
  b->min_block = i->min_block;
  return 0;
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

int
backing_open (struct backing *b, const char *name)
{
  struct stat st;
  int fd;
  bool ro = false;

  memset (b, 0, sizeof *b);
  b->fd = -1;
  b->min_block = 1;
  b->run_ns = 2 * BACKING_FAST_RUN_NS;  /* Slow until measured. */
  if (remote_is_uri (name))
    return remote_backing_open (b, name);
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
    return -1;
  }
  if (!ro && !cfg.shared && lock_for_writing (fd, name) == -1)
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
    b->size = end;
    b->is_block = true;
    b->sector = 512;
#ifdef BLKSSZGET
    {
      int ss;

      if (ioctl (fd, BLKSSZGET, &ss) == 0 && ss > 0)
        b->sector = ss;
    }
#endif
  }
  else if (S_ISREG (st.st_mode))
    b->size = st.st_size;
  else {
    nbdkit_error ("file=%s: not a regular file or block device%s", name,
                  S_ISDIR (st.st_mode) ? " (it is a directory)" : "");
    goto err;
  }

  b->name = name;
  b->fd = fd;
  b->readonly = ro;
  b->can_punch = true;
  b->can_zero_range = true;
  return 0;

 err:
  close (fd);
  return -1;
}

void
backing_close (struct backing *b)
{
  remote_close (b->remote);
  b->remote = NULL;
  if (b->fd >= 0)
    close (b->fd);
  b->fd = -1;
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
write_run (struct backing *b, const struct plug_run *run)
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
  r = write_iov (b->fd, iov, run->n, run->offset);
  err = errno;
  if (iov != stack_iov)
    free (iov);
  errno = err;
  return r;
}

/* Write zeroes the slow way (no fallocate): a shared zero buffer. */
static int
write_zeroes (struct backing *b, uint64_t offset, uint64_t count)
{
  static const char zero[65536];

  while (count > 0) {
    struct iovec iov = { (void *) zero, MIN (count, sizeof zero) };
    if (write_iov (b->fd, &iov, 1, offset) == -1)
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
try_fallocate (struct backing *b, bool *flag, int mode,
               uint64_t offset, uint64_t count)
{
  if (!__atomic_load_n (flag, __ATOMIC_RELAXED)) {
    errno = EOPNOTSUPP;
    return -1;
  }
  if (fallocate (b->fd, mode, offset, count) == 0)
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
zero_block_device (struct backing *b, uint64_t offset, uint64_t count)
{
  uint64_t ss = b->sector, start, end;
  uint64_t range[2];

  start = (offset + ss - 1) / ss * ss;
  end = (offset + count) / ss * ss;
  if (end <= start)
    return write_zeroes (b, offset, count);
  if (start > offset && write_zeroes (b, offset, start - offset) == -1)
    return -1;
  range[0] = start;
  range[1] = end - start;
  if (ioctl (b->fd, BLKZEROOUT, range) == -1) {
    if (!not_supported (errno) && errno != EINVAL)
      return -1;
    if (write_zeroes (b, start, end - start) == -1)
      return -1;
  }
  if (offset + count > end &&
      write_zeroes (b, end, offset + count - end) == -1)
    return -1;
  return 0;
}
#endif

static int
zero_run (struct backing *b, const struct plug_run *run)
{
  bool fast = run->flags & PLUG_F_FAST;

  /* NBD: a zero may punch a hole unless NO_HOLE was set, as long as it
   * reads back as zeroes.
   */
  if ((run->flags & PLUG_F_MAY_TRIM) &&
      try_fallocate (b, &b->can_punch,
                     FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                     run->offset, run->count) == 0)
    return 0;
  if (try_fallocate (b, &b->can_zero_range,
                     FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
                     run->offset, run->count) == 0)
    return 0;
  if (errno != EOPNOTSUPP)
    return -1;
#ifdef BLKZEROOUT
  if (b->is_block && !fast)
    return zero_block_device (b, run->offset, run->count);
#endif
  /* Fast zero: "MUST fail quickly with NBD_ENOTSUP unless the request
   * can be serviced in less time than a corresponding NBD_CMD_WRITE".
   */
  if (fast) {
    errno = ENOTSUP;
    return -1;
  }
  return write_zeroes (b, run->offset, run->count);
}

static int
trim_run (struct backing *b, const struct plug_run *run)
{
  /* A trim is advisory (the client must not assume anything about the
   * bytes afterwards): if the file cannot punch holes, do nothing.
   */
  if (try_fallocate (b, &b->can_punch,
                     FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                     run->offset, run->count) == 0 || errno == EOPNOTSUPP)
    return 0;
  return -1;
}

int
backing_issue_run (struct backing *b, const struct plug_run *run)
{
  /* Testing and benchmarking aids (plugin.c): a per-operation price,
   * and "not now" answers the NBD protocol could never bring us.
   */
  if (plug_debug_backend_delay_us > 0)
    nanosleep (&(struct timespec) {
        .tv_sec = plug_debug_backend_delay_us / 1000000,
        .tv_nsec = plug_debug_backend_delay_us % 1000000 * 1000 }, NULL);
  if (inject_eagain ()) {
    errno = EAGAIN;
    return -1;
  }

  switch (run->op) {
  case PLUG_OP_WRITE: return write_run (b, run);
  case PLUG_OP_ZERO: return zero_run (b, run);
  case PLUG_OP_TRIM: return trim_run (b, run);
  }
  abort ();
}

bool
backing_one_writer (const struct backing *b)
{
  return b->remote == NULL && !b->is_block &&
    plug_debug_backend_delay_us == 0;
}

void
backing_note_run (struct backing *b, uint64_t ns)
{
  uint64_t avg = __atomic_load_n (&b->run_ns, __ATOMIC_RELAXED);

  /* Weight 1/8: a few slow runs in a row make the file slow.  Racing
   * updates may lose a sample: it is an estimate.
   */
  __atomic_store_n (&b->run_ns, avg - avg / 8 + ns / 8, __ATOMIC_RELAXED);
}

bool
backing_fast (const struct backing *b)
{
  return b->remote == NULL &&
    __atomic_load_n (&b->run_ns, __ATOMIC_RELAXED) <= BACKING_FAST_RUN_NS;
}

int
backing_pread (struct backing *b, void *buf, uint64_t count, uint64_t offset)
{
  char *p = buf;

  if (b->remote) {
    struct remote_wait w;

    remote_wait_init (&w);
    remote_start_pread (b->remote, &w, buf, count, offset);
    return remote_wait (&w);
  }

  while (count > 0) {
    ssize_t r = pread (b->fd, p, count, offset);

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

int
backing_sync (struct backing *b)
{
  if (b->readonly)
    return 0;
  if (b->remote) {
    struct remote_wait w;

    remote_wait_init (&w);
    remote_start_flush (b->remote, &w);
    return remote_wait (&w);
  }
  return fdatasync (b->fd);
}

int
backing_cache (struct backing *b, uint64_t count, uint64_t offset)
{
  int r;

  if (b->remote) {
    struct remote_wait w;

    remote_wait_init (&w);
    remote_start_cache (b->remote, &w, count, offset);
    return remote_wait (&w);
  }
  r = posix_fadvise (b->fd, offset, count, POSIX_FADV_WILLNEED);

  if (r != 0) {
    errno = r;
    return -1;
  }
  return 0;
}

int
backing_extent (struct backing *b, uint64_t offset, uint64_t count,
                uint64_t *len, bool *hole)
{
  off_t data, next;

  if (b->remote) {
    struct remote_extent e;

    if (remote_extents (b->remote, offset, count, &e, 1) == -1)
      return -1;
    *hole = e.flags & LIBNBD_STATE_HOLE;
    *len = e.length;
    return 0;
  }
  if (b->is_block) {
    *hole = false;
    *len = count;
    return 0;
  }
  data = lseek (b->fd, offset, SEEK_DATA);
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
  next = lseek (b->fd, offset, SEEK_HOLE);
  if (next == -1)
    return -1;
  *hole = false;
  *len = MIN ((uint64_t) next - offset, count);
  if (*len == 0)
    *len = count;
  return 0;
}

bool
backing_aligned (const struct backing *b, const char *what,
                 uint64_t offset, uint64_t count)
{
  if (b->min_block <= 1 ||
      (offset % b->min_block == 0 && count % b->min_block == 0))
    return true;
  /* Never below the server's minimum (NBD: it MAY fail such requests
   * or worse): refuse, naming whose rule it is.
   */
  nbdkit_error ("file=%s: %s of %" PRIu64 " bytes at offset %" PRIu64
                " is not aligned to the NBD server's minimum block size "
                "%" PRIu32 " (the export advertises it as its minimum)",
                b->name, what, count, offset, b->min_block);
  errno = EINVAL;
  return false;
}
