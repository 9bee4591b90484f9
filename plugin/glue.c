/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* glue.c: carrying out the engine's actions.  See glue.h. */

#include <config.h>

#include <errno.h>
#include <pthread.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "backing.h"
#include "cleanup.h"
#include "conn.h"
#include "glue.h"
#include "iopool.h"
#include "plugin.h"
#include "request.h"

pthread_mutex_t eng_lock = PTHREAD_MUTEX_INITIALIZER;
/* The engine, borrowed from the entry (glue_init) until .unload.
 * Protected by eng_lock.
 */
static struct engine *eng;

/* The backing files, borrowed from the entry (glue_init): read-only
 * until .unload.
 */
static struct backing *backings;

/* A run or a sync that another thread carries out: the pool (job), or
 * an asynchronous backend (br).  Owned by the glue: a run's is made
 * when it is handed over and freed when it comes back; a sync's is
 * one per backing file (sync_jobs), made at start.
 */
struct glue_job {
  struct pool_job job;
  struct backend_run br;        /* A run's, for its backend. */
  struct eng_run *run;          /* Owned by the engine: a run, */
  struct eng_sync *sync;        /* or a sync. */
};

/* One sync job per backing file: the engine has at most one sync of a
 * file in flight (SYNC_INFLIGHT), so a file's job is free again once
 * its sync came back.  Made at start because a sync must not wait for
 * memory in a thread that may not block: a remote's loop thread that
 * carried out its own FLUSH would wait for itself.  Owned; freed by
 * glue_fini_locked.
 */
static struct glue_job *sync_jobs;

int
glue_init (struct engine *e, struct backing *b, size_t nr_backings)
{
  sync_jobs = calloc (nr_backings, sizeof *sync_jobs);
  if (sync_jobs == NULL) {
    nbdkit_error ("calloc: %m");
    return -1;
  }
  eng = e;
  backings = b;
  return 0;
}

void
glue_fini_locked (void)
{
  eng = NULL;
  backings = NULL;
  free (sync_jobs);
  sync_jobs = NULL;
}

/* Futex words of the waiter groups: static, so that a waker may touch
 * a word after its waiters (and their connection) are gone.  Groups
 * that share a word only share wake-ups.
 */
#define NR_WAKE_WORDS 64
static uint32_t wake_words[NR_WAKE_WORDS];
static uint32_t next_slot;              /* Atomic. */
static PLUG_THREAD_LOCAL uint32_t my_bit; /* 0: not yet given. */

void
glue_waiter_init (struct waiter *w, uint64_t group)
{
  if (my_bit == 0)
    my_bit = UINT32_C (1) <<
      (__atomic_fetch_add (&next_slot, 1, __ATOMIC_RELAXED) % 32);
  w->state = WAITER_AWAKE;
  w->err = 0;
  w->bit = my_bit;
  w->word = &wake_words[group % NR_WAKE_WORDS];
  w->next = NULL;
}

static long
futex (uint32_t *word, int op, uint32_t val, uint32_t mask)
{
  return syscall (SYS_futex, word, op, val, NULL, NULL, mask);
}

