/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* plugin.h: the plugin's global state, shared by plugin.c, conn.c,
 * glue.c, loop.c and request.c.
 *
 * Everything here is written during configuration (.config,
 * .config_complete, .get_ready: single threaded) and read-only after
 * that, except the statistics totals (under stats_lock).
 */
#ifndef NBDPLUG_PLUGIN_H
#define NBDPLUG_PLUGIN_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "layout.h"
#include "plug.h"
#include "retry.h"
#include "stats.h"

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

enum plug_mode {
  MODE_WRITEBACK,               /* Acknowledge once held (copied). */
  MODE_HOLD,                    /* Acknowledge once the backend did it. */
};

/* direct=: which requests skip the plug (conn.c, the direct path). */
enum plug_direct {
  DIRECT_NEVER,                 /* None: everything is plugged. */
  DIRECT_AUTO,                  /* What cannot merge, to a backing file
                                 * that writes it about as fast as the
                                 * plug copies it (a local file); to an
                                 * NBD server in writeback mode only
                                 * direct-size= requests. */
  DIRECT_ALWAYS,                /* What cannot merge, to any file. */
};

struct config {
  enum plug_mode mode;
  uint64_t idle_ns;             /* 0: unplug when the queue is drained. */
  uint64_t max_delay_ns;
  struct plug_limits lim;
  unsigned max_inflight;
  unsigned io_threads;          /* Threads issuing runs (iopool). */
  enum plug_direct direct;
  uint64_t direct_min;          /* direct-size=: so do requests this
                                 * large. */
  struct retry_policy retry;
  bool shared;                  /* lock=no: no lock on the files. */
  const char *statsfile;        /* Owned (nbdkit_realpath-like copy). */
  unsigned remote_connections;  /* remote-connections=: handles per NBD
                                 * URI (where it allows multi-conn). */
  unsigned remote_queue_depth;  /* remote-queue-depth=: runs in flight
                                 * per NBD URI. */
  uint64_t stats_interval_ns;   /* stats-interval=: rewrite stats-file=
                                 * this often while connections are
                                 * open; 0: only at close and exit. */
  uint64_t connect_timeout_ns;  /* connect-timeout=: one attempt to
                                 * connect to an NBD server. */
  uint64_t connect_retry_ns;    /* connect-retry=: keep trying at start
                                 * for this long. */
  const char *connect_timeout_text;  /* Both as given (or the default). */
  const char *connect_retry_text;
};

extern struct config cfg;
extern struct layout layout;
extern struct backing *backings;  /* Owned: [layout.nr]. */
extern size_t nr_backings;

/* Debug flags (-D plug.NAME=N). */
extern int plug_debug_stats;
extern int plug_debug_unplug;

/* Monotonic clock in nanoseconds. */
extern uint64_t now_ns (void);

struct conn;

/* A connection closes: take it out of the registry, add its statistics
 * to the totals and rewrite stats-file= (if any), all under stats_lock.
 * Context: .close.  Returns how many connections are left.
 */
extern size_t stats_publish_close (struct conn *c);

/* Rewrite stats-file= (if any) with the live figures.  Takes stats_lock,
 * then conns_lock and eng_lock briefly (conns_live).  Context: the
 * timer thread, every stats-interval= while connections are open.
 */
extern void stats_write_live (void);

static inline const char *
mode_name (enum plug_mode m)
{
  return m == MODE_HOLD ? "hold" : "writeback";
}

#endif /* NBDPLUG_PLUGIN_H */
