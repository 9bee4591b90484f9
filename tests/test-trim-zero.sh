#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-trim-zero.sh - trim and zero (with and without NO_HOLE) across
# backing-file boundaries read back as zeroes.
#
# Four fully allocated files (all bytes 0xff) are concatenated.  A trim,
# a zero, and a zero with NBD_CMD_FLAG_NO_HOLE each cross one boundary,
# plus an unaligned trim inside a file.  Through nbdsh the ranges read
# back as zeroes and their neighbours are untouched.  After the server has
# exited the files hold the same bytes, and the aligned trimmed range is
# a hole in both files (on a regular file trim punches holes).  Both
# modes.
#
# Then the allocation a zero leaves, on one fully allocated file, seen
# in its st_blocks after a FLUSH: a zero with NO_HOLE frees no block (it
# reads back as zeroes); a plain zero may punch a hole, and does where
# the file can (zero_run punches first): its whole range is freed.
# The test needs a filesystem that punches holes (fallocate(1) probes
# $tmp).  Shown able to fail: with zero_run's NO_HOLE test inverted
# (punching only when NO_HOLE was set), "zero with NO_HOLE freed 512
# blocks; the plain zero freed 0 bytes of its 256 KiB".
source ./functions.sh
set -e
set -x

requires nbdkit --version
requires nbdsh_sys --version
plug_tmpdir

# Can files here punch holes (and free the blocks)?
head -c 65536 /dev/urandom > "$tmp/probe"
requires sh -c "fallocate --punch-hole -o 0 -l 65536 '$tmp/probe' &&
                test \"\$(stat -c %b '$tmp/probe')\" -eq 0"
rm -f "$tmp/probe"

K=1024
sizes=($((512 * K)) $((256 * K)) $((512 * K)) $((256 * K)))
export tmp

for mode in writeback hold; do
  files=()
  for i in 0 1 2 3; do
    f=$tmp/$mode-$i.img
    /usr/bin/python3 -c "import sys; sys.stdout.buffer.write(b'\xff' * ${sizes[i]})" > "$f"
    files+=("$f")
  done
  export mode

  start_plug $mode "${files[@]}" mode=$mode
  nbdsh_sys -u "$(server_uri $mode)" -c - <<'EOF'
import os
K = 1024
b1, b2, b3 = 512 * K, 768 * K, 1280 * K
size = 1536 * K
img = bytearray(b"\xff" * size)
ranges = [
    ("trim", b1 - 64 * K, 128 * K),
    ("trim", 100, 5000),                        # unaligned
    ("zero", b2 - 32 * K, 64 * K),
    ("zero-nohole", b3 - 12345, 23456),         # unaligned
]
for op, off, n in ranges:
    if op == "trim":
        h.trim(n, off)
    elif op == "zero":
        h.zero(n, off)
    else:
        h.zero(n, off, nbd.CMD_FLAG_NO_HOLE)
    img[off:off + n] = bytes(n)
    # Read at once (the request may still be in the plug): zeroes, and
    # the bytes on either side are still 0xff.
    assert h.pread(n, off) == bytes(n), (op, off, n)
    if off > 0:
        assert h.pread(1, off - 1) == b"\xff", (op, off)
    assert h.pread(1, off + n) == b"\xff", (op, off, n)
h.flush()
assert h.pread(size, 0) == img

with open(os.environ["tmp"] + "/expected-" + os.environ["mode"], "wb") as f:
    f.write(img)
EOF
  stop_server $mode

  # The server has exited: the files hold the image ...
  cat "${files[@]}" | cmp - "$tmp/expected-$mode"
  # ... and the trim across the first boundary punched holes: the last
  # 64K of file 0 and the first 64K of file 1.
  /usr/bin/python3 - "${files[0]}" "${files[1]}" <<'EOF'
import os, sys
K = 1024

def assert_hole(name, start, end):
    fd = os.open(name, os.O_RDONLY)
    try:
        assert os.lseek(fd, start, os.SEEK_HOLE) == start, (name, start)
        try:
            data = os.lseek(fd, start, os.SEEK_DATA)
        except OSError:                 # ENXIO: only a hole to the end
            data = os.fstat(fd).st_size
        assert data >= end, (name, start, end, data)
    finally:
        os.close(fd)

assert_hole(sys.argv[1], 448 * K, 512 * K)
assert_hole(sys.argv[2], 0, 64 * K)
EOF
done

# Allocation after a zero with and without NO_HOLE.
for mode in writeback hold; do
  f=$tmp/alloc-$mode.img
  /usr/bin/python3 -c "import sys; sys.stdout.buffer.write(b'\xff' * (1 << 20))" > "$f"
  export f
  start_plug alloc-$mode "$f" mode=$mode
  nbdsh_sys -u "$(server_uri alloc-$mode)" -c - <<'EOF'
import os, sys
K = 1024
f = os.environ["f"]

def blocks():
    return os.stat(f).st_blocks

b0 = blocks()
if b0 * 512 < 1024 * K:
    sys.exit("the file is not fully allocated: %d blocks" % b0)
h.zero(256 * K, 256 * K, nbd.CMD_FLAG_NO_HOLE)
h.flush()
b1 = blocks()
h.zero(256 * K, 512 * K)
h.flush()
b2 = blocks()
print("st_blocks: %d, after the zero with NO_HOLE %d, after the plain "
      "zero %d" % (b0, b1, b2))
assert h.pread(1024 * K, 0) == \
    b"\xff" * (256 * K) + bytes(512 * K) + b"\xff" * (256 * K)
bad = []
if b1 < b0:
    bad.append("zero with NO_HOLE freed %d blocks" % (b0 - b1))
if (b1 - b2) * 512 < 256 * K:
    bad.append("the plain zero freed %d bytes of its 256 KiB"
               % ((b1 - b2) * 512))
if bad:
    sys.exit("; ".join(bad))
EOF
  stop_server alloc-$mode
  # The file itself: zeroes where the zeroes went, 0xff around them.
  /usr/bin/python3 -c "
import sys
d = open(sys.argv[1], 'rb').read()
assert d == b'\xff' * (256 << 10) + bytes(512 << 10) + b'\xff' * (256 << 10)
" "$f"
done
