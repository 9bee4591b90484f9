#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-flush-fua.sh - after a FLUSH or FUA reply the data is in the
# backing file, in both modes.
#
# Checked by reading the backing files directly (python os.pread) while
# the server is still running.  Writeback mode runs with idle=10s
# max-delay=60s so that an acknowledged write really sits in the plug
# (checked: the file still reads zero) until the FLUSH; the statsfile
# then shows that no idle= or max-delay= timer unplugged anything, so
# the FLUSH and the FUA requests got the data out themselves.  Hold mode
# (defaults) promises more: the data is in the file as soon as a write
# is answered.  Every write crosses the boundary between the two files.
source ./functions.sh
set -e
set -x

requires nbdkit --version
requires nbdsh_sys --version
plug_tmpdir

export tmp

for mode in writeback hold; do
  params=()
  # direct=never: the requests must wait in the plug (with the default,
  # a request that cannot merge would be written at once instead).
  [ $mode = hold ] || params=(idle=10s max-delay=60s direct=never)
  params+=(stats-file="$tmp/$mode.json")
  truncate -s 1M "$tmp/$mode-0.img"
  truncate -s 1M "$tmp/$mode-1.img"
  export mode

  start_plug $mode "$tmp/$mode-0.img" "$tmp/$mode-1.img" \
             mode=$mode "${params[@]}"
  nbdsh_sys -u "$(server_uri $mode)" -c - <<'EOF'
import os
K = 1024
M = 1024 * K
mode = os.environ["mode"]
fds = [os.open("%s/%s-%d.img" % (os.environ["tmp"], mode, i), os.O_RDONLY)
       for i in (0, 1)]
assert h.can_flush() and h.can_fua()

def on_disk(off, n):
    """Export range [off, off+n) read from the backing files themselves."""
    out = b""
    while n > 0:
        i, o = divmod(off, M)
        k = min(n, M - o)
        out += os.pread(fds[i], k, o)
        off += k
        n -= k
    return out

# Plain write, then FLUSH.
a = b"\x11" * (64 * K)
h.pwrite(a, M - 32 * K)
if mode == "writeback":
    assert on_disk(M - 32 * K, 64 * K) == bytes(64 * K), \
        "premise: the write should still be held in the plug"
else:
    assert on_disk(M - 32 * K, 64 * K) == a, "hold: answered before written"
h.flush()
assert on_disk(M - 32 * K, 64 * K) == a, "not in the files after FLUSH"

# FUA write: in the files when answered, no FLUSH needed.
b = b"\x22" * (8 * K)
h.pwrite(b, M - 4 * K, nbd.CMD_FLAG_FUA)
assert on_disk(M - 4 * K, 8 * K) == b, "not in the files after FUA write"

# FUA zero and FUA trim are answered after they reached the files too.
h.zero(2 * K, M - K, nbd.CMD_FLAG_FUA)
assert on_disk(M - 4 * K, 8 * K) == b"\x22" * (3 * K) + bytes(2 * K) + \
    b"\x22" * (3 * K)
h.trim(64 * K, M - 32 * K, nbd.CMD_FLAG_FUA)
assert on_disk(M - 32 * K, 64 * K) == bytes(64 * K)

h.flush()
for fd in fds:
    os.close(fd)
EOF
  stop_server $mode
  cat "$tmp/$mode.json"
  [ $mode = hold ] && continue
  /usr/bin/python3 - "$tmp/$mode.json" <<'EOF2'
import json, sys
u = {k: v for k, v in json.load(open(sys.argv[1]))["unplugs"].items() if v}
print("unplugs %r" % u)
if u.get("idle") or u.get("max-delay"):
    sys.exit("a timer unplugged: the FLUSH or a FUA request waited for it")
# The first FLUSH unplugs the write, each FUA request unplugs itself, and
# the last FLUSH finds the plug empty.
if u != {"flush": 1, "fua": 3}:
    sys.exit("unplugs %r, expected {'flush': 1, 'fua': 3}" % u)
EOF2
done
