#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Copyright the nbdplug authors (see LICENSE).

# An NBD server that accepts fewer connections than remote-connections=
# (nbdkit --filter=limit limit=2, the plug asking for 4): the export
# works on the two it has; the plug says so once; and the two it cannot
# open are tried again rarely: fewer than 12 refused connections in the
# server's log over the test's 4 s of quiet, where the reconnect backoff
# (requeue-max-delay=100ms) would knock about 20 times a second.
source ./functions.sh
set -e

requires /usr/bin/python3 -c 'import nbd'
test -f "$PLUGIN"

plug_tmpdir
source "$srcdir/remote-lib.sh"

srv_start r unix --filter=limit --filter=log memory 8M limit=2 \
          logfile="$tmp/r.txt"
srv_start plug unix "$PLUGIN" "file=${srv_uri[r]}" remote-connections=4
nbdsh_sys -u "${srv_uri[plug]}" -c '
for i in range(100):
    h.pwrite(bytes([i]) * 4096, i * 8192)
h.flush()
for i in range(100):
    assert h.pread(4096, i * 8192) == bytes([i]) * 4096, i
print("io ok")
'
sleep 4
refused=$(grep -c 'too many clients connected' "$tmp/r.log" || :)
lines=$(grep -c 'cannot be opened' "$tmp/plug.log" || :)
used=$(grep -o 'connection=[0-9]* Write' "$tmp/r.txt" | sort -u | wc -l)
echo "refused connections: $refused; plug log lines: $lines;" \
     "connections that wrote: $used"
grep 'cannot be opened' "$tmp/plug.log" || :
[ "$refused" -lt 12 ] || fail "$refused refused connections"
[ "$lines" -eq 1 ] || fail "$lines log lines about it, expected 1"
[ "$used" -le 2 ] || fail "$used connections wrote, the limit is 2"
srv_stop plug
srv_stop r
