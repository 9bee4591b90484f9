/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* conn.c: connection lifecycle and the worker-thread side.  See conn.h.
 *
 * Worker threads (nbdkit's) build a request, make one engine call under
 * eng_lock, carry out what it returned (glue_perform), and wait for
 * their answer if the engine did not acknowledge at once.
 */

#include <config.h>

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backing.h"
#include "cleanup.h"
#include "conn.h"
#include "glue.h"
#include "layout.h"
#include "log.h"
#include "plugin.h"
#include "remote.h"
#include "statsfile.h"

/* Given by the entry at start (conns_init): read-only after that. */
static struct conns_setup setup;

static uint64_t next_conn_id;

/* Requests that fail are logged at most once a second: a backend that
 * fails every write must not fill the log.
 */
static pthread_mutex_t errlog_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ratelimit errlog;         /* Protected by errlog_lock. */

static void
request_error (const char *what)
{
  int err = errno;

  log_error_limited (&errlog, &errlog_lock, "%s: %m", what);
  /* nbdkit sends the errno to the client either way. */
  nbdkit_set_error (err);
  errno = err;
}

/* Tells a worker thread's exit to its connection: see worker_exit. */
static pthread_key_t worker_key;
static bool worker_key_made;

static pthread_mutex_t conns_lock = PTHREAD_MUTEX_INITIALIZER;
static struct conn *conns;              /* Protected by conns_lock. */
static size_t nr_conns;                 /* Protected by conns_lock. */

static void
conns_register (struct conn *c)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&conns_lock);
  c->reg_next = conns;
  conns = c;
  nr_conns++;
}

/* Returns how many connections are left. */
size_t
conns_unregister (struct conn *c)
{
  struct conn **pp;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&conns_lock);

  for (pp = &conns; *pp; pp = &(*pp)->reg_next)
    if (*pp == c) {
      *pp = c->reg_next;
      nr_conns--;
      break;
    }
  return nr_conns;
}

size_t
conns_open (void)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&conns_lock);
  return nr_conns;
}

/* The statistics of the pieces made for a request of c. */
static void
count_pieces (struct conn *c, const struct request *r)
{
  STATS_ADD (c->stats.pieces, r->op.nr_pieces);
  stats_max (&c->stats.max_pieces, r->op.nr_pieces);
}

/* Each nbdkit worker thread serves one connection.  When it exits (the
 * client went away, or the server is stopping) it stops counting as a
 * worker that could bring the next request (the engine's "parked"
 * trigger).
 */
static void
worker_exit (void *vc)
{
  struct conn *c = vc;
  pthread_t self = pthread_self ();
  struct glue_actions a;
  size_t i;

  glue_begin (&a);
  pthread_mutex_lock (&eng_lock);
  for (i = 0; i < c->nr_workers; ++i)
    if (pthread_equal (c->workers[i], self)) {
      c->workers[i] = c->workers[--c->nr_workers];
      break;
    }
  /* nbdkit's worker loop ends only when the connection is no longer
   * active (conn.h, enum conn_phase).
   */
  __atomic_store_n (&c->phase, CONN_ENDING, __ATOMIC_RELEASE);
  if (c->gate == GATE_TAKEN && pthread_equal (c->gate_owner, self)) {
    c->gate = GATE_OPEN;
    pthread_cond_signal (&c->gate_cond);
  }
  if (c->ec)
    engine_conn_set_workers (setup.eng, c->ec, c->nr_workers, now_ns (), &a.eng);
  glue_end_locked (&a);
  pthread_mutex_unlock (&eng_lock);
  glue_perform (&a, GLUE_INLINE_ONE);
}

int
conn_init_worker_key (void)
{
  int err = pthread_key_create (&worker_key, worker_exit);

  if (err != 0) {
    errno = err;
    nbdkit_error ("pthread_key_create: %m");
    return -1;
  }
  worker_key_made = true;
  return 0;
}

void
conn_delete_worker_key (void)
{
  if (worker_key_made)
    pthread_key_delete (worker_key);
  worker_key_made = false;
}

/* nbdkit does not tell a plugin how many worker threads serve a
 * connection (--threads): note every thread that calls us.
 */
