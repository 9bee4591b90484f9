/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* plugin.c: the nbdkit entry points: the plugin's one handle (its
 * configuration, layout, backing files), its lifecycle (.get_ready
 * builds the rooms and gives each what it needs, .cleanup and .unload
 * take them down), and the callbacks.
 *
 * The callbacks are thin: reads, flushes and writes go to conn.c, which
 * hands them to the export's engine (src/engine.h, glue.h); the
 * parameters are config.c's, the stats-file= reports statsfile.c's.
 */

#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
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
#include "remote.h"
#include "rescue.h"
#include "request.h"
#include "statsfile.h"

/* -D plug.stats=1: log each connection's statistics at close. */
NBDKIT_DLL_PUBLIC int plug_debug_stats;
/* -D plug.unplug=1: log every unplug (reason, requests, bytes, runs). */
NBDKIT_DLL_PUBLIC int plug_debug_unplug;
/* -D plug.state=1: log every change of state of the engine's machines
 * (op, run, file, pace, conn, engine), as "op 17: NEW -> ACKED".
 */
NBDKIT_DLL_PUBLIC int plug_debug_state = 0;
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
  struct engine *eng;           /* Owned; glue.c, conn.c and loop.c
                                 * borrow it.  Freed under eng_lock. */
} plug;

uint64_t
now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
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

  if (plug.eng == NULL)
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
  statsfile_write_exit (&live);
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
    glue_fini_locked ();
    engine_free (plug.eng);
    plug.eng = NULL;
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
  return config_complete (&plug.cfg);
}

/* The engine's messages, already rate-limited (engine.h). */
/* The engine's state log (-D plug.state=1). */
static void
engine_state_log (void *opaque, const char *msg)
{
  nbdkit_debug ("%s", msg);
}

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

  config_direct_size (&plug.cfg, any_remote ());
  ec = (struct eng_config) {
    .mode = plug.cfg.mode == MODE_HOLD ? ENG_HOLD : ENG_WRITEBACK,
    .nr_backings = plug.nr_backings,
    .idle_ns = plug.cfg.idle_ns,
    .max_delay_ns = plug.cfg.max_delay_ns,
    .lim = plug.cfg.lim,
    .max_inflight = plug.cfg.max_inflight,
    .direct = plug.cfg.direct != DIRECT_NEVER,
    .direct_size = plug.cfg.direct_size,
    .retry = plug.cfg.retry,
    .seed = index_seed (),
    .log = engine_log,
    .debug_unplug = plug_debug_unplug,
    .state_log = plug_debug_state ? engine_state_log : NULL,
    .inject_unplug_nomem = plug_debug_inject_unplug_nomem > 0 ?
      (unsigned) plug_debug_inject_unplug_nomem : 0,
    .names = (const char *const *) plug.cfg.files,
  };

  plug.eng = engine_new (&ec);
  if (plug.eng == NULL) {
    nbdkit_error ("engine: %m");
    return -1;
  }
  /* A server's queue, not a file's: remote-queue-depth= runs in flight
   * per NBD URI; the rest wait in the engine's queue, where they can
   * still merge with what comes after them.
   */
  for (i = 0; i < plug.nr_backings; ++i)
    if (plug.backings[i].remote)
      engine_set_max_inflight (plug.eng, i, plug.cfg.remote_queue_depth);
  /* A write to an NBD server costs a round trip, a write to a local
   * file about what the plug's copy costs.  In writeback mode a request
   * to a server that merges with nothing is still acknowledged from the
   * plug, and written with the server's parallelism (remote-queue-depth=
   * in flight) rather than the client's (bench/report.sh measures
   * 4 KiB random writes to a server of 1 ms per write against nbdkit's
   * nbd plugin, which writes each one through).
   */
  for (i = 0; i < plug.nr_backings; ++i)
    if (plug.backings[i].remote && plug.cfg.mode == MODE_WRITEBACK &&
        plug.cfg.direct == DIRECT_AUTO)
      engine_set_direct_rule (plug.eng, i, ENG_DIRECT_LARGE);
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

/* Open the files and build the layout here, not in .config_complete:
 * errors are still seen by the user, and --dump-plugin never opens them.
 */
