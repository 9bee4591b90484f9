/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* shim-fdatasync.so: an LD_PRELOAD shim for the tests that makes the
 * syncs of one file slow or failing, as a disk whose cache flush is
 * slow, or whose writeback failed, would, and can record what each
 * sync made durable.
 *
 * fdatasync and fsync of the file SHIM_PATH (compared through readlink
 * of /proc/self/fd/N with SHIM_PATH's realpath) obey the first word of
 * the control file, re-read at every call: SHIM_SYNC_CONTROL if set,
 * else SHIM_CONTROL (none, or no such file: "ok"):
 *   ok         the real call;
 *   hold       the call waits, re-reading the file every 10 ms, until
 *              it says something else, then obeys that;
 *   fail       the call fails with SHIM_ERRNO (default EIO) without
 *              syncing anything;
 *   fail-once  the first call of the process that sees it fails as
 *              "fail" does; every other call is real.
 * SHIM_SYNC_CONTROL is for a test that preloads shim-pwritev.so too:
 * that shim's control file is SHIM_CONTROL, and both read SHIM_PATH,
 * SHIM_ERRNO and SHIM_COUNT (set SHIM_COUNT for one of them only).
 * A control file read while it is rewritten in place may read empty,
 * which means "ok": replace it instead (write another file, rename).
 *
 * SHIM_DELAY_US=N (decimal microseconds) makes every sync of SHIM_PATH,
 * real or failing, take N us more (a sleep before the call or the
 * failure), one sync at a time (a mutex held over the sleep and the
 * call), as a disk that flushes its cache in N us, one flush command
 * after the other, would (bench/flush-group.sh, test-heal-after-sync.sh).
 *
 * SHIM_DURABLE=P: at the start of each sync that will succeed (after
 * any hold, before the delay), the file's contents are copied to P
 * (through P.tmp and rename; blocks of zeroes left as holes): what is on
 * stable storage at the latest once that sync returns, i.e. what a
 * power loss right after it keeps.
 *
 * Each call on SHIM_PATH counts one in SHIM_COUNT (a file of one
 * decimal number, rewritten as the call starts, before any wait) if
 * set; each failure counts one in SHIM_FAILED the same way.  Other
 * files' syncs go to the real function.
 *
 * Usage: LD_PRELOAD=.../shim-fdatasync.so SHIM_PATH=disk.img
 *        SHIM_CONTROL=ctl SHIM_COUNT=calls nbdkit ...
 *        LD_PRELOAD=.../shim-pwritev.so:.../shim-fdatasync.so
 *        SHIM_PATH=disk.img SHIM_CONTROL=wctl SHIM_SYNC_CONTROL=sctl
 *        SHIM_DELAY_US=1000000 SHIM_DURABLE=durable.img nbdkit ...
 */

#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "shim-common.h"

/* What the control file says. */
enum verdict {
  V_OK,
  V_HOLD,
  V_FAIL,
  V_FAIL_ONCE,
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct shim_target target;       /* SHIM_PATH */
static const char *control, *count_file, *failed_file, *durable;
static int fail_errno = EIO;
static unsigned long delay_us;          /* SHIM_DELAY_US */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t delay_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t snapshot_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long calls, failures;
static bool failed_once;

static void
init (void)
{
  const char *s;

  shim_target_init (&target, "SHIM_PATH");
  if ((s = getenv ("SHIM_ERRNO")) != NULL)
    fail_errno = atoi (s);
  if ((s = getenv ("SHIM_DELAY_US")) != NULL)
    delay_us = strtoul (s, NULL, 10);
  control = getenv ("SHIM_SYNC_CONTROL");
  if (control == NULL)
    control = getenv ("SHIM_CONTROL");
  count_file = getenv ("SHIM_COUNT");
  failed_file = getenv ("SHIM_FAILED");
  durable = getenv ("SHIM_DURABLE");
}

static enum verdict
read_control (void)
{
  char word[32];

  if (control == NULL || !shim_read_word (control, word, sizeof word))
    return V_OK;
  if (strcmp (word, "hold") == 0)
    return V_HOLD;
  if (strcmp (word, "fail") == 0)
    return V_FAIL;
  if (strcmp (word, "fail-once") == 0)
    return V_FAIL_ONCE;
  return V_OK;
}

/* The control file's verdict once it no longer says "hold". */
static enum verdict
wait_while_held (void)
{
  enum verdict v;

  while ((v = read_control ()) == V_HOLD)
    nanosleep (&(struct timespec) { .tv_nsec = 10000000 }, NULL);
  return v;
}

/* Must this sync of the target fail?  Counts the call, waits while
 * held.
 */
static bool
must_fail (void)
{
  enum verdict v;
  bool fail;

  pthread_mutex_lock (&lock);
  shim_write_number (count_file, ++calls);
  pthread_mutex_unlock (&lock);

  v = wait_while_held ();

  pthread_mutex_lock (&lock);
  fail = v == V_FAIL || (v == V_FAIL_ONCE && !failed_once);
  if (fail) {
    failed_once = true;
    shim_write_number (failed_file, ++failures);
  }
  pthread_mutex_unlock (&lock);
  return fail;
}

/* Copy the target's contents (fd) to SHIM_DURABLE, if set, through
 * SHIM_DURABLE.tmp and rename: the test never reads half a copy.
 */
static void
snapshot (int fd)
{
  static char buf[1 << 16];     /* Under snapshot_lock. */
  char tmp[PATH_MAX];
  struct stat st;
  off_t off;
  ssize_t n, i;
  int out;

  if (durable == NULL || fstat (fd, &st) == -1)
    return;
  snprintf (tmp, sizeof tmp, "%s.tmp", durable);
  pthread_mutex_lock (&snapshot_lock);
  out = open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out == -1)
    goto out;
  for (off = 0; off < st.st_size; off += n) {
    n = pread (fd, buf, sizeof buf, off);
    if (n <= 0)
      break;
    for (i = 0; i < n && buf[i] == 0; ++i)
      ;
    if (i < n && pwrite (out, buf, n, off) != n)
      break;
  }
  if (ftruncate (out, st.st_size) == 0)
    rename (tmp, durable);
  close (out);
 out:
  pthread_mutex_unlock (&snapshot_lock);
}

/* Sleep SHIM_DELAY_US, then the real sync, or the failure: with a
 * delay, one sync at a time.
 */
static int
slow_sync (const char *name, int fd, bool fail)
{
  int r;

  if (delay_us > 0) {
    pthread_mutex_lock (&delay_lock);
    nanosleep (&(struct timespec) { .tv_sec = delay_us / 1000000,
                                    .tv_nsec = delay_us % 1000000 * 1000 },
               NULL);
  }
  if (fail) {
    errno = fail_errno;
    r = -1;
  }
  else
    r = ((int (*) (int)) shim_real ("shim-fdatasync", name)) (fd);
  if (delay_us > 0) {
    int err = errno;

    pthread_mutex_unlock (&delay_lock);
    errno = err;
  }
  return r;
}

static int
shim_sync (const char *name, int fd)
{
  bool fail;

  pthread_once (&once, init);
  if (!shim_is_target (&target, fd))
    return ((int (*) (int)) shim_real ("shim-fdatasync", name)) (fd);
  fail = must_fail ();
  if (!fail)
    snapshot (fd);
  return slow_sync (name, fd, fail);
}

int
fdatasync (int fd)
{
  return shim_sync ("fdatasync", fd);
}

int
fsync (int fd)
{
  return shim_sync ("fsync", fd);
}
