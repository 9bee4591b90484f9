/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* retry.c: see retry.h. */

#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include "retry.h"

bool
retry_is_transient (int err)
{
  return err == EAGAIN || err == EWOULDBLOCK || err == ENOMEM ||
    err == EBUSY;
}

uint64_t
retry_delay (const struct retry_policy *p, unsigned attempt)
{
  uint64_t d = p->delay_ns ? p->delay_ns : 1;
  uint64_t cap = p->max_delay_ns > d ? p->max_delay_ns : d;

  while (attempt-- > 0 && d < cap)
    d = d > cap / 2 ? cap : d * 2;
  return d < cap ? d : cap;
}

void
retry_reset (struct retry_state *s)
{
  s->attempts = 0;
  s->since_ns = 0;
}
