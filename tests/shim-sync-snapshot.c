/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* shim-sync-snapshot.so: an LD_PRELOAD shim for the record tests that
 * controls fdatasync and fsync of one file, SHIM_SYNC_PATH (compared
 * through readlink of /proc/self/fd/N with its realpath):
 *   SHIM_SYNC_FAIL=F     F holds a number N; while N > 0 each sync
 *                        fails with EIO without syncing and N goes
 *                        down by one (the file is rewritten).
 *   SHIM_SYNC_DELAY_US=N each sync takes N microseconds more.
 *   SHIM_SYNC_DURABLE=P  at the start of each sync that will succeed,
 *                        the file's contents are copied to P (through
 *                        P.tmp and rename): what is on stable storage
 *                        at the latest once that sync returns, i.e.
 *                        what a power loss right after it keeps.
 * Other files' syncs go to the real functions.
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
#include <sys/stat.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char target[PATH_MAX];
static bool have_target;

static void
init (void)
{
  const char *s = getenv ("SHIM_SYNC_PATH");

  if (s && realpath (s, target) != NULL)
    have_target = true;
}

static bool
is_target (int fd)
{
  char link[64], path[PATH_MAX];
  ssize_t n;

  pthread_once (&once, init);
  if (!have_target)
    return false;
  snprintf (link, sizeof link, "/proc/self/fd/%d", fd);
  n = readlink (link, path, sizeof path - 1);
  if (n < 0)
    return false;
  path[n] = '\0';
  return strcmp (path, target) == 0;
}

/* Take one failure from SHIM_SYNC_FAIL's count, if it has one. */
static bool
take_failure (void)
{
  const char *name = getenv ("SHIM_SYNC_FAIL");
  FILE *fp;
  long n = 0;

  if (name == NULL || (fp = fopen (name, "r")) == NULL)
    return false;
  if (fscanf (fp, "%ld", &n) != 1)
    n = 0;
  fclose (fp);
  if (n <= 0)
    return false;
  if ((fp = fopen (name, "w")) != NULL) {
    fprintf (fp, "%ld\n", n - 1);
    fclose (fp);
  }
  return true;
}

static void
snapshot (int fd)
{
  static char buf[1 << 16];
  const char *dest = getenv ("SHIM_SYNC_DURABLE");
  char tmp[PATH_MAX];
  struct stat st;
  off_t off;
  int out;

  if (dest == NULL || fstat (fd, &st) == -1)
    return;
  snprintf (tmp, sizeof tmp, "%s.tmp", dest);
  out = open (tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (out == -1)
    return;
  for (off = 0; off < st.st_size; ) {
    ssize_t n = pread (fd, buf, sizeof buf, off), i;

    if (n <= 0)
      break;
    for (i = 0; i < n && buf[i] == 0; ++i)
      ;
    if (i < n && pwrite (out, buf, n, off) != n)
      break;
    off += n;
  }
  if (ftruncate (out, st.st_size) == 0)
    rename (tmp, dest);
  close (out);
}

static void
delay (void)
{
  const char *s = getenv ("SHIM_SYNC_DELAY_US");

  if (s)
    usleep (atoi (s));
}

static int
shim_sync (int fd, int (*real) (int))
{
  bool fail;

  if (!is_target (fd))
    return real (fd);
  pthread_mutex_lock (&lock);
  fail = take_failure ();
  if (!fail)
    snapshot (fd);
  pthread_mutex_unlock (&lock);
  delay ();
  if (fail) {
    errno = EIO;
    return -1;
  }
  return real (fd);
}

int
fdatasync (int fd)
{
  int (*real) (int) = (int (*) (int)) dlsym (RTLD_NEXT, "fdatasync");

  return shim_sync (fd, real);
}

int
fsync (int fd)
{
  int (*real) (int) = (int (*) (int)) dlsym (RTLD_NEXT, "fsync");

  return shim_sync (fd, real);
}
