/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* nbd-bench: a small libnbd aio load generator for the benchmarks.
 *
 * One connection keeps --qd commands in flight (nbd_aio_* plus
 * nbd_poll) until --ops commands were issued or --seconds passed, then
 * waits for the rest.  Write workloads end with a FLUSH that is part of
 * the measured time (--no-final-flush to leave it out): a server that
 * acknowledges writes before they reach its backend (the plug in
 * writeback mode) must not look faster by leaving its backlog out of the
 * clock.
 *
 * Output: one line of key=value pairs, for scripts:
 *
 *   op=write bs=4096 qd=16 ops=N bytes=N flushes=N seconds=S
 *   mbps=X iops=X lat_p50_us=X lat_p99_us=X lat_max_us=X flush_s=S
 *
 * mbps is 10^6 bytes per second.  Latencies are per data command (issue
 * to completion callback), flushes excluded; flush_s is the time spent
 * waiting for flushes (final one included).
 */

#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libnbd.h>

enum op { OP_WRITE, OP_READ, OP_RANDWRITE, OP_RANDREAD, OP_MIXED };
static const char *op_names[] = {
  "write", "read", "randwrite", "randread", "mixed", NULL
};

/* Options. */
static const char *uri;
static enum op op = OP_WRITE;
static uint64_t bs_min = 4096, bs_max = 4096;
static unsigned qd = 16;
static uint64_t range;          /* --size; 0: the whole export. */
static uint64_t offset0;        /* --offset: start of the range. */
static uint64_t max_ops;        /* --ops; 0: use --seconds. */
static double seconds = 5;
static uint64_t flush_every;
static uint64_t seed = 1;
static unsigned read_pct = 50;
static int final_flush = -1;    /* -1: yes for workloads that write. */

/* One command in flight. */
struct slot {
  char *buf;
  uint64_t start_ns;
  bool is_flush;
  bool busy;
};

static struct nbd_handle *nbd;
static struct slot *slots;
static unsigned inflight;
static bool failed;

/* Latencies of data commands, in ns. */
static uint64_t *lat;
static size_t lat_len, lat_cap;

static uint64_t
now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * UINT64_C (1000000000) + ts.tv_nsec;
}

