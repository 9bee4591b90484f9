/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* statsfile.c: the stats-file= reports.  See statsfile.h. */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backing.h"
#include "cleanup.h"
#include "conn.h"
#include "plugin.h"
#include "log.h"
#include "remote.h"
#include "statsfile.h"

/* Given by the entry at start (statsfile_init): read-only after that. */
static struct statsfile_setup sf;

static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
static struct plug_stats stats_total;        /* Protected by stats_lock. */

void
statsfile_init (const struct statsfile_setup *s)
{
  sf = *s;
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
  stats_health.state = STATS_FILE_FAILING;
  stats_health.failed++;
  errno = err;
  if (!log_error_every (&stats_health.log, NULL, STATS_ERROR_INTERVAL_NS,
                        "stats-file=%s: report not written: %s%s%s: %m",
                        sf.path, what, path ? " " : "", path ? path : ""))
    nbdkit_debug ("stats-file=%s: report not written: %s%s%s: %m "
                  "(%" PRIu64 " since the last one written)",
                  sf.path, what, path ? " " : "", path ? path : "",
                  stats_health.failed);
}

/* A report was written.  Caller holds stats_lock. */
static void
stats_file_written_locked (void)
{
  if (stats_health.state == STATS_FILE_FAILING)
    nbdkit_error ("stats-file=%s: written again, after %" PRIu64
                  " reports that could not be written",
                  sf.path, stats_health.failed);
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

  if (asprintf (&tmp, "%s.tmp", sf.path) == -1) {
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
  if (rename (tmp, sf.path) == -1) {
    err = errno;
    unlink (tmp);
    stats_file_failed_locked ("rename to", sf.path, err);
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
    .mode = mode_name (sf.mode),
    .written_at = written_at,
    .interval_ns = sf.interval_ns,
    .closed = closed,
    .totals = &totals,
  };
  uint64_t now;
  size_t i;

  if (sf.path == NULL)
    return;
  flive = calloc (sf.nr_backings ? sf.nr_backings : 1, sizeof *flive);
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
  r.nr_files = sf.nr_backings;
  r.uptime_ns = now - sf.start_ns;
  if (r.unflushed.requests > 0 && now > r.unflushed.oldest_ns)
    r.unflushed_age_ns = now - r.unflushed.oldest_ns;
  for (i = 0; i < sf.nr_backings; ++i) {
    flive[i].name = sf.backings[i].name;
    if (sf.backings[i].remote)
      remote_stats (sf.backings[i].remote, now, &flive[i]);
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

void
statsfile_write_exit (const struct plug_stats *live)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&stats_lock);
  struct plug_stats all = stats_total;

  stats_merge (&all, live);
  write_statsfile_locked ("exit", &all, OPEN_IN_CLOSED);
}

/* Refuse a stats-file= that no report could replace now, not at the
 * first close: a directory (rename(2) fails with EISDIR at every
 * report), anything else that is not a regular file (a device or FIFO
 * would be replaced by the report), a directory we cannot create
 * PATH.tmp in.
 */
int
statsfile_check (const char *path)
{
  CLEANUP_FREE char *tmp = NULL;
  struct stat st;
  int fd;

  if (stat (path, &st) == 0) {
    if (S_ISDIR (st.st_mode)) {
      nbdkit_error ("stats-file=%s: is a directory: name a file, such as "
                    "%s/plug-stats.json", path,
                    path);
      return -1;
    }
    if (!S_ISREG (st.st_mode)) {
      nbdkit_error ("stats-file=%s: exists and is not a regular file: "
                    "every report replaces it (by rename)",
                    path);
      return -1;
    }
  }
  if (asprintf (&tmp, "%s.tmp", path) == -1) {
    nbdkit_error ("asprintf: %m");
    return -1;
  }
  fd = open (tmp, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd == -1) {
    nbdkit_error ("stats-file=%s: cannot create %s: %m",
                  path, tmp);
    return -1;
  }
  close (fd);
  unlink (tmp);
  return 0;
}
