#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Read-your-writes in writeback mode with idle=10s max-delay=60s: a read
# overlapping held data on the same connection returns the new data at
# once (it unplugs: unplugs.read >= 1, and no timer unplugged, so it did
# not wait for idle=), while a read that does not overlap held data
# leaves the plug alone (unplugs.read == 0, and the held write is still
# not in the file afterwards).
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/client.py" <<'EOF'
import nbd, sys, time
uri, img, case = sys.argv[1], sys.argv[2], sys.argv[3]
K = 65536

def in_file(off, size):
    with open(img, "rb") as f:
        f.seek(off)
        return f.read(size)

h = nbd.NBD()
h.connect_uri(uri)
h.pwrite(b"N" * K, K)           # Held: idle=10s.
t = time.monotonic()
if case == "overlap":
    # Overlaps the held write by 4K at each end.
    got = h.pread(K + 8192, K - 4096)
    want = b"O" * 4096 + b"N" * K + b"O" * 4096
else:
    # Right next to the held write, not overlapping it.
    got = h.pread(K, 2 * K) + h.pread(K, 0)
    want = b"O" * 2 * K
elapsed = time.monotonic() - t
if got != want:
    sys.exit("%s: read returned wrong data: %r..." % (case, got[:16]))
held = in_file(K, K) == b"O" * K
print("%s: read ok in %.3f s; write %s" %
      (case, elapsed, "still held" if held else "in the file"))
if case == "overlap" and held:
    sys.exit("overlap: the read was right but the write is not in the file")
if case == "apart" and not held:
    sys.exit("apart: a read elsewhere unplugged the held write")
h.shutdown()
EOF

for case in overlap apart; do
  img=$tmp/$case.img
  /usr/bin/python3 -c 'import sys
open(sys.argv[1], "wb").write(b"O" * (1 << 20))' "$img"
  # direct=never: the requests must wait in the plug (with the default,
  # a request that cannot merge would be written at once instead).
  start_plug $case file="$img" mode=writeback idle=10s max-delay=60s \
             direct=never stats-file="$tmp/$case.json"
  timeout 60 /usr/bin/python3 $tmp/client.py "$(server_uri $case)" $img $case
  stop_server $case
  cat "$tmp/$case.json"
  /usr/bin/python3 - "$tmp/$case.json" $case <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
case = sys.argv[2]
u = st["unplugs"]
print("%s: unplugs %r" % (case, u))
if case == "overlap" and u["read"] < 1:
    sys.exit("overlap: unplugs.read is %d, expected >= 1" % u["read"])
if case == "apart" and u["read"] != 0:
    sys.exit("apart: unplugs.read is %d, expected 0" % u["read"])
if u["idle"] or u["max-delay"]:
    sys.exit("%s: a timer unplugged during the test" % case)
EOF
done
