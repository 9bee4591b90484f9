/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* test-engine-model: the engine against a model of the disk
 * (engine-model.c says what it checks), in 500 random scenarios of
 * fixed seeds, so that a failure names the seed that reproduces it:
 * `test-engine-model SEED [STEPS]` runs that one alone, printing each
 * step.
 */

#include <config.h>

#include <stdbool.h>
#include <stdlib.h>

#include "engine-model.h"
#include "tap.h"

#define NR_SEEDS 500
#define NR_STEPS 3000

int
main (int argc, char **argv)
{
  char msg[1024];
  unsigned seed;

  if (argc > 1) {
    model_verbose = true;
    seed = (unsigned) strtoul (argv[1], NULL, 0);
    ok (model_run_seed (seed, argc > 2 ?
                        (unsigned) strtoul (argv[2], NULL, 0) : NR_STEPS,
                        msg, sizeof msg), "%s", msg);
    return done_testing ();
  }
  for (seed = 1; seed <= NR_SEEDS; ++seed)
    ok (model_run_seed (seed, NR_STEPS, msg, sizeof msg), "%s", msg);
  return done_testing ();
}
