#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A slow backend is no reason to drop acknowledged data: a close and
# the exit wait for it, and give a queued run up only when its file
# said "not now" (EAGAIN) for requeue-timeout= (test-give-up-close.sh),
# never because a run in flight is slow or the only slot is busy.
# Every case: -D plug.backend_delay_us=1500000 (each backend write
# takes 1.5 s, longer than requeue-timeout=1s), writeback mode with the
# writes held (direct=never idle=10s max-delay=60s), no FLUSH; the
# backing file itself is read after the server exited with status 0:
#  1. close: max-inflight=1, four 4 KiB writes 1 MiB apart (four runs
#     for the one slot, 6 s of backend time) acknowledged, then a clean
#     disconnect.  Once the close is over (the statsfile is written at
#     each close) the server gets SIGTERM.  All four blocks are in the
#     file and statsfile counts no loss.
#  2. sigterm: the same four writes, but the client stays connected
#     (it reads elsewhere every 10 ms: nbdkit 1.32 exits on SIGTERM
#     only then) and the server gets SIGTERM: the exit writes all four.
#  3. rewrites: default max-inflight and idle=, three rewrites A, B, C
#     of one 4 KiB block pipelined at the backend: each is acknowledged
#     before the next is sent (so that "newest" is the client's order:
#     nbdkit may hand requests in flight together to the plugin in any
#     order, as NBD allows), 0.1 s apart, so that each is unplugged on
#     its own (idle=1ms): A's run in flight, B's and C's queued behind
#     it; then a clean disconnect: the file ends with C, the newest
#     acknowledged version.
# No duration is asserted.  Every case runs; the test fails at the end
# if any of them failed.
# Able to fail: the plugin of commit 65665af (before the close and the
# exit waited for a slow backend) gives up three of the four runs at
# the close (1) and at the exit (2), "not written within requeue-timeout
# of the close", and keeps A, not C (3).
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/client.py" <<'EOF'
import nbd, sys, time
case, uri = sys.argv[1], sys.argv[2]
K = 1024
M = 1024 * K

def blocks():
    return [(i * M, bytes([0x61 + i]) * (4 * K)) for i in range(4)]

h = nbd.NBD()
h.connect_uri(uri)
if case == "close":
    for off, data in blocks():
        h.pwrite(data, off)               # Acknowledged: held in the plug.
    h.shutdown()                          # Clean disconnect, no FLUSH.
elif case == "sigterm":
    ready = sys.argv[3]
    for off, data in blocks():
        h.pwrite(data, off)
    open(ready, "w").close()
    try:
        while True:
            h.pread(4 * K, 6 * M)
            time.sleep(0.01)
    except nbd.Error as e:
        print("client: the server went away: %s" % e)
elif case == "rewrites":
    for c in (b"A", b"B", b"C"):
        h.pwrite(c * (4 * K), 0)          # Acknowledged.
        time.sleep(0.1)                   # Unplugged on its own (idle).
    h.shutdown()
print("client %s: done" % case)
EOF

# check.py IMG CASE: the blocks the case wrote are in the file.
cat > "$tmp/check.py" <<'EOF'
import sys
img, case = sys.argv[1:3]
K = 1024
M = 1024 * K
d = open(img, "rb").read()
if case == "rewrites":
    got = d[:4 * K]
    names = {b"A" * 4 * K: "A", b"B" * 4 * K: "B", b"C" * 4 * K: "C",
             bytes(4 * K): "nothing"}
    print("rewrites: the block holds %s" % names.get(got, "torn data"))
    if got != b"C" * 4 * K:
        sys.exit("rewrites: the file holds %s, not C, the newest "
                 "acknowledged write" % names.get(got, "torn data"))
    sys.exit(0)
missing = [i for i in range(4) if d[i * M:i * M + 4 * K] != bytes([0x61 + i]) * (4 * K)]
print("%s: %d of 4 acknowledged blocks in the file" % (case, 4 - len(missing)))
if missing:
    sys.exit("%s: acknowledged blocks missing from the file at offsets %s"
             % (case, ", ".join("%d MiB" % i for i in missing)))
EOF

# lost.py STATSFILE: print and check statsfile's count of lost writes.
cat > "$tmp/lost.py" <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
print("statsfile: retry %s" % st["retry"])
if st["retry"]["lost"] or st["retry"]["gave_up"]:
    sys.exit("statsfile counts %d lost writes, %d runs given up"
             % (st["retry"]["lost"], st["retry"]["gave_up"]))
EOF

failed=()
kill_quietly () { kill -KILL "$@" 2>/dev/null || :; }
# After case NAME: stop its server, then check its statsfile and file.
check_case ()
{
  stop_server "$1"
  /usr/bin/python3 "$tmp/lost.py" "$tmp/$1.json" || failed+=("$1-stats")
  /usr/bin/python3 "$tmp/check.py" "$tmp/$1.img" "$1" || failed+=("$1")
}
slow=(-D plug.backend_delay_us=1500000)
held=(direct=never idle=10s max-delay=60s requeue-timeout=1s)

# 1. Close.
img=$tmp/close.img
truncate -s 8M "$img"
start_plug close "${slow[@]}" -- file="$img" "${held[@]}" max-inflight=1 \
           stats-file="$tmp/close.json"
timeout 60 /usr/bin/python3 "$tmp/client.py" close "$(server_uri close)"
wait_closes "$tmp/close.json" 1   # The close is over once it published.
check_case close

# 2. SIGTERM with the client still connected.
img=$tmp/sigterm.img
truncate -s 8M "$img"
start_plug sigterm "${slow[@]}" -- file="$img" "${held[@]}" max-inflight=1 \
           stats-file="$tmp/sigterm.json"
timeout 60 /usr/bin/python3 "$tmp/client.py" sigterm "$(server_uri sigterm)" \
        "$tmp/sigterm.ready" &
cpid=$!
cleanup_fn kill_quietly $cpid
wait_for_file "$tmp/sigterm.ready" 60 || fail "sigterm: the client did not write"
check_case sigterm
wait $cpid

# 3. Three pipelined rewrites of one block.
img=$tmp/rewrites.img
truncate -s 8M "$img"
start_plug rewrites "${slow[@]}" -- file="$img" direct=never \
           requeue-timeout=1s stats-file="$tmp/rewrites.json"
timeout 60 /usr/bin/python3 "$tmp/client.py" rewrites "$(server_uri rewrites)"
wait_closes "$tmp/rewrites.json" 1
check_case rewrites

for name in close sigterm rewrites; do
  grep -iE 'lost|gave|give|drop|error' "$(server_log $name)" || :
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "$0: failed: ${failed[*]}"
  exit 1
fi
