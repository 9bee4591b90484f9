/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* parse.h: parameter syntax that nbdkit 1.32 does not parse for us (pure).
 *
 * nbdkit_parse_delay() only exists from nbdkit 1.40, and nbdkit loads
 * plugins with RTLD_NOW, so calling it would stop the plugin loading on
 * Debian 12.  Our own parser follows its syntax.
 */
#ifndef NBDPLUG_PARSE_H
#define NBDPLUG_PARSE_H

#include <stdint.h>

/* Parse a duration: a decimal number (fraction allowed) followed by an
 * optional unit s, ms, us or ns; no unit means seconds ("3ms", "0.5s",
 * "250us", "2").  Leading and trailing blanks are not allowed.
 * Returns 0 and sets *ns, or -1 with errno EINVAL (syntax) or ERANGE
 * (more than about 584 years).
 */
extern int parse_duration (const char *str, uint64_t *ns)
  __attribute__ ((__nonnull__ (1, 2)));

#endif /* NBDPLUG_PARSE_H */
