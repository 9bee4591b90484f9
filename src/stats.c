/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* stats.c: see stats.h. */

#include <config.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "minmax.h"
#include "stats.h"

static const char *const client_names[STATS_NR_CLIENT] = {
  "read", "write", "zero", "trim", "flush", "fua", "cache", "extents",
};
static const char *const backend_names[STATS_NR_BACKEND] = {
  "read", "write", "zero", "trim", "sync",
};

void
stats_merge (struct plug_stats *into, const struct plug_stats *from)
{
  size_t i;

  into->connections += from->connections;
  for (i = 0; i < STATS_NR_CLIENT; ++i) {
    into->client[i].ops += from->client[i].ops;
    into->client[i].bytes += from->client[i].bytes;
  }
  for (i = 0; i < STATS_NR_BACKEND; ++i) {
    into->backend[i].ops += from->backend[i].ops;
    into->backend[i].bytes += from->backend[i].bytes;
  }
  for (i = 0; i < PLUG_NR_REASONS; ++i)
    into->unplugs[i] += from->unplugs[i];
  into->direct += from->direct;
  into->pooled += from->pooled;
  into->pieces += from->pieces;
  into->max_pieces = MAX (into->max_pieces, from->max_pieces);
  into->bytes_copied += from->bytes_copied;
  into->largest_requests = MAX (into->largest_requests,
                                from->largest_requests);
  into->largest_bytes = MAX (into->largest_bytes, from->largest_bytes);
  into->held_total_ns += from->held_total_ns;
  into->held_max_ns = MAX (into->held_max_ns, from->held_max_ns);
  into->eagain += from->eagain;
  into->timer_fired += from->timer_fired;
  into->restarted += from->restarted;
  into->gave_up += from->gave_up;
  into->errors += from->errors;
  into->synced_answers += from->synced_answers;
  into->lost += from->lost;
  into->no_slot += from->no_slot;
  for (i = 0; i < STATS_NR_LATENCY; ++i)
    stats_hist_merge (&into->latency[i], &from->latency[i]);
}

static const char *const latency_names[STATS_NR_LATENCY] = {
  "write", "flush", "held", "backend",
};

uint64_t
stats_hist_upper_us (unsigned i)
{
  if (i >= STATS_HIST_BUCKETS - 1)
    return UINT64_MAX;
  return i == 0 ? 1 : UINT64_C (1) << i;
}

uint64_t
stats_hist_percentile_us (const struct stats_hist *h, unsigned permille)
{
  uint64_t need, seen = 0;
  unsigned i;

  if (h->count == 0)
    return 0;
  /* ceil (count * permille / 1000), at least the first duration. */
  need = (h->count * permille + 999) / 1000;
  if (need == 0)
    need = 1;
  for (i = 0; i < STATS_HIST_BUCKETS; ++i) {
    seen += h->bucket[i];
    if (seen >= need)
      return stats_hist_upper_us (i);
  }
  return UINT64_MAX;            /* Buckets summing to less than count. */
}

void
stats_hist_merge (struct stats_hist *into, const struct stats_hist *from)
{
  unsigned i;

  into->count += from->count;
  into->sum_us += from->sum_us;
  for (i = 0; i < STATS_HIST_BUCKETS; ++i)
    into->bucket[i] += from->bucket[i];
}

/* Every field of struct plug_stats is a uint64_t (or an array or struct
 * of them): stats_snapshot copies it as an array.
 */
_Static_assert (sizeof (struct plug_stats) % sizeof (uint64_t) == 0,
                "struct plug_stats is made of uint64_t");

void
stats_snapshot (struct plug_stats *to, const struct plug_stats *from)
{
  const uint64_t *f = (const uint64_t *) from;
  uint64_t *t = (uint64_t *) to;
  size_t i;

  for (i = 0; i < sizeof *from / sizeof (uint64_t); ++i)
    t[i] = __atomic_load_n (&f[i], __ATOMIC_RELAXED);
}

double
stats_merge_factor (const struct plug_stats *s)
{
  if (s->backend[STATS_B_WRITE].ops == 0)
    return -1;
  return (double) s->client[STATS_C_WRITE].ops / s->backend[STATS_B_WRITE].ops;
}

/* ---- the unflushed window ---- */

static void
window_merge (struct stats_window *into, const struct stats_window *from)
{
  if (from->requests == 0)
    return;
  if (into->requests == 0 || from->oldest_ns < into->oldest_ns)
    into->oldest_ns = from->oldest_ns;
  into->bytes += from->bytes;
  into->requests += from->requests;
}