static void
note_worker (struct conn *c)
{
  struct glue_actions a;
  pthread_t *w;

  if (pthread_getspecific (worker_key) == c)
    return;
  glue_begin (&a);
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&eng_lock);

    if (c->nr_workers == c->cap_workers) {
      size_t cap = c->cap_workers ? 2 * c->cap_workers : 16;

      w = realloc (c->workers, cap * sizeof *w);
      if (w == NULL)
        return;                 /* Uncounted: the idle timer still works. */
      c->workers = w;
      c->cap_workers = cap;
    }
    c->workers[c->nr_workers++] = pthread_self ();
    engine_conn_set_workers (setup.eng, c->ec, c->nr_workers, now_ns (), &a.eng);
    glue_end_locked (&a);
  }
  pthread_setspecific (worker_key, c);
  glue_perform (&a, GLUE_INLINE_ONE);
}

void
conn_leave (struct conn *c)
{
  pthread_t self = pthread_self ();

  if (__atomic_load_n (&c->phase, __ATOMIC_ACQUIRE) == CONN_SERVING)
    return;
  /* The gate opens at this thread's exit: worker_exit must see it.
   * (With --threads=1 no worker exits before .close, and the phase
   * stays CONN_SERVING.)
   */
  if (pthread_getspecific (worker_key) != c)
    pthread_setspecific (worker_key, c);
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&eng_lock);
  while (c->gate == GATE_TAKEN)
    pthread_cond_wait (&c->gate_cond, &eng_lock);
  c->gate = GATE_TAKEN;
  c->gate_owner = self;
}

/* After the engine refused r (engine_submit returned -1, errno set):
 * r is freed, but the actions of that call go out all the same: its
 * arrival may have unplugged other connections' acknowledged data,
 * which nothing else would write (engine.h, engine_submit).  Returns
 * -1 with errno kept.
 */
static int
submit_refused (struct request *r, struct glue_actions *a)
{
  int err = errno;

  request_free (&r->op);
  glue_perform (a, GLUE_INLINE_ONE);
  errno = err;
  return -1;
}

/* Submit r and wait for its answer unless it was acknowledged at once.
 * r belongs to the engine from here on.  Returns 0, or -1 with errno.
 */
static int
submit_wait (struct conn *c, struct request *r)
{
  struct glue_actions a;
  struct waiter w;
  size_t nr_pieces = r->op.nr_pieces, room = r->room;
  bool acked;
  int ret;

  glue_waiter_init (&w, c ? c->id : 0);
  r->op.waiter = &w;
  glue_begin (&a);
  pthread_mutex_lock (&eng_lock);
  ret = engine_submit (setup.eng, c ? c->ec : NULL, &r->op, now_ns (), &a.eng);
  acked = r->op.acked;          /* r may be freed once we unlock. */
  /* A write copied after all (submit_mutation): its thread's next one
   * is expected to be plugged and copied too.
   */
  if (room > 0)
    request_refill_locked (nr_pieces, room);
  glue_end_locked (&a);
  pthread_mutex_unlock (&eng_lock);
  if (ret == -1)
    return submit_refused (r, &a);
  glue_perform (&a, GLUE_INLINE_ONE);
  if (!acked)
    ret = glue_wait (&w);
  if (ret) {
    errno = ret;
    return -1;
  }
  return 0;
}

/* Free c's own memory.  Copies in its arena may outlive it: each chunk
 * goes with its last copy (arena_fini).
 */
static void
conn_free (struct conn *c)
{
  if (c->arena) {
    arena_fini (c->arena);
    free (c->arena);
  }
  pthread_mutex_destroy (&c->arena_lock);
  free (c->workers);
  free (c);
}

/* Arena chunks at most per connection: 6 of 2 MiB, three times the
 * default max-bytes=, so that a stream holding max-bytes= of copies (in
 * up to three chunks, each begun ARENA_SLACK before its first write)
 * still has a chunk free for what comes next.
 */
#define ARENA_CHUNKS_PER_CONN 6

/* Do writeback copies go to an arena?  Only where a merged run would
 * otherwise be gathered into one buffer: an NBD server takes one
 * buffer per write (a local file takes pwritev's vector).
 */
static bool
wants_arena (void)
{
  size_t i;

  if (setup.mode != MODE_WRITEBACK)
    return false;
  for (i = 0; i < setup.layout->nr; ++i)
    if (setup.backings[i].remote)
      return true;
  return false;
}

