/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* config.c: the plugin's parameters.  See plug-config.h (config.h is
 * autoconf's).
 */

#include <config.h>

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "plug-config.h"
#include "parse.h"
#include "remote.h"

/* Defaults.  The man page explains each (NOTES, "Choice of defaults"). */
#define DEFAULT_IDLE_NS           1000000ULL    /* 1 ms */
#define DEFAULT_MAX_DELAY_NS     10000000ULL    /* 10 ms */
/* Both modes.  In hold mode the "parked" trigger, not this limit, keeps
 * a plug from waiting for a request no free thread can read (the man
 * page's "Choice of defaults" has the measurement).
 */
#define DEFAULT_MAX_REQUESTS           256
#define DEFAULT_MAX_BYTES         (4 * 1024 * 1024)
#define DEFAULT_MAX_MERGE         (1024 * 1024)
#define DEFAULT_MAX_INFLIGHT           64
/* Threads issuing runs, shared by all connections: as many as nbdkit's
 * default worker threads per connection, so that unmergeable I/O keeps
 * the parallelism a plain file plugin has.
 */
#define DEFAULT_IO_THREADS             16
/* Requests at least this large are written at once (no copy).  In
 * front of an NBD server, where every operation is a round trip, only a
 * request as large as the largest run (max-merge's default), which
 * cannot become part of a larger one; the kernel's nbd driver sends
 * 64-128 KiB requests, and those merge.  On local files the page cache
 * takes a 64 KiB write for about what the plug's copy of it costs, so
 * merging it saves nothing: measured, CPU per 64 KiB sequential write
 * 1.11x of nbdkit file against 1.38x with 1M.
 */
#define DEFAULT_DIRECT_SIZE_LOCAL   (64 * 1024)
#define DEFAULT_DIRECT_SIZE_REMOTE  (1024 * 1024)
/* blk-mq's BLK_MQ_RESOURCE_DELAY: rerun the queue 3 ms later. */
#define DEFAULT_RETRY_DELAY_NS    3000000ULL
#define DEFAULT_RETRY_MAX_DELAY_NS 100000000ULL  /* 100 ms */
#define DEFAULT_RETRY_TIMEOUT_NS  10000000000ULL /* 10 s */
/* NBD backing files (file=nbd://...): handles per server where it
 * advertises multi-conn, and runs in flight per server.  Both are
 * explained in the man page with their measurements.
 */
/* stats-interval=: often enough for a person watching nbdplug-stat
 * (iostat's usual 1-2 s), rarely enough that rewriting a few KiB costs
 * nothing.
 */
#define DEFAULT_STATS_INTERVAL_NS 2000000000ULL /* 2 s */
/* Below this the timer thread, the one that also unplugs on idle= and
 * max-delay=, would spend its time rewriting the file (1ns measured at
 * a quarter of a core with one idle connection), and no reader of the
 * file looks that often.
 */
#define STATS_INTERVAL_MIN_NS     100000000ULL /* 100 ms */
#define STATS_INTERVAL_MIN_TEXT   "100ms"
#define DEFAULT_REMOTE_CONNECTIONS      4
#define DEFAULT_REMOTE_QUEUE_DEPTH     64
/* One attempt to connect to an NBD server (TCP connect, TLS and NBD
 * handshakes): a server that is up answers in milliseconds, one across
 * a slow WAN with TLS in well under a second; without a bound a
 * black-holed address waits for the kernel's SYN retries (about 127 s
 * with net.ipv4.tcp_syn_retries=6).  As long as retry-timeout='s
 * default, the longest a client is kept waiting for a server.
 */
#define DEFAULT_CONNECT_TIMEOUT_NS 10000000000ULL /* 10 s */
#define DEFAULT_CONNECT_TIMEOUT_TEXT "10s"
/* One attempt at start, as nbdkit-nbd-plugin's retry=0: a mistyped URI
 * fails at once.  A plug started beside its storage sets it.
 */
#define DEFAULT_CONNECT_RETRY_NS   0
#define DEFAULT_CONNECT_RETRY_TEXT "0"
#define STRIPE_MIN 4096