void
stats_unflushed_ack (struct stats_unflushed *u, uint64_t bytes, uint64_t now)
{
  struct stats_window one = { .bytes = bytes, .requests = 1,
                              .oldest_ns = now };

  window_merge (&u->open, &one);
}

void
stats_unflushed_flush_begin (struct stats_unflushed *u,
                             struct stats_flush_mark *m)
{
  m->w = u->open;
  u->open = (struct stats_window) { 0 };
  m->next = NULL;
  m->prev = u->tail;
  if (u->tail)
    u->tail->next = m;
  else
    u->head = m;
  u->tail = m;
  m->linked = true;
}

static void
mark_unlink (struct stats_unflushed *u, struct stats_flush_mark *m)
{
  if (m->prev)
    m->prev->next = m->next;
  else
    u->head = m->next;
  if (m->next)
    m->next->prev = m->prev;
  else
    u->tail = m->prev;
  m->prev = m->next = NULL;
  m->linked = false;
}

void
stats_unflushed_flush_end (struct stats_unflushed *u,
                           struct stats_flush_mark *m, bool ok)
{
  struct stats_flush_mark *h;

  /* Covered by a newer FLUSH that succeeded first: nothing left. */
  if (!m->linked)
    return;
  if (!ok) {
    /* Nothing covers its window yet: the next FLUSH's will. */
    window_merge (m->next ? &m->next->w : &u->open, &m->w);
    mark_unlink (u, m);
    return;
  }
  /* It covers everything acknowledged before it arrived: its window
   * and every older one.
   */
  do {
    h = u->head;
    mark_unlink (u, h);
  } while (h != m);
}

void
stats_unflushed_total (const struct stats_unflushed *u,
                       struct stats_window *out)
{
  const struct stats_flush_mark *m;

  *out = (struct stats_window) { 0 };
  for (m = u->head; m != NULL; m = m->next)
    window_merge (out, &m->w);
  window_merge (out, &u->open);
}

/* ---- JSON ---- */

static void
counters_json (FILE *fp, const char *ind, const char *name,
               const char *const *names, const struct stats_counter *c,
               size_t n)
{
  size_t i;

  fprintf (fp, "%s\"%s\": {", ind, name);
  for (i = 0; i < n; ++i)
    fprintf (fp, "%s\n%s  \"%s\": { \"ops\": %" PRIu64
             ", \"bytes\": %" PRIu64 " }",
             i ? "," : "", ind, names[i], c[i].ops, c[i].bytes);
  fprintf (fp, "\n%s},\n", ind);
}

/* The fields of the historical format, "client" to "retry", each line
 * starting with ind; no newline after the last.
 */
static void
fields_json (FILE *fp, const struct plug_stats *s, const char *ind)
{
  size_t i;

  counters_json (fp, ind, "client", client_names, s->client, STATS_NR_CLIENT);
  counters_json (fp, ind, "backend", backend_names, s->backend,
                 STATS_NR_BACKEND);
  fprintf (fp, "%s\"unplugs\": {", ind);
  for (i = 0; i < PLUG_NR_REASONS; ++i)
    fprintf (fp, "%s\n%s  \"%s\": %" PRIu64, i ? "," : "", ind,
             plug_reason_name (i), s->unplugs[i]);
  fprintf (fp, "\n%s},\n", ind);
  fprintf (fp, "%s\"direct\": %" PRIu64 ",\n", ind, s->direct);
  fprintf (fp, "%s\"pooled\": %" PRIu64 ",\n", ind, s->pooled);
  fprintf (fp, "%s\"pieces\": { \"total\": %" PRIu64
           ", \"max_per_request\": %" PRIu64 " },\n",
           ind, s->pieces, s->max_pieces);
  fprintf (fp, "%s\"bytes_copied\": %" PRIu64 ",\n", ind, s->bytes_copied);
  fprintf (fp, "%s\"largest_plug\": { \"requests\": %" PRIu64
           ", \"bytes\": %" PRIu64 " },\n", ind,
           s->largest_requests, s->largest_bytes);
  fprintf (fp, "%s\"held_ns\": { \"total\": %" PRIu64
           ", \"max\": %" PRIu64 " },\n", ind, s->held_total_ns,
           s->held_max_ns);
  fprintf (fp, "%s\"synced_answers\": %" PRIu64 ",\n", ind,
           s->synced_answers);
  fprintf (fp, "%s\"retry\": { \"eagain\": %" PRIu64
           ", \"timer_fired\": %" PRIu64 ", \"restarted\": %" PRIu64
           ", \"gave_up\": %" PRIu64 ", \"errors\": %" PRIu64
           ", \"lost\": %" PRIu64 ", \"no_slot\": %" PRIu64 " }", ind,
           s->eagain, s->timer_fired, s->restarted, s->gave_up, s->errors,
           s->lost, s->no_slot);
}

