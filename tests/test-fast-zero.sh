#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-fast-zero.sh - a fast zero (NBD_CMD_FLAG_FAST_ZERO) either zeroes
# or fails with ENOTSUP, and the server keeps serving.
#
# With and without NO_HOLE, across the boundary between two files that
# hold data, in both modes.  nbdkit 1.32 aborts the whole server on a
# fast zero to a plugin that cannot answer it, so "keeps serving" is the
# point: after each fast zero, a write and a read on the same connection
# and a second connection must work.
#
# The files are on $tmp (ext4 here: both fast zeros succeed) and, when
# there is one, on a tmpfs (/dev/shm), which can punch holes but has no
# FALLOC_FL_ZERO_RANGE: there the NO_HOLE fast zero gets ENOTSUP.
source ./functions.sh
set -e
set -x

requires nbdkit --version
requires nbdsh_sys --version
plug_tmpdir

dirs=("$tmp")
if [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] &&
   shm=$(mktemp -d /dev/shm/nbdplug-test.XXXXXX); then
  cleanup_fn rm -rf "$shm"
  dirs+=("$shm")
fi

for dir in "${dirs[@]}"; do
for mode in writeback hold; do
  for i in 0 1; do
    /usr/bin/python3 -c 'import sys; sys.stdout.buffer.write(b"\xaa" * 1048576)' \
            > "$dir/$mode-$i.img"
  done

  name=$mode-$(basename "$dir")
  start_plug $name "$dir/$mode-0.img" "$dir/$mode-1.img" mode=$mode
  nbdsh_sys -u "$(server_uri $name)" -c - <<'EOF'
import errno
K = 1024
M = 1024 * K
assert h.can_fast_zero()
outcomes = []
for flags, off in [(0, M - 48 * K), (nbd.CMD_FLAG_NO_HOLE, M + 128 * K)]:
    n = 64 * K if off < M else 16 * K
    try:
        h.zero(n, off, nbd.CMD_FLAG_FAST_ZERO | flags)
        outcomes.append("zeroed")
        assert h.pread(n, off) == bytes(n)
    except nbd.Error as e:
        assert e.errnum == errno.ENOTSUP, e
        outcomes.append("ENOTSUP")
        # A refused fast zero changed nothing.
        assert h.pread(n, off) == b"\xaa" * n
    # Still serving: the neighbours are intact, a write reads back.
    assert h.pread(1, off - 1) == b"\xaa"
    assert h.pread(1, off + n) == b"\xaa"
    h.pwrite(b"\x55" * 4096, 0)
    assert h.pread(4096, 0) == b"\x55" * 4096
print("fast zero:", outcomes)
h.flush()
EOF
  # A second connection: the server still serves after the fast zeros.
  nbdsh_sys -u "$(server_uri $name)" -c '
assert h.pread(4096, 0) == b"\x55" * 4096
'
  stop_server $name
done
done
