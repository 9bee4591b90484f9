#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-boundary.sh - data round-trips across backing-file boundaries.
#
# Three files of odd sizes are concatenated.  Writes that span two and
# three files (single ones, and bursts of concurrent adjacent ones the
# plug may merge) carry random data, unique to each write, so that a
# piece written from the wrong part of the client's buffer, or to the
# wrong place, cannot look right.  Each write (each burst) is checked
# before anything overwrites it: read back through nbdsh, and, after a
# FLUSH, in the backing files themselves (read directly, each export
# offset mapped to its file by the test, not by the plugin).  After the
# server has exited the backing files, joined with cat, equal the image
# the writes should have made, at their original sizes.  Both modes.
# Shown able to fail: with request_set_data (plugin/request.c) pointing
# every piece of a write at the start of the client's data instead of
# at its own slice, "two files: read back through NBD differs from the
# write at export offset 300007" (writes of one repeated byte, checked
# only once later writes had covered them, passed with it); with
# layout_piece_at (src/layout.c) making the piece before a boundary one
# byte longer than what is left of its file (reads and writes alike, so
# NBD reads back what it wrote), "two files: the backing files differ
# from the write at export offset 300007 (file 1 offset 0)".
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
  export mode boundary_files="${files[*]}" boundary_sizes="${sizes[*]}"

  start_plug $mode "${files[@]}" mode=$mode
  nbdsh_sys -u "$(server_uri $mode)" -c - <<'EOF'
import os, random, sys
files = os.environ["boundary_files"].split()
sizes = [int(x) for x in os.environ["boundary_sizes"].split()]
b1 = sizes[0]                   # first boundary
b2 = b1 + sizes[1]              # second boundary
size = b2 + sizes[2]
assert h.get_size() == size
img = bytearray(size)
rng = random.Random(os.environ["mode"])

def in_files(off, n):
    # The export's bytes [off, off+n) read from the backing files.
    out = bytearray()
    start = 0
    for f, fsize in zip(files, sizes):
        lo, hi = max(off, start), min(off + n, start + fsize)
        if lo < hi:
            with open(f, "rb") as fp:
                fp.seek(lo - start)
                out += fp.read(hi - lo)
        start += fsize
    return out

def where(off):
    start = 0
    for i, fsize in enumerate(sizes):
        if off < start + fsize:
            return "file %d offset %d" % (i, off - start)
        start += fsize

def check(what, ranges):
    # Each (off, n) of ranges holds img's bytes, through NBD and, once
    # flushed, in the files.
    for off, n in ranges:
        got = h.pread(n, off)
        if got != img[off:off + n]:
            d = next(i for i in range(n) if got[i] != img[off + i])
            sys.exit("%s: read back through NBD differs from the write at "
                     "export offset %d" % (what, off + d))
    h.flush()
    for off, n in ranges:
        got = in_files(off, n)
        if got != img[off:off + n]:
            d = next(i for i in range(n) if got[i] != img[off + i])
            sys.exit("%s: the backing files differ from the write at "
                     "export offset %d (%s)" % (what, off + d, where(off + d)))
    print("ok: %s" % what)

def write(what, n, off):
    buf = rng.randbytes(n)
    h.pwrite(buf, off)
    img[off:off + n] = buf
    check(what, [(off, n)])

write("two files", 5000, b1 - 1234)
write("three files", 100 + sizes[1] + 1000, b1 - 100)
write("two files, second boundary, over the last", 7777, b2 - 3333)
write("the first byte", 1, 0)
write("the last byte", 1, size - 1)

def burst(what, first, k):
    # k concurrent adjacent 1000-byte writes from first: the plug may
    # merge them; each piece must land right.
    cmds = []
    for i in range(k):
        off = first + i * 1000
        buf = rng.randbytes(1000)
        cmds.append(h.aio_pwrite(buf, off))
        img[off:off + 1000] = buf
    while h.aio_in_flight() > 0:
        h.poll(-1)
    for c in cmds:
        assert h.aio_command_completed(c)
    check(what, [(first, k * 1000)])

# Across the first boundary, then across the second one over part of
# the first burst (NBD orders overlapping writes only once the first
# ones are answered: the first burst is, before the second is sent).
burst("burst across the first boundary", b1 - 20000, 80)
burst("burst across the second boundary", b2 - 35000, 70)

# Read back: whole export, and reads that themselves cross boundaries.
assert h.pread(size, 0) == img
for off, n in [(b1 - 1, 2), (b2 - 1, 2), (b1 - 100, sizes[1] + 200)]:
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
