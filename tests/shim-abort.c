/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* shim-abort.so: an LD_PRELOAD shim for the tests that calls abort(3)
 * from a thread of its own once the file ABORT_TRIGGER exists (polled
 * every 10 ms): a real abort in a thread that is not the plugin's, as
 * nbdkit 1.32.4's assertion in a worker thread (rescue.h).
 * ABORT_TWICE=1: two such threads, aborting at about the same time.
 * Without ABORT_TRIGGER the shim does nothing.
 *
 * Usage: LD_PRELOAD=.../shim-abort.so ABORT_TRIGGER=trigger nbdkit ...
 *        touch trigger
 */

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

static const char *trigger;

static void *
watch (void *arg)
{
  (void) arg;
  while (access (trigger, F_OK) != 0)
    usleep (10000);
  abort ();
}

static void
start_watcher (void)
{
  pthread_t t;

  if (pthread_create (&t, NULL, watch, NULL) == 0)
    pthread_detach (t);
}

__attribute__ ((constructor)) static void
shim_abort_init (void)
{
  trigger = getenv ("ABORT_TRIGGER");
  if (trigger == NULL)
    return;
  start_watcher ();
  if (getenv ("ABORT_TWICE") != NULL)
    start_watcher ();
}
