/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* plugin.c: nbdkit glue: parameters, global state, callbacks.
 *
 * The callbacks are thin: reads, flushes and writes go to conn.c, which
 * hands them to the export's engine (src/engine.h, glue.h).
 */

#include <config.h>

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
#include "plug-config.h"
#include "conn.h"
#include "glue.h"
#include "iopool.h"
#include "layout.h"
#include "minmax.h"
#include "plugin.h"
#include "ratelimit.h"
#include "remote.h"
#include "rescue.h"
#include "request.h"

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

/* The nbdkit entry points' handle: the plugin's one state, built by
 * .config, .config_complete and .get_ready (one thread, before any
 * connection) and read-only after that until .unload.  Every other
 * room of the plugin receives what it needs of it at start.
 */
static struct plugin_state {
  struct config cfg;
  struct layout layout;
  struct backing *backings;     /* Owned: [nr_backings]. */
  size_t nr_backings;           /* Opened so far (all of them once
                                 * .get_ready succeeded). */
  uint64_t start_ns;            /* .get_ready's now_ns. */
} plug;

struct config cfg;

static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
static struct plug_stats stats_total;        /* Protected by stats_lock. */
static uint64_t inject_counter;              /* Atomic. */

uint64_t
now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

bool
inject_eagain (void)
{
  int n = plug_debug_inject_eagain;

  return n > 0 &&
    __atomic_add_fetch (&inject_counter, 1, __ATOMIC_RELAXED) % n == 0;
}

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
                  plug.cfg.statsfile, what, path ? " " : "", path ? path : "",
                  stats_health.failed);
  else if (suppressed > 0)
    nbdkit_error ("stats-file=%s: report not written: %s%s%s: %m "
                  "(and %" PRIu64 " more since the last message)",
                  plug.cfg.statsfile, what, path ? " " : "", path ? path : "",
                  suppressed);
  else
    nbdkit_error ("stats-file=%s: report not written: %s%s%s: %m",
                  plug.cfg.statsfile, what, path ? " " : "", path ? path : "");
}

