/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* The engine's fuzz target (fuzz-engine.c) without libFuzzer, as a TAP
 * test: every file of the corpus (tests/fuzz/corpus/engine, or the
 * files and directories named as arguments), then FUZZ_ENGINE_RANDOM
 * inputs (default 2000) of random bytes and lengths from fixed seeds.
 * A random input that fails is saved as fuzz-engine-fail-SEED in the
 * current directory, for the fuzzer binary or this program to replay
 * (`test-fuzz-engine FILE`; FUZZ_ENGINE_VERBOSE=1 prints each completion
 * and sync).
 */

#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine-model.h"
#include "fuzz-engine.h"
#include "tap.h"

#define FUZZ_MAX_LEN 8192          /* As -max_len= in run-engine-fuzzer.sh. */

static uint8_t buf[FUZZ_MAX_LEN];

static void
replay_file (const char *path)
{
  char msg[1024];
  FILE *fp = fopen (path, "rb");
  size_t len;

  if (fp == NULL) {
    ok (false, "%s: %s", path, strerror (errno));
    return;
  }
  len = fread (buf, 1, sizeof buf, fp);
  fclose (fp);
  ok (fuzz_engine_check (buf, len, msg, sizeof msg), "%s (%zu bytes): %s",
      path, len, msg);
}

/* path: a file, or a directory whose files are replayed in name order. */
static void
replay (const char *path)
{
  struct dirent **names;
  struct stat st;
  int i, n;

  if (stat (path, &st) == -1 || !S_ISDIR (st.st_mode)) {
    replay_file (path);
    return;
  }
  n = scandir (path, &names, NULL, alphasort);
  if (n == -1) {
    ok (false, "%s: %s", path, strerror (errno));
    return;
  }
  for (i = 0; i < n; ++i) {
    if (names[i]->d_name[0] != '.') {
      char *f;

      if (asprintf (&f, "%s/%s", path, names[i]->d_name) == -1)
        abort ();
      replay_file (f);
      free (f);
    }
    free (names[i]);
  }
  free (names);
}

static uint64_t rng;

static uint64_t
xorshift (void)
{
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void
save (unsigned seed, size_t len)
{
  char name[64];
  FILE *fp;

  snprintf (name, sizeof name, "fuzz-engine-fail-%u", seed);
  fp = fopen (name, "wb");
  if (fp == NULL || fwrite (buf, 1, len, fp) != len || fclose (fp) != 0)
    printf ("# could not save %s: %s\n", name, strerror (errno));
  else
    printf ("# saved as %s\n", name);
}

/* n inputs of random bytes, 1 to FUZZ_MAX_LEN / 2 long (most scenarios
 * end by the input running out, so the length is the number of steps).
 */
static void
random_inputs (unsigned n)
{
  char msg[1024];
  unsigned seed, bad = 0;
  size_t len, i;

  for (seed = 1; seed <= n; ++seed) {
    rng = 0x2545F4914F6CDD1DULL ^ (seed * 0x9E3779B97F4A7C15ULL);
    len = 1 + xorshift () % (FUZZ_MAX_LEN / 2);
    for (i = 0; i < len; ++i)
      buf[i] = (uint8_t) (xorshift () >> 24);
    if (!fuzz_engine_check (buf, len, msg, sizeof msg)) {
      bad++;
      ok (false, "random input %u (%zu bytes): %s", seed, len, msg);
      save (seed, len);
    }
  }
  ok (bad == 0, "%u random inputs, %u failed", n, bad);
}

int
main (int argc, char **argv)
{
  const char *srcdir = getenv ("srcdir");
  const char *nr = getenv ("FUZZ_ENGINE_RANDOM");
  int i;

  model_verbose = getenv ("FUZZ_ENGINE_VERBOSE") != NULL;
  if (argc > 1) {
    for (i = 1; i < argc; ++i)
      replay (argv[i]);
    return done_testing ();
  }
  {
    char *corpus;

    if (asprintf (&corpus, "%s/../fuzz/corpus/engine",
                  srcdir ? srcdir : ".") == -1)
      abort ();
    replay (corpus);
    free (corpus);
  }
  random_inputs (nr ? (unsigned) strtoul (nr, NULL, 0) : 2000);
  return done_testing ();
}