/* splitmix64 */
static uint64_t
rnd (uint64_t *state)
{
  uint64_t z = (*state += UINT64_C (0x9e3779b97f4a7c15));

  z = (z ^ (z >> 30)) * UINT64_C (0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C (0x94d049bb133111eb);
  return z ^ (z >> 31);
}

/* Uniform in [0, n). */
static uint64_t
rnd_below (uint64_t *state, uint64_t n)
{
  return n ? rnd (state) % n : 0;
}

static void __attribute__ ((noreturn))
usage (FILE *fp, int status)
{
  fprintf (fp,
"usage: nbd-bench --uri URI [options]\n"
"  --op write|read|randwrite|randread|mixed   (default write)\n"
"        write/read: sequential from --offset, wrapping at the range end\n"
"        mixed: random reads (--read-pct) and random writes\n"
"  --bs SIZE | MIN-MAX   request size; a range picks sizes at random in\n"
"                        multiples of 512 (default 4096)\n"
"  --qd N                commands in flight (default 16)\n"
"  --size BYTES          range used (default: export size minus --offset)\n"
"  --offset BYTES        start of the range (default 0)\n"
"  --ops N | --seconds S stop issuing after N commands or S seconds (5)\n"
"  --flush-every N       after every N writes: wait for the writes in\n"
"                        flight, then FLUSH and wait for it (like fsync)\n"
"  --no-final-flush      do not end a writing workload with a FLUSH\n"
"  --read-pct P          mixed: percentage of reads (default 50)\n"
"  --seed N              random seed (default 1)\n");
  exit (status);
}

/* SIZE with an optional k/K, m/M, g/G suffix (powers of 1024). */
static uint64_t
parse_size (const char *opt, const char *s)
{
  char *end;
  unsigned long long v;

  errno = 0;
  v = strtoull (s, &end, 0);
  if (errno || end == s)
    goto bad;
  switch (*end) {
  case 'k': case 'K': v <<= 10; end++; break;
  case 'm': case 'M': v <<= 20; end++; break;
  case 'g': case 'G': v <<= 30; end++; break;
  }
  if (*end == 'i' || *end == 'B')
    end++;
  if (*end != '\0')
    goto bad;
  return v;
 bad:
  fprintf (stderr, "nbd-bench: %s: cannot parse '%s'\n", opt, s);
  exit (EXIT_FAILURE);
}

static void
parse_bs (const char *s)
{
  const char *dash = strchr (s, '-');

  if (dash) {
    char *lo = strndup (s, dash - s);

    if (lo == NULL) {
      perror ("strndup");
      exit (EXIT_FAILURE);
    }
    bs_min = parse_size ("--bs", lo);
    bs_max = parse_size ("--bs", dash + 1);
    free (lo);
    if (bs_min % 512 || bs_max % 512) {
      fprintf (stderr, "nbd-bench: --bs %s: a range needs multiples of 512\n",
               s);
      exit (EXIT_FAILURE);
    }
  }
  else
    bs_min = bs_max = parse_size ("--bs", s);
  if (bs_min == 0 || bs_min > bs_max || bs_max > 32 * 1024 * 1024) {
    fprintf (stderr, "nbd-bench: --bs %s: need 0 < MIN <= MAX <= 32M\n", s);
    exit (EXIT_FAILURE);
  }
}

static void
parse_args (int argc, char *argv[])
{
  enum { OPT_URI = 256, OPT_OP, OPT_BS, OPT_QD, OPT_SIZE, OPT_OFFSET,
         OPT_OPS, OPT_SECONDS, OPT_FLUSH_EVERY, OPT_NO_FINAL_FLUSH,
         OPT_FINAL_FLUSH, OPT_READ_PCT, OPT_SEED };
  static const struct option long_options[] = {
    { "uri", required_argument, NULL, OPT_URI },
    { "op", required_argument, NULL, OPT_OP },
    { "bs", required_argument, NULL, OPT_BS },
    { "qd", required_argument, NULL, OPT_QD },
    { "size", required_argument, NULL, OPT_SIZE },
    { "offset", required_argument, NULL, OPT_OFFSET },
    { "ops", required_argument, NULL, OPT_OPS },
    { "seconds", required_argument, NULL, OPT_SECONDS },
    { "flush-every", required_argument, NULL, OPT_FLUSH_EVERY },
    { "no-final-flush", no_argument, NULL, OPT_NO_FINAL_FLUSH },
    { "final-flush", no_argument, NULL, OPT_FINAL_FLUSH },
    { "read-pct", required_argument, NULL, OPT_READ_PCT },
    { "seed", required_argument, NULL, OPT_SEED },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 }
  };
  int c;
  size_t i;

  while ((c = getopt_long (argc, argv, "h", long_options, NULL)) != -1) {
    switch (c) {
    case OPT_URI:
      uri = optarg;
      break;
    case OPT_OP:
      for (i = 0; op_names[i] != NULL; ++i)
        if (strcmp (optarg, op_names[i]) == 0)
          break;
      if (op_names[i] == NULL) {
        fprintf (stderr, "nbd-bench: --op %s: unknown\n", optarg);
        exit (EXIT_FAILURE);
      }
      op = i;
      break;
    case OPT_BS:
      parse_bs (optarg);
      break;
    case OPT_QD:
      qd = parse_size ("--qd", optarg);
      if (qd < 1 || qd > 4096) {
        fprintf (stderr, "nbd-bench: --qd must be between 1 and 4096\n");
        exit (EXIT_FAILURE);
      }
      break;
    case OPT_SIZE:
      range = parse_size ("--size", optarg);
      break;
    case OPT_OFFSET:
      offset0 = parse_size ("--offset", optarg);
      break;
    case OPT_OPS:
      max_ops = parse_size ("--ops", optarg);
      break;
    case OPT_SECONDS:
      seconds = atof (optarg);
      if (seconds <= 0) {
        fprintf (stderr, "nbd-bench: --seconds must be positive\n");
        exit (EXIT_FAILURE);
      }
      break;
    case OPT_FLUSH_EVERY:
      flush_every = parse_size ("--flush-every", optarg);
      break;
    case OPT_NO_FINAL_FLUSH:
      final_flush = 0;
      break;
    case OPT_FINAL_FLUSH:
      final_flush = 1;
      break;
    case OPT_READ_PCT:
      read_pct = parse_size ("--read-pct", optarg);
      if (read_pct > 100) {
        fprintf (stderr, "nbd-bench: --read-pct must be at most 100\n");
        exit (EXIT_FAILURE);
      }
      break;
    case OPT_SEED:
      seed = parse_size ("--seed", optarg);
      break;
    case 'h':
      usage (stdout, EXIT_SUCCESS);
    default:
      usage (stderr, EXIT_FAILURE);
    }
  }
  if (optind != argc || uri == NULL)
    usage (stderr, EXIT_FAILURE);
}

