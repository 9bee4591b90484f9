#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Multi-conn: a FLUSH on one connection covers the writes acknowledged
# on every connection, so it unplugs every connection's plug, not only
# its own.  Writeback mode with idle=10s max-delay=60s direct=never: an
# acknowledged write stays in its plug until something unplugs it (a
# FLUSH that waits for a plug it did not unplug is answered once idle=
# has unplugged it, and the statistics tell).
# Two connections to one server, both open throughout:
#  - A writes 64 KiB at 0 (acknowledged, held in A's plug), B writes
#    64 KiB at 256 KiB; the backing file itself (read directly, not
#    through the server) holds neither yet;
#  - B sends a FLUSH; once it is answered, the file holds both writes,
#    while A, idle, has sent nothing since its write;
#  - statsfile: two plugs unplugged by the FLUSH (A's and B's), none by
#    a timer, and backend.sync.ops grew with B's connection;
#  - strace -ff -ttt -T -y: between B sending the FLUSH and getting its
#    reply, the server entered fdatasync or fsync on the backing file
#    after the pwrite calls that put both writes there had returned.
#    (Order through the one system clock strace and the client both
#    read: no duration is asserted.)
# Shown able to fail: with submit_flush (src/engine-durable.c) unplugging only
# the flushing connection's plug, "1 plugs unplugged by the FLUSH,
# expected 2 (A's and B's)" and "a timer unplugged: idle 1" (the FLUSH
# waited for A's idle timer).
source ./functions.sh
set -e
set -x

requires_python_nbd
requires strace -ff -o /dev/null true

plug_tmpdir

img=$tmp/disk.img
/usr/bin/python3 -c 'import sys; open(sys.argv[1], "wb").write(b"A" * (1 << 20))' "$img"

# client.py URI IMG STATSFILE EVENTS
cat > "$tmp/client.py" <<'EOF'
import json, nbd, plugtest, sys, time
uri, img, statsfile, out = sys.argv[1:5]
K = 65536

def in_file(off):
    with open(img, "rb") as f:
        f.seek(off)
        return f.read(K)

def stats_after(n):
    return plugtest.stats_after(statsfile, n)

a = nbd.NBD()
a.connect_uri(uri)
b = nbd.NBD()
b.connect_uri(uri)
a.pwrite(b"B" * K, 0)
b.pwrite(b"C" * K, 4 * K)
if in_file(0) != b"A" * K or in_file(4 * K) != b"A" * K:
    sys.exit("the writes are in the file before any FLUSH: nothing held "
             "them, so this test shows nothing")
t1 = time.time()
b.flush()
t2 = time.time()
bad = []
if in_file(0) != b"B" * K:
    bad.append("after B's FLUSH was answered, A's acknowledged write is not "
               "in the file (it holds %r...)" % in_file(0)[:8])
if in_file(4 * K) != b"C" * K:
    bad.append("after B's FLUSH was answered, B's own write is not in the "
               "file (it holds %r...)" % in_file(4 * K)[:8])
json.dump({"start": t1, "end": t2}, open(out, "w"))
b.shutdown()
sb = stats_after(1)
a.shutdown()
st = stats_after(2)
u = st["unplugs"]
print("B's connection: client.flush %r backend.sync %r"
      % (sb["client"]["flush"], sb["backend"]["sync"]))
print("unplugs %r" % u)
if sb["client"]["flush"]["ops"] != 1:
    bad.append("client.flush.ops %d on B's connection, expected 1"
               % sb["client"]["flush"]["ops"])
if sb["backend"]["sync"]["ops"] < 1:
    bad.append("backend.sync.ops did not grow with B's FLUSH")
if u["flush"] != 2:
    bad.append("%d plugs unplugged by the FLUSH, expected 2 (A's and B's)"
               % u["flush"])
if u["idle"] or u["max-delay"]:
    bad.append("a timer unplugged: idle %d, max-delay %d"
               % (u["idle"], u["max-delay"]))
if bad:
    sys.exit("\n".join(bad))
EOF

# check.py STRACE-DIR IMG EVENTS: the order of the system calls.
cat > "$tmp/check.py" <<'EOF'
import json, plugtest, sys
tdir, img, events = sys.argv[1:4]
ev = json.load(open(events))
K = 65536
writes, syncs, _ = plugtest.backing_calls(tdir, img)
print("backing file %s: %d pwrite calls, %d syncs"
      % (img, len(writes), len(syncs)))

def written_by(off):
    """When the call that wrote [off, off+K) returned, or None."""
    ends = [end for end, o, n in writes if o <= off and off + K <= o + n]
    return min(ends) if ends else None

inside = [t for t in syncs if ev["start"] <= t <= ev["end"]]
done = [written_by(0), written_by(4 * K)]
print("B's FLUSH: %d syncs while it was answered; A's write written at %s, "
      "B's at %s" % (len(inside), done[0], done[1]))
if not inside:
    sys.exit("no fdatasync or fsync of the backing file between B's FLUSH "
             "and its reply")
if None in done or not [t for t in inside if t > max(done)]:
    sys.exit("no sync of the backing file during B's FLUSH after both "
             "writes were written")
EOF

mkdir "$tmp/st"
SERVER_WRAP="strace -ff -qq -ttt -T -y -s 0 -o $tmp/st/t -e trace=fdatasync,fsync,pwrite64,pwritev,pwritev2" \
  start_plug srv file="$img" mode=writeback idle=10s max-delay=60s \
             direct=never stats-file="$tmp/stats.json"
timeout 60 /usr/bin/python3 "$tmp/client.py" "$(server_uri srv)" "$img" \
        "$tmp/stats.json" "$tmp/events"
stop_server srv
/usr/bin/python3 "$tmp/check.py" "$tmp/st" "$img" "$tmp/events"
