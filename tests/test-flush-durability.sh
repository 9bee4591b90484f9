#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Writeback mode with idle=10s max-delay=60s, so nothing leaves the plug
# by itself during the test.  Reading the backing file directly (not
# through the server) while the server runs:
#  - a write whose reply came is not in the file yet (the plug holds it);
#  - after a FLUSH reply it is;
#  - after a FUA write's reply that write is in the file;
#  - a later plain write is again only held.
# statsfile then shows that only FLUSH and FUA (and the close) unplugged:
# no timer fired, so "still held" was the plug's doing.
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

img=$tmp/disk.img
/usr/bin/python3 -c 'import sys; open(sys.argv[1], "wb").write(b"A" * (1 << 20))' "$img"

cat > "$tmp/client.py" <<'EOF'
import nbd, sys
uri, img = sys.argv[1], sys.argv[2]
K = 65536

def in_file(off, size):
    with open(img, "rb") as f:
        f.seek(off)
        return f.read(size)

def check(off, ch, what):
    got = in_file(off, K)
    if got != ch * K:
        sys.exit("%s: file at %d holds %r..., expected %r"
                 % (what, off, got[:8], ch))
    print("ok: %s" % what)

h = nbd.NBD()
h.connect_uri(uri)

h.pwrite(b"B" * K, 0)
check(0, b"A", "write acknowledged but still held in the plug")

h.flush()
check(0, b"B", "after FLUSH the write is in the file")

h.pwrite(b"C" * K, K, nbd.CMD_FLAG_FUA)
check(K, b"C", "after a FUA write's reply it is in the file")

h.pwrite(b"D" * K, 2 * K)
check(2 * K, b"A", "a later plain write is held again")

h.shutdown()
EOF

# direct=never: the requests must wait in the plug (with the default,
# a request that cannot merge would be written at once instead).
start_plug srv file="$img" mode=writeback idle=10s max-delay=60s direct=never \
           stats-file="$tmp/stats.json"
timeout 60 /usr/bin/python3 $tmp/client.py "$(server_uri srv)" $img
stop_server srv

cat "$tmp/stats.json"
/usr/bin/python3 - "$tmp/stats.json" <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
u = st["unplugs"]
want = {"flush": 1, "fua": 1, "idle": 0, "max-delay": 0, "read": 0,
        "max-requests": 0, "max-bytes": 0}
bad = {k: u[k] for k in want if u[k] != want[k]}
if bad:
    sys.exit("unplugs %r, expected %r" % (bad, want))
if st["client"]["fua"]["ops"] != 1 or st["client"]["flush"]["ops"] != 1:
    sys.exit("client fua/flush counts wrong: %r" % st["client"])
EOF

# The held write went out at close.
/usr/bin/python3 - "$img" <<'EOF'
import sys
d = open(sys.argv[1], "rb").read()
K = 65536
assert d[:K] == b"B" * K and d[K:2*K] == b"C" * K and d[2*K:3*K] == b"D" * K
assert d[3*K:] == b"A" * (len(d) - 3 * K)
EOF
