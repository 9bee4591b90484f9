/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 *
 * bench/delay-us.c: an nbdkit filter that makes each write cost a
 * fixed time, in microseconds, and counts what reaches the remote.
 * nbdkit 1.32's delay filter takes whole milliseconds only ("0.5ms"
 * parses as 0), and the report needs the remote latencies between 0
 * and 1 ms where a network round trip sits; its stats filter does not
 * count writes with FUA, which are durability points as FLUSHes are.
 * Built by bench/report.sh, never installed.
 *
 *   nbdkit --filter=./delay-us.so memory 1G write-us=500 counts=FILE
 *
 * At unload, FILE gets one line: "writes N fua N flushes N zeroes N
 * trims N" (fua: the writes and zeroes with the FUA flag).
 *
 * The sleep is paid by the nbdkit worker thread that serves the write,
 * as with the delay filter: a server of T threads serves up to T writes
 * in parallel.
 */

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

static int64_t write_us;
static char *counts_path;
static uint64_t writes, fua, flushes, zeroes, trims;

static void
tally (uint64_t *counter)
{
  __atomic_fetch_add (counter, 1, __ATOMIC_RELAXED);
}

static int
delay_us_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
                 const char *key, const char *value)
{
  if (strcmp (key, "write-us") == 0) {
    if (nbdkit_parse_int64_t ("write-us", value, &write_us) == -1)
      return -1;
    if (write_us < 0) {
      nbdkit_error ("write-us must not be negative: %s", value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, "counts") == 0) {
    free (counts_path);
    counts_path = nbdkit_absolute_path (value);
    return counts_path == NULL ? -1 : 0;
  }
  return next (nxdata, key, value);
}

static void
delay_us_unload (void)
{
  FILE *f;

  if (counts_path == NULL)
    return;
  f = fopen (counts_path, "w");
  if (f == NULL) {
    nbdkit_error ("counts: %s: %m", counts_path);
    free (counts_path);
    return;
  }
  fprintf (f, "writes %" PRIu64 " fua %" PRIu64 " flushes %" PRIu64
           " zeroes %" PRIu64 " trims %" PRIu64 "\n",
           writes, fua, flushes, zeroes, trims);
  fclose (f);
  free (counts_path);
}

/* Sleep the whole time even if a signal interrupts the sleep. */
static void
pay (void)
{
  struct timespec ts = {
    .tv_sec = write_us / 1000000,
    .tv_nsec = (write_us % 1000000) * 1000,
  };

  if (write_us == 0)
    return;
  while (nanosleep (&ts, &ts) == -1 && errno == EINTR)
    ;
}

static int
delay_us_pwrite (nbdkit_next *next, void *handle __attribute__ ((unused)), const void *buf,
                 uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  tally (&writes);
  if (flags & NBDKIT_FLAG_FUA)
    tally (&fua);
  pay ();
  return next->pwrite (next, buf, count, offset, flags, err);
}

static int
delay_us_zero (nbdkit_next *next, void *handle __attribute__ ((unused)),
               uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  tally (&zeroes);
  if (flags & NBDKIT_FLAG_FUA)
    tally (&fua);
  return next->zero (next, count, offset, flags, err);
}

static int
delay_us_trim (nbdkit_next *next, void *handle __attribute__ ((unused)),
               uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  tally (&trims);
  return next->trim (next, count, offset, flags, err);
}

static int
delay_us_flush (nbdkit_next *next, void *handle __attribute__ ((unused)),
                uint32_t flags, int *err)
{
  tally (&flushes);
  return next->flush (next, flags, err);
}

static struct nbdkit_filter filter = {
  .name = "delayus",
  .longname = "nbdplug bench: microsecond write delay",
  .config = delay_us_config,
  .config_help = "write-us=N   sleep N microseconds before each write\n"
                 "counts=FILE  write the operation counts here at unload",
  .unload = delay_us_unload,
  .pwrite = delay_us_pwrite,
  .zero = delay_us_zero,
  .trim = delay_us_trim,
  .flush = delay_us_flush,
};

NBDKIT_REGISTER_FILTER (filter)
