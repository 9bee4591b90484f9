/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* plugin.c: nbdkit glue: parameters, global state, callbacks.
 *
 * The callbacks are thin: reads, flushes and writes go to conn.c, which
 * hands them to the export's engine (src/engine.h, glue.h).
 */

#include <config.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>
#include <libnbd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backing.h"
#include "cleanup.h"
#include "conn.h"
#include "glue.h"
#include "iopool.h"
#include "layout.h"
#include "minmax.h"
#include "parse.h"
#include "plugin.h"
#include "ratelimit.h"
#include "remote.h"
#include "rescue.h"
#include "request.h"
#include "vector.h"

/* -D plug.stats=1: log each connection's statistics at close. */
NBDKIT_DLL_PUBLIC int plug_debug_stats;
/* -D plug.unplug=1: log every unplug (reason, requests, bytes, runs). */
NBDKIT_DLL_PUBLIC int plug_debug_unplug;
/* -D plug.inject_eagain=N: every Nth backend write/zero/trim fails with
 * EAGAIN.  A testing aid: no nbdkit filter can inject EAGAIN, and the
 * NBD protocol cannot carry it.
 */
NBDKIT_DLL_PUBLIC int plug_debug_inject_eagain;
/* -D plug.inject_unplug_nomem=N: every Nth unplug runs out of memory
 * (as if it could not allocate its runs).  A testing aid for the
 * engine's answer to that: nothing is lost, nothing reordered.
 */
NBDKIT_DLL_PUBLIC int plug_debug_inject_unplug_nomem;
/* -D plug.backend_delay_us=N: every backend write/zero/trim costs N
 * microseconds more (a sleep before it).  A benchmarking aid that models
 * a slow or per-operation-priced backend, comparable to nbdkit's delay
 * filter in front of the file plugin.
 */
NBDKIT_DLL_PUBLIC int plug_debug_backend_delay_us;

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

struct config cfg = {
  .mode = MODE_WRITEBACK,
  .idle_ns = DEFAULT_IDLE_NS,
  .max_delay_ns = DEFAULT_MAX_DELAY_NS,
  .lim = {
    .max_requests = 0,          /* Set by mode in config_complete. */
    .max_bytes = DEFAULT_MAX_BYTES,
    .max_merge = DEFAULT_MAX_MERGE,
    .max_iov = IOV_MAX,
  },
  .max_inflight = DEFAULT_MAX_INFLIGHT,
  .io_threads = DEFAULT_IO_THREADS,
  .direct = DIRECT_AUTO,
  .direct_min = UINT64_MAX,     /* Set by make_engine unless given. */
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
};
struct layout layout;
struct backing *backings;
size_t nr_backings;

DEFINE_VECTOR_TYPE (string_vector, char *)
static string_vector files = empty_vector;   /* Owned: realpath copies,
                                              * or NBD URIs as given. */
static uint64_t stripe;
#define STRIPE_MIN 4096
static char *statsfile;                      /* Owned. */

static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
static struct plug_stats stats_total;        /* Protected by stats_lock. */

uint64_t
now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static uint64_t start_ns;                    /* .get_ready's now_ns. */

/* A stats-file= that cannot be written (its directory removed, the
 * file system full) fails at every report, every stats-interval= for
 * as long as a connection stays open: the first failure is logged at
 * once, later ones at most once a minute with the count (at the
 * default 2s that is 30 reports a line, not 43,200 lines a day), and
 * the first report written after them says so.  Each failure not
 * logged as an error is a debug line (nbdkit -v).
 */
#define STATS_ERROR_INTERVAL_NS (60 * 1000000000ULL)

enum stats_file_state {
  STATS_FILE_WRITTEN,           /* The last report was written, or none
                                 * was tried yet. */
  STATS_FILE_FAILING,           /* The last report could not be written. */
};

static struct {
  enum stats_file_state state;
  uint64_t failed;              /* Reports not written since the last one
                                 * written. */
  struct ratelimit log;
} stats_health;                 /* Protected by stats_lock. */

/* A report could not be written: "what" failed with errno err (path,
 * when given, is the file it was done to).  Caller holds stats_lock.
 */
static void
stats_file_failed_locked (const char *what, const char *path, int err)
{
  uint64_t suppressed;

  stats_health.state = STATS_FILE_FAILING;
  stats_health.failed++;
  errno = err;
  if (!ratelimit_allow_every (&stats_health.log, now_ns (),
                              STATS_ERROR_INTERVAL_NS, &suppressed))
    nbdkit_debug ("stats-file=%s: report not written: %s%s%s: %m "
                  "(%" PRIu64 " since the last one written)",
                  statsfile, what, path ? " " : "", path ? path : "",
                  stats_health.failed);
  else if (suppressed > 0)
    nbdkit_error ("stats-file=%s: report not written: %s%s%s: %m "
                  "(and %" PRIu64 " more since the last message)",
                  statsfile, what, path ? " " : "", path ? path : "",
                  suppressed);
  else
    nbdkit_error ("stats-file=%s: report not written: %s%s%s: %m",
                  statsfile, what, path ? " " : "", path ? path : "");
}

