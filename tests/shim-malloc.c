/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* shim-malloc.so: an LD_PRELOAD shim for the tests that makes malloc
 * fail, as a process out of memory would, for allocations of one size
 * and only from the moment the test chooses.
 *
 * malloc (n) returns NULL with errno ENOMEM when
 *   - n is SHIM_MALLOC_SIZE (decimal bytes), and
 *   - the file SHIM_MALLOC_TRIGGER exists (looked up at each such
 *     call, so the test arms the shim by creating it), and
 *   - fewer than SHIM_MALLOC_TIMES (decimal, default 1) calls failed
 *     so far.
 * Every other call goes to glibc's allocator.  Each failure counts one
 * in SHIM_COUNT (a file of one decimal number, rewritten) if set.
 * Without SHIM_MALLOC_SIZE or SHIM_MALLOC_TRIGGER nothing fails.
 *
 * Only the size is compared: one size, armed just before the step
 * under test, singles out the allocation of that step in a server that
 * is otherwise idle.
 *
 * Not usable under a sanitizer: its runtime, preloaded first, serves
 * malloc itself and this one is never called.
 *
 * Usage: LD_PRELOAD=.../shim-malloc.so SHIM_MALLOC_SIZE=192
 *        SHIM_MALLOC_TRIGGER=armed SHIM_MALLOC_TIMES=2 nbdkit ...
 */

#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#include "shim-common.h"

/* glibc's allocator under its own name: no dlsym, which may itself
 * call malloc.
 */
extern void *__libc_malloc (size_t n);

/* Read once, at the first call of the failing size: getenv does not
 * allocate.
 */
static bool inited;
static size_t fail_size;
static const char *trigger, *count_file;
static unsigned long fail_times = 1;
static unsigned long failures;

static void
init (void)
{
  const char *s;

  if ((s = getenv ("SHIM_MALLOC_SIZE")) != NULL)
    fail_size = strtoull (s, NULL, 10);
  if ((s = getenv ("SHIM_MALLOC_TIMES")) != NULL)
    fail_times = strtoul (s, NULL, 10);
  trigger = getenv ("SHIM_MALLOC_TRIGGER");
  count_file = getenv ("SHIM_COUNT");
  __atomic_store_n (&inited, true, __ATOMIC_RELEASE);
}

/* Must this allocation of n bytes fail? */
static bool
must_fail (size_t n)
{
  unsigned long k;

  if (!__atomic_load_n (&inited, __ATOMIC_ACQUIRE))
    init ();                    /* Idempotent: a race reads env twice. */
  if (fail_size == 0 || n != fail_size || trigger == NULL ||
      __atomic_load_n (&failures, __ATOMIC_RELAXED) >= fail_times ||
      access (trigger, F_OK) == -1)
    return false;
  k = __atomic_add_fetch (&failures, 1, __ATOMIC_RELAXED);
  if (k > fail_times)
    return false;               /* Another thread took the last one. */
  shim_write_number (count_file, k);     /* Allocates nothing. */
  return true;
}

void *
malloc (size_t n)
{
  int err = errno;

  if (must_fail (n)) {
    errno = ENOMEM;
    return NULL;
  }
  errno = err;
  return __libc_malloc (n);
}
