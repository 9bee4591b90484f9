#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Acknowledged writes are never dropped at a clean disconnect or at a
# graceful server exit (writeback mode: a reply means "we have it"; only
# SIGKILL or power loss may lose what no FLUSH covered).  Each case
# checks the backing file itself after the server exited (stop_server:
# SIGTERM, exit status 0):
#  1. contention for the one backend slot: max-inflight=1,
#     -D plug.backend_delay_us=500000, idle=10s direct=never.  Connection
#     A writes 64 KiB and sends FLUSH without waiting (its run takes the
#     slot for 0.5 s); connection B writes 64 KiB at 2 MiB (acknowledged)
#     and disconnects.  B's block must be in the file.
#  2. "not now" at close: -D plug.inject_eagain=2 (every 2nd backend
#     write fails with EAGAIN), idle=10s direct=never: 8 acknowledged
#     64 KiB writes, then a disconnect without FLUSH.  All 8 are in the
#     file.
#  3. SIGTERM of the server after a random-write workload of 4
#     connections, each in its own 2 MiB region, that stay connected
#     (they read every 10 ms, so that nbdkit 1.32 exits on SIGTERM) with
#     their acknowledged writes held (idle=10s max-delay=60s
#     direct=never max-inflight=1); once without injection and once with
#     inject_eagain=5.  Each client records every write that was
#     acknowledged; after the exit each 4 KiB block of the file holds
#     the last acknowledged write to it, or a write sent after that one
#     that was never acknowledged (it may have reached the file).
# No case asserts a duration; a sleep only makes the contention likely.
# Every case runs; the test fails at the end if any of them failed.
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/client.py" <<'EOF'
import json, nbd, os, random, sys, time
case, uri = sys.argv[1], sys.argv[2]
K = 1024
M = 1024 * K

if case == "contention":
    a = nbd.NBD()
    a.connect_uri(uri)
    a.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b"A" * (64 * K))), 0)
    fl = a.aio_flush()
    # Let A's unplugged run take the only slot (backend_delay_us=0.5 s).
    # Not asserted: a correct server keeps B's data whatever the order.
    time.sleep(0.1)
    b = nbd.NBD()
    b.connect_uri(uri)
    b.pwrite(b"B" * (64 * K), 2 * M)       # Acknowledged.
    pending = not a.aio_command_completed(fl)
    b.shutdown()                           # Clean disconnect, no FLUSH.
    print("B disconnected while A's FLUSH was %s"
          % ("still pending" if pending else "already answered"))
    while a.aio_in_flight() > 0:
        a.poll(-1)
    a.aio_command_completed(fl)            # Raises if the FLUSH failed.
    a.shutdown()

elif case == "eagain":
    h = nbd.NBD()
    h.connect_uri(uri)
    for i in range(8):
        h.pwrite(bytes([0x61 + i]) * (64 * K), i * 256 * K)
    h.shutdown()                           # Clean disconnect, no FLUSH.

