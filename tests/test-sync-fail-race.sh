#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Two connections' FLUSHes race over a sync that fails once: both fail,
# and so does every later FLUSH until the data is written again.  A
# failed fdatasync means the pages written since the last good one may
# never reach the disk (and Linux reports that once per open file: the
# next fdatasync may succeed over them), so the engine records what the
# sync covered as lost (SYNCS BELONG TO THE ENGINE, THE RECORD).
# tests/shim-fdatasync.so holds the syncs of the backing file while its
# control file says "hold", then fails the first one with EIO
# ("fail-once").  Writeback mode, writes held (direct=never idle=10s
# max-delay=60s):
#  1. connection 1 writes 4 KiB of "a" at 0 (acknowledged) and sends a
#     FLUSH, whose sync the shim holds;
#  2. meanwhile connection 2 writes 4 KiB of "b" at 1 MiB (acknowledged)
#     and sends a FLUSH; once connection 2's block is in the file (its
#     FLUSH wrote it during the held sync, and waits for the next one),
#     the shim lets the held sync go, failing it: both FLUSHes fail with
#     EIO (connection 2's horizon covers "a", and "b" was written since
#     the last successful sync);
#  3. connection 3, opened afterwards, and connection 1 send a FLUSH
#     each: both fail with EIO (nothing was written again);
#  4. connection 3 writes "A" at 0 again: its FLUSH still fails ("b" is
#     lost too); it writes "B" at 1 MiB again: its FLUSH and connection
#     1's succeed, and the file holds the rewrites;
#  5. the shim failed exactly one sync; the server exits with status 0.
# Order and counts only, no duration: a sleep (0.5 s) lets the engine
# see connection 2's write finish, microseconds after its data is in
# the file, before the held sync fails.
# Able to fail: with the plugin of commit 65665af (each FLUSH worker
# syncs for itself, one deferred error) both FLUSHes' syncs are held
# and exactly one of them fails: the other FLUSH succeeds.
source ./functions.sh
set -e
set -x

requires_python_nbd
test -f "$SHIM_FDATASYNC" || fail "$SHIM_FDATASYNC not built"

plug_tmpdir

cat > "$tmp/client.py" <<'EOF'
import nbd, plugtest, sys, time
from plugtest import answer, check, check_flush, in_file, number, \
    set_control, wait_until
uri, img, control, count = sys.argv[1:5]
K = 1024
M = 1024 * K
bad = []

h1, h2 = nbd.NBD(), nbd.NBD()
h1.connect_uri(uri)
h2.connect_uri(uri)
h1.pwrite(b"a" * (4 * K), 0)

# 1, 2. The race.
c1 = h1.aio_flush()
wait_until("connection 1's sync is held", lambda: number(count) >= 1, [h1])
h2.pwrite(b"b" * (4 * K), M)
c2 = h2.aio_flush()
wait_until("connection 2's block is in the file",
           lambda: in_file(img, M, 4 * K) == b"b" * (4 * K), [h1, h2])
# Let the engine see that write finish (microseconds after its data is
# in the file) before the held sync fails: step 4 counts on "b" being
# written during that sync.
time.sleep(0.5)
for i, (h, c) in enumerate(((h1, c1), (h2, c2)), 1):
    h.poll(0)
    if h.aio_in_flight() == 0:
        bad.append("connection %d's FLUSH was answered while the sync "
                   "was held" % i)
print("syncs entered while held: %d" % number(count))
set_control(control, "fail-once")
for i, (h, c) in enumerate(((h1, c1), (h2, c2)), 1):
    check(bad, "connection %d, FLUSH in the race" % i, answer(h, c), "EIO",
          "a sync covering its horizon failed")

# 3. Later FLUSHes.
h3 = nbd.NBD()
h3.connect_uri(uri)
check_flush(h3, "connection 3 (opened afterwards), FLUSH", "EIO", bad)
check_flush(h1, "connection 1, FLUSH after the race", "EIO", bad)

# 4. Written again.
h3.pwrite(b"A" * (4 * K), 0)
check_flush(h3, "connection 3, FLUSH after only the block at 0 was written "
            "again", "EIO", bad)
h3.pwrite(b"B" * (4 * K), M)
check_flush(h3, "connection 3, FLUSH after both blocks were written again",
            "ok", bad)
check_flush(h1, "connection 1, FLUSH after both blocks were written again",
            "ok", bad)
if (in_file(img, 0, 4 * K) != b"A" * (4 * K) or
        in_file(img, M, 4 * K) != b"B" * (4 * K)):
    bad.append("the file does not hold the rewrites")
for h in (h1, h2, h3):
    h.shutdown()
plugtest.verdict(bad, "every FLUSH told the truth")
EOF

img=$tmp/disk.img
truncate -s 4M "$img"
echo hold > "$tmp/ctl"
wrap="env LD_PRELOAD=$SHIM_FDATASYNC SHIM_PATH=$img SHIM_CONTROL=$tmp/ctl"
wrap+=" SHIM_ERRNO=5 SHIM_COUNT=$tmp/calls SHIM_FAILED=$tmp/failed" # EIO
SERVER_WRAP=$wrap start_plug race file="$img" direct=never idle=10s \
                             max-delay=60s
run_client race 120 "$tmp/client.py" "$img" "$tmp/ctl" "$tmp/calls"
echo ok > "$tmp/ctl"            # A failed client may have left a sync held.
end_client race
cat "$(server_log race)"
calls=$(cat "$tmp/calls" 2>/dev/null || echo 0)
failed=$(cat "$tmp/failed" 2>/dev/null || echo 0)
echo "syncs of the backing file: $calls, failed: $failed"
[ "$failed" -eq 1 ] || fail "the shim failed $failed syncs, expected 1"
