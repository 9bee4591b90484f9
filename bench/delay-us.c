/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 *
 * bench/delay-us.c: an nbdkit filter that makes each write cost a
 * fixed time, in microseconds.  nbdkit 1.32's delay filter takes whole
 * milliseconds only ("0.5ms" parses as 0), and the report needs the
 * remote latencies between 0 and 1 ms where a network round trip sits.
 * Built by bench/report.sh, never installed.
 *
 *   nbdkit --filter=./delay-us.so memory 1G write-us=500
 *
 * The sleep is paid by the nbdkit worker thread that serves the write,
 * as with the delay filter: a server of T threads serves up to T writes
 * in parallel.
 */

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

static int64_t write_us;

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
  return next (nxdata, key, value);
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
  pay ();
  return next->pwrite (next, buf, count, offset, flags, err);
}

static struct nbdkit_filter filter = {
  .name = "delayus",
  .longname = "nbdplug bench: microsecond write delay",
  .config = delay_us_config,
  .config_help = "write-us=N  sleep N microseconds before each write",
  .pwrite = delay_us_pwrite,
};

NBDKIT_REGISTER_FILTER (filter)