int
glue_wait (struct waiter *w)
{
  uint32_t awake = WAITER_AWAKE;

  /* Announce the sleep; failing that, the answer is already there. */
  if (!__atomic_compare_exchange_n (&w->state, &awake, WAITER_ASLEEP, false,
                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
    return w->err;
  for (;;) {
    /* Read the word before looking at the state: a waker sets the
     * state, then changes the word, then wakes, so either DONE is seen
     * here, or the kernel sees the word changed (EAGAIN), or the wake
     * finds us asleep.
     */
    uint32_t v = __atomic_load_n (w->word, __ATOMIC_SEQ_CST);

    if (__atomic_load_n (&w->state, __ATOMIC_SEQ_CST) == WAITER_DONE)
      return w->err;
    futex (w->word, FUTEX_WAIT_BITSET_PRIVATE, v, w->bit);
  }
}

/* Up to this many groups are woken together; more flush early. */
#define WAKE_BATCH 8

struct wake_batch {
  size_t n;
  uint32_t *word[WAKE_BATCH];
  uint32_t mask[WAKE_BATCH];
};

static void
wake_flush (struct wake_batch *b)
{
  size_t i;

  for (i = 0; i < b->n; ++i) {
    __atomic_add_fetch (b->word[i], 1, __ATOMIC_SEQ_CST);
    futex (b->word[i], FUTEX_WAKE_BITSET_PRIVATE, INT_MAX, b->mask[i]);
  }
  b->n = 0;
}

/* Answer w: from here on its stack frame may be gone. */
static void
wake_add (struct wake_batch *b, struct waiter *w)
{
  uint32_t *word = w->word, bit = w->bit;
  size_t i;

  if (__atomic_exchange_n (&w->state, WAITER_DONE, __ATOMIC_SEQ_CST) !=
      WAITER_ASLEEP)
    return;                     /* It will see DONE without sleeping. */
  for (i = 0; i < b->n; ++i)
    if (b->word[i] == word) {
      b->mask[i] |= bit;
      return;
    }
  if (b->n == WAKE_BATCH)
    wake_flush (b);
  b->word[b->n] = word;
  b->mask[b->n++] = bit;
}

void
glue_begin (struct glue_actions *a)
{
  eng_actions_init (&a->eng);
  a->wake = NULL;
}

/* glue_end_locked's work, inlined into the completions of runs and
 * syncs, which call it once per run.
 */
static inline void
end_locked (struct glue_actions *a)
{
  struct eng_op *op;

  list_for_each (op, &a->eng.reply, reply_link) {
    struct waiter *w = op->waiter;

    if (w) {
      w->err = op->err;
      w->next = a->wake;
      a->wake = w;
    }
  }
  list_init (&a->eng.reply);
  request_recycle_locked (&a->eng);
  glue_kick_timer_locked ();
}

void
glue_end_locked (struct glue_actions *a)
{
  end_locked (a);
}

/* Answer every waiter, each group with one wake-up, then free every
 * released op.  Once answered, a waiter's stack frame may be gone: read
 * its next first.
 */
static void
answer_and_release (struct glue_actions *a)
{
  struct waiter *w, *wnext;
  struct eng_op *op, *next;
  struct wake_batch b;          /* Only [0, b.n) of its arrays is read:
                                 * the rest is left unset, not zeroed
                                 * on every call. */

  b.n = 0;
  for (w = a->wake; w != NULL; w = wnext) {
    wnext = w->next;
    wake_add (&b, w);
  }
  wake_flush (&b);
  a->wake = NULL;
  list_for_each_safe (op, next, &a->eng.release, release_link)
    request_free (op);
  list_init (&a->eng.release);
}

/* Hand run r's result to the engine; what that unblocks joins a. */
static void
complete_into (struct glue_actions *a, struct eng_run *r, int err)
{
  pthread_mutex_lock (&eng_lock);
  engine_complete (eng, r, err, now_ns (), &a->eng);
  end_locked (a);
  pthread_mutex_unlock (&eng_lock);
}

/* Hand sync s's result to the engine; what that unblocks joins a. */
static void
sync_done_into (struct glue_actions *a, struct eng_sync *s, int err)
{
  pthread_mutex_lock (&eng_lock);
  engine_sync_done (eng, s, err, now_ns (), &a->eng);
  end_locked (a);
  pthread_mutex_unlock (&eng_lock);
}

static void glue_issue (struct eng_run *r, uint32_t inline_runs);
static void glue_sync (struct eng_sync *s, uint32_t inline_runs);

/* The pool's side of a job: this thread may block. */
static void
glue_job_run (struct pool_job *job)
{
  struct glue_job *j = list_entry (&job->link, struct glue_job, job.link);
  struct eng_run *r = j->run;
  struct eng_sync *s = j->sync;

  /* j is not touched again: a sync's job is reused as soon as its sync
   * is done, which glue_sync reports.
   */
  if (s != NULL)
    glue_sync (s, GLUE_INLINE_ALL);
  else {
    free (j);
    glue_issue (r, GLUE_INLINE_ALL);
  }
}

/* Hand a run or a sync to the pool.  False if the pool is not running
 * (or, for a run, there is no memory for its job): the caller does it
 * itself.
 */
static bool
pool_submit (struct eng_run *r, struct eng_sync *s)
{
  struct glue_job *j = s ? &sync_jobs[s->backing] : malloc (sizeof *j);

  if (j == NULL)
    return false;
  j->job.fn = glue_job_run;
  j->run = r;
  j->sync = s;
  if (iopool_submit (&j->job, s ? POOL_URGENT : POOL_NORMAL))
    return true;
  if (s == NULL)
    free (j);
  return false;
}

/* Carry out a's syncs: in this thread if it may block (a worker, a pool
 * thread: a FLUSH's worker syncs the files itself, as before the engine
 * owned syncs), otherwise in the pool.  The ones left to this thread go
 * on mine (newest first).
 */
static void
take_syncs (struct glue_actions *a, uint32_t inline_runs, list_head *mine)
{
  struct eng_sync *s;

  while ((s = list_pop (&a->eng.sync, struct eng_sync, link)) != NULL) {
    if ((inline_runs == GLUE_INLINE_NONE ||
         inline_runs == GLUE_INLINE_FAST) && pool_submit (NULL, s))
      continue;
    list_add_head (mine, &s->link);
  }
}

/* Sync one backing file: its result is an errno, or 0. */
static int
sync_backing (struct eng_sync *s)
{
  return backing_sync (&backings[s->backing]) == 0 ? 0 : errno;
}

/* Carry out a's syncs (take_syncs); false if none was left to this
 * thread.  Out of line: glue_perform runs on every request, syncs only
 * for a FLUSH.
 */
static bool __attribute__ ((__noinline__))
run_syncs (struct glue_actions *a, uint32_t inline_runs)
{
  list_head syncs = LIST_HEAD_INIT (syncs);
  struct eng_sync *s;

  take_syncs (a, inline_runs, &syncs);
  if (list_empty (&syncs))
    return false;
  while ((s = list_pop (&syncs, struct eng_sync, link)) != NULL)
    sync_done_into (a, s, sync_backing (s));
  return true;
}

/* Hand r to the I/O pool.  Counted first: once handed over, r may be
 * completed and its connection closed at any moment.  False if the
 * pool is not running.
 */
static bool
to_pool (struct eng_run *r)
{
  uint64_t *pooled = &engine_run_stats (r)->pooled;

  STATS_ADD (*pooled, 1);
  if (pool_submit (r, NULL))
    return true;
  STATS_ADD (*pooled, UINT64_MAX);      /* Not handed over after all. */
  return false;
}

/* The backend's flags for run r to b: FUA where a member's client
 * waits for "persisted" (conn.c then skips the FLUSH that emulates it
 * elsewhere), or where the FLUSH that made r would sync b after it
 * (struct eng_run's flush_fua), and b can do it.
 */
static uint32_t
run_flags (const struct backing *b, const struct eng_run *r)
{
  size_t i;

  if (!b->be->can_fua)
    return 0;
  if (r->flush_fua)
    return BACKEND_RUN_FUA;
  for (i = 0; i < r->run->n; ++i) {
    const struct eng_op *op = r->run->reqs[i]->opaque;

    if (op->flags & ENG_F_FUA)
      return BACKEND_RUN_FUA;
  }
  return 0;
}

/* Write run r to synchronous backend b now, measuring how long it
 * takes (backing_note_run).  Returns 0 or an errno.
 */
static int
issue_timed (struct backing *b, struct eng_run *r)
{
  struct backend_run br = {
    .run = r->run,
    .flags = run_flags (b, r),
    .stats = engine_run_stats (r),
  };
  uint64_t t0 = now_ns ();
  int err = b->be->ops->issue (b->be, &br);

  backing_note_run (b, now_ns () - t0);
  return err;
}

static backend_done_fn async_done;

/* Hand run r to asynchronous backend b, which reports through
 * async_done.  Returns BACKEND_PENDING, or the run's result when it is
 * done at once (a trim the server cannot do, no connection, no memory).
 */
static int
issue_async (const struct backing *b, struct eng_run *r)
{
  struct glue_job *j = malloc (sizeof *j);
  int err;

  if (j == NULL)
    return ENOMEM;
  j->run = r;
  j->sync = NULL;
  j->br = (struct backend_run) {
    .run = r->run,
    .flags = run_flags (b, r),
    .stats = engine_run_stats (r),
    .done = async_done,
  };
  err = b->be->ops->issue (b->be, &j->br);
  if (err != BACKEND_PENDING)
    free (j);
  return err;
}

void
glue_perform (struct glue_actions *a, uint32_t inline_runs)
{
  /* The runs this thread issues itself, in order, one per round: so
   * that each round's answers go out before the next run.
   */
  list_head mine = LIST_HEAD_INIT (mine);

  for (;;) {
    struct eng_run *r, *last;
    const struct backing *strand = NULL;
    int err;

    answer_and_release (a);
    /* The runs wait meanwhile: a FLUSH waits for the sync, and
     * nothing waits for runs made after it.
     */
    if (!list_empty (&a->eng.sync) && run_syncs (a, inline_runs))
      continue;
    if (list_empty (&a->eng.issue) && list_empty (&mine))
      return;
    /* This round takes the runs on a's list now, up to `last`; what the
     * engine adds meanwhile (complete_into) waits for the next round.
     */
    last = list_last (&a->eng.issue, struct eng_run, issue_link);
    do {
      const struct backing *b;

      r = list_pop (&a->eng.issue, struct eng_run, issue_link);
      if (r == NULL)
        break;
      b = &backings[r->run->backing];
      if (b->be->async) {
        /* The backend's thread hands it back.  Done at once: its
         * result goes to the engine now.
         */
        err = issue_async (b, r);
        if (err != BACKEND_PENDING)
          complete_into (a, r, err);
        continue;
      }
      if (list_empty (&mine) && inline_runs > 0 &&
          (inline_runs != GLUE_INLINE_FAST || backing_fast (b))) {
        /* This thread's first run, and with it every other run of this
         * list to the same file if the kernel would make them take
         * turns anyway: one thread writing them in a row does the same
         * work without a pool thread's wake-up each, and without the
         * lock's spinning (the kernel's submitter issues its whole plug
         * list itself, blk_mq_flush_plug_list).
         */
        if (inline_runs == GLUE_INLINE_FAST)
          inline_runs = GLUE_INLINE_NONE;
        else if (inline_runs != GLUE_INLINE_ALL)
          inline_runs--;
        if (backing_one_writer (b))
          strand = b;
      }
      else if (b != strand && to_pool (r))
        continue;
      /* Here too when the pool is not running (server exit). */
      list_add_tail (&mine, &r->issue_link);
    } while (r != last);
    r = list_pop (&mine, struct eng_run, issue_link);
    if (r == NULL)
      continue;
    err = issue_timed (&backings[r->run->backing], r);
    complete_into (a, r, err);
  }
}

/* Runs an asynchronous backend's thread got answers for: hand each
 * back to the engine with its result under one eng_lock acquisition,
 * and carry out what that unblocks without blocking this thread
 * (GLUE_INLINE_NONE).
 */
static void
async_done (struct backend_run *const *runs, size_t n)
{
  struct glue_actions a;
  uint64_t now;
  size_t i;

  glue_begin (&a);
  pthread_mutex_lock (&eng_lock);
  now = now_ns ();      /* Under the lock: the engine's time never
                         * goes back from one call to the next. */
  for (i = 0; i < n; ++i) {
    struct glue_job *j = (struct glue_job *)
      ((char *) runs[i] - offsetof (struct glue_job, br));

    engine_complete (eng, j->run, runs[i]->err, now, &a.eng);
    free (j);
  }
  glue_end_locked (&a);
  pthread_mutex_unlock (&eng_lock);
  glue_perform (&a, GLUE_INLINE_NONE);
}

static void
glue_sync (struct eng_sync *s, uint32_t inline_runs)
{
  struct glue_actions a;

  glue_begin (&a);
  sync_done_into (&a, s, sync_backing (s));
  glue_perform (&a, inline_runs == 0 ? 1 : inline_runs);
}

void
glue_record_lost (const struct backend_lost *lost, size_t n, int err)
{
  size_t i;
  ACQUIRE_LOCK_FOR_CURRENT_SCOPE (&eng_lock);

  for (i = 0; i < n; ++i)
    engine_record_lost (eng, lost[i].backing, lost[i].offset, lost[i].count,
                        lost[i].seq_lo, lost[i].seq_hi, err);
}

static void
glue_issue (struct eng_run *r, uint32_t inline_runs)
{
  struct glue_actions a;

  glue_begin (&a);
  list_add_tail (&a.eng.issue, &r->issue_link);
  glue_perform (&a, inline_runs == 0 ? 1 : inline_runs);
}
