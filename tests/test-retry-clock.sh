#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# "Not now" (EAGAIN) may drop an acknowledged write only after the file
# refused for requeue-timeout without a success in between.  The file's
# retry clock measures one stretch of refusals: it starts again after a
# give-up that left the file with nothing queued or in flight, so a
# later short refusal is retried, not given up at once.
#   writeback, direct=never, idle=10ms, requeue-timeout=1s; every write to
#   the file fails with EAGAIN while SHIM_CONTROL says "fail"
#   (shim-pwritev, SHIM_ERRNO=11).
#   1. the file refuses for 2.5 s: write A (64 KiB at 0) is given up on
#      (expected: that is requeue-timeout).
#   2. the file accepts again; nothing is written for 3 s.
#   3. the file refuses for 50 ms while write B (64 KiB at 1 MiB) goes
#      out; then accepts.  The retries (requeue-delay=3ms) must write B.
#   4. clean disconnect, server exit; B must be in the file.
# Shown able to fail: with the clock reset by successes only, B is given
# up on at its first EAGAIN (3/3 runs).
source ./functions.sh
set -e
set -x

requires_python_nbd
plug_tmpdir
test -f "$SHIM_PWRITEV" || fail "$SHIM_PWRITEV not built"

cat > "$tmp/client.py" <<'PY'
import nbd, sys, time
uri, ctl, img = sys.argv[1:4]
K = 1024
h = nbd.NBD()
h.connect_uri(uri)
open(ctl, "w").write("fail\n")
h.pwrite(b"A" * (64 * K), 0)
time.sleep(2.5)                     # refused for > requeue-timeout: A given up
open(ctl, "w").write("ok\n")
time.sleep(3)                       # the file is fine; nothing written
open(ctl, "w").write("fail\n")
h.pwrite(b"B" * (64 * K), 1024 * K) # acknowledged
time.sleep(0.05)                    # one short "not now"
open(ctl, "w").write("ok\n")
time.sleep(0.5)
h.shutdown()
PY

img=$tmp/disk.img
truncate -s 4M "$img"
echo ok > "$tmp/ctl"
SERVER_WRAP="env LD_PRELOAD=$SHIM_PWRITEV SHIM_PATH=$img SHIM_ERRNO=11 SHIM_CONTROL=$tmp/ctl" \
  start_plug eagain file="$img" direct=never idle=10ms requeue-timeout=1s
timeout 60 /usr/bin/python3 "$tmp/client.py" "$(server_uri eagain)" \
        "$tmp/ctl" "$img"
stop_server eagain
/usr/bin/python3 - "$img" <<'PY'
import sys
d = open(sys.argv[1], "rb").read()[1 << 20:(1 << 20) + 65536]
if d != b"B" * 65536:
    sys.exit("acknowledged write B is not in the file after a 50 ms EAGAIN "
             "(the file had accepted writes again for 3 s): it holds %r..."
             % d[:8])
print("B is in the file")
PY