static void
record_latency (uint64_t ns)
{
  if (lat_len == lat_cap) {
    size_t cap = lat_cap ? lat_cap * 2 : 65536;
    uint64_t *p = realloc (lat, cap * sizeof *p);

    if (p == NULL)
      return;                   /* Percentiles from what we have. */
    lat = p;
    lat_cap = cap;
  }
  lat[lat_len++] = ns;
}

static int
complete (void *vp, int *error)
{
  struct slot *s = vp;

  if (*error) {
    fprintf (stderr, "nbd-bench: %s failed: %s\n",
             s->is_flush ? "flush" : "command", strerror (*error));
    failed = true;
  }
  else if (!s->is_flush)
    record_latency (now_ns () - s->start_ns);
  s->busy = false;
  inflight--;
  return 1;                     /* Retire the command. */
}

static struct slot *
free_slot (void)
{
  unsigned i;

  for (i = 0; i < qd; ++i)
    if (!slots[i].busy)
      return &slots[i];
  abort ();                     /* Callers check inflight < qd. */
}

/* Wait until at most `limit` commands are in flight. */
static void
wait_for (unsigned limit)
{
  while (inflight > limit) {
    if (nbd_poll (nbd, -1) == -1) {
      fprintf (stderr, "nbd-bench: %s\n", nbd_get_error ());
      exit (EXIT_FAILURE);
    }
  }
}

/* Issue a FLUSH and wait for it and everything before it. */
static void
flush_and_wait (void)
{
  struct slot *s;
  nbd_completion_callback cb;

  wait_for (0);
  s = free_slot ();
  s->busy = true;
  s->is_flush = true;
  s->start_ns = now_ns ();
  cb.callback = complete;
  cb.user_data = s;
  cb.free = NULL;
  inflight++;
  if (nbd_aio_flush (nbd, cb, 0) == -1) {
    fprintf (stderr, "nbd-bench: flush: %s\n", nbd_get_error ());
    exit (EXIT_FAILURE);
  }
  wait_for (0);
}

static int
cmp_u64 (const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;

  return x < y ? -1 : x > y;
}

static double
percentile_us (double p)
{
  size_t i;

  if (lat_len == 0)
    return 0;
  i = (size_t) (p * (lat_len - 1) + 0.5);
  return lat[i] / 1000.;
}

