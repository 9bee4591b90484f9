/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* backing.c: one backing file: its backend and what the plumbing
 * learns about it.  See backing.h.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backing.h"
#include "file.h"

/* Open the backend of name: an NBD export or a local file. */
static struct backend *
open_backend (struct backing *b, const char *name,
              const struct backing_params *p)
{
  struct backend *be;

  if (remote_is_uri (name)) {
    b->remote = remote_open (name, &p->remote);
    return b->remote ? remote_backend (b->remote) : NULL;
  }
  be = file_open (name, p->lock);
  /* The debug flags price and refuse a local file's runs: a remote's
   * are issued by its loop thread, which must not sleep, and its server
   * answers "not now" on its own.
   */
  if (be != NULL &&
      (p->inject.eagain_every > 0 || p->inject.delay_us > 0))
    be = inject_open (be, &p->inject);
  return be;
}

int
backing_open (struct backing *b, const char *name,
              const struct backing_params *p)
{
  memset (b, 0, sizeof *b);
  b->run_ns = 2 * BACKING_FAST_RUN_NS;  /* Slow until measured. */
  b->be = open_backend (b, name, p);
  if (b->be == NULL)
    return -1;
  b->name = name;
  b->size = b->be->size;
  b->readonly = b->be->readonly;
  b->min_block = b->be->min_block;
  return 0;
}

void
backing_close (struct backing *b)
{
  if (b->be)
    b->be->ops->close (b->be);
  b->be = NULL;
  b->remote = NULL;
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
  return !b->be->async &&
    __atomic_load_n (&b->run_ns, __ATOMIC_RELAXED) <= BACKING_FAST_RUN_NS;
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