elif case == "sigterm":
    # NWRITES random writes of 4..32 KiB (4 KiB aligned) at queue depth
    # 16 in [BASE, BASE+SIZE), never two overlapping ones in flight; then
    # it creates the file READY (the test sends SIGTERM once all clients
    # are ready) and reads every 10 ms until the server goes away.
    # Every write is logged in issue order with its outcome: LOG is JSON
    # [[offset, length, id, acked], ...].
    ready, log = sys.argv[3], sys.argv[4]
    nwrites, seed, base, size = (int(x) for x in sys.argv[5:9])
    rng = random.Random(seed)
    h = nbd.NBD()
    h.connect_uri(uri)
    writes = []
    inflight = {}

    def block(wid, blk):
        # 4 KiB block blk of write wid: identifiable and not torn.
        return (b"%08d:%08d;" % (wid, blk)) * (4096 // 18) + b"\n" * (4096 % 18)

    def done(i, wid):
        def cb(err):
            writes[i][3] = err.value == 0
            inflight.pop(wid, None)
            return 1
        return cb

    def overlaps(off, n):
        return any(off < o + c and o < off + n for o, c in inflight.values())

    try:
        while len(writes) < nwrites:
            while h.aio_in_flight() >= 16:
                h.poll(-1)
            n = rng.randrange(1, 9) * 4096
            off = base + rng.randrange(0, (size - n) // 4096) * 4096
            while overlaps(off, n):
                h.poll(-1)
            wid = len(writes) + seed * 1000000
            data = b"".join(block(wid, b) for b in range(off // 4096, (off + n) // 4096))
            writes.append([off, n, wid, None])
            inflight[wid] = (off, n)
            h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(data)), off,
                         completion=done(len(writes) - 1, wid))
        while h.aio_in_flight() > 0:
            h.poll(-1)
    except nbd.Error as e:
        sys.exit("client: the server went away during the workload: %s" % e)
    acked = sum(1 for w in writes if w[3])
    print("client: %d writes sent, %d acknowledged" % (len(writes), acked))
    json.dump(writes, open(log, "w"))
    open(ready, "w").close()
    try:
        while True:
            h.pread(4096, base)
            time.sleep(0.01)
    except nbd.Error as e:
        print("client: the server went away: %s" % e)
EOF

# check-sigterm.py IMG LOG...: every block holds its last acknowledged
# write, or a later one that was never acknowledged.
cat > "$tmp/check-sigterm.py" <<'EOF'
import json, sys
img, logs = sys.argv[1], sys.argv[2:]
d = open(img, "rb").read()
writes = [w for log in logs for w in json.load(open(log))]
per_block = {}
for off, n, wid, acked in writes:
    for b in range(off // 4096, (off + n) // 4096):
        per_block.setdefault(b, []).append((wid, bool(acked)))

def block(wid, blk):
    return (b"%08d:%08d;" % (wid, blk)) * (4096 // 18) + b"\n" * (4096 % 18)

lost = []
for b, ws in sorted(per_block.items()):
    last = max([i for i, (w, a) in enumerate(ws) if a], default=None)
    allowed = [block(w, b) for w, a in ws[last if last is not None else 0:]]
    if last is None:
        allowed.append(bytes(4096))         # Never acknowledged: may be old.
    got = d[b * 4096:(b + 1) * 4096]
    if got not in allowed:
        lost.append((b, ws[last][0] if last is not None else None, got[:18]))
acked = sum(1 for w in writes if w[3])
print("%d writes, %d acknowledged, %d blocks written" %
      (len(writes), acked, len(per_block)))
if lost:
    for b, w, got in lost[:10]:
        print("block %d (offset %d): acknowledged write #%s is missing, "
              "the file has %r" % (b, b * 4096, w, got))
    sys.exit("%d blocks lost an acknowledged write" % len(lost))
EOF

failed=()
kill_quietly () { kill -KILL "$@" 2>/dev/null || :; }

# 1. Contention for the one slot, clean disconnect of B.
img=$tmp/contention.img
truncate -s 4M "$img"
start_plug contention -D plug.backend_delay_us=500000 -- file="$img" \
           max-inflight=1 idle=10s direct=never
timeout 60 /usr/bin/python3 "$tmp/client.py" contention "$(server_uri contention)"
stop_server contention
grep -i 'drop' "$(server_log contention)" || :
/usr/bin/python3 - "$img" <<'EOF' || failed+=(contention)
import sys
d = open(sys.argv[1], "rb").read()
K, M = 1024, 1024 * 1024
bad = []
if d[:64 * K] != b"A" * (64 * K):
    bad.append("A's flushed block at 0 is not in the file")
if d[2 * M:2 * M + 64 * K] != b"B" * (64 * K):
    bad.append("B's acknowledged block at 2 MiB is not in the file "
               "(B disconnected while A's run had the only slot)")
if bad:
    sys.exit("contention: " + "; ".join(bad))
print("contention: both blocks are in the file")
EOF

# 2. EAGAIN at close.
img=$tmp/eagain.img
truncate -s 4M "$img"
start_plug eagain -D plug.inject_eagain=2 -- file="$img" idle=10s direct=never
timeout 60 /usr/bin/python3 "$tmp/client.py" eagain "$(server_uri eagain)"
stop_server eagain
grep -i 'drop' "$(server_log eagain)" || :
/usr/bin/python3 - "$img" <<'EOF' || failed+=(eagain)
import sys
d = open(sys.argv[1], "rb").read()
K = 1024
lost = [i for i in range(8)
        if d[i * 256 * K:i * 256 * K + 64 * K] != bytes([0x61 + i]) * (64 * K)]
if lost:
    sys.exit("eagain: %d of 8 acknowledged writes are not in the file "
             "(writes %r)" % (len(lost), lost))
print("eagain: all 8 acknowledged writes are in the file")
EOF

# 3. SIGTERM during a random-write workload of 4 connections.
for inject in 0 5; do
  name=sigterm-$inject
  img=$tmp/$name.img
  truncate -s 8M "$img"
  opts=()
  [ $inject -gt 0 ] && opts+=(-D plug.inject_eagain=$inject)
  start_plug $name "${opts[@]}" -- file="$img" direct=never max-inflight=1 \
             idle=10s max-delay=60s
  cpids=()
  for c in 1 2 3 4; do
    timeout 60 /usr/bin/python3 "$tmp/client.py" sigterm "$(server_uri $name)" \
            "$tmp/$name.ready$c" "$tmp/$name.log$c" 1000 $c \
            $(( (c - 1) * 2 << 20 )) $((2 << 20)) > "$tmp/$name.out$c" 2>&1 &
    cpids+=($!)
    cleanup_fn kill_quietly $!
  done
  for c in 1 2 3 4; do
    wait_for_file "$tmp/$name.ready$c" 60 || {
      cat "$tmp/$name.out$c"
      fail "$name: client $c did not get going"
    }
  done
  stop_server $name
  rc=0
  for p in "${cpids[@]}"; do wait $p || rc=$?; done
  cat "$tmp"/$name.out?
  test $rc -eq 0
  grep -i 'drop' "$(server_log $name)" | head -20 || :
  /usr/bin/python3 "$tmp/check-sigterm.py" "$img" "$tmp"/$name.log? ||
    failed+=($name)
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "$0: acknowledged writes lost in: ${failed[*]}"
  exit 1
fi
