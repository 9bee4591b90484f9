/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* plugin.h: what the entry room (plugin.c) offers the rest of the
 * plugin: the debug flags and the clock.
 *
 * The debug flags are set by nbdkit before .config and read-only after
 * that; the injection counter is atomic.
 */
#ifndef NBDPLUG_PLUGIN_H
#define NBDPLUG_PLUGIN_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "plug-config.h"
#include "stats.h"
#include "statsfile.h"            /* stats_write_live, for loop.c. */

/* A thread-local variable of the plugin.  initial-exec: it lives in the
 * thread's static TLS block (ld.so reserves room for dlopen'd objects),
 * read with one %fs-relative load.  The default model for a shared
 * object is dynamic TLS, which a thread's first access allocates with
 * ld.so's malloc through __tls_get_addr, a call on every access;
 * ThreadSanitizer's hook of that call reports a race between the
 * allocation and glibc freeing a finished thread's TLS (synchronised by
 * a lock inside glibc that it cannot see), and once crashed in it.
 * tests/test-static-tls.sh checks that no dynamic TLS is left.
 */
#define PLUG_THREAD_LOCAL __thread __attribute__ ((tls_model ("initial-exec")))

/* Debug flags (-D plug.NAME=N). */
extern int plug_debug_stats;
extern int plug_debug_unplug;

/* Monotonic clock in nanoseconds. */
extern uint64_t now_ns (void);


#endif /* NBDPLUG_PLUGIN_H */
