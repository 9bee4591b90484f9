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
shim=$abs_top_builddir/tests/.libs/shim-fdatasync.so
test -f "$shim" || fail "$shim not built"

cat > "$tmp/client.py" <<'PY'
import nbd, os, sys, time
uri, ctl, mode = sys.argv[1:4]
K = 1024
def setctl(s):
    open(ctl + ".tmp", "w").write(s + "\n")
    os.rename(ctl + ".tmp", ctl)
def wait(hh, c):
    try:
        while not hh.aio_command_completed(c):
            hh.poll(-1)
        return "ok"
    except nbd.Error as e:
        return e.string
def answer(f):
    try:
        f()
        return "ok"
    except nbd.Error as e:
        return e.string
h = nbd.NBD()
h.connect_uri(uri)
h.flush()
h.pwrite(b"A" * (64 * K), 0)
time.sleep(0.3)
setctl("hold")
f0 = h.aio_flush()
time.sleep(0.3)
g = nbd.NBD()
g.connect_uri(uri)
fua = g.aio_pwrite(bytearray(b"B" * (64 * K)), 0, flags=nbd.CMD_FLAG_FUA)
time.sleep(0.5)
setctl("fail-once")
r0 = wait(h, f0)
rb = wait(g, fua)
f2 = answer(h.flush)
f3 = answer(g.flush)
print("%s: F0: %s; FUA B: %s; FLUSH after: %s / %s" % (mode, r0, rb, f2, f3))
if r0 == "ok":
    sys.exit("%s: F0 succeeded although its only sync failed" % mode)
if rb != "ok" and (f2 == "ok" or f3 == "ok"):
    sys.exit("%s: FLUSH succeeded: it covers A (acknowledged, lost when "
             "the sync failed), and the only newer write over A, the FUA "
             "write B, was answered with an error" % mode)
PY

failed=()
for mode in writeback hold; do
  img=$tmp/$mode.img
  truncate -s 4M "$img"
  echo ok > "$tmp/$mode.ctl"
  SERVER_WRAP="env LD_PRELOAD=$shim SHIM_PATH=$img SHIM_CONTROL=$tmp/$mode.ctl" \
    start_plug $mode file="$img" mode=$mode direct=never idle=10ms
  timeout 60 /usr/bin/python3 "$tmp/client.py" "$(server_uri $mode)" \
          "$tmp/$mode.ctl" $mode || failed+=($mode)
  stop_server $mode
done
[ ${#failed[@]} -eq 0 ] || fail "a FLUSH lied in: ${failed[*]}"
