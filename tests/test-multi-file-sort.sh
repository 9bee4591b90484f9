#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# One plug holding writes for several backing files dispatches per file,
# sorted and merged: three concatenated 256K files, the first 64K of
# each filled by 4K writes in shuffled order (interleaved across the
# files), held (writeback, idle=10s max-delay=60s) until a FLUSH: that
# is exactly 3 backend writes, one per file, and the data is right.
source ./functions.sh
set -e
set -x

requires_python_nbd

plug_tmpdir

cat > "$tmp/client.py" <<'EOF'
import nbd, random, sys
uri, files = sys.argv[1], sys.argv[2:]
F = 256 * 1024                  # Size of each file.
bs = 4096
per = 16                        # 64K per file.
h = nbd.NBD()
h.connect_uri(uri)
errs = []
def done(err):
    if err.value:
        errs.append(err.value)
    return 1
blocks = [(f, j) for f in range(len(files)) for j in range(per)]
random.Random(3).shuffle(blocks)
print("order:", blocks)
def data(f, j):
    return bytes([0x41 + f]) * (bs - 1) + bytes([j])
for f, j in blocks:
    h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(data(f, j))),
                 f * F + j * bs, completion=done)
    while h.aio_in_flight() >= 8:
        h.poll(-1)
while h.aio_in_flight() > 0:
    h.poll(-1)
h.flush()
if errs:
    sys.exit("write errors: %r" % errs[:10])
for f, name in enumerate(files):
    d = open(name, "rb").read()
    want = b"".join(data(f, j) for j in range(per))
    if d[:per * bs] != want or d[per * bs:] != b"\0" * (F - per * bs):
        sys.exit("%s: wrong contents after flush" % name)
h.shutdown()
EOF

files=()
for i in 0 1 2; do
  truncate -s 256K "$tmp/f$i"
  files+=("$tmp/f$i")
done

# direct=never: the requests must wait in the plug (with the default,
# a request that cannot merge would be written at once instead).
start_plug srv file="$tmp/f0" file="$tmp/f1" file="$tmp/f2" \
           mode=writeback idle=10s max-delay=60s direct=never \
           stats-file="$tmp/stats.json"
timeout 60 /usr/bin/python3 $tmp/client.py "$(server_uri srv)" "${files[@]}"
stop_server srv

cat "$tmp/stats.json"
/usr/bin/python3 - "$tmp/stats.json" <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
u = st["unplugs"]
w = st["backend"]["write"]
if st["client"]["write"]["ops"] != 48:
    sys.exit("client.write.ops %d, expected 48" % st["client"]["write"]["ops"])
busy = {k: v for k, v in u.items() if v and k != "flush"}
if u["flush"] != 1 or busy:
    sys.exit("unplugs %r: expected only the one FLUSH unplug" % u)
if st["largest_plug"]["requests"] != 48:
    sys.exit("largest plug %r, expected all 48 writes" % st["largest_plug"])
if w["ops"] != 3 or w["bytes"] != 3 * 65536:
    sys.exit("backend.write %r: expected 3 writes (one 64K run per file)" % w)
EOF
