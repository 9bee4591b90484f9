#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# FLUSHes share syncs (group commit, SYNCS BELONG TO THE ENGINE): the
# FLUSHes that wait while a sync runs share the next one, so N
# connections flushing at once over one dirty file cost fewer than N
# fdatasync calls; and every FLUSH still waits for its own horizon.
# tests/shim-fdatasync.so holds the backing file's syncs while its
# control file says "hold", so that the FLUSHes surely pile up behind
# the first sync whatever the machine's speed.  Writeback mode, writes
# held (direct=never idle=10s max-delay=60s); the server runs under
# strace -ff (fdatasync, fsync and the writes, with times and paths).
#  1. Group: N=4 connections.  Connection 0 writes 4 KiB at 0 and sends
#     a FLUSH: its sync is held.  Then each connection i of 1..3 writes
#     4 KiB at i MiB and sends a FLUSH; once its block is in the file
#     (its FLUSH wrote it and waits for a sync).  No FLUSH is answered
#     while the sync is held.  The shim lets it go: every FLUSH
#     succeeds, and when each returns its connection's block is in the
#     file (read directly).  Counted three ways, each fewer than N: the
#     shim's calls, strace's fdatasync calls on the file, statsfile's
#     backend.sync.ops; statsfile's synced_answers counts all N.
#  2. Horizon: 4 connections at once (a thread each), 25 times each:
#     write its own 4 KiB block (new data each time), FLUSH, read the
#     file: it holds that data.  And strace shows, for each FLUSH, an
#     fdatasync of the file that began after the write of that block
#     returned and before the FLUSH's reply (one clock: strace -ttt and
#     the client's time.time()).  Not counted: whether these overlap
#     depends on the machine.
#  3. The server exits with status 0.
# Counts and order only, never durations.
# Able to fail: the plugin of commit 65665af (each FLUSH worker syncs
# for itself) makes 4 syncs in case 1.
source ./functions.sh
set -e
set -x

requires_python_nbd
requires strace -ff -o /dev/null true
test -f "$SHIM_FDATASYNC" || fail "$SHIM_FDATASYNC not built"

plug_tmpdir

cat > "$tmp/client.py" <<'EOF'
import json, nbd, plugtest, sys, threading, time
from plugtest import in_file, number, set_control, wait_until
uri, img, control, count, statsfile, out = sys.argv[1:7]
N = 4
K = 1024
M = 1024 * K
bad = []
events = []                     # [conn, off, sent, replied]

def data(i, n):
    return ((b"conn %d write %04d;" % (i, n)) * 4 * K)[:4 * K]

# 1. Group.
hs = []
for i in range(N):
    h = nbd.NBD()
    h.connect_uri(uri)
    hs.append(h)
cookies = []
for i, h in enumerate(hs):
    sent = time.time()
    h.pwrite(data(i, 0), i * M)             # Acknowledged, held.
    cookies.append(h.aio_flush())
    if i == 0:
        wait_until("connection 0's sync is held",
                   lambda: number(count) >= 1, hs)
    else:
        wait_until("connection %d's block is in the file" % i,
                   lambda: in_file(img, i * M, 4 * K) == data(i, 0), hs)
    events.append([i, i * M, sent, None])
time.sleep(0.2)                 # Let the last FLUSH wait for a sync.
for i, h in enumerate(hs):
    h.poll(0)
    if h.aio_in_flight() == 0:
        bad.append("group: connection %d's FLUSH was answered while the "
                   "sync was held" % i)
held = number(count)
set_control(control, "ok")
pending = set(range(N))
while pending:
    for i in list(pending):
        hs[i].poll(0)
        if hs[i].aio_command_completed(cookies[i]):   # Raises if it failed.
            events[i][3] = time.time()
            pending.discard(i)
            if in_file(img, i * M, 4 * K) != data(i, 0):
                bad.append("group: connection %d's FLUSH returned before its "
                           "write was in the file" % i)
    time.sleep(0.001)
for h in hs:
    h.shutdown()
st = plugtest.stats_after(statsfile, N)
syncs = number(count)
answers = st.get("synced_answers", 0)
print("group: %d FLUSHes; syncs entered while held: %d; the shim's sync "
      "calls: %d; statsfile backend.sync.ops %d, synced_answers %d"
      % (N, held, syncs, st["backend"]["sync"]["ops"], answers))
