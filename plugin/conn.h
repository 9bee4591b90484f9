/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* conn.h: one client connection, and the requests its nbdkit worker
 * threads hand to the engine.
 *
 * The path of a write (writeback mode): the worker maps the export range
 * to per-file pieces (layout.h) and asks the engine whether it may be
 * written at once (the direct path: it continues no recent request, so
 * it could not merge, and it overlaps nothing unfinished); if so it
 * issues it itself from nbdkit's buffer and answers when it is written.
 * Otherwise it copies the data (nbdkit reuses its buffer once we
 * return), submits it, and answers at once: the engine holds it in the
 * connection's plug until an unplug sends it to its files' queues.  The
 * worker whose request triggered the unplug issues the first run itself
 * (glue.h).
 *
 * Error storage: the engine keeps it (engine.h, "ERRORS BELONG TO
 * RUNS"): a write acknowledged and then failed for good makes the next
 * FLUSH of every connection fail.  Nothing here stores an error.
 */
#ifndef NBDPLUG_CONN_H
#define NBDPLUG_CONN_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "arena.h"
#include "plug-config.h"
#include "engine.h"
#include "layout.h"
#include "request.h"
#include "stats.h"


/* What the plug knows of nbdkit's own state of the connection: an
 * nbdkit worker thread leaves its loop only once the connection is no
 * longer active (client done, dead, or the server quitting), so the
 * first worker exit (worker_exit) means nbdkit is ending it.
 */
enum conn_phase {
  CONN_SERVING,
  CONN_ENDING,
};

/* Whether a worker of an ending connection is on its way out with an
 * answer (conn_leave): from our return until its thread exits.
 */
enum reply_gate {
  GATE_OPEN,
  GATE_TAKEN,
};

struct conn {
  /* Protected by conns_lock (conn.c): the registry of open connections,
   * whose statistics exit counts.
   */
  struct conn *reg_next;

  /* Read-only after conn_open. */
  uint64_t id;                  /* For log messages. */
  uint64_t opened_ns;           /* For the statistics (now_ns). */

  /* The ENG_CLOSE request, allocated at open: ending a connection
   * allocates nothing, so no shortage of memory can keep its
   * acknowledged data from being written.  Owned until conn_close
   * submits it.
   */
  struct request *close_req;

  /* Protected by eng_lock. */
  struct eng_conn *ec;          /* Owned by the engine; freed at close. */
  pthread_t *workers;           /* Owned: threads seen serving us. */
  size_t nr_workers, cap_workers;

  /* The reply gate (conn_leave).  phase is also read without the lock
   * (atomic): it only ever goes from CONN_SERVING to CONN_ENDING.
   */
  enum conn_phase phase;
  enum reply_gate gate;
  pthread_t gate_owner;         /* The worker that holds the gate. */
  pthread_cond_t gate_cond;     /* Signalled when the gate opens. */
  /* Writeback copies placed by offset (src/arena.h), so that a merged
   * run to an NBD server is one buffer: set at open when an NBD server
   * is a backing file in writeback mode, else NULL.  Protected by
   * arena_lock (its copies are put by any thread, without it).
   */
  struct arena *arena;
  pthread_mutex_t arena_lock;

  /* Atomic counters (any thread). */
  struct plug_stats stats;
};

/* Open a connection.  Returns NULL after nbdkit_error.  Context: .open. */
extern struct conn *conn_open (void);

/* Write out everything the connection acknowledged (retrying "not now"
 * up to requeue-timeout), publish its statistics, free it.  Context:
 * .close (no worker of this connection is inside the plugin any more).
 */
extern void conn_close (struct conn *c);

/* At server exit (.cleanup): write out every plug of every connection,
 * retrying up to requeue-timeout, sync the files, and add the statistics
 * of the connections still open to *live (nbdkit 1.32 may skip their
 * .close).  Allocates nothing: its request comes from conns_init.
 */
extern void conns_shutdown (struct plug_stats *live);

/* After an abort (rescue.h), from the rescue thread: conns_shutdown's
 * write-out, or, if the exit's is under way, wait for it to end.
 */
extern void conns_rescue (void);

/* What the connections need of the export, given once at start. */
struct conns_setup {
  struct engine *eng;           /* Borrowed from the entry: the export's
                                 * engine, called under eng_lock. */
  const struct layout *layout;  /* Borrowed from the entry (plugin.c):
                                 * read-only until .unload. */
  struct backing *backings;     /* Borrowed likewise: [layout->nr]. */
  enum plug_mode mode;
  enum plug_direct direct;
};

/* Take s (copied) and allocate the exit's request (.get_ready, once the
 * layout and the engine exist), so that the exit cannot fail for
 * memory; free it if no exit used it (.unload).  conns_init returns 0,
 * or -1 after nbdkit_error.
 */
extern int conns_init (const struct conns_setup *s);
extern void conns_fini (void);

/* Remove c from the registry of open connections (conn_close, through
 * stats_publish_close: under stats_lock, so that a report counts it
 * either open or closed, never both or neither).  Returns how many
 * connections are left.
 */
extern size_t conns_unregister (struct conn *c);

/* The live part of a report: for each open connection (an array of
 * r->nr_conns put in *out, malloc'd) its statistics, also summed into
 * *open_sum, and the engine's figures of it; the engine's figures of r
 * and files (engine_snapshot).  Returns 0, or -1 with errno.  Takes
 * conns_lock, then eng_lock briefly.  Any thread holding neither.
 */
extern int conns_live (struct stats_report *r, struct stats_file_live *files,
                       struct plug_stats *open_sum,
                       struct stats_conn_live **out);

/* How many connections have not finished .close.  Any thread. */
extern size_t conns_open (void);

/* Create and delete the key that tells a worker thread's exit to its
 * connection (.get_ready / .unload: no destructor may run from an
 * unloaded plugin).
 */
extern int conn_init_worker_key (void);
extern void conn_delete_worker_key (void);

/* Worker side (nbdkit callbacks).  Return 0, or -1 with errno set after
 * nbdkit_error.
 */
extern int conn_pwrite (struct conn *c, const void *buf, uint32_t count,
                        uint64_t offset, bool fua);
extern int conn_zero (struct conn *c, uint32_t count, uint64_t offset,
                      bool may_trim, bool fua, bool fast);
extern int conn_trim (struct conn *c, uint32_t count, uint64_t offset,
                      bool fua);
extern int conn_flush (struct conn *c);
extern int conn_pread (struct conn *c, void *buf, uint32_t count,
                       uint64_t offset);
/* Every data callback calls this last, whatever it answers.  While
 * the connection serves, it returns at once.  Once nbdkit is ending
 * it, the workers leave one at a time, each once the previous one's
 * thread has exited, i.e. nbdkit has sent (or dropped) its reply.
 *
 * Why: nbdkit 1.32.4 and 1.32.5 check the connection's status before
 * taking the socket's write lock, and the thread whose send or read
 * fails first closes the socket (sockout = -1) under no lock that a
 * sender holds; a second reply that passed the check then hits
 * raw_send_socket's assert (sock >= 0) and the server aborts.  Fixed
 * upstream by commit 9d82aa4f ("server: Don't assert on send if client
 * hangs up early"), in nbdkit 1.33.10 (stable: 1.34.0).  Answers that
 * leave one at a time never meet at that socket.
 */
extern void conn_leave (struct conn *c);

/* Wait until no mutation acknowledged before this call and overlapping
 * [offset, offset+count) is unfinished, on any connection (before reads
 * and extents).
 */
extern int conn_barrier (struct conn *c, uint64_t offset, uint64_t count);

#endif /* NBDPLUG_CONN_H */
