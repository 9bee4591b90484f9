/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* request-size: prints the size of the block plugin/request.c allocates
 * for a request without pieces (a FLUSH, a close, the exit), for
 * test-close-nomem.sh's malloc shim to fail exactly that allocation.
 * Keep the rounding in step with request.c's header_size.
 */

#include <config.h>

#include <stddef.h>
#include <stdio.h>

#include "request.h"

int
main (void)
{
  size_t n = offsetof (struct request, pieces);

  printf ("%zu\n", (n + 63) & ~(size_t) 63);
  return 0;
}