void
config_init (struct config *c)
{
  *c = (struct config) {
    .mode = MODE_WRITEBACK,
    .idle_ns = DEFAULT_IDLE_NS,
    .max_delay_ns = DEFAULT_MAX_DELAY_NS,
    .lim = {
      .max_requests = 0,        /* Set by mode in config_complete. */
      .max_bytes = DEFAULT_MAX_BYTES,
      .max_merge = DEFAULT_MAX_MERGE,
      .max_iov = IOV_MAX,
    },
    .max_inflight = DEFAULT_MAX_INFLIGHT,
    .io_threads = DEFAULT_IO_THREADS,
    .direct = DIRECT_AUTO,
    .direct_size = UINT64_MAX,  /* Set by config_direct_size unless given. */
    .retry = {
      .delay_ns = DEFAULT_RETRY_DELAY_NS,
      .max_delay_ns = DEFAULT_RETRY_MAX_DELAY_NS,
      .timeout_ns = DEFAULT_RETRY_TIMEOUT_NS,
    },
    .remote_connections = DEFAULT_REMOTE_CONNECTIONS,
    .remote_queue_depth = DEFAULT_REMOTE_QUEUE_DEPTH,
    .stats_interval_ns = DEFAULT_STATS_INTERVAL_NS,
    .connect_timeout_ns = DEFAULT_CONNECT_TIMEOUT_NS,
    .connect_retry_ns = DEFAULT_CONNECT_RETRY_NS,
    .connect_timeout_text = DEFAULT_CONNECT_TIMEOUT_TEXT,
    .connect_retry_text = DEFAULT_CONNECT_RETRY_TEXT,
    .given = {
      .idle_text = "1ms",
      .max_delay_text = "10ms",
      .requeue_delay_text = "3ms",
      .requeue_timeout_text = "10s",
    },
  };
}

static int
parse_duration_param (const char *key, const char *value, uint64_t *ns)
{
  if (parse_duration (value, ns) == 0)
    return 0;
  if (errno == ERANGE)
    nbdkit_error ("%s=%s: too long (at most about 584 years)", key, value);
  else
    nbdkit_error ("%s=%s: expected a duration such as 3ms, 500us or 0.5s",
                  key, value);
  return -1;
}

static int
parse_size_param (const char *key, const char *value, uint64_t *r,
                  uint64_t min, uint64_t max)
{
  int64_t v = nbdkit_parse_size (value);

  if (v == -1) {
    /* nbdkit_parse_size's own message does not name the parameter. */
    nbdkit_error ("%s=%s: expected a size such as 4096, 64k or 1M",
                  key, value);
    return -1;
  }
  if ((uint64_t) v < min || (uint64_t) v > max) {
    nbdkit_error ("%s=%s: must be between %" PRIu64 " and %" PRIu64,
                  key, value, min, max);
    return -1;
  }
  *r = v;
  return 0;
}

/* Our own, not nbdkit_parse_unsigned: nbdkit 1.32's names only the key
 * and calls any non-number an "empty string".  Digits only: strtoul
 * alone would take " 5", "+5" and "-1" (as ULONG_MAX).
 */
static int
parse_count_param (const char *key, const char *value, unsigned *r,
                   unsigned min, unsigned max)
{
  unsigned long v;
  char *end;

  errno = 0;
  if (!isdigit ((unsigned char) value[0]) ||
      (v = strtoul (value, &end, 10), *end != '\0')) {
    nbdkit_error ("%s=%s: expected a whole number between %u and %u",
                  key, value, min, max);
    return -1;
  }
  if (errno == ERANGE || v < min || v > max) {
    nbdkit_error ("%s=%s: must be between %u and %u", key, value, min, max);
    return -1;
  }
  *r = v;
  return 0;
}

/* A requeue-timeout below requeue-delay gives up on a "not now" before its
 * first retry, which would make "not now" an error after all.
 */
static int
check_retry_timeout (const struct config *c)
{
  if (c->retry.timeout_ns >= c->retry.delay_ns)
    return 0;
  nbdkit_error ("requeue-timeout=%s: must be at least requeue-delay=%s "
                "(a backing file that says \"not now\" would be given up "
                "on before its first retry)",
                c->given.requeue_timeout_text, c->given.requeue_delay_text);
  return -1;
}


/* The names of earlier releases, accepted until the next one.  nbdkit
 * offers every key to the filters first: statsfile= and retry-delay=
 * are the stats and retry filters' own, and reach the plug only when
 * no such filter is loaded.  The new names are ours alone (checked
 * against every filter's by tests/test-filter-keys.sh).
 */
