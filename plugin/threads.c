/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* threads.c: naming the plugin's threads and making them I/O flushers.
 *
 * In front of a local /dev/nbd (the kernel's nbd driver on the same
 * machine), the kernel may need this process to write dirty pages of
 * that device before it can free memory.  A thread of the process that
 * allocates memory then enters reclaim, which may wait for writeback to
 * /dev/nbd, which waits for this process: the reclaim deadlock.  Linux
 * 5.6 added PR_SET_IO_FLUSHER for such daemons ("userspace processes
 * that are needed to perform I/O", prctl(2)): the thread's allocations
 * behave as GFP_NOIO (PF_MEMALLOC_NOIO: reclaim starts no I/O) and its
 * writes are throttled only against the device it writes to
 * (PF_LOCAL_THROTTLE); kernel/sys.c sets both bits.  It needs
 * CAP_SYS_RESOURCE; without it, or on an older kernel, the thread runs
 * as before and -v says so for each thread.  The flag is per thread: nbdkit's own
 * worker threads (which copy held writes in writeback mode) are not
 * the plugin's to change; the man page says what to do about them.
 */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <string.h>

#ifdef HAVE_SYS_PRCTL_H
#include <sys/prctl.h>
#endif

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "threads.h"

/* One debug line per thread, naming it: a thread that never asked is
 * then visible (tests/test-io-flusher.sh counts the lines per name
 * against the threads in /proc), wherever the kernel refuses the flag.
 * The plugin starts a bounded number of threads, each once.
 */
static void
make_io_flusher (const char *name)
{
#if defined (HAVE_SYS_PRCTL_H) && defined (PR_SET_IO_FLUSHER)
  if (prctl (PR_SET_IO_FLUSHER, 1, 0, 0, 0) == 0) {
    nbdkit_debug ("thread %s: an I/O flusher (PR_SET_IO_FLUSHER)", name);
    return;
  }
  int err = errno;

  if (err == EPERM)
    nbdkit_debug ("thread %s: not an I/O flusher: PR_SET_IO_FLUSHER "
                  "needs CAP_SYS_RESOURCE: %s", name, strerror (err));
  else
    nbdkit_debug ("thread %s: not an I/O flusher: PR_SET_IO_FLUSHER "
                  "(Linux 5.6): %s", name, strerror (err));
#else
  nbdkit_debug ("thread %s: not an I/O flusher: built without "
                "PR_SET_IO_FLUSHER", name);
#endif
}

void
thread_setup (const char *name)
{
  /* Cosmetic: a name the kernel refuses leaves the inherited one. */
  pthread_setname_np (pthread_self (), name);
  make_io_flusher (name);
}
