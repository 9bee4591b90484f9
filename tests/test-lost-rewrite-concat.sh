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
test -f "$SHIM_FDATASYNC" || fail "$SHIM_FDATASYNC not built"

cat > "$tmp/client.py" <<'PY'
import plugtest, sys, time
from plugtest import SETTLE, answer, check, connect, held_flush, outcome, \
    pwrite_settled, set_control
uri, control = sys.argv[1:3]
K = 1024
M = 1024 * K
bad = []

h, g = connect(uri), connect(uri)
h.flush()
pwrite_settled(h, b"A" * (64 * K), 0)
f0 = held_flush(h, control)
pwrite_settled(h, b"X" * (4 * K), 4 * M)
f = g.aio_flush()
time.sleep(SETTLE)
pwrite_settled(h, b"B" * (64 * K), 0)
set_control(control, "fail-once")
check(bad, "setup: F0", answer(h, f0), "EIO", "its only sync failed")
rf = answer(g, f)
f3 = outcome(h.flush)
print("F3: %s" % f3)
check(bad, "FLUSH F", rf, "EIO",
      "it covers A (acknowledged, lost when the sync failed), and the only "
      "newer write over A, W, is lost too (F3: %s)" % f3)
plugtest.verdict(bad, "no FLUSH covering a lost write succeeded")
PY

f1=$tmp/f1.img
f2=$tmp/f2.img
truncate -s 4M "$f1" "$f2"
echo ok > "$tmp/ctl"
SERVER_WRAP="env LD_PRELOAD=$SHIM_FDATASYNC SHIM_PATH=$f1 SHIM_CONTROL=$tmp/ctl" \
  start_plug concat file="$f1" file="$f2" direct=never idle=10ms
run_client concat 60 "$tmp/client.py" "$tmp/ctl"
echo ok > "$tmp/ctl"            # A failed client may have left a sync held.
end_client concat
