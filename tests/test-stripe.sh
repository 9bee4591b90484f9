#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-stripe.sh - stripe=64k: data round-trips across stripe units and
# lands in the right file.
#
# Three equal files striped in 64 KiB units (unit k of the export is
# unit k/3 of file k%3).  Writes that span two units, all three files,
# and more than a whole stripe read back through nbdsh; after the server
# has exited, each backing file holds exactly its units of the expected
# image (de-striped in python).  Both modes.
source ./functions.sh
set -e
set -x

requires nbdkit --version
requires nbdsh_sys --version
plug_tmpdir

export tmp

for mode in writeback hold; do
  files=()
  for i in 0 1 2; do
    f=$tmp/$mode-$i.img
    truncate -s 1M "$f"
    files+=("$f")
  done
  export mode

  start_plug $mode stripe=64k "${files[@]}" mode=$mode
  nbdsh_sys -u "$(server_uri $mode)" -c - <<'EOF'
import os
U = 65536
size = 3 * 1024 * 1024
assert h.get_size() == size
img = bytearray(size)

def write(buf, off):
    h.pwrite(buf, off)
    img[off:off + len(buf)] = buf

write(b"\x11" * 1000, U - 500)                  # units 0|1 (files 0, 1)
write(bytes(range(256)) * 800, 2 * U - 7)       # units 1..4 (all files)
write(b"\x22" * (3 * U + 2), 10 * U - 1)        # more than a stripe
write(b"\x33" * 4096, 0)                        # first unit of file 0
write(b"\x44" * 4096, size - 4096)              # last unit of file 2
# Concurrent writes, one per unit of two stripes: the plug may merge
# those that are adjacent in one file, never across files.
cmds = []
for k in range(6):
    off = 20 * U + k * U + 100
    buf = bytes([0x80 + k]) * (U - 200)
    cmds.append(h.aio_pwrite(buf, off))
    img[off:off + len(buf)] = buf
while h.aio_in_flight() > 0:
    h.poll(-1)
for c in cmds:
    assert h.aio_command_completed(c)

assert h.pread(size, 0) == img
for off, n in [(U - 1, 2), (3 * U - 10, 20), (U - 500, 4 * U)]:
    assert h.pread(n, off) == img[off:off + n], (off, n)

with open(os.environ["tmp"] + "/expected-" + os.environ["mode"], "wb") as f:
    f.write(img)
EOF
  stop_server $mode

  # The server has exited: file k holds units k, k+3, k+6, ...
  /usr/bin/python3 - "$tmp/expected-$mode" "${files[@]}" <<'EOF'
import sys
U = 65536
img = open(sys.argv[1], "rb").read()
files = sys.argv[2:]
n = len(files)
for k, name in enumerate(files):
    want = b"".join(img[u * U:(u + 1) * U]
                    for u in range(k, len(img) // U, n))
    got = open(name, "rb").read()
    assert len(got) == 1024 * 1024, (name, len(got))
    if got != want:
        bad = next(i for i in range(len(got)) if got[i] != want[i])
        sys.exit("%s: wrong data at file offset %d (stripe unit %d)"
                 % (name, bad, bad // U * n + k))
EOF
done
