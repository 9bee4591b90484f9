/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* file.h: the local file backend (backend.h): a regular file or a
 * block device, written with pwritev and fallocate in the calling
 * thread.  pread/pwrite on one fd are safe from many threads.
 */
#ifndef NBDPLUG_FILE_H
#define NBDPLUG_FILE_H

#include <stdbool.h>

#include "backend.h"

/* Open name (O_RDWR, or O_RDONLY if it cannot be written) and find its
 * size.  A file opened read-write is locked against other processes
 * (refused if one holds a lock on it) when lock is true (lock=no makes
 * it false).  name is borrowed until close.  Returns NULL after
 * nbdkit_error naming the file.
 */
extern struct backend *file_open (const char *name, bool lock);

#endif /* NBDPLUG_FILE_H */
