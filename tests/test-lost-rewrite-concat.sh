#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A rewrite that a failed sync recorded as lost heals no older loss:
# its own data may be gone too (a failed sync records everything written
# since the last successful one: Linux reports a writeback error to one
# sync only).  Plain writes, an export of two concatenated files (so a
# FLUSH can wait for the second round while covering only the first
# write); syncs of file 1 are held, then fail once (shim-fdatasync).
#   1. FLUSH (first round).
#   2. A = 64 KiB "A" at 0 (file 1): acknowledged, written.
#   3. hold; FLUSH F0: round 1 syncs file 1 (held).
#   4. X = 4 KiB at 4 MiB (file 2): written during round 1.
#   5. FLUSH F (second connection): covers A and X; file 2 was written
#      since round 1 began, so F waits for round 2.
#   6. W = 64 KiB "B" at 0 (file 1): acknowledged after F was sent (F
#      does not cover it), written during round 1.
#   7. fail-once: round 1's sync of file 1 fails: A and W recorded lost.
#      Round 2 syncs files 1 and 2 for real.
#   8. F's answer; then FLUSH F3.
# F covers A, which is lost; the only newer write over A is W, which the
# plugin itself reports lost (F3 fails for it).  F must fail.
# Shown able to fail: with a failed sync's writes still healing, F
# succeeds (round 2's sync of W heals A), while F3 fails.
source ./functions.sh
set -e
set -x

requires_python_nbd
plug_tmpdir
shim=$abs_top_builddir/tests/.libs/shim-fdatasync.so
test -f "$shim" || fail "$shim not built"

cat > "$tmp/client.py" <<'PY'
import nbd, os, sys, time
uri, ctl = sys.argv[1:3]
K = 1024
M = 1024 * K
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
g = nbd.NBD()
g.connect_uri(uri)
h.flush()
h.pwrite(b"A" * (64 * K), 0)
time.sleep(0.3)
setctl("hold")
f0 = h.aio_flush()
time.sleep(0.3)
h.pwrite(b"X" * (4 * K), 4 * M)
time.sleep(0.3)
f = g.aio_flush()
time.sleep(0.3)
h.pwrite(b"B" * (64 * K), 0)
time.sleep(0.3)
setctl("fail-once")
r0 = wait(h, f0)
rf = wait(g, f)
f3 = answer(h.flush)
print("F0: %s; F: %s; F3: %s" % (r0, rf, f3))
if r0 == "ok":
    sys.exit("setup: F0 succeeded although its only sync failed")
if rf == "ok":
    sys.exit("FLUSH F succeeded: it covers A (acknowledged, lost when the "
             "sync failed), and the only newer write over A, W, is lost "
             "too (F3: %s)" % f3)
PY

f1=$tmp/f1.img
f2=$tmp/f2.img
truncate -s 4M "$f1" "$f2"
echo ok > "$tmp/ctl"
SERVER_WRAP="env LD_PRELOAD=$shim SHIM_PATH=$f1 SHIM_CONTROL=$tmp/ctl" \
  start_plug concat file="$f1" file="$f2" direct=never idle=10ms
rc=0
timeout 60 /usr/bin/python3 "$tmp/client.py" "$(server_uri concat)" \
        "$tmp/ctl" || rc=$?
stop_server concat
[ $rc -eq 0 ] || fail "a FLUSH covering a lost write succeeded"
