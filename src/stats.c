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
}

static void
counters_json (FILE *fp, const char *name, const char *const *names,
               const struct stats_counter *c, size_t n)
{
  size_t i;

  fprintf (fp, "  \"%s\": {", name);
  for (i = 0; i < n; ++i)
    fprintf (fp, "%s\n    \"%s\": { \"ops\": %" PRIu64
             ", \"bytes\": %" PRIu64 " }",
             i ? "," : "", names[i], c[i].ops, c[i].bytes);
  fprintf (fp, "\n  },\n");
}

char *
stats_json (const struct plug_stats *s, const char *mode)
{
  char *buf = NULL;
  size_t len = 0, i;
  FILE *fp;

  fp = open_memstream (&buf, &len);
  if (fp == NULL)
    return NULL;
  fprintf (fp, "{\n  \"connections\": %" PRIu64 ",\n", s->connections);
  fprintf (fp, "  \"mode\": \"%s\",\n", mode);
  counters_json (fp, "client", client_names, s->client, STATS_NR_CLIENT);
  counters_json (fp, "backend", backend_names, s->backend, STATS_NR_BACKEND);
  fprintf (fp, "  \"unplugs\": {");
  for (i = 0; i < PLUG_NR_REASONS; ++i)
    fprintf (fp, "%s\n    \"%s\": %" PRIu64, i ? "," : "",
             plug_reason_name (i), s->unplugs[i]);
  fprintf (fp, "\n  },\n");
  fprintf (fp, "  \"direct\": %" PRIu64 ",\n", s->direct);
  fprintf (fp, "  \"pooled\": %" PRIu64 ",\n", s->pooled);
  fprintf (fp, "  \"bytes_copied\": %" PRIu64 ",\n", s->bytes_copied);
  fprintf (fp, "  \"largest_plug\": { \"requests\": %" PRIu64
           ", \"bytes\": %" PRIu64 " },\n",
           s->largest_requests, s->largest_bytes);
  fprintf (fp, "  \"held_ns\": { \"total\": %" PRIu64
           ", \"max\": %" PRIu64 " },\n", s->held_total_ns, s->held_max_ns);
  fprintf (fp, "  \"synced_answers\": %" PRIu64 ",\n", s->synced_answers);
  fprintf (fp, "  \"retry\": { \"eagain\": %" PRIu64
           ", \"timer_fired\": %" PRIu64 ", \"restarted\": %" PRIu64
           ", \"gave_up\": %" PRIu64 ", \"errors\": %" PRIu64
           ", \"lost\": %" PRIu64 ", \"no_slot\": %" PRIu64 " }\n}\n",
           s->eagain, s->timer_fired, s->restarted, s->gave_up, s->errors,
           s->lost, s->no_slot);
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