struct conn *
conn_open (void)
{
  struct conn *c;

  c = calloc (1, sizeof *c);
  if (c == NULL) {
    nbdkit_error ("calloc: %m");
    return NULL;
  }
  c->id = __atomic_add_fetch (&next_conn_id, 1, __ATOMIC_RELAXED);
  c->stats.connections = 1;
  pthread_mutex_init (&c->arena_lock, NULL);
  if (wants_arena ()) {
    /* Without one, copies go to request blocks: slower, not wrong. */
    c->arena = malloc (sizeof *c->arena);
    if (c->arena)
      arena_init (c->arena, ARENA_CHUNKS_PER_CONN);
  }
  c->close_req = request_new (ENG_CLOSE, 0, 0, 0, 0);
  if (c->close_req == NULL) {
    nbdkit_error ("connection %" PRIu64 ": no memory for its close "
                  "request: %m", c->id);
    conn_free (c);
    return NULL;
  }
  c->opened_ns = now_ns ();
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&eng_lock);
    c->ec = engine_conn_open (setup.eng, &c->stats);
    /* Under the lock: the timer thread may unplug c from now on. */
    if (c->ec) {
      engine_conn_set_id (c->ec, c->id);
      timer_stats_conns_locked (1);
    }
  }
  if (c->ec == NULL) {
    nbdkit_error ("connection: %m");
    request_free (&c->close_req->op);
    conn_free (c);
    return NULL;
  }
  c->phase = CONN_SERVING;
  c->gate = GATE_OPEN;
  pthread_cond_init (&c->gate_cond, NULL);
  conns_register (c);
  return c;
}

void
conn_close (struct conn *c)
{
  struct request *r;
  char *line;

  /* With --threads=1 the connection thread itself served the requests,
   * and it outlives c.
   */
  if (pthread_getspecific (worker_key) == c)
    pthread_setspecific (worker_key, NULL);

  /* blk_finish_plug: write out what we acknowledged.  NBD has no way to
   * report an error at close: the engine logs each loss.  The request
   * was allocated at open: engine_conn_free needs the close answered.
   */
  r = c->close_req;
  c->close_req = NULL;
  if (submit_wait (c, r) == -1)
    nbdkit_error ("connection %" PRIu64 ": close: %m", c->id);
  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&eng_lock);
    engine_conn_free (setup.eng, c->ec);
    c->ec = NULL;
    timer_stats_conns_locked (-1);
  }

  if (plug_debug_stats && (line = stats_line (&c->stats)) != NULL) {
    nbdkit_debug ("connection %" PRIu64 ": %s", c->id, line);
    free (line);
  }
  if (plug_debug_stats && c->arena)
    nbdkit_debug ("connection %" PRIu64 ": arena: %" PRIu64 " writes "
                  "placed, %" PRIu64 " not, %u chunks", c->id,
                  c->arena->placed, c->arena->refused,
                  c->arena->nr_chunks);
  /* The last connection gone: no worker thread is left to reuse the
   * cache, and nbdkit has freed its threads' buffers.
   */
  if (stats_publish_close (c) == 0)
    request_trim ();
  pthread_cond_destroy (&c->gate_cond);
  conn_free (c);
}

/* The exit's request, allocated at start (conns_init). */
static struct request *exit_req;

/* The write-out with exit_req: done once, by whichever of the exit
 * and an abort's rescue comes first; the other waits for it to end.
 */
enum exit_state {
  EXIT_PENDING,                 /* exit_req not taken yet. */
  EXIT_WRITING,                 /* Taken: the write-out is under way. */
  EXIT_DONE,                    /* Answered: written out and synced. */
};
static enum exit_state exit_state = EXIT_PENDING;
static pthread_mutex_t exit_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t exit_cond = PTHREAD_COND_INITIALIZER;

int
conns_init (const struct conns_setup *s)
{
  setup = *s;
  exit_req = request_new (ENG_SHUTDOWN, 0, 0, 0, 0);
  if (exit_req == NULL) {
    nbdkit_error ("no memory for the exit's request: %m");
    return -1;
  }
  return 0;
}

void
conns_fini (void)
{
  if (exit_req)
    request_free (&exit_req->op);
  exit_req = NULL;
}

/* Take exit_req if nobody has (returns it), or wait until the
 * write-out that took it has ended (returns NULL).  An abort during
 * the exit's write-out must not let the process die before that
 * write-out ends: the rescue thread waits here, and the aborting
 * thread waits for the rescue thread (at most RESCUE_WAIT_S, rescue.c).
 */
