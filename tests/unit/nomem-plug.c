/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* src/plug.c with allocations that fail on demand (alloc-fail.h), for
 * test-engine-nomem: linked before libplugcore, so that the archive's
 * own plug.o is never pulled in.
 */
#include <config.h>

#include "alloc-fail.h"
#include "../../src/plug.c"
