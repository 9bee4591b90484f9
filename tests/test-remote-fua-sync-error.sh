#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A remote FUA write that fails may have failed in the server's sync
# (nbdkit file: pwrite then fdatasync), and Linux reports a writeback
# error to one sync only: the writes the server answered before it and
# no FLUSH covered may be gone, as the plugin assumes for its own files
# ("A sync that fails records every range written to that file since
# its last successful sync as lost").  A later FLUSH must not succeed
# over them.
#   server: nbdkit file, whose fdatasync fails once on demand
#   (shim-fdatasync, fail-once); plug file=nbd+unix://...
#   1. FLUSH; C = 4 KiB at 1 MiB, acknowledged, answered by the server.
#   2. the server's next sync fails; E = FUA write of 4 KiB at 2 MiB:
#      the server's fdatasync fails, E is answered EIO.
#   3. FLUSH F: covers C, which the failed server sync may have lost.
# Shown able to fail: without fua_failed (plugin/remote.c), F succeeds.
source ./functions.sh
set -e
set -x

requires_python_nbd
plug_tmpdir
test -f "$SHIM_FDATASYNC" || fail "$SHIM_FDATASYNC not built"

cat > "$tmp/client.py" <<'PY'
import nbd, plugtest, sys
from plugtest import check, check_flush, connect, outcome, pwrite_settled, \
    set_control
uri, control = sys.argv[1:3]
K = 1024
bad = []

h = connect(uri)
h.flush()
pwrite_settled(h, b"C" * (4 * K), 1024 * K)
set_control(control, "fail-once")
check(bad, "setup: FUA E",
      outcome(lambda: h.pwrite(b"E" * (4 * K), 2048 * K, nbd.CMD_FLAG_FUA)),
      "EIO", "the server's sync failed")
check_flush(h, "FLUSH F", "EIO", bad,
            "the server's sync failed with C answered and not yet flushed")
plugtest.verdict(bad, "no FLUSH succeeded over what a failed server sync "
                 "may have lost")
PY

img=$tmp/srv.img
truncate -s 4M "$img"
echo ok > "$tmp/sfail"
SERVER_WRAP="env LD_PRELOAD=$SHIM_FDATASYNC SHIM_PATH=$img SHIM_CONTROL=$tmp/sfail" \
  start_server srv file "$img"
SERVER_WRAP= start_plug plug file="$(server_uri srv)" idle=10ms
run_client plug 60 "$tmp/client.py" "$tmp/sfail"
end_client plug
stop_server srv
