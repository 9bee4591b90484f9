#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A backend that never recovers: -D plug.inject_eagain=1 makes every
# backend write fail with EAGAIN; requeue-timeout=300ms.
#  - hold mode: the write fails with EIO after about requeue-timeout, and
#    the server keeps serving (reads on that and another connection);
#  - writeback mode (direct=never, so that the write is held): the write
#    is acknowledged, the next FLUSH fails with EIO no sooner than
#    requeue-timeout, the write is counted lost (statistics) and released:
#    not in the file, and the FLUSH after that fails too (the range is
#    lost until written again, which this backend never allows); another
#    connection still reads.
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/client.py" <<'EOF'
import errno, nbd, sys, time
uri, img, mode = sys.argv[1], sys.argv[2], sys.argv[3]
timeout = 0.3
K = 65536

def expect_eio(what, fn):
    t = time.monotonic()
    try:
        fn()
    except nbd.Error as e:
        took = time.monotonic() - t
        if e.errnum != errno.EIO:
            sys.exit("%s: failed with %r, expected EIO" % (what, e))
        print("%s: EIO after %.3f s" % (what, took))
        return took
    sys.exit("%s: succeeded, expected EIO" % what)

def in_file(off, n):
    with open(img, "rb") as f:
        f.seek(off)
        return f.read(n)

h = nbd.NBD()
h.connect_uri(uri)
if mode == "hold":
    took = expect_eio("hold: write", lambda: h.pwrite(b"W" * K, 0))
    if took < timeout * 0.9:
        sys.exit("hold: the write failed after %.3f s, requeue-timeout is %s s"
                 % (took, timeout))
else:
    # Acknowledged (it would raise otherwise: every backend write fails).
    h.pwrite(b"W" * K, 0)
    print("writeback: write acknowledged")
    took = expect_eio("writeback: flush", h.flush)
    if took < timeout * 0.9:
        sys.exit("writeback: flush failed after %.3f s, requeue-timeout is %s s"
                 % (took, timeout))
    if in_file(0, K) != b"O" * K:
        sys.exit("writeback: the failed write reached the file")
    # The loss stands until the range is written again (every backend
    # write fails here): every FLUSH says so, not only the first.
    expect_eio("writeback: next flush", h.flush)
    if in_file(0, K) != b"O" * K:
        sys.exit("writeback: the failed write reached the file")

# The server still serves: another connection, and this one, read.
h2 = nbd.NBD()
h2.connect_uri(uri)
if h2.pread(K, K) != b"O" * K:
    sys.exit("%s: second connection read wrong data" % mode)
if h.pread(K, 2 * K) != b"O" * K:
    sys.exit("%s: first connection read wrong data" % mode)
h2.shutdown()
h.shutdown()
print("%s: ok" % mode)
EOF

for mode in hold writeback; do
  img=$tmp/$mode.img
  /usr/bin/python3 -c 'import sys
open(sys.argv[1], "wb").write(b"O" * (1 << 20))' "$img"
  start_plug $mode -D plug.inject_eagain=1 -- file="$img" mode=$mode \
             direct=never requeue-timeout=300ms stats-file="$tmp/$mode.json"
  timeout 60 /usr/bin/python3 $tmp/client.py "$(server_uri $mode)" $img $mode
  stop_server $mode
  cat "$tmp/$mode.json"
  /usr/bin/python3 - "$tmp/$mode.json" $mode <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
r = st["retry"]
if r["gave_up"] < 1:
    sys.exit("%s: retry.gave_up is %d" % (sys.argv[2], r["gave_up"]))
if st["backend"]["write"]["ops"] != 0:
    sys.exit("%s: backend.write.ops %d: a write got through"
             % (sys.argv[2], st["backend"]["write"]["ops"]))
if sys.argv[2] == "writeback" and r["lost"] != 1:
    sys.exit("writeback: retry.lost is %d, expected 1" % r["lost"])
if st["connections"] != 2:
    sys.exit("%s: %d connections, expected 2" % (sys.argv[2], st["connections"]))
EOF
  # Nothing of the failed write reached the file.
  /usr/bin/python3 -c 'import sys
assert open(sys.argv[1], "rb").read() == b"O" * (1 << 20)' "$img"
done
