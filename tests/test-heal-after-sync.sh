#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A FLUSH that covers a lost write fails unless that write, or a newer
# one over its range, is on stable storage when the FLUSH is answered:
# a rewrite heals the record once a sync covered it (sync_healed), not
# when it is written.  Here a write W2 sent after the FLUSH F is
# written during the sync F waits for, which began before it.
#   writeback, direct=never, idle=10ms; file writes to [0, 64 KiB) fail
#   (shim-pwritev, SHIM_CONTROL) and every fdatasync takes 1 s
#   (shim-fdatasync, SHIM_DELAY_US; its control file SHIM_SYNC_CONTROL).
#   1. W1 = 64 KiB "A" at 0: acknowledged, its run fails (THE RECORD).
#   2. FLUSH F (async): it covers W1 and starts a round of syncs.
#   3. the range heals; W2 = 64 KiB "B" at 0: acknowledged and written
#      while F's sync runs.
#   4. F's answer.
# Case "durable": SHIM_DURABLE snapshots the file at the start of each
# sync.  F must fail, or the snapshot must hold W1 or W2 at 0.
# Case "syncfail": that one sync fails (the sync control file says
# "fail-once" from the start).  F must fail: the only sync it waited
# for failed, and W1 is lost.
# Shown able to fail: with a rewrite healing the record as soon as it
# is written, F answers success in both cases (5/5 runs each).
source ./functions.sh
set -e
set -x

requires_python_nbd
plug_tmpdir
test -f "$SHIM_PWRITEV" || fail "$SHIM_PWRITEV not built"
test -f "$SHIM_FDATASYNC" || fail "$SHIM_FDATASYNC not built"

cat > "$tmp/client.py" <<'PY'
import nbd, os, sys, time
uri, ctl, durable, case = sys.argv[1:5]
K = 1024
h = nbd.NBD()
h.connect_uri(uri)
h.pwrite(b"A" * (64 * K), 0)        # W1: acknowledged, then fails
time.sleep(0.3)                     # idle=10ms unplugs it; its run fails
f = h.aio_flush()                   # F: covers W1; its sync takes 1 s
time.sleep(0.2)
open(ctl, "w").write("ok\n")
h.pwrite(b"B" * (64 * K), 0)        # W2: after F, written during F's sync
try:
    while not h.aio_command_completed(f):
        h.poll(-1)
except nbd.Error as e:
    print("%s: F failed: %s" % (case, e))
    sys.exit(0)
if case == "syncfail":
    sys.exit("syncfail: FLUSH F succeeded although the one sync it waited "
             "for failed and W1 (acknowledged before F) was lost")
d = open(durable, "rb").read(64 * K)
if d not in (b"A" * (64 * K), b"B" * (64 * K)):
    sys.exit("durable: FLUSH F succeeded, but stable storage at 0 holds %r..."
             ": neither W1 (acknowledged before F, lost) nor a newer write"
             % d[:8])
print("durable: F succeeded and stable storage holds a covered version")
PY

failed=()
for case in durable syncfail; do
  echo fail > "$tmp/$case.ctl"
  if [ $case = syncfail ]; then sync=fail-once; else sync=ok; fi
  echo $sync > "$tmp/$case.sctl"
  img=$tmp/$case.img
  truncate -s 4M "$img"
  SERVER_WRAP="env LD_PRELOAD=$SHIM_PWRITEV:$SHIM_FDATASYNC SHIM_PATH=$img SHIM_FAIL_LO=0 SHIM_FAIL_HI=65536 SHIM_CONTROL=$tmp/$case.ctl SHIM_SYNC_CONTROL=$tmp/$case.sctl SHIM_DELAY_US=1000000 SHIM_DURABLE=$tmp/$case.durable" \
    start_plug $case file="$img" direct=never idle=10ms
  timeout 60 /usr/bin/python3 "$tmp/client.py" "$(server_uri $case)" \
          "$tmp/$case.ctl" "$tmp/$case.durable" $case || failed+=($case)
  stop_server $case
done
[ ${#failed[@]} -eq 0 ] || fail "a FLUSH lied in: ${failed[*]}"
