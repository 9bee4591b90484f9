#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# The retry clock measures one stretch of "not now" (man page, "Errors
# and retries": "once the file has nothing queued or in flight, a later
# "not now" starts a retry-timeout of its own").  A stretch may end with
# a real error instead of a success or a give-up: the next stretch must
# still get its own retry-timeout.
#   -D plug.inject_eagain=2 (every 2nd backend write is refused with
#   EAGAIN), retry-timeout=1s, direct=never; writes to [0, 64 KiB) fail
#   with EIO (shim-pwritev, no control file: always).
#   1. W0, 4 KiB at 1 MiB: backend call 1, written.
#   2. W1, 4 KiB at 0: call 2 refused (the clock starts), call 3 fails
#      with EIO: W1 fails (its client waits: hold mode, or FUA).
#   3. 1.5 s with nothing queued or in flight.
#   4. W2, 4 KiB at 2 MiB: call 4 refused once, call 5 would write it.
#      W2 must succeed (hold: its answer; writeback: a FLUSH after it).
# Shown able to fail: with the clock reset only by a success or a
# give-up, W2 is given up at its first EAGAIN ("giving up after
# retry-timeout"), the clock still running from step 2.
source ./functions.sh
set -e
set -x

requires_python_nbd
plug_tmpdir
test -f "$SHIM_PWRITEV" || fail "$SHIM_PWRITEV not built"

cat > "$tmp/client.py" <<'PY'
import nbd, sys, time
uri, mode = sys.argv[1:3]
K = 1024
def answer(f):
    try:
        f()
        return "ok"
    except nbd.Error as e:
        return e.string
h = nbd.NBD()
h.connect_uri(uri)
fua = nbd.CMD_FLAG_FUA if mode == "writeback" else 0
w0 = answer(lambda: h.pwrite(b"0" * (4 * K), 1024 * K, fua))
w1 = answer(lambda: h.pwrite(b"1" * (4 * K), 0, fua))
time.sleep(1.5)
w2 = answer(lambda: h.pwrite(b"2" * (4 * K), 2048 * K))
fl = answer(h.flush)
print("%s: W0 %s; W1 %s; W2 %s; FLUSH %s" % (mode, w0, w1, w2, fl))
if w0 != "ok" or w1 == "ok":
    sys.exit("%s: setup: W0 must succeed and W1 fail" % mode)
if w2 != "ok" or fl != "ok":
    sys.exit("%s: W2 was refused once (EAGAIN), 1.5 s after the last "
             "stretch of refusals ended with a real error, and was given "
             "up instead of retried" % mode)
PY

failed=()
for mode in hold writeback; do
  img=$tmp/$mode.img
  truncate -s 4M "$img"
  SERVER_WRAP="env LD_PRELOAD=$SHIM_PWRITEV SHIM_PATH=$img SHIM_ERRNO=5 SHIM_FAIL_LO=0 SHIM_FAIL_HI=65536" \
    start_plug $mode -D plug.inject_eagain=2 -- file="$img" mode=$mode \
      direct=never idle=10ms retry-timeout=1s
  timeout 60 /usr/bin/python3 "$tmp/client.py" "$(server_uri $mode)" $mode ||
    failed+=($mode)
  stop_server $mode
done
[ ${#failed[@]} -eq 0 ] || fail "a write given up at its first EAGAIN in: ${failed[*]}"