static const struct deprecated_key {
  const char *old, *new, *why;
} deprecated_keys[] = {
  { "statsfile", "stats-file", "it is nbdkit-stats-filter's key" },
  { "retry-delay", "requeue-delay", "it is nbdkit-retry-filter's key" },
  { "retry-max-delay", "requeue-max-delay", "renamed with retry-delay=" },
  { "retry-timeout", "requeue-timeout", "renamed with retry-delay=" },
  { "shared", "lock", "nbdkit-nbd-plugin's shared= means something else" },
};
#define NR_DEPRECATED (sizeof deprecated_keys / sizeof deprecated_keys[0])
_Static_assert (NR_DEPRECATED == CONFIG_NR_RENAMED,
                "struct config_given has a slot per renamed parameter");

/* Which names of each renamed parameter were given (.config runs in
 * one thread): both at once is refused, since which one won would
 * depend on their order on the command line.
 */
enum name_given { GIVEN_NONE = 0, GIVEN_OLD = 1, GIVEN_NEW = 2 };

/* Note that key was given; -1 after nbdkit_error if the other name of
 * the same parameter was given too.
 */
static int
note_name_given (struct config *c, const char *key)
{
  size_t i;

  for (i = 0; i < NR_DEPRECATED; ++i) {
    const struct deprecated_key *d = &deprecated_keys[i];
    bool is_old = strcmp (key, d->old) == 0;

    if (!is_old && strcmp (key, d->new) != 0)
      continue;
    c->given.names[i] |= is_old ? GIVEN_OLD : GIVEN_NEW;
    if (c->given.names[i] == (GIVEN_OLD | GIVEN_NEW)) {
      nbdkit_error ("%s= and %s= both given: %s= is the deprecated name "
                    "of %s=; give only %s=", d->new, d->old, d->old,
                    d->new, d->new);
      return -1;
    }
    return 0;
  }
  return 0;
}

/* The current name of key, saying so if key is an old one (shared=,
 * whose value is inverted, says so itself).  nbdkit 1.32 has no
 * warning level and nbdkit_debug is seen only with -v, so the warning
 * is an nbdkit_error message; nbdkit starts all the same.
 */
static const char *
current_key (const char *key, const char *value)
{
  size_t i;

  for (i = 0; i < NR_DEPRECATED; ++i) {
    const struct deprecated_key *d = &deprecated_keys[i];

    if (strcmp (key, d->old) == 0 && strcmp (d->old, "shared") != 0) {
      nbdkit_error ("warning: %s=%s: %s= is deprecated (%s), use %s= "
                    "instead; the old name goes in the next release",
                    key, value, d->old, d->why, d->new);
      return d->new;
    }
  }
  return key;
}

/* A path that starts like a URI ("scheme://") with a scheme libnbd
 * does not serve is a mistyped URI far more often than a file in a
 * directory named "nbdx:": say so rather than "No such file".
 */
static int
check_uri_scheme (const char *value)
{
  size_t n = 0;

  if (!isalpha ((unsigned char) value[0]))
    return 0;
  while (isalnum ((unsigned char) value[n]) || value[n] == '+' ||
         value[n] == '-' || value[n] == '.')
    n++;
  if (strncmp (value + n, "://", 3) != 0)
    return 0;
  nbdkit_error ("file=%s: unknown URI scheme '%.*s': expected one of %s "
                "(a local path that starts like this: write ./%s)",
                value, (int) n, value, remote_uri_schemes (), value);
  return -1;
}

/* An idle= longer than max-delay= never fires: the oldest held
 * request is at least as old as the last one, so max-delay= always
 * comes first (plug_deadline in src/engine.c).  Harmless (the plug
 * still unplugs, at max-delay=), so nbdkit starts; but whoever set it
 * expected the plug to wait that long, so it is said.
 */
static void
check_idle (const struct config *c)
{
  if (c->idle_ns <= c->max_delay_ns)
    return;
  nbdkit_error ("warning: idle=%s is longer than max-delay=%s, so it has "
                "no effect: a plug goes out max-delay= after its oldest "
                "request at the latest; to hold longer, raise max-delay= "
                "too", c->given.idle_text, c->given.max_delay_text);
}

/* Append path (owned from here on) to c's files.  -1 with errno. */
static int
add_file (struct config *c, char *path)
{
  char **f = realloc (c->files, (c->nr_files + 1) * sizeof *f);

  if (f == NULL)
    return -1;
  c->files = f;
  c->files[c->nr_files++] = path;
  return 0;
}

