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
#
# A file that answers a fast zero "not now" (EAGAIN, here every backend
# write, zero and trim, by -D plug.inject_eagain=1) makes it fail with
# ENOTSUP at once: never requeued nor retried (statsfile: retry.eagain,
# retry.timer_fired and retry.gave_up stay 0), the data unchanged, with
# and without NO_HOLE, in both modes.  Shown able to fail: with
# engine_complete sending a fast zero's EAGAIN to the retry path like
# any run's, "the fast zero failed with EIO, not ENOTSUP" (after
# requeue-timeout=2s of retries).
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

# A fast zero that gets EAGAIN from the file.
for mode in writeback hold; do
  f=$tmp/eagain-$mode.img
  /usr/bin/python3 -c 'import sys; sys.stdout.buffer.write(b"\xaa" * 1048576)' \
          > "$f"
  # requeue-timeout=2s: a fast zero wrongly retried gives up soon.
  start_plug eagain-$mode -D plug.inject_eagain=1 -- "$f" mode=$mode \
             requeue-timeout=2s stats-file="$tmp/eagain-$mode.json"
  nbdsh_sys -u "$(server_uri eagain-$mode)" -c - <<'EOF'
import errno, sys
K = 1024
for flags in (0, nbd.CMD_FLAG_NO_HOLE):
    try:
        h.zero(64 * K, 128 * K, nbd.CMD_FLAG_FAST_ZERO | flags)
        sys.exit("the fast zero (flags %d) succeeded although every "
                 "backend zero gets EAGAIN" % flags)
    except nbd.Error as e:
        if e.errnum != errno.ENOTSUP:
            sys.exit("the fast zero failed with %s, not ENOTSUP"
                     % errno.errorcode.get(e.errnum, e.errnum))
    assert h.pread(1024 * K, 0) == b"\xaa" * (1024 * K)
print("fast zeros with EAGAIN: ENOTSUP")
EOF
  stop_server eagain-$mode
  /usr/bin/python3 - "$tmp/eagain-$mode.json" "$f" <<'EOF'
import json, sys
st = json.load(open(sys.argv[1]))
print("client.zero %r retry %r" % (st["client"]["zero"], st["retry"]))
bad = ["retry.%s is %d" % (k, st["retry"][k])
       for k in ("eagain", "timer_fired", "gave_up") if st["retry"][k]]
if st["client"]["zero"]["ops"] != 2:
    bad.append("client.zero.ops %d, expected 2" % st["client"]["zero"]["ops"])
if open(sys.argv[2], "rb").read() != b"\xaa" * 1048576:
    bad.append("the file changed")
if bad:
    sys.exit("fast zero with EAGAIN: " + "; ".join(bad))
EOF
done
