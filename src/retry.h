/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* retry.h: what to do when a backend says "not now" (pure).
 *
 * The kernel's answer to a driver out of resources is to requeue the
 * request and run the queue again a little later (blk_delay_queue in
 * 2.6.39, blk_mq_delay_run_hw_queue with BLK_MQ_RESOURCE_DELAY = 3 ms
 * today).  We do the same, with a capped exponential backoff so that a
 * backend that stays short of resources is not polled every 3 ms for
 * seconds, and a give-up deadline so that no request waits forever.
 *
 * The engine (engine-queue.c) keeps one struct retry_state per backing-file
 * queue for the backoff and asks retry_delay() for each delay.
 */
#ifndef NBDPLUG_RETRY_H
#define NBDPLUG_RETRY_H

#include <stdbool.h>
#include <stdint.h>

struct retry_policy {
  uint64_t delay_ns;            /* First delay (requeue-delay=). */
  uint64_t max_delay_ns;        /* Cap of the backoff (requeue-max-delay=). */
  uint64_t timeout_ns;          /* Give up this long after the first
                                 * failure (requeue-timeout=). */
};

/* The backoff of one queue, and since when it says "not now".  The
 * give-up deadline is the queue's (requeue-timeout= "when a backing file
 * has said not now" for that long), not each run's: with one slot, runs
 * that each waited their own timeout would give up one after another,
 * N times requeue-timeout for N runs.
 */
struct retry_state {
  unsigned attempts;            /* Delays so far; 0 = not delayed. */
  uint64_t since_ns;            /* First "not now" since the last
                                 * success; 0: none. */
};

/* Is err a "not now" (resource shortage) rather than a failure?
 * EAGAIN/EWOULDBLOCK and ENOMEM (an allocation a dispatch needs, as the
 * SCSI midlayer treats it), and EBUSY.
 */
extern bool retry_is_transient (int err);

/* Delay before retry number `attempt` (0-based): delay_ns << attempt,
 * capped at max_delay_ns (and never 0, so a timer always advances).
 */
extern uint64_t retry_delay (const struct retry_policy *p, unsigned attempt)
  __attribute__ ((__nonnull__ (1)));

/* A success: forget the failures. */
extern void retry_reset (struct retry_state *s)
  __attribute__ ((__nonnull__ (1)));

#endif /* NBDPLUG_RETRY_H */