int
config_set (struct config *c, const char *key, const char *value)
{
  if (note_name_given (c, key) == -1)
    return -1;
  key = current_key (key, value);
  if (strcmp (key, "file") == 0) {
    if (!remote_is_uri (value) && check_uri_scheme (value) == -1)
      return -1;
    /* Absolute now: nbdkit changes directory to / when it forks.  An
     * NBD URI is libnbd's to parse, not a path.
     */
    char *path = remote_is_uri (value) ? strdup (value)
      : nbdkit_realpath (value);

    if (path == NULL) {
      if (remote_is_uri (value))
        nbdkit_error ("strdup: %m");
      return -1;
    }
    if (add_file (c, path) == -1) {
      nbdkit_error ("realloc: %m");
      free (path);
      return -1;
    }
  }
  else if (strcmp (key, "stripe") == 0) {
    if (parse_size_param (key, value, &c->stripe, 1, UINT32_MAX) == -1)
      return -1;
    /* Requests cost one piece per file whatever the stripe, but reads,
     * block status and cache still walk it unit by unit (one pread or
     * lseek each), and a unit smaller than a page splits every
     * page-sized I/O of a client between files.
     */
    if (c->stripe < STRIPE_MIN) {
      nbdkit_error ("stripe=%s: %" PRIu64 " bytes is too small: the "
                    "smallest stripe is %d (4k)", value, c->stripe,
                    STRIPE_MIN);
      return -1;
    }
    if (c->stripe % 512 != 0) {
      nbdkit_error ("stripe=%s: must be a multiple of 512", value);
      return -1;
    }
  }
  else if (strcmp (key, "mode") == 0) {
    if (strcmp (value, "writeback") == 0)
      c->mode = MODE_WRITEBACK;
    else if (strcmp (value, "hold") == 0)
      c->mode = MODE_HOLD;
    else {
      nbdkit_error ("mode=%s: expected writeback or hold", value);
      return -1;
    }
  }
  else if (strcmp (key, "idle") == 0) {
    if (parse_duration_param (key, value, &c->idle_ns) == -1)
      return -1;
    snprintf (c->given.idle_text, sizeof c->given.idle_text, "%s", value);
  }
  else if (strcmp (key, "max-delay") == 0) {
    if (parse_duration_param (key, value, &c->max_delay_ns) == -1)
      return -1;
    if (c->max_delay_ns == 0) {
      nbdkit_error ("max-delay=%s: must be greater than 0", value);
      return -1;
    }
    snprintf (c->given.max_delay_text, sizeof c->given.max_delay_text,
              "%s", value);
  }
  else if (strcmp (key, "max-requests") == 0) {
    unsigned n;

    if (parse_count_param (key, value, &n, 1, 1 << 20) == -1)
      return -1;
    c->lim.max_requests = n;
    c->given.max_requests = true;
  }
  else if (strcmp (key, "max-bytes") == 0)
    return parse_size_param (key, value, &c->lim.max_bytes,
                             1, UINT64_C (1) << 40);
  else if (strcmp (key, "max-merge") == 0)
    return parse_size_param (key, value, &c->lim.max_merge,
                             512, UINT64_C (1) << 30);
  else if (strcmp (key, "max-inflight") == 0)
    return parse_count_param (key, value, &c->max_inflight, 1, 1 << 16);
  else if (strcmp (key, "direct") == 0) {
    if (strcmp (value, "auto") == 0)
      c->direct = DIRECT_AUTO;
    else if (strcmp (value, "always") == 0)
      c->direct = DIRECT_ALWAYS;
    else if (strcmp (value, "never") == 0)
      c->direct = DIRECT_NEVER;
    else {
      nbdkit_error ("direct=%s: expected auto, always or never", value);
      return -1;
    }
  }
  else if (strcmp (key, "direct-size") == 0)
    return parse_size_param (key, value, &c->direct_size, 0, UINT32_MAX);
  else if (strcmp (key, "io-threads") == 0)
    return parse_count_param (key, value, &c->io_threads, 1, 1024);
  else if (strcmp (key, "remote-connections") == 0)
    return parse_count_param (key, value, &c->remote_connections,
                              1, REMOTE_MAX_CONNS);
  else if (strcmp (key, "remote-queue-depth") == 0)
    return parse_count_param (key, value, &c->remote_queue_depth,
                              1, 1 << 16);
  else if (strcmp (key, "connect-timeout") == 0) {
    if (parse_duration_param (key, value, &c->connect_timeout_ns) == -1)
      return -1;
    if (c->connect_timeout_ns == 0) {
      nbdkit_error ("connect-timeout=%s: must be greater than 0 "
                    "(no attempt could ever finish)", value);
      return -1;
    }
    c->connect_timeout_text = value;   /* nbdkit keeps it. */
  }
  else if (strcmp (key, "connect-retry") == 0) {
    if (parse_duration_param (key, value, &c->connect_retry_ns) == -1)
      return -1;
    c->connect_retry_text = value;
  }
  else if (strcmp (key, "requeue-delay") == 0) {
    if (parse_duration_param (key, value, &c->retry.delay_ns) == -1)
      return -1;
    if (c->retry.delay_ns == 0) {
      nbdkit_error ("requeue-delay=%s: must be greater than 0 "
                    "(a zero delay would spin)", value);
      return -1;
    }
    snprintf (c->given.requeue_delay_text,
              sizeof c->given.requeue_delay_text, "%s", value);
  }
  else if (strcmp (key, "requeue-max-delay") == 0)
    return parse_duration_param (key, value, &c->retry.max_delay_ns);
  else if (strcmp (key, "requeue-timeout") == 0) {
    if (parse_duration_param (key, value, &c->retry.timeout_ns) == -1)
      return -1;
    snprintf (c->given.requeue_timeout_text,
              sizeof c->given.requeue_timeout_text, "%s", value);
  }
  else if (strcmp (key, "lock") == 0 || strcmp (key, "shared") == 0) {
    /* shared= (nbdkit-nbd-plugin's shared= means one connection for
     * all clients, something else) is lock= inverted.
     */
    bool lock = strcmp (key, "lock") == 0;
    int r = nbdkit_parse_bool (value);

    if (r == -1) {
      nbdkit_error ("%s=%s: expected a boolean such as yes or no",
                    key, value);
      return -1;
    }
    if (!lock)
      nbdkit_error ("warning: shared=%s: shared= is deprecated, use "
                    "lock=%s (nbdkit-nbd-plugin's shared= means something "
                    "else); the old name goes in the next release",
                    value, r ? "no" : "yes");
    c->shared = lock ? !r : r;
  }
  else if (strcmp (key, "stats-interval") == 0) {
    if (parse_duration_param (key, value, &c->stats_interval_ns) == -1)
      return -1;
    if (c->stats_interval_ns > 0 &&
        c->stats_interval_ns < STATS_INTERVAL_MIN_NS) {
      nbdkit_error ("stats-interval=%s: must be 0 (reports only at close "
                    "and exit) or at least %s: the timer thread that "
                    "writes the reports also unplugs", value,
                    STATS_INTERVAL_MIN_TEXT);
      return -1;
    }
  }
  else if (strcmp (key, "stats-file") == 0) {
    /* The file need not exist yet: make the directory absolute. */
    free (c->statsfile);
    if (value[0] == '/')
      c->statsfile = strdup (value);
    else {
      char cwd[PATH_MAX];
      if (getcwd (cwd, sizeof cwd) == NULL ||
          asprintf (&c->statsfile, "%s/%s", cwd, value) == -1)
        c->statsfile = NULL;
    }
    if (c->statsfile == NULL) {
      nbdkit_error ("stats-file=%s: %m", value);
      return -1;
    }
  }
  else {
    nbdkit_error ("unknown parameter '%s' (see nbdkit plug --help)", key);
    return -1;
  }
  return 0;
}