static struct request *
take_exit_req (void)
{
  struct request *r = NULL;

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&exit_lock);
  switch (exit_state) {
  case EXIT_PENDING:
    exit_state = EXIT_WRITING;
    r = exit_req;
    exit_req = NULL;
    break;
  case EXIT_WRITING:
    while (exit_state == EXIT_WRITING)
      pthread_cond_wait (&exit_cond, &exit_lock);
    break;
  case EXIT_DONE:
    break;
  }
  return r;
}

static void
exit_write_out_done (void)
{
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&exit_lock);
  exit_state = EXIT_DONE;
  pthread_cond_broadcast (&exit_cond);
}

/* Write out everything every connection acknowledged and sync the
 * files, with the exit's request: once, whichever of the exit and an
 * abort's rescue comes first; the other returns when it has ended.
 */
static void
write_out_all (const char *why)
{
  struct request *r = take_exit_req ();

  if (r == NULL)
    return;
  /* The exit's answer is the record's (engine.h, THE RECORD): an
   * error says acknowledged data is lost, as logged when it was.
   */
  if (submit_wait (NULL, r) == -1)
    nbdkit_error ("%s: not every acknowledged write is on "
                  "stable storage (see the losses logged above): %m", why);
  exit_write_out_done ();
}

void
conns_rescue (void)
{
  nbdkit_error ("the server is aborting: writing out every "
                "connection's acknowledged data first");
  write_out_all ("abort");
}

void
conns_shutdown (struct plug_stats *live)
{
  struct conn *c;

  write_out_all ("server exit");

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&conns_lock);
  for (c = conns; c != NULL; c = c->reg_next)
    stats_merge (live, &c->stats);
}

int
conns_live (struct stats_report *r, struct stats_file_live *files,
            struct plug_stats *open_sum, struct stats_conn_live **out)
{
  struct stats_conn_live *live;
  struct conn *c;
  uint64_t now = now_ns ();
  size_t i;

  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&conns_lock);
  live = calloc (nr_conns ? nr_conns : 1, sizeof *live);
  if (live == NULL)
    return -1;
  for (c = conns, i = 0; c != NULL; c = c->reg_next, ++i) {
    live[i].id = c->id;
    live[i].age_ns = now > c->opened_ns ? now - c->opened_ns : 0;
    stats_snapshot (&live[i].s, &c->stats);
    stats_merge (open_sum, &live[i].s);
  }
  /* The engine's figures, all of one instant: one short hold of the
   * lock, copying counters it keeps up to date (no list is walked but
   * the connections and the files).
   */
  pthread_mutex_lock (&eng_lock);
  for (c = conns, i = 0; c != NULL; c = c->reg_next, ++i)
    if (c->ec)
      engine_conn_snapshot (c->ec, &live[i]);
  if (setup.eng)
    engine_snapshot (setup.eng, r, files);
  pthread_mutex_unlock (&eng_lock);
  r->nr_conns = nr_conns;
  *out = live;
  return 0;
}

/* Did this worker thread's last write go into the plug rather than
 * the direct path?  Then its next one most likely does too (a stream:
 * each thread of a connection serves its requests in turn), and its
 * data is copied before taking the lock.
 */
static PLUG_THREAD_LOCAL bool last_plugged;

/* Writeback acknowledges a write at once, so the plug must hold a copy
 * of its data (nbdkit reuses its buffer once we return); a FUA write
 * and hold mode make the client wait, so the plug borrows it.
 */
static bool
needs_copy (const void *data, uint32_t flags)
{
  return data && setup.mode == MODE_WRITEBACK && !(flags & ENG_F_FUA);
}

/* Room to ask for in the request's block: a copy of the data, made
 * before the lock, when the write will most likely be plugged.  A
 * write that takes the direct path after all wasted the copy (and
 * writes from it); one expected to go direct that does not is copied
 * later, at the cost of a second lock acquisition.
 */
static size_t
speculate_room (const void *data, uint32_t flags, uint32_t count)
{
  if (!needs_copy (data, flags))
    return 0;
  return setup.direct == DIRECT_NEVER || last_plugged ? count : 0;
}

