#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# The timer thread writes what its unplugs made for a fast local file
# itself (it waits next anyway, as the kernel's task flushes its own
# plug when it sleeps) instead of waking an I/O pool thread for it.
# One client writes 16 requests 1 MiB apart (the direct path: each
# measured as fast on a file in $tmp), then 12 batches of 4 adjacent 4
# KiB writes, each batch followed by a pause longer than idle=, so
# that a timer unplugs it.  The statsfile counts hand-offs to the pool
# ("pooled"):
#  * the file as it is: none (each timer unplug is written by the timer
#    thread);
#  * -D plug.backend_delay_us=2000 (every backend write takes 2 ms, far
#    more than BACKING_FAST_RUN_NS): the timer's runs go to the pool,
#    at least one per batch the timer unplugged.
# The data must be in the file, and every server must exit 0.
source ./functions.sh
set -e

requires test -x /usr/bin/python3
requires jq --version
test -f "$PLUGIN"

plug_tmpdir

client ()
{
  nbdsh_sys -u "$1" -c "
import time
for i in range(16):
    h.pwrite(b'w' * 4096, (32 + i) << 20)
for b in range(12):
    for k in range(4):
        h.pwrite(b'%c' % (65 + b) * 4096, (b << 20) + k * 4096)
    time.sleep(0.05)
h.flush()
for b in range(12):
    assert h.pread(16384, b << 20) == b'%c' % (65 + b) * 16384, b
"
}

# check NAME: prints "pooled timer-unplugs".
counts ()
{
  jq -r '"\(.pooled) \(.unplugs.idle + .unplugs["max-delay"])"' "$tmp/$1.json"
}

truncate -s 64M "$tmp/disk"
start_plug fast "$tmp/disk" stats-file="$tmp/fast.json"
client "$(server_uri fast)"
stop_server fast
read -r pooled timer < <(counts fast)
echo "fast: $pooled runs pooled, $timer timer unplugs"
[ "$timer" -ge 1 ] || fail "fast: no timer unplug: the test did not test"
[ "$pooled" -eq 0 ] || fail "fast: $pooled runs handed to the pool"

start_plug slow -D plug.backend_delay_us=2000 -- "$tmp/disk" \
           stats-file="$tmp/slow.json"
client "$(server_uri slow)"
stop_server slow
read -r pooled timer < <(counts slow)
echo "slow: $pooled runs pooled, $timer timer unplugs"
[ "$timer" -ge 1 ] || fail "slow: no timer unplug: the test did not test"
[ "$pooled" -ge "$timer" ] ||
  fail "slow: $pooled runs pooled for $timer timer unplugs"
echo "PASS"
