/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* shim-common.h: what the tests' LD_PRELOAD shims (shim-pwritev.c,
 * shim-fdatasync.c, shim-malloc.c) share: which file a descriptor is,
 * the real function under the shim, the first word of a control file
 * and a count file.  Static inline: each shim is one object of its
 * own, and these are test aids, not a library.
 *
 * shim_write_number may run inside malloc (shim-malloc.c): it does
 * not allocate (no stdio, a hand-made number).  The others may.
 */

#ifndef NBDPLUG_SHIM_COMMON_H
#define NBDPLUG_SHIM_COMMON_H

#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The one file a shim acts on: the realpath of an environment
 * variable's value, taken once at the shim's init.
 */
struct shim_target {
  bool set;                     /* The variable named an existing file. */
  char path[PATH_MAX];
};

/* Set *t from the environment variable var (unset, or no such file:
 * no target, and shim_is_target is false for every descriptor).
 */
static inline void
shim_target_init (struct shim_target *t, const char *var)
{
  const char *s = getenv (var);

  t->set = s != NULL && realpath (s, t->path) != NULL;
}

/* Is fd the target file?  Compared by name, through readlink of
 * /proc/self/fd/N: the file the descriptor was opened on, whatever
 * path the opener gave (relative, through a symlink).
 */
static inline bool
shim_is_target (const struct shim_target *t, int fd)
{
  char link[64], path[PATH_MAX];
  ssize_t n;

  if (!t->set)
    return false;
  snprintf (link, sizeof link, "/proc/self/fd/%d", fd);
  n = readlink (link, path, sizeof path - 1);
  if (n <= 0)
    return false;
  path[n] = '\0';
  return strcmp (path, t->path) == 0;
}

/* The next definition of function name after the shim's (libc's);
 * aborts, naming the shim, if there is none.
 */
static inline void *
shim_real (const char *shim, const char *name)
{
  void *f = dlsym (RTLD_NEXT, name);

  if (f == NULL) {
    fprintf (stderr, "%s: dlsym %s: %s\n", shim, name, dlerror ());
    abort ();
  }
  return f;
}

/* The first word (up to a blank or a newline) of file into buf, which
 * has size bytes; false, and buf empty, if the file cannot be opened
 * or is empty.  Read at every call, so that a test changes a shim's
 * behaviour by rewriting the file: a file read while it is rewritten
 * in place may read empty (replace it instead: write another file,
 * rename).
 */
static inline bool
shim_read_word (const char *file, char *buf, size_t size)
{
  ssize_t n;
  int fd;

  buf[0] = '\0';
  fd = open (file, O_RDONLY | O_CLOEXEC);
  if (fd == -1)
    return false;
  n = read (fd, buf, size - 1);
  close (fd);
  if (n <= 0) {
    buf[0] = '\0';
    return false;
  }
  buf[n] = '\0';
  buf[strcspn (buf, " \t\n")] = '\0';
  return true;
}

/* Rewrite file (if not NULL) with the number n and a newline: a count
 * file that the test reads.  Does not allocate.  A short write is left
 * as it is: the test sees a wrong count.  Two calls at once for one
 * file may leave either number: a caller whose file must end with the
 * latest serializes its calls.
 */
static inline void
shim_write_number (const char *file, unsigned long n)
{
  char buf[32];
  size_t i = sizeof buf;
  int fd;

  if (file == NULL)
    return;
  buf[--i] = '\n';
  do {
    buf[--i] = '0' + n % 10;
    n /= 10;
  } while (n > 0);
  fd = open (file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd == -1)
    return;
  if (write (fd, buf + i, sizeof buf - i) != (ssize_t) (sizeof buf - i)) {
    /* A test aid: a short count file is seen by the test. */
  }
  close (fd);
}

#endif /* NBDPLUG_SHIM_COMMON_H */
