/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* shim-fdatasync.so: an LD_PRELOAD shim for the tests that makes the
 * syncs of one file slow or failing, as a disk whose cache flush is
 * slow, or whose writeback failed, would.
 *
 * fdatasync and fsync of the file SHIM_PATH (compared through readlink
 * of /proc/self/fd/N with SHIM_PATH's realpath) obey the first word of
 * the file SHIM_CONTROL, re-read at every call (no SHIM_CONTROL, or no
 * such file: "ok"):
 *   ok         the real call;
 *   hold       the call waits, re-reading the file every 10 ms, until
 *              it says something else, then obeys that;
 *   fail       the call fails with SHIM_ERRNO (default EIO) without
 *              syncing anything;
 *   fail-once  the first call of the process that sees it fails as
 *              "fail" does; every other call is real.
 * SHIM_DELAY_US=N (decimal microseconds) makes every real sync of
 * SHIM_PATH sleep N us first, one sync at a time (a mutex held over the
 * sleep and the call), as a disk that flushes its cache in N us, one
 * flush command after the other, would (bench/flush-group.sh).
 * A control file read while it is rewritten in place may read empty,
 * which means "ok": replace it instead (write another file, rename).
 * Each call on SHIM_PATH counts one in SHIM_COUNT (a file of one
 * decimal number, rewritten as the call starts, before any wait) if
 * set; each failure counts one in SHIM_FAILED the same way.  Other
 * files' syncs go to the real function.
 *
 * Usage: LD_PRELOAD=.../shim-fdatasync.so SHIM_PATH=disk.img
 *        SHIM_CONTROL=ctl SHIM_COUNT=calls nbdkit ...
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* What the control file says. */
enum verdict {
  V_OK,
  V_HOLD,
  V_FAIL,
  V_FAIL_ONCE,
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char target[PATH_MAX];
static bool have_target;
static const char *control, *count_file, *failed_file;
static int fail_errno = EIO;
static unsigned long delay_us;          /* SHIM_DELAY_US */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t delay_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long calls, failures;
static bool failed_once;

static void
init (void)
{
  const char *s;

  s = getenv ("SHIM_PATH");
  if (s && realpath (s, target) != NULL)
    have_target = true;
  if ((s = getenv ("SHIM_ERRNO")) != NULL)
    fail_errno = atoi (s);
  if ((s = getenv ("SHIM_DELAY_US")) != NULL)
    delay_us = strtoul (s, NULL, 10);
  control = getenv ("SHIM_CONTROL");
  count_file = getenv ("SHIM_COUNT");
  failed_file = getenv ("SHIM_FAILED");
}

static void *
real (const char *name)
{
  void *f = dlsym (RTLD_NEXT, name);

  if (f == NULL) {
    fprintf (stderr, "shim-fdatasync: dlsym %s: %s\n", name, dlerror ());
    abort ();
  }
  return f;
}

static bool
is_target (int fd)
{
  char link[64], path[PATH_MAX];
  ssize_t n;

  if (!have_target)
    return false;
  snprintf (link, sizeof link, "/proc/self/fd/%d", fd);
  n = readlink (link, path, sizeof path - 1);
  if (n <= 0)
    return false;
  path[n] = 0;
  return strcmp (path, target) == 0;
}

static enum verdict
read_control (void)
{
  char buf[32];
  ssize_t n;
  int fd;

  if (control == NULL)
    return V_OK;
  fd = open (control, O_RDONLY | O_CLOEXEC);
  if (fd == -1)
    return V_OK;
  n = read (fd, buf, sizeof buf - 1);
  close (fd);
  if (n <= 0)
    return V_OK;
  buf[n] = 0;
  buf[strcspn (buf, " \t\n")] = 0;
  if (strcmp (buf, "hold") == 0)
    return V_HOLD;
  if (strcmp (buf, "fail") == 0)
    return V_FAIL;
  if (strcmp (buf, "fail-once") == 0)
    return V_FAIL_ONCE;
  return V_OK;
}

/* Rewrite file (if set) with the number n.  Caller holds lock. */
static void
write_number (const char *file, unsigned long n)
{
  char buf[32];
  int fd, len;

  if (file == NULL)
    return;
  fd = open (file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd == -1)
    return;
  len = snprintf (buf, sizeof buf, "%lu\n", n);
  if (write (fd, buf, len) != len) {
    /* A test aid: a short count file is seen by the test. */
  }
  close (fd);
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

/* Must this sync of fd fail?  Counts the call, waits while held. */
static bool
must_fail (int fd)
{
  enum verdict v;
  bool fail;

  pthread_once (&once, init);
  if (!is_target (fd))
    return false;
  pthread_mutex_lock (&lock);
  write_number (count_file, ++calls);
  pthread_mutex_unlock (&lock);

  v = wait_while_held ();

  pthread_mutex_lock (&lock);
  fail = v == V_FAIL || (v == V_FAIL_ONCE && !failed_once);
  if (fail) {
    failed_once = true;
    write_number (failed_file, ++failures);
  }
  pthread_mutex_unlock (&lock);
  return fail;
}

/* The real sync, after SHIM_DELAY_US if set (one at a time then). */
static int
real_sync (const char *name, int fd)
{
  int r;

  if (delay_us == 0 || !is_target (fd))
    return ((int (*) (int)) real (name)) (fd);
  pthread_mutex_lock (&delay_lock);
  nanosleep (&(struct timespec) { .tv_sec = delay_us / 1000000,
                                  .tv_nsec = delay_us % 1000000 * 1000 },
             NULL);
  r = ((int (*) (int)) real (name)) (fd);
  pthread_mutex_unlock (&delay_lock);
  return r;
}

int
fdatasync (int fd)
{
  if (must_fail (fd)) {
    errno = fail_errno;
    return -1;
  }
  return real_sync ("fdatasync", fd);
}

int
fsync (int fd)
{
  if (must_fail (fd)) {
    errno = fail_errno;
    return -1;
  }
  return real_sync ("fsync", fd);
}