/* Submit a write, zero or trim (data: nbdkit's buffer for a write).  A
 * FUA one is answered once written and synced (the engine's round of
 * syncs): NBD "MUST NOT send its reply ... until ... persisted".
 *
 * One lock acquisition tries the direct path and, failing that,
 * submits r to the plug, unless the data still has to be copied for
 * the plug (then a second one submits).
 */
static int
submit_mutation (struct conn *c, struct request *r, const void *data,
                 const char *what)
{
  struct glue_actions a;
  struct waiter w;
  bool direct = false, submitted = false, acked = false;
  bool copy = needs_copy (data, r->op.flags);
  /* Copied before the lock (into an arena, or speculate_room): whether
   * the write goes direct or into the plug, one acquisition decides
   * and submits.
   */
  bool copied = r->copy != NULL;
  uint64_t now;
  int ret = 0;

  note_worker (c);
  glue_waiter_init (&w, c->id);
  r->op.waiter = &w;
  glue_begin (&a);
  pthread_mutex_lock (&eng_lock);
  now = now_ns ();
  if (setup.direct != DIRECT_NEVER)
    direct = engine_try_direct (setup.eng, c->ec, &r->op, now, &a.eng);
  if (!direct && (copied || !copy)) {
    /* Writeback acknowledges at once: the data must be our own copy,
     * since nbdkit reuses its buffer once we return.  (On the direct
     * path it is not counted: the client waits.)
     */
    if (copied && copy)
      r->op.bytes = r->op.count;
    ret = engine_submit (setup.eng, c->ec, &r->op, now, &a.eng);
    acked = r->op.acked;        /* r may be reused once we unlock. */
    submitted = true;
  }
  /* The spare for this thread's next request: it speculates a copy
   * when this one was plugged.
   */
  request_refill_locked (r->op.nr_pieces, copy && !direct ? r->op.count : 0);
  glue_end_locked (&a);
  pthread_mutex_unlock (&eng_lock);
  last_plugged = !direct;

  if (submitted && ret == -1)
    submit_refused (r, &a);
  else if (direct || submitted) {
    glue_perform (&a, GLUE_INLINE_ONE);
    if (!acked && (ret = glue_wait (&w)) != 0) {
      errno = ret;
      ret = -1;
    }
  }
  if (!direct && !submitted) {
    /* The direct path was expected and refused: copy now. */
    r = request_with_copy (r, data);
    if (r == NULL)
      return -1;
    STATS_ADD (c->stats.bytes_copied, r->op.count);
    r->op.bytes = r->op.count;
    ret = submit_wait (c, r);
  }
  if (ret == -1) {
    /* A fast zero that cannot be fast is an answer, not a failure. */
    if (errno != ENOTSUP)
      request_error (what);
    return -1;
  }
  return 0;
}

int
conn_pwrite (struct conn *c, const void *buf, uint32_t count,
             uint64_t offset, bool fua)
{
  struct request *r;
  uint64_t start = now_ns ();
  uint32_t flags = fua ? ENG_F_FUA : 0;
  struct request_place place = {
    .gather = layout_range_scattered (setup.layout, offset, count),
  };

  stats_count (&c->stats.client[STATS_C_WRITE], count);
  if (fua)
    stats_count (&c->stats.client[STATS_C_FUA], count);
  /* A gathered (striped) write is not in the client's order: no slot. */
  if (c->arena && !place.gather && needs_copy (buf, flags)) {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&c->arena_lock);
    place.slot = arena_place (c->arena, offset, count, &place.chunk);
  }
  if (!place.slot)
    place.room = place.gather ? count : speculate_room (buf, flags, count);
  /* The data's one trip: copied (or borrowed) there, before the lock. */
  r = request_new_write (offset, count, flags, buf, &place);
  if (r == NULL) {
    if (place.chunk)
      arena_put (place.chunk);
    return -1;
  }
  count_pieces (c, r);
  if (r->copy)
    STATS_ADD (c->stats.bytes_copied, count);
  if (submit_mutation (c, r, buf, "pwrite") == -1)
    return -1;
  stats_hist_add (&c->stats.latency[STATS_L_WRITE], now_ns () - start);
  return 0;
}

