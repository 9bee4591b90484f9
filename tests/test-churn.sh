#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Connection churn with runs in flight: 64 connections (4 clients, 16
# connections each, one after another) open, write, and go away while
# their writes are held or being written: -D plug.backend_delay_us=2000
# (every backend write takes 2 ms more), max-inflight=4 (the connections
# contend for the file's slots), direct=never (every write goes through
# the plug).  Each connection writes 32 random 4..32 KiB writes at queue
# depth 8 to its own 256 KiB region and leaves without a FLUSH: cleanly
# (NBD_CMD_DISC) or, every third one, by closing its socket.  Both modes.
# Run under whatever sanitizer the build has (stop_server fails on a
# report or a crash).  After the server exited, every 4 KiB block of
# the file holds the last acknowledged write to it, or a write sent
# after that one that was never acknowledged.
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/client.py" <<'EOF'
import json, nbd, random, sys
uri, me, nconn, log = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
R = 256 * 1024
rng = random.Random(me)
writes = []

def block(wid, blk):
    return (b"%08d:%08d;" % (wid, blk)) * (4096 // 18) + b"\n" * (4096 % 18)

for j in range(nconn):
    region = me * nconn + j
    base = region * R
    h = nbd.NBD()
    h.connect_uri(uri)
    inflight = {}

    def done(i, key):
        def cb(err):
            writes[i][3] = err.value == 0
            inflight.pop(key, None)
            return 1
        return cb

    for k in range(32):
        while h.aio_in_flight() >= 8:
            h.poll(-1)
        n = rng.randrange(1, 9) * 4096
        off = base + rng.randrange(0, (R - n) // 4096) * 4096
        while any(off < o + c and o < off + n for o, c in inflight.values()):
            h.poll(-1)
        wid = region * 1000 + k
        data = b"".join(block(wid, b) for b in range(off // 4096, (off + n) // 4096))
        writes.append([off, n, wid, None])
        inflight[wid] = (off, n)
        h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(data)), off,
                     completion=done(len(writes) - 1, wid))
    while h.aio_in_flight() > 0:
        h.poll(-1)
    if j % 3 == 2:
        del h                   # Socket closed, no NBD_CMD_DISC.
    else:
        h.shutdown()            # NBD_CMD_DISC, no FLUSH.
        del h
json.dump(writes, open(log, "w"))
bad = [w for w in writes if not w[3]]
print("client %d: %d connections, %d writes, %d not acknowledged"
      % (me, nconn, len(writes), len(bad)))
EOF

cat > "$tmp/check.py" <<'EOF'
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
        allowed.append(bytes(4096))
    got = d[b * 4096:(b + 1) * 4096]
    if got not in allowed:
        lost.append((b, ws[last][0] if last is not None else None, got[:18]))
print("%d writes, %d acknowledged, %d blocks written"
      % (len(writes), sum(1 for w in writes if w[3]), len(per_block)))
for b, w, got in lost[:10]:
    print("block %d (offset %d): acknowledged write #%s is missing, the file "
          "has %r" % (b, b * 4096, w, got))
if lost:
    sys.exit("%d blocks lost an acknowledged write" % len(lost))
EOF

kill_quietly () { kill -KILL "$@" 2>/dev/null || :; }

failed=()
for mode in writeback hold; do
  img=$tmp/$mode.img
  truncate -s 16M "$img"
  start_plug $mode -D plug.backend_delay_us=2000 -- file="$img" mode=$mode \
             max-inflight=4 direct=never stats-file="$tmp/$mode.json"
  pids=()
  for c in 0 1 2 3; do
    timeout 120 /usr/bin/python3 "$tmp/client.py" "$(server_uri $mode)" $c 16 \
            "$tmp/$mode.log$c" &
    pids+=($!)
    cleanup_fn kill_quietly $!
  done
  rc=0
  for p in "${pids[@]}"; do wait $p || rc=1; done
  [ $rc -eq 0 ] || { server_running $mode; fail "$mode: a client failed"; }
  stop_server $mode
  grep -iE 'drop|error' "$(server_log $mode)" | head -10 || :
  /usr/bin/python3 -c 'import json, sys
st = json.load(open(sys.argv[1]))
print("connections %d, retry %r" % (st["connections"], st["retry"]))
assert st["connections"] == 64, st["connections"]' "$tmp/$mode.json"
  /usr/bin/python3 "$tmp/check.py" "$img" "$tmp"/$mode.log? || failed+=($mode)
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "$0: acknowledged writes lost in: ${failed[*]}"
  exit 1
fi