if syncs >= N:
    bad.append("group: %d FLUSHes made %d syncs (shim), expected fewer"
               % (N, syncs))
if st["backend"]["sync"]["ops"] >= N:
    bad.append("group: %d FLUSHes made %d syncs (statsfile), expected fewer"
               % (N, st["backend"]["sync"]["ops"]))
if answers < N:
    bad.append("group: synced_answers %d, expected at least %d"
               % (answers, N))
group_end = time.time()

# 2. Horizon.
ROUNDS = 25
def worker(i):
    h = nbd.NBD()
    h.connect_uri(uri)
    for n in range(1, ROUNDS + 1):
        sent = time.time()
        h.pwrite(data(i, n), i * M)
        h.flush()
        replied = time.time()
        if in_file(img, i * M, 4 * K) != data(i, n):
            bad.append("horizon: connection %d's FLUSH %d returned before "
                       "its write was in the file" % (i, n))
        events.append([i, i * M, sent, replied])
    h.shutdown()
ts = [threading.Thread(target=worker, args=(i,)) for i in range(N)]
for t in ts:
    t.start()
for t in ts:
    t.join()
st = plugtest.stats_after(statsfile, 2 * N)
print("horizon: %d FLUSHes, statsfile backend.sync.ops %d in all "
      "(printed, not checked)" % (N * ROUNDS, st["backend"]["sync"]["ops"]))
json.dump({"events": events, "group_end": group_end}, open(out, "w"))
if bad:
    sys.exit("\n".join(bad))
EOF

# check.py STRACE-DIR IMG EVENTS N: strace's count of the group's syncs,
# and a sync after each FLUSH's write, before its reply.
cat > "$tmp/check.py" <<'EOF'
import json, plugtest, sys
tdir, img, evfile, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ev = json.load(open(evfile))
writes, syncs, _ = plugtest.backing_calls(tdir, img)
group = [t for t in syncs if t <= ev["group_end"]]
print("strace: %d fdatasync/fsync calls of the backing file in the group "
      "(%d FLUSHes), %d in all" % (len(group), n, len(syncs)))
bad = []
if len(group) >= n:
    bad.append("group: %d FLUSHes made %d syncs (strace), expected fewer"
               % (n, len(group)))
for conn, off, sent, replied in ev["events"]:
    # The write of this FLUSH's block: after the request was sent.
    ends = [end for end, o, c in writes
            if sent <= end <= replied and o <= off and off + 4096 <= o + c]
    ok = ends and any(min(ends) < t <= replied for t in syncs)
    if not ok:
        bad.append("connection %d: no sync of the file between the write "
                   "of its block (at %d) and its FLUSH's reply at %.6f%s"
                   % (conn, off, replied,
                      "" if ends else " (no write of the block seen)"))
print("%d FLUSHes each answered after a sync that began after their "
      "write" % (len(ev["events"]) - len(bad)))
if bad:
    sys.exit("\n".join(bad[:10]))
EOF

img=$tmp/disk.img
truncate -s 8M "$img"
echo hold > "$tmp/ctl"
mkdir "$tmp/st"
wrap="strace -ff -qq -ttt -T -y -s 0 -o $tmp/st/t"
wrap+=" -e trace=fdatasync,fsync,pwrite64,pwritev,pwritev2,fallocate"
wrap+=" env LD_PRELOAD=$SHIM_FDATASYNC SHIM_PATH=$img SHIM_CONTROL=$tmp/ctl"
wrap+=" SHIM_COUNT=$tmp/calls"
SERVER_WRAP=$wrap start_plug group file="$img" direct=never idle=10s \
                             max-delay=60s stats-file="$tmp/stats.json"
run_client group 300 "$tmp/client.py" "$img" "$tmp/ctl" "$tmp/calls" \
           "$tmp/stats.json" "$tmp/events.json"
echo ok > "$tmp/ctl"            # A failed client may have left a sync held.
end_client group
/usr/bin/python3 "$tmp/check.py" "$tmp/st" "$img" "$tmp/events.json" 4