/* A report was written.  Caller holds stats_lock. */
static void
stats_file_written_locked (void)
{
  if (stats_health.state == STATS_FILE_FAILING)
    nbdkit_error ("stats-file=%s: written again, after %" PRIu64
                  " reports that could not be written",
                  plug.cfg.statsfile, stats_health.failed);
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

  if (asprintf (&tmp, "%s.tmp", plug.cfg.statsfile) == -1) {
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
  if (rename (tmp, plug.cfg.statsfile) == -1) {
    err = errno;
    unlink (tmp);
    stats_file_failed_locked ("rename to", plug.cfg.statsfile, err);
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
    .mode = mode_name (plug.cfg.mode),
    .written_at = written_at,
    .interval_ns = plug.cfg.stats_interval_ns,
    .closed = closed,
    .totals = &totals,
  };
  uint64_t now;
  size_t i;

  if (plug.cfg.statsfile == NULL)
    return;
  flive = calloc (plug.nr_backings ? plug.nr_backings : 1, sizeof *flive);
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
  r.nr_files = plug.nr_backings;
  r.uptime_ns = now - plug.start_ns;
  if (r.unflushed.requests > 0 && now > r.unflushed.oldest_ns)
    r.unflushed_age_ns = now - r.unflushed.oldest_ns;
  for (i = 0; i < plug.nr_backings; ++i) {
    flive[i].name = plug.backings[i].name;
    if (plug.backings[i].remote)
      remote_stats (plug.backings[i].remote, now, &flive[i]);
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
  for (i = 0; i < plug.nr_backings; ++i)
    if (plug.backings[i].remote)
      remote_stop (plug.backings[i].remote);
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
  for (i = 0; i < plug.nr_backings; ++i)
    backing_close (&plug.backings[i]);
  free (plug.backings);
  layout_free (&plug.layout);
  config_free (&plug.cfg);
}

static void
plugin_load (void)
{
  config_init (&plug.cfg);
}

static int
plugin_config (const char *key, const char *value)
{
  return config_set (&plug.cfg, key, value);
}

static int
plugin_config_complete (void)
{
  if (config_complete (&plug.cfg) == -1)
    return -1;
  cfg = plug.cfg;
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

/* Is an NBD server among the backing files? */
static bool
any_remote (void)
{
  size_t i;

  for (i = 0; i < plug.nr_backings; ++i)
    if (plug.backings[i].remote)
      return true;
  return false;
}

static int
make_engine (void)
{
  struct eng_config ec;
  size_t i;

  config_direct_min (&plug.cfg, any_remote ());
  ec = (struct eng_config) {
    .mode = plug.cfg.mode == MODE_HOLD ? ENG_HOLD : ENG_WRITEBACK,
    .nr_backings = plug.nr_backings,
    .idle_ns = plug.cfg.idle_ns,
    .max_delay_ns = plug.cfg.max_delay_ns,
    .lim = plug.cfg.lim,
    .max_inflight = plug.cfg.max_inflight,
    .direct = plug.cfg.direct != DIRECT_NEVER,
    .direct_min = plug.cfg.direct_min,
    .retry = plug.cfg.retry,
    .seed = index_seed (),
    .log = engine_log,
    .debug_unplug = plug_debug_unplug,
    .inject_unplug_nomem = plug_debug_inject_unplug_nomem > 0 ?
      (unsigned) plug_debug_inject_unplug_nomem : 0,
    .names = (const char *const *) plug.cfg.files,
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
  for (i = 0; i < plug.nr_backings; ++i)
    if (plug.backings[i].remote)
      engine_set_max_inflight (eng, i, plug.cfg.remote_queue_depth);
  /* A write to an NBD server costs a round trip, a write to a local
   * file about what the plug's copy costs.  In writeback mode a request
   * to a server that merges with nothing is still acknowledged from the
   * plug, and written with the server's parallelism (remote-queue-depth=
   * in flight) rather than the client's: measured at queue depth 16 to
   * a server that takes 1 ms per write, 4 KiB random writes ran about
   * twice as fast as on the direct path (bench/README.md).
   */
  for (i = 0; i < plug.nr_backings; ++i)
    if (plug.backings[i].remote && plug.cfg.mode == MODE_WRITEBACK &&
        plug.cfg.direct == DIRECT_AUTO)
      engine_set_direct_rule (eng, i, ENG_DIRECT_LARGE);
  return 0;
}

/* The largest minimum block size of the NBD servers: the export's. */
static uint32_t
export_min_block (void)
{
  uint32_t m = 1;
  size_t i;

  for (i = 0; i < plug.nr_backings; ++i)
    m = MAX (m, plug.backings[i].min_block);
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
  for (i = 0; i < plug.nr_backings; ++i) {
    uint64_t start = plug.layout.starts ? plug.layout.starts[i] : 0;

    if (plug.layout.stripe % m != 0 || start % m != 0) {
      nbdkit_error ("file=%s: %s %" PRIu64 " is not a multiple of the "
                    "minimum block size %" PRIu32 " that an NBD server "
                    "of this export requires",
                    plug.backings[i].name,
                    plug.layout.stripe ? "stripe" : "its offset in the export",
                    plug.layout.stripe ? plug.layout.stripe : start, m);
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

  if (stat (plug.cfg.statsfile, &st) == 0) {
    if (S_ISDIR (st.st_mode)) {
      nbdkit_error ("stats-file=%s: is a directory: name a file, such as "
                    "%s/plug-stats.json", plug.cfg.statsfile,
                    plug.cfg.statsfile);
      return -1;
    }
    if (!S_ISREG (st.st_mode)) {
      nbdkit_error ("stats-file=%s: exists and is not a regular file: "
                    "every report replaces it (by rename)",
                    plug.cfg.statsfile);
      return -1;
    }
  }
  if (asprintf (&tmp, "%s.tmp", plug.cfg.statsfile) == -1) {
    nbdkit_error ("asprintf: %m");
    return -1;
  }
  fd = open (tmp, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd == -1) {
    nbdkit_error ("stats-file=%s: cannot create %s: %m",
                  plug.cfg.statsfile, tmp);
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

  plug.start_ns = now_ns ();
  if (plug.cfg.statsfile && check_statsfile () == -1)
    return -1;

  if (conn_init_worker_key () == -1 ||
      request_init (plug.cfg.lim.max_bytes) == -1)
    return -1;

  plug.backings = calloc (plug.cfg.nr_files, sizeof *plug.backings);
  sizes = calloc (plug.cfg.nr_files, sizeof *sizes);
  if (plug.backings == NULL || sizes == NULL) {
    nbdkit_error ("calloc: %m");
    return -1;
  }
  for (i = 0; i < plug.cfg.nr_files; ++i) {
    if (backing_open (&plug.backings[i], plug.cfg.files[i]) == -1)
      return -1;
    plug.nr_backings++;
    sizes[i] = plug.backings[i].size;
  }
  if (layout_init (&plug.layout, sizes, plug.cfg.nr_files, plug.cfg.stripe,
                   &why, &bad) == -1) {
    if (errno != EINVAL)
      nbdkit_error ("layout: %m");
    else if (why == LAYOUT_EMPTY_FILE || why == LAYOUT_STRIPE_NOT_MULTIPLE ||
             why == LAYOUT_STRIPE_UNEQUAL || why == LAYOUT_TOO_LARGE) {
      /* stripe= only when one was asked for: 0 means concatenated. */
      if (plug.cfg.stripe > 0)
        nbdkit_error ("file=%s: %s (size %" PRIu64 ", stripe=%" PRIu64 ")",
                      plug.cfg.files[bad], layout_strerror (why), sizes[bad],
                      plug.cfg.stripe);
      else
        nbdkit_error ("file=%s: %s (size %" PRIu64 ")",
                      plug.cfg.files[bad], layout_strerror (why), sizes[bad]);
    }
    else
      nbdkit_error ("%s", layout_strerror (why));
    return -1;
  }
  if (check_alignment () == -1 || make_engine () == -1)
    return -1;
  glue_init (plug.backings);
  return conns_init (&(struct conns_setup) {
      .layout = &plug.layout,
      .backings = plug.backings,
      .mode = plug.cfg.mode,
      .direct = plug.cfg.direct,
    });
}

/* Threads only now: nbdkit may have forked since .get_ready (the
 * remotes' handles were connected there; their loops start here).
 */
static int
plugin_after_fork (void)
{
  size_t i;

  if (iopool_start (plug.cfg.io_threads) == -1 || timer_start () == -1 ||
      rescue_start () == -1)
    return -1;
  for (i = 0; i < plug.nr_backings; ++i)
    if (plug.backings[i].remote &&
        remote_start (plug.backings[i].remote) == -1)
      return -1;
  return 0;
}

static void
plugin_dump_plugin (void)
{
  config_dump ();
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
  return plug.layout.size;
}

static int
plugin_can_write (void *handle)
{
  size_t i;

  for (i = 0; i < plug.nr_backings; ++i)
    if (plug.backings[i].readonly)
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

  for (i = 0; i < plug.nr_backings; ++i)
    if (plug.backings[i].remote == NULL ||
        remote_info (plug.backings[i].remote)->can_trim)
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
  for (i = 0; i < plug.nr_backings; ++i)
    if (plug.backings[i].remote)
      *preferred = MAX (*preferred,
                        remote_info (plug.backings[i].remote)->pref_block);
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
  if (layout_iter_init (&it, &plug.layout, offset, count) == -1) {
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
    struct remote *rem = plug.backings[p.backing].remote;

    /* A server answers many extents per round trip: take them all. */
    while (rem && left > 0) {
      struct remote_extent ext[64];
      int n = remote_extents (rem, off, left, ext, 64), k;

      if (n == -1) {
        nbdkit_error ("file=%s: block status: %m", plug.backings[p.backing].name);
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

      if (backing_extent (&plug.backings[p.backing], off, left, &len,
                          &hole) == -1) {
        nbdkit_error ("file=%s: lseek: %m", plug.backings[p.backing].name);
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
  if (layout_iter_init (&it, &plug.layout, offset, count) == -1) {
    nbdkit_error ("cache beyond the end of the export");
    errno = EINVAL;
    return -1;
  }
  while (layout_iter_next (&it, &p)) {
    if (!backing_aligned (&plug.backings[p.backing], "cache", p.offset, p.count))
      return -1;
    if (backing_cache (&plug.backings[p.backing], p.count, p.offset) == -1) {
      nbdkit_error ("file=%s: %s: %m", plug.backings[p.backing].name,
                    plug.backings[p.backing].remote ? "cache" : "posix_fadvise");
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

static struct nbdkit_plugin plugin = {
  .name = "plug",
  .longname = "nbdkit plug plugin (explicit block plugging for NBD)",
  .version = PACKAGE_VERSION,
  .description = "Collect, sort and merge NBD requests into fewer, "
                 "larger backend I/Os",
  .load = plugin_load,
  .unload = plugin_unload,
  .config = plugin_config,
  .config_complete = plugin_config_complete,
  .config_help = config_help,
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
