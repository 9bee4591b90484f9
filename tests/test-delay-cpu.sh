#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Waiting for a backend that says "not now" costs no CPU: hold mode,
# -D plug.inject_eagain=1 (every backend write fails with EAGAIN),
# requeue-timeout=3s requeue-max-delay=100ms, one write.  Over the ~3 s the
# write waits, the server uses < 0.2 s of CPU (utime+stime from
# /proc/PID/stat), the write then fails with EIO, and the retry timer
# fired a bounded number of times (~3s/100ms plus the backoff steps:
# retry.timer_fired < 100).
source ./functions.sh
set -e
set -x

requires_python_nbd
requires test -r /proc/self/stat

plug_tmpdir

truncate -s 1M "$tmp/img"
start_plug srv -D plug.inject_eagain=1 -- file="$tmp/img" mode=hold \
           requeue-timeout=3s requeue-max-delay=100ms stats-file="$tmp/stats.json"

timeout 60 /usr/bin/python3 - "$(server_sock srv)" "$(server_pid srv)" <<'EOF'
import errno, nbd, os, sys, time
sock, pid = sys.argv[1], int(sys.argv[2])
tick = os.sysconf("SC_CLK_TCK")

def cpu():
    # Fields after the ")" of the command name: utime and stime are the
    # 14th and 15th fields of the line, counting all threads.
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick

h = nbd.NBD()
h.connect_unix(sock)
c0, t0 = cpu(), time.monotonic()
try:
    h.pwrite(b"x" * 4096, 0)
    sys.exit("the write succeeded: no EAGAIN was injected?")
except nbd.Error as e:
    if e.errnum != errno.EIO:
        sys.exit("the write failed with %r, expected EIO" % e)
c1, t1 = cpu(), time.monotonic()
print("write failed with EIO after %.2f s; server CPU %.3f s"
      % (t1 - t0, c1 - c0))
if t1 - t0 < 2.5:
    sys.exit("gave up after %.2f s, requeue-timeout is 3 s" % (t1 - t0))
if c1 - c0 >= 0.2:
    sys.exit("the server used %.3f s of CPU while the backend was delayed"
             % (c1 - c0))
h.shutdown()
EOF

# No client left: the server exits at once and writes statsfile.
stop_server srv
cat "$tmp/stats.json"
/usr/bin/python3 - "$tmp/stats.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))["retry"]
if r["gave_up"] != 1:
    sys.exit("retry.gave_up %d, expected 1" % r["gave_up"])
if not 0 < r["timer_fired"] < 100:
    sys.exit("retry.timer_fired %d, expected 1..99" % r["timer_fired"])
print("timer fired %d times, eagain %d" % (r["timer_fired"], r["eagain"]))
EOF