int
config_complete (struct config *c)
{
  if (c->nr_files == 0) {
    nbdkit_error ("no backing file given: use file=PATH "
                  "(or just PATH), once per file");
    return -1;
  }
  if (!c->given.max_requests)
    c->lim.max_requests = DEFAULT_MAX_REQUESTS;
  if (check_retry_timeout (c) == -1)
    return -1;
  check_idle (c);
  if (c->retry.max_delay_ns < c->retry.delay_ns)
    c->retry.max_delay_ns = c->retry.delay_ns;
  return 0;
}

void
config_direct_size (struct config *c, bool any_remote)
{
  if (c->direct_size == UINT64_MAX)
    c->direct_size = any_remote ? DEFAULT_DIRECT_SIZE_REMOTE
      : DEFAULT_DIRECT_SIZE_LOCAL;
}

void
config_free (struct config *c)
{
  size_t i;

  for (i = 0; i < c->nr_files; ++i)
    free (c->files[i]);
  free (c->files);
  c->files = NULL;
  c->nr_files = 0;
  free (c->statsfile);
  c->statsfile = NULL;
}

void
config_dump (void)
{
  printf ("plug_mode_default=writeback\n");
  printf ("plug_idle_default=1ms\n");
  printf ("plug_max_delay_default=10ms\n");
  printf ("plug_max_requests_default=%d\n", DEFAULT_MAX_REQUESTS);
  printf ("plug_max_bytes_default=%d\n", DEFAULT_MAX_BYTES);
  printf ("plug_max_merge_default=%d\n", DEFAULT_MAX_MERGE);
  printf ("plug_max_inflight_default=%d\n", DEFAULT_MAX_INFLIGHT);
  printf ("plug_io_threads_default=%d\n", DEFAULT_IO_THREADS);
  printf ("plug_direct_default=auto\n");
  printf ("plug_direct_size_default=%d\n", DEFAULT_DIRECT_SIZE_LOCAL);
  printf ("plug_direct_size_default_remote=%d\n",
          DEFAULT_DIRECT_SIZE_REMOTE);
  printf ("plug_requeue_delay_default=3ms\n");
  printf ("plug_requeue_max_delay_default=100ms\n");
  printf ("plug_requeue_timeout_default=10s\n");
  printf ("plug_remote_connections_default=%d\n",
          DEFAULT_REMOTE_CONNECTIONS);
  printf ("plug_remote_queue_depth_default=%d\n",
          DEFAULT_REMOTE_QUEUE_DEPTH);
  printf ("plug_connect_timeout_default=%s\n",
          DEFAULT_CONNECT_TIMEOUT_TEXT);
  printf ("plug_connect_retry_default=%s\n", DEFAULT_CONNECT_RETRY_TEXT);
  printf ("plug_lock_default=yes\n");
  printf ("plug_stats_interval_default=2s\n");
}

