/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* fuzz-engine: a libFuzzer target for the pure core.  Each input is a
 * scenario of tests/unit/engine-model.c in fuzz mode: its bytes pick
 * the configuration (files, connections, mode, limits, error rates)
 * and then every step (writes, zeroes, trims, FUA, FLUSHes, reads,
 * closes, completions of runs and syncs with 0, EIO, EAGAIN or ENOMEM,
 * time passing, worker counts, the exit), and the model checks the
 * engine's invariants after each (engine-model.h lists them).  A
 * failure aborts with the model's first message; ASan's leak check
 * runs after each input.
 *
 *   clang -fsanitize=fuzzer,address,undefined ... (tests/fuzz/run-engine-fuzzer.sh)
 *
 * fuzz-engine-main.c replays a corpus and random inputs through the
 * same function without libFuzzer (test-fuzz-engine in make check).
 */

#include <config.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine-model.h"
#include "fuzz-engine.h"

bool
fuzz_engine_check (const uint8_t *buf, size_t len, char *msg, size_t msg_len)
{
  return model_run_input (buf, len, msg, msg_len);
}

int
LLVMFuzzerTestOneInput (const uint8_t *buf, size_t len)
{
  char msg[1024];

  if (!fuzz_engine_check (buf, len, msg, sizeof msg)) {
    fprintf (stderr, "fuzz-engine: the model failed: %s\n", msg);
    abort ();
  }
  return 0;
}
