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

bool
retry_failed (const struct retry_policy *p, struct retry_state *s,
              uint64_t now_ns, uint64_t *delay_ns)
{
  uint64_t elapsed, left, d;

  if (s->attempts == 0)
    s->first_ns = now_ns;
  elapsed = now_ns >= s->first_ns ? now_ns - s->first_ns : 0;
  if (elapsed >= p->timeout_ns)
    return false;
  left = p->timeout_ns - elapsed;
  d = retry_delay (p, s->attempts);
  s->attempts++;
  *delay_ns = d < left ? d : left;
  return true;
}

void
retry_reset (struct retry_state *s)
{
  s->attempts = 0;
  s->first_ns = 0;
}
