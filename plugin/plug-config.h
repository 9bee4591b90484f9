/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* plug-config.h: the plugin's parameters (key=value on nbdkit's command
 * line), parsed into a struct config that the caller owns.
 *
 * nbdkit calls .config once per key, then .config_complete, all in one
 * thread before any connection: config_set fills the struct key by key,
 * config_complete checks it as a whole and settles the defaults that
 * depend on other keys.  After that it is read-only; every other part
 * of the plugin gets what it needs of it as arguments at start.
 */
#ifndef NBDPLUG_PLUG_CONFIG_H
#define NBDPLUG_PLUG_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plug.h"
#include "retry.h"

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

/* The parameters that have an old name too (config.c,
 * deprecated_keys).
 */
#define CONFIG_NR_RENAMED 5

/* What config_set remembers between keys, for the checks that involve
 * two keys given in any order (config_complete) and for their messages.
 */
struct config_given {
  unsigned names[CONFIG_NR_RENAMED];  /* enum name_given bits (config.c). */
  bool max_requests;            /* max-requests= given. */
  /* As given (or the defaults, as --dump-plugin says them). */
  char idle_text[64], max_delay_text[64];
  char requeue_delay_text[64], requeue_timeout_text[64];
};

struct config {
  char **files;                 /* Owned, [nr_files]: realpath copies, or
                                 * NBD URIs as given. */
  size_t nr_files;
  uint64_t stripe;              /* stripe=: 0 means concatenated. */
  enum plug_mode mode;
  uint64_t idle_ns;             /* 0: unplug when the queue is drained. */
  uint64_t max_delay_ns;
  struct plug_limits lim;
  unsigned max_inflight;
  unsigned io_threads;          /* Threads issuing runs (iopool). */
  enum plug_direct direct;
  uint64_t direct_size;         /* direct-size=: so do requests this
                                 * large (config_direct_size settles the
                                 * default). */
  struct retry_policy retry;
  bool shared;                  /* lock=no: no lock on the files. */
  char *statsfile;              /* Owned: absolute, or NULL. */
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
  const char *connect_timeout_text;  /* Both as given (nbdkit keeps the
                                      * strings) or the default. */
  const char *connect_retry_text;

  struct config_given given;    /* config_set's notes, for config_complete. */
};

/* The defaults, before the first key. */
extern void config_init (struct config *c);

/* One key=value (.config).  Returns 0, or -1 after nbdkit_error.  A
 * deprecated name or a harmless oddity is said with nbdkit_error and
 * still returns 0.
 */
extern int config_set (struct config *c, const char *key, const char *value);

/* All keys given (.config_complete): check what involves several keys
 * and settle the defaults that depend on them.  Returns 0, or -1 after
 * nbdkit_error.
 */
extern int config_complete (struct config *c);

/* direct-size='s default, once it is known whether an NBD server is
 * among the backing files (.get_ready): kept if given.
 */
extern void config_direct_size (struct config *c, bool any_remote);

/* Free what c owns (.unload). */
extern void config_free (struct config *c);

/* --dump-plugin: the defaults, one "plug_KEY_default=VALUE" a line. */
extern void config_dump (void);

/* --help: the parameters, one or two lines each. */
extern const char config_help[];

static inline const char *
mode_name (enum plug_mode m)
{
  return m == MODE_HOLD ? "hold" : "writeback";
}

#endif /* NBDPLUG_PLUG_CONFIG_H */
