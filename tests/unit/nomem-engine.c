/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* src/engine*.c with allocations that fail on demand (alloc-fail.h),
 * for test-engine-nomem: linked before libplugcore, so that the
 * archive's own engine objects are never pulled in.  Every room of the
 * engine is included: one left to the archive would pull in a second
 * copy of the symbols, or allocate with the real calloc.
 */
#include <config.h>

#include "alloc-fail.h"
#include "../../src/engine.c"
#include "../../src/engine-admit.c"
#include "../../src/engine-direct.c"
#include "../../src/engine-durable.c"
#include "../../src/engine-life.c"
#include "../../src/engine-pace.c"
#include "../../src/engine-queue.c"
#include "../../src/engine-state.c"
