/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

#ifndef NBDPLUG_FUZZ_ENGINE_H
#define NBDPLUG_FUZZ_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Run the input as one scenario of the engine's model (fuzz mode).
 * Returns true if nothing was wrong; msg gets the scenario's summary
 * and its first failure.
 */
extern bool fuzz_engine_check (const uint8_t *buf, size_t len,
                               char *msg, size_t msg_len);

/* libFuzzer's entry point: fuzz_engine_check, aborting on a failure. */
extern int LLVMFuzzerTestOneInput (const uint8_t *buf, size_t len);

#endif /* NBDPLUG_FUZZ_ENGINE_H */
