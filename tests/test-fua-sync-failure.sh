#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# THE RECORD holds acknowledged writes that were lost, and only those.
# A FUA write whose sync fails is answered with EIO (its client knows):
# it is not acknowledged, so it leaves the record (record_forget_op),
# as a plain write answered with its error never enters it.
#   1. FLUSH (the file's first sync: nothing is left unsynced).
#   2. FUA write of 64 KiB at 0 whose fdatasync fails
#      (shim-fdatasync, its control file says "fail-once" from then
#      on): answered EIO, as it must be.
#   3. FLUSH on the same connection, and on a new one: nothing
#      acknowledged was lost, both must succeed.
# Run in writeback and hold mode.  Shown able to fail: with the FUA
# write's own range kept in the record, the FLUSHes fail with EIO until
# [0, 64 KiB) is written again (both modes, every run).
source ./functions.sh
set -e
set -x

requires_python_nbd
plug_tmpdir
test -f "$SHIM_FDATASYNC" || fail "$SHIM_FDATASYNC not built"

cat > "$tmp/client.py" <<'PY'
import nbd, sys
from plugtest import outcome, set_control
uri, control, mode = sys.argv[1:4]
K = 1024

h = nbd.NBD()
h.connect_uri(uri)
h.flush()
set_control(control, "fail-once")
fua = outcome(lambda: h.pwrite(b"F" * (64 * K), 0, nbd.CMD_FLAG_FUA))
if fua == "ok":
    sys.exit("%s: the FUA write succeeded although its sync failed" % mode)
same = outcome(h.flush)
g = nbd.NBD()
g.connect_uri(uri)
other = outcome(g.flush)
print("%s: FUA write: %s; FLUSH then: %s; on a new connection: %s"
      % (mode, fua, same, other))
if same != "ok" or other != "ok":
    sys.exit("%s: FLUSH failed after a FUA write that was answered with "
             "an error; no acknowledged write was lost" % mode)
PY

failed=()
for mode in writeback hold; do
  img=$tmp/$mode.img
  truncate -s 4M "$img"
  echo ok > "$tmp/$mode.ctl"
  SERVER_WRAP="env LD_PRELOAD=$SHIM_FDATASYNC SHIM_PATH=$img SHIM_CONTROL=$tmp/$mode.ctl" \
    start_plug $mode file="$img" mode=$mode
  timeout 60 /usr/bin/python3 "$tmp/client.py" "$(server_uri $mode)" \
          "$tmp/$mode.ctl" $mode || failed+=($mode)
  stop_server $mode
done
[ ${#failed[@]} -eq 0 ] || fail "FLUSH over-reported in: ${failed[*]}"
