#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-boundary.sh - data round-trips across backing-file boundaries.
#
# Three files of odd sizes are concatenated.  Writes that span two and
# three files (single ones, and a burst of concurrent ones the plug may
# merge) read back through nbdsh, and after the server has exited the
# backing files, joined with cat, equal the image the writes should have
# made (built in python alongside).  Both modes.
source ./functions.sh
set -e
set -x

requires nbdkit --version
requires nbdsh_sys --version
plug_tmpdir

# Odd sizes: no boundary is aligned to anything.
sizes=(300007 65537 200003)
export tmp

for mode in writeback hold; do
  files=()
  for i in 0 1 2; do
    f=$tmp/$mode-$i.img
    truncate -s "${sizes[i]}" "$f"
    files+=("$f")
  done
  export mode

  start_plug $mode "${files[@]}" mode=$mode
  nbdsh_sys -u "$(server_uri $mode)" -c - <<'EOF'
import os
b1 = 300007                     # first boundary
b2 = b1 + 65537                 # second boundary
size = b2 + 200003
assert h.get_size() == size
img = bytearray(size)

def write(buf, off):
    h.pwrite(buf, off)
    img[off:off + len(buf)] = buf

# Two files: unaligned write across the first boundary.
write(bytes([0x11]) * 5000, b1 - 1234)
# Three files: all of file 1 plus a bit of files 0 and 2.
write(bytes(range(256)) * 300, b1 - 100)
# Two files: across the second boundary, over part of the previous one.
write(b"\x22" * 7777, b2 - 3333)
# The first and the last byte of the export.
write(b"\x33", 0)
write(b"\x44", size - 1)

# A burst of concurrent adjacent 1000-byte writes across both
# boundaries: the plug may merge them; each piece must land right.
cmds = []
for k in range(80):
    off = b1 - 20000 + k * 1000
    buf = bytes([0x80 + k % 64]) * 1000
    cmds.append(h.aio_pwrite(buf, off))
    img[off:off + 1000] = buf
# The second burst overlaps the first: NBD gives overlapping writes in
# flight at the same time no order, so let the first finish (a reply
# means applied; the second must then win over it).
while h.aio_in_flight() > 0:
    h.poll(-1)
for k in range(70):
    off = b2 - 35000 + k * 1000
    buf = bytes([0x40 + k % 32]) * 1000
    cmds.append(h.aio_pwrite(buf, off))
    img[off:off + 1000] = buf
while h.aio_in_flight() > 0:
    h.poll(-1)
for c in cmds:
    assert h.aio_command_completed(c)

# Read back: whole export, and reads that themselves cross boundaries.
assert h.pread(size, 0) == img
for off, n in [(b1 - 1, 2), (b2 - 1, 2), (b1 - 100, 65537 + 200)]:
    assert h.pread(n, off) == img[off:off + n], (off, n)

with open(os.environ["tmp"] + "/expected-" + os.environ["mode"], "wb") as f:
    f.write(img)
EOF
  stop_server $mode

  # The server has exited: the files themselves hold the image, at their
  # original sizes.
  cat "${files[@]}" | cmp - "$tmp/expected-$mode"
  for i in 0 1 2; do
    test "$(stat -c %s "${files[i]}")" -eq "${sizes[i]}"
  done
done
