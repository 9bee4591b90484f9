#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A write that a failed sync recorded as lost heals no older loss: its
# own data may be gone (a failed sync records what was written since the
# last successful one because Linux reports a writeback error to one
# sync only).  Here the rewrite is a FUA write, answered with EIO.
#   1. FLUSH (first round, real sync).
#   2. A = 64 KiB "A" at 0, acknowledged, written (idle=10ms).
#   3. syncs held (shim-fdatasync "hold"); FLUSH F0 (round 1: A).
#   4. FUA B = 64 KiB "B" at 0 on a second connection: written while
#      round 1 is held, so it waits for round 2.
#   5. "fail-once": round 1 fails (A and B recorded lost); round 2 is real.
#   6. F0 fails; B is answered EIO (its own loss).
#   7. FLUSH F2 covers A.  A was acknowledged and lost; the only newer
#      write over it, B, was answered with an error (and is in the record
#      as lost until its answer forgets it).  F2 must fail.
# Shown able to fail: with every written range healing at the next
# successful sync, F2 succeeds (round 2 heals A through B, then
# record_forget_op drops B: the record is empty).
source ./functions.sh
set -e
set -x

requires_python_nbd
plug_tmpdir
test -f "$SHIM_FDATASYNC" || fail "$SHIM_FDATASYNC not built"

cat > "$tmp/client.py" <<'PY'
import nbd, plugtest, sys, time
from plugtest import answer, check, connect, held_flush, outcome, \
    pwrite_settled, set_control
uri, control, mode = sys.argv[1:4]
K = 1024
bad = []

h = connect(uri)
h.flush()
pwrite_settled(h, b"A" * (64 * K), 0)
f0 = held_flush(h, control)
g = connect(uri)
fua = g.aio_pwrite(bytearray(b"B" * (64 * K)), 0, flags=nbd.CMD_FLAG_FUA)
time.sleep(0.5)
set_control(control, "fail-once")
check(bad, "%s: setup: F0" % mode, answer(h, f0), "EIO",
      "its only sync failed")
rb = answer(g, fua)
f2, f3 = outcome(h.flush), outcome(g.flush)
print("%s: FUA B: %s" % (mode, rb))
if rb != "ok":
    why = ("it covers A (acknowledged, lost when the sync failed), and the "
           "only newer write over A, the FUA write B, was answered with an "
           "error")
    check(bad, "%s: FLUSH after, connection 1" % mode, f2, "EIO", why)
    check(bad, "%s: FLUSH after, connection 2" % mode, f3, "EIO", why)
plugtest.verdict(bad, "%s: no FLUSH lied" % mode)
PY

for mode in writeback hold; do
  img=$tmp/$mode.img
  truncate -s 4M "$img"
  echo ok > "$tmp/$mode.ctl"
  SERVER_WRAP="env LD_PRELOAD=$SHIM_FDATASYNC SHIM_PATH=$img SHIM_CONTROL=$tmp/$mode.ctl" \
    start_plug $mode file="$img" mode=$mode direct=never idle=10ms
  run_client $mode 60 "$tmp/client.py" "$tmp/$mode.ctl" $mode
  echo ok > "$tmp/$mode.ctl"    # A failed client may have left a sync held.
  end_client $mode
done
