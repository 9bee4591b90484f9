#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# Commands fill the connections to an NBD server in turn: one takes up
# to 16 in flight (nbdkit's default worker count) before the next is
# used, so light traffic stays on one connection, and heavy traffic
# still spreads over all of them.  The server is nbdkit eval over a file
# with multi-conn (so the plug opens remote-connections=4 to it); each
# read waits while the marker file R.hold exists.  A client sends 40
# reads at once through the plug (nbdkit -t 64, so that all 40 reach
# it); once the server's log (--filter=log) shows all 40, the reads per
# server connection must be 16, 16 and 8.  Then the reads are let go
# and return the file's data.
# With pick_conn spreading every command to the connection with the
# fewest in flight: "FAIL: reads per server connection [10, 10, 10, 10],
# expected [16, 16, 8]".
source ./functions.sh
set -e

requires test -x /usr/bin/python3
requires /usr/bin/python3 -c 'import nbd'
requires nbdkit eval --version
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

/usr/bin/python3 -c 'import sys
open(sys.argv[1], "wb").write(bytes(range(256)) * (4 << 12))' "$tmp/R.img"
touch "$tmp/R.hold"
# A read waits while R.hold exists, 30 s at most.
srv_start R unix --filter=log eval logfile="$tmp/R.txt" \
  thread_model='echo parallel' get_size='echo 4194304' \
  can_multi_conn='exit 0' \
  pread="for i in \$(seq 600); do [ -e $tmp/R.hold ] || break; sleep 0.05; done
dd if=$tmp/R.img skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none"
srv_start plug unix -t 64 "$PLUGIN" "file=${srv_uri[R]}"

cat > "$tmp/client.py" <<'EOF2'
import collections, os, sys
import nbd, plugtest

uri, log, hold, img = sys.argv[1:5]
N = 40
h = nbd.NBD()
h.connect_uri(uri)
bufs, cookies, conns = plugtest.held_reads(h, log, N)
if len(conns) < N:
    sys.exit("FAIL: %d of the %d reads reached the server" % (len(conns), N))
counts = sorted(collections.Counter(conns).values(), reverse=True)
print("reads per server connection: %r" % counts)
if counts != [16, 16, 8]:
    sys.exit("FAIL: reads per server connection %r, expected [16, 16, 8]"
             % counts)
os.unlink(hold)
for c in cookies:
    while not h.aio_command_completed(c):
        h.poll(-1)
plugtest.check_reads(bufs, img)
print("the %d reads returned the file's data" % N)
h.shutdown()
EOF2
/usr/bin/python3 "$tmp/client.py" "${srv_uri[plug]}" "$tmp/R.txt" \
                 "$tmp/R.hold" "$tmp/R.img"
srv_stop plug
srv_stop R
