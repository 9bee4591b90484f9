#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# The retry clock measures one stretch of "not now" (man page, "Errors
# and retries": "once the file has nothing queued or in flight, a later
# "not now" starts a requeue-timeout of its own").  A stretch may end with
# a real error instead of a success or a give-up: the next stretch must
# still get its own requeue-timeout.
#   -D plug.inject_eagain=2 (every 2nd backend write is refused with
#   EAGAIN), requeue-timeout=1s, direct=never; writes to [0, 64 KiB) fail
#   with EIO (shim-pwritev, no control file: always).
#   1. W0, 4 KiB at 1 MiB: backend call 1, written.
#   2. W1, 4 KiB at 0: call 2 refused (the clock starts), call 3 fails
#      with EIO: W1 fails (its client waits: hold mode, or FUA).
#   3. 1.5 s with nothing queued or in flight.
#   4. W2, 4 KiB at 2 MiB: call 4 refused once, call 5 would write it.
#      W2 must succeed (hold: its answer; writeback: a FLUSH after it).
# Shown able to fail: with the clock reset only by a success or a
# give-up, W2 is given up at its first EAGAIN ("giving up after
# requeue-timeout"), the clock still running from step 2.
source ./functions.sh
set -e
set -x

requires_python_nbd
plug_tmpdir
test -f "$SHIM_PWRITEV" || fail "$SHIM_PWRITEV not built"

cat > "$tmp/client.py" <<'PY'
import nbd, plugtest, sys, time
from plugtest import check, check_flush, connect, outcome
uri, mode = sys.argv[1:3]
K = 1024
bad = []

h = connect(uri)
fua = nbd.CMD_FLAG_FUA if mode == "writeback" else 0
check(bad, "%s: setup: W0" % mode,
      outcome(lambda: h.pwrite(b"0" * (4 * K), 1024 * K, fua)), "ok")
check(bad, "%s: setup: W1" % mode,
      outcome(lambda: h.pwrite(b"1" * (4 * K), 0, fua)), "EIO",
      "writes to [0, 64 KiB) fail")
time.sleep(1.5)
why = ("refused once (EAGAIN), 1.5 s after the last stretch of refusals "
       "ended with a real error: retried, not given up")
check(bad, "%s: W2" % mode,
      outcome(lambda: h.pwrite(b"2" * (4 * K), 2048 * K)), "ok", why)
check_flush(h, "%s: FLUSH" % mode, "ok", bad, why)
plugtest.verdict(bad, "%s: W2 was retried" % mode)
PY

for mode in hold writeback; do
  img=$tmp/$mode.img
  truncate -s 4M "$img"
  SERVER_WRAP="env LD_PRELOAD=$SHIM_PWRITEV SHIM_PATH=$img SHIM_ERRNO=5 SHIM_FAIL_LO=0 SHIM_FAIL_HI=65536" \
    start_plug $mode -D plug.inject_eagain=2 -- file="$img" mode=$mode \
      direct=never idle=10ms requeue-timeout=1s
  run_client $mode 60 "$tmp/client.py" $mode
  end_client $mode
done
