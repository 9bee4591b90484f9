#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# A FLUSH reaches only the NBD servers that answered a write since the
# last FLUSH that succeeded there (a FLUSH covers what the server
# answered before it: NBD spec), and always the first time.  Two nbdkit
# memory servers A and B, concatenated; each one's log (--filter=log)
# counts the FLUSH commands it got:
#   FLUSH                       -> A 1, B 1   (first: always sent)
#   write to A, FLUSH           -> A 2, B 1
#   FLUSH, FLUSH                -> A 2, B 1   (both clean)
#   FUA write to B (no FUA)     -> A 2, B 2   (FUA emulated by a FLUSH)
#   zero on A, trim on B, FLUSH -> A 3, B 3
# and the data written is on the servers afterwards.
# A FLUSH covers only what the server answered before the FLUSH was
# sent: a write answered while a FLUSH is in flight at the server is
# not covered by it, and the next FLUSH must reach the server.  Server C
# (nbdkit eval over a file) holds each FLUSH until the test lets it go;
# in hold mode a client's write is answered once the server answered
# it.  Connection 1 sends a FLUSH; once C's log shows it arrived,
# connection 2 writes, then the FLUSH is let go, then connection 2
# sends a FLUSH: C's log must show a Flush after the write's answer.
# With the mark of what a FLUSH covers taken when it is answered instead
# of when it is sent, that last FLUSH finds the server clean and fails
# with "no Flush reached C after the write answered during its first
# Flush".
source ./functions.sh
set -e

requires test -x /usr/bin/python3
requires nbdkit eval --version
requires /usr/bin/python3 -c 'import nbd'
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

srv_start A unix --filter=log memory 1M logfile="$tmp/A.txt"
srv_start B tcp --filter=log --filter=fua memory 1M \
          logfile="$tmp/B.txt"
srv_start plug unix "$PLUGIN" "file=${srv_uri[A]}" "file=${srv_uri[B]}" \
          idle=0

cat > "$tmp/client.py" <<'EOF2'
import re, sys, time
import nbd

uri, alog, blog = sys.argv[1:4]
M = 1 << 20

def flushes(log):
    n = 0
    for line in open(log):
        if re.search(r" Flush id=\d+ \.\.\.$", line.rstrip("\n")):
            n += 1
    return n

def expect(step, a, b):
    # The log filter writes its line as the request arrives: a FLUSH the
    # plug sent was logged before its answer reached the plug.
    got = (flushes(alog), flushes(blog))
    print("%-32s A %d B %d flushes (expected %d %d)" % (step, got[0], got[1], a, b))
    if got != (a, b):
        sys.exit("FAIL: %s: servers got %r flushes, expected %r"
                 % (step, got, (a, b)))

h = nbd.NBD()
h.connect_uri(uri)
assert h.get_size() == 2 * M
h.flush()
expect("first FLUSH", 1, 1)
h.pwrite(b"a" * 4096, 8192)
h.flush()
expect("write to A, FLUSH", 2, 1)
h.flush()
h.flush()
expect("FLUSH, FLUSH", 2, 1)
h.pwrite(b"b" * 4096, M + 4096, nbd.CMD_FLAG_FUA)
expect("FUA write to B", 2, 2)
h.zero(4096, 65536)
h.trim(4096, M + 65536)
h.flush()
expect("zero on A, trim on B, FLUSH", 3, 3)
h.shutdown()
EOF2
/usr/bin/python3 "$tmp/client.py" "${srv_uri[plug]}" "$tmp/A.txt" "$tmp/B.txt"
srv_stop plug

# A FLUSH that unplugs one run of a server with FUA sends it with FUA
# and no NBD FLUSH after it (nothing else is left to cover); two runs,
# a server without FUA, or a run answered earlier without FUA still get
# the FLUSH, and so do runs for one server from two connections' plugs.
# idle=10s max-delay=60s direct=never: data stays held until the FLUSH
# (with the default max-delay=10ms, a client slower than that between
# its write and its FLUSH, as on a loaded machine, saw the write go out
# plain before the FLUSH came).
srv_start plug2 unix "$PLUGIN" "file=${srv_uri[A]}" "file=${srv_uri[B]}" \
          idle=10s max-delay=60s direct=never
cat > "$tmp/client2.py" <<'EOF2'
import re, sys
import nbd

uri, alog, blog = sys.argv[1:4]
M = 1 << 20

def count(log, pattern):
    return sum(1 for line in open(log) if re.search(pattern, line))

def state():
    return (count(alog, r" Flush id=\d+ \.\.\.$"),
            count(blog, r" Flush id=\d+ \.\.\.$"),
            count(alog, r" Write id=\d+ .* fua=1 "),
            count(blog, r" Write id=\d+ .* fua=1 "))

base = None
def expect(step, want):
    got = tuple(g - b for g, b in zip(state(), base))
    print("%-40s A/B flushes %d %d, A/B FUA writes %d %d (expected %r)"
          % ((step,) + got + (want,)))
    if got != want:
        sys.exit("FAIL: %s: got %r, expected %r" % (step, got, want))