int
main (int argc, char *argv[])
{
  uint64_t export_size, rng, cursor, ops = 0, bytes = 0, writes = 0;
  uint64_t flushes = 0, flush_ns = 0, start, deadline, t, elapsed;
  bool writing;
  unsigned i;
  char *pattern;

  parse_args (argc, argv);
  rng = seed;
  writing = op == OP_WRITE || op == OP_RANDWRITE ||
    (op == OP_MIXED && read_pct < 100);
  if (final_flush == -1)
    final_flush = writing;

  nbd = nbd_create ();
  if (nbd == NULL || nbd_connect_uri (nbd, uri) == -1) {
    fprintf (stderr, "nbd-bench: %s: %s\n", uri, nbd_get_error ());
    exit (EXIT_FAILURE);
  }
  export_size = nbd_get_size (nbd);
  if ((int64_t) export_size == -1) {
    fprintf (stderr, "nbd-bench: %s\n", nbd_get_error ());
    exit (EXIT_FAILURE);
  }
  if (offset0 >= export_size) {
    fprintf (stderr, "nbd-bench: --offset beyond the export (%" PRIu64 ")\n",
             export_size);
    exit (EXIT_FAILURE);
  }
  if (range == 0 || range > export_size - offset0)
    range = export_size - offset0;
  if (bs_max > range) {
    fprintf (stderr, "nbd-bench: --bs larger than the range (%" PRIu64 ")\n",
             range);
    exit (EXIT_FAILURE);
  }
  if ((writing || flush_every) && nbd_is_read_only (nbd) == 1) {
    fprintf (stderr, "nbd-bench: the export is read-only\n");
    exit (EXIT_FAILURE);
  }

  /* Write data: random bytes (not zeros, which some servers detect),
   * shared by all slots: only the number and shape of requests matter.
   */
  pattern = malloc (bs_max);
  slots = calloc (qd, sizeof *slots);
  if (pattern == NULL || slots == NULL) {
    perror ("malloc");
    exit (EXIT_FAILURE);
  }
  for (i = 0; i < bs_max; ++i)
    pattern[i] = rnd (&rng) | 1;
  for (i = 0; i < qd; ++i) {
    slots[i].buf = malloc (bs_max);
    if (slots[i].buf == NULL) {
      perror ("malloc");
      exit (EXIT_FAILURE);
    }
  }

  cursor = 0;
  start = now_ns ();
  deadline = max_ops ? UINT64_MAX : start + (uint64_t) (seconds * 1e9);
  while (!failed) {
    uint64_t len, off;
    bool is_write;
    struct slot *s;
    nbd_completion_callback cb;
    int64_t cookie;

    if (max_ops ? ops >= max_ops : now_ns () >= deadline)
      break;
    if (flush_every && writes > 0 && writes % flush_every == 0 &&
        writes / flush_every > flushes) {
      t = now_ns ();
      flush_and_wait ();
      flush_ns += now_ns () - t;
      flushes++;
      continue;
    }
    wait_for (qd - 1);

    len = bs_min == bs_max ? bs_min :
      bs_min + rnd_below (&rng, (bs_max - bs_min) / 512 + 1) * 512;
    switch (op) {
    case OP_WRITE:
    case OP_READ:
      if (cursor + len > range)
        cursor = 0;
      off = cursor;
      cursor += len;
      is_write = op == OP_WRITE;
      break;
    default:
      {
        uint64_t align = bs_min == bs_max ? bs_min : 512;

        off = rnd_below (&rng, (range - len) / align + 1) * align;
        is_write = op == OP_RANDWRITE ||
          (op == OP_MIXED && rnd_below (&rng, 100) >= read_pct);
      }
    }
    off += offset0;

    s = free_slot ();
    s->busy = true;
    s->is_flush = false;
    s->start_ns = now_ns ();
    cb.callback = complete;
    cb.user_data = s;
    cb.free = NULL;
    inflight++;
    if (is_write) {
      cookie = nbd_aio_pwrite (nbd, pattern, len, off, cb, 0);
      writes++;
    }
    else
      cookie = nbd_aio_pread (nbd, s->buf, len, off, cb, 0);
    if (cookie == -1) {
      fprintf (stderr, "nbd-bench: %s\n", nbd_get_error ());
      exit (EXIT_FAILURE);
    }
    ops++;
    bytes += len;
  }
  wait_for (0);
  if (final_flush && !failed) {
    t = now_ns ();
    flush_and_wait ();
    flush_ns += now_ns () - t;
    flushes++;
  }
  elapsed = now_ns () - start;
  if (failed)
    exit (EXIT_FAILURE);

  qsort (lat, lat_len, sizeof *lat, cmp_u64);
  printf ("op=%s bs=%" PRIu64, op_names[op], bs_min);
  if (bs_max != bs_min)
    printf ("-%" PRIu64, bs_max);
  printf (" qd=%u ops=%" PRIu64 " bytes=%" PRIu64 " flushes=%" PRIu64
          " seconds=%.6f mbps=%.2f iops=%.0f"
          " lat_p50_us=%.1f lat_p99_us=%.1f lat_max_us=%.1f"
          " flush_s=%.6f\n",
          qd, ops, bytes, flushes, elapsed / 1e9,
          bytes / (elapsed / 1e9) / 1e6, ops / (elapsed / 1e9),
          percentile_us (0.50), percentile_us (0.99),
          lat_len ? lat[lat_len - 1] / 1000. : 0., flush_ns / 1e9);

  if (nbd_shutdown (nbd, 0) == -1) {
    fprintf (stderr, "nbd-bench: shutdown: %s\n", nbd_get_error ());
    exit (EXIT_FAILURE);
  }
  nbd_close (nbd);
  for (i = 0; i < qd; ++i)
    free (slots[i].buf);
  free (slots);
  free (pattern);
  free (lat);
  return EXIT_SUCCESS;
}