static int
plugin_get_ready (void)
{
  CLEANUP_FREE uint64_t *sizes = NULL;
  enum layout_error why;
  uint64_t start_ns = now_ns ();
  size_t i, bad;
  const struct backing_params bparams = {
    .lock = !plug.cfg.shared,
    .remote = {
      .max_conns = plug.cfg.remote_connections,
      .retry = plug.cfg.retry,
      .connect_timeout_ns = plug.cfg.connect_timeout_ns,
      .connect_retry_ns = plug.cfg.connect_retry_ns,
      .connect_timeout_text = plug.cfg.connect_timeout_text,
      .connect_retry_text = plug.cfg.connect_retry_text,
      .lost = glue_record_lost,
    },
    .inject = {
      .eagain_every = plug_debug_inject_eagain,
      .delay_us = plug_debug_backend_delay_us,
    },
  };

  if (plug.cfg.statsfile && statsfile_check (plug.cfg.statsfile) == -1)
    return -1;

  if (conn_init_worker_key () == -1)
    return -1;

  plug.backings = calloc (plug.cfg.nr_files, sizeof *plug.backings);
  sizes = calloc (plug.cfg.nr_files, sizeof *sizes);
  if (plug.backings == NULL || sizes == NULL) {
    nbdkit_error ("calloc: %m");
    return -1;
  }
  for (i = 0; i < plug.cfg.nr_files; ++i) {
    if (backing_open (&plug.backings[i], plug.cfg.files[i], &bparams) == -1)
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
  if (check_alignment () == -1 ||
      request_init (plug.cfg.lim.max_bytes, &plug.layout,
                    plug.backings) == -1 ||
      make_engine () == -1)
    return -1;
  /* Each room gets what it needs of the handle. */
  if (glue_init (plug.eng, plug.backings, plug.nr_backings) == -1)
    return -1;
  statsfile_init (&(struct statsfile_setup) {
      .path = plug.cfg.statsfile,
      .mode = plug.cfg.mode,
      .interval_ns = plug.cfg.stats_interval_ns,
      .backings = plug.backings,
      .nr_backings = plug.nr_backings,
      .start_ns = start_ns,
    });
  return conns_init (&(struct conns_setup) {
      .eng = plug.eng,
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

  uint64_t live_ns = plug.cfg.statsfile ? plug.cfg.stats_interval_ns : 0;

  if (iopool_start (plug.cfg.io_threads) == -1 ||
      timer_start (plug.eng, live_ns) == -1 || rescue_start () == -1)
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

/* An extents answer under construction: the part of the export that
 * one backing file's piece covers, walked from its start.
 */
struct extents_walk {
  struct nbdkit_extents *extents;       /* nbdkit's, filled here. */
  struct backing *b;
  uint64_t off;                 /* Next offset in the backing file. */
  uint64_t exp;                 /* The same place in the export. */
  uint64_t left;                /* Bytes of the piece not yet answered. */
};

/* Answer len bytes at w's place with nbdkit's extent flags fl, and
 * move on.  Returns 0, or -1 (nbdkit_add_extent said why).
 */
static int
extents_add (struct extents_walk *w, uint64_t len, uint32_t fl)
{
  if (nbdkit_add_extent (w->extents, w->exp, len, fl) == -1)
    return -1;
  w->off += len;
  w->exp += len;
  w->left -= len;
  return 0;
}

/* nbdkit's extent flags for an NBD server's block status flags. */
static uint32_t
extent_flags_of_remote (uint32_t flags)
{
  uint32_t fl = 0;

  if (flags & LIBNBD_STATE_HOLE)
    fl |= NBDKIT_EXTENT_HOLE;
  if (flags & LIBNBD_STATE_ZERO)
    fl |= NBDKIT_EXTENT_ZERO;
  return fl;
}

/* A piece on an NBD server: one block status round trip answers many
 * extents; take them all, and more round trips for the rest, unless
 * the client wants one (req_one).  Returns 0, or -1 after nbdkit_error.
 */
static int
extents_remote (struct extents_walk *w, bool req_one)
{
  while (w->left > 0) {
    struct remote_extent ext[64];
    int n = remote_extents (w->b->remote, w->off, w->left, ext, 64), k;

    if (n == -1) {
      nbdkit_error ("file=%s: block status: %m", w->b->name);
      return -1;
    }
    for (k = 0; k < n && w->left > 0; ++k)
      if (extents_add (w, MIN (ext[k].length, w->left),
                       extent_flags_of_remote (ext[k].flags)) == -1)
        return -1;
    if (req_one)
      break;
  }
  return 0;
}

/* A piece of a local file: data and holes (SEEK_DATA, SEEK_HOLE), the
 * whole piece.  Returns 0, or -1 after nbdkit_error.
 */
static int
extents_local (struct extents_walk *w)
{
  while (w->left > 0) {
    uint64_t len;
    bool hole;

    if (backing_extent (w->b, w->off, w->left, &len, &hole) == -1) {
      nbdkit_error ("file=%s: lseek: %m", w->b->name);
      return -1;
    }
    if (extents_add (w, len, hole ? NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO
                     : 0) == -1)
      return -1;
  }
  return 0;
}

static int
extents_answer (void *handle, uint32_t count, uint64_t offset,
                uint32_t flags, struct nbdkit_extents *extents)
{
  struct conn *c = handle;
  struct layout_iter it;
  struct layout_piece p;
  unsigned pieces = 0;
  bool req_one = flags & NBDKIT_FLAG_REQ_ONE;

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
    struct extents_walk w = {
      .extents = extents,
      .b = &plug.backings[p.backing],
      .off = p.offset,
      .exp = offset + p.buf_offset,
      .left = p.count,
    };

    if (w.b->remote ? extents_remote (&w, req_one) : extents_local (&w))
      return -1;
    if (req_one)
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
