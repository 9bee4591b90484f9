#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# The man page ("The record of lost data"): "write the data again, then
# FLUSH".  That must hold when the rewrite comes in many small writes,
# as a kernel rewrites a range page by page: more writes than the
# engine keeps ranges (256).
#   writeback, direct=never, max-bytes=64M; writes to [0, 4 MiB) fail
#   while SHIM_CONTROL says "fail" (shim-pwritev).
#   1. 4 MiB acknowledged in 1 MiB writes; the file fails them: the
#      FLUSH fails (EIO).
#   2. The file works again.  For piece sizes 16 KiB (256 writes) and
#      4 KiB (1024 writes): rewrite all 4 MiB, then FLUSH: it must
#      succeed, and the file must hold the rewrite.
# The server must exit 0.
# Shown able to fail: with the rewrites' heal set widened to one span
# past 256 entries (heal_add calling span_add only), the FLUSH after
# each rewrite fails with EIO.
source ./functions.sh
set -e
set -x

requires_python_nbd
plug_tmpdir
test -f "$SHIM_PWRITEV" || fail "$SHIM_PWRITEV not built"

cat > "$tmp/client.py" <<'PY'
import plugtest, sys
from plugtest import check, outcome, set_control
import nbd
uri, control, img = sys.argv[1:4]
K = 1024
M = 1024 * K
LOST = 4 * M
bad = []

h = nbd.NBD()
h.connect_uri(uri)
set_control(control, "fail")
for off in range(0, LOST, M):
    h.pwrite(b"A" * M, off)
check(bad, "FLUSH over the failed writes", outcome(h.flush), "EIO",
      "the file failed every write of [0, 4 MiB)")
set_control(control, "ok")
for piece in (16 * K, 4 * K):
    fill = b"B" if piece == 16 * K else b"C"
    for off in range(0, LOST, piece):
        h.pwrite(fill * piece, off)
    check(bad, "FLUSH after a rewrite in %d writes of %d bytes"
          % (LOST // piece, piece), outcome(h.flush), "ok",
          "all 4 MiB were written again and the FLUSH's sync covered them")
    with open(img, "rb") as f:
        if f.read(LOST) != fill * LOST:
            bad.append("the file does not hold the rewrite in %d-byte "
                       "writes" % piece)
h.shutdown()
plugtest.verdict(bad, "a rewrite in 256 and in 1024 writes heals the record")
PY

img=$tmp/disk.img
truncate -s 16M "$img"
echo ok > "$tmp/ctl"
SERVER_WRAP="env LD_PRELOAD=$SHIM_PWRITEV SHIM_PATH=$img SHIM_ERRNO=5 SHIM_FAIL_LO=0 SHIM_FAIL_HI=4194304 SHIM_CONTROL=$tmp/ctl" \
  start_plug pieces file="$img" direct=never max-bytes=64M
run_client pieces 120 "$tmp/client.py" "$tmp/ctl" "$img"
end_client pieces
