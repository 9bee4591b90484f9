/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* minmax.h: MIN and MAX that evaluate their arguments once.
 *
 * Pure header: used by src/ and plugin/.
 */
#ifndef NBDPLUG_MINMAX_H
#define NBDPLUG_MINMAX_H

#define MIN(a, b) ({                            \
      __typeof__ (a) _min_a = (a);              \
      __typeof__ (b) _min_b = (b);              \
      _min_a < _min_b ? _min_a : _min_b;        \
    })
#define MAX(a, b) ({                            \
      __typeof__ (a) _max_a = (a);              \
      __typeof__ (b) _max_b = (b);              \
      _max_a > _max_b ? _max_a : _max_b;        \
    })

#endif /* NBDPLUG_MINMAX_H */