/* A report was written.  Caller holds stats_lock. */
static void
stats_file_written_locked (void)
{
  if (stats_health.state == STATS_FILE_FAILING)
    nbdkit_error ("stats-file=%s: written again, after %" PRIu64
                  " reports that could not be written",
                  statsfile, stats_health.failed);
  stats_health.state = STATS_FILE_WRITTEN;
  stats_health.failed = 0;
  /* The next failure is news: log it at once. */
  stats_health.log = (struct ratelimit) { 0 };
}

/* Write text to stats-file= atomically (temporary file + rename), so a
 * reader never sees half a file.  Caller holds stats_lock (not
 * eng_lock: a slow or failing file system delays only the next report).
 */
static void
replace_statsfile_locked (const char *text)
{
  CLEANUP_FREE char *tmp = NULL;
  FILE *fp;
  int err;

  if (asprintf (&tmp, "%s.tmp", statsfile) == -1) {
    stats_file_failed_locked ("asprintf", NULL, errno);
    return;
  }
  fp = fopen (tmp, "w");
  if (fp == NULL) {
    stats_file_failed_locked ("create", tmp, errno);
    return;
  }
  if (fputs (text, fp) == EOF) {
    err = errno;
    fclose (fp);
    unlink (tmp);
    stats_file_failed_locked ("write", tmp, err);
    return;
  }
  if (fclose (fp) == EOF) {
    err = errno;
    unlink (tmp);
    stats_file_failed_locked ("write", tmp, err);
    return;
  }
  if (rename (tmp, statsfile) == -1) {
    err = errno;
    unlink (tmp);
    stats_file_failed_locked ("rename to", statsfile, err);
    return;
  }
  stats_file_written_locked ();
}

/* How a report counts the connections still open. */
enum open_counted {
  OPEN_APART,                   /* In the live totals only. */
  OPEN_IN_CLOSED,               /* Already merged into *closed (exit). */
};

/* Write the report: *closed at the top level (the historical format),
 * and the live figures.  Caller holds stats_lock (so that a closing
 * connection is counted either open or closed: stats_publish_close).
 */
static void
write_statsfile_locked (const char *written_at,
                        const struct plug_stats *closed,
                        enum open_counted open)
{
  CLEANUP_FREE char *json = NULL;
  CLEANUP_FREE struct stats_conn_live *conns = NULL;
  CLEANUP_FREE struct stats_file_live *flive = NULL;
  struct plug_stats totals = *closed, open_sum = { 0 };
  struct stats_report r = {
    .mode = mode_name (cfg.mode),
    .written_at = written_at,
    .interval_ns = cfg.stats_interval_ns,
    .closed = closed,
    .totals = &totals,
  };
  uint64_t now;
  size_t i;

  if (statsfile == NULL)
    return;
  flive = calloc (nr_backings ? nr_backings : 1, sizeof *flive);
  if (flive == NULL || conns_live (&r, flive, &open_sum, &conns) == -1) {
    stats_file_failed_locked ("gather the figures", NULL, errno);
    return;
  }
  /* After the engine's snapshot: no acknowledgement in it is newer. */
  now = now_ns ();
  if (open == OPEN_APART)
    stats_merge (&totals, &open_sum);
  r.conns = conns;
  r.files = flive;
  r.nr_files = nr_backings;
  r.uptime_ns = now - start_ns;
  if (r.unflushed.requests > 0 && now > r.unflushed.oldest_ns)
    r.unflushed_age_ns = now - r.unflushed.oldest_ns;
  for (i = 0; i < nr_backings; ++i) {
    flive[i].name = backings[i].name;
    if (backings[i].remote)
      remote_stats (backings[i].remote, now, &flive[i]);
  }
  json = stats_report_json (&r);
  if (json == NULL) {
    stats_file_failed_locked ("format the report", NULL, errno);
    return;
  }
  replace_statsfile_locked (json);
}

size_t
stats_publish_close (struct conn *c)
{
  size_t left;

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&stats_lock);
  left = conns_unregister (c);
  stats_merge (&stats_total, &c->stats);
  write_statsfile_locked ("close", &stats_total, OPEN_APART);
  return left;
}

void
stats_write_live (void)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&stats_lock);
  write_statsfile_locked ("interval", &stats_total, OPEN_APART);
}

/* Server exit.  nbdkit 1.32 can reach .cleanup while a connection
 * thread is still between .finalize and .close, and that thread then
 * never reaches .close (seen with --run), so everything every
 * connection acknowledged is written out here (the engine retries "not
 * now" up to requeue-timeout), the files are synced, and then every
 * thread the plugin started is stopped and joined: none may outlive
 * .unload and the dlclose after it.  Connections still open count in
 * the statistics written here.
 */
static void
plugin_cleanup (void)
{
  struct plug_stats live = { 0 };
  size_t i;

  if (eng == NULL)
    return;
  /* The rescue stays armed through the exit's write-out and syncs: an
   * abort in between waits for them (conns_rescue).
   */
  conns_shutdown (&live);
  rescue_stop ();
  iopool_stop ();
  timer_stop ();
  /* Last: a completion may still hand runs to the pool until here. */
  for (i = 0; i < nr_backings; ++i)
    if (backings[i].remote)
      remote_stop (backings[i].remote);
  /* Always: the exit's sync emptied the unflushed window, which a
   * report from the last close still shows.
   */
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&stats_lock);
  {
    struct plug_stats all = stats_total;

    stats_merge (&all, &live);
    write_statsfile_locked ("exit", &all, OPEN_IN_CLOSED);
  }
}

