#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-unplug-debug.sh - -D plug.unplug=1 names the connection of every
# unplug, also of those the timer thread makes, whose lines nbdkit
# prefixes with no connection ("nbdkit: debug: ..." rather than
# "nbdkit: plug[N]: debug: ...").
#
# Two connections each hold one 4 KiB write (direct=never, idle=50ms,
# max-delay=60s): the timer thread unplugs each at idle.  The log must
# have "connection 1: unplug idle: 1 requests 4096 bytes" and the same
# for connection 2, both on the timer thread's unprefixed lines, and
# every unplug line must name its connection.  The server must exit 0.
# Shown able to fail: without the engine's "connection N: " prefix,
# "no timer-thread unplug line for connection 1".
source ./functions.sh
set -e
set -x

requires_python_nbd
plug_tmpdir

truncate -s 1M "$tmp/img"
start_plug dbg -v -D plug.unplug=1 -- file="$tmp/img" direct=never \
           idle=50ms max-delay=60s
log=$(server_log dbg)

timeout 120 /usr/bin/python3 - "$(server_uri dbg)" "$log" <<'EOF'
import nbd, re, sys, time
uri, log = sys.argv[1:3]
a = nbd.NBD(); a.connect_uri(uri)
b = nbd.NBD(); b.connect_uri(uri)
a.pwrite(b"a" * 4096, 0)
b.pwrite(b"b" * 4096, 65536)
# Both plugs go out at idle=50ms; wait for the two lines (the timeout
# above bounds the wait, nothing here measures time).
while len(re.findall(r"unplug idle", open(log).read())) < 2:
    time.sleep(0.05)
a.flush(); b.flush()
a.shutdown(); b.shutdown()
EOF
stop_server dbg
grep 'unplug' "$log"

for id in 1 2; do
  grep -qE "^nbdkit: debug: connection $id: unplug idle: 1 requests 4096 bytes -> 1 runs$" "$log" ||
    fail "no timer-thread unplug line for connection $id"
done
if grep -E 'debug: .*unplug [a-z-]+:' "$log" |
     grep -vE 'debug: connection [0-9]+: unplug [a-z-]+:'; then
  fail "the unplug lines above do not name their connection"
fi
