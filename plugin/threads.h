/* SPDX-License-Identifier: BSD-3-Clause
 * Copyright the nbdplug authors (see LICENSE).
 */

/* threads.h: what every thread the plugin starts does first. */
#ifndef NBDPLUG_THREADS_H
#define NBDPLUG_THREADS_H

/* Thread names (at most 15 characters: the kernel's TASK_COMM_LEN),
 * seen in /proc/PID/task/TID/comm, top -H and gdb.
 */
#define THREAD_NAME_TIMER  "plug-timer"
#define THREAD_NAME_IO     "plug-io"
#define THREAD_NAME_REMOTE "plug-remote"

/* Name the calling thread and make it an I/O flusher where the kernel
 * allows it (see threads.c).  Call it first in the thread's function.
 */
extern void thread_setup (const char *name);

#endif /* NBDPLUG_THREADS_H */
