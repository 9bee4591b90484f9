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
import nbd, os, sys, time
uri, ctl = sys.argv[1:3]
K = 1024
def setctl(s):
    open(ctl + ".tmp", "w").write(s + "\n")
    os.rename(ctl + ".tmp", ctl)
def answer(f):
    try:
        f()
        return "ok"
    except nbd.Error as e:
        return e.string
h = nbd.NBD()
h.connect_uri(uri)
h.flush()
setctl("fail")
h.pwrite(b"A" * (64 * K), 0)
time.sleep(0.3)
setctl("ok")
f1 = answer(h.flush)
h.pwrite(b"a" * (64 * K), 0)
for i in range(300):
    h.pwrite(b"x" * 512, 1024 * K + i * 4 * K)
time.sleep(0.3)
f2 = answer(h.flush)
f3 = answer(h.flush)
print("F1: %s; F2: %s; F3: %s" % (f1, f2, f3))
if f1 == "ok":
    sys.exit("setup: F1 succeeded although A was lost")
if f2 != "ok":
    sys.exit("F2 failed: A was written again and F2's sync covered the "
             "rewrite, but 300 other writes since the last sync kept the "
             "loss in the record (F3: %s)" % f3)
PY

img=$tmp/disk.img
truncate -s 4M "$img"
echo ok > "$tmp/ctl"
SERVER_WRAP="env LD_PRELOAD=$SHIM_PWRITEV SHIM_PATH=$img SHIM_ERRNO=5 SHIM_FAIL_LO=0 SHIM_FAIL_HI=65536 SHIM_CONTROL=$tmp/ctl" \
  start_plug many file="$img" direct=never idle=10ms
rc=0
timeout 60 /usr/bin/python3 "$tmp/client.py" "$(server_uri many)" \
        "$tmp/ctl" || rc=$?
stop_server many
[ $rc -eq 0 ] || fail "a rewrite followed by a FLUSH did not heal the record"
