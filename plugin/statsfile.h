/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* statsfile.h: the stats-file= reports (nbdplug-stat reads them).
 *
 * A report is JSON (stats_report_json, src/stats.h): the statistics of
 * the connections closed, of those still open, and of each backing
 * file.  It is rewritten at every close, every stats-interval= while a
 * connection is open (the timer thread) and at exit, each time
 * atomically (a temporary file renamed over it), under stats_lock: a
 * closing connection is counted either open or closed, never both.
 */
#ifndef NBDPLUG_STATSFILE_H
#define NBDPLUG_STATSFILE_H

#include <stddef.h>
#include <stdint.h>

#include "plug-config.h"
#include "stats.h"

struct backing;
struct conn;

/* What the reports need of the export, given once at start. */
struct statsfile_setup {
  const char *path;             /* stats-file=, borrowed from the entry's
                                 * configuration; NULL: no reports. */
  enum plug_mode mode;
  uint64_t interval_ns;         /* stats-interval=, as reported. */
  const struct backing *backings;       /* Borrowed: [nr_backings]. */
  size_t nr_backings;
  uint64_t start_ns;            /* .get_ready's now_ns: the uptime's
                                 * origin. */
};

/* Refuse a stats-file= that no report could replace (.get_ready,
 * before the files are opened).  Returns 0, or -1 after nbdkit_error.
 */
extern int statsfile_check (const char *path);

/* Take s (copied), before the first connection (.get_ready). */
extern void statsfile_init (const struct statsfile_setup *s);

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

/* Server exit, once every connection's data is written out and every
 * thread stopped: the last report, with the connections still open
 * (live) counted as closed.
 */
extern void statsfile_write_exit (const struct plug_stats *live);

#endif /* NBDPLUG_STATSFILE_H */