static void
plugin_unload (void)
{
  size_t i;

  /* No worker-thread destructor, and no signal handler, may run from
   * an unloaded plugin (.cleanup stopped the rescue already, unless
   * nbdkit skipped it).
   */
  rescue_stop ();
  conn_delete_worker_key ();
  conns_fini ();
  request_fini ();
  /* A connection nbdkit never closed may still hold the engine and
   * read the files (see plugin_cleanup): the process is exiting, leave
   * them.
   */
  if (conns_open () > 0)
    return;
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&eng_lock);
    engine_free (eng);
    eng = NULL;
  }
  for (i = 0; i < nr_backings; ++i)
    backing_close (&backings[i]);
  free (backings);
  layout_free (&layout);
  for (i = 0; i < files.len; ++i)
    free (files.ptr[i]);
  string_vector_reset (&files);
  free (statsfile);
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

static bool max_requests_set;

/* requeue-delay= and requeue-timeout= as given (or the defaults, as
 * --dump-plugin says them), for config_complete's message: the two
 * keys come in any order.
 */
static char requeue_delay_text[64] = "3ms", requeue_timeout_text[64] = "10s";

/* A requeue-timeout below requeue-delay gives up on a "not now" before its
 * first retry, which would make "not now" an error after all.
 */
static int
check_retry_timeout (void)
{
  if (cfg.retry.timeout_ns >= cfg.retry.delay_ns)
    return 0;
  nbdkit_error ("requeue-timeout=%s: must be at least requeue-delay=%s "
                "(a backing file that says \"not now\" would be given up "
                "on before its first retry)",
                requeue_timeout_text, requeue_delay_text);
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

/* Which names of each renamed parameter were given (.config runs in
 * one thread): both at once is refused, since which one won would
 * depend on their order on the command line.
 */
enum name_given { GIVEN_NONE = 0, GIVEN_OLD = 1, GIVEN_NEW = 2 };
static unsigned names_given[NR_DEPRECATED];

/* Note that key was given; -1 after nbdkit_error if the other name of
 * the same parameter was given too.
 */
static int
note_name_given (const char *key)
{
  size_t i;

  for (i = 0; i < NR_DEPRECATED; ++i) {
    const struct deprecated_key *d = &deprecated_keys[i];
    bool is_old = strcmp (key, d->old) == 0;

    if (!is_old && strcmp (key, d->new) != 0)
      continue;
    names_given[i] |= is_old ? GIVEN_OLD : GIVEN_NEW;
    if (names_given[i] == (GIVEN_OLD | GIVEN_NEW)) {
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

/* idle= and max-delay= as given (or the defaults), for check_idle. */
static char idle_text[64] = "1ms", max_delay_text[64] = "10ms";

/* An idle= longer than max-delay= never fires: the oldest held
 * request is at least as old as the last one, so max-delay= always
 * comes first (plug_deadline in src/engine.c).  Harmless (the plug
 * still unplugs, at max-delay=), so nbdkit starts; but whoever set it
 * expected the plug to wait that long, so it is said.
 */
static void
check_idle (void)
{
  if (cfg.idle_ns <= cfg.max_delay_ns)
    return;
  nbdkit_error ("warning: idle=%s is longer than max-delay=%s, so it has "
                "no effect: a plug goes out max-delay= after its oldest "
                "request at the latest; to hold longer, raise max-delay= "
                "too", idle_text, max_delay_text);
}

static int
plugin_config (const char *key, const char *value)
{
  if (note_name_given (key) == -1)
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
    if (string_vector_append (&files, path) == -1) {
      nbdkit_error ("realloc: %m");
      free (path);
      return -1;
    }
  }
  else if (strcmp (key, "stripe") == 0) {
    if (parse_size_param (key, value, &stripe, 1, UINT32_MAX) == -1)
      return -1;
    /* Requests cost one piece per file whatever the stripe, but reads,
     * block status and cache still walk it unit by unit (one pread or
     * lseek each), and a unit smaller than a page splits every
     * page-sized I/O of a client between files.
     */
    if (stripe < STRIPE_MIN) {
      nbdkit_error ("stripe=%s: %" PRIu64 " bytes is too small: the "
                    "smallest stripe is %d (4k)", value, stripe, STRIPE_MIN);
      return -1;
    }
    if (stripe % 512 != 0) {
      nbdkit_error ("stripe=%s: must be a multiple of 512", value);
      return -1;
    }
  }
  else if (strcmp (key, "mode") == 0) {
    if (strcmp (value, "writeback") == 0)
      cfg.mode = MODE_WRITEBACK;
    else if (strcmp (value, "hold") == 0)
      cfg.mode = MODE_HOLD;
    else {
      nbdkit_error ("mode=%s: expected writeback or hold", value);
      return -1;
    }
  }
  else if (strcmp (key, "idle") == 0) {
    if (parse_duration_param (key, value, &cfg.idle_ns) == -1)
      return -1;
    snprintf (idle_text, sizeof idle_text, "%s", value);
  }
  else if (strcmp (key, "max-delay") == 0) {
    if (parse_duration_param (key, value, &cfg.max_delay_ns) == -1)
      return -1;
    if (cfg.max_delay_ns == 0) {
      nbdkit_error ("max-delay=%s: must be greater than 0", value);
      return -1;
    }
    snprintf (max_delay_text, sizeof max_delay_text, "%s", value);
  }
  else if (strcmp (key, "max-requests") == 0) {
    unsigned n;

    if (parse_count_param (key, value, &n, 1, 1 << 20) == -1)
      return -1;
    cfg.lim.max_requests = n;
    max_requests_set = true;
  }
  else if (strcmp (key, "max-bytes") == 0)
    return parse_size_param (key, value, &cfg.lim.max_bytes,
                             1, UINT64_C (1) << 40);
  else if (strcmp (key, "max-merge") == 0)
    return parse_size_param (key, value, &cfg.lim.max_merge,
                             512, UINT64_C (1) << 30);
  else if (strcmp (key, "max-inflight") == 0)
    return parse_count_param (key, value, &cfg.max_inflight, 1, 1 << 16);
  else if (strcmp (key, "direct") == 0) {
    if (strcmp (value, "auto") == 0)
      cfg.direct = DIRECT_AUTO;
    else if (strcmp (value, "always") == 0)
      cfg.direct = DIRECT_ALWAYS;
    else if (strcmp (value, "never") == 0)
      cfg.direct = DIRECT_NEVER;
    else {
      nbdkit_error ("direct=%s: expected auto, always or never", value);
      return -1;
    }
  }
  else if (strcmp (key, "direct-size") == 0)
    return parse_size_param (key, value, &cfg.direct_min, 0, UINT32_MAX);
  else if (strcmp (key, "io-threads") == 0)
    return parse_count_param (key, value, &cfg.io_threads, 1, 1024);
  else if (strcmp (key, "remote-connections") == 0)
    return parse_count_param (key, value, &cfg.remote_connections,
                              1, REMOTE_MAX_CONNS);
  else if (strcmp (key, "remote-queue-depth") == 0)
    return parse_count_param (key, value, &cfg.remote_queue_depth,
                              1, 1 << 16);
  else if (strcmp (key, "connect-timeout") == 0) {
    if (parse_duration_param (key, value, &cfg.connect_timeout_ns) == -1)
      return -1;
    if (cfg.connect_timeout_ns == 0) {
      nbdkit_error ("connect-timeout=%s: must be greater than 0 "
                    "(no attempt could ever finish)", value);
      return -1;
    }
    cfg.connect_timeout_text = value;   /* nbdkit keeps it. */
  }
  else if (strcmp (key, "connect-retry") == 0) {
    if (parse_duration_param (key, value, &cfg.connect_retry_ns) == -1)
      return -1;
    cfg.connect_retry_text = value;
  }
  else if (strcmp (key, "requeue-delay") == 0) {
    if (parse_duration_param (key, value, &cfg.retry.delay_ns) == -1)
      return -1;
    if (cfg.retry.delay_ns == 0) {
      nbdkit_error ("requeue-delay=%s: must be greater than 0 "
                    "(a zero delay would spin)", value);
      return -1;
    }
    snprintf (requeue_delay_text, sizeof requeue_delay_text, "%s", value);
  }
  else if (strcmp (key, "requeue-max-delay") == 0)
    return parse_duration_param (key, value, &cfg.retry.max_delay_ns);
  else if (strcmp (key, "requeue-timeout") == 0) {
    if (parse_duration_param (key, value, &cfg.retry.timeout_ns) == -1)
      return -1;
    snprintf (requeue_timeout_text, sizeof requeue_timeout_text, "%s", value);
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
    cfg.shared = lock ? !r : r;
  }
  else if (strcmp (key, "stats-interval") == 0) {
    if (parse_duration_param (key, value, &cfg.stats_interval_ns) == -1)
      return -1;
    if (cfg.stats_interval_ns > 0 &&
        cfg.stats_interval_ns < STATS_INTERVAL_MIN_NS) {
      nbdkit_error ("stats-interval=%s: must be 0 (reports only at close "
                    "and exit) or at least %s: the timer thread that "
                    "writes the reports also unplugs", value,
                    STATS_INTERVAL_MIN_TEXT);
      return -1;
    }
  }
  else if (strcmp (key, "stats-file") == 0) {
    /* The file need not exist yet: make the directory absolute. */
    free (statsfile);
    if (value[0] == '/')
      statsfile = strdup (value);
    else {
      char cwd[PATH_MAX];
      if (getcwd (cwd, sizeof cwd) == NULL ||
          asprintf (&statsfile, "%s/%s", cwd, value) == -1)
        statsfile = NULL;
    }
    if (statsfile == NULL) {
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

static int
plugin_config_complete (void)
{
  if (files.len == 0) {
    nbdkit_error ("no backing file given: use file=PATH "
                  "(or just PATH), once per file");
    return -1;
  }
  if (!max_requests_set)
    cfg.lim.max_requests = DEFAULT_MAX_REQUESTS;
  if (check_retry_timeout () == -1)
    return -1;
  check_idle ();
  if (cfg.retry.max_delay_ns < cfg.retry.delay_ns)
    cfg.retry.max_delay_ns = cfg.retry.delay_ns;
  cfg.statsfile = statsfile;
  return 0;
}

/* The engine's messages, already rate-limited (engine.h). */
static void
engine_log (void *opaque, int level, const char *msg)
{
  if (level == 0)
    nbdkit_error ("%s", msg);
  else
    nbdkit_debug ("%s", msg);
}

/* A seed no client can know, for the shapes of the engine's indexes
 * (src/itree.h): offsets picked against a known one could make them
 * paths, each lookup as slow as a scan.  getrandom cannot fail for 4
 * bytes once the pool is ready; before that, the clock and the PID
 * are still unknown to a client.
 */
static uint32_t
index_seed (void)
{
  uint32_t seed;
  struct timespec ts;

  if (getrandom (&seed, sizeof seed, GRND_NONBLOCK) == sizeof seed)
    return seed;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint32_t) ts.tv_nsec ^ (uint32_t) ts.tv_sec ^
    ((uint32_t) getpid () << 16);
}

static int
make_engine (void)
{
  struct eng_config ec;
  size_t i;

  if (cfg.direct_min == UINT64_MAX) {
    cfg.direct_min = DEFAULT_DIRECT_SIZE_LOCAL;
    for (i = 0; i < nr_backings; ++i)
      if (backings[i].remote)
        cfg.direct_min = DEFAULT_DIRECT_SIZE_REMOTE;
  }
  ec = (struct eng_config) {
    .mode = cfg.mode == MODE_HOLD ? ENG_HOLD : ENG_WRITEBACK,
    .nr_backings = nr_backings,
    .idle_ns = cfg.idle_ns,
    .max_delay_ns = cfg.max_delay_ns,
    .lim = cfg.lim,
    .max_inflight = cfg.max_inflight,
    .direct = cfg.direct != DIRECT_NEVER,
    .direct_min = cfg.direct_min,
    .retry = cfg.retry,
    .seed = index_seed (),
    .log = engine_log,
    .debug_unplug = plug_debug_unplug,
    .inject_unplug_nomem = plug_debug_inject_unplug_nomem > 0 ?
      (unsigned) plug_debug_inject_unplug_nomem : 0,
    .names = (const char *const *) files.ptr,
  };

  eng = engine_new (&ec);
  if (eng == NULL) {
    nbdkit_error ("engine: %m");
    return -1;
  }
  /* A server's queue, not a file's: remote-queue-depth= runs in flight
   * per NBD URI; the rest wait in the engine's queue, where they can
   * still merge with what comes after them.
   */
  for (i = 0; i < nr_backings; ++i)
    if (backings[i].remote)
      engine_set_max_inflight (eng, i, cfg.remote_queue_depth);
  /* A write to an NBD server costs a round trip, a write to a local
   * file about what the plug's copy costs.  In writeback mode a request
   * to a server that merges with nothing is still acknowledged from the
   * plug, and written with the server's parallelism (remote-queue-depth=
   * in flight) rather than the client's: measured at queue depth 16 to
   * a server that takes 1 ms per write, 4 KiB random writes ran about
   * twice as fast as on the direct path (bench/README.md).
   */
  for (i = 0; i < nr_backings; ++i)
    if (backings[i].remote && cfg.mode == MODE_WRITEBACK &&
        cfg.direct == DIRECT_AUTO)
      engine_set_direct_rule (eng, i, ENG_DIRECT_LARGE);
  return 0;
}

/* The largest minimum block size of the NBD servers: the export's. */
static uint32_t
export_min_block (void)
{
  uint32_t m = 1;
  size_t i;

  for (i = 0; i < nr_backings; ++i)
    m = MAX (m, backings[i].min_block);
  return m;
}

/* A client that obeys the export's minimum block size must never make
 * a misaligned request to a server: each server's data must start on a
 * multiple of that minimum (concatenated) or the stripe must be one.
 * Refuse such a layout now rather than each request later.
 */
static int
check_alignment (void)
{
  uint32_t m = export_min_block ();
  size_t i;

  if (m <= 1)
    return 0;
  for (i = 0; i < nr_backings; ++i) {
    uint64_t start = layout.starts ? layout.starts[i] : 0;

    if (layout.stripe % m != 0 || start % m != 0) {
      nbdkit_error ("file=%s: %s %" PRIu64 " is not a multiple of the "
                    "minimum block size %" PRIu32 " that an NBD server "
                    "of this export requires",
                    backings[i].name,
                    layout.stripe ? "stripe" : "its offset in the export",
                    layout.stripe ? layout.stripe : start, m);
      return -1;
    }
  }
  return 0;
}

/* Refuse a stats-file= that no report could replace now, not at the
 * first close: a directory (rename(2) fails with EISDIR at every
 * report), anything else that is not a regular file (a device or FIFO
 * would be replaced by the report), a directory we cannot create
 * PATH.tmp in.
 */
static int
check_statsfile (void)
{
  CLEANUP_FREE char *tmp = NULL;
  struct stat st;
  int fd;

  if (stat (statsfile, &st) == 0) {
    if (S_ISDIR (st.st_mode)) {
      nbdkit_error ("stats-file=%s: is a directory: name a file, such as "
                    "%s/plug-stats.json", statsfile, statsfile);
      return -1;
    }
    if (!S_ISREG (st.st_mode)) {
      nbdkit_error ("stats-file=%s: exists and is not a regular file: "
                    "every report replaces it (by rename)", statsfile);
      return -1;
    }
  }
  if (asprintf (&tmp, "%s.tmp", statsfile) == -1) {
    nbdkit_error ("asprintf: %m");
    return -1;
  }
  fd = open (tmp, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd == -1) {
    nbdkit_error ("stats-file=%s: cannot create %s: %m", statsfile, tmp);
    return -1;
  }
  close (fd);
  unlink (tmp);
  return 0;
}

/* Open the files and build the layout here, not in .config_complete:
 * errors are still seen by the user, and --dump-plugin never opens them.
 */
static int
plugin_get_ready (void)
{
  CLEANUP_FREE uint64_t *sizes = NULL;
  enum layout_error why;
  size_t i, bad;
  const struct backing_params bparams = {
    .lock = !cfg.shared,
    .remote = {
      .max_conns = cfg.remote_connections,
      .retry = cfg.retry,
      .connect_timeout_ns = cfg.connect_timeout_ns,
      .connect_retry_ns = cfg.connect_retry_ns,
      .connect_timeout_text = cfg.connect_timeout_text,
      .connect_retry_text = cfg.connect_retry_text,
      .lost = glue_record_lost,
    },
    .inject = {
      .eagain_every = plug_debug_inject_eagain,
      .delay_us = plug_debug_backend_delay_us,
    },
  };

  start_ns = now_ns ();
  if (statsfile && check_statsfile () == -1)
    return -1;

  if (conn_init_worker_key () == -1 || request_init () == -1 ||
      conns_init () == -1)
    return -1;

  backings = calloc (files.len, sizeof *backings);
  sizes = calloc (files.len, sizeof *sizes);
  if (backings == NULL || sizes == NULL) {
    nbdkit_error ("calloc: %m");
    return -1;
  }
  for (i = 0; i < files.len; ++i) {
    if (backing_open (&backings[i], files.ptr[i], &bparams) == -1)
      return -1;
    nr_backings++;
    sizes[i] = backings[i].size;
  }
  if (layout_init (&layout, sizes, files.len, stripe, &why, &bad) == -1) {
    if (errno != EINVAL)
      nbdkit_error ("layout: %m");
    else if (why == LAYOUT_EMPTY_FILE || why == LAYOUT_STRIPE_NOT_MULTIPLE ||
             why == LAYOUT_STRIPE_UNEQUAL || why == LAYOUT_TOO_LARGE) {
      /* stripe= only when one was asked for: 0 means concatenated. */
      if (stripe > 0)
        nbdkit_error ("file=%s: %s (size %" PRIu64 ", stripe=%" PRIu64 ")",
                      files.ptr[bad], layout_strerror (why), sizes[bad],
                      stripe);
      else
        nbdkit_error ("file=%s: %s (size %" PRIu64 ")",
                      files.ptr[bad], layout_strerror (why), sizes[bad]);
    }
    else
      nbdkit_error ("%s", layout_strerror (why));
    return -1;
  }
  if (check_alignment () == -1)
    return -1;
  return make_engine ();
}

/* Threads only now: nbdkit may have forked since .get_ready (the
 * remotes' handles were connected there; their loops start here).
 */
static int
plugin_after_fork (void)
{
  size_t i;

  if (iopool_start (cfg.io_threads) == -1 || timer_start () == -1 ||
      rescue_start () == -1)
    return -1;
  for (i = 0; i < nr_backings; ++i)
    if (backings[i].remote && remote_start (backings[i].remote) == -1)
      return -1;
  return 0;
}

static void
plugin_dump_plugin (void)
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
  printf ("plug_libev=%d.%d\n", ev_version_major (), ev_version_minor ());
  {
    struct nbd_handle *h = nbd_create ();

    if (h) {
      printf ("plug_libnbd=%s\n", nbd_get_version (h));
      printf ("plug_remote_tls=%s\n", nbd_supports_tls (h) ? "yes" : "no");
      nbd_close (h);
    }
  }
}

static void *
plugin_open (int readonly)
{
  return conn_open ();
}

static void
plugin_close (void *handle)
{
  conn_close (handle);
}

static int64_t
plugin_get_size (void *handle)
{
  return layout.size;
}

static int
plugin_can_write (void *handle)
{
  size_t i;

  for (i = 0; i < nr_backings; ++i)
    if (backings[i].readonly)
      return 0;
  return 1;
}

static int
plugin_can_flush (void *handle)
{
  return 1;
}

/* A trim is advisory: a server without it keeps its data (remote.c).
 * Only when no backing at all can trim is there no point in clients
 * sending it.
 */
static int
plugin_can_trim (void *handle)
{
  size_t i;

  for (i = 0; i < nr_backings; ++i)
    if (backings[i].remote == NULL ||
        remote_info (backings[i].remote)->can_trim)
      return 1;
  return 0;
}

static int
plugin_can_zero (void *handle)
{
  return 1;
}

/* nbdkit 1.32 aborts on a fast-zero request to a plugin that has .zero
 * but no .can_fast_zero.  We answer fast zeros ourselves (ENOTSUP when
 * the file cannot zero quickly).
 */
static int
plugin_can_fast_zero (void *handle)
{
  return 1;
}

/* Native, not EMULATE: with EMULATE nbdkit would send a FUA write as a
 * write (which would sit in the plug until idle) then a flush.
 */
static int
plugin_can_fua (void *handle)
{
  return NBDKIT_FUA_NATIVE;
}

/* NBD_FLAG_CAN_MULTI_CONN: "the server operates entirely without cache,
 * or ... the cache it uses is shared among all connections".  Ours is
 * shared in both modes: one engine per export, whose queues, index of
 * held data and sequence numbers every connection uses, so a read on
 * any connection sees every acknowledged write and a FLUSH on any
 * connection covers what any connection acknowledged before it.
 */
static int
plugin_can_multi_conn (void *handle)
{
  return 1;
}

static int
plugin_can_extents (void *handle)
{
  return 1;
}

static int
plugin_can_cache (void *handle)
{
  return NBDKIT_CACHE_NATIVE;
}

static int
plugin_block_size (void *handle,
                   uint32_t *minimum, uint32_t *preferred, uint32_t *maximum)
{
  size_t i;

  /* Local files take any alignment (we never read-modify-write); an NBD
   * server may require a minimum, which the export then requires too
   * (requests below it are refused with EINVAL).  4 KiB is where
   * page-cache backed files are efficient, unless a server prefers
   * more; 32 MiB is the NBD spec's portable maximum payload (larger
   * runs to a server with a smaller maximum are split).
   */
  *minimum = export_min_block ();
  *preferred = MAX (4096u, *minimum);
  for (i = 0; i < nr_backings; ++i)
    if (backings[i].remote)
      *preferred = MAX (*preferred,
                        remote_info (backings[i].remote)->pref_block);
  *maximum = 32 * 1024 * 1024;
  *preferred = MIN (*preferred, *maximum);
  return 0;
}

static int
plugin_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
              uint32_t flags)
{
  int r = conn_pread (handle, buf, count, offset);

  conn_leave (handle);
  return r;
}

static int
plugin_pwrite (void *handle, const void *buf, uint32_t count,
               uint64_t offset, uint32_t flags)
{
  int r = conn_pwrite (handle, buf, count, offset, flags & NBDKIT_FLAG_FUA);

  conn_leave (handle);
  return r;
}

static int
plugin_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  int r = conn_zero (handle, count, offset,
                     flags & NBDKIT_FLAG_MAY_TRIM, flags & NBDKIT_FLAG_FUA,
                     flags & NBDKIT_FLAG_FAST_ZERO);

  conn_leave (handle);
  return r;
}

static int
plugin_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  int r = conn_trim (handle, count, offset, flags & NBDKIT_FLAG_FUA);

  conn_leave (handle);
  return r;
}

static int
plugin_flush (void *handle, uint32_t flags)
{
  int r = conn_flush (handle);

  conn_leave (handle);
  return r;
}

static int
extents_answer (void *handle, uint32_t count, uint64_t offset,
                uint32_t flags, struct nbdkit_extents *extents)
{
  struct conn *c = handle;
  struct layout_iter it;
  struct layout_piece p;
  unsigned pieces = 0;

  stats_count (&c->stats.client[STATS_C_EXTENTS], count);
  if (layout_iter_init (&it, &layout, offset, count) == -1) {
    nbdkit_error ("extents beyond the end of the export");
    errno = EINVAL;
    return -1;
  }
  /* Held data turns holes into data: write it out first. */
  if (conn_barrier (c, offset, count) == -1)
    return -1;
  /* A client asks again for the rest; bound the work of one call. */
  while (layout_iter_next (&it, &p) && pieces++ < 256) {
    uint64_t off = p.offset, left = p.count, exp = offset + p.buf_offset;
    struct remote *rem = backings[p.backing].remote;

    /* A server answers many extents per round trip: take them all. */
    while (rem && left > 0) {
      struct remote_extent ext[64];
      int n = remote_extents (rem, off, left, ext, 64), k;

      if (n == -1) {
        nbdkit_error ("file=%s: block status: %m", backings[p.backing].name);
        return -1;
      }
      for (k = 0; k < n && left > 0; ++k) {
        uint64_t len = MIN (ext[k].length, left);
        uint32_t fl = 0;

        if (ext[k].flags & LIBNBD_STATE_HOLE)
          fl |= NBDKIT_EXTENT_HOLE;
        if (ext[k].flags & LIBNBD_STATE_ZERO)
          fl |= NBDKIT_EXTENT_ZERO;
        if (nbdkit_add_extent (extents, exp, len, fl) == -1)
          return -1;
        off += len;
        exp += len;
        left -= len;
      }
      if (flags & NBDKIT_FLAG_REQ_ONE)
        return 0;
    }
    while (left > 0) {
      uint64_t len;
      bool hole;

      if (backing_extent (&backings[p.backing], off, left, &len,
                          &hole) == -1) {
        nbdkit_error ("file=%s: lseek: %m", backings[p.backing].name);
        return -1;
      }
      if (nbdkit_add_extent (extents, exp, len,
                             hole ? NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO
                             : 0) == -1)
        return -1;
      off += len;
      exp += len;
      left -= len;
    }
    if (flags & NBDKIT_FLAG_REQ_ONE)
      break;
  }
  return 0;
}

static int
cache_answer (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  struct conn *c = handle;
  struct layout_iter it;
  struct layout_piece p;

  stats_count (&c->stats.client[STATS_C_CACHE], count);
  if (layout_iter_init (&it, &layout, offset, count) == -1) {
    nbdkit_error ("cache beyond the end of the export");
    errno = EINVAL;
    return -1;
  }
  while (layout_iter_next (&it, &p)) {
    if (!backing_aligned (&backings[p.backing], "cache", p.offset, p.count))
      return -1;
    if (backing_cache (&backings[p.backing], p.count, p.offset) == -1) {
      nbdkit_error ("file=%s: %s: %m", backings[p.backing].name,
                    backings[p.backing].remote ? "cache" : "posix_fadvise");
      return -1;
    }
  }
  return 0;
}

static int
plugin_extents (void *handle, uint32_t count, uint64_t offset,
                uint32_t flags, struct nbdkit_extents *extents)
{
  int r = extents_answer (handle, count, offset, flags, extents);

  conn_leave (handle);
  return r;
}

static int
plugin_cache (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  int r = cache_answer (handle, count, offset, flags);

  conn_leave (handle);
  return r;
}

#define plugin_config_help \
  "file=PATH|URI           Backing file, block device or NBD URI (nbd://HOST:PORT/EXPORT,\n" \
  "                        nbd+unix:///EXPORT?socket=PATH, nbds://...); repeat: concatenated.\n" \
  "stripe=SIZE             Stripe the files (RAID-0) in units of SIZE (>= 4k).\n" \
  "mode=writeback|hold     Acknowledge when held (default) or when written.\n" \
  "idle=DURATION           Unplug when no request came for this long (1ms).\n" \
  "max-delay=DURATION      Unplug when the oldest held request is this old (10ms).\n" \
  "max-requests=N          Unplug at N held requests (256).\n" \
  "max-bytes=SIZE          Unplug at SIZE held write bytes; memory bound (4M).\n" \
  "max-merge=SIZE          Largest merged backend I/O (1M).\n" \
  "max-inflight=N          Backend I/Os in flight per file, all connections (64).\n" \
  "io-threads=N            Threads issuing backend I/O, all connections (16).\n" \
  "remote-connections=N    NBD connections per URI if it allows multi-conn (4).\n" \
  "remote-queue-depth=N    Backend I/Os in flight per NBD URI, all connections (64).\n" \
  "connect-timeout=DURATION One attempt to connect to an NBD server (10s).\n" \
  "connect-retry=DURATION  At start, keep trying an NBD server this long (0: once).\n" \
  "direct=auto|always|never Write what cannot merge at once, unplugged: to\n" \
  "                        local files (auto), to every file, or never.\n" \
  "direct-size=SIZE        With direct=auto, also requests this large (64k;\n" \
  "                        1M with an NBD server as a backing file; 0: off).\n" \
  "requeue-delay=DURATION  First retry after EAGAIN/ENOMEM (3ms).\n" \
  "requeue-max-delay=DURATION\n" \
  "                        Backoff cap (100ms).\n" \
  "requeue-timeout=DURATION\n" \
  "                        Give up with EIO after this long (10s).\n" \
  "lock=BOOL               Lock the files against other processes (yes).\n" \
  "stats-file=PATH         Write JSON statistics here.\n" \
  "stats-interval=DURATION Rewrite stats-file= this often while connections\n" \
  "                        are open (2s; at least 100ms; 0: only at close\n" \
  "                        and exit)."

static struct nbdkit_plugin plugin = {
  .name = "plug",
  .longname = "nbdkit plug plugin (explicit block plugging for NBD)",
  .version = PACKAGE_VERSION,
  .description = "Collect, sort and merge NBD requests into fewer, "
                 "larger backend I/Os",
  .unload = plugin_unload,
  .config = plugin_config,
  .config_complete = plugin_config_complete,
  .config_help = plugin_config_help,
  .magic_config_key = "file",
  .get_ready = plugin_get_ready,
  .after_fork = plugin_after_fork,
  .cleanup = plugin_cleanup,
  .dump_plugin = plugin_dump_plugin,
  .open = plugin_open,
  .close = plugin_close,
  .get_size = plugin_get_size,
  .block_size = plugin_block_size,
  .can_write = plugin_can_write,
  .can_flush = plugin_can_flush,
  .can_trim = plugin_can_trim,
  .can_zero = plugin_can_zero,
  .can_fast_zero = plugin_can_fast_zero,
  .can_fua = plugin_can_fua,
  .can_multi_conn = plugin_can_multi_conn,
  .can_extents = plugin_can_extents,
  .can_cache = plugin_can_cache,
  .pread = plugin_pread,
  .pwrite = plugin_pwrite,
  .zero = plugin_zero,
  .trim = plugin_trim,
  .flush = plugin_flush,
  .extents = plugin_extents,
  .cache = plugin_cache,
  .errno_is_preserved = 1,
};

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL
NBDKIT_REGISTER_PLUGIN (plugin)
