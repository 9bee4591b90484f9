#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# test-state-log.sh - -D plug.state=1 logs every change of state of the
# engine's machines, one line each, in the order they happen.
#
# One connection (writeback, direct=never) writes 4 KiB, which is held
# and acknowledged at once, then sends a FLUSH, which writes it out and
# syncs.  The log must show, in this order: the write's op NEW -> ACKED;
# the run made of it reaching INFLIGHT, then DONE; the FLUSH's op
# reaching SYNC_WAIT, then ANSWERED, then FINISHED; the connection
# OPEN -> CLOSING at its close.  Without the flag no such line appears.
# The server must exit 0 both times.
# Shown able to fail: with plugin.c's hook left unset (plug_debug_state
# ignored) "no state lines".
source ./functions.sh
set -e
set -x

requires_python_nbd
plug_tmpdir

client ()
{
  timeout 120 /usr/bin/python3 - "$1" <<'PYEOF'
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b"s" * 4096, 0)
h.flush()
h.shutdown()
PYEOF
}

truncate -s 1M "$tmp/img"
start_plug st -v -D plug.state=1 -- file="$tmp/img" direct=never \
           idle=10s max-delay=60s
client "$(server_uri st)"
stop_server st
log=$(server_log st)
grep -E ': (op|run|conn|file|pace|engine) [0-9]+: [A-Z_]+ -> [A-Z_]+$' \
  "$log" > "$tmp/states" || fail "no state lines"
cat "$tmp/states"

/usr/bin/python3 - "$tmp/states" <<'PYEOF'
import re, sys
lines = [l.split("debug: ", 1)[1].strip() for l in open(sys.argv[1])]
def first(pattern, after=-1):
    for i, l in enumerate(lines):
        if i > after and re.fullmatch(pattern, l):
            return i
    sys.exit("no line %r after line %d of the state log" % (pattern, after))
w = first(r"op (\d+): NEW -> ACKED")
wop = re.fullmatch(r"op (\d+): .*", lines[w]).group(1)
r = first(r"run (\d+): [A-Z]+ -> INFLIGHT", w)
run = re.fullmatch(r"run (\d+): .*", lines[r]).group(1)
first(r"run %s: INFLIGHT -> DONE" % run, r)
s = first(r"op (\d+): [A-Z_]+ -> SYNC_WAIT", w)
fop = re.fullmatch(r"op (\d+): .*", lines[s]).group(1)
if fop == wop:
    sys.exit("the FLUSH's op has the write's number %s" % wop)
a = first(r"op %s: SYNC_WAIT -> ANSWERED" % fop, s)
first(r"op %s: ANSWERED -> FINISHED" % fop, a)
first(r"conn \d+: OPEN -> CLOSING", a)
print("state log: %d lines, in the expected order" % len(lines))
PYEOF

# Without the flag: no state line.
start_plug quiet -v -- file="$tmp/img" direct=never idle=10s max-delay=60s
client "$(server_uri quiet)"
stop_server quiet
if grep -E ': (op|run|conn) [0-9]+: [A-Z_]+ -> ' "$(server_log quiet)"; then
  fail "state lines without -D plug.state=1"
fi
