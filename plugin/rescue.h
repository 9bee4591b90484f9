/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* rescue.h: write out acknowledged data when the process aborts.
 *
 * nbdkit 1.32.4 and 1.32.5 abort (raw_send_socket: Assertion
 * 'sock >= 0') when a client closes its socket while two of its
 * replies are being sent (conn.h, conn_leave; fixed in nbdkit 1.33.10
 * and 1.34.0).  The abort happens in an nbdkit worker thread, outside
 * the plugin, while the plug may hold writes of every connection that
 * were acknowledged and not flushed: nbdkit-file-plugin(1) would have
 * written them already.  So a SIGABRT handler wakes the rescue thread,
 * which writes out everything held, as the server's exit does
 * (conns_shutdown), and lets the abort go on once that is done or
 * RESCUE_WAIT_S passed (the plugin's own assertion, with eng_lock
 * held, would keep it from ever finishing).  The process then dies of
 * SIGABRT, also when it came from kill(2).
 */
#ifndef NBDPLUG_RESCUE_H
#define NBDPLUG_RESCUE_H

/* .after_fork: start the thread and install the handler.  Returns 0,
 * or -1 after nbdkit_error.
 */
extern int rescue_start (void);

/* .cleanup, once the exit's write-out is done: restore the previous
 * handler and stop the thread.
 */
extern void rescue_stop (void);

#endif /* NBDPLUG_RESCUE_H */
