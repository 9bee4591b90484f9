/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* engine-model: the engine (driven by engine-harness) against a model
 * of the disk in random scenarios; engine-model.c says what it checks.
 * Two users: test-engine-model (fixed seeds) and the fuzz target
 * tests/fuzz/fuzz-engine.c (choices read from the fuzzer's input).
 *
 * Fuzz mode (model_run_input) checks, on top of the model:
 *  - no op is answered twice, nor released twice, and an op
 *    acknowledged at submit is never on a reply list;
 *  - an admitted mutation released with no error was written (every
 *    acknowledged mutation is on the fake disk, or still the engine's);
 *  - no run, answer or release for an op of a connection already freed
 *    (engine_conn_free), and no run holding a released op's piece;
 *  - after every step: the engine's runs in flight are exactly those
 *    the harness holds, and its unfinished mutations those admitted and
 *    not released;
 *  - the exit (ENG_SHUTDOWN), in some inputs, answered as a FLUSH over
 *    everything: after every admitted mutation finished and was synced,
 *    failing iff the model knows of a loss;
 * and draws completions with ENOMEM as well as EIO and EAGAIN, and
 * changes a connection's worker count (engine_conn_set_workers).
 */

#ifndef NBDPLUG_ENGINE_MODEL_H
#define NBDPLUG_ENGINE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Print each completion and sync (test-engine-model SEED). */
extern bool model_verbose;

/* One scenario of `steps` random steps drawn from seed.  Returns true
 * if the model found nothing wrong; msg gets the scenario's summary
 * and its first failure.
 */
extern bool model_run_seed (unsigned seed, unsigned steps,
                            char *msg, size_t msg_len);

/* One scenario in fuzz mode: every choice is read from buf (a byte, or
 * two for a choice among more than 256) until it runs out, and the
 * steps stop there; the end (draining, closes) draws from a generator
 * seeded by the bytes.  Returns true if nothing was wrong; msg as
 * above.
 */
extern bool model_run_input (const uint8_t *buf, size_t len,
                             char *msg, size_t msg_len);

#endif /* NBDPLUG_ENGINE_MODEL_H */
