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
import nbd, os, sys, time
uri, sfail = sys.argv[1:3]
K = 1024
def answer(f):
    try:
        f()
        return "ok"
    except nbd.Error as e:
        return e.string
h = nbd.NBD()
h.connect_uri(uri)
h.flush()
h.pwrite(b"C" * (4 * K), 1024 * K)
time.sleep(0.3)
open(sfail + ".new", "w").write("fail-once\n")
os.rename(sfail + ".new", sfail)
e = answer(lambda: h.pwrite(b"E" * (4 * K), 2048 * K, nbd.CMD_FLAG_FUA))
f = answer(h.flush)
print("FUA E: %s; FLUSH F: %s" % (e, f))
if e == "ok":
    sys.exit("setup: E succeeded although the server's sync failed")
if f == "ok":
    sys.exit("FLUSH F succeeded after the server's sync failed with C "
             "answered and not yet flushed")
PY

img=$tmp/srv.img
truncate -s 4M "$img"
echo ok > "$tmp/sfail"
SERVER_WRAP="env LD_PRELOAD=$SHIM_FDATASYNC SHIM_PATH=$img SHIM_CONTROL=$tmp/sfail" \
  start_server srv file "$img"
SERVER_WRAP= start_plug plug file="$(server_uri srv)" idle=10ms
rc=0
timeout 60 /usr/bin/python3 "$tmp/client.py" "$(server_uri plug)" \
        "$tmp/sfail" || rc=$?
stop_server plug
stop_server srv
[ $rc -eq 0 ] || fail "a FLUSH succeeded over writes a failed server sync may have lost"
