#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# The man page ("The record of lost data"): a range leaves the record
# "when a later write, zero or trim over it has succeeded and a sync
# covered it (the FLUSH that follows the rewrite does): write the data
# again, then FLUSH".  That must hold however many other ranges were
# written between the rewrite and the FLUSH.
#   writeback, direct=never, idle=10ms; writes to [0, 64 KiB) fail while
#   SHIM_CONTROL says "fail" (shim-pwritev).
#   1. FLUSH; A = 64 KiB at 0 fails (acknowledged, recorded).
#   2. FLUSH F1 fails (expected).
#   3. A' = 64 KiB at 0 again (the file takes it now), then 300 writes
#      of 512 bytes elsewhere, none touching another.
#   4. FLUSH F2: A' is written and F2's sync covers it: F2 must succeed.
# Shown able to fail: with the rewrites taken from the written set,
# which passed 256 entries and became one widened span that heals
# nothing, F2 and every later FLUSH fail.
source ./functions.sh
set -e
set -x

requires_python_nbd
plug_tmpdir
test -f "$SHIM_PWRITEV" || fail "$SHIM_PWRITEV not built"

cat > "$tmp/client.py" <<'PY'
import plugtest, sys, time
from plugtest import SETTLE, check, check_flush, connect, outcome, \
    pwrite_settled, set_control
uri, control = sys.argv[1:3]
K = 1024
bad = []

h = connect(uri)
h.flush()
set_control(control, "fail")
pwrite_settled(h, b"A" * (64 * K), 0)
set_control(control, "ok")
check_flush(h, "setup: FLUSH F1", "EIO", bad, "A was lost")
h.pwrite(b"a" * (64 * K), 0)
for i in range(300):
    h.pwrite(b"x" * 512, 1024 * K + i * 4 * K)
time.sleep(SETTLE)
f2, f3 = outcome(h.flush), outcome(h.flush)
print("F3: %s" % f3)
check(bad, "FLUSH F2", f2, "ok",
      "A was written again and F2's sync covered the rewrite; 300 other "
      "writes since the last sync must not keep the loss in the record "
      "(F3: %s)" % f3)
plugtest.verdict(bad, "the rewrite and its FLUSH healed the record")
PY

img=$tmp/disk.img
truncate -s 4M "$img"
echo ok > "$tmp/ctl"
SERVER_WRAP="env LD_PRELOAD=$SHIM_PWRITEV SHIM_PATH=$img SHIM_ERRNO=5 SHIM_FAIL_LO=0 SHIM_FAIL_HI=65536 SHIM_CONTROL=$tmp/ctl" \
  start_plug many file="$img" direct=never idle=10ms
run_client many 60 "$tmp/client.py" "$tmp/ctl"
end_client many