h = nbd.NBD()
h.connect_uri(uri)
base = state()
h.flush()
expect("first FLUSH", (1, 1, 0, 0))
h.pwrite(b"c" * 4096, 16384)
h.pwrite(b"c" * 4096, 20480)
h.flush()
expect("one run on A, FLUSH", (1, 1, 1, 0))
h.pwrite(b"d" * 4096, 65536)
h.pwrite(b"d" * 4096, 262144)
h.flush()
expect("two runs on A, FLUSH", (2, 1, 1, 0))
h.pwrite(b"e" * 4096, M + 16384)
h.flush()
expect("one run on B (no FUA), FLUSH", (2, 2, 1, 0))
h.pwrite(b"f" * 4096, 131072)
h.flush()
expect("one run on A, FLUSH, again", (2, 2, 2, 0))
# The second write overlaps the held first: that unplugs it, a plain
# run answered before the FLUSH; the FLUSH's own run gets FUA and the
# server still gets the FLUSH for the first.
h.pwrite(b"g" * 4096, 196608)
h.pwrite(b"h" * 4096, 196608)
h.flush()
expect("overlap unplug, then FLUSH", (3, 2, 3, 0))
# A FLUSH unplugs every connection's plug: runs for A from two plugs
# are two plain writes and one FLUSH, not one FUA write each; a run
# that only the other connection held is the FLUSH's only one.
h2 = nbd.NBD()
h2.connect_uri(uri)
h.pwrite(b"i" * 4096, 327680)
h2.pwrite(b"j" * 4096, 393216)
h.flush()
expect("runs on A from two connections, FLUSH", (4, 2, 3, 0))
h2.pwrite(b"k" * 4096, 458752)
h.flush()
expect("the other connection's one run on A, FLUSH", (4, 2, 4, 0))
h2.shutdown()
h.shutdown()
EOF2
/usr/bin/python3 "$tmp/client2.py" "${srv_uri[plug2]}" "$tmp/A.txt" "$tmp/B.txt"
srv_stop plug2

/usr/bin/python3 - "${srv_uri[A]}" "${srv_uri[B]}" <<'EOF2'
import sys
import nbd
a, b = nbd.NBD(), nbd.NBD()
a.connect_uri(sys.argv[1])
b.connect_uri(sys.argv[2])
assert a.pread(4096, 8192) == b"a" * 4096, "A lost the write"
assert b.pread(4096, 4096) == b"b" * 4096, "B lost the FUA write"
assert a.pread(8192, 16384) == b"c" * 8192, "A lost the FLUSH's FUA run"
assert a.pread(4096, 65536) == b"d" * 4096, "A lost a run"
assert a.pread(4096, 262144) == b"d" * 4096, "A lost a run"
assert a.pread(4096, 131072) == b"f" * 4096, "A lost the last FUA run"
assert b.pread(4096, 16384) == b"e" * 4096, "B lost its run"
assert a.pread(4096, 196608) == b"h" * 4096, "A lost the newer overlap"
assert a.pread(4096, 327680) == b"i" * 4096, "A lost a two-connection run"
assert a.pread(4096, 393216) == b"j" * 4096, "A lost a two-connection run"
assert a.pread(4096, 458752) == b"k" * 4096, "A lost the other connection's run"
print("data on both servers")
EOF2
srv_stop A
srv_stop B

# ---- a write answered while a FLUSH is in flight ----
truncate -s 1M "$tmp/C.img"
srv_start C unix --filter=log eval logfile="$tmp/C.txt" \
  thread_model='echo parallel' get_size='echo 1048576' can_fua='echo none' \
  pread="dd if=$tmp/C.img skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none" \
  pwrite="dd of=$tmp/C.img seek=\$4 conv=notrunc oflag=seek_bytes status=none" \
  flush="for i in \$(seq 600); do [ -e $tmp/C.go ] && break; sleep 0.05; done"
srv_start plug3 unix "$PLUGIN" "file=${srv_uri[C]}" mode=hold
cat > "$tmp/client3.py" <<'EOF2'
import os, re, sys, time
import nbd

uri, log, go = sys.argv[1:4]

def lines():
    return [line.rstrip("\n") for line in open(log)]

def find(pattern):
    return [i for i, line in enumerate(lines()) if re.search(pattern, line)]

FLUSH = r" Flush id=\d+ \.\.\.$"
h1 = nbd.NBD()
h1.connect_uri(uri)
h2 = nbd.NBD()
h2.connect_uri(uri)
fl = h1.aio_flush()
for _ in range(600):
    if find(FLUSH):
        break
    h1.poll(0)
    time.sleep(0.05)
else:
    sys.exit("FAIL: the FLUSH did not reach C within 30 s")
# Hold mode: answered once C answered it, its first Flush still held.
h2.pwrite(b"w" * 4096, 65536)
open(go, "w").close()
while not h1.aio_command_completed(fl):
    h1.poll(-1)
h2.flush()
flushes = find(FLUSH)
answered = find(r" \.\.\.Write id=\d+ return=0$")
first_done = find(r" \.\.\.Flush id=\d+ return=0$")
print("C's log: Flush sent at lines %r, the write answered at %r, "
      "a Flush answered at %r" % (flushes, answered, first_done))
assert len(answered) == 1, "C answered %d writes" % len(answered)
if not (flushes[0] < answered[0] < first_done[0]):
    sys.exit("FAIL: the write was not answered during C's first Flush")
if not any(i > answered[0] for i in flushes):
    sys.exit("FAIL: no Flush reached C after the write answered during "
             "its first Flush")
h2.shutdown()
h1.shutdown()
EOF2
/usr/bin/python3 "$tmp/client3.py" "${srv_uri[plug3]}" "$tmp/C.txt" \
                 "$tmp/C.go"
srv_stop plug3
srv_stop C
/usr/bin/python3 - "$tmp/C.img" <<'EOF2'
import sys
d = open(sys.argv[1], "rb").read()
assert d[65536:65536 + 4096] == b"w" * 4096, "C lost the write"
EOF2