int
conn_zero (struct conn *c, uint32_t count, uint64_t offset,
           bool may_trim, bool fua, bool fast)
{
  struct request *r;

  stats_count (&c->stats.client[STATS_C_ZERO], count);
  if (fua)
    stats_count (&c->stats.client[STATS_C_FUA], count);
  r = request_new (ENG_ZERO, offset, count,
                   (fua ? ENG_F_FUA : 0) | (may_trim ? ENG_F_MAY_TRIM : 0) |
                   (fast ? ENG_F_FAST : 0), 0);
  if (r == NULL)
    return -1;
  count_pieces (c, r);
  return submit_mutation (c, r, NULL, "zero");
}

int
conn_trim (struct conn *c, uint32_t count, uint64_t offset, bool fua)
{
  struct request *r;

  stats_count (&c->stats.client[STATS_C_TRIM], count);
  if (fua)
    stats_count (&c->stats.client[STATS_C_FUA], count);
  r = request_new (ENG_TRIM, offset, count, fua ? ENG_F_FUA : 0, 0);
  if (r == NULL)
    return -1;
  count_pieces (c, r);
  return submit_mutation (c, r, NULL, "trim");
}

int
conn_flush (struct conn *c)
{
  struct request *r;
  uint64_t start = now_ns ();

  stats_count (&c->stats.client[STATS_C_FLUSH], 0);
  note_worker (c);
  /* NBD: "all write requests for which a reply has already been sent"
   * must be on permanent storage.  The engine answers once every
   * mutation acknowledged before this FLUSH, on any connection, is
   * written and the files written since their last sync are synced,
   * with the errno of a recorded loss it covers, if any (THE RECORD).
   */
  r = request_new (ENG_FLUSH, 0, 0, 0, 0);
  if (r == NULL)
    return -1;
  if (submit_wait (c, r) == -1) {
    request_error ("flush");
    return -1;
  }
  stats_hist_add (&c->stats.latency[STATS_L_FLUSH], now_ns () - start);
  return 0;
}

int
conn_barrier (struct conn *c, uint64_t offset, uint64_t count)
{
  struct request *r;
  bool quiet;

  {
    ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&eng_lock);
    quiet = engine_quiet (setup.eng);
  }
  if (quiet)
    return 0;
  note_worker (c);
  r = request_new (ENG_READ, offset, count, 0, 0);
  if (r == NULL)
    return -1;
  count_pieces (c, r);
  if (submit_wait (c, r) == -1) {
    nbdkit_error ("waiting for held writes before reading: %m");
    return -1;
  }
  return 0;
}

int
conn_pread (struct conn *c, void *buf, uint32_t count, uint64_t offset)
{
  struct layout_iter it;
  struct layout_piece p;
  struct remote_wait w;
  int ret = 0;

  stats_count (&c->stats.client[STATS_C_READ], count);
  if (layout_iter_init (&it, setup.layout, offset, count) == -1) {
    nbdkit_error ("pread beyond the end of the export: offset %" PRIu64
                  " count %" PRIu32, offset, count);
    errno = EINVAL;
    return -1;
  }
  while (layout_iter_next (&it, &p))
    if (!backing_aligned (&setup.backings[p.backing], "read",
                          p.offset, p.count))
      return -1;
  layout_iter_init (&it, setup.layout, offset, count);
  /* A read never returns stale data: wait for any held or in-flight
   * mutation, of any connection, acknowledged before it.
   */
  if (conn_barrier (c, offset, count) == -1)
    return -1;
  /* The remote pieces are all sent first, then the local ones read
   * while the servers answer.
   */
  remote_wait_init (&w);
  while (layout_iter_next (&it, &p)) {
    struct backing *b = &setup.backings[p.backing];

    if (b->remote == NULL)
      continue;
    stats_count (&c->stats.backend[STATS_B_READ], p.count);
    remote_start_pread (b->remote, &w, (char *) buf + p.buf_offset,
                        p.count, p.offset);
  }
  layout_iter_init (&it, setup.layout, offset, count);
  while (layout_iter_next (&it, &p)) {
    struct backing *b = &setup.backings[p.backing];

    if (b->remote)
      continue;
    stats_count (&c->stats.backend[STATS_B_READ], p.count);
    if (backing_pread (b, (char *) buf + p.buf_offset,
                       p.count, p.offset) == -1 && ret == 0) {
      nbdkit_error ("file=%s: pread: %m", b->name);
      ret = -1;
    }
  }
  if (remote_wait (&w) == -1 && ret == 0) {
    nbdkit_error ("pread from an NBD backing file: %m");
    ret = -1;
  }
  return ret;
}
