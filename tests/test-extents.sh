#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-extents.sh - block status reports the holes of sparse backing
# files, and never reports held data as a hole.
#
# Two sparse files (truncate) are concatenated.  After written regions
# have been flushed, base:allocation shows them as data (flags 0) and the
# unwritten ones as hole|zero (flags 3), including a data region that
# crosses the boundary between the files.  Then, in writeback mode with
# idle=10s max-delay=60s, a write acknowledged but still held in the plug
# (the backing file still has a hole there: checked) is reported as data:
# the plugin unplugs before answering.  The first part runs in both modes.
source ./functions.sh
set -e
set -x

requires nbdkit --version
requires nbdsh_sys --version
plug_tmpdir

export tmp

for mode in writeback hold; do
  # Writeback: keep an acknowledged write in the plug for the last part.
  # Hold: defaults (a hold-mode write waits for its unplug).
  params=()
  # direct=never: the requests must wait in the plug (with the default,
  # a request that cannot merge would be written at once instead).
  [ $mode = hold ] || params=(idle=10s max-delay=60s direct=never)
  truncate -s 1M "$tmp/$mode-0.img"
  truncate -s 1M "$tmp/$mode-1.img"
  export mode

  start_plug $mode "$tmp/$mode-0.img" "$tmp/$mode-1.img" \
             mode=$mode "${params[@]}"
  nbdsh_sys --base-allocation -u "$(server_uri $mode)" -c - <<'EOF'
import os
K = 1024
M = 1024 * K
HOLE = nbd.STATE_HOLE | nbd.STATE_ZERO
mode = os.environ["mode"]
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)

def extents(off, n):
    """[(offset, length, flags)] for [off, off+n), as many calls as it takes."""
    out = []
    end = off + n
    while off < end:
        got = []
        def cb(meta, o, entries, err):
            assert meta == nbd.CONTEXT_BASE_ALLOCATION
            got.extend(entries)
        h.block_status(end - off, off, cb)
        assert got
        for i in range(0, len(got), 2):
            out.append((off, got[i], got[i + 1]))
            off += got[i]
    return out

def flags_over(off, n):
    """The set of flags reported anywhere in [off, off+n)."""
    return {f for (o, l, f) in extents(0, 2 * M)
            if o < off + n and o + l > off}

# Nothing written yet: all holes.
assert flags_over(0, 2 * M) == {HOLE}, extents(0, 2 * M)

# Data in file 0, and data across the boundary.
h.pwrite(b"\x11" * (64 * K), 256 * K)
h.pwrite(b"\x22" * (128 * K), M - 64 * K)
h.flush()
print(extents(0, 2 * M))
assert flags_over(256 * K, 64 * K) == {0}
assert flags_over(M - 64 * K, 128 * K) == {0}
assert flags_over(0, 256 * K) == {HOLE}
assert flags_over(320 * K, M - 64 * K - 320 * K) == {HOLE}
assert flags_over(M + 64 * K, M - 64 * K) == {HOLE}

if mode == "writeback":
    # Held in the plug: acknowledged, but the file has a hole there.
    h.pwrite(b"\x33" * (64 * K), M + 512 * K)
    name = os.environ["tmp"] + "/writeback-1.img"
    fd = os.open(name, os.O_RDONLY)
    assert os.pread(fd, 64 * K, 512 * K) == bytes(64 * K), \
        "premise: the write should still be held in the plug"
    os.close(fd)
    # block_status must unplug first: data, not a hole.
    assert flags_over(M + 512 * K, 64 * K) == {0}, extents(0, 2 * M)
    assert flags_over(M + 576 * K, 448 * K) == {HOLE}
    assert h.pread(64 * K, M + 512 * K) == b"\x33" * (64 * K)
EOF
  stop_server $mode
done