char *
stats_json (const struct plug_stats *s, const char *mode)
{
  char *buf = NULL;
  size_t len = 0;
  FILE *fp;

  fp = open_memstream (&buf, &len);
  if (fp == NULL)
    return NULL;
  fprintf (fp, "{\n  \"connections\": %" PRIu64 ",\n", s->connections);
  fprintf (fp, "  \"mode\": \"%s\",\n", mode);
  fields_json (fp, s, "  ");
  fprintf (fp, "\n}\n");
  if (fclose (fp) == EOF) {
    free (buf);
    return NULL;
  }
  return buf;
}

/* "merge_factor" and "latency_us", after a field (",\n" first). */
static void
derived_json (FILE *fp, const struct plug_stats *s, const char *ind)
{
  double mf = stats_merge_factor (s);
  unsigned i, j, n;

  if (mf < 0)
    fprintf (fp, ",\n%s\"merge_factor\": null", ind);
  else
    fprintf (fp, ",\n%s\"merge_factor\": %.3f", ind, mf);
  fprintf (fp, ",\n%s\"latency_us\": {", ind);
  for (i = 0; i < STATS_NR_LATENCY; ++i) {
    const struct stats_hist *h = &s->latency[i];

    /* Buckets up to the last one used: the rest are 0. */
    for (n = STATS_HIST_BUCKETS; n > 0 && h->bucket[n - 1] == 0; --n)
      ;
    fprintf (fp, "%s\n%s  \"%s\": { \"count\": %" PRIu64 ", \"sum\": %"
             PRIu64 ", \"p50\": %" PRIu64 ", \"p99\": %" PRIu64
             ", \"buckets\": [", i ? "," : "", ind, latency_names[i],
             h->count, h->sum_us, stats_hist_percentile_us (h, 500),
             stats_hist_percentile_us (h, 990));
    for (j = 0; j < n; ++j)
      fprintf (fp, "%s%" PRIu64, j ? ", " : "", h->bucket[j]);
    fprintf (fp, "] }");
  }
  fprintf (fp, "\n%s}", ind);
}

static void
conn_json (FILE *fp, const struct stats_conn_live *c, bool last)
{
  fprintf (fp, "    {\n      \"id\": %" PRIu64 ",\n      \"age_s\": %.3f,\n"
           "      \"held\": %" PRIu64 ",\n      \"runs\": %" PRIu64 ",\n"
           "      \"unfinished\": %" PRIu64 ",\n      \"waiting\": %" PRIu64
           ",\n      \"copied_bytes\": %" PRIu64 ",\n",
           c->id, c->age_ns / 1e9, c->held, c->runs, c->unfinished,
           c->waiting, c->copied_bytes);
  fields_json (fp, &c->s, "      ");
  derived_json (fp, &c->s, "      ");
  fprintf (fp, "\n    }%s\n", last ? "" : ",");
}

static void
file_json (FILE *fp, const struct stats_file_live *f, bool last)
{
  fprintf (fp, "    {\n      \"name\": \"");
  /* A path or URI: escape what JSON requires. */
  for (const char *p = f->name; *p; ++p) {
    if (*p == '"' || *p == '\\')
      fprintf (fp, "\\%c", *p);
    else if ((unsigned char) *p < 0x20)
      fprintf (fp, "\\u%04x", (unsigned char) *p);
    else
      fputc (*p, fp);
  }
  fprintf (fp, "\",\n      \"kind\": \"%s\",\n      \"state\": \"%s\",\n"
           "      \"inflight\": %" PRIu64 ",\n      \"queued\": %" PRIu64
           ",\n      \"not_now\": %" PRIu64 ",\n      \"errors\": %" PRIu64
           ",\n      \"runs\": %" PRIu64 ",\n      \"bytes\": %" PRIu64
           ",\n      \"syncs\": %" PRIu64,
           f->remote ? "nbd" : "local", f->state, f->inflight, f->queued,
           f->not_now, f->errors, f->runs, f->bytes, f->syncs);
  if (f->remote)
    fprintf (fp, ",\n      \"server\": { \"connections_up\": %" PRIu64
             ", \"connections\": %" PRIu64 ", \"connections_lost\": %"
             PRIu64 ", \"reconnects\": %" PRIu64 ", \"outage_s\": %.3f"
             ", \"in_outage\": %s }",
             f->conns_up, f->conns, f->conns_lost, f->reconnects,
             f->outage_ns / 1e9, f->in_outage ? "true" : "false");
  fprintf (fp, "\n    }%s\n", last ? "" : ",");
}

