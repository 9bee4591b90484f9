#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A real resource shortage, no injection: max-inflight=1 (one backend
# I/O at a time on the file, all connections together) and 4 client
# processes writing at once, each to its own 1 MiB region.  Dispatch
# finds the slot taken ("not now"): the run stays queued until a
# completion frees the slot.  statsfile retry.no_slot > 0, nothing given
# up, and every byte is right after the clients' flushes.  Both modes.
#
# To make the overlap reliable on two CPUs: -D plug.backend_delay_us=1000
# makes every backend write hold its slot 1 ms longer (a slow disk: the
# slot is still really taken, nothing fails on purpose), and
# max-bytes=128k makes writeback mode unplug often.  (A connection whose
# unplug yields more runs than free slots also meets the shortage by
# itself; either way it is a real one.)
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/client.py" <<'EOF'
import nbd, os, random, sys, time
uri, img, me = sys.argv[1], sys.argv[2], int(sys.argv[3])
M = 1 << 20
base = me * M
qd = 8
rng = random.Random(me)
h = nbd.NBD()
h.connect_uri(uri)
# Start together: all four connected before anybody writes.
open("%s.ready%d" % (img, me), "w").close()
t = time.monotonic()
while not all(os.path.exists("%s.ready%d" % (img, i)) for i in range(4)):
    if time.monotonic() - t > 30:
        sys.exit("client %d: the others did not connect" % me)
    time.sleep(0.001)
errs = []
def done(err):
    if err.value:
        errs.append(err.value)
    return 1
ref = bytearray(M)
off = 0
while off < M or h.aio_in_flight() > 0:
    while off < M and h.aio_in_flight() < qd:
        n = min(rng.randrange(1, 9) * 4096, M - off)
        data = bytearray(rng.randbytes(n))
        ref[off:off + n] = data
        h.aio_pwrite(nbd.Buffer.from_bytearray(data), base + off,
                     completion=done)
        off += n
    h.poll(-1)
h.flush()
if errs:
    sys.exit("client %d: write errors %r" % (me, errs[:10]))
if h.pread(M, base) != ref:
    sys.exit("client %d: reads back wrong data" % me)
with open(img, "rb") as f:
    f.seek(base)
    if f.read(M) != ref:
        sys.exit("client %d: the file is wrong after flush" % me)
h.shutdown()
EOF

# The four clients at once; fail if any fails.
cat > "$tmp/clients.sh" <<EOF
pids=
trap 'kill \$pids 2>/dev/null; exit 143' TERM
for i in 0 1 2 3; do
  /usr/bin/python3 $tmp/client.py "\$1" "\$2" \$i &
  pids="\$pids \$!"
done
rc=0
for p in \$pids; do wait \$p || rc=1; done
exit \$rc
EOF

for mode in writeback hold; do
  img=$tmp/$mode.img
  truncate -s 4M "$img"
  start_plug $mode -D plug.backend_delay_us=1000 -- file="$img" \
             mode=$mode max-inflight=1 max-bytes=128k stats-file="$tmp/$mode.json"
  timeout 60 sh $tmp/clients.sh "$(server_uri $mode)" $img
  stop_server $mode
  /usr/bin/python3 - "$tmp/$mode.json" $mode <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
mode = sys.argv[2]
r = st["retry"]
print("%s: connections %d, retry %r, backend.write %r" %
      (mode, st["connections"], r, st["backend"]["write"]))
bad = []
if st["connections"] != 4: bad.append("connections %d" % st["connections"])
if r["no_slot"] == 0: bad.append("retry.no_slot == 0: no shortage seen")
if r["gave_up"] != 0: bad.append("retry.gave_up %d" % r["gave_up"])
if r["errors"] != 0: bad.append("retry.errors %d" % r["errors"])
if st["backend"]["write"]["bytes"] < 4 << 20:
    bad.append("backend wrote %d bytes" % st["backend"]["write"]["bytes"])
if bad:
    sys.exit("%s: %s" % (mode, "; ".join(bad)))
EOF
done
