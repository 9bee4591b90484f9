/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* backend-inject.h: a backend around another that injects what tests
 * and benchmarks need and no real backend does on its own: a price per
 * run (-D plug.backend_delay_us=N, a sleep before it, as nbdkit's delay
 * filter in front of the file plugin) and "not now" answers
 * (-D plug.inject_eagain=N: every Nth run fails with EAGAIN, which no
 * nbdkit filter can inject and the NBD protocol cannot carry).  The
 * other operations go straight to the backend inside.
 */
#ifndef NBDPLUG_BACKEND_INJECT_H
#define NBDPLUG_BACKEND_INJECT_H

#include "backend.h"

struct inject_params {
  int eagain_every;             /* 0: never. */
  int delay_us;                 /* 0: no sleep. */
};

/* Wrap inner (owned by the wrapper from here on, even on failure).
 * Returns NULL after nbdkit_error.  The count of -D plug.inject_eagain
 * runs over every wrapper: every Nth run of the process fails.
 */
extern struct backend *inject_open (struct backend *inner,
                                    const struct inject_params *p);

#endif /* NBDPLUG_BACKEND_INJECT_H */