const char config_help[] =
  "file=PATH|URI           Backing file, block device or NBD URI (nbd://HOST:PORT/EXPORT,\n"
  "                        nbd+unix:///EXPORT?socket=PATH, nbds://...); repeat: concatenated.\n"
  "stripe=SIZE             Stripe the files (RAID-0) in units of SIZE (>= 4k).\n"
  "mode=writeback|hold     Acknowledge when held (default) or when written.\n"
  "idle=DURATION           Unplug when no request came for this long (1ms).\n"
  "max-delay=DURATION      Unplug when the oldest held request is this old (10ms).\n"
  "max-requests=N          Unplug at N held requests (256).\n"
  "max-bytes=SIZE          Unplug at SIZE held write bytes; memory bound (4M).\n"
  "max-merge=SIZE          Largest merged backend I/O (1M).\n"
  "max-inflight=N          Backend I/Os in flight per file, all connections (64).\n"
  "io-threads=N            Threads issuing backend I/O, all connections (16).\n"
  "remote-connections=N    NBD connections per URI if it allows multi-conn (4).\n"
  "remote-queue-depth=N    Backend I/Os in flight per NBD URI, all connections (64).\n"
  "connect-timeout=DURATION One attempt to connect to an NBD server (10s).\n"
  "connect-retry=DURATION  At start, keep trying an NBD server this long (0: once).\n"
  "direct=auto|always|never Write what cannot merge at once, unplugged: to\n"
  "                        local files (auto), to every file, or never.\n"
  "direct-size=SIZE        With direct=auto, also requests this large (64k;\n"
  "                        1M with an NBD server as a backing file; 0: off).\n"
  "requeue-delay=DURATION  First retry after EAGAIN/ENOMEM (3ms).\n"
  "requeue-max-delay=DURATION\n"
  "                        Backoff cap (100ms).\n"
  "requeue-timeout=DURATION\n"
  "                        Give up with EIO after this long (10s).\n"
  "lock=BOOL               Lock the files against other processes (yes).\n"
  "stats-file=PATH         Write JSON statistics here.\n"
  "stats-interval=DURATION Rewrite stats-file= this often while connections\n"
  "                        are open (2s; at least 100ms; 0: only at close\n"
  "                        and exit).";
