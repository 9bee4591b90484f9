#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Backend "not now" (EAGAIN) is retried, never lost: with
# -D plug.inject_eagain=N (every Nth backend write fails with EAGAIN) for
# N = 2, 7, 50, in both modes, a workload of random writes, reads and
# flushes reads back what it wrote and leaves it in the file, and
# statsfile shows retries (retry.eagain > 0; the delayed queue rerun by
# its timer or, with other runs in flight, restarted by their completion
# as blk-mq does: timer_fired + restarted > 0, and at N = 2 the timer
# itself fires) and no failure (gave_up == 0, errors == 0).
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

# Random writes and reads (4K..32K, 4K aligned) at queue depth 8, never
# two overlapping ones in flight, reads checked against the reference;
# a flush every 100 operations.
cat > "$tmp/client.py" <<'EOF'
import nbd, random, sys
uri, img, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
size = 4 << 20
nops = 400
qd = 8
rng = random.Random(seed)
ref = bytearray(open(img, "rb").read())
h = nbd.NBD()
h.connect_uri(uri)
inflight = {}                   # cookie -> (offset, count)
errs = []
checks = []                     # (offset, expected bytes, buffer)

def overlaps(off, n):
    return any(off < o + c and o < off + n for o, c in inflight.values())

def done_cb(key):
    def cb(err):
        if err.value:
            errs.append((key, err.value))
        inflight.pop(key, None)
        return 1
    return cb

key = 0
for i in range(nops):
    while h.aio_in_flight() >= qd:
        h.poll(-1)
    n = rng.randrange(1, 9) * 4096
    off = rng.randrange(0, (size - n) // 4096) * 4096
    while overlaps(off, n):
        h.poll(-1)
    key += 1
    inflight[key] = (off, n)
    if rng.random() < 0.7:
        data = bytearray(rng.randbytes(n))
        ref[off:off + n] = data
        h.aio_pwrite(nbd.Buffer.from_bytearray(data), off,
                     completion=done_cb(key))
    else:
        buf = nbd.Buffer(n)
        checks.append((off, bytes(ref[off:off + n]), buf))
        h.aio_pread(buf, off, completion=done_cb(key))
    if i % 100 == 99:
        while h.aio_in_flight() > 0:
            h.poll(-1)
        h.flush()
while h.aio_in_flight() > 0:
    h.poll(-1)
h.flush()
if errs:
    sys.exit("errors: %r" % errs[:10])
for off, want, buf in checks:
    if buf.to_bytearray() != want:
        sys.exit("read at %d returned wrong data" % off)
if h.pread(size, 0) != ref:
    sys.exit("final read differs from the reference")
if open(img, "rb").read() != ref:
    sys.exit("the file differs from the reference after flush")
print("%d ops, %d reads checked" % (nops, len(checks)))
h.shutdown()
EOF

for mode in writeback hold; do
  for n in 2 7 50; do
    img=$tmp/$mode-$n.img
    json=$tmp/$mode-$n.json
    /usr/bin/python3 -c 'import random, sys
open(sys.argv[1], "wb").write(random.Random(9).randbytes(4 << 20))' "$img"
    start=$(date +%s%N)
    start_plug $mode-$n -D plug.inject_eagain=$n -- file="$img" mode=$mode \
               stats-file="$json"
    timeout 60 /usr/bin/python3 $tmp/client.py "$(server_uri $mode-$n)" $img $n
    stop_server $mode-$n
    end=$(date +%s%N)
    /usr/bin/python3 - "$json" "$mode inject_eagain=$n" <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
r = st["retry"]
print("%s: retry %r backend.write %r" % (sys.argv[2], r, st["backend"]["write"]))
bad = []
if r["eagain"] == 0: bad.append("retry.eagain == 0")
if r["timer_fired"] + r["restarted"] == 0:
    bad.append("retry.timer_fired + retry.restarted == 0")
if sys.argv[2].endswith("=2") and r["timer_fired"] == 0:
    bad.append("retry.timer_fired == 0")
if r["gave_up"] != 0: bad.append("retry.gave_up %d" % r["gave_up"])
if r["errors"] != 0: bad.append("retry.errors %d" % r["errors"])
if bad:
    sys.exit("%s: %s" % (sys.argv[2], ", ".join(bad)))
EOF
    echo "$mode inject_eagain=$n: ok in $(( (end - start) / 1000000 )) ms"
  done
done