char *
stats_report_json (const struct stats_report *r)
{
  char *buf = NULL;
  size_t len = 0, i;
  FILE *fp;

  fp = open_memstream (&buf, &len);
  if (fp == NULL)
    return NULL;
  fprintf (fp, "{\n  \"connections\": %" PRIu64 ",\n",
           r->closed->connections);
  fprintf (fp, "  \"mode\": \"%s\",\n", r->mode);
  fields_json (fp, r->closed, "  ");
  derived_json (fp, r->closed, "  ");
  fprintf (fp, ",\n  \"written_at\": \"%s\",\n  \"stats_interval_s\": %.3f"
           ",\n  \"uptime_s\": %.3f,\n  \"open_connections\": %zu,\n",
           r->written_at, r->interval_ns / 1e9, r->uptime_ns / 1e9,
           r->nr_conns);
  fprintf (fp, "  \"unflushed\": { \"bytes\": %" PRIu64 ", \"requests\": %"
           PRIu64 ", \"oldest_age_s\": %.6f },\n", r->unflushed.bytes,
           r->unflushed.requests, r->unflushed_age_ns / 1e9);
  fprintf (fp, "  \"queue\": { \"held\": %" PRIu64 ", \"queued\": %" PRIu64
           ", \"inflight\": %" PRIu64 ", \"copied_bytes\": %" PRIu64 " },\n",
           r->held, r->queued, r->inflight, r->copied_bytes);
  fprintf (fp, "  \"totals\": {\n    \"connections\": %" PRIu64 ",\n",
           r->totals->connections);
  fields_json (fp, r->totals, "    ");
  derived_json (fp, r->totals, "    ");
  fprintf (fp, "\n  },\n  \"per_connection\": [\n");
  for (i = 0; i < r->nr_conns; ++i)
    conn_json (fp, &r->conns[i], i + 1 == r->nr_conns);
  fprintf (fp, "  ],\n  \"files\": [\n");
  for (i = 0; i < r->nr_files; ++i)
    file_json (fp, &r->files[i], i + 1 == r->nr_files);
  fprintf (fp, "  ]\n}\n");
  if (fclose (fp) == EOF) {
    free (buf);
    return NULL;
  }
  return buf;
}

char *
stats_line (const struct plug_stats *s)
{
  char *buf = NULL;
  size_t len = 0, i;
  FILE *fp;
  uint64_t client_mut = s->client[STATS_C_WRITE].ops +
    s->client[STATS_C_ZERO].ops + s->client[STATS_C_TRIM].ops;
  uint64_t backend_mut = s->backend[STATS_B_WRITE].ops +
    s->backend[STATS_B_ZERO].ops + s->backend[STATS_B_TRIM].ops;

  fp = open_memstream (&buf, &len);
  if (fp == NULL)
    return NULL;
  fprintf (fp, "client writes+zeros+trims=%" PRIu64
           " backend=%" PRIu64 " (%.2f per backend op)",
           client_mut, backend_mut,
           backend_mut ? (double) client_mut / backend_mut : 0.0);
  fprintf (fp, " unplugs:");
  for (i = 0; i < PLUG_NR_REASONS; ++i)
    if (s->unplugs[i])
      fprintf (fp, " %s=%" PRIu64, plug_reason_name (i), s->unplugs[i]);
  fprintf (fp, " largest=%" PRIu64 "/%" PRIu64 "B eagain=%" PRIu64
           " gave_up=%" PRIu64 " errors=%" PRIu64 " lost=%" PRIu64
           " syncs=%" PRIu64 " synced_answers=%" PRIu64,
           s->largest_requests, s->largest_bytes, s->eagain, s->gave_up,
           s->errors, s->lost, s->backend[STATS_B_SYNC].ops,
           s->synced_answers);
  if (fclose (fp) == EOF) {
    free (buf);
    return NULL;
  }
  return buf;
}
